// The direct transports' kernel sequences on one GPU, with N simulated peers in one process: each
// "rank" has a window (device memory, as a peer's over NVLink/P2P, or pinned host memory mapped into
// the GPU, as the host-memory transport's), and the codec kernels are given pointers into the other
// ranks' windows exactly as the direct algorithms give them (sched/algorithms/direct.cpp): a quantize
// stores into the window its readers read, a fused reduce loads every window in rank order. The flag
// handshakes are left out (one stream orders everything here); the multi-process tests check them.
//
//   correctness  N = 2..8, bf16/fp16/fp32, sum/avg, odd counts, in and out of place, both window
//                kinds, one-shot / two-shot all-reduce, reduce-scatter, all-gather: every rank's
//                result bit for bit the CPU reference algorithm (tests/sched/sim_job.hpp), which is
//                what the same call over NCCL gives; ranks identical;
//   graph        the one-shot sequence captured into a CUDA graph, replayed on new inputs: equal to
//                the reference each time;
//   bandwidth    the kernels that cross the link of the host-memory transport (quantize storing into
//                mapped host memory, the fused reduce loading it), against cudaMemcpyAsync of the same
//                bytes through pinned memory, in the same run, for several CTA caps (direct.ctas).
// Exit 0 all passed, 1 a failure, 77 no CUDA device. --quick: fewer sizes.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "quant/quant.hpp"
#include "sched/algorithms/algorithms.hpp"
#include "sched/plan/stages.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;

namespace {

int g_failures = 0;
int g_checks = 0;


enum class Kind { device, host };
const char* name(Kind k) { return k == Kind::device ? "device window" : "host window"; }

// N windows of `bytes` each (device memory, or mapped pinned host memory), and their GPU addresses.
struct Windows {
  Kind kind;
  std::vector<char*> at;  // what kernels use
  std::vector<void*> own;
  Windows(Kind k, int n, size_t bytes) : kind(k) {
    for (int r = 0; r < n; ++r) {
      void* p = nullptr;
      if (k == Kind::device) {
        FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&p, bytes));
        at.push_back(static_cast<char*>(p));
      } else {
        FP8WIRE_CUDA_OR_EXIT(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
        void* d = nullptr;
        FP8WIRE_CUDA_OR_EXIT(cudaHostGetDevicePointer(&d, p, 0));
        at.push_back(static_cast<char*>(d));
      }
      own.push_back(p);
    }
  }
  ~Windows() {
    for (void* p : own) kind == Kind::device ? cudaFree(p) : cudaFreeHost(p);
  }
};

struct Job {
  Spec spec;
  int n = 2;
  bool in_place = false;
};

quant::ElemType etype(DataType t) { return elem_type(t); }

