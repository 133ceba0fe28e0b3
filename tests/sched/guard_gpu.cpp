// GPU tier of the guard: N ranks on GPU 0 (emulated hosts, as multirank_collectives) drive
// sched::Engine through a linked NCCL, over the two-shot and one-shot all-reduce and the all-to-all
// (one stage of whole blocks). Synthetic gradients that break e4m3 on one rank (an outlier
// 1e5x larger inside every block, an all-NaN block, one Inf, values below e4m3's range after scaling)
// trip the guard at the call that carries them; every rank then runs the next guard.retry_after calls
// in full precision, bit for bit what plain NCCL gives, and goes back to FP8 after. Prints the
// synthetic-failure table: input, telemetry (this rank's input quantization, calls 0-1), the audit
// (calls 0-1: the FP8 results against full precision, audit.every = 1), what the guard did, the
// FP8 result of the bad call and the later ones against plain NCCL.
//
// Usage: guard_gpu [--ranks 2,4] [--timeout S]. Exit 77 without a GPU.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/rank_launcher.hpp"
#include "common/status.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/engine/engine.hpp"
#include "sched/engine/engine_probe.hpp"
#include "sched/platform/gpu_platform.hpp"
#include "sched/platform/nccl_api_linked.hpp"
#include "sched/comm/telemetry_monitor.hpp"
#include "tests/sched/multirank_main.hpp"

using namespace fp8wire;

