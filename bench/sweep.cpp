#include "bench/sweep.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <fmt/format.h>

#include "bench/host/check.hpp"
#include "bench/host/planner_check.hpp"
#include "bench/host/profile.hpp"
#include "bench/host/results.hpp"
#include "common/config.hpp"
#include "common/output_file.hpp"
#include "common/log.hpp"
#include "common/status.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/engine/engine.hpp"
#include "sched/engine/engine_probe.hpp"
#include "sched/platform/gpu_platform.hpp"
#include "sched/platform/nccl_api_linked.hpp"
#if FP8WIRE_BENCH_HAVE_QUANT
#include "quant/quant.hpp"
#endif

namespace fp8wire::bench {

namespace {

// Errors inside the worker: FP8WIRE_CUDA_OR / FP8WIRE_NCCL_OR log them (the log names the rank) and
// return exit code 2 from run_sweep_rank.

int g_rank = 0;

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::f32: return ncclFloat32;
  }
  return ncclFloat32;
}

// What one rank reports for one point, all-gathered (as bytes) to rank 0.
struct RankReport {
  double times_us[kMaxRepeats];
  int32_t repeats;
  int32_t status;          // ncclResult_t of the first failing call, 0 = fine
  double max_err_ratio;
  uint64_t mismatches;
  uint64_t nonfinite;
  uint64_t hash;
  uint64_t wire_bytes;     // per application call, from Accounting
  uint64_t recorded_calls; // calls Accounting saw during the timed region
  uint64_t fallback_calls; // of those, calls an FP8 request ran as plain NCCL (fallback)
  uint64_t gather_calls[3];// of those, by the transport of their gather step (index = GatherMethod)
  uint64_t direct_calls;   // of those, calls a direct transport carried
  int32_t checked;
};

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Device buffers of one (collective, dtype): `buffers` send and receive buffers at the largest size.
struct Buffers {
  std::vector<void*> send, recv;
  ~Buffers() {
    for (void* p : send) cudaFree(p);
    for (void* p : recv) cudaFree(p);
  }
};

struct Worker {
  Worker(const SweepOptions& options, const RankEnv& rank_env) : opt(options), env(rank_env) {}
  const SweepOptions& opt;
  RankEnv env;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  NcclApi api;
  Platform platform;  // the GPU platform over `api`, shared by the engines below
  // One engine per gather transport timed, all on the one communicator, each with its own
  // configuration, scratch and agreement: with --gather-transport both, every path with a gather
  // step is timed on each in turn; paths without one run on the first alone.
  struct Variant {
    std::optional<GatherMethod> transport;  // nullopt: gather_transport as loaded ("auto")
    std::unique_ptr<sched::Engine> engine;
    std::optional<Carrier> direct;       // a direct transport carries this variant's FP8 calls
  };
  std::vector<Variant> variants;
  Config config;  // as loaded, with the benchmark's overrides (the variants' differ in gather_transport)
  Config loaded;  // as loaded (and --fabric): what the shim would plan with, for the planner's picks
  void* report_send = nullptr;   // device: one RankReport
  void* report_recv = nullptr;   // device: world_size RankReports
  std::vector<cudaEvent_t> start_events, stop_events;
  bool progress_tty = false;

  ncclResult_t issue(sched::Engine& engine, Collective c, Path path, const void* send, void* recv, uint64_t count,
                     DType d) {
    const ncclDataType_t t = nccl_type(d);
    switch (c) {
      case Collective::all_reduce: return sched::EngineProbe(engine).all_reduce_forced(path, send, recv, count, t, ncclSum, comm, stream);
      case Collective::reduce_scatter: return sched::EngineProbe(engine).reduce_scatter_forced(path, send, recv, count, t, ncclSum, comm, stream);
      case Collective::all_gather: return sched::EngineProbe(engine).all_gather_forced(path, send, recv, count, t, comm, stream);
      case Collective::all_to_all: return sched::EngineProbe(engine).all_to_all_forced(path, send, recv, count, t, comm, stream);
      case Collective::send_recv: return message_round(engine, path, send, recv, count, t);
    }
    return ncclInvalidArgument;
  }

  // One round of messages as sendrecv_perf times it: `count` elements to the next rank and from the
  // previous one, in one group. FP8 through the engine's send and receive (the benchmark's
  // configuration turns messages on at every size); pass-through is NCCL's own pair of calls.
  ncclResult_t message_round(sched::Engine& engine, Path path, const void* send, void* recv, uint64_t count,
                             ncclDataType_t t) {
    const int n = env.world_size;
    const int next = (env.rank + 1) % n, prev = (env.rank + n - 1) % n;
    const bool plain = path == Path::passthrough;
    ncclResult_t res = plain ? api.GroupStart() : engine.group_start();
    if (res != ncclSuccess) return res;
    res = plain ? api.Send(send, count, t, next, comm, stream) : engine.send(send, count, t, next, comm, stream);
    if (res == ncclSuccess)
      res = plain ? api.Recv(recv, count, t, prev, comm, stream) : engine.recv(recv, count, t, prev, comm, stream);
    // The group is closed whatever happened inside it, and its first error wins.
    const ncclResult_t end = plain ? api.GroupEnd() : engine.group_end();
    return res != ncclSuccess ? res : end;
  }

