// libfp8wire.so against a fake libnccl.so.2 that records every call (fake_nccl.cpp). Each scenario
// runs shim_probe in a fresh process, since the shim's state is set up once per process:
// symbol resolution (RTLD_NEXT, RTLD_NOLOAD, explicit nccl.library, none at all), exact argument
// forwarding for every export, the re-entry guard, configuration errors, the C API, the exported
// symbol set, and the pass-through cost.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/cuda_devices.hpp"
#include "probe_script.hpp"
#include "sched/plan/types.hpp"
#include "shim/fp8wire.h"
#include "shim/reentry_guard.hpp"

namespace {

struct Run {
  int exit_code = -1;
  std::string output;  // stdout and stderr together (the shim logs to stderr)
  std::vector<std::string> fake_log;
  std::vector<std::pair<std::string, int>> rcs;
  std::string config_at;  // address of the probe's ncclConfig_t, as the fake prints pointers
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Starts `program` with exactly `env` (plus PATH), so FP8WIRE_* variables of the CI shell cannot
// leak into a scenario.
Run run(const std::string& program, const std::vector<std::string>& args, std::vector<std::string> env) {
  env.push_back("PATH=/usr/bin:/bin");
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  std::vector<char*> argv{const_cast<char*>(program.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  REQUIRE(spawned == 0);
  Run r;
  char buffer[4096];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) r.output.append(buffer, n);
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  bool in_log = false;
  for (const auto& line : lines_of(r.output)) {
    if (line == "fake-log-begin") in_log = true;
    else if (line == "fake-log-end") in_log = false;
    else if (in_log) r.fake_log.push_back(line);
    else if (line.rfind("config-at ", 0) == 0) r.config_at = line.substr(10);
    else if (line.rfind("rc ", 0) == 0) {
      const size_t space = line.rfind(' ');
      r.rcs.emplace_back(line.substr(3, space - 3), std::stoi(line.substr(space + 1)));
    }
  }
  return r;
}

const std::string kShim = SHIM_PATH;
const std::string kFake = FAKE_NCCL_PATH;
const std::string kFakeBefore228 = FAKE_NCCL_BEFORE_2_28_PATH;  // the same without ncclAlltoAll

Run probe_linked(const std::string& script, std::vector<std::string> env) {
  env.push_back("LD_PRELOAD=" + kShim);
  return run(PROBE_LINKED_PATH, {"--mode", "linked", "--script", script}, env);
}
Run run_probe(const std::string& mode, const std::string& script, std::vector<std::string> env) {
  return run(PROBE_PATH, {"--mode", mode, "--script", script, "--shim", kShim, "--fake", kFake}, env);
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The agreement at communicator creation (docs/DESIGN.md): every process running the library,
// disabled or not, all-gathers 64 bytes of its own right after each blocking creation, so that ranks
// with different settings still agree. Those bytes live on the GPU: a machine without one (CI) has
// no exchange, a machine with one has one after each creation but ncclCommInitAll (one process for
// every rank, no exchange). Returns the log without those all-gathers, each checked to follow the
// creation of its communicator, on buffers that are not the application's; counts them.
std::vector<std::string> without_agreement(const std::vector<std::string>& log, int& exchanges) {
  const std::string app_send = fmt::format("send={:#x}", probe::kSend);
  const std::string shape = fmt::format("sendcount=64, dtype={}, comm=", static_cast<int>(ncclUint8));
  std::vector<std::string> rest;
  std::string created;  // the communicator the line before created, if any
  for (const auto& line : log) {
    if (!created.empty() && line.rfind("ncclAllGather(", 0) == 0 && count_of(line, shape + created + ",") == 1 &&
        count_of(line, app_send) == 0) {
      ++exchanges;
      created.clear();
      continue;
    }
    created.clear();
    const size_t arrow = line.rfind(" -> 0x");
    if (line.rfind("ncclComm", 0) == 0 && line.rfind("ncclCommInitAll(", 0) != 0 && arrow != std::string::npos)
      created = line.substr(arrow + 4);
    rest.push_back(line);
  }
  return rest;
}

// The calls of the "all" script (probe_script.hpp).
constexpr size_t kAllCalls = 22;

// The probe ended normally after `calls` calls of its script, each returning `expected(its name)`.
void check_every_call_returned(const Run& r, size_t calls,
                               const std::function<ncclResult_t(const std::string&)>& expected) {
  CHECK(r.exit_code == 0);
  REQUIRE(r.rcs.size() == calls);
  for (const auto& [name, rc] : r.rcs) {
    CAPTURE(name);
    CHECK(rc == expected(name));
  }
}
// The same, every call returning `expected`.
void check_every_call_returned(const Run& r, size_t calls, ncclResult_t expected) {
  check_every_call_returned(r, calls, [expected](const std::string&) { return expected; });
}

// The engine is free to ask the fake questions (those are not recorded) but every application
// call must arrive exactly once, unchanged, in order, and the library adds nothing but the agreement.
void check_forwarded_exactly(const Run& r) {
  INFO(r.output);
  check_every_call_returned(r, kAllCalls, ncclSuccess);
  int exchanges = 0;
  CHECK(without_agreement(r.fake_log, exchanges) == probe::expected_all(r.config_at));
  // InitRank, InitRankConfig, InitRankScalable, Split and Shrink each agree where a GPU is seen.
  static const bool gpu = fp8wire::visible_cuda_devices() > 0;
  CHECK(exchanges == (gpu ? 5 : 0));
}

// Enabled, but nothing eligible: the engine sits in between. The application's calls must all be
// there in order; the engine may add its own calls, none of them on the application's buffers.
void check_forwarded_through_engine(const Run& r) {
  INFO(r.output);
  check_every_call_returned(r, kAllCalls, ncclSuccess);
  const auto expected = probe::expected_all(r.config_at);
  size_t next = 0;
  for (const auto& line : r.fake_log)
    if (next < expected.size() && line == expected[next]) ++next;
  CHECK_MESSAGE(next == expected.size(), "first missing: " << (next < expected.size() ? expected[next] : ""));
  const std::string app_send = fmt::format("send={:#x}", probe::kSend);
  size_t expected_app_calls = 0, actual_app_calls = 0;
  for (const auto& line : expected) expected_app_calls += count_of(line, app_send);
  for (const auto& line : r.fake_log) actual_app_calls += count_of(line, app_send);
  CHECK(actual_app_calls == expected_app_calls);
}

// Thresholds far above any test size: the engine must pass everything through.
const std::vector<std::string> kEnabledNothingEligible = {
    "FP8WIRE_ENABLE=1",
    "FP8WIRE_THRESHOLDS_ALL_REDUCE_NVLINK=1TiB", "FP8WIRE_THRESHOLDS_ALL_REDUCE_PCIE=1TiB",
    "FP8WIRE_THRESHOLDS_ALL_REDUCE_NET=1TiB", "FP8WIRE_THRESHOLDS_REDUCE_SCATTER_NVLINK=1TiB",
    "FP8WIRE_THRESHOLDS_REDUCE_SCATTER_PCIE=1TiB", "FP8WIRE_THRESHOLDS_REDUCE_SCATTER_NET=1TiB",
    "FP8WIRE_THRESHOLDS_ALL_GATHER_NVLINK=1TiB", "FP8WIRE_THRESHOLDS_ALL_GATHER_PCIE=1TiB",
    "FP8WIRE_THRESHOLDS_ALL_GATHER_NET=1TiB", "FP8WIRE_COLLECTIVES_ALL_TO_ALL=1",
    "FP8WIRE_THRESHOLDS_ALL_TO_ALL_NVLINK=1TiB", "FP8WIRE_THRESHOLDS_ALL_TO_ALL_PCIE=1TiB",
    "FP8WIRE_THRESHOLDS_ALL_TO_ALL_NET=1TiB", "FP8WIRE_LOG_LEVEL=info"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("re-entry guard: only the outermost guard owns the mark") {
  using fp8wire::shim::ReentryGuard;
  CHECK_FALSE(ReentryGuard::inside());
  {
    ReentryGuard outer;
    CHECK_FALSE(outer.reentered());
    CHECK(ReentryGuard::inside());
    {
      ReentryGuard inner;
      CHECK(inner.reentered());
    }
    CHECK(ReentryGuard::inside());  // the inner guard must not clear the outer mark
  }
  CHECK_FALSE(ReentryGuard::inside());
}

TEST_CASE("the agreement's all-gathers are told apart from the application's calls") {
  // As a machine with a GPU logs it: each creation followed by the library's 64-byte all-gather.
  const std::string mine = "send=0x7f0000000040, recv=0x7f0000000000, sendcount=64, dtype=" +
                           std::to_string(static_cast<int>(ncclUint8));
  const std::vector<std::string> log = {
      "ncclCommInitRank(nranks=2, id=0102030405060708, rank=1) -> 0xc0c00001",
      "ncclAllGather(" + mine + ", comm=0xc0c00001, stream=0x1)",
      "ncclCommInitAll(ndev=2, devlist=[3,5]) -> [0xc0c00003,0xc0c00004]",
      "ncclCommSplit(comm=0xc0c00001, color=7, key=9, config=0x0) -> 0xc0c00006",
      "ncclAllGather(" + mine + ", comm=0xc0c00001, stream=0x1)",  // on another communicator: kept
      "ncclAllGather(" + mine + ", comm=0xc0c00006, stream=0x1)",  // not right after its creation: kept
  };
  int exchanges = 0;
  const auto rest = without_agreement(log, exchanges);
  CHECK(exchanges == 1);
  REQUIRE(rest.size() == log.size() - 1);
  CHECK(rest[1] == log[2]);
  CHECK(rest.back() == log.back());
}

TEST_CASE("RTLD_NEXT: a job linked against NCCL, shim preloaded, disabled: every call forwarded exactly") {
  const Run r = probe_linked("all", {"FP8WIRE_ENABLE=0", "FP8WIRE_LOG_LEVEL=info"});
  check_forwarded_exactly(r);
  CHECK(count_of(r.output, "resolved real NCCL") == 1);
  CHECK(count_of(r.output, "from RTLD_NEXT (" + kFake) == 1);
  CHECK(count_of(r.output, "enable = false") == 1);
}

TEST_CASE("RTLD_NEXT: enabled with nothing eligible: every call reaches NCCL unchanged through the engine") {
  const Run r = probe_linked("all", kEnabledNothingEligible);
  check_forwarded_through_engine(r);
  CHECK(count_of(r.output, "from RTLD_NEXT") == 1);
}

TEST_CASE("RTLD_NOLOAD: NCCL loaded RTLD_LOCAL before the shim (as under PyTorch)") {
  SUBCASE("disabled") {
    const Run r = run_probe("noload", "all", {"FP8WIRE_ENABLE=0", "FP8WIRE_LOG_LEVEL=info"});
    check_forwarded_exactly(r);
    CHECK(count_of(r.output, "from already loaded libnccl.so.2 (" + kFake) == 1);
  }
  SUBCASE("enabled, nothing eligible") {
    const Run r = run_probe("noload", "all", kEnabledNothingEligible);
    check_forwarded_through_engine(r);
    CHECK(count_of(r.output, "from already loaded libnccl.so.2") == 1);
  }
}

TEST_CASE("explicit nccl.library: NCCL not loaded at all until the shim loads it") {
  const Run r = run_probe("dlopen", "all", {"FP8WIRE_ENABLE=0", "FP8WIRE_LOG_LEVEL=info", "FP8WIRE_NCCL_LIBRARY=" + kFake});
  check_forwarded_exactly(r);
  CHECK(count_of(r.output, "from nccl.library " + kFake) == 1);
}

TEST_CASE("no NCCL at all: every export returns ncclSystemError, nothing crashes") {
  const Run r = run_probe("dlopen", "all", {"FP8WIRE_LOG_LEVEL=info"});
  INFO(r.output);
  check_every_call_returned(r, kAllCalls, ncclSystemError);
  CHECK(count_of(r.output, "no usable NCCL found") == 1);
  CHECK(count_of(r.output, "FP8WIRE_NCCL_LIBRARY") >= 1);  // the message says how to fix it
  CHECK(count_of(r.output, "fake not loaded") == 1);
}

TEST_CASE("an NCCL without ncclAlltoAll (before 2.28): that export returns ncclSystemError naming it, the rest forward") {
  for (const char* enable : {"FP8WIRE_ENABLE=0", "FP8WIRE_ENABLE=1"}) {
    CAPTURE(enable);
    const Run r = run_probe("dlopen", "all", {enable, "FP8WIRE_LOG_LEVEL=info", "FP8WIRE_COLLECTIVES_ALL_TO_ALL=1",
                                              "FP8WIRE_NCCL_LIBRARY=" + kFakeBefore228});
    INFO(r.output);
    check_every_call_returned(r, kAllCalls, [](const std::string& name) {
      return name == "ncclAlltoAll" ? ncclSystemError : ncclSuccess;
    });
    CHECK(count_of(r.output, "missing optional ncclAlltoAll\n") == 1);  // the resolution line
    CHECK(count_of(r.output, "ncclAlltoAll: the real NCCL") == 1);
    CHECK(count_of(r.output, "does not provide this function; returning ncclSystemError") == 1);
    int exchanges = 0;
    std::vector<std::string> expected = probe::expected_all(r.config_at);
    std::erase_if(expected, [](const std::string& line) { return line.rfind("ncclAlltoAll(", 0) == 0; });
    CHECK(without_agreement(r.fake_log, exchanges) == expected);
  }
}

TEST_CASE("nccl.library naming libfp8wire.so itself is refused (no call may loop back into the shim)") {
  const Run r = run_probe("dlopen", "all", {"FP8WIRE_NCCL_LIBRARY=" + kShim});
  INFO(r.output);
  check_every_call_returned(r, kAllCalls, ncclSystemError);
  CHECK(count_of(r.output, "no usable NCCL found") == 1);
}

TEST_CASE("a nccl.library path that does not exist is reported with the loader's reason") {
  const Run r = run_probe("dlopen", "all", {"FP8WIRE_NCCL_LIBRARY=/nonexistent/libnccl.so.2"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(count_of(r.output, "nccl.library '/nonexistent/libnccl.so.2'") == 1);
}

TEST_CASE("configuration errors: logged once each, then everything passes through") {
  const Run r = probe_linked("all", {"FP8WIRE_BLOCK_SIZE=100", "FP8WIRE_FORMAT=e4m4", "FP8WIRE_BOGUS=1"});
  check_forwarded_exactly(r);
  CHECK(count_of(r.output, "env FP8WIRE_BLOCK_SIZE: block_size = '100': expected a power of two in [32, 4096]") == 1);
  CHECK(count_of(r.output, "env FP8WIRE_FORMAT: format = 'e4m4'") == 1);
  CHECK(count_of(r.output, "env FP8WIRE_BOGUS") == 1);
  CHECK(count_of(r.output, "3 configuration error(s)") == 1);
}

TEST_CASE("re-entry: NCCL calling back into an export goes straight to NCCL, logged once") {
  const Run r = probe_linked("reenter", kEnabledNothingEligible);
  INFO(r.output);
  check_every_call_returned(r, 3, ncclSuccess);
  // Each application call reaches the fake, which calls ncclAllReduce again (bound to the shim);
  // the shim sees the guard and forwards once more, at depth 1, instead of recursing.
  size_t depth0 = 0, depth1 = 0;
  for (const auto& line : r.fake_log) {
    if (line.rfind("ncclAllReduce(", 0) != 0) continue;
    depth0 += line.ends_with("depth=0");
    depth1 += line.ends_with("depth=1");
  }
  CHECK(depth0 == 2);
  CHECK(depth1 == 2);
  CHECK(count_of(r.output, "ncclAllReduce re-entered from " + kFake) == 1);
  CHECK(count_of(r.output, "a bug") == 0);  // the caller was NCCL, not fp8wire
  // The log is prefixed with the rank of the first communicator (the fake says rank 1).
  CHECK(count_of(r.output, "fp8wire[rank 1]") >= 1);
}

// ncclCommInitAll: every rank in this process, driven by one thread inside one group. FP8 would run
// the agreement exchange (all-gather + stream synchronize) of the first communicator alone and wait
// forever for the second; these communicators pass through, inside the application's own group.
TEST_CASE("ncclCommInitAll communicators and their splits pass through inside the application's group") {
  const Run r = probe_linked("initall", {"FP8WIRE_ENABLE=1", "FP8WIRE_LOG_LEVEL=info"});
  INFO(r.output);
  check_every_call_returned(r, 13, ncclSuccess);
  const std::string s = fmt::format("{:#x}", probe::kSend), v = fmt::format("{:#x}", probe::kRecv);
  const std::string st = fmt::format("{:#x}", probe::kStream);
  std::vector<std::string> expected = {
      fmt::format("ncclCommInitAll(ndev=2, devlist=[0,1]) -> [{},{}]", probe::comm(1), probe::comm(2)),
      "ncclGroupStart()"};
  auto all_reduce = [&](int c) {
    return fmt::format("ncclAllReduce(send={}, recv={}, count={}, dtype={}, op={}, comm={}, stream={}) depth=0", s, v,
                       64u << 20, static_cast<int>(ncclBfloat16), static_cast<int>(ncclSum), probe::comm(c), st);
  };
  expected.push_back(all_reduce(1));
  expected.push_back(all_reduce(2));
  expected.push_back("ncclGroupEnd()");
  // The split children (3, 4) of the clique are a clique too.
  expected.push_back("ncclGroupStart()");
  for (int i = 0; i < 2; ++i)
    expected.push_back(fmt::format("ncclCommSplit(comm={}, color=0, key={}, config=0x0) -> {}", probe::comm(1 + i), i,
                                   probe::comm(3 + i)));
  expected.push_back("ncclGroupEnd()");
  expected.push_back("ncclGroupStart()");
  expected.push_back(all_reduce(3));
  expected.push_back(all_reduce(4));
  expected.push_back("ncclGroupEnd()");
  CHECK(r.fake_log == expected);
  CHECK(count_of(r.output, "agreement") == 0);
}

TEST_CASE("C API: version, totals, step marks and flush are safe without a profiler") {
  for (const char* enable : {"FP8WIRE_ENABLE=0", "FP8WIRE_ENABLE=1"}) {
    CAPTURE(enable);
    const Run r = run_probe("noload", "capi", {enable});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(count_of(r.output, "capi version=100 ") == 1);
    CHECK(count_of(r.output, "dropped=0") == 1);
    // Able to act needs a GPU too: before set-up a CUDA driver on the machine, after it a device the
    // driver sees. Without them (CI) the answer is 0 however the configuration reads.
    const bool on = std::string(enable) == "FP8WIRE_ENABLE=1";
    const bool before = on && fp8wire::cuda_driver_present(), after = on && fp8wire::visible_cuda_devices() > 0;
    CHECK(count_of(r.output, before ? "capi active_before=1" : "capi active_before=0") == 1);
    CHECK(count_of(r.output, after ? "capi active_after=1" : "capi active_after=0") == 1);
    // Every path by its to_string name, FP8 ones starred; slots past the last path "", outside null.
    std::string paths = "capi paths=null,";
    for (int i = 0; i < FP8WIRE_MAX_PATHS; ++i) {
      const auto p = static_cast<fp8wire::Path>(i);
      paths += i < fp8wire::kPathCount ? std::string(fp8wire::to_string(p)) + (fp8wire::is_fp8(p) ? "*" : "") : "-";
      paths += ",";
    }
    paths += "null";
    CHECK(count_of(r.output, paths) == 1);
    CHECK(count_of(r.output, "passthrough,two_shot*,") == 1);
    // Transports likewise; every call a pass-through here, so all of them NCCL's.
    const std::string calls = r.output.substr(r.output.find("calls=") + 6, r.output.find(" dropped=") - r.output.find("calls=") - 6);
    CHECK(count_of(r.output, "capi transports=null,nccl,peer_memory,host_memory,-,-,-,-,-,null carried=" + calls +
                                 " nccl=" + calls + "\n") == 1);
    CHECK((on ? calls != "0" : true));
    // Every collective slot of the error totals by name, the all-to-all's included.
    CHECK(count_of(r.output, "capi collectives=null,all_reduce,reduce_scatter,all_gather,all_to_all,send_recv,-,-,-,null\n") == 1);
    // By the NCCL function called: the one all-reduce of 1000 floats at 2 ranks, 4000 B of caller data
    // and 4000 B on NCCL's ring (2(n-1)/n of the buffer); an older, smaller layout gets its part only.
    const unsigned long long n = std::stoull(calls);
    CHECK(count_of(r.output, "capi kinds=null,all_reduce,reduce_scatter,all_gather,broadcast,reduce,send,recv,all_to_all,"
                             "-,-,-,-,-,-,-,-,null all_reduce_calls=" + calls + " app_bytes=" + std::to_string(4000 * n) +
                                 " plain_wire_bytes=" + std::to_string(4000 * n) + " size_ok=1 older_calls=" + calls +
                                 " older_tail_untouched=1\n") == 1);
  }
}

TEST_CASE("C API: fp8wire_active is 0 with a configuration error") {
  const Run r = run_probe("noload", "capi", {"FP8WIRE_BLOCK_SIZE=7"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(count_of(r.output, "capi active_before=0") == 1);
  CHECK(count_of(r.output, "capi active_after=0") == 1);
}

TEST_CASE("exported dynamic symbols: exactly the interposed NCCL functions and the C API") {
  FILE* nm = popen(("nm -D --defined-only " + kShim + " 2>/dev/null").c_str(), "r");
  REQUIRE(nm);
  std::set<std::string> exported;
  char line[1024];
  while (fgets(line, sizeof(line), nm)) {
    std::istringstream fields(line);
    std::string address, type, name;
    fields >> address >> type >> name;
    if (type == "A") continue;  // version node
    if (!name.empty()) exported.insert(name);
  }
  const int nm_status = pclose(nm);
  // No silent pass: without nm (binutils, which the compiler needs anyway) the check fails.
  REQUIRE_MESSAGE((nm_status == 0 && !exported.empty()),
                  "`nm -D --defined-only " << kShim << "` failed (exit status " << nm_status
                                           << "): this check needs nm from binutils");
  const std::set<std::string> expected = {
      "ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclAlltoAll", "ncclBroadcast", "ncclBcast", "ncclReduce",
      "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd", "ncclGroupSimulateEnd", "ncclCommInitRank", "ncclCommInitRankConfig",
      "ncclCommInitAll", "ncclCommInitRankScalable", "ncclCommSplit", "ncclCommShrink", "ncclCommFinalize",
      "ncclCommDestroy", "ncclCommAbort", "ncclCommGetAsyncError", "fp8wire_version", "fp8wire_step_begin", "fp8wire_step_end",
      "fp8wire_profiler_flush", "fp8wire_get_totals", "fp8wire_set_feedback_key", "fp8wire_active",
      "fp8wire_path_name", "fp8wire_path_is_fp8", "fp8wire_transport_name", "fp8wire_get_transport_totals",
      "fp8wire_get_error_totals", "fp8wire_collective_name", "fp8wire_call_error", "fp8wire_debug_state",
      "fp8wire_call_kind_name", "fp8wire_get_kind_totals"};
  CHECK(exported == expected);
}

TEST_CASE("pass-through cost per ncclAllReduce call (CPU time; target < 1 us)") {
  struct Row {
    const char* label;
    std::vector<std::string> env;
    double shim_ns = 0, direct_ns = 0;
  };
  std::vector<Row> rows = {{"FP8WIRE_ENABLE=0", {"FP8WIRE_ENABLE=0"}},
                           {"enabled, not eligible", kEnabledNothingEligible}};
  for (auto& row : rows) {
    const Run r = probe_linked("bench", row.env);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const size_t at = r.output.find("bench shim_ns=");
    REQUIRE(at != std::string::npos);
    REQUIRE(std::sscanf(r.output.c_str() + at, "bench shim_ns=%lf direct_ns=%lf", &row.shim_ns, &row.direct_ns) == 2);
  }
  std::string table = "\n  configuration            direct (ns)  via shim (ns)  overhead (ns)\n";
  for (const auto& row : rows)
    table += fmt::format("  {:<24} {:>11.1f}  {:>13.1f}  {:>13.1f}\n", row.label, row.direct_ns, row.shim_ns,
                         row.shim_ns - row.direct_ns);
  MESSAGE(table);
  std::printf("%s", table.c_str());
  // CPU time excludes descheduling, so the bound holds on a loaded machine; a generous margin
  // keeps it from flaking while still catching an accidental allocation or lock on the path.
  for (const auto& row : rows) CHECK(row.shim_ns - row.direct_ns < 1000.0);
}
