// Configuration: precedence (defaults < file < env), every error kind with a message naming the
// source, key, value and what was expected, size parsing, and the to_toml() round trip.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "common/config.hpp"

using namespace fp8wire;

namespace {

// A TOML file in the temporary directory, removed when the test ends.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& text) {
    char name[] = "/tmp/fp8wire_test_config_XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    close(fd);
    path = name;
    std::ofstream(path) << text;
  }
  ~TempFile() { std::remove(path.c_str()); }
};

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string all_messages(const ConfigResult& r) {
  std::string out;
  for (const auto& e : r.errors) out += e.message() + "\n";
  return out;
}

}  // namespace

TEST_CASE("parse_size accepts bytes and binary suffixes and refuses anything else") {
  CHECK(parse_size("0") == 0u);
  CHECK(parse_size("4096") == 4096u);
  CHECK(parse_size("767KiB") == 767u * 1024);
  CHECK(parse_size("767K") == 767u * 1024);
  CHECK(parse_size("64MiB") == 64ull << 20);
  CHECK(parse_size("64 MiB") == 64ull << 20);
  CHECK(parse_size("64m") == 64ull << 20);
  CHECK(parse_size("1GiB") == 1ull << 30);
  CHECK(parse_size("1G") == 1ull << 30);
  CHECK(parse_size("1TiB") == 1ull << 40);
  CHECK(parse_size("512B") == 512u);
  CHECK(parse_size(" 12 ") == 12u);
  CHECK_FALSE(parse_size(""));
  CHECK_FALSE(parse_size("MiB"));
  CHECK_FALSE(parse_size("-1"));
  CHECK_FALSE(parse_size("1.5GiB"));
  CHECK_FALSE(parse_size("64MB"));  // decimal or binary? refused rather than guessed
  CHECK_FALSE(parse_size("64XiB"));
  CHECK_FALSE(parse_size("99999999999999999999"));
  CHECK_FALSE(parse_size("17000000TiB"));  // overflows 64 bits
}

TEST_CASE("format_size picks the largest exact binary unit") {
  CHECK(format_size(0) == "0");
  CHECK(format_size(1000) == "1000");
  CHECK(format_size(767 * 1024) == "767KiB");
  CHECK(format_size(64ull << 20) == "64MiB");
  CHECK(format_size(3ull << 30) == "3GiB");
  CHECK(format_size(1ull << 40) == "1TiB");
  for (uint64_t v : {1ull, 1023ull, 1024ull, 1536ull * 1024, (1ull << 40) + 1})
    CHECK(parse_size(format_size(v)) == v);
}

TEST_CASE("enum names are the strings a config file uses") {
  CHECK(std::string(to_string(Fp8Format::e5m2)) == "e5m2");
  CHECK(std::string(to_string(ScaleType::e8m0)) == "e8m0");
  CHECK(std::string(to_string(Rounding::stochastic)) == "stochastic");
  CHECK(std::string(to_string(ConvertPath::automatic)) == "auto");
  CHECK(std::string(to_string(Algorithm::two_shot)) == "two_shot");
  CHECK(std::string(to_string(Fabric::pcie)) == "pcie");
  CHECK(std::string(to_string(Collective::reduce_scatter)) == "reduce_scatter");
  CHECK(std::string(to_string(Collective::all_to_all)) == "all_to_all");
}

TEST_CASE("no file and no environment gives the defaults") {
  const ConfigResult r = load_config("", {});
  CHECK(r.ok());
  CHECK(r.config.enable);
  CHECK(r.config.block_size == 128);
  CHECK(r.config.format == Fp8Format::e4m3);
  CHECK(r.config.thresholds[0][1] == 1ull << 20);
  // The all-to-all carries activations: off unless configured; its thresholds the reduce-scatter's.
  CHECK_FALSE(r.config.collective_enable[static_cast<int>(Collective::all_to_all)]);
  CHECK(r.config.thresholds[static_cast<int>(Collective::all_to_all)] ==
        r.config.thresholds[static_cast<int>(Collective::reduce_scatter)]);
  REQUIRE(r.sources.size() == 1);
  CHECK(r.sources[0] == "defaults");
}

TEST_CASE("precedence: defaults < file < environment") {
  TempFile file(R"(
block_size = 256
format = "e5m2"
[thresholds.all_reduce]
pcie = "767KiB"
net = 4096
[profiler]
step_ranges = ["train_step"]
)");
  const ConfigResult r = load_config(file.path, {"FP8WIRE_BLOCK_SIZE=512", "FP8WIRE_ENABLE=off",
                                                 "PATH=/usr/bin", "FP8WIRE_CONFIG=/ignored"});
  INFO(all_messages(r));
  REQUIRE(r.ok());
  CHECK(r.config.block_size == 512);                  // env beats file
  CHECK(r.config.format == Fp8Format::e5m2);          // file beats default
  CHECK_FALSE(r.config.enable);                       // env beats default
  CHECK(r.config.thresholds[0][1] == 767u * 1024);    // size string in a file
  CHECK(r.config.thresholds[0][2] == 4096u);          // plain integer in a file
  CHECK(r.config.thresholds[0][0] == 256ull << 20);   // untouched default
  CHECK(r.config.profiler_step_ranges == std::vector<std::string>{"train_step"});
  REQUIRE(r.sources.size() == 3);
  CHECK(r.sources[0] == "env FP8WIRE_ENABLE, FP8WIRE_BLOCK_SIZE");
  CHECK(r.sources[1] == "file " + file.path);
  CHECK(r.sources[2] == "defaults");
}