  // All-gathers one RankReport per rank; rank 0 gets them in rank order.
  int gather_reports(const RankReport& mine, std::vector<RankReport>& all) {
    FP8WIRE_CUDA_OR(cudaMemcpyAsync(report_send, &mine, sizeof(RankReport), cudaMemcpyHostToDevice, stream), return 2);
    FP8WIRE_NCCL_OR(api.AllGather(report_send, report_recv, sizeof(RankReport), ncclUint8, comm, stream), return 2);
    all.resize(static_cast<size_t>(env.world_size));
    FP8WIRE_CUDA_OR(cudaMemcpyAsync(all.data(), report_recv, sizeof(RankReport) * all.size(), cudaMemcpyDeviceToHost, stream), return 2);
    FP8WIRE_CUDA_OR(cudaStreamSynchronize(stream), return 2);
    return 0;
  }

  // What this rank's output of (c, path, d) is checked against (the call's count and the buffer are
  // the checker's to set; the bound needs neither).
  CheckSpec check_spec(Collective c, Path path, DType d) const {
    CheckSpec spec;
    spec.collective = c;
    spec.path = path;
    spec.dtype = d;
    spec.nranks = env.world_size;
    spec.rank = env.rank;
    spec.block = config.block_size;
    spec.fp8 = config.format;
    spec.scale = config.scale_type;
    return spec;
  }

