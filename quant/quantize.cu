// Quantize kernel (plain, or with the error-feedback residual) and its raw launch.
#include "quant/dispatch.hpp"
#include "quant/kernels.cuh"

namespace fp8wire::quant::detail {
namespace {

// Loads this thread's 16 elements of a full, 16-byte aligned group as fp32, and the largest |x| bit
// pattern among them. For bf16 a value is the high half of its fp32, so the two values of a word are
// (w << 16) and (w & 0xFFFF0000), and the largest |bf16| pattern (a 16x2 integer max over the masked
// words) shifted up is the largest |fp32| one: 16 + 12 integer operations instead of ~56.
template <ElemType T, bool kStreaming>
__device__ __forceinline__ uint32_t load_full_group(const void* base, size_t e, float (&x)[kVec]) {
  if constexpr (T == ElemType::bf16) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + e);
    const uint4 a = kStreaming ? __ldcs(p) : __ldg(p);
    const uint4 b = kStreaming ? __ldcs(p + 1) : __ldg(p + 1);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[2 * i] = math::bits_f32(w[i] << 16);
      x[2 * i + 1] = math::bits_f32(w[i] & 0xFFFF0000u);
      m = __vmaxu2(m, w[i] & 0x7FFF7FFFu);
    }
    return max(m << 16, m & 0xFFFF0000u);
  } else {
    load16<T, kStreaming>(base, e, kVec, true, x);
    return abs_max_bits(x);
  }
}

// The common case, tiles that lie whole inside one chunk (segment) of the wire buffer, without
// stochastic rounding or a residual: the same bytes as quantize_group, without its per-element
// masking, per-group segment division and 64-bit slot arithmetic (the kernel was issue-bound at ~320
// instructions per 16 elements; this path is about 150). The scale type is a template argument (the
// caller switches on it once per tile, a uniform branch) so that make_scale and the scale store carry
// no run-time branches on it.
template <ElemType T, Fp8Format F, bool kNative, bool kStreaming, ScaleType S, bool kStats>
__device__ __forceinline__ void quantize_full_group(const QuantizeParams& p, size_t e, size_t local, int lanes,
                                                    const ChunkView& c, uint32_t* smem, StatsAcc& stats) {
  float x[kVec];
  const uint32_t amax = group_max(load_full_group<T, kStreaming>(p.in, e, x), lanes, smem);
  const math::BlockScale bs = math::make_scale<F>(amax, S);
  const uint4 q = encode16<F, kNative>(x, kVec, bs, false, 0, 0);
  *reinterpret_cast<uint4*>(c.payload + local) = q;
  if constexpr (kStats) measure16<F, kNative>(x, kVec, bs, q, stats);
  if ((threadIdx.x & (lanes - 1)) == 0) {
    const size_t block = local >> p.target.block_shift;
    constexpr size_t kScaleBytes = scale_bytes(S);
    store_scale(c.scales + block * kScaleBytes, S, bs.stored);
    if (block == c.last_block) {
      for (size_t b = (block + 1) * kScaleBytes; b < align_up((block + 1) * kScaleBytes, kWireAlign); ++b) c.scales[b] = 0;
    }
  }
}

}  // namespace