TEST_CASE("environment variable names derive from the keys") {
  const ConfigResult r = load_config(
      "", {"FP8WIRE_THRESHOLDS_ALL_REDUCE_NET=1TiB", "FP8WIRE_COLLECTIVES_ALL_GATHER=yes",
           "FP8WIRE_COST_MODEL_PCIE_BUS_BANDWIDTH_GBPS=22.5", "FP8WIRE_FABRIC=pcie",
           "FP8WIRE_PROFILER_STEP_RANGES=step, fwd_bwd", "FP8WIRE_SEED=0x10",
           "FP8WIRE_LOG_FILE=/tmp/x-%r.log", "FP8WIRE_NCCL_LIBRARY=/opt/nccl/libnccl.so.2",
           "FP8WIRE_ALGORITHM=one_shot", "FP8WIRE_CONVERT_PATH=software", "FP8WIRE_SCALE_TYPE=e8m0",
           "FP8WIRE_COLLECTIVES_ALL_TO_ALL=1", "FP8WIRE_THRESHOLDS_ALL_TO_ALL_PCIE=8MiB"});
  INFO(all_messages(r));
  REQUIRE(r.ok());
  CHECK(r.config.thresholds[0][2] == 1ull << 40);
  CHECK(r.config.collective_enable[2]);
  CHECK(r.config.collective_enable[3]);
  CHECK(r.config.thresholds[3][1] == 8ull << 20);
  CHECK(r.config.cost_model[1].bus_bandwidth_gbps == doctest::Approx(22.5));
  CHECK(r.config.cost_model[1].calibrated);  // giving a number means it is to be used
  CHECK_FALSE(r.config.cost_model[0].calibrated);
  CHECK(r.config.fabric_override == Fabric::pcie);
  CHECK(r.config.profiler_step_ranges == std::vector<std::string>{"step", "fwd_bwd"});
  CHECK(r.config.seed == 16);
  CHECK(r.config.log_file == "/tmp/x-%r.log");
  CHECK(r.config.nccl_library == "/opt/nccl/libnccl.so.2");
  CHECK(r.config.algorithm == Algorithm::one_shot);
  CHECK(r.config.convert_path == ConvertPath::software);
  CHECK(r.config.scale_type == ScaleType::e8m0);
}

TEST_CASE("booleans accept every documented spelling") {
  for (const char* t : {"true", "1", "on", "yes", "TRUE", "On"}) {
    const ConfigResult r = load_config("", {std::string("FP8WIRE_PROFILER_ENABLE=") + t});
    CHECK_MESSAGE(r.ok(), t);
    CHECK(r.config.profiler_enable);
  }
  for (const char* f : {"false", "0", "off", "no"}) {
    const ConfigResult r = load_config("", {std::string("FP8WIRE_ENABLE=") + f});
    CHECK_MESSAGE(r.ok(), f);
    CHECK_FALSE(r.config.enable);
  }
}

TEST_CASE("a bad environment value names the variable, key, value and what was expected") {
  struct Case {
    const char* entry;
    const char* key;
    const char* value;
    const char* expected_fragment;
  };
  const Case cases[] = {
      {"FP8WIRE_BLOCK_SIZE=100", "block_size", "100", "power of two in [32, 4096]"},
      {"FP8WIRE_BLOCK_SIZE=8192", "block_size", "8192", "power of two in [32, 4096]"},
      {"FP8WIRE_BLOCK_SIZE=16", "block_size", "16", "power of two in [32, 4096]"},
      {"FP8WIRE_ENABLE=maybe", "enable", "maybe", "true/false, 1/0, on/off, yes/no"},
      {"FP8WIRE_FORMAT=e4m4", "format", "e4m4", "one of \"e4m3\", \"e5m2\""},
      {"FP8WIRE_THRESHOLDS_ALL_REDUCE_PCIE=64MB", "thresholds.all_reduce.pcie", "64MB", "binary suffix"},
      {"FP8WIRE_COALESCE_MAX_BYTES=0", "coalesce.max_bytes", "0", "at least 1"},
      {"FP8WIRE_COALESCE_MAX_CALLS=0", "coalesce.max_calls", "0", "an integer in [1, 65536]"},
      {"FP8WIRE_SCRATCH_MAX_BYTES=0", "scratch.max_bytes", "0", "at least 1"},
      {"FP8WIRE_PIPELINE_CHUNK_BYTES=-5", "pipeline.chunk_bytes", "-5", "a size"},
      {"FP8WIRE_COST_MODEL_NET_CODEC_GBPS=-2", "cost_model.net.codec_gbps", "-2", ">= 0"},
      {"FP8WIRE_COST_MODEL_NET_OP_LATENCY_US=inf", "cost_model.net.op_latency_us", "inf", "finite"},
      {"FP8WIRE_COST_MODEL_NET_ALLGATHER_LATENCY_US=-1", "cost_model.net.allgather_latency_us", "-1", ">= 0"},
      {"FP8WIRE_COST_MODEL_PCIE_ALLTOALL_BANDWIDTH_GBPS=fast", "cost_model.pcie.alltoall_bandwidth_gbps", "fast", "finite"},
      {"FP8WIRE_COST_MODEL_NET_HOSTS=1.5", "cost_model.net.hosts", "1.5", "an integer in [0, 16777216]"},
      {"FP8WIRE_COST_MODEL_NET_RANKS_PER_HOST=-8", "cost_model.net.ranks_per_host", "-8", "an integer in [0, 16777216]"},
      {"FP8WIRE_LOG_LEVEL=verbose", "log.level", "verbose", "\"debug\""},
      {"FP8WIRE_PROFILER_TOP=0", "profiler.top", "0", "[1, 100000]"},
      {"FP8WIRE_PROFILER_DEVICE_BUFFERS=250", "profiler.device_buffers", "250", "[1, 200]"},
      {"FP8WIRE_PROFILER_DEVICE_BUFFER_BYTES=1GiB", "profiler.device_buffer_bytes", "1GiB", "at most 256MiB"},
      {"FP8WIRE_PROFILER_DEVICE_BUFFER_BYTES=1KiB", "profiler.device_buffer_bytes", "1KiB", "at least 64KiB"},
      {"FP8WIRE_PROFILER_STEP_RANGES=step,,x", "profiler.step_ranges", "step,,x", "non-empty"},
      {"FP8WIRE_SEED=12abc", "seed", "12abc", "unsigned integer"},
      {"FP8WIRE_FABRIC=infiniband", "fabric", "infiniband", "\"pcie\""},
  };
  for (const auto& c : cases) {
    const ConfigResult r = load_config("", {c.entry});
    CAPTURE(c.entry);
    REQUIRE(r.errors.size() == 1);
    const ConfigError& e = r.errors[0];
    CHECK(e.key == c.key);
    CHECK(e.value == c.value);
    CHECK(contains(e.expected, c.expected_fragment));
    const std::string name = std::string(c.entry).substr(0, std::string(c.entry).find('='));
    CHECK(e.source == "env " + name);
    const std::string m = e.message();
    CHECK(contains(m, name));
    CHECK(contains(m, c.key));
    CHECK(contains(m, std::string("'") + c.value + "'"));
    CHECK(contains(m, c.expected_fragment));
  }
}