  // Times one (collective, dtype, size, path) on one variant's engine; fills `point` on rank 0.
  int run_point(Collective c, DType d, uint64_t bytes, Path path, const Variant& variant, const Buffers& buf,
                SweepPoint& point) {
    const CallCounts counts = call_counts(c, bytes, d, env.world_size);
    const size_t elem = dtype_size(d);
    const int nbuf = static_cast<int>(buf.send.size());
    RankReport mine{};
    mine.repeats = opt.repeats;

    // Poison the outputs so a path that writes nothing cannot pass on a previous path's result.
    for (int b = 0; b < nbuf; ++b)
      FP8WIRE_CUDA_OR(cudaMemsetAsync(buf.recv[static_cast<size_t>(b)], 0xff, counts.recv_elems * elem, stream), return 2);

    int op = 0;
    auto next = [&](void) -> ncclResult_t {
      const int b = op++ % nbuf;
      return issue(*variant.engine, c, path, buf.send[static_cast<size_t>(b)], buf.recv[static_cast<size_t>(b)],
                   counts.count_arg, d);
    };
    ncclResult_t status = ncclSuccess;
    for (int w = 0; w < opt.warmup && status == ncclSuccess; ++w) status = next();
    const AccountingTotals before = Accounting::instance().totals();
    for (int r = 0; r < opt.repeats && status == ncclSuccess; ++r) {
      FP8WIRE_CUDA_OR(cudaEventRecord(start_events[static_cast<size_t>(r)], stream), return 2);
      for (int i = 0; i < opt.iters && status == ncclSuccess; ++i) status = next();
      FP8WIRE_CUDA_OR(cudaEventRecord(stop_events[static_cast<size_t>(r)], stream), return 2);
    }
    const AccountingTotals after = Accounting::instance().totals();
    // Make sure every rotation buffer holds a result before checking it.
    while (status == ncclSuccess && op < nbuf) status = next();
    mine.status = static_cast<int32_t>(status);
    FP8WIRE_CUDA_OR(cudaStreamSynchronize(stream), return 2);
    if (status == ncclSuccess) {
      for (int r = 0; r < opt.repeats; ++r) {
        float ms = 0;
        FP8WIRE_CUDA_OR(cudaEventElapsedTime(&ms, start_events[static_cast<size_t>(r)], stop_events[static_cast<size_t>(r)]), return 2);
        mine.times_us[r] = 1e3 * ms / opt.iters;
      }
      uint64_t calls = 0, wire = 0;
      for (int p = 0; p < kMaxPaths; ++p) {
        calls += after.calls[p] - before.calls[p];
        wire += after.wire_bytes[p] - before.wire_bytes[p];
      }
      mine.recorded_calls = calls;
      const int fb = static_cast<int>(Path::fallback);
      mine.fallback_calls = after.calls[fb] - before.calls[fb];
      // A message the planner passed through (below a threshold, or a calibrated cost model's
      // choice) is plain NCCL under an FP8 label, as a fallback is.
      if (c == Collective::send_recv && path != Path::passthrough) {
        const int plain = static_cast<int>(Path::passthrough);
        mine.fallback_calls += after.calls[plain] - before.calls[plain];
      }
      for (int g = 0; g < 3; ++g) mine.gather_calls[g] = after.gather_calls[g] - before.gather_calls[g];
      mine.direct_calls = after.direct_calls - before.direct_calls;
      // Per application call: sched may record a pipelined call as several records.
      mine.wire_bytes = wire / static_cast<uint64_t>(opt.repeats * opt.iters);

      if (opt.check) {
        CheckSpec spec = check_spec(c, path, d);
        spec.count = counts.count_arg;
        std::vector<unsigned char> host(counts.recv_elems * elem);
        // The last buffer written is (op - 1) % nbuf; large sizes check only that one (host time).
        const int first = bytes <= opt.check_all_buffers_max_bytes ? 0 : nbuf - 1;
        uint64_t hash = 0xcbf29ce484222325ull;
        for (int k = first; k < nbuf; ++k) {
          const int b = (op - nbuf + k) % nbuf;
          FP8WIRE_CUDA_OR(cudaMemcpy(host.data(), buf.recv[static_cast<size_t>(b)], host.size(), cudaMemcpyDeviceToHost), return 2);
          spec.buffer = b;
          const LocalCheck lc = check_output(spec, host.data());
          mine.max_err_ratio = std::max(mine.max_err_ratio, lc.max_err_ratio);
          mine.mismatches += lc.mismatches;
          mine.nonfinite += lc.nonfinite;
          hash = (hash ^ lc.hash) * 0x100000001b3ull;
        }
        mine.hash = hash;
        mine.checked = 1;
      }
    }

    std::vector<RankReport> all;
    if (int rc = gather_reports(mine, all)) return rc;
    if (env.rank != 0) return 0;

    point.collective = c;
    point.dtype = d;
    point.path = path;
    point.bytes = bytes;
    point.count = counts.count_arg;
    for (const auto& r : all)
      if (r.status != 0 && point.supported) {
        point.supported = false;
        point.error = fmt::format("{} ({})", ncclGetErrorString(static_cast<ncclResult_t>(r.status)), r.status);
      }
    if (!point.supported) return 0;
    // A fallback is plain NCCL under an FP8 label: timing it as FP8 would fake the crossover.
    for (const auto& r : all)
      if (path != Path::passthrough && r.fallback_calls > 0 && point.supported) {
        point.supported = false;
        point.error = fmt::format("{} of {} calls ran as plain NCCL (a fallback or a pass-through; see the fp8wire log)",
                                  r.fallback_calls, r.recorded_calls);
      }
    if (!point.supported) return 0;
    std::vector<std::vector<double>> times;
    for (const auto& r : all) times.emplace_back(r.times_us, r.times_us + r.repeats);
    point.times_us = max_over_ranks(times);
    point.time = summarize(point.times_us);
    point.algbw_gbps = algbw_gbps(bytes, point.time.median);
    point.busbw_gbps = point.algbw_gbps * busbw_factor(c, env.world_size);
    if (all[0].recorded_calls > 0) {
      point.wire_bytes = all[0].wire_bytes;
      point.wire_source = "accounting";
    } else {
      // Nothing recorded (an engine without accounting): what the path should send, per rank.
      const auto shape = path_shape(c, path, env.world_size);
      WireParams wire{d, config.block_size, quant_scale_bytes()};
      const double per_byte = shape ? shape->bus_bytes_per_s * (path == Path::passthrough ? 1.0 : wire.ratio()) : 0;
      point.wire_bytes = static_cast<uint64_t>(per_byte * static_cast<double>(bytes));
      point.wire_source = "nominal";
    }
    if (variant.direct && path != Path::passthrough) {
      // Every timed call of every rank over the direct transport, or the point is NCCL's (a call too
      // large for the window goes over NCCL's transports, which the curve must not hide).
      bool all_direct = true;
      for (const auto& r : all) all_direct &= r.recorded_calls > 0 && r.direct_calls == r.recorded_calls;
      if (all_direct) point.transport = to_string(*variant.direct);
      else {
        point.supported = false;
        point.error = "not every call went over the direct transport (too large for one buffer set of "
                      "direct.window_bytes?)";
        return 0;
      }
    } else if (has_gather_step(c, path)) {
      // Summed over ranks, so a rank that gathered differently from the others shows as mixed.
      uint64_t by_allgather = 0, by_sendrecv = 0;
      for (const auto& r : all) {
        by_allgather += r.gather_calls[static_cast<int>(GatherMethod::allgather)];
        by_sendrecv += r.gather_calls[static_cast<int>(GatherMethod::sendrecv)];
      }
      if (by_allgather > 0 && by_sendrecv > 0)
        point.gather_transport = "mixed";
      else if (by_sendrecv > 0)
        point.gather_transport = "sendrecv";
      else if (by_allgather > 0)
        point.gather_transport = "allgather";
      else if (variant.transport)
        // Nothing recorded (an engine without accounting; wire_source says "nominal"): what was asked.
        point.gather_transport = gather_transport_name(*variant.transport);
    }
    if (opt.check && all[0].checked) {
      point.check.ran = true;
      point.check.bound = error_bound(check_spec(c, path, d));
      for (const auto& r : all) {
        point.check.max_err_ratio = std::max(point.check.max_err_ratio, r.max_err_ratio);
        point.check.mismatches += r.mismatches;
        point.check.nonfinite += r.nonfinite;
      }
      point.check.pass = point.check.mismatches == 0 && point.check.nonfinite == 0;
      // Data-parallel replicas must stay in sync: an FP8 all-reduce leaves identical bytes everywhere.
      point.check.bitwise_required = c == Collective::all_reduce && path != Path::passthrough;
      // Reduce-scatter, all-to-all and message outputs differ per rank; identity is meaningful for the
      // others only.
      if (c != Collective::reduce_scatter && c != Collective::all_to_all && c != Collective::send_recv)
        for (const auto& r : all) point.check.bitwise_identical &= (r.hash == all[0].hash);
      if (point.check.bitwise_required && !point.check.bitwise_identical) point.check.pass = false;
    }
    return 0;
  }

  size_t quant_scale_bytes() const {
    return config.scale_type == ScaleType::fp32 ? 4 : config.scale_type == ScaleType::bf16 ? 2 : 1;
  }

