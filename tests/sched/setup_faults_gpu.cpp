// A communicator's set-up on real GPUs when a peer never answers (sched/README.md, "The agreement"):
// 2-4 processes on one GPU (distinct NCCL_HOSTID, the direct transport forced with
// direct.assume_one_host), both direct kinds. The GPU's platform tables are wrapped so that one rank,
// the victim, ends or stops right before one operation of its set-up (an all-gather, a window's
// creation, a peer window's opening):
//   killed   its process ends there (_exit: no clean-up, what a kill looks like to its peers);
//   stopped  it stops itself (SIGSTOP) there, and a child it forked first resumes it well after the
//            others' deadline; it must then fail its own creation too.
// Every other rank's creation must fail with ncclRemoteError within the deadline (setup_timeout_s =
// 10 here) and then be aborted, as the shim does; nothing hangs. Then, in the same run:
//   after a kill   a victim killed once its windows exist leaves their names in /dev/shm; the next
//                  job sweeps them before its own windows, comes up with the direct transport, and
//                  leaves no name of fp8wire's behind;
//   no room        windows larger than /dev/shm has free: every rank comes up without the direct
//                  transport, FP8 over NCCL, alike.
// (A peer killed or absent mid-collective, and a destroy then: direct_faults_gpu.)
// Exit 0 all passed, 1 a failure, 77 no GPU.
//   setup_faults_gpu [host_memory|peer_memory] [ranks...]
#include <cuda_runtime.h>
#include <dirent.h>
#include <nccl.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/rank_launcher.hpp"
#include "common/status.hpp"
#include "sched/engine/engine.hpp"
#include "sched/engine/engine_probe.hpp"
#include "sched/platform/gpu_platform.hpp"
#include "sched/platform/nccl_api_linked.hpp"
#include "tests/sched/gpu_ranks.hpp"

using namespace fp8wire;

namespace {

constexpr double kDeadline = 10;  // setup_timeout_s of these runs: NCCL's first connections take seconds here

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --- the victim's set-up operations, wrapped ---------------------------------------------------------
struct Victim {
  const Platform* base = nullptr;
  int at = -1;  // its set-up operation that never happens (-1: none)
  bool kill = false;
  int count = 0;
  bool resumed = false;  // stopped, then resumed: everything it does next fails
} g_victim;

bool stops_here() {
  if (g_victim.resumed) return true;
  if (g_victim.at < 0 || g_victim.count++ != g_victim.at) return false;
  std::fflush(stdout);
  if (g_victim.kill) _exit(0);
  const pid_t self = getpid();
  if (fork() == 0) {  // resumes it once every peer has given up
    sleep(static_cast<unsigned>(kDeadline) + 3);
    kill(self, SIGCONT);
    _exit(0);
  }
  raise(SIGSTOP);
  g_victim.resumed = true;
  return true;
}

ncclResult_t w_all_gather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  return stops_here() ? ncclSystemError : g_victim.base->nccl->AllGather(s, r, n, t, c, st);
}
cudaError_t w_create(WindowKind kind, size_t bytes, uint64_t tag, Window* out, WindowHandle* handle) {
  return stops_here() ? cudaErrorUnknown : g_victim.base->direct.create(kind, bytes, tag, out, handle);
}
cudaError_t w_open(const WindowHandle& handle, Window* out) {
  return stops_here() ? cudaErrorUnknown : g_victim.base->direct.open(handle, out);
}

// fp8wire's names in /dev/shm.
std::set<std::string> shm_names() {
  std::set<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (const dirent* e = readdir(d))
      if (std::strncmp(e->d_name, "fp8wire-", 8) == 0) out.insert(e->d_name);
    closedir(d);
  }
  return out;
}