// The direct algorithm's kernels for every simulated rank, in an order that satisfies the flags the
// real transport would wait on (all writers of a phase before its readers).
void run_direct(const Job& job, Windows& w, const std::vector<char*>& in, const std::vector<char*>& out,
                const quant::WireFormat& f, cudaStream_t st, quant::LaunchOptions opt) {
  const Spec& s = job.spec;
  const int n = job.n;
  const quant::ElemType t = etype(s.dtype);
  const size_t es = quant::elem_size(t);
  const float post = s.op == ReduceOp::avg ? 1.0f / static_cast<float>(n) : 1.0f;
  auto at = [&](uint64_t sr) {
    quant::LaunchOptions o = opt;
    o.sr_offset = sr;
    return o;
  };
  std::array<const void*, quant::kMaxReduceInputs> inputs{};
  switch (s.collective) {
    case Collective::all_reduce:
      if (s.path == Path::one_shot) {
        for (int r = 0; r < n; ++r)
          FP8WIRE_CUDA_OR_EXIT(quant::quantize(in[r], t, s.count, w.at[r], quant::Segmented::single(s.count, f), f, st, at(0)));
        for (int j = 0; j < n; ++j) inputs[j] = w.at[j];
        for (int r = 0; r < n; ++r) {
          quant::ReduceOutput o{out[r], t, nullptr};
          FP8WIRE_CUDA_OR_EXIT(quant::dequantize_reduce(inputs.data(), n, s.count, post, o, f, st, at(0)));
        }
      } else {
        const sched::ShardLayout l = sched::shard_layout(s.count, n, f);
        for (int r = 0; r < n; ++r)
          for (int j = 0; j < n; ++j)
            if (l.length(j))
              FP8WIRE_CUDA_OR_EXIT(quant::quantize(in[r] + l.begin(j) * es, t, l.length(j), w.at[j] + r * l.seg_stride,
                                 quant::Segmented::single(l.length(j), f), f, st, at(l.begin(j))));
        for (int r = 0; r < n; ++r) {
          if (!l.length(r)) continue;
          for (int j = 0; j < n; ++j) inputs[j] = w.at[r] + j * l.seg_stride;
          quant::ReduceOutput o{nullptr, t, w.at[r] + static_cast<size_t>(n) * l.seg_stride};
          FP8WIRE_CUDA_OR_EXIT(quant::dequantize_reduce(inputs.data(), n, l.length(r), post, o, f, st, at(l.begin(r))));
        }
        for (int r = 0; r < n; ++r)
          for (int j = 0; j < n; ++j)
            if (l.length(j))
              FP8WIRE_CUDA_OR_EXIT(quant::dequantize(w.at[j] + static_cast<size_t>(n) * l.seg_stride, quant::Segmented::single(l.length(j), f),
                                   l.length(j), out[r] + l.begin(j) * es, t, f, st, opt));
      }
      break;
    case Collective::reduce_scatter: {
      const size_t cb = quant::chunk_bytes(s.count, f);
      for (int r = 0; r < n; ++r)
        for (int j = 0; j < n; ++j)
          FP8WIRE_CUDA_OR_EXIT(quant::quantize(in[r] + static_cast<size_t>(j) * s.count * es, t, s.count, w.at[j] + r * cb,
                             quant::Segmented::single(s.count, f), f, st, at(static_cast<size_t>(j) * s.count)));
      for (int r = 0; r < n; ++r) {
        for (int j = 0; j < n; ++j) inputs[j] = w.at[r] + j * cb;
        quant::ReduceOutput o{out[r], t, nullptr};
        FP8WIRE_CUDA_OR_EXIT(quant::dequantize_reduce(inputs.data(), n, s.count, post, o, f, st, at(static_cast<size_t>(r) * s.count)));
      }
      break;
    }
    case Collective::all_gather:
      for (int r = 0; r < n; ++r)
        FP8WIRE_CUDA_OR_EXIT(quant::quantize(in[r], t, s.count, w.at[r], quant::Segmented::single(s.count, f), f, st, at(0)));
      for (int r = 0; r < n; ++r)
        for (int j = 0; j < n; ++j)
          FP8WIRE_CUDA_OR_EXIT(quant::dequantize(w.at[j], quant::Segmented::single(s.count, f), s.count,
                               out[r] + static_cast<size_t>(j) * s.count * es, t, f, st, opt));
      break;
  }
}

void check_job(const Job& job, Windows& w, cudaStream_t st, quant::LaunchOptions opt) {
  const Kind kind = w.kind;
  const Spec& s = job.spec;
  const int n = job.n;
  const quant::WireFormat f = quant::WireFormat::from(Config{});
  const size_t es = dtype_size(s.dtype);
  const size_t in_bytes = in_elems(s, n) * es, out_bytes = out_elems(s, n) * es;
  std::vector<Bytes> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(make_input(s, r, n));
  std::vector<char*> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&in[r], std::max(in_bytes, out_bytes)));
    FP8WIRE_CUDA_OR_EXIT(cudaMemcpy(in[r], inputs[r].data(), in_bytes, cudaMemcpyHostToDevice));
    if (job.in_place && s.collective == Collective::all_reduce) {
      out[r] = in[r];
    } else {
      FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&out[r], out_bytes));
      FP8WIRE_CUDA_OR_EXIT(cudaMemset(out[r], 0xFF, out_bytes));  // poisoned: every element must be written
    }
  }
  run_direct(job, w, in, out, f, st, opt);
  FP8WIRE_CUDA_OR_EXIT(cudaStreamSynchronize(st));
  FP8WIRE_CUDA_OR_EXIT(cudaGetLastError());
  Bytes first;
  for (int r = 0; r < n; ++r) {
    Bytes got(out_bytes);
    FP8WIRE_CUDA_OR_EXIT(cudaMemcpy(got.data(), out[r], out_bytes, cudaMemcpyDeviceToHost));
    const Bytes want = expected_output(s, inputs, r, f, 0);
    ++g_checks;
    const bool alike = r == 0 || s.collective == Collective::reduce_scatter || got == first;
    if (r == 0) first = got;
    if (got != want || !alike) {
      ++g_failures;
      std::printf("FAIL: %s %s %s n=%d dtype=%d %s count=%zu %s: rank %d %s\n", name(kind), to_string(s.collective),
                  to_string(s.path), n, static_cast<int>(s.dtype), s.op == ReduceOp::avg ? "avg" : "sum", s.count,
                  job.in_place ? "in place" : "out of place", r, got != want ? "differs from the reference" : "differs from rank 0");
    }
  }
  for (int r = 0; r < n; ++r) {
    if (out[r] != in[r]) cudaFree(out[r]);
    cudaFree(in[r]);
  }
}