  // Codec throughput of this GPU, for the cost model: quantize and dequantize of a 64 MiB bf16 buffer,
  // and the GPU time of a one-block quantize as the per-launch cost. Rank 0 only.
  int measure_codec(Codec& codec) {
#if FP8WIRE_BENCH_HAVE_QUANT
    using namespace fp8wire::quant;
    const size_t count = 32ull << 20;  // 64 MiB of bf16
    const WireFormat fmt = WireFormat::from(config);
    const Segmented layout = Segmented::single(count, fmt);
    void* in = nullptr;
    void* wire = nullptr;
    FP8WIRE_CUDA_OR(cudaMalloc(&in, count * 2), return 2);
    FP8WIRE_CUDA_OR(cudaMalloc(&wire, layout.seg_stride), return 2);
    FP8WIRE_CUDA_OR(cudaMemsetAsync(in, 0x3c, count * 2, stream), return 2);  // finite bf16 values
    cudaEvent_t a, b;
    FP8WIRE_CUDA_OR(cudaEventCreate(&a), return 2);
    FP8WIRE_CUDA_OR(cudaEventCreate(&b), return 2);
    auto time_it = [&](auto&& fn, int reps) -> float {
      fn();
      cudaEventRecord(a, stream);
      for (int i = 0; i < reps; ++i) fn();
      cudaEventRecord(b, stream);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      return ms / reps;
    };
    const float q_ms = time_it([&] { quantize(in, ElemType::bf16, count, wire, layout, fmt, stream); }, 10);
    const float d_ms = time_it([&] { dequantize(wire, layout, count, in, ElemType::bf16, fmt, stream); }, 10);
    const Segmented tiny = Segmented::single(fmt.block, fmt);
    const float l_ms = time_it([&] { quantize(in, ElemType::bf16, fmt.block, wire, tiny, fmt, stream); }, 50);
    const cudaError_t err = cudaGetLastError();
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaFree(in);
    cudaFree(wire);
    if (err != cudaSuccess || !(q_ms > 0) || !(d_ms > 0)) {
      std::fprintf(stderr, "fp8wire-bench: codec timing failed (%s); the cost model assumes a codec throughput\n",
                   cudaGetErrorString(err));
      return 0;
    }
    const double bytes = static_cast<double>(count) * 2;
    codec.gbps = 2 * bytes / ((q_ms + d_ms) * 1e-3) / 1e9;  // mean of quantize and dequantize
    codec.launch_us = l_ms * 1e3;
    codec.basis = fmt::format("quantize {:.0f} GB/s, dequantize {:.0f} GB/s of bf16 on this GPU (64 MiB)",
                              bytes / (q_ms * 1e6), bytes / (d_ms * 1e6));
#else
    (void)codec;
#endif
    return 0;
  }

