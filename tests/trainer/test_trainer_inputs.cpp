// Bad input to the trainer, CPU tier: config files and values (a directory, NaN/Inf, wrongly typed
// or placed keys, non-ASCII toml++ 3.3 misreads), damaged checkpoints (flipped bits anywhere, a
// truncated file, hand-made headers with wrong JSON types or impossible sizes, overlapping tensor
// ranges, nesting past the input limits, a lost checksum), presets past the TOML limits, and shards
// whose tensors have the wrong rank or dtype. Every case must end in an error that names
// the file (and the entry), never in an exception from the standard library or a silent load.
#include <ATen/ATen.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "trainer/config.hpp"
#include "trainer/data.hpp"
#include "trainer/train.hpp"

#include "tests/trainer/trainer_test.hpp"

using namespace fp8wire::trainer;

namespace {

// Files of this test live under one folder per process; each test removes what it wrote.
std::string scratch(const std::string& name) {
  const std::string dir = fmt::format("/tmp/fp8wire-trainer-inputs-{}", ::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir + "/" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

// A safetensors file from a header given as JSON and raw data bytes.
void write_raw_safetensors(const std::string& path, const nlohmann::json& header, const std::string& data) {
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char((uint64_t(text.size()) >> (8 * i)) & 0xFF);
  write_file(path, bytes + text + data);
}

// The header length and JSON text of a safetensors file.
uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[size_t(i)])) << (8 * i);
  return n;
}

std::string resume_error(const Config& c, const std::string& path) {
  Trainer t(c, 0, 1, {});
  return t.resume(path);
}

}  // namespace

TEST_CASE("config: a directory, NaN/Inf, out-of-range values and a mistyped preset name are errors") {
  Config c;
  std::string err = load_config_file(FP8WIRE_TRAINER_CONFIG_DIR, c);
  CHECK(err.find("is a directory, expected a TOML preset file") != std::string::npos);
  CHECK(load_config_file("/nonexistent/preset.toml", c).find("/nonexistent/preset.toml: cannot read") == 0);

  for (const char* key : {"train.bucket_cap_mb", "train.peak_lr", "train.end_lr", "train.eps", "train.beta1",
                          "train.clip_norm", "train.weight_decay", "train.peak_tflops", "model.rope_base",
                          "model.time_min_period"}) {
    for (const char* value : {"nan", "inf", "-inf"}) {
      c = tiny_config();
      CAPTURE(key);
      CAPTURE(value);
      REQUIRE(apply_override(fmt::format("{}={}", key, value), c) == "");  // typed: a double
      err = validate(c);
      CHECK(err.find(key) == 0);
      CHECK(err.find("expected a finite number") != std::string::npos);
    }
  }
  c = tiny_config();
  c.train.beta2 = 1.0;
  CHECK(validate(c).find("train.beta1/beta2") == 0);
  c = tiny_config();
  c.train.bucket_cap_mb = -1;
  CHECK(validate(c) == "train.bucket_cap_mb: got -1, expected a positive number");
  c = tiny_config();
  c.train.save_every = -2;
  CHECK(validate(c) == "train.save_every: got -2, expected 0 or more");
  // TOML spells NaN and Inf too.
  c = Config{};
  CHECK(load_config_string("[train]\nbucket_cap_mb = nan\n", c) == "train.bucket_cap_mb: got nan, expected a finite number");
  CHECK(load_config_string("preset = 3\n", c).find("preset: got the integer 3, expected a string") == 0);

  // Overrides move related keys together; only the end result is validated.
  c = tiny_config();
  REQUIRE(apply_override("data.raw_action_dim=40", c) == "");
  REQUIRE(apply_override("model.action_dim=48", c) == "");
  CHECK(validate(c) == "");
}