TEST_CASE("a failed key keeps its default and the others still apply") {
  const ConfigResult r = load_config("", {"FP8WIRE_BLOCK_SIZE=100", "FP8WIRE_FORMAT=e5m2"});
  CHECK_FALSE(r.ok());
  CHECK(r.config.block_size == 128);
  CHECK(r.config.format == Fp8Format::e5m2);
}

TEST_CASE("an unknown FP8WIRE_ variable is an error with a suggestion; build variables are not") {
  const ConfigResult r = load_config("", {"FP8WIRE_BLOCKSIZE=256", "FP8WIRE_NCCL_ROOT=/opt/nccl",
                                          "FP8WIRE_EXTRA_INCLUDE=/x", "FP8WIRE_CONFIG=",
                                          // the project's scripts' own (scripts/gpu/soak.sh: FP8WIRE_BUILD)
                                          "FP8WIRE_BUILD=build", "FP8WIRE_BUILD_TRAINER=0",
                                          "FP8WIRE_TORCH_PYTHON=/p", "FP8WIRE_SANITIZE=1", "FP8WIRE_FUZZ=1",
                                          "FP8WIRE_FUZZ_SECONDS=15", "FP8WIRE_SKIP_PACKAGE=1",
                                          // set by fp8wire-train / fp8wire-prof for their children
                                          "FP8WIRE_TRAIN_STORE=/tmp/s", "FP8WIRE_PROF_LIB=/l.so",
                                          "FP8WIRE_SHIM_LIB=/s.so", "FP8WIRE_CUPTI_DIR=/c",
                                          // the rank launchers' MPS switch and what they tell their ranks
                                          "FP8WIRE_MPS=0", "FP8WIRE_TESTBED_MODE=mps",
                                          "FP8WIRE_BOOTSTRAP_SECRET=0123"});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].source == "env FP8WIRE_BLOCKSIZE");
  CHECK(r.errors[0].value == "256");
  CHECK(contains(r.errors[0].expected, "did you mean FP8WIRE_BLOCK_SIZE?"));
}

TEST_CASE("file errors carry file:line, the key, the value and what was expected") {
  TempFile file("enable = true\n"
                "block_size = 100\n"
                "[thresholds.all_reduce]\n"
                "pcie = \"lots\"\n"
                "nvlnk = 5\n"
                "[profiler]\n"
                "step_ranges = [\"a\", 3]\n"
                "enable = \"sometimes\"\n"
                "[log]\n"
                "file = 7\n");
  const ConfigResult r = load_config(file.path, {});
  INFO(all_messages(r));
  REQUIRE(r.errors.size() == 6);
  auto find = [&](const std::string& key) -> const ConfigError* {
    for (const auto& e : r.errors)
      if (e.key == key) return &e;
    return nullptr;
  };
  const ConfigError* block = find("block_size");
  REQUIRE(block);
  CHECK(block->source == "file " + file.path + ":2");
  CHECK(block->value == "100");
  const ConfigError* pcie = find("thresholds.all_reduce.pcie");
  REQUIRE(pcie);
  CHECK(pcie->source == "file " + file.path + ":4");
  CHECK(pcie->value == "lots");
  const ConfigError* typo = find("thresholds.all_reduce.nvlnk");
  REQUIRE(typo);
  CHECK(typo->source == "file " + file.path + ":5");
  CHECK(contains(typo->expected, "did you mean thresholds.all_reduce.nvlink?"));
  const ConfigError* ranges = find("profiler.step_ranges");
  REQUIRE(ranges);
  CHECK(ranges->source == "file " + file.path + ":7");
  const ConfigError* enable = find("profiler.enable");
  REQUIRE(enable);
  CHECK(enable->value == "sometimes");
  const ConfigError* log_file = find("log.file");  // a number where a path belongs
  REQUIRE(log_file);
  CHECK(log_file->source == "file " + file.path + ":10");
  CHECK(r.config.enable);  // the good line still applied
}