  // The host link's pinned-copy rates (cudaMemcpyAsync through pinned host memory), with every rank
  // copying at once as the direct transport's traffic runs, for the link limit (bench/host/
  // link_limit.hpp): D2H alone, H2D alone, then both at once on two streams (PCIe is full duplex;
  // what it keeps of each direction then is reported beside the limit, not used in it), and both at
  // once in copies of each kSmallCopyBytes (what the link keeps in copies the size small calls send;
  // reported too). Off the
  // timed path: before the first point. Every pass starts on all ranks together after a small
  // all-reduce, and its time is the slowest rank's. The passes run kPinnedRounds times, one round
  // after the other, and each rate is the best round's (best_round_gbps says why).
  int measure_pinned(PinnedRates& rates) {
    constexpr size_t kBytes = 32ull << 20;
    constexpr int kCopies = 8;  // 256 MiB per rank and direction: start skew stays well under 1 %
    void* host[2] = {nullptr, nullptr};
    void* dev[2] = {nullptr, nullptr};
    cudaStream_t second = nullptr;
    cudaEvent_t ev[4] = {nullptr, nullptr, nullptr, nullptr};  // start, end on `stream`; start, end on `second`
    struct Free {
      void** host; void** dev; cudaStream_t& second; cudaEvent_t* ev;
      ~Free() {
        for (int i = 0; i < 2; ++i) cudaFreeHost(host[i]), cudaFree(dev[i]);
        for (int i = 0; i < 4; ++i) if (ev[i]) cudaEventDestroy(ev[i]);
        if (second) cudaStreamDestroy(second);
      }
    } release{host, dev, second, ev};
    for (int i = 0; i < 2; ++i) {
      FP8WIRE_CUDA_OR(cudaHostAlloc(&host[i], kBytes, cudaHostAllocDefault), return 2);
      FP8WIRE_CUDA_OR(cudaMalloc(&dev[i], kBytes), return 2);
    }
    for (auto& e : ev) FP8WIRE_CUDA_OR(cudaEventCreate(&e), return 2);
    FP8WIRE_CUDA_OR(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking), return 2);
    // n copies of `size` bytes (a divisor of kBytes), each at the next place of the buffers.
    auto copies = [&](bool d2h, cudaStream_t st, int n, size_t size) {
      cudaError_t err = cudaSuccess;
      for (int i = 0; i < n && err == cudaSuccess; ++i) {
        const size_t at = static_cast<size_t>(i) * size % kBytes;
        err = d2h ? cudaMemcpyAsync(static_cast<char*>(host[0]) + at, static_cast<char*>(dev[0]) + at, size,
                                    cudaMemcpyDeviceToHost, st)
                  : cudaMemcpyAsync(static_cast<char*>(dev[1]) + at, static_cast<char*>(host[1]) + at, size,
                                    cudaMemcpyHostToDevice, st);
      }
      return err;
    };
    auto elapsed_us = [&](cudaEvent_t from, cudaEvent_t to, double& us) {
      float ms = 0;
      const cudaError_t err = cudaEventElapsedTime(&ms, from, to);
      us = 1e3 * ms;
      return err;
    };
    // D2H alone, H2D alone, then D2H and H2D together, in copies of kBytes, then together in copies of
    // each kSmallCopyBytes (the same bytes): this rank's times, then the slowest rank's. Round r's
    // times start at us[r * kSlots]: D2H alone, H2D alone, then the k-th pass of both directions at
    // 2 + 2k (D2H) and 3 + 2k (H2D).
    constexpr int kSmall = static_cast<int>(std::size(kSmallCopyBytes));
    constexpr int kSlots = 4 + 2 * kSmall;  // one round's times
    constexpr int kPinnedRounds = 3;
    double us[kPinnedRounds * kSlots] = {};
    static_assert(sizeof(us) <= sizeof(RankReport), "the times fit the report buffer");
    for (int step = 0; step < kPinnedRounds * (3 + kSmall); ++step) {
      const int pass = step % (3 + kSmall), round = step / (3 + kSmall);
      const bool both = pass >= 2;
      const size_t size = pass <= 2 ? kBytes : kSmallCopyBytes[pass - 3];
      const int n = static_cast<int>(kBytes * kCopies / size);
      const int out = round * kSlots + (pass <= 1 ? pass : 2 + 2 * (pass - 2));
      FP8WIRE_CUDA_OR(copies(pass != 1, stream, 1, kBytes), return 2);  // warm
      FP8WIRE_NCCL_OR(api.AllReduce(report_send, report_send, 1, ncclFloat64, ncclMax, comm, stream), return 2);
      FP8WIRE_CUDA_OR(cudaEventRecord(ev[0], stream), return 2);
      if (both) {
        FP8WIRE_CUDA_OR(cudaStreamWaitEvent(second, ev[0], 0), return 2);
        FP8WIRE_CUDA_OR(cudaEventRecord(ev[2], second), return 2);
        FP8WIRE_CUDA_OR(copies(false, second, n, size), return 2);
        FP8WIRE_CUDA_OR(cudaEventRecord(ev[3], second), return 2);
      }
      FP8WIRE_CUDA_OR(copies(pass != 1, stream, n, size), return 2);
      FP8WIRE_CUDA_OR(cudaEventRecord(ev[1], stream), return 2);
      FP8WIRE_CUDA_OR(cudaEventSynchronize(ev[1]), return 2);
      if (both) FP8WIRE_CUDA_OR(cudaEventSynchronize(ev[3]), return 2);
      FP8WIRE_CUDA_OR(elapsed_us(ev[0], ev[1], us[out]), return 2);
      if (both) FP8WIRE_CUDA_OR(elapsed_us(ev[2], ev[3], us[out + 1]), return 2);
    }
    constexpr size_t kReported = sizeof(us) / sizeof(us[0]);
    FP8WIRE_CUDA_OR(cudaMemcpyAsync(report_send, us, sizeof(us), cudaMemcpyHostToDevice, stream), return 2);
    FP8WIRE_NCCL_OR(api.AllReduce(report_send, report_send, kReported, ncclFloat64, ncclMax, comm, stream), return 2);
    FP8WIRE_CUDA_OR(cudaMemcpyAsync(us, report_send, sizeof(us), cudaMemcpyDeviceToHost, stream), return 2);
    FP8WIRE_CUDA_OR(cudaStreamSynchronize(stream), return 2);
    // Emulated ranks share this GPU's one link; else each rank has its own.
    rates.ranks_per_link = opt.emulate_ranks > 0 ? env.world_size : 1;
    rates.bytes = kBytes * kCopies;
    const double link_bytes = static_cast<double>(rates.bytes) * rates.ranks_per_link;
    auto gbps = [&](int slot) { return best_round_gbps(us + slot, kPinnedRounds, kSlots, link_bytes); };
    rates.d2h_gbps = gbps(0);
    rates.h2d_gbps = gbps(1);
    rates.duplex_d2h_gbps = gbps(2);
    rates.duplex_h2d_gbps = gbps(3);
    for (int k = 0; k < kSmall; ++k)
      rates.duplex_small[k] = {kSmallCopyBytes[k], gbps(4 + 2 * k), gbps(5 + 2 * k)};
    return 0;
  }

  void progress(const std::string& what, size_t done, size_t total) {
    if (env.rank != 0) return;
    if (progress_tty)
      std::fprintf(stderr, "\r[%zu/%zu] %-60s", done, total, what.c_str());
    else
      std::fprintf(stderr, "[%zu/%zu] %s\n", done, total, what.c_str());
    std::fflush(stderr);
  }
};

}  // namespace

