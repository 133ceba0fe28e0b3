// The launcher's private MPS daemon, with a stand-in nvidia-cuda-mps-control on PATH that records
// how it was called: a private pipe directory (never the default one), the daemon started before the
// ranks and sent `quit` after them, its environment reaching every rank, FP8WIRE_MPS=0 and a missing
// program both giving time-sliced ranks, a daemon that fails to start giving time-sliced ranks too.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/rank_launcher.hpp"

using namespace fp8wire;
namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A scratch directory with a fake nvidia-cuda-mps-control in bin/, put first on PATH for the test's
// life. The fake appends one line per call to calls.log: its arguments, the two MPS variables and
// what came on stdin; with FAKE_MPS_FAIL set it exits 1 as a daemon that cannot start would.
struct FakeMps {
  fs::path dir, bin, calls;
  std::string old_path;
  std::string old_mps;
  bool had_mps = false;

  explicit FakeMps(bool install = true) {
    char templ[] = "/tmp/fp8wire-mps-test-XXXXXX";
    REQUIRE(::mkdtemp(templ));
    dir = templ;
    bin = dir / "bin";
    calls = dir / "calls.log";
    fs::create_directories(bin);
    if (install) {
      const fs::path script = bin / "nvidia-cuda-mps-control";
      std::ofstream f(script);
      f << "#!/bin/sh\n"
           "input=$(cat)\n"
           "echo \"args=[$*] pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY stdin=[$input]\" >> '"
        << calls.string()
        << "'\n"
           "[ -n \"$FAKE_MPS_FAIL\" ] && { echo 'cannot start' > \"$CUDA_MPS_LOG_DIRECTORY/control.log\"; exit 1; }\n"
           "exit 0\n";
      f.close();
      ::chmod(script.c_str(), 0755);
    }
    old_path = std::getenv("PATH") ? std::getenv("PATH") : "";
    // Without the fake, PATH must still not reach a real one: only the scratch bin and /bin for sh.
    const std::string path = bin.string() + ":/bin:/usr/bin";
    ::setenv("PATH", path.c_str(), 1);
    if (const char* m = std::getenv("FP8WIRE_MPS")) {
      had_mps = true;
      old_mps = m;
    }
    ::unsetenv("FP8WIRE_MPS");
    ::unsetenv("FP8WIRE_TESTBED_MODE");
    ::unsetenv("CUDA_MPS_PIPE_DIRECTORY");
    ::unsetenv("FAKE_MPS_FAIL");
  }
  ~FakeMps() {
    ::setenv("PATH", old_path.c_str(), 1);
    if (had_mps) ::setenv("FP8WIRE_MPS", old_mps.c_str(), 1);
    else ::unsetenv("FP8WIRE_MPS");
    ::unsetenv("FAKE_MPS_FAIL");
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  // Every rank writes the MPS variables it got to rank<R>.env.
  LaunchSpec spec(int nranks) const {
    LaunchSpec s;
    s.argv = {"/bin/sh", "-c",
              "echo \"mode=$FP8WIRE_TESTBED_MODE pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY "
              "host=$NCCL_HOSTID\" > '" + dir.string() + "/rank'$RANK.env"};
    s.nranks = nranks;
    s.timeout_s = 20;
    s.kill_grace_s = 1;
    s.one_gpu = true;
    s.quiet = true;
    return s;
  }

  // Two ranks sharing a GPU, which must start and end well and run time-sliced: the launch's note
  // on why.
  std::string time_sliced_note() const {
    const LaunchResult res = launch_local_ranks(spec(2));
    REQUIRE_MESSAGE(res.ok, res.error);
    CHECK(res.testbed == "time-sliced");
    return res.testbed_note;
  }
};

}  // namespace

TEST_CASE("mps: a private daemon is started, reaches every rank and is sent quit") {
  FakeMps fake;
  const LaunchResult res = launch_local_ranks(fake.spec(2));
  REQUIRE_MESSAGE(res.ok, res.error);
  CHECK(res.testbed == "mps");
  CHECK(contains(res.testbed_note, "side by side under a private MPS daemon"));

  const std::string calls = fake.calls.string();
  std::ifstream log(calls);
  std::string start, quit, extra;
  REQUIRE(std::getline(log, start));
  REQUIRE(std::getline(log, quit));
  CHECK_FALSE(std::getline(log, extra));  // exactly two calls
  CHECK(contains(start, "args=[-d]"));
  CHECK(contains(quit, "args=[]"));
  CHECK(contains(quit, "stdin=[quit]"));

  // The pipe directory is a fresh private one, the same for start, quit and every rank.
  const auto field = [](const std::string& line, const std::string& key) {
    const size_t at = line.find(key + "=");
    if (at == std::string::npos) return std::string();
    const size_t from = at + key.size() + 1;
    return line.substr(from, line.find(' ', from) - from);
  };
  const std::string pipe = field(start, "pipe");
  CHECK(contains(pipe, "/fp8wire-mps-"));
  CHECK(pipe != "/tmp/nvidia-mps");
  CHECK(field(quit, "pipe") == pipe);
  CHECK(field(start, "log") != "");
  CHECK(field(start, "log") != "/var/log/nvidia-mps");
  for (int r = 0; r < 2; ++r) {
    const std::string env = read(fake.dir / ("rank" + std::to_string(r) + ".env"));
    CHECK(contains(env, "mode=mps"));
    CHECK(field(env, "pipe") == pipe);
    CHECK(field(env, "log") == field(start, "log"));
    CHECK(contains(env, "host=emulated-host-" + std::to_string(r)));
  }
  CHECK_FALSE(fs::exists(fs::path(pipe).parent_path()));  // the private directory is removed
}