TEST_CASE("file errors come in the file's line order, whatever the order of the keys") {
  // The key table applies enable before block_size before the cost model; unknown keys are found
  // last. None of that order may show: the reader goes through the file from the top.
  TempFile file("[cost_model.net]\n"
                "hosts = 1.5\n"
                "ranks_per_host = 8\n"
                "[profiler]\n"
                "tpo = 3\n"
                "enable = \"sometimes\"\n"
                "[thresholds.all_reduce]\n"
                "pcie = \"lots\"\n");
  TempFile root("nonsense = 1\n"
                "block_size = 100\n"
                "enable = 7\n");
  for (const TempFile* f : {&file, &root}) {
    const ConfigResult r = load_config(f->path, {});
    INFO(all_messages(r));
    REQUIRE(r.errors.size() >= 3);
    size_t previous = 0;
    for (const ConfigError& e : r.errors) {
      const size_t line = std::stoul(e.source.substr(e.source.rfind(':') + 1));
      CHECK(line > previous);
      previous = line;
    }
  }
  const ConfigResult r = load_config(file.path, {});
  REQUIRE(r.errors.size() == 4);
  CHECK(r.errors[0].key == "cost_model.net.hosts");
  CHECK(r.errors[0].value == "1.5");
  CHECK(r.errors[0].expected == "an integer in [0, 16777216] (0 = not recorded)");
  CHECK(r.errors[1].key == "profiler.tpo");
  CHECK(r.errors[2].key == "profiler.enable");
  CHECK(r.errors[3].key == "thresholds.all_reduce.pcie");
}

TEST_CASE("the cost model's job shape takes whole numbers only") {
  for (const char* bad : {"hosts = 1.5", "hosts = 2.0", "hosts = -1", "hosts = 16777217", "ranks_per_host = \"8x\""}) {
    CAPTURE(bad);
    const ConfigResult r = parse_config_toml(std::string("[cost_model.net]\n") + bad + "\n", "shape.toml", Config{});
    REQUIRE(r.errors.size() == 1);
    CHECK(contains(r.errors[0].message(), "an integer in [0, 16777216]"));
    CHECK_FALSE(r.config.cost_model[2].calibrated);
  }
  const ConfigResult ok = parse_config_toml("[cost_model.net]\nhosts = 4\nranks_per_host = \"8\"\n", "shape.toml",
                                            Config{});
  REQUIRE(ok.ok());
  CHECK(ok.config.cost_model[2].hosts == 4);
  CHECK(ok.config.cost_model[2].ranks_per_host == 8);
  CHECK(ok.config.cost_model[2].calibrated);
}

TEST_CASE("a TOML syntax error and a missing file are errors, not crashes") {
  TempFile bad("enable = true\nblock_size = = 3\n");
  const ConfigResult syntax = load_config(bad.path, {});
  REQUIRE(syntax.errors.size() == 1);
  CHECK(syntax.errors[0].source == "file " + bad.path + ":2");
  CHECK(syntax.errors[0].expected == "valid TOML");

  // A time that starts with no digit broke an assumption inside toml++ 3.3 (found by
  // fuzz_config_toml; the assumptions are compiled out): now an ordinary syntax error.
  const ConfigResult time = parse_config_toml("s =2026-01-01T-01T05:\"\"\"text\"", "t.toml", Config{});
  REQUIRE(time.errors.size() == 1);
  CHECK(time.errors[0].source.rfind("file t.toml:1", 0) == 0);
  CHECK(time.errors[0].expected == "valid TOML");

  const ConfigResult missing = load_config("/nonexistent/fp8wire.toml", {});
  REQUIRE(missing.errors.size() == 1);
  CHECK(missing.errors[0].source == "file /nonexistent/fp8wire.toml");
  CHECK(missing.errors[0].value == "/nonexistent/fp8wire.toml");
  CHECK(contains(missing.errors[0].message(), "readable TOML file"));
}

// FP8WIRE_CONFIG=out/sweep (the benchmark's output folder, not the profile in it): a directory opens
// and reads as an empty document, which used to give the defaults with no error at all.
TEST_CASE("non-ASCII outside strings is an error with file:line:column, never toml++ 3.3's unreachable path") {
  // Each of these sends toml++ 3.3.0 into TOML_UNREACHABLE (undefined behaviour) without the check.
  const struct {
    const char* text;
    const char* source;
    const char* what;
  } cases[] = {
      {"block_size = 128\n\xc2\xa7 = 2\n", "file t.toml:2:1", "non-ASCII character U+00A7 outside a quoted string"},
      {"format = \"e4m3\" \xc3\xa9\n", "file t.toml:1:17", "non-ASCII character U+00E9"},
      {"[log]\nfile = \"\"\"\\\n\xc2\xa7\"\"\"\n", "file t.toml:3:1", "write it as \\u00A7"},
      {"[log]\nfile = \"\"\"\\\xd0\x96\"\"\"\n", "file t.toml:2:12", "right after a backslash"},
      {"block_size = 128 \xff\n", "file t.toml:1:18", "a byte that is not UTF-8"},
      // toml++ assumes a table header starts with a key (found by fuzz_config_toml).
      {"format = \"e4m3\"\n[\x01ds.all_reduce]\n", "file t.toml:2:2", "a table header must begin with a key"},
      {"[[[[[[[[[[[[)", "file t.toml:1:3", "a table header must begin with a key"},
      {"  [ = ]\n", "file t.toml:1:5", "a table header must begin with a key"},
      {"a = 1\n[\nb = 2\n", "file t.toml:2:2", "a table header must begin with a key"},
      // A quote inside a bare value starts no string: toml++ reads on through the whitespace test.
      {"s = 2024-01-01\"\xef\xbb\xb7x\n", "file t.toml:1:16", "non-ASCII character U+FEF7"},
      {"block_size = 4\"\"\"\xc2\xa7\"\"\"\n", "file t.toml:1:18", "non-ASCII character U+00A7"},
      {"block_size = 0506-ff['V;\xc5\xbf;1T\n", "file t.toml:1:25", "non-ASCII character U+017F"},
      // toml++ trims U+FEFF after a line-ending backslash as whitespace and tests what follows.
      {"[log]\nfile = \"\"\"\\\n \xef\xbb\xbf\n  \xc3\xa9\"\"\"\n", "file t.toml:4:3", "write it as \\u00E9"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    const ConfigResult r = parse_config_toml(c.text, "t.toml", Config{});
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].source == c.source);
    CHECK(contains(r.errors[0].message(), c.what));
    CHECK(contains(r.errors[0].message(), "expected valid TOML"));
  }
  // Non-ASCII where TOML allows it: strings, comments (and a byte-order mark).
  const ConfigResult ok = parse_config_toml("\xef\xbb\xbf# r\xc3\xa9sum\xc3\xa9 \xc2\xa7\n[log]\nfile = \"/tmp/\xc3\xa9t\xc3\xa9-%r.log\"\n",
                                            "t.toml", Config{});
  CHECK(ok.ok());
  CHECK(ok.config.log_file == "/tmp/\xc3\xa9t\xc3\xa9-%r.log");
  // Arrays (nested, on lines of their own) are not table headers.
  const ConfigResult arrays = parse_config_toml("[profiler]\nstep_ranges = [\n  \"step\",\n  \"x\"]\n[ \"log\" ]\nlevel = \"info\"\n",
                                                "t.toml", Config{});
  CHECK(arrays.ok());
  CHECK(arrays.config.profiler_step_ranges == std::vector<std::string>{"step", "x"});
}