TEST_CASE("config: non-ASCII that toml++ 3.3 would misread is an error with line and column, not undefined behaviour") {
  Config c;
  CHECK(load_config_string("[train]\nsteps = 3\n\xc2\xa7 = 1\n", c) ==
        "TOML error at line 3, column 1: non-ASCII character U+00A7 outside a quoted string or comment (TOML allows "
        "non-ASCII only in strings and comments; quote the key or value)");
  CHECK(load_config_string("[train]\nout_dir = \"x\" \xc3\xa9\n", c).find("line 2, column 15: non-ASCII character U+00E9") !=
        std::string::npos);
  CHECK(load_config_string("[train]\nout_dir = \"\"\"\\\n\xc2\xa7\"\"\"\n", c).find("write it as \\u00A7") !=
        std::string::npos);
  CHECK(load_config_string("[train]\nout_dir = \"\"\"\\\xc3\xa9\"\"\"\n", c).find("right after a backslash") !=
        std::string::npos);
  // Legal places: strings, comments, a CJK character after a line-ending backslash (not misread).
  c = Config{};
  CHECK(load_config_string("# r\xc3\xa9sum\xc3\xa9\n[train]\nout_dir = \"out/\xc3\xa9t\xc3\xa9\" # \xc2\xa7\n", c) == "");
  CHECK(c.train.out_dir == "out/\xc3\xa9t\xc3\xa9");
  CHECK(load_config_string("[train]\nout_dir = \"\"\"\\\n  \xe4\xb8\xad\"\"\"\n", c) == "");
  CHECK(c.train.out_dir == "\xe4\xb8\xad");
}

TEST_CASE("checkpoints: a flipped bit anywhere, a truncation or a lost checksum is an error naming the file") {
  Config c = tiny_config();
  auto source = make_synthetic_source(c);
  const std::string path = scratch("ckpt.safetensors");
  {
    Trainer a(c, 0, 1, {});
    a.step(source->get(0, 4));
    REQUIRE(a.save(path) == "");
  }
  const std::string good = read_file(path);
  REQUIRE(resume_error(c, path) == "");
  const uint64_t n = header_length(good);
  const std::string header = good.substr(8, n);
  REQUIRE(header.find("\"fp8wire_crc32\"") != std::string::npos);
  REQUIRE(header.find("fp8wire-trainer-v2") != std::string::npos);

  const std::string damaged = scratch("damaged.safetensors");
  // One bit in the tensor data, in the first and the last byte, and in several places between.
  for (size_t at : {size_t(8 + n), good.size() / 2, good.size() - 1}) {
    std::string bytes = good;
    bytes[at] = char(bytes[at] ^ 0x10);
    write_file(damaged, bytes);
    const std::string err = resume_error(c, damaged);
    CAPTURE(at);
    CHECK(err.find(damaged + ": checksum mismatch") == 0);
  }
  // One bit in a header value: the step number (still valid JSON, still a plausible checkpoint).
  {
    std::string bytes = good;
    const size_t step_at = bytes.find("\"step\":\"1\"");
    REQUIRE(step_at != std::string::npos);
    bytes[step_at + 8] = '3';  // '1' -> '3' is one bit
    write_file(damaged, bytes);
    CHECK(resume_error(c, damaged).find(damaged + ": checksum mismatch") == 0);
  }
  // The checksum key itself damaged: a v2 checkpoint without it is refused.
  {
    std::string bytes = good;
    const size_t key_at = bytes.find("fp8wire_crc32");
    bytes[key_at] = 'g';
    write_file(damaged, bytes);
    CHECK(resume_error(c, damaged).find("fp8wire_crc32 is missing from a fp8wire-trainer-v2 checkpoint") !=
          std::string::npos);
  }
  // Truncated: to the header, inside the header, inside the length.
  for (size_t keep : {size_t(8 + n + 100), size_t(8 + n / 2), size_t(5)}) {
    write_file(damaged, good.substr(0, keep));
    const std::string err = resume_error(c, damaged);
    CAPTURE(keep);
    CHECK(err.find(damaged + ": ") == 0);
  }
  std::remove(damaged.c_str());
  std::remove(path.c_str());
}

