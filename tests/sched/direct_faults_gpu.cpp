// The direct transports when a peer fails, on one GPU with two processes (distinct NCCL_HOSTID, the
// transport forced with direct.assume_one_host, as the emulated testbed allows):
//   killed   rank 1's process ends abruptly between two collectives (_exit: no clean-up, which is what a
//            kill looks like to its peers; a death by signal would make the launcher stop rank 0
//            too); rank 0's next FP8 all-reduce waits on its
//            flags; its watchdog thread sees the peer gone (Engine::comm_peer_lost, what the shim's
//            ncclCommGetAsyncError reports as ncclRemoteError) and aborts the communicator: rank 0's
//            stream completes, nothing hangs;
//   killed, destroyed   as killed, but rank 0, once its communicator reports the error
//            (Engine::comm_async_error, what the shim's ncclCommGetAsyncError answers), destroys it
//            instead of aborting: the destroy releases the wait and returns ncclRemoteError (the
//            call's output is not valid), and the stream completes;
//   absent   rank 1 stays alive but never issues the collective; rank 0's watchdog aborts after 2 s
//            from another thread: its stream completes;
//   exited / destroyed   the end of a normal job: rank 1 finishes its collectives and exits (without
//            destroying its communicator) or destroys it first; rank 0 goes on for 3 s, its watchdog
//            polling, and must see no error, then destroys its communicator: a peer that has gone
//            while nothing waits on it is no error (the kernel's answer, not a pid probe).
// Each case also checks that a healthy collective went over the direct transport first. A case that
// hangs is killed by the launcher's deadline and fails. Exit 0 all passed, 1 a failure, 77 no GPU.
//   direct_faults_gpu [host_memory|peer_memory]
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/rank_launcher.hpp"
#include "common/status.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/engine/engine.hpp"
#include "sched/engine/engine_probe.hpp"
#include "sched/platform/gpu_platform.hpp"
#include "sched/platform/nccl_api_linked.hpp"
#include "tests/sched/gpu_ranks.hpp"