TEST_CASE("an environment value that is not UTF-8 is an error (a TOML file could not hold it either)") {
  const ConfigResult r = load_config("", {"FP8WIRE_PROFILER_STEP_RANGES=step,Profil\xff\xffStep"});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].message() ==
        "env FP8WIRE_PROFILER_STEP_RANGES: profiler.step_ranges = '<bytes that are not UTF-8>': expected UTF-8 text");
  CHECK(load_config("", {"FP8WIRE_LOG_FILE=/tmp/\xc3\xa9t\xc3\xa9.log"}).ok());
}

TEST_CASE("a directory given as the config file is an error, not an empty configuration") {
  char dir[] = "/tmp/fp8wire_test_config_dir_XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const ConfigResult r = load_config(dir, {"FP8WIRE_BLOCK_SIZE=256"});
  rmdir(dir);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].source == std::string("file ") + dir);
  CHECK(r.errors[0].value == dir);
  CHECK(contains(r.errors[0].message(), "readable TOML file (it is a directory)"));
  CHECK(!r.ok());
}

TEST_CASE("a TOML file past the input limits is an error naming the file, what was wrong and the limit") {
  // A dotted key of 300,000 parts (600 KB, within the size limit): toml++ frees the tables it makes by
  // recursion, so keys like it overflowed the stack before the guard counted their parts.
  std::string deep;
  for (int i = 0; i < 300'000; ++i) deep += "a.";
  const TempFile dotted(deep + "b = 1\n");
  ConfigResult r = load_config(dotted.path, {});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].message() ==
        "file " + dotted.path + ":1:512: 'nested deeper than its limit of 256 levels (each table, array, inline table "
        "and part of a dotted key is one)': expected a TOML file within the input limits: at most 1048576 bytes "
        "(1 MiB), nested at most 256 levels deep");
  const TempFile header("[" + deep + "b]\nblock_size = 64\n");
  r = load_config(header.path, {});
  REQUIRE(r.errors.size() == 1);
  CHECK(contains(r.errors[0].message(), "nested deeper than its limit of 256 levels"));
  // Larger than the limit: refused before it is read.
  const TempFile big(std::string(2u << 20, '#'));
  r = load_config(big.path, {"FP8WIRE_BLOCK_SIZE=256"});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].message() == "file " + big.path + ": '2097152 bytes': expected a TOML file within the input "
                                 "limits: at most 1048576 bytes (1 MiB), nested at most 256 levels deep");
  CHECK(r.config.block_size == 256);  // the environment still applies
}

TEST_CASE("parse_config_toml layers a document on a base config") {
  Config base;
  base.block_size = 64;
  base.log_level = "debug";
  const ConfigResult r = parse_config_toml("[coalesce]\nmax_calls = 8\n", "profile.toml", base);
  REQUIRE(r.ok());
  CHECK(r.config.block_size == 64);
  CHECK(r.config.log_level == "debug");
  CHECK(r.config.coalesce_max_calls == 8);
}

