// The log sink (common/log.cpp): a log.file is created only when a line is written (the library
// loads into every process the environment reaches, and most never log), "%p" names each process's
// own file (a forked child's too), "%r" waits for the rank, an unopenable path falls back to stderr.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "common/log.hpp"
#include "tests/common/scratch.hpp"

namespace fs = std::filesystem;
using namespace fp8wire;

namespace {
fs::path fresh_dir(const std::string& name) { return test::fresh_dir("log", name); }
size_t files_in(const fs::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}
std::string read(const fs::path& p) { return test::read_text(p); }
}  // namespace

TEST_CASE("log.file: no file until a line is written; %p is this process, a forked child gets its own") {
  const fs::path dir = fresh_dir("pid");
  log_set_level(LogLevel::warn);
  log_set_file((dir / "fp8wire-%p.log").string());
  FP8WIRE_INFO("below the level: not written, no file");
  CHECK(files_in(dir) == 0);

  FP8WIRE_WARN("first line from {}", ::getpid());
  const fs::path mine = dir / fmt::format("fp8wire-{}.log", ::getpid());
  REQUIRE(fs::exists(mine));
  CHECK(read(mine).find(fmt::format("first line from {}", ::getpid())) != std::string::npos);

  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    FP8WIRE_WARN("child line");
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  const fs::path theirs = dir / fmt::format("fp8wire-{}.log", child);
  REQUIRE(fs::exists(theirs));
  CHECK(read(theirs).find("child line") != std::string::npos);
  CHECK(read(mine).find("child line") == std::string::npos);
  log_set_file("");
  fs::remove_all(dir);
}

TEST_CASE("log.file: %r waits for the rank, then each rank's file") {
  const fs::path dir = fresh_dir("rank");
  log_set_level(LogLevel::warn);
  log_set_rank(-1);
  log_set_file((dir / "fp8wire-%r.log").string());
  FP8WIRE_WARN("before the rank is known: stderr");
  CHECK(files_in(dir) == 0);
  log_set_rank(3);
  FP8WIRE_WARN("rank three");
  CHECK(read(dir / "fp8wire-3.log").find("rank three") != std::string::npos);
  log_set_rank(-1);
  log_set_file("");
  fs::remove_all(dir);
}

TEST_CASE("log.file: a symbolic link planted at the path is refused; lines go to stderr, the target is untouched") {
  const fs::path dir = fresh_dir("link");
  const fs::path victim = dir / "victim.txt";
  std::ofstream(victim) << "precious\n";
  fs::create_symlink(victim, dir / "fp8wire.log");
  log_set_level(LogLevel::warn);
  log_set_file((dir / "fp8wire.log").string());
  // stderr into a file for the while: the refusal is said there, with the line after it.
  const fs::path captured = dir / "stderr.txt";
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int capture = ::open(captured.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ::dup2(capture, 2);
  FP8WIRE_WARN("must not reach the victim");
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(capture);
  log_set_file("");
  const std::string said = read(captured);
  CHECK(said.find(fmt::format("fp8wire ERROR log.file: cannot write '{}': it is a symbolic link",
                              (dir / "fp8wire.log").string())) == 0);
  CHECK(said.find("must not reach the victim") != std::string::npos);
  CHECK(read(victim) == "precious\n");
  CHECK(fs::is_symlink(dir / "fp8wire.log"));
  fs::remove_all(dir);
}

TEST_CASE("log.file: a path that cannot be opened falls back to stderr and creates nothing") {
  log_set_level(LogLevel::warn);
  log_set_file("/nonexistent-dir/fp8wire-%p.log");
  FP8WIRE_WARN("to stderr");
  FP8WIRE_WARN("to stderr again, without a second open error");
  CHECK(!fs::exists("/nonexistent-dir"));
  log_set_file("");
}