using namespace fp8wire;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One rank of one case. Exit status: 0 passed; 1 failed (printed).
int rank_main(const std::string& scenario, DirectMode mode, int rank, const ncclUniqueId& id) {
  FP8WIRE_CUDA_OR(cudaSetDevice(0), return 1);
  cudaStream_t stream;
  FP8WIRE_CUDA_OR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), return 1);
  ncclComm_t comm = nullptr;
  FP8WIRE_NCCL_OR(ncclCommInitRank(&comm, 2, id, rank), return 1);
  NcclApi api = nccl_api_from_linked();
  Platform platform = gpu_platform(api);
  Config config;
  config.direct_transport = mode;
  config.direct_assume_one_host = true;
  sched::Engine eng(config, platform);
  eng.comm_created(comm);
  const size_t count = size_t{4} << 20;  // 8 MiB of bf16
  void *in = nullptr, *out = nullptr;
  FP8WIRE_CUDA_OR(cudaMalloc(&in, count * 2), return 1);
  FP8WIRE_CUDA_OR(cudaMalloc(&out, count * 2), return 1);
  FP8WIRE_CUDA_OR(cudaMemset(in, 0x3C, count * 2), return 1);
  // A healthy call first: it must go over the direct transport.
  FP8WIRE_NCCL_OR(sched::EngineProbe(eng).all_reduce_forced(Path::two_shot, in, out, count, ncclBfloat16, ncclSum, comm, stream), return 1);
  FP8WIRE_CUDA_OR(cudaStreamSynchronize(stream), return 1);
  CallRecord rec[8];
  const size_t n = Accounting::instance().snapshot(rec, 8, 0);
  const Carrier want = mode == DirectMode::peer_memory ? Carrier::peer_memory : Carrier::host_memory;
  if (n == 0 || rec[n - 1].transport != want) {
    std::printf("FAIL %s rank %d: the healthy call went over %s, expected %s\n", scenario.c_str(), rank,
                n ? to_string(rec[n - 1].transport) : "nothing", to_string(want));
    return 1;
  }
  // Both ranks are past the healthy call before rank 1 fails (a 4-byte NCCL all-reduce as barrier).
  FP8WIRE_NCCL_OR(ncclAllReduce(in, out, 1, ncclFloat32, ncclSum, comm, stream), return 1);
  FP8WIRE_CUDA_OR(cudaStreamSynchronize(stream), return 1);
  if (scenario == "exited" || scenario == "destroyed") {
    if (rank == 1) {
      if (scenario == "destroyed") eng.comm_destroyed(comm), ncclCommDestroy(comm);
      std::fflush(stdout);
      _exit(0);  // no destructor runs: the process just ends
    }
    const auto t0 = std::chrono::steady_clock::now();
    bool lost = false;
    while (!lost && seconds_since(t0) < 3.0) {
      lost = eng.comm_peer_lost(comm);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    eng.comm_destroyed(comm);
    ncclCommDestroy(comm);
    std::printf("%s %s (%s): rank 0 %s after rank 1 ended\n", lost ? "FAIL" : "PASS", scenario.c_str(),
                to_string(mode), lost ? "saw an error" : "saw no error for 3 s and destroyed its communicator");
    std::fflush(stdout);
    cudaFree(in);
    cudaFree(out);
    return lost ? 1 : 0;
  }
  if (rank == 1) {
    if (scenario == "killed" || scenario == "killed_destroyed") _exit(0);
    std::this_thread::sleep_for(std::chrono::seconds(6));  // "absent": alive, never issues the call
    eng.comm_abort(comm);
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  FP8WIRE_NCCL_OR(sched::EngineProbe(eng).all_reduce_forced(Path::two_shot, in, out, count, ncclBfloat16, ncclSum, comm, stream), return 1);
  if (scenario == "killed_destroyed") {
    ncclResult_t async = ncclSuccess;
    while (seconds_since(t0) < 20 && (async = eng.comm_async_error(comm)) == ncclSuccess)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const ncclResult_t destroyed = eng.comm_destroyed(comm);
    const cudaError_t synced = cudaStreamSynchronize(stream);
    const bool ok = async == ncclRemoteError && destroyed == ncclRemoteError && synced == cudaSuccess;
    std::printf("%s %s (%s): asynchronous error %d after %.2f s, destroy returned %d, stream %s\n",
                ok ? "PASS" : "FAIL", scenario.c_str(), to_string(mode), static_cast<int>(async), seconds_since(t0),
                static_cast<int>(destroyed), synced == cudaSuccess ? "completed" : "failed");
    std::fflush(stdout);
    ncclCommAbort(comm);  // NCCL's own state, whose peer is gone
    cudaFree(in);
    cudaFree(out);
    return ok ? 0 : 1;
  }
  // The application's watchdog, on another thread: PyTorch's polls ncclCommGetAsyncError (which the
  // shim answers with ncclRemoteError once a local peer of a direct transport is gone) and aborts.
  std::atomic<bool> aborted{false};
  std::string why;
  std::thread watchdog([&] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (cudaStreamQuery(stream) == cudaSuccess) return;
      const bool lost = eng.comm_peer_lost(comm);
      if (lost || seconds_since(t0) > 2.0) {
        why = lost ? "peer lost" : "timeout";
        eng.comm_abort(comm);
        aborted = true;
        return;
      }
    }
  });
  const cudaError_t synced = cudaStreamSynchronize(stream);
  watchdog.join();
  const double took = seconds_since(t0);
  const bool want_lost = scenario == "killed";
  const bool ok = synced == cudaSuccess && aborted.load() && took < 20 && (why == "peer lost") == want_lost;
  std::printf("%s %s (%s): rank 0's stream released after %.2f s (%s, abort from the watchdog thread: %s)\n",
              ok ? "PASS" : "FAIL", scenario.c_str(), to_string(mode), took, why.empty() ? "finished" : why.c_str(),
              aborted.load() ? "yes" : "no");
  std::fflush(stdout);
  cudaFree(in);
  cudaFree(out);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (test::no_gpu()) return 77;
  if (const std::optional<int> status = test::as_rank([](const RankEnv& env, const ncclUniqueId& id) {
        const std::string scenario = std::getenv("DIRECT_FAULT_SCENARIO");
        const DirectMode mode = std::strcmp(std::getenv("DIRECT_FAULT_MODE"), "peer_memory") == 0
                                    ? DirectMode::peer_memory
                                    : DirectMode::host_memory;
        return rank_main(scenario, mode, env.rank, id);
      }))
    return *status;
  const std::vector<std::string> modes =
      argc > 1 ? std::vector<std::string>{argv[1]} : std::vector<std::string>{"host_memory", "peer_memory"};
  int failures = 0;
  for (const std::string& mode : modes) {
    for (const char* scenario : {"killed", "killed_destroyed", "absent", "exited", "destroyed"}) {
      LaunchSpec spec;
      spec.argv = {"/proc/self/exe"};
      spec.nranks = 2;
      spec.env = {{"DIRECT_FAULT_SCENARIO", scenario}, {"DIRECT_FAULT_MODE", mode}};
      spec.one_gpu = true;
      spec.timeout_s = 60;
      const LaunchResult r = launch_local_ranks(spec);
      const bool rank0_ok = !r.exit_codes.empty() && r.exit_codes[0] == 0;
      const bool rank1_ok = r.exit_codes.size() > 1 && r.exit_codes[1] == 0;
      if (!rank0_ok || !rank1_ok) {
        ++failures;
        std::printf("FAIL %s (%s): exit codes %d, %d (%s)\n", scenario, mode.c_str(),
                    r.exit_codes.empty() ? -1 : r.exit_codes[0], r.exit_codes.size() > 1 ? r.exit_codes[1] : -1,
                    r.error.c_str());
      }
    }
  }
  std::printf("direct faults: %s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