TEST_CASE("to_toml prints every key and parses back to the same configuration") {
  Config c;
  c.enable = false;
  c.collective_enable = {false, true, true, true};
  c.format = Fp8Format::e5m2;
  c.block_size = 1024;
  c.scale_type = ScaleType::bf16;
  c.rounding = Rounding::stochastic;
  c.seed = UINT64_MAX;  // beyond TOML's signed integers: must still round-trip
  c.convert_path = ConvertPath::native;
  c.algorithm = Algorithm::ring;
  c.gather_transport = GatherMethod::sendrecv;
  c.fabric_override = Fabric::net;
  c.thresholds[2][1] = 767 * 1024 + 3;
  c.thresholds[3][2] = 5 * 1024 + 1;
  c.cost_model[1] = {.op_latency_us = 12.5, .bus_bandwidth_gbps = 21.75, .codec_gbps = 400, .kernel_launch_us = 3.25,
                     .allreduce_latency_us = 27059.25, .allgather_latency_us = 11069.5,
                     .reduce_scatter_latency_us = 3774.125, .alltoall_latency_us = 7158.0625,
                     .allreduce_bandwidth_gbps = 1.25, .allgather_bandwidth_gbps = 0.875,
                     .reduce_scatter_bandwidth_gbps = 3.625, .alltoall_bandwidth_gbps = 0.9375, .calibrated = true};
  c.coalesce_enable = false;
  c.coalesce_max_bytes = 3ull << 30;
  c.coalesce_max_calls = 7;
  c.scratch_max_bytes = 1000;
  c.scratch_process_max_bytes = 3ull << 30;
  c.pipeline_chunk_bytes = 5ull << 20;
  c.error_feedback = true;
  c.error_feedback_max_bytes = 0;
  c.telemetry_sample_every = 0;
  c.guard_enable = true;
  c.guard_retry_after = 0;
  c.guard_decide_after = 3;
  c.guard_max_rel_error = 0.1;
  c.guard_max_saturated = 0;
  c.guard_max_flushed = 0.03;
  c.guard_max_nonfinite = 1;
  c.audit_every = 50;
  c.setup_timeout_s = 2.5;
  c.hierarchy_enable = false;
  c.hierarchy_ranks_per_host = 4;
  c.cost_model[2].hosts = 2;
  c.cost_model[2].ranks_per_host = 8;
  c.cost_model[1].direct_latency_us = 12.5;
  c.cost_model[1].direct_bandwidth_gbps = 51.25;
  c.direct_transport = DirectMode::host_memory;
  c.direct_assume_one_host = true;
  c.direct_window_bytes = 3ull << 20;
  c.direct_ctas = 9;
  c.cost_model[1].direct_stage_bytes = 1ull << 20;
  c.cost_model[1].direct_max_stages = 5;
  c.cost_model[1].direct_shared_max_stages = 3;
  c.cost_model[1].direct_shared_stage_bytes = 48ull << 20;
  c.cost_model[0].direct_max_stages = 4;
  c.direct_sets = 3;
  c.direct_protocol = DirectProtocol::kernels;
  c.log_level = "trace";
  c.log_file = "/tmp/with \"quotes\" and \\ back\tslash-%r.log";
  c.nccl_library = "/opt/nccl/lib/libnccl.so.2";
  c.profiler_enable = true;
  c.profiler_step_ranges = {"a", "b c"};
  c.profiler_report_every = 100;
  c.profiler_output = "/tmp/prof";
  c.profiler_top = 3;
  c.profiler_buffer_bytes = 1ull << 24;
  c.profiler_device_buffers = 20;
  c.profiler_device_buffer_bytes = 1ull << 20;
  c.profiler_comm_pattern = "allreduce|my_comm_kernel";
  c.routes[0][2] = {{4, 16ull << 20, true, Algorithm::two_shot, GatherMethod::allgather},
                    {4, 64ull << 20, false},
                    {8, 1ull << 20, true, Algorithm::one_shot, GatherMethod::automatic}};
  c.routes[1][1] = {{2, 3000, true}};

  const std::string text = to_toml(c);
  const ConfigResult r = parse_config_toml(text, "round-trip");
  INFO(text);
  INFO(all_messages(r));
  REQUIRE(r.ok());
  CHECK(to_toml(r.config) == text);
  const Config& p = r.config;
  CHECK(p.enable == c.enable);
  CHECK(p.collective_enable == c.collective_enable);
  CHECK(p.format == c.format);
  CHECK(p.block_size == c.block_size);
  CHECK(p.scale_type == c.scale_type);
  CHECK(p.rounding == c.rounding);
  CHECK(p.seed == c.seed);
  CHECK(p.convert_path == c.convert_path);
  CHECK(p.algorithm == c.algorithm);
  CHECK(p.gather_transport == c.gather_transport);
  CHECK(p.fabric_override == c.fabric_override);
  CHECK(p.thresholds == c.thresholds);
  CHECK(p.cost_model[1].op_latency_us == c.cost_model[1].op_latency_us);
  CHECK(p.cost_model[1].bus_bandwidth_gbps == c.cost_model[1].bus_bandwidth_gbps);
  CHECK(p.cost_model[1].codec_gbps == c.cost_model[1].codec_gbps);
  CHECK(p.cost_model[1].kernel_launch_us == c.cost_model[1].kernel_launch_us);
  CHECK(p.cost_model[1].allreduce_latency_us == c.cost_model[1].allreduce_latency_us);
  CHECK(p.cost_model[1].allgather_latency_us == c.cost_model[1].allgather_latency_us);
  CHECK(p.cost_model[1].reduce_scatter_latency_us == c.cost_model[1].reduce_scatter_latency_us);
  CHECK(p.cost_model[1].alltoall_latency_us == c.cost_model[1].alltoall_latency_us);
  CHECK(p.cost_model[1].allreduce_bandwidth_gbps == c.cost_model[1].allreduce_bandwidth_gbps);
  CHECK(p.cost_model[1].allgather_bandwidth_gbps == c.cost_model[1].allgather_bandwidth_gbps);
  CHECK(p.cost_model[1].reduce_scatter_bandwidth_gbps == c.cost_model[1].reduce_scatter_bandwidth_gbps);
  CHECK(p.cost_model[1].alltoall_bandwidth_gbps == c.cost_model[1].alltoall_bandwidth_gbps);
  CHECK(p.cost_model[1].calibrated);
  CHECK_FALSE(p.cost_model[0].calibrated);
  CHECK(p.coalesce_enable == c.coalesce_enable);
  CHECK(p.coalesce_max_bytes == c.coalesce_max_bytes);
  CHECK(p.coalesce_max_calls == c.coalesce_max_calls);
  CHECK(p.scratch_max_bytes == c.scratch_max_bytes);
  CHECK(p.scratch_process_max_bytes == c.scratch_process_max_bytes);
  CHECK(p.pipeline_chunk_bytes == c.pipeline_chunk_bytes);
  CHECK(p.error_feedback == c.error_feedback);
  CHECK(p.error_feedback_max_bytes == c.error_feedback_max_bytes);
  CHECK(p.telemetry_sample_every == c.telemetry_sample_every);
  CHECK(p.guard_enable == c.guard_enable);
  CHECK(p.guard_retry_after == c.guard_retry_after);
  CHECK(p.guard_decide_after == c.guard_decide_after);
  CHECK(p.guard_max_rel_error == c.guard_max_rel_error);
  CHECK(p.guard_max_saturated == c.guard_max_saturated);
  CHECK(p.guard_max_flushed == c.guard_max_flushed);
  CHECK(p.guard_max_nonfinite == c.guard_max_nonfinite);
  CHECK(p.audit_every == c.audit_every);
  CHECK(p.setup_timeout_s == c.setup_timeout_s);
  CHECK(p.hierarchy_enable == c.hierarchy_enable);
  CHECK(p.hierarchy_ranks_per_host == c.hierarchy_ranks_per_host);
  CHECK(p.cost_model[2].hosts == 2);
  CHECK(p.cost_model[2].ranks_per_host == 8);
  CHECK(p.cost_model[1].direct_latency_us == 12.5);
  CHECK(p.cost_model[1].direct_bandwidth_gbps == 51.25);
  CHECK(p.direct_transport == DirectMode::host_memory);
  CHECK(p.direct_assume_one_host);
  CHECK(p.direct_window_bytes == 3ull << 20);
  CHECK(p.direct_ctas == 9);
  CHECK(p.cost_model[1].direct_stage_bytes == 1ull << 20);
  CHECK(p.cost_model[1].direct_max_stages == 5);
  CHECK(p.cost_model[1].direct_shared_max_stages == 3);
  CHECK(p.cost_model[1].direct_shared_stage_bytes == 48ull << 20);
  CHECK(p.cost_model[0].direct_max_stages == 4);
  CHECK_FALSE(p.cost_model[0].calibrated);  // the pipeline shape alone calibrates nothing
  CHECK(p.direct_sets == 3);
  CHECK(p.direct_protocol == DirectProtocol::kernels);
  CHECK(p.log_level == c.log_level);
  CHECK(p.log_file == c.log_file);
  CHECK(p.nccl_library == c.nccl_library);
  CHECK(p.profiler_enable == c.profiler_enable);
  CHECK(p.profiler_step_ranges == c.profiler_step_ranges);
  CHECK(p.profiler_report_every == c.profiler_report_every);
  CHECK(p.profiler_output == c.profiler_output);
  CHECK(p.profiler_top == c.profiler_top);
  CHECK(p.profiler_buffer_bytes == c.profiler_buffer_bytes);
  CHECK(p.profiler_device_buffers == c.profiler_device_buffers);
  CHECK(p.profiler_device_buffer_bytes == c.profiler_device_buffer_bytes);
  CHECK(p.profiler_comm_pattern == c.profiler_comm_pattern);
  CHECK(p.routes == c.routes);
}

