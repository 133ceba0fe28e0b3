// Files in and out (common/output_file.hpp): output written whole or not at all, a symbolic link
// planted at an output path refused and its target left untouched.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "common/output_file.hpp"

namespace fs = std::filesystem;
using namespace fp8wire;

namespace {
fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("fp8wire_test_files_{}_{}", ::getpid(), name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}
std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
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