TEST_CASE("checkpoints: hand-made headers with wrong types or impossible sizes are errors naming file and entry") {
  const std::string path = scratch("hand.safetensors");
  TensorMap none;
  const struct {
    nlohmann::json header;
    const char* expected;
  } cases[] = {
      {{{"w", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", nlohmann::json::array()}}}},
       "tensor 'w': data_offsets is [], expected [begin, end]"},
      {{{"w", {{"dtype", 7}, {"shape", {2}}, {"data_offsets", {0, 8}}}}}, "tensor 'w': dtype is the number 7"},
      {{{"w", {{"dtype", "F32"}, {"shape", "two"}, {"data_offsets", {0, 8}}}}}, "tensor 'w': shape is the string \"two\""},
      {{{"w", {{"dtype", "F32"}, {"shape", {-2}}, {"data_offsets", {0, 8}}}}}, "expected non-negative integers"},
      {{{"w", {{"dtype", "F32"}, {"shape", {4611686018427387904ull, 4}}, {"data_offsets", {0, 8}}}}},
       "is larger than the file"},
      {{{"w", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {8, 0}}}}}, "inconsistent with its shape"},
      {{{"w", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 800}}}}}, "inconsistent with its shape"},
      {{{"w", "tensor"}}, "tensor 'w': entry is the string \"tensor\", expected an object"},
      {{{"__metadata__", {"a", "b"}}}, "__metadata__ is an array, expected an object"},
      {{{"w", {{"dtype", "Q4"}, {"shape", {2}}, {"data_offsets", {0, 8}}}}}, "unsupported dtype 'Q4'"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.expected);
    write_raw_safetensors(path, c.header, std::string(8, '\0'));
    const std::string err = read_safetensors(path, none);
    CHECK(err.find(path + ": ") == 0);
    CHECK(err.find(c.expected) != std::string::npos);
  }
  // A checkpoint without the generator state, or with a wrong one: errors naming the entry.
  Config c = tiny_config();
  const std::string ckpt = scratch("ckpt_rng.safetensors");
  {
    Trainer a(c, 0, 1, {});
    REQUIRE(a.save(ckpt) == "");
  }
  TensorMap tensors;
  Metadata meta;
  REQUIRE(read_safetensors(ckpt, tensors, &meta) == "");
  meta.erase(kChecksumKey);
  tensors.erase("rng/noise_generator");
  REQUIRE(write_safetensors(ckpt, tensors, meta) == "");
  CHECK(resume_error(c, ckpt) == ckpt + ": missing 'rng/noise_generator'");
  tensors["rng/noise_generator"] = at::zeros({3}, at::kFloat);
  REQUIRE(write_safetensors(ckpt, tensors, meta) == "");
  CHECK(resume_error(c, ckpt).find(ckpt + ": 'rng/noise_generator' is Float [3], expected U8") == 0);
  // A checkpoint of the format before checksums still resumes (with a warning).
  {
    Trainer a(c, 0, 1, {});
    REQUIRE(a.save(ckpt) == "");
  }
  tensors.clear();
  meta.clear();
  REQUIRE(read_safetensors(ckpt, tensors, &meta) == "");
  meta["format"] = "fp8wire-trainer-v1";
  meta.erase(kChecksumKey);
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    const at::Tensor cpu = t.contiguous();
    header[name] = {{"dtype", t.scalar_type() == at::kByte ? "U8" : "F32"},
                    {"shape", cpu.sizes().vec()},
                    {"data_offsets", {data.size(), data.size() + cpu.nbytes()}}};
    data.append(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes());
  }
  header["__metadata__"] = meta;
  write_raw_safetensors(ckpt, header, data);
  CHECK(resume_error(c, ckpt) == "");
  std::remove(ckpt.c_str());
  std::remove(path.c_str());
}

