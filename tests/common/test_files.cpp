// Files in and out (common/output_file.hpp, common/input_limits.hpp, the TOML guard's limits): output
// written whole or not at all, a symbolic link planted at an output path refused and its target left
// untouched; JSON and TOML text past its nesting, token or size limit refused with where and which
// limit, before any parser (whose recursion a million-deep value would overflow) sees it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "common/input_limits.hpp"
#include "common/output_file.hpp"
#include "common/toml_guard.hpp"
#include "tests/common/scratch.hpp"

namespace fs = std::filesystem;
using namespace fp8wire;

namespace {
fs::path fresh_dir(const std::string& name) { return test::fresh_dir("files", name); }
std::string read(const fs::path& p) { return test::read_text(p); }
std::string deep_json(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }
}  // namespace

TEST_CASE("output files: written whole or not at all, and an unwritable path is an error naming it") {
  const fs::path dir = fresh_dir("whole");
  const std::string path = (dir / "report.json").string();
  std::string error;
  REQUIRE(write_file_atomically(path, "{\"a\":1}\n", error));
  CHECK(read(path) == "{\"a\":1}\n");
  REQUIRE(write_file_atomically(path, "{\"a\":2}\n", error));  // replaced whole
  CHECK(read(path) == "{\"a\":2}\n");
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);  // no temporary left

  CHECK(!write_file_atomically("/nonexistent-dir/report.json", "x", error));
  CHECK(error == "cannot write '/nonexistent-dir/report.json': No such file or directory");
  CHECK(!write_file_atomically("/tmp", "x", error));
  CHECK(error == "cannot write '/tmp': Is a directory");
  // A full device: /dev/full accepts the open and fails the write (caught at flush/close).
  struct stat st {};
  if (::stat("/dev/full", &st) == 0) {
    CHECK(!write_file_atomically("/dev/full", std::string(1 << 16, 'x'), error));
    CHECK(error == "cannot write '/dev/full': No space left on device");
  }
  // The system's links to an open stream are written through.
  CHECK(write_file_atomically("/dev/stdout", "", error));
  fs::remove_all(dir);
}

TEST_CASE("output files: a symbolic link planted at the path is refused, and what it points to is untouched") {
  const fs::path dir = fresh_dir("link");
  const fs::path victim = dir / "victim.txt";
  std::ofstream(victim) << "precious\n";
  const fs::path planted = dir / "report.json";
  fs::create_symlink(victim, planted);
  const std::string expected = fmt::format(
      "cannot write '{}': it is a symbolic link, which fp8wire does not write through (remove it, or give the path "
      "of the file it points to)",
      planted.string());
  std::string error;
  CHECK(!write_file_atomically(planted.string(), "overwritten\n", error));
  CHECK(error == expected);
  for (const OutputMode mode : {OutputMode::truncate, OutputMode::append}) {
    error.clear();
    CHECK(open_output(planted.string(), mode, error) < 0);
    CHECK(error == expected);
    CHECK(fopen_output(planted.string(), mode, error) == nullptr);
    CHECK(error == expected);
  }
  CHECK(read(victim) == "precious\n");
  CHECK(fs::is_symlink(planted));
  // A dangling link (to a file not yet there) is refused too, and creates nothing.
  const fs::path dangling = dir / "trace.json";
  fs::create_symlink(dir / "created-through-link", dangling);
  CHECK(fopen_output(dangling.string(), OutputMode::truncate, error) == nullptr);
  CHECK(!fs::exists(dir / "created-through-link"));
  // A folder given as a link is the user's choice and is followed.
  fs::create_directories(dir / "real");
  fs::create_directory_symlink(dir / "real", dir / "alias");
  CHECK(write_file_atomically((dir / "alias" / "r.json").string(), "ok\n", error));
  CHECK(read(dir / "real" / "r.json") == "ok\n");
  fs::remove_all(dir);
}