namespace {

constexpr size_t kCount = size_t(1) << 20;  // fp32 elements per call
constexpr int kCalls = 5;                   // 0 clean, 1 broken on one rank, 2-3 full precision, 4 FP8
constexpr uint32_t kRetry = 2;

enum Breakage { kOutlier, kNanBlock, kInf, kUnderflow, kBreakages };
const char* label(int b) {
  static const char* n[] = {"outlier_1e5x_per_block", "all_NaN_block", "one_Inf", "below_e4m3_range"};
  return n[b];
}

std::vector<float> input(int rank, int call, int breakage, int bad_rank) {
  std::vector<float> x(kCount);
  uint64_t s = 0x9E3779B97F4A7C15ull * uint64_t(rank * 131 + call + 1);
  for (size_t i = 0; i < kCount; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    // Gaussian-ish (sum of uniforms), the scale of gradients.
    double g = 0;
    for (int k = 0; k < 4; ++k) g += double((s >> (16 * k)) & 0xFFFF) / 65536.0 - 0.5;
    x[i] = float(g * 1e-3);
  }
  if (call != 1 || rank != bad_rank) return x;
  switch (breakage) {
    case kOutlier:
      for (size_t i = 0; i < kCount; i += 128) x[i] = 1e5f * 1e-3f;
      break;
    case kNanBlock:
      for (size_t i = 4096; i < 4096 + 128; ++i) x[i] = std::numeric_limits<float>::quiet_NaN();
      break;
    case kInf: x[kCount / 3] = std::numeric_limits<float>::infinity(); break;
    case kUnderflow:
      for (float& v : x) v *= 1e-36f;
      break;
  }
  return x;
}

// The guarded calls: the all-reduce's two paths and the all-to-all (kCount / n elements per peer).
struct GuardedCall {
  Collective collective;
  Path path;
  const char* name;
};
constexpr GuardedCall kGuarded[] = {{Collective::all_reduce, Path::two_shot, "two_shot"},
                                    {Collective::all_reduce, Path::one_shot, "one_shot"},
                                    {Collective::all_to_all, Path::one_shot, "all_to_all"}};
constexpr int kGuardedCalls = sizeof(kGuarded) / sizeof(kGuarded[0]);

Config guard_config() {
  Config c;
  for (auto& per : c.thresholds) per = {0, 0, 0};
  c.collective_enable.fill(true);
  c.telemetry_sample_every = 1;
  c.guard_enable = true;
  c.guard_retry_after = kRetry;
  c.guard_decide_after = 1;  // the votes of call i read by call i + 1: the table's switch at the next call
  c.audit_every = 1;  // every FP8 call also in full precision: the bad call's true error
  return c;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

int rank_main(int rank, int n, const ncclUniqueId& id, const std::string& out_path) {
  FILE* out = std::fopen(out_path.c_str(), "w");
  if (!out) return 5;
  FP8WIRE_CUDA_OR(cudaSetDevice(0), _exit(3));
  cudaStream_t stream = nullptr;
  FP8WIRE_CUDA_OR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), _exit(3));
  ncclComm_t comm = nullptr;
  FP8WIRE_NCCL_OR(ncclCommInitRank(&comm, n, id, rank), _exit(4));
  const NcclApi api = nccl_api_from_linked();
  const Platform platform = gpu_platform(api);
  float *in = nullptr, *fp8 = nullptr, *plain = nullptr;
  FP8WIRE_CUDA_OR(cudaMalloc(&in, kCount * sizeof(float)), _exit(3));
  FP8WIRE_CUDA_OR(cudaMalloc(&fp8, kCount * sizeof(float)), _exit(3));
  FP8WIRE_CUDA_OR(cudaMalloc(&plain, kCount * sizeof(float)), _exit(3));
  const int bad_rank = n - 1;
  for (const GuardedCall& g : kGuarded) {
    const Path path = g.path;
    const bool a2a = g.collective == Collective::all_to_all;
    for (int b = 0; b < kBreakages; ++b) {
      sched::Engine eng(guard_config(), platform);
      eng.comm_created(comm);
      const uint64_t seq_before = Accounting::instance().last_seq();
      const sched::ErrorTotals before = sched::error_totals();
      std::vector<int> bitwise(kCalls, 0);
      double bad_call_rel = 0;
      sched::ErrorTotals after_bad{};
      for (int call = 0; call < kCalls; ++call) {
        const std::vector<float> x = input(rank, call, b, bad_rank);
        FP8WIRE_CUDA_OR(cudaMemcpy(in, x.data(), kCount * sizeof(float), cudaMemcpyHostToDevice), _exit(3));
        const size_t per_peer = kCount / static_cast<size_t>(n);
        const ncclResult_t fp8_res =
            a2a ? sched::EngineProbe(eng).all_to_all_forced(path, in, fp8, per_peer, ncclFloat32, comm, stream)
                : sched::EngineProbe(eng).all_reduce_forced(path, in, fp8, kCount, ncclFloat32, ncclSum, comm, stream);
        if (fp8_res != ncclSuccess) _exit(6);
        // Plain NCCL on the same input (its own call, not through the engine).
        if (a2a) FP8WIRE_NCCL_OR(ncclAlltoAll(in, plain, per_peer, ncclFloat32, comm, stream), _exit(4));
        else FP8WIRE_NCCL_OR(ncclAllReduce(in, plain, kCount, ncclFloat32, ncclSum, comm, stream), _exit(4));
        FP8WIRE_CUDA_OR(cudaStreamSynchronize(stream), _exit(3));
        std::vector<float> a(kCount), p(kCount);
        FP8WIRE_CUDA_OR(cudaMemcpy(a.data(), fp8, kCount * sizeof(float), cudaMemcpyDeviceToHost), _exit(3));
        FP8WIRE_CUDA_OR(cudaMemcpy(p.data(), plain, kCount * sizeof(float), cudaMemcpyDeviceToHost), _exit(3));
        bitwise[call] = std::memcmp(a.data(), p.data(), kCount * sizeof(float)) == 0;
        if (call == 1) {
          bad_call_rel = max_rel_diff(a, p);
          after_bad = sched::error_totals();
        }
      }
      std::vector<CallRecord> records(256);
      const size_t got = Accounting::instance().snapshot(records.data(), records.size(), seq_before);
      std::string paths;
      for (size_t i = 0; i < got; ++i)
        if (records[i].rank == rank && records[i].nranks == n && records[i].path != Path::passthrough)
          paths += std::string(to_string(records[i].path)) + ",";
      const int c = static_cast<int>(g.collective), p = static_cast<int>(path);
      const quant::ErrorStats& in_after = after_bad.input[c][p];
      const quant::ErrorStats& in_before = before.input[c][p];
      const double sq_e = in_after.sq_error - in_before.sq_error, sq_i = in_after.sq_input - in_before.sq_input;
      const sched::ErrorTotals end = sched::error_totals();
      const double audit_e = after_bad.audit_sq_error[c][p] - before.audit_sq_error[c][p];
      const double audit_x = after_bad.audit_sq_exact[c][p] - before.audit_sq_exact[c][p];
      const bool switched = paths == std::string(to_string(path)) + "," + to_string(path) + ",fallback,fallback," +
                                         to_string(path) + ",";
      const bool ok = switched && bitwise[2] && bitwise[3] && end.guard_trips[c] - before.guard_trips[c] == 1;
      // name status rel_error(bad call, this rank's input, cumulative of calls 0-1) flushed nonfinite
      // guard paths fp8_vs_plain(bad call) bitwise(2,3)
      std::fprintf(out, "%s/%s %s %.3e %llu %llu %.3e %s %.3e %d%d\n", g.name, label(b), ok ? "PASS" : "FAIL",
                   sq_i > 0 ? std::sqrt(sq_e / sq_i) : 0.0, in_after.flushed - in_before.flushed,
                   in_after.nonfinite - in_before.nonfinite, audit_x > 0 ? std::sqrt(audit_e / audit_x) : 0.0,
                   paths.c_str(), bad_call_rel, bitwise[2], bitwise[3]);
      std::fflush(out);
      FP8WIRE_CUDA_OR(cudaStreamSynchronize(stream), _exit(3));
      eng.comm_destroyed(comm);
    }
  }
  cudaFree(in);
  cudaFree(fp8);
  cudaFree(plain);
  ncclCommDestroy(comm);
  std::fclose(out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> worlds = {2, 4};
  int timeout_s = 240;
  std::string child_out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks" && i + 1 < argc) {
      worlds = world_sizes(argv[++i]);
    } else if (a == "--timeout" && i + 1 < argc) {
      timeout_s = std::atoi(argv[++i]);
    } else if (a == "--rank-output" && i + 1 < argc) {
      child_out = argv[++i];
    } else {
      std::fprintf(stderr, "unknown argument '%s'; expected --ranks 2,4 | --timeout S\n", a.c_str());
      return 2;
    }
  }
  if (!child_out.empty()) {
    return run_launched_rank(timeout_s, [&](const RankEnv& env, const ncclUniqueId& id) {
      return rank_main(env.rank, env.world_size, id, child_out + std::to_string(env.rank));
    });
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  int failures = 0;
  std::printf("%-5s %-4s %-34s %-6s %-10s %-8s %-9s %-10s %-48s %-12s %s\n", "ranks", "rank", "case", "result",
              "telemetry", "flushed", "nonfinite", "audit", "paths (calls 0-4)", "fp8_vs_nccl", "calls 2,3 == NCCL");
  for (int n : worlds) {
    const std::string prefix = "/tmp/fp8wire_guard_" + std::to_string(getpid()) + "_" + std::to_string(n) + "_";
    LaunchSpec spec;
    spec.argv = {"/proc/self/exe", "--rank-output", prefix, "--timeout", std::to_string(timeout_s)};
    spec.one_gpu = true;
    spec.nranks = n;
    spec.timeout_s = timeout_s + 30;
    const LaunchResult launched = launch_local_ranks(spec);
    std::printf("testbed: %d ranks on one GPU, %s\n", n, launched.testbed.empty() ? "?" : launched.testbed.c_str());
    if (!launched.ok) {
      std::fprintf(stderr, "FAIL: world size %d: %s\n", n, launched.error.c_str());
      ++failures;
    }
    for (int r = 0; r < n; ++r) {
      std::ifstream f(prefix + std::to_string(r));
      std::string name, status, paths, bits;
      double rel = 0, diff = 0, audit = 0;
      unsigned long long flushed = 0, nonfinite = 0;
      int lines = 0;
      while (f >> name >> status >> rel >> flushed >> nonfinite >> audit >> paths >> diff >> bits) {
        ++lines;
        if (status != "PASS") ++failures;
        std::printf("%-5d %-4d %-34s %-6s %-10.3e %-8llu %-9llu %-10.3e %-48s %-12.3e %s\n", n, r, name.c_str(),
                    status.c_str(), rel, flushed, nonfinite, audit, paths.c_str(), diff,
                    bits == "11" ? "bitwise" : "DIFFER");
      }
      if (lines != kGuardedCalls * kBreakages) {
        std::fprintf(stderr, "FAIL: world size %d rank %d reported %d cases, expected %d\n", n, r, lines,
                     kGuardedCalls * kBreakages);
        ++failures;
      }
      unlink((prefix + std::to_string(r)).c_str());
    }
  }
  std::printf("%s guard_gpu: %d failures\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