// One rank of one case, configured by the environment the launcher passes. Exit 0: as expected.
int rank_main(int rank, int nranks, const ncclUniqueId& id) {
  const std::string scenario = std::getenv("SETUP_FAULT_SCENARIO");
  const DirectMode mode = std::strcmp(std::getenv("SETUP_FAULT_MODE"), "peer_memory") == 0 ? DirectMode::peer_memory
                                                                                           : DirectMode::host_memory;
  const int victim = std::atoi(std::getenv("SETUP_FAULT_VICTIM"));
  FP8WIRE_CUDA_OR(cudaSetDevice(0), return 1);
  ncclComm_t comm = nullptr;
  FP8WIRE_NCCL_OR(ncclCommInitRank(&comm, nranks, id, rank), return 1);
  NcclApi api = nccl_api_from_linked();
  Platform base = gpu_platform(api);
  NcclApi wrapped_api = api;
  Platform platform = base;
  g_victim.base = &base;
  if (scenario == "setup" && rank == victim) {
    g_victim.at = std::atoi(std::getenv("SETUP_FAULT_AT"));
    g_victim.kill = std::strcmp(std::getenv("SETUP_FAULT_HOW"), "killed") == 0;
    wrapped_api.AllGather = w_all_gather;
    platform.nccl = &wrapped_api;
    platform.direct.create = w_create;
    platform.direct.open = w_open;
  }
  Config config;
  config.direct_transport = mode;
  config.direct_assume_one_host = true;
  config.setup_timeout_s = kDeadline;
  if (scenario == "no_room") {
    struct statvfs v{};
    statvfs("/dev/shm", &v);
    config.direct_window_bytes = static_cast<uint64_t>(v.f_bavail) * v.f_frsize + (uint64_t{1} << 30);
  }
  sched::Engine eng(config, platform);
  const auto t0 = std::chrono::steady_clock::now();
  const ncclResult_t created = eng.comm_created(comm);
  const double took = seconds_since(t0);
  const sched::CommInfo info = sched::EngineProbe(eng).comm_info(comm);
  const char* kind = to_string(mode);

  if (scenario == "setup") {
    // A stopped peer is found by the deadline alone; a killed one may be found sooner, by NCCL's own
    // error on its closed sockets: any error, within the deadline.
    const bool stopped = std::strcmp(std::getenv("SETUP_FAULT_HOW"), "stopped") == 0;
    const bool ok = stopped ? created == ncclRemoteError && took > kDeadline * 0.9 && took < kDeadline + 30
                            : created != ncclSuccess && took < kDeadline + 30;
    // Resumed, the victim fails its own creation too, or passes through where it never joined the
    // agreement's all-gather; it never comes up with FP8.
    const bool victim_ok = created != ncclSuccess || !info.fp8_ok;
    if (rank == victim)
      std::printf("%s victim rank %d (%s), resumed after its stop: creation returned %d after %.1f s, FP8 %s\n",
                  victim_ok ? "PASS" : "FAIL", rank, kind, static_cast<int>(created), took, info.fp8_ok ? "on" : "off");
    else
      std::printf("%s rank %d (%s): creation returned %d after %.1f s (%s expected within %.0f s)\n",
                  ok ? "PASS" : "FAIL", rank, kind, static_cast<int>(created), took,
                  stopped ? "ncclRemoteError at the deadline" : "an error", kDeadline);
    std::fflush(stdout);
    eng.comm_abort(comm);  // as the shim does after a failed creation (and the victim's peers are gone)
    return (rank == victim ? victim_ok : ok) ? 0 : 1;
  }
  if (created != ncclSuccess) {
    std::printf("FAIL %s rank %d (%s): creation returned %d\n", scenario.c_str(), rank, kind, static_cast<int>(created));
    return 1;
  }
  if (scenario == "no_room" || scenario == "after_kill") {
    const bool want_direct = scenario == "after_kill";
    const bool ok = info.fp8_ok && info.direct == want_direct;
    std::printf("%s %s rank %d (%s): FP8 %s, direct transport %s\n", ok ? "PASS" : "FAIL", scenario.c_str(), rank,
                kind, info.fp8_ok ? "on" : "off", info.direct ? "set up" : "not set up");
    std::fflush(stdout);
    eng.comm_destroyed(comm);
    ncclCommDestroy(comm);
    return ok ? 0 : 1;
  }
  std::printf("FAIL unknown scenario %s\n", scenario.c_str());
  return 1;
}