TEST_CASE("mps: FP8WIRE_MPS=0 gives time-sliced ranks and never calls the control program") {
  FakeMps fake;
  ::setenv("FP8WIRE_MPS", "0", 1);
  CHECK(contains(fake.time_sliced_note(), "FP8WIRE_MPS=0"));
  CHECK_FALSE(fs::exists(fake.calls));
  const std::string env = read(fake.dir / "rank1.env");
  CHECK(contains(env, "mode=time-sliced pipe= "));
}

TEST_CASE("mps: without nvidia-cuda-mps-control the ranks are time-sliced and told so") {
  FakeMps fake(/*install=*/false);
  CHECK(contains(fake.time_sliced_note(), "not found on PATH"));
  CHECK(contains(read(fake.dir / "rank0.env"), "mode=time-sliced"));
}

TEST_CASE("mps: a daemon that fails to start falls back to time-sliced, with its log") {
  FakeMps fake;
  ::setenv("FAKE_MPS_FAIL", "1", 1);
  const std::string note = fake.time_sliced_note();
  CHECK(contains(note, "did not start"));
  CHECK(contains(note, "cannot start"));
  CHECK(contains(read(fake.calls), "args=[-d]"));
  CHECK_FALSE(contains(read(fake.calls), "stdin=[quit]"));  // nothing to stop
}

TEST_CASE("mps: a launch inside an enclosing launcher's daemon joins it and leaves it running") {
  FakeMps fake;
  ::setenv("FP8WIRE_TESTBED_MODE", "mps", 1);
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/outer-pipe", 1);
  const LaunchResult res = launch_local_ranks(fake.spec(2));
  ::unsetenv("FP8WIRE_TESTBED_MODE");
  ::unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  REQUIRE_MESSAGE(res.ok, res.error);
  CHECK(res.testbed == "mps");
  CHECK_FALSE(fs::exists(fake.calls));  // neither started nor stopped here
  CHECK(contains(read(fake.dir / "rank0.env"), "pipe=/tmp/outer-pipe"));
}

TEST_CASE("mps: ranks on GPUs of their own get no daemon") {
  FakeMps fake;
  LaunchSpec spec = fake.spec(2);
  spec.one_gpu = false;
  const LaunchResult res = launch_local_ranks(spec);
  REQUIRE_MESSAGE(res.ok, res.error);
  CHECK(res.testbed.empty());
  CHECK_FALSE(fs::exists(fake.calls));
}

TEST_CASE("mps: the daemon is stopped when a rank fails") {
  FakeMps fake;
  LaunchSpec spec = fake.spec(2);
  spec.argv = {"/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 30"};
  const LaunchResult res = launch_local_ranks(spec);
  CHECK_FALSE(res.ok);
  CHECK(contains(read(fake.calls), "stdin=[quit]"));
}

TEST_CASE("mps: a launcher stopped by SIGTERM stops its ranks and the daemon, then ends by SIGTERM") {
  FakeMps fake;
  LaunchSpec spec = fake.spec(2);
  spec.argv = {"/bin/sh", "-c", "exec sleep 30"};
  const pid_t launcher = ::fork();
  REQUIRE(launcher >= 0);
  if (launcher == 0) {
    launch_local_ranks(spec);
    ::_exit(0);  // not reached: the launcher re-raises SIGTERM
  }
  // Wait for the daemon to be started (the first call), then interrupt.
  for (int i = 0; i < 200 && !fs::exists(fake.calls); ++i) ::usleep(10000);
  ::usleep(100000);
  ::kill(launcher, SIGTERM);
  int status = 0;
  REQUIRE(::waitpid(launcher, &status, 0) == launcher);
  CHECK(WIFSIGNALED(status));
  if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGTERM);
  CHECK(contains(read(fake.calls), "stdin=[quit]"));
}