TEST_CASE("checkpoints: overlapping ranges are refused before anything is allocated") {
  const std::string path = scratch("overlap.safetensors");
  TensorMap none;
  const std::string data(64, '\0');
  // Two tensors sharing bytes: the format gives every tensor bytes of its own.
  write_raw_safetensors(path,
                        {{"a", {{"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {0, 32}}}},
                         {"b", {{"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {16, 48}}}}},
                        data);
  CHECK(read_safetensors(path, none) == path + ": tensors 'a' (data_offsets [0, 32]) and 'b' (data_offsets [16, 48]) "
                                               "overlap; the format gives every tensor bytes of its own");
  // Many entries that each span the whole file: the reader allocated that many times the file's size
  // before its checksum could fail; now the second entry ends it.
  const size_t spans = 20000;
  const std::string big(4u << 20, '\0');
  nlohmann::json header = nlohmann::json::object();
  for (size_t i = 0; i < spans; ++i)
    header[fmt::format("t{:05}", i)] = {{"dtype", "U8"}, {"shape", {big.size()}}, {"data_offsets", {0, big.size()}}};
  write_raw_safetensors(path, header, big);
  const auto start = std::chrono::steady_clock::now();
  const std::string err = read_safetensors(path, none);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 5);
  CHECK(err.find(path + ": tensors 't00000' (data_offsets [0, 4194304]) and 't00001' (data_offsets [0, 4194304]) "
                        "overlap") == 0);
  // The header-only reader (the shard source) refuses it too, and out-of-file and reversed ranges
  // are errors as before.
  std::map<std::string, SafetensorsEntry> entries;
  CHECK(read_safetensors_header(path, entries).find("overlap") != std::string::npos);
  write_raw_safetensors(path, {{"a", {{"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {40, 72}}}}}, data);
  CHECK(read_safetensors(path, none).find("data_offsets [40, 72] inconsistent with its shape [8] of F32 (32 bytes) or "
                                          "the file size") != std::string::npos);
  // Zero-byte tensors take no bytes and overlap nothing.
  write_raw_safetensors(path,
                        {{"a", {{"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {0, 32}}}},
                         {"e", {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {16, 16}}}}},
                        data);
  CHECK(read_safetensors(path, none) == "");
  std::remove(path.c_str());
}

TEST_CASE("checkpoints: a header or __metadata__ nested a million deep is an error, never a stack overflow") {
  const std::string path = scratch("deep.safetensors");
  const std::string nest = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  for (const std::string& text : {R"({"__metadata__":{"note":)" + nest + "}}",
                                  R"({"w":{"dtype":"F32","shape":)" + nest + R"(,"data_offsets":[0,0]}})"}) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char((uint64_t(text.size()) >> (8 * i)) & 0xFF);
    write_file(path, bytes + text);
    TensorMap none;
    const std::string err = read_safetensors(path, none);
    CHECK(err.find(path + ": header: line 1, column ") == 0);
    CHECK(err.find(": JSON nested deeper than its limit of 256 levels") != std::string::npos);
  }
  std::remove(path.c_str());
}

TEST_CASE("presets: a TOML preset past the input limits is an error naming the file and the limit") {
  std::string deep;
  for (int i = 0; i < 300'000; ++i) deep += "a.";
  const std::string dotted = scratch("deep.toml");
  write_file(dotted, "[model]\n" + deep + "b = 1\n");
  Config c;
  CHECK(load_config_file(dotted, c) ==
        dotted + ": TOML error at line 2, column 510: nested deeper than its limit of 256 levels (each table, array, "
                 "inline table and part of a dotted key is one)");
  const std::string big = scratch("big.toml");
  write_file(big, std::string((1u << 20) + 1, '#'));
  CHECK(load_config_file(big, c) == big + ": 1048577 bytes, more than the limit of 1048576 bytes (1 MiB) for a TOML "
                                          "preset");
  std::remove(dotted.c_str());
  std::remove(big.c_str());
}

TEST_CASE("shards: a tensor of the wrong rank (a scalar) or dtype is an error naming the shard and tensor") {
  Config c = tiny_config();
  auto source = make_synthetic_source(c);
  const std::string dir = scratch("shards");
  ::mkdir(dir.c_str(), 0755);
  const std::string shard = dir + "/shard-00000.safetensors";
  const Batch b = source->get(0, 3);
  TensorMap t = {{"images", b.images}, {"image_mask", b.image_mask}, {"tokens", b.tokens.to(at::kInt)},
                 {"token_mask", b.token_mask}, {"actions", at::zeros({}, at::kFloat)}};
  REQUIRE(write_safetensors(shard, t, {{"format", "fp8wire-libero-v1"}}) == "");
  c.data.source = "shards";
  c.data.shard_dir = dir;
  std::unique_ptr<DataSource> out;
  std::string err = make_shard_source(c, out);
  CHECK(err.find(shard + ": tensor 'actions' has shape [], expected [samples, ") == 0);
  t["actions"] = b.actions.narrow(2, 0, c.data.raw_action_dim).to(at::kDouble);
  REQUIRE(write_safetensors(shard, t, {{"format", "fp8wire-libero-v1"}}) == "");
  err = make_shard_source(c, out);
  CHECK(err == shard + ": tensor 'actions' has dtype F64, expected F32");
  t["actions"] = b.actions.narrow(2, 0, c.data.raw_action_dim).contiguous();
  REQUIRE(write_safetensors(shard, t, {{"format", "fp8wire-libero-v1"}}) == "");
  CHECK(make_shard_source(c, out) == "");
  CHECK(out->size() == 3);
  std::remove(shard.c_str());
  ::rmdir(dir.c_str());
}