TEST_CASE("the defaults round-trip too, and every key has an environment variable") {
  const std::string text = to_toml(Config{});
  const ConfigResult r = parse_config_toml(text, "defaults");
  REQUIRE(r.ok());
  CHECK(to_toml(r.config) == text);
  CHECK(contains(text, "[thresholds.all_gather]\n"));
  CHECK(contains(text, "pcie = \"1MiB\""));
  // A calibrated = false line written after the numbers keeps an uncalibrated model uncalibrated.
  CHECK_FALSE(r.config.cost_model[0].calibrated);
}

TEST_CASE("setup_timeout_s: 120 s by default, 0 for none, and a clear error for anything else") {
  CHECK(Config{}.setup_timeout_s == 120);
  const ConfigResult ok = load_config("", {"FP8WIRE_SETUP_TIMEOUT_S=0.5"});
  REQUIRE(ok.ok());
  CHECK(ok.config.setup_timeout_s == 0.5);
  REQUIRE(load_config("", {"FP8WIRE_SETUP_TIMEOUT_S=0"}).ok());
  CHECK(parse_config_toml("setup_timeout_s = 30\n", "t.toml").config.setup_timeout_s == 30);
  for (const char* bad : {"FP8WIRE_SETUP_TIMEOUT_S=-1", "FP8WIRE_SETUP_TIMEOUT_S=inf", "FP8WIRE_SETUP_TIMEOUT_S=1e9",
                          "FP8WIRE_SETUP_TIMEOUT_S=soon"}) {
    const ConfigResult r = load_config("", {bad});
    REQUIRE(r.errors.size() == 1);
    CAPTURE(r.errors[0].message());
    CHECK(r.errors[0].key == "setup_timeout_s");
    CHECK(r.errors[0].message().find("seconds, a finite number in [0, 86400] (0 = no deadline)") != std::string::npos);
  }
}