struct Case {
  std::string scenario, mode, how;
  int nranks = 2, victim = -1, at = -1;
  std::string label() const {
    std::string s = scenario + " " + mode + ", " + std::to_string(nranks) + " ranks";
    if (victim >= 0) s += ", rank " + std::to_string(victim) + " " + how + " before set-up operation " + std::to_string(at);
    return s;
  }
};

bool run_case(const Case& c) {
  LaunchSpec spec;
  spec.argv = {"/proc/self/exe"};
  spec.nranks = c.nranks;
  spec.env = {{"SETUP_FAULT_SCENARIO", c.scenario}, {"SETUP_FAULT_MODE", c.mode}, {"SETUP_FAULT_HOW", c.how},
              {"SETUP_FAULT_VICTIM", std::to_string(c.victim)}, {"SETUP_FAULT_AT", std::to_string(c.at)}};
  spec.one_gpu = true;
  spec.quiet = true;
  spec.timeout_s = kDeadline + 60;
  const auto t0 = std::chrono::steady_clock::now();
  const LaunchResult r = launch_local_ranks(spec);
  bool ok = r.ok;
  std::string codes;
  for (int code : r.exit_codes) codes += (codes.empty() ? "" : ", ") + std::to_string(code);
  std::printf("%s %s: exit codes [%s], %.1f s%s%s\n", ok ? "PASS" : "FAIL", c.label().c_str(), codes.c_str(),
              seconds_since(t0), r.error.empty() ? "" : ": ", r.error.c_str());
  std::fflush(stdout);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (test::no_gpu()) return 77;
  if (const std::optional<int> status =
          test::as_rank([](const RankEnv& env, const ncclUniqueId& id) { return rank_main(env.rank, env.world_size, id); }))
    return *status;
  const std::vector<std::string> modes =
      argc > 1 ? std::vector<std::string>{argv[1]} : std::vector<std::string>{"host_memory", "peer_memory"};
  std::vector<int> rank_counts;
  for (int i = 2; i < argc; ++i) rank_counts.push_back(std::atoi(argv[i]));
  if (rank_counts.empty()) rank_counts = {2, 4};
  int failures = 0;
  const std::set<std::string> before = shm_names();
  for (const std::string& mode : modes) {
    for (int n : rank_counts) {
      // The victim's set-up operations: the agreement's all-gather, its flag page and data window,
      // the offers' all-gather, each peer's two windows opened, the confirmation's all-gather.
      // At 4 ranks, the opening of the first peer's windows stands for the others'.
      const int operations = 4 + 2 * (n - 1) + 1;
      for (int at = 0; at < operations; ++at) {
        if (n > 2 && at > 4 && at < operations - 1) continue;
        const Case c{"setup", mode, at % 2 ? "stopped" : "killed", n, (at + 1) % n, at};
        failures += run_case(c) ? 0 : 1;
      }
    }
    // A job after one whose victim died with its windows made (before the offers' all-gather): the
    // names it left are swept (once they are 2 s old) and the next job's direct transport comes up.
    failures += run_case(Case{"setup", mode, "killed", 2, 1, 3}) ? 0 : 1;
    const std::set<std::string> leftovers = shm_names();
    std::this_thread::sleep_for(std::chrono::seconds(3));
    failures += run_case(Case{"after_kill", mode, "", 2}) ? 0 : 1;
    std::set<std::string> still;
    for (const std::string& name : shm_names())
      if (!before.count(name)) still.insert(name);
    std::printf("%s after a killed job (%s): %zu name(s) of fp8wire's in /dev/shm after it, %zu after the next job\n",
                still.empty() ? "PASS" : "FAIL", mode.c_str(), leftovers.size() - std::min(leftovers.size(), before.size()),
                still.size());
    failures += still.empty() ? 0 : 1;
  }
  failures += run_case(Case{"no_room", "host_memory", "", 2}) ? 0 : 1;
  failures += run_case(Case{"no_room", "host_memory", "", 4}) ? 0 : 1;
  const std::set<std::string> after = shm_names();
  size_t left = 0;
  for (const std::string& name : after) left += before.count(name) ? 0 : 1;
  std::printf("%s nothing of fp8wire's left in /dev/shm (%zu new name(s))\n", left ? "FAIL" : "PASS", left);
  failures += left ? 1 : 0;
  std::printf("setup faults: %s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
