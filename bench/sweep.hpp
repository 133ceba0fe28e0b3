// fp8wire-bench sweep: one rank's work. Times plain NCCL and fp8wire's FP8 paths through the same
// sched::Engine the shim runs (its *_forced entry points), checks every result, reduces the timings
// to rank 0 (max over ranks), and on rank 0 writes the table, the JSON and the threshold profile.
#pragma once

#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/host/crossover.hpp"
#include "common/rank_launcher.hpp"
#include "bench/host/units.hpp"

namespace fp8wire::bench {

inline constexpr int kMaxRepeats = 100;

struct SweepOptions {
  std::vector<Collective> collectives{std::begin(kCollectives), std::end(kCollectives)};
  std::vector<DType> dtypes = {DType::bf16};
  std::vector<Path> paths = {Path::passthrough, Path::two_shot, Path::one_shot, Path::ring};
  uint64_t min_bytes = 4ull << 10;
  uint64_t max_bytes = 1ull << 30;
  double step = 2.0;
  int warmup = 3;
  int repeats = 10;        // timed samples per point (median and spread over these)
  int iters = 1;           // operations per sample (the sample is their mean)
  int buffers = 4;         // rotation: consecutive operations use different buffers
  int emulate_ranks = 0;   // 0: one rank per visible GPU
  // One rank per GPU, NCCL told the GPUs form hosts of this many (NCCL_HOSTID per block): a 4- or
  // 8-GPU machine standing in for a job spanning hosts. 0: one host.
  int ranks_per_host = 0;
  std::string fabric = "auto";  // auto | nvlink | pcie | net (a "both" run launches one round each)
  // --gather-transport: how the FP8 paths' gather step moves the slots (Config::gather_transport).
  // Empty ("auto"): the configuration as loaded, i.e. FP8WIRE_GATHER_TRANSPORT or the planner's
  // choice per call. One entry: that transport. Two ("both": allgather, sendrecv): every path with a
  // gather step is timed once with each. Each point records the transport its calls used.
  std::vector<GatherMethod> gather_transports;
  // --transport: what carries the FP8 paths. nccl: NCCL's transports; direct: a direct transport
  // (peer GPU memory, or host memory under NCCL_P2P_DISABLE=1; sched/transport/direct_windows.hpp), peer_memory /
  // host_memory: that one; both: every FP8 path over NCCL's and over the direct one. Emulated ranks
  // share this machine's memory, so the direct transport assumes one host there (direct.assume_one_host).
  std::string transport = "nccl";
  double timeout_s = 1800;          // whole launch (launcher kills every rank past it)
  double bootstrap_timeout_s = 120; // a rank waiting for rank 0's NCCL id gives up after this
  bool check = true;
  uint64_t check_all_buffers_max_bytes = 64ull << 20;  // above: only the last buffer is checked
  std::string json_path;
  std::string profile_path;
  CrossoverOptions crossover;
  nlohmann::json as_json = nlohmann::json::object();  // the command line, recorded in the JSON
};

// Runs this process as one rank. Returns the process exit code: 0 when every run completed and every
// check passed, 1 when a check failed, 2 on a setup or NCCL/CUDA error (printed).
int run_sweep_rank(const SweepOptions& options, const fp8wire::RankEnv& env);

}  // namespace fp8wire::bench
