// fp8wire-transport-probe: times the ways fp8wire can move its quantized bytes between ranks, with no
// codec in the way, so that path design rests on measurements of the fabric rather than guesses.
//
// For each input size S (the caller's bf16 bytes) it derives Q, the bytes one rank's FP8 copy takes on
// the wire (payload + fp32 scale per 128 elements), and times on one communicator:
//   allreduce      NCCL's bf16 all-reduce of S (the baseline every FP8 path must beat)
//   allgather      ncclAllGather of Q per rank               (the one-shot exchange)
//   p2p            grouped send/recv of Q to/from every peer (the one-shot exchange as point-to-point)
//   split f        one group: all-gather of f*Q + send/recv of (1-f)*Q (collective and p2p
//                  connections used at once)
//   two_allgather  one group: two all-gathers of Q/2
//   a2a            grouped send/recv of Q/n to/from every peer (two-shot's first phase)
//   allgather/n    ncclAllGather of Q/n per rank              (two-shot's second phase)
//   p2p/n          grouped send/recv of Q/n with every peer   (that phase as point-to-point)
//   a2a, allgather/n   both phases back to back; a2a+allgather/n: both in one group
//   split/n f      one group: all-gather of f*Q/n + send/recv of (1-f)*Q/n
// Median of the repeats on rank 0 after a barrier per repeat; --rows times only the rows named. Launch: --emulate-ranks N (N ranks on
// one GPU, distinct NCCL_HOSTID) or one rank per visible GPU, like fp8wire-bench.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "common/command_line.hpp"
#include "common/rank_launcher.hpp"
#include "common/status.hpp"
#include "bench/host/units.hpp"

namespace fb = fp8wire::bench;

namespace {

struct Options {
  int emulate_ranks = 0;
  std::vector<size_t> sizes;
  std::vector<double> fractions{0.5, 0.6, 0.7};
  std::vector<std::string> rows;  // empty: every row
  int warmup = 2, repeats = 5;
  // A row by its name, or the split rows by theirs without the fraction ("split", "split/n").
  bool wants(const std::string& name) const {
    if (rows.empty()) return true;
    return std::any_of(rows.begin(), rows.end(),
                       [&](const std::string& r) { return name == r || name.rfind(r + " ", 0) == 0; });
  }
};

struct Rank {
  int rank = 0, n = 1;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  char* send = nullptr;
  char* recv = nullptr;
  float* flag = nullptr;

  void barrier() {
    FP8WIRE_NCCL_OR_EXIT(ncclAllReduce(flag, flag, 1, ncclFloat32, ncclSum, comm, stream));
    FP8WIRE_CUDA_OR_EXIT(cudaStreamSynchronize(stream));
  }

  // Grouped send/recv of `bytes` to and from every peer; slot j of `recv` takes peer j's bytes.
  void p2p_all(size_t bytes, size_t send_off, size_t recv_off) {
    for (int j = 0; j < n; ++j) {
      if (j == rank || bytes == 0) continue;
      FP8WIRE_NCCL_OR_EXIT(ncclSend(send + send_off, bytes, ncclUint8, j, comm, stream));
      FP8WIRE_NCCL_OR_EXIT(ncclRecv(recv + recv_off + j * bytes, bytes, ncclUint8, j, comm, stream));
    }
  }

  // Send/recv of bytes/n to each peer (each peer gets its own slice).
  void a2a(size_t bytes) {
    const size_t per = bytes / n;
    for (int j = 0; j < n; ++j) {
      if (j == rank) continue;
      FP8WIRE_NCCL_OR_EXIT(ncclSend(send + j * per, per, ncclUint8, j, comm, stream));
      FP8WIRE_NCCL_OR_EXIT(ncclRecv(recv + j * per, per, ncclUint8, j, comm, stream));
    }
  }

  // All-gather of f*q in the group with send/recv of the rest.
  void split(size_t q, double f) {
    const size_t head = static_cast<size_t>(f * static_cast<double>(q)) & ~size_t(255);
    FP8WIRE_NCCL_OR_EXIT(ncclGroupStart());
    if (head) FP8WIRE_NCCL_OR_EXIT(ncclAllGather(send, recv, head, ncclUint8, comm, stream));
    p2p_all(q - head, head, n * head);
    FP8WIRE_NCCL_OR_EXIT(ncclGroupEnd());
  }