TEST_CASE("JSON limits: depth counted outside strings, past the limit refused with where and the limit") {
  CHECK(json_check_text(deep_json(kMaxInputDepth)).empty());
  CHECK(json_check_text(deep_json(kMaxInputDepth + 1)) ==
        fmt::format("line 1, column {}: JSON nested deeper than its limit of {} levels", kMaxInputDepth + 1,
                    kMaxInputDepth));
  // About a million deep (2 MB): refused at the first level past the limit, without recursion.
  CHECK(!json_check_text(deep_json(1'000'000)).empty());
  CHECK(!json_check_text(std::string(1'000'000, '{')).empty());
  // Brackets inside strings (escaped quotes too) are text, not nesting.
  const std::string in_string = "[\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"]";
  CHECK(json_check_text(in_string).empty());
  // Siblings do not add up: a wide document is as deep as its deepest branch.
  std::string wide = "[";
  for (int i = 0; i < 10000; ++i) wide += (i ? "," : "") + deep_json(10);
  CHECK(json_check_text(wide + "]").empty());
  // Position on a later line (the object is the first level).
  CHECK(json_check_text("{\n  \"a\": " + deep_json(300), {}).find("line 2, column 263") == 0);
  // Tokens and whole text, where a caller bounds them.
  CHECK(json_check_text("[\"" + std::string(100, 'x') + "\"]", {kMaxInputDepth, 0, 64}) ==
        "line 1, column 67: a JSON string or number longer than its limit of 64 bytes");
  CHECK(json_check_text("[" + std::string(100, '1') + "]", {kMaxInputDepth, 0, 64}).find("longer than its limit") !=
        std::string::npos);
  CHECK(json_check_text(std::string(3u << 20, ' '), {kMaxInputDepth, 2u << 20, 0}) ==
        "line 1, column 2097153: the JSON text is longer than its limit of 2097152 bytes (2 MiB)");
  // Fed in pieces (a stream), the count carries over.
  JsonScan scan;
  for (size_t i = 0; i < kMaxInputDepth; ++i) CHECK(scan.feed("["));
  CHECK(!scan.feed("["));
  CHECK(scan.what() == fmt::format("JSON nested deeper than its limit of {} levels", kMaxInputDepth));
}

TEST_CASE("bounded file reads: the size is checked before reading, the message names file, size and limit") {
  const fs::path dir = fresh_dir("bounded");
  const fs::path big = dir / "big.json";
  std::ofstream(big) << std::string(2000, ' ');
  std::string text, error;
  CHECK(!read_file_bounded(big.string(), 1024, "a test input", text, error));
  CHECK(error == big.string() + ": 2000 bytes, more than the limit of 1024 bytes for a test input");
  CHECK(read_file_bounded(big.string(), 2000, "a test input", text, error));
  CHECK(text.size() == 2000);
  CHECK(!read_file_bounded(dir.string(), 1024, "a test input", text, error));
  CHECK(error == dir.string() + ": is a directory, expected a test input");
  CHECK(!read_file_bounded((dir / "none").string(), 1024, "a test input", text, error));
  CHECK(error == (dir / "none").string() + ": cannot read: No such file or directory");
  fs::remove_all(dir);
}

TEST_CASE("TOML limits: nesting by tables, arrays, inline tables and dotted-key parts; size") {
  auto problem = [](const std::string& text) { return toml_check_text(text); };
  std::string dotted;
  for (int i = 0; i < 300'000; ++i) dotted += "a.";
  // A key or header of 300,000 parts (toml++ frees the tables it makes by recursion; a million parts
  // overflowed the stack): refused at the limit.
  for (const std::string& text : {dotted + "b = 1\n", "[" + dotted + "b]\nx = 1\n"}) {
    const TomlTextProblem p = problem(text);
    REQUIRE(p);
    CHECK(p.over_limit);
    CHECK(p.line == 1);
    CHECK(p.what == fmt::format("nested deeper than its limit of {} levels (each table, array, inline table and part "
                                "of a dotted key is one)",
                                kMaxInputDepth));
  }
  std::string parts;
  for (size_t i = 0; i + 1 < kMaxInputDepth; ++i) parts += "a.";
  CHECK(!problem(parts + "b = 1\n"));              // exactly the limit
  CHECK(problem(parts + "b.c = 1\n").over_limit);  // one past it
  // The levels add up across a header, a dotted key and nested values.
  std::string half;
  for (size_t i = 0; i < kMaxInputDepth / 2; ++i) half += "a.";
  CHECK(problem("[" + half + "t]\n" + half + "k = 1\n").over_limit);
  CHECK(problem("x = " + std::string(kMaxInputDepth + 1, '[') + std::string(kMaxInputDepth + 1, ']') + "\n").over_limit);
  std::string inline_tables = "x = ";
  for (size_t i = 0; i < kMaxInputDepth; ++i) inline_tables += "{a = ";
  CHECK(!problem(inline_tables + "1" + std::string(kMaxInputDepth, '}') + "\n"));
  CHECK(problem(inline_tables + "{a = 1}" + std::string(kMaxInputDepth, '}') + "\n").over_limit);
  // Wide files are not deep: many keys, many array elements, many tables.
  std::string wide;
  for (int i = 0; i < 2000; ++i) wide += fmt::format("[t{}]\nk{} = [{{a = 1}}, {{b = [1, 2]}}]\na.b.c = 2\n", i, i);
  CHECK(!problem(wide));
  CHECK(!problem("x = 1.5\ny = [1.5, 2.5]\n\"a.b\" = 1\n[[arr.t]]\nk = 'a.b.c'\n"));
  const TomlTextProblem big = problem(std::string(kMaxTomlBytes + 1, '#'));
  REQUIRE(big);
  CHECK(big.over_limit);
  CHECK(big.what == fmt::format("the TOML text is {} bytes, more than its limit of 1048576 bytes (1 MiB)",
                                kMaxTomlBytes + 1));
}