int run_sweep_rank(const SweepOptions& opt, const RankEnv& env) {
  g_rank = env.rank;
  log_set_rank(env.rank);  // sched/ and quant/ log lines name the rank, as under the shim
  Worker w{opt, env};
  w.progress_tty = isatty(STDERR_FILENO);

  // The fabric label and the environment NCCL reads at communicator creation.
  std::optional<Fabric> forced_fabric;
  if (opt.fabric != "auto") forced_fabric = parse_fabric(opt.fabric);
  const bool p2p_disabled = opt.fabric == "pcie";
  if (p2p_disabled) setenv("NCCL_P2P_DISABLE", "1", 1);
  // Emulated ranks share one GPU; a distinct host id per rank makes NCCL treat them as separate
  // hosts joined by sockets. Always overwritten: a host id inherited by every rank would merge them.
  if (opt.emulate_ranks > 0)
    fp8wire::set_emulated_host(env.rank);

  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "fp8wire-bench rank %d: no CUDA device visible\n", env.rank);
    return 2;
  }
  const int device = opt.emulate_ranks > 0 ? 0 : env.local_rank % ndev;
  FP8WIRE_CUDA_OR(cudaSetDevice(device), return 2);
  FP8WIRE_CUDA_OR(cudaStreamCreateWithFlags(&w.stream, cudaStreamNonBlocking), return 2);

  ConfigResult cfg = load_config();
  if (!cfg.ok()) {
    for (const auto& e : cfg.errors) std::fprintf(stderr, "fp8wire-bench rank %d: config: %s\n", env.rank, e.message().c_str());
    return 2;
  }
  w.config = cfg.config;
  if (forced_fabric) w.config.fabric_override = forced_fabric;
  w.loaded = w.config;
  // Every rank gets the same argv, so the configurations (and their fingerprints) still agree.
  if (opt.gather_transports.size() == 1) w.config.gather_transport = opt.gather_transports.front();
  // The benchmark forces each path explicitly; per-collective switches meant for jobs (FP8
  // all-gather and all-to-all are off by default) must not turn a forced path into a fallback.
  w.config.enable = true;
  w.config.collective_enable.fill(true);
  // Messages have no forced entry point: the planner routes them, so FP8 needs their threshold at 0.
  w.config.thresholds[static_cast<int>(Collective::send_recv)].fill(0);

  // Rank 0 times the codec before anyone has a communicator: on emulated ranks the others would
  // otherwise spin in their first collective on the same GPU and slow the kernels down.
  Codec measured_codec;
  if (env.rank == 0) {
    if (int rc = w.measure_codec(measured_codec)) return rc;
  }

  ncclUniqueId id{};
  if (env.rank == 0) FP8WIRE_NCCL_OR(ncclGetUniqueId(&id), return 2);
  std::string error;
  if (!exchange_bootstrap_blob(env, &id, sizeof(id), opt.bootstrap_timeout_s, error)) {
    std::fprintf(stderr, "fp8wire-bench rank %d: %s\n", env.rank, error.c_str());
    return 2;
  }
  FP8WIRE_NCCL_OR(ncclCommInitRank(&w.comm, env.world_size, id, env.rank), return 2);
  w.api = nccl_api_from_linked();
  w.platform = gpu_platform(w.api);
  std::vector<std::optional<GatherMethod>> transports(opt.gather_transports.begin(), opt.gather_transports.end());
  if (transports.empty()) transports.push_back(std::nullopt);
  // NCCL's transports: one engine per gather transport (with --transport direct only the first, for
  // the plain-NCCL baseline). The direct transport: one engine more, with it forced.
  const bool over_nccl = opt.transport == "nccl" || opt.transport == "both";
  for (const auto& t : transports) {
    Config c = w.config;
    if (t) c.gather_transport = *t;
    c.direct_transport = DirectMode::off;
    w.variants.push_back({t, std::make_unique<sched::Engine>(c, w.platform), std::nullopt});
    w.variants.back().engine->comm_created(w.comm);
    if (!over_nccl) break;
  }
  if (opt.transport != "nccl") {
    Config c = w.config;
    const char* p2p_env = std::getenv("NCCL_P2P_DISABLE");
    const bool no_p2p = p2p_disabled || (p2p_env && std::strcmp(p2p_env, "1") == 0);
    const bool host = opt.transport == "host_memory" || (opt.transport != "peer_memory" && no_p2p);
    c.direct_transport = host ? DirectMode::host_memory : DirectMode::peer_memory;
    c.direct_assume_one_host = c.direct_assume_one_host || opt.emulate_ranks > 0;
    const Carrier kind = host ? Carrier::host_memory : Carrier::peer_memory;
    w.variants.push_back({std::nullopt, std::make_unique<sched::Engine>(c, w.platform), kind});
    w.variants.back().engine->comm_created(w.comm);
    if (!sched::EngineProbe(*w.variants.back().engine).comm_info(w.comm).direct && env.rank == 0)
      std::fprintf(stderr, "fp8wire-bench: the direct transport (%s) could not be set up on every rank; its points "
                           "will be marked unsupported\n", to_string(kind));
  }
  struct CommGuard {
    Worker& w;
    ~CommGuard() {
      for (auto& v : w.variants) {
        if (v.engine) v.engine->comm_destroyed(w.comm);
        v.engine.reset();
      }
      ncclCommDestroy(w.comm);
      cudaFree(w.report_send);
      cudaFree(w.report_recv);
      for (auto e : w.start_events) cudaEventDestroy(e);
      for (auto e : w.stop_events) cudaEventDestroy(e);
      cudaStreamDestroy(w.stream);
    }
  } guard{w};

  FP8WIRE_CUDA_OR(cudaMalloc(&w.report_send, sizeof(RankReport)), return 2);
  FP8WIRE_CUDA_OR(cudaMalloc(&w.report_recv, sizeof(RankReport) * static_cast<size_t>(env.world_size)), return 2);
  w.start_events.resize(static_cast<size_t>(opt.repeats));
  w.stop_events.resize(static_cast<size_t>(opt.repeats));
  for (int r = 0; r < opt.repeats; ++r) {
    FP8WIRE_CUDA_OR(cudaEventCreate(&w.start_events[static_cast<size_t>(r)]), return 2);
    FP8WIRE_CUDA_OR(cudaEventCreate(&w.stop_events[static_cast<size_t>(r)]), return 2);
  }

  SweepResult result;
  for (const auto& v : w.variants)
    if (v.direct == Carrier::host_memory) {
      if (int rc = w.measure_pinned(result.pinned)) return rc;
      break;
    }
  {
    auto& m = result.machine;
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    m.hostname = host;
    cudaDeviceProp prop{};
    FP8WIRE_CUDA_OR(cudaGetDeviceProperties(&prop, device), return 2);
    m.gpu_name = prop.name;
    m.compute_capability = prop.major * 10 + prop.minor;
    cudaDriverGetVersion(&m.driver_version);
    cudaRuntimeGetVersion(&m.runtime_version);
    ncclGetVersion(&m.nccl_version);
    m.nranks = env.world_size;
    m.emulated = opt.emulate_ranks > 0;
    if (const char* testbed = std::getenv("FP8WIRE_TESTBED_MODE"); testbed && m.emulated) m.testbed = testbed;
    // Provisional: the engine knows the detected fabric only after its first FP8 call (the ranks
    // exchange facts then); set again after the sweep.
    m.fabric = forced_fabric ? *forced_fabric : sched::EngineProbe(*w.variants.front().engine).fabric_of(w.comm);
    m.p2p_disabled = p2p_disabled;
    m.created_utc = utc_now();
    result.options = opt.as_json;
    result.wire.block = w.config.block_size;
    result.wire.scale_bytes = w.quant_scale_bytes();
    result.fp8_format = w.config.format == Fp8Format::e4m3 ? "e4m3" : "e5m2";
    result.codec = measured_codec;
    result.gather_transport_requested = gather_transport_option_name(opt.gather_transports);
    // "both": the ranks ran with allgather and with sendrecv (one engine each).
    result.gather_transport_config = w.variants.size() > 1 ? "both" : gather_transport_name(w.config.gather_transport);
  }

  // The plan: every (collective, dtype) with its own size series (sizes split evenly into ranks).
  struct Job {
    Collective c;
    DType d;
    std::vector<uint64_t> sizes;
    std::vector<Path> paths;
  };
  std::vector<Job> jobs;
  // The variants a path is timed on: plain NCCL on the first; an FP8 path on every NCCL variant when
  // it has a gather step (else the first), unless --transport direct, and on the direct variant
  // where the direct transport has its program (not the ring).
  const bool fp8_over_nccl = opt.transport == "nccl" || opt.transport == "both";
  auto variants_of = [&w, fp8_over_nccl](Collective c, Path path) {
    std::vector<size_t> v;
    if (path == Path::passthrough) return std::vector<size_t>{0};
    for (size_t i = 0; i < w.variants.size(); ++i) {
      const Worker::Variant& var = w.variants[i];
      if (var.direct) {
        // Messages have no direct program: NCCL's transports carry them.
        const bool direct_program = c != Collective::send_recv;
        if (direct_program && path != Path::ring && path != Path::hierarchical) v.push_back(i);
      } else if (fp8_over_nccl && (has_gather_step(c, path) || i == 0)) {
        v.push_back(i);
      }
    }
    return v;
  };
  size_t total_points = 0;
  for (Collective c : opt.collectives)
    for (DType d : opt.dtypes) {
      Job job{c, d, size_series(opt.min_bytes, opt.max_bytes, opt.step, static_cast<uint64_t>(env.world_size) * dtype_size(d)),
              paths_for(c, opt.paths)};
      for (Path path : job.paths) total_points += job.sizes.size() * variants_of(c, path).size();
      jobs.push_back(std::move(job));
    }
  size_t done = 0;

  for (const Job& job : jobs) {
    if (job.sizes.empty()) continue;
    const CallCounts largest = call_counts(job.c, job.sizes.back(), job.d, env.world_size);
    const size_t elem = dtype_size(job.d);
    Buffers buf;
    for (int b = 0; b < opt.buffers; ++b) {
      void* s = nullptr;
      void* r = nullptr;
      FP8WIRE_CUDA_OR(cudaMalloc(&s, largest.send_elems * elem), return 2);
      buf.send.push_back(s);
      FP8WIRE_CUDA_OR(cudaMalloc(&r, largest.recv_elems * elem), return 2);
      buf.recv.push_back(r);
    }
    std::vector<unsigned char> host;
    for (uint64_t bytes : job.sizes) {
      const CallCounts counts = call_counts(job.c, bytes, job.d, env.world_size);
      // Inputs: all-gather ranks send their own elements [0, sendcount); all-reduce, reduce-scatter
      // and all-to-all send the whole global index range.
      host.resize(counts.send_elems * elem);
      for (int b = 0; b < opt.buffers; ++b) {
        fill_input(job.d, env.rank, b, 0, counts.send_elems, host.data());
        FP8WIRE_CUDA_OR(cudaMemcpy(buf.send[static_cast<size_t>(b)], host.data(), host.size(), cudaMemcpyHostToDevice), return 2);
      }
      // Pageable cudaMemcpy may return before its DMA lands; the collectives run on another stream.
      FP8WIRE_CUDA_OR(cudaDeviceSynchronize(), return 2);
      for (Path path : job.paths)
        for (size_t v : variants_of(job.c, path)) {
          const Worker::Variant& variant = w.variants[v];
          const std::string over = variant.direct ? fmt::format(" over {}", to_string(*variant.direct))
                                   : w.variants.size() > 1 && has_gather_step(job.c, path) && variant.transport
                                       ? fmt::format(" over {}", gather_transport_name(*variant.transport))
                                       : "";
          w.progress(fmt::format("{} {} {} {}{}", collective_name(job.c), to_string(job.d), format_bytes(bytes),
                                 path_name(path), over),
                     ++done, total_points);
          SweepPoint point;
          if (int rc = w.run_point(job.c, job.d, bytes, path, variant, buf, point)) return rc;
          if (env.rank == 0) result.points.push_back(std::move(point));
        }
    }
  }
  if (env.rank != 0) return 0;
  if (w.progress_tty) std::fprintf(stderr, "\n");
  // The fabric the engine detected (NVLink between the GPUs, pcie, net), now that FP8 calls have run;
  // a sweep of pass-through alone never asks, and keeps the provisional label (use --fabric then).
  if (!forced_fabric) result.machine.fabric = sched::EngineProbe(*w.variants.front().engine).fabric_of(w.comm);

  compute_speedups(result);
  compute_link_limits(result);
  if (result.pinned.measured())
    fmt::print("# pinned cudaMemcpyAsync, every rank at once: D2H {:.1f} GB/s, H2D {:.1f} GB/s per link "
               "({} rank{} per link); both directions at once: D2H {:.1f} + H2D {:.1f} GB/s\n",
               result.pinned.d2h_gbps, result.pinned.h2d_gbps, result.pinned.ranks_per_link,
               result.pinned.ranks_per_link == 1 ? "" : "s", result.pinned.duplex_d2h_gbps,
               result.pinned.duplex_h2d_gbps);
  for (const DuplexInCopies& d : result.pinned.duplex_small)
    if (d.copy_bytes)
      fmt::print("# pinned, both directions at once in copies of {} MiB (every rank at once): D2H {:.1f} + H2D {:.1f} GB/s\n",
                 d.copy_bytes >> 20, d.d2h_gbps, d.h2d_gbps);
  const auto crossovers = analyze_crossovers(result, opt.crossover);
  Calibration calibration = calibrate(result);
  // The job shape the figures belong to (sched/plan/hierarchy.hpp: a flat FP8 path across hosts with
  // local peers is only taken where a calibrated profile of that very shape says it wins).
  {
    const sched::CommInfo info = sched::EngineProbe(*w.variants.front().engine).comm_info(w.comm);
    if (info.hosts > 0 && info.nranks % info.hosts == 0) {
      calibration.model.hosts = info.hosts;
      calibration.model.ranks_per_host = info.nranks / info.hosts;
    }
  }
  for (const auto& job : jobs) std::printf("%s\n", render_table(result, job.c, job.d).c_str());
  std::printf("%s\n", render_crossovers(result, crossovers).c_str());
  std::printf("%s\n", render_planner_picks(planner_picks(result, w.loaded, result.machine.fabric), result.machine).c_str());
  fmt::print("# cost model ({}): op_latency {:.1f} us, bus {:.2f} GB/s [{}]; codec {:.0f} GB/s, launch {:.1f} us [{}]\n",
             fabric_name(result.machine.fabric), calibration.model.op_latency_us, calibration.model.bus_bandwidth_gbps,
             calibration.link.basis, calibration.model.codec_gbps, calibration.model.kernel_launch_us,
             calibration.codec.basis);
  std::fflush(stdout);

  int rc = 0;
  if (!opt.json_path.empty()) {
    std::string error;
    if (!fp8wire::write_file_atomically(opt.json_path, to_json(result, crossovers, calibration).dump(1) + "\n", error)) {
      std::fprintf(stderr, "fp8wire-bench: --json: %s\n", error.c_str());
      rc = 2;
    } else {
      std::printf("# wrote %s\n", opt.json_path.c_str());
    }
  }
  if (!opt.profile_path.empty()) {
    std::string error;
    if (!fp8wire::write_file_atomically(opt.profile_path,
                                        render_profile_toml({profile_from_sweep(result, crossovers, calibration)}),
                                        error)) {
      std::fprintf(stderr, "fp8wire-bench: --profile: %s\n", error.c_str());
      rc = 2;
    } else {
      std::printf("# wrote %s\n", opt.profile_path.c_str());
    }
  }
  const auto failures = failed_checks(result);
  size_t checked = 0;
  for (const auto& p : result.points) checked += p.check.ran;
  for (const auto& f : failures) std::printf("FAIL check %s\n", f.c_str());
  if (opt.check)
    std::printf("%s checks: %zu points checked, %zu failed\n", failures.empty() ? "PASS" : "FAIL", checked, failures.size());
  std::fflush(stdout);
  if (rc == 0 && !failures.empty()) rc = 1;
  return rc;
}

}  // namespace fp8wire::bench