// kStats: the telemetry instance (QuantizeParams::rec set), a separate one so that the production
// kernel keeps its register budget; it runs at 4 CTAs per SM (64 registers: no spills).
template <ElemType T, Fp8Format F, bool kNative, bool kResidual, bool kStreaming = true,
          int kMinBlocks = kResidual ? 4 : 6, bool kStats = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks) quantize_kernel(const __grid_constant__ QuantizeParams p) {
  __shared__ uint32_t smem[kThreads / 32];
  StatsAcc stats;
  const size_t count = p.target.count;
  const size_t tiles = (count + kTileElems - 1) / kTileElems;
  // Uniform over the grid: may tiles take the fast path at all.
  const bool fast = !kResidual && p.in_aligned && !p.stochastic && p.variant != 3;
  const WireTarget& t = p.target;
  const int lanes = (1 << t.block_shift) / kVec;
  for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const size_t t0 = tile * kTileElems;
    if (fast && t0 + kTileElems <= count) {   // uniform over the CTA
      const ChunkOf chunk = chunk_of(t, t0);   // one division per tile
      if (t0 + kTileElems <= chunk.start + chunk.n) {
        const size_t e = t0 + size_t(threadIdx.x) * kVec;
        const ChunkView c = chunk_view(t, chunk);
        if (t.scale == ScaleType::fp32)
          quantize_full_group<T, F, kNative, kStreaming, ScaleType::fp32, kStats>(p, e, e - chunk.start, lanes, c, smem, stats);
        else if (t.scale == ScaleType::bf16)
          quantize_full_group<T, F, kNative, kStreaming, ScaleType::bf16, kStats>(p, e, e - chunk.start, lanes, c, smem, stats);
        else
          quantize_full_group<T, F, kNative, kStreaming, ScaleType::e8m0, kStats>(p, e, e - chunk.start, lanes, c, smem, stats);
        continue;
      }
    }
    const size_t e = t0 + size_t(threadIdx.x) * kVec;
    const int n = e < count ? int(count - e < size_t(kVec) ? count - e : kVec) : 0;
    float x[kVec];
    load16<T, kStreaming>(p.in, e, n, p.in_aligned, x);
    if constexpr (kResidual) {
      float r[kVec];
      load16<ElemType::f32>(p.residual, e, n, true, r);
#pragma unroll
      for (int i = 0; i < kVec; ++i) x[i] = math::add_rn(x[i], r[i]);
    }
    uint4 q;
    const math::BlockScale bs =
        quantize_group<F, kNative>(x, n, e, p.target, p.stochastic, p.seed, p.sr_offset + e, smem, &q);
    if constexpr (kStats)
      if (n > 0) measure16<F, kNative>(x, n, bs, q, stats);
    if constexpr (kResidual) {
      if (n == 0) continue;
      float y[kVec];
      decode16<F, kNative>(q, bs.decode, y);
#pragma unroll
      for (int i = 0; i < kVec; ++i) y[i] = bs.kind == 2 ? 0.0f : math::sub_rn(x[i], y[i]);
      store16<ElemType::f32>(p.residual, e, n, true, y);
    }
  }
  if constexpr (kStats) {
    if (commit_stats(stats, &p.rec->input, p.guard ? &p.rec->input_done : nullptr) && threadIdx.x == 0)
      cast_vote(p.rec, &p.rec->input, &p.rec->input_done, p.bounds, false, p.target);
  }
}

cudaError_t launch_quantize_kernel(const QuantizeParams& p, ElemType in_type, Fp8Format fp8, bool native,
                                   unsigned grid, cudaStream_t stream) {
  FP8WIRE_DISPATCH_ELEM(in_type, T, FP8WIRE_DISPATCH_FP8(fp8, F, FP8WIRE_DISPATCH_BOOL(native, kNative, {
    if (p.rec && p.residual) quantize_kernel<T, F, kNative, true, true, 4, true><<<grid, kThreads, 0, stream>>>(p);
    else if (p.rec) quantize_kernel<T, F, kNative, false, true, 4, true><<<grid, kThreads, 0, stream>>>(p);
    else if (p.residual) quantize_kernel<T, F, kNative, true><<<grid, kThreads, 0, stream>>>(p);
    else if (p.variant == 1) quantize_kernel<T, F, kNative, false, false><<<grid, kThreads, 0, stream>>>(p);
    else if (p.variant == 2) quantize_kernel<T, F, kNative, false, true, 8><<<grid, kThreads, 0, stream>>>(p);
    else quantize_kernel<T, F, kNative, false><<<grid, kThreads, 0, stream>>>(p);
  })));
  return cudaGetLastError();
}

}  // namespace fp8wire::quant::detail