// The one-shot sequence of 4 ranks captured once, replayed on three new inputs.
void check_graph(Kind kind, cudaStream_t st, quant::LaunchOptions opt) {
  const int n = 4;
  Job job{{Collective::all_reduce, Path::one_shot, DataType::bf16, ReduceOp::sum, 70001, 3}, n, false};
  const quant::WireFormat f = quant::WireFormat::from(Config{});
  const size_t bytes = job.spec.count * 2;
  std::vector<char*> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&in[r], bytes));
    FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&out[r], bytes));
  }
  Windows w(kind, n, quant::chunk_bytes(job.spec.count, f) + 4096);
  cudaGraph_t g;
  cudaGraphExec_t ge;
  FP8WIRE_CUDA_OR_EXIT(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  run_direct(job, w, in, out, f, st, opt);
  FP8WIRE_CUDA_OR_EXIT(cudaStreamEndCapture(st, &g));
  FP8WIRE_CUDA_OR_EXIT(cudaGraphInstantiate(&ge, g, 0));
  for (uint64_t seed : {5u, 6u, 7u}) {
    job.spec.seed = seed;
    std::vector<Bytes> inputs;
    for (int r = 0; r < n; ++r) {
      inputs.push_back(make_input(job.spec, r, n));
      FP8WIRE_CUDA_OR_EXIT(cudaMemcpy(in[r], inputs[r].data(), bytes, cudaMemcpyHostToDevice));
      FP8WIRE_CUDA_OR_EXIT(cudaMemset(out[r], 0xFF, bytes));
    }
    FP8WIRE_CUDA_OR_EXIT(cudaGraphLaunch(ge, st));
    FP8WIRE_CUDA_OR_EXIT(cudaStreamSynchronize(st));
    for (int r = 0; r < n; ++r) {
      Bytes got(bytes);
      FP8WIRE_CUDA_OR_EXIT(cudaMemcpy(got.data(), out[r], bytes, cudaMemcpyDeviceToHost));
      ++g_checks;
      if (got != expected_output(job.spec, inputs, r, f, 0)) {
        ++g_failures;
        std::printf("FAIL: %s graph replay (seed %llu): rank %d differs from the reference\n", name(kind),
                    static_cast<unsigned long long>(seed), r);
      }
    }
  }
  FP8WIRE_CUDA_OR_EXIT(cudaGraphExecDestroy(ge));
  FP8WIRE_CUDA_OR_EXIT(cudaGraphDestroy(g));
  for (int r = 0; r < n; ++r) cudaFree(in[r]), cudaFree(out[r]);
}