TEST_CASE("telemetry and guard keys: defaults, what each accepts, and a clear error otherwise") {
  const Config d;
  CHECK(d.telemetry_sample_every == 16);
  CHECK_FALSE(d.guard_enable);
  CHECK(d.guard_retry_after == 100);
  CHECK(d.guard_decide_after == 8);
  CHECK(d.guard_max_rel_error == 0.25);
  CHECK(d.guard_max_flushed == 0.01);
  CHECK(d.guard_max_nonfinite == 0);
  CHECK(d.audit_every == 0);
  const ConfigResult ok = load_config("", {"FP8WIRE_TELEMETRY_SAMPLE_EVERY=1", "FP8WIRE_GUARD_ENABLE=on",
                                           "FP8WIRE_GUARD_MAX_REL_ERROR=0.5", "FP8WIRE_GUARD_MAX_FLUSHED=1e-3"});
  REQUIRE(ok.ok());
  CHECK(ok.config.telemetry_sample_every == 1);
  CHECK(ok.config.guard_enable);
  CHECK(ok.config.guard_max_rel_error == 0.5);
  CHECK(ok.config.guard_max_flushed == 1e-3);
  for (const char* bad : {"FP8WIRE_GUARD_MAX_REL_ERROR=-0.1", "FP8WIRE_GUARD_MAX_FLUSHED=nan",
                          "FP8WIRE_GUARD_MAX_NONFINITE=lots", "FP8WIRE_TELEMETRY_SAMPLE_EVERY=-1",
                          "FP8WIRE_GUARD_DECIDE_AFTER=0"}) {
    const ConfigResult r = load_config("", {bad});
    REQUIRE(r.errors.size() == 1);
    CAPTURE(r.errors[0].message());
    CHECK(r.errors[0].message().find(r.errors[0].key) != std::string::npos);
    CHECK_FALSE(r.errors[0].expected.empty());
  }
  const ConfigResult file = parse_config_toml("[guard]\nenable = true\nmax_rel_error = 0.3\nretry_after = 0\n", "t");
  REQUIRE(file.ok());
  CHECK(file.config.guard_max_rel_error == 0.3);
  CHECK(file.config.guard_retry_after == 0);
}

TEST_CASE("measured routes: the sweep's text form, sorted on load, and a clear error for anything else") {
  const auto two = parse_measured_route("4 ranks from 16MiB: two_shot/sendrecv", Collective::all_reduce);
  REQUIRE(two);
  CHECK(two->ranks == 4);
  CHECK(two->from_bytes == 16ull << 20);
  CHECK(two->fp8);
  CHECK(two->algorithm == Algorithm::two_shot);
  CHECK(two->gather == GatherMethod::sendrecv);
  CHECK(to_string(*two) == "4 ranks from 16MiB: two_shot/sendrecv");
  const auto plain = parse_measured_route(" 8 ranks from 1000 :  nccl ", Collective::reduce_scatter);
  REQUIRE(plain);
  CHECK_FALSE(plain->fp8);
  CHECK(to_string(*plain) == "8 ranks from 1000: nccl");
  CHECK(parse_measured_route("2 ranks from 4MiB: fp8", Collective::reduce_scatter));
  CHECK(parse_measured_route("2 ranks from 4MiB: fp8/sendrecv", Collective::all_gather));
  // What a collective has not: an all-reduce algorithm elsewhere, "fp8" for the all-reduce, a gather
  // step where the path has none, an unknown gather step, a world of one, no size.
  CHECK_FALSE(parse_measured_route("4 ranks from 4MiB: two_shot", Collective::reduce_scatter));
  CHECK_FALSE(parse_measured_route("4 ranks from 4MiB: fp8", Collective::all_reduce));
  CHECK_FALSE(parse_measured_route("4 ranks from 4MiB: fp8/allgather", Collective::reduce_scatter));
  CHECK_FALSE(parse_measured_route("4 ranks from 4MiB: one_shot/ring", Collective::all_reduce));
  CHECK_FALSE(parse_measured_route("1 ranks from 4MiB: nccl", Collective::all_reduce));
  CHECK_FALSE(parse_measured_route("4 ranks: nccl", Collective::all_reduce));
  CHECK_FALSE(parse_measured_route("4 ranks from 4MB: nccl", Collective::all_reduce));

  const ConfigResult r = parse_config_toml(
      "[routes.all_reduce]\nnet = [\"8 ranks from 1MiB: nccl\", \"4 ranks from 64MiB: one_shot\", "
      "\"4 ranks from 16MiB: two_shot/allgather\"]\n",
      "routes.toml");
  REQUIRE(r.ok());
  const auto& net = r.config.routes[static_cast<int>(Collective::all_reduce)][static_cast<int>(Fabric::net)];
  REQUIRE(net.size() == 3);
  CHECK(to_string(net[0]) == "4 ranks from 16MiB: two_shot/allgather");
  CHECK(to_string(net[1]) == "4 ranks from 64MiB: one_shot");
  CHECK(to_string(net[2]) == "8 ranks from 1MiB: nccl");

  const ConfigResult twice = parse_config_toml(
      "[routes.all_reduce]\npcie = [\"4 ranks from 16MiB: nccl\", \"4 ranks from 16MiB: ring\"]\n", "twice.toml");
  REQUIRE(twice.errors.size() == 1);
  CHECK(twice.errors[0].key == "routes.all_reduce.pcie");
  CHECK(twice.errors[0].expected.find("at most one per rank count and size") != std::string::npos);
  CHECK(twice.config.routes[0][1].empty());

  const std::vector<std::string> env = {"FP8WIRE_ROUTES_REDUCE_SCATTER_NET=2 ranks from 2MiB: fp8, 2 ranks from 1GiB: nccl"};
  const ConfigResult e = load_config("", env);
  REQUIRE(e.ok());
  CHECK(e.config.routes[1][2].size() == 2);
  const ConfigResult bad = load_config("", {"FP8WIRE_ROUTES_ALL_GATHER_NVLINK=2 ranks from 2MiB: two_shot"});
  REQUIRE(bad.errors.size() == 1);
  CHECK(bad.errors[0].expected.find("fp8[/allgather|/sendrecv]") != std::string::npos);
}