  template <class Op>
  double median_ms(const Options& o, Op&& op) {
    cudaEvent_t a, b;
    FP8WIRE_CUDA_OR_EXIT(cudaEventCreate(&a));
    FP8WIRE_CUDA_OR_EXIT(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < o.warmup + o.repeats; ++i) {
      barrier();
      FP8WIRE_CUDA_OR_EXIT(cudaEventRecord(a, stream));
      op();
      FP8WIRE_CUDA_OR_EXIT(cudaEventRecord(b, stream));
      FP8WIRE_CUDA_OR_EXIT(cudaStreamSynchronize(stream));
      float t = 0;
      FP8WIRE_CUDA_OR_EXIT(cudaEventElapsedTime(&t, a, b));
      if (i >= o.warmup) ms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
};

int run_rank(const Options& o, const fp8wire::RankEnv& env) {
  if (o.emulate_ranks > 0) fp8wire::set_emulated_host(env.rank);
  int ndev = 0;
  FP8WIRE_CUDA_OR_EXIT(cudaGetDeviceCount(&ndev));
  FP8WIRE_CUDA_OR_EXIT(cudaSetDevice(o.emulate_ranks > 0 ? 0 : env.local_rank % ndev));
  Rank r;
  r.rank = env.rank;
  r.n = env.world_size;
  FP8WIRE_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  ncclUniqueId id{};
  if (env.rank == 0) FP8WIRE_NCCL_OR_EXIT(ncclGetUniqueId(&id));
  std::string error;
  if (!fp8wire::exchange_bootstrap_blob(env, &id, sizeof(id), 120, error)) {
    std::fprintf(stderr, "transport-probe rank %d: %s\n", env.rank, error.c_str());
    return 2;
  }
  FP8WIRE_NCCL_OR_EXIT(ncclCommInitRank(&r.comm, env.world_size, id, env.rank));
  const size_t max_s = *std::max_element(o.sizes.begin(), o.sizes.end());
  const size_t max_q = max_s / 2 / 128 * 132 + 4096;
  const size_t bytes = std::max(max_s, 2 * max_q * r.n) + (1 << 20);  // room for two phases' outputs
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&r.send, bytes));
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&r.recv, bytes));
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&r.flag, sizeof(float)));
  FP8WIRE_CUDA_OR_EXIT(cudaMemset(r.send, 0x3c, bytes));   // bf16 ~1.0: finite values for the all-reduce
  if (r.rank == 0)
    std::printf("# transport probe: %d ranks%s, median of %d ms (rank 0)\n# %10s %-16s %10s %10s\n", r.n,
                o.emulate_ranks ? " (emulated, one GPU)" : "", o.repeats, "S", "transport", "bytes/rank", "ms");
  auto row = [&](size_t s, const std::string& what, size_t b, auto&& op) {
    if (!o.wants(what)) return;
    const double ms = r.median_ms(o, op);
    if (r.rank == 0) std::printf("  %10s %-16s %10s %10.2f\n", fb::format_bytes(s).c_str(), what.c_str(), fb::format_bytes(b).c_str(), ms);
    std::fflush(stdout);
  };
  for (size_t s : o.sizes) {
    const size_t q = (s / 2 / 128 * 132 + 255) & ~size_t(255);
    const size_t qn = (q / r.n + 255) & ~size_t(255);
    row(s, "allreduce bf16", s, [&] {
      FP8WIRE_NCCL_OR_EXIT(ncclAllReduce(r.send, r.recv, s / 2, ncclBfloat16, ncclSum, r.comm, r.stream));
    });
    row(s, "allgather", q, [&] { FP8WIRE_NCCL_OR_EXIT(ncclAllGather(r.send, r.recv, q, ncclUint8, r.comm, r.stream)); });
    row(s, "p2p", q, [&] {
      FP8WIRE_NCCL_OR_EXIT(ncclGroupStart());
      r.p2p_all(q, 0, 0);
      FP8WIRE_NCCL_OR_EXIT(ncclGroupEnd());
    });
    for (double f : o.fractions) row(s, fmt::format("split {:.2f}", f), q, [&] { r.split(q, f); });
    row(s, "two_allgather", q, [&] {
      const size_t h = (q / 2 + 255) & ~size_t(255);
      FP8WIRE_NCCL_OR_EXIT(ncclGroupStart());
      FP8WIRE_NCCL_OR_EXIT(ncclAllGather(r.send, r.recv, h, ncclUint8, r.comm, r.stream));
      FP8WIRE_NCCL_OR_EXIT(ncclAllGather(r.send + h, r.recv + r.n * h, q - h, ncclUint8, r.comm, r.stream));
      FP8WIRE_NCCL_OR_EXIT(ncclGroupEnd());
    });
    row(s, "a2a", q, [&] {
      FP8WIRE_NCCL_OR_EXIT(ncclGroupStart());
      r.a2a(q);
      FP8WIRE_NCCL_OR_EXIT(ncclGroupEnd());
    });
    row(s, "allgather/n", qn, [&] { FP8WIRE_NCCL_OR_EXIT(ncclAllGather(r.send, r.recv, qn, ncclUint8, r.comm, r.stream)); });
    row(s, "p2p/n", qn, [&] {
      FP8WIRE_NCCL_OR_EXIT(ncclGroupStart());
      r.p2p_all(qn, 0, 0);
      FP8WIRE_NCCL_OR_EXIT(ncclGroupEnd());
    });
    // Two-shot's two phases back to back, and in one group (the overlap of one stage's gather with
    // the next stage's all-to-all would run them so): what the operations' fixed costs and the
    // second connection set are worth.
    row(s, "a2a, allgather/n", q, [&] {
      FP8WIRE_NCCL_OR_EXIT(ncclGroupStart());
      r.a2a(q);
      FP8WIRE_NCCL_OR_EXIT(ncclGroupEnd());
      FP8WIRE_NCCL_OR_EXIT(ncclAllGather(r.send, r.recv + r.n * q, qn, ncclUint8, r.comm, r.stream));
    });
    row(s, "a2a+allgather/n", q, [&] {
      FP8WIRE_NCCL_OR_EXIT(ncclGroupStart());
      r.a2a(q);
      FP8WIRE_NCCL_OR_EXIT(ncclAllGather(r.send, r.recv + r.n * q, qn, ncclUint8, r.comm, r.stream));
      FP8WIRE_NCCL_OR_EXIT(ncclGroupEnd());
    });
    for (double f : o.fractions)
      row(s, fmt::format("split/n {:.2f}", f), qn, [&] { r.split(qn, f); });
  }
  FP8WIRE_CUDA_OR_EXIT(cudaStreamSynchronize(r.stream));
  ncclCommDestroy(r.comm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fp8wire-transport-probe: time the transports fp8wire can use for its quantized bytes"};
  Options o;
  std::vector<std::string> sizes{"4MiB", "64MiB"};
  std::string fractions;
  app.add_option("--emulate-ranks", o.emulate_ranks, "N ranks sharing GPU 0 (distinct NCCL_HOSTID)")->check(CLI::Range(0, 64));
  app.add_option("--sizes", sizes, "input sizes (bf16 bytes), e.g. 4MiB 64MiB");
  app.add_option("--fractions", o.fractions, "all-gather share of the split transports (0..1)")->check(CLI::Range(0.0, 1.0));
  app.add_option("--rows", o.rows, "only these rows, by name (\"a2a\", \"allgather/n\", \"split/n\", ...); default all");
  app.add_option("--warmup", o.warmup)->check(CLI::Range(0, 1000));
  app.add_option("--repeats", o.repeats)->check(CLI::Range(1, 1000));
  if (const auto status = fp8wire::parse_command_line(app, argc, argv, "fp8wire-transport-probe")) return *status;
  for (const auto& s : sizes) {
    const auto v = fb::parse_bytes(s);
    if (!v || *v < 4096) {
      std::fprintf(stderr, "transport-probe: --sizes '%s': expected a size of at least 4KiB, e.g. 64MiB\n", s.c_str());
      return 2;
    }
    o.sizes.push_back(*v);
  }

  std::string error;
  if (auto env = fp8wire::rank_env_from_environment(error)) return run_rank(o, *env);
  if (!error.empty()) {
    std::fprintf(stderr, "transport-probe: %s\n", error.c_str());
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "transport-probe: no CUDA device visible\n");
    return 2;
  }
  fp8wire::LaunchSpec spec;
  spec.argv.assign(argv, argv + argc);
  spec.nranks = o.emulate_ranks > 0 ? o.emulate_ranks : ndev;
  spec.one_gpu = o.emulate_ranks > 0;
  spec.timeout_s = 300;
  const auto res = fp8wire::launch_local_ranks(spec);
  if (!res.ok) std::fprintf(stderr, "transport-probe: %s\n", res.error.c_str());
  return res.ok ? 0 : 1;
}