float median_ms(cudaStream_t st, const std::function<void()>& work, int reps = 9) {
  cudaEvent_t a, b;
  FP8WIRE_CUDA_OR_EXIT(cudaEventCreate(&a));
  FP8WIRE_CUDA_OR_EXIT(cudaEventCreate(&b));
  work();
  FP8WIRE_CUDA_OR_EXIT(cudaStreamSynchronize(st));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    FP8WIRE_CUDA_OR_EXIT(cudaEventRecord(a, st));
    work();
    FP8WIRE_CUDA_OR_EXIT(cudaEventRecord(b, st));
    FP8WIRE_CUDA_OR_EXIT(cudaEventSynchronize(b));
    float ms = 0;
    FP8WIRE_CUDA_OR_EXIT(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

// The host-memory transport's link, as its kernels use it: one rank's bf16 buffer quantized into
// mapped host memory (what every peer reads), and a 2-input fused reduce loading two such windows
// (what each rank does), against cudaMemcpyAsync through pinned memory of the bytes each moves.
void bandwidth(cudaStream_t st, size_t count) {
  const quant::WireFormat f = quant::WireFormat::from(Config{});
  const size_t wire = quant::chunk_bytes(count, f);
  char *in = nullptr, *out = nullptr, *dev_wire = nullptr;
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&in, count * 2));
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&out, count * 2));
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&dev_wire, 2 * wire));
  FP8WIRE_CUDA_OR_EXIT(cudaMemset(in, 0x3C, count * 2));  // bf16 1.1719: finite, non-zero blocks
  Windows w(Kind::host, 2, wire);
  const float d2h = median_ms(st, [&] { FP8WIRE_CUDA_OR_EXIT(cudaMemcpyAsync(w.own[0], dev_wire, wire, cudaMemcpyDeviceToHost, st)); });
  const float h2d = median_ms(st, [&] {
    FP8WIRE_CUDA_OR_EXIT(cudaMemcpyAsync(dev_wire, w.own[0], wire, cudaMemcpyHostToDevice, st));
    FP8WIRE_CUDA_OR_EXIT(cudaMemcpyAsync(dev_wire + wire, w.own[1], wire, cudaMemcpyHostToDevice, st));
  });
  auto gbs = [](double bytes, float ms) { return bytes / (ms * 1e6); };
  std::printf("bandwidth: %zu MiB bf16 -> %zu MiB on the wire; pinned cudaMemcpyAsync D2H %.1f GB/s, H2D %.1f GB/s "
              "(the ceiling)\n", count * 2 >> 20, wire >> 20, gbs(wire, d2h), gbs(2.0 * wire, h2d));
  std::printf("bandwidth: %5s | %-34s | %-34s\n", "CTAs", "quantize -> host window (D2H)", "reduce of 2 host windows (H2D)");
  for (uint32_t ctas : {2u, 4u, 8u, 16u, 32u, 0u}) {
    quant::LaunchOptions opt;
    opt.max_ctas = ctas;
    const float q = median_ms(st, [&] {
      FP8WIRE_CUDA_OR_EXIT(quant::quantize(in, quant::ElemType::bf16, count, w.at[0], quant::Segmented::single(count, f), f, st, opt));
    });
    FP8WIRE_CUDA_OR_EXIT(quant::quantize(in, quant::ElemType::bf16, count, w.at[1], quant::Segmented::single(count, f), f, st, opt));
    const void* inputs[2] = {w.at[0], w.at[1]};
    const float rd = median_ms(st, [&] {
      quant::ReduceOutput o{out, quant::ElemType::bf16, nullptr};
      FP8WIRE_CUDA_OR_EXIT(quant::dequantize_reduce(inputs, 2, count, 1.0f, o, f, st, opt));
    });
    std::printf("bandwidth: %5s | %6.1f GB/s %5.1f %% of the ceiling     | %6.1f GB/s %5.1f %% of the ceiling\n",
                ctas ? std::to_string(ctas).c_str() : "all", gbs(wire, q), 100.0 * d2h / q, gbs(2.0 * wire, rd),
                100.0 * h2d / rd);
  }
  FP8WIRE_CUDA_OR_EXIT(cudaGetLastError());
  cudaFree(in);
  cudaFree(out);
  cudaFree(dev_wire);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  cudaStream_t st;
  FP8WIRE_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  quant::LaunchOptions opt;
  opt.max_ctas = 16;  // as direct.ctas by default
  const Collective collectives[] = {Collective::all_reduce, Collective::all_reduce, Collective::reduce_scatter,
                                    Collective::all_gather};
  const Path paths[] = {Path::one_shot, Path::two_shot, Path::two_shot, Path::one_shot};
  for (Kind kind : {Kind::device, Kind::host}) {
    const int before = g_checks, failed_before = g_failures;
    // Eight windows, each large enough for the largest job below (8 ranks, a reduce-scatter of
    // 65537 elements per rank in fp32), made once: pinned host allocations are slow.
    const quant::WireFormat f = quant::WireFormat::from(Config{});
    Windows w(kind, 8, sched::direct_set_bytes(Collective::reduce_scatter, Path::two_shot, 65537, 8, f) +
                           sched::direct_set_bytes(Collective::all_reduce, Path::two_shot, 65537, 8, f));
    for (int n = 2; n <= 8; ++n) {
      for (int v = 0; v < 4; ++v) {
        for (DataType t : {DataType::bf16, DataType::f16, DataType::f32}) {
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
            if (collectives[v] == Collective::all_gather && op == ReduceOp::avg) continue;
            std::vector<size_t> counts = {1, 127, 4099, size_t(3 * n * 128 + 5)};
            if (!quick) counts.push_back((size_t{1} << 16) + 1);
            for (size_t count : counts)
              for (bool in_place : {false, true}) {
                if (in_place && collectives[v] != Collective::all_reduce) continue;
                check_job({{collectives[v], paths[v], t, op, count, 40u + count}, n, in_place}, w, st, opt);
              }
          }
        }
      }
    }
    check_graph(kind, st, opt);
    std::printf("%s %s: %d/%d bit-exact against the reference algorithm (N = 2..8, 3 dtypes, sum/avg, 4 collectives, "
                "in and out of place, graph replay)\n", g_failures == failed_before ? "PASS" : "FAIL", name(kind),
                g_checks - before - (g_failures - failed_before), g_checks - before);
  }
  bandwidth(st, quick ? size_t{16} << 20 : size_t{64} << 20);
  std::printf("direct kernels: %s (%d checks, %d failures)\n", g_failures ? "FAIL" : "PASS", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
