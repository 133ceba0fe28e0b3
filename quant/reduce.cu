// Fused dequantize-reduce(-requantize) kernel, its mixed variant (one plain addend) and the naive
// dequantize-then-reduce baseline kept for the benchmark.
//
// The fused kernel reads each of the k chunks once and writes the output once: per 16-element group a
// thread loads the 16 payload bytes and the block scale of every input (kBatch inputs in flight at a
// time), accumulates in fp32 in input order, and stores the caller dtype or requantizes the sum (the
// group's amax needs the whole FP8 block, which the group owns).
#include "quant/dispatch.hpp"
#include "quant/kernels.cuh"

namespace fp8wire::quant::detail {

__device__ __forceinline__ void load_plain(const ReduceParams& p, size_t e, int n, float (&x)[kVec]) {
  switch (p.plain_type) {
    case ElemType::f32: load16<ElemType::f32>(p.plain, e, n, p.plain_aligned, x); break;
    case ElemType::f16: load16<ElemType::f16>(p.plain, e, n, p.plain_aligned, x); break;
    case ElemType::bf16: load16<ElemType::bf16>(p.plain, e, n, p.plain_aligned, x); break;
  }
}

__device__ __forceinline__ void accumulate(float (&acc)[kVec], const float (&t)[kVec]) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = math::add_rn(acc[i], t[i]);
}

template <OutKind kOut, Fp8Format F, bool kNative, bool kStats = false>
__device__ __forceinline__ void finish(const ReduceParams& p, float (&acc)[kVec], size_t e, int n, uint32_t* smem,
                                       StatsAcc* stats = nullptr) {
  if (p.post_scale != 1.0f) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = math::mul_rn(acc[i], p.post_scale);
  }
  if constexpr (kOut == OutKind::wire) {
    uint4 q;
    const math::BlockScale bs =
        quantize_group<F, kNative>(acc, n, e, p.out_wire, p.stochastic, p.seed, p.sr_offset + e, smem, &q);
    if constexpr (kStats)
      if (n > 0) measure16<F, kNative>(acc, n, bs, q, *stats);
  } else {
    if (n == 0) return;
    constexpr ElemType T = kOut == OutKind::f32 ? ElemType::f32 : kOut == OutKind::f16 ? ElemType::f16 : ElemType::bf16;
    store16<T>(p.out_plain, e, n, p.out_aligned, acc);
  }
}

// Sum starts from -0.0f: -0 + t == t for every t (+0, -0 and NaN included), so the result equals
// the reference's "first term, then add the others".
// kPlain: the mixed variant (a plain addend). A separate instance, because the plain addend's 16
// registers live across the whole input loop: without it the kernel fits 4 CTAs per SM instead of 3.
// The guard flags of the k inputs (quant/telemetry.hpp), ORed.
__device__ __forceinline__ bool input_flags(const ReduceParams& p) {
  bool any = false;
  for (int j = 0; j < p.k; ++j) any |= guard_flag_at(p.in[j], p.count, p.scale);
  return any;
}

// kStats: the telemetry instance of a requantizing reduce (ReduceParams::rec set, wire output), one
// CTA per SM fewer (its figures' registers would otherwise spill).
template <OutKind kOut, Fp8Format F, bool kNative, bool kPlain, bool kStats = false>
__global__ void __launch_bounds__(kThreads, (kPlain ? 3 : 4) - (kStats ? 1 : 0))
    dequantize_reduce_kernel(const __grid_constant__ ReduceParams p) {
  __shared__ uint32_t smem[kThreads / 32];
  constexpr int kBatch = 4;
  StatsAcc stats;
  // A reduce into the caller's dtype is this rank's last read of the call's chunks: their flags
  // decide (a requantizing reduce relays them instead, below).
  if (kOut != OutKind::wire && p.guard && blockIdx.x == 0 && threadIdx.x == 0 && input_flags(p))
    atomicOr(&p.rec->decision, 1u);
  const size_t tiles = (p.count + kTileElems - 1) / kTileElems;
  const size_t ssize = scale_bytes(p.scale);
  for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const size_t e = tile * kTileElems + size_t(threadIdx.x) * kVec;
    const int n = e < p.count ? int(p.count - e < size_t(kVec) ? p.count - e : kVec) : 0;
    float acc[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = -0.0f;
    if (n > 0) {
      float plain[kVec];
      if constexpr (kPlain) load_plain(p, e, n, plain);
      const size_t scale_at = p.scales_offset + (e >> p.block_shift) * ssize;
      for (int j0 = 0; j0 < p.k; j0 += kBatch) {
        uint4 q[kBatch];
        uint32_t s[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (j0 + u < p.k) {
            q[u] = __ldcs(reinterpret_cast<const uint4*>(p.in[j0 + u] + e));
            s[u] = load_scale(p.in[j0 + u] + scale_at, p.scale);
          }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (j0 + u < p.k) {
            if constexpr (kPlain)
              if (p.plain_position == j0 + u) accumulate(acc, plain);
            float t[kVec];
            decode16<F, kNative>(q[u], math::decode_scale(s[u], p.scale), t);
            accumulate(acc, t);
          }
        }
      }
      if constexpr (kPlain)
        if (p.plain_position >= p.k) accumulate(acc, plain);
    }
    finish<kOut, F, kNative, kStats>(p, acc, e, n, smem, &stats);
  }
  if constexpr (kStats) {
    if (commit_stats(stats, &p.rec->requant, p.guard ? &p.rec->requant_done : nullptr) && threadIdx.x == 0) {
      const bool relayed = input_flags(p);
      if (relayed) atomicOr(&p.rec->relay, 1u);
      cast_vote(p.rec, &p.rec->requant, &p.rec->requant_done, p.bounds, relayed, p.out_wire);
    }
  }
}

// Naive baseline, second half: sum k fp32 arrays (already dequantized) in order.
template <OutKind kOut, Fp8Format F, bool kNative>
__global__ void __launch_bounds__(kThreads) reduce_f32_kernel(const __grid_constant__ ReduceParams p) {
  __shared__ uint32_t smem[kThreads / 32];
  const size_t tiles = (p.count + kTileElems - 1) / kTileElems;
  for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const size_t e = tile * kTileElems + size_t(threadIdx.x) * kVec;
    const int n = e < p.count ? int(p.count - e < size_t(kVec) ? p.count - e : kVec) : 0;
    float acc[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = -0.0f;
    for (int j = 0; j < p.k; ++j) {
      float t[kVec];
      load16<ElemType::f32>(p.f32_in + size_t(j) * p.count, e, n, (p.count % 4) == 0, t);
      accumulate(acc, t);
    }
    finish<kOut, F, kNative>(p, acc, e, n, smem);
  }
}

// The fused kernel's instance: the telemetry one only for a requantizing reduce given a record.
template <OutKind kOut, Fp8Format F, bool kNative>
void launch_fused(const ReduceParams& p, unsigned grid, cudaStream_t stream) {
  if constexpr (kOut == OutKind::wire) {
    if (p.rec) {
      if (p.plain) dequantize_reduce_kernel<kOut, F, kNative, true, true><<<grid, kThreads, 0, stream>>>(p);
      else dequantize_reduce_kernel<kOut, F, kNative, false, true><<<grid, kThreads, 0, stream>>>(p);
      return;
    }
  }
  if (p.plain) dequantize_reduce_kernel<kOut, F, kNative, true><<<grid, kThreads, 0, stream>>>(p);
  else dequantize_reduce_kernel<kOut, F, kNative, false><<<grid, kThreads, 0, stream>>>(p);
}

cudaError_t launch_reduce_kernel(const ReduceParams& p, OutKind out, Fp8Format fp8, bool native, bool f32_inputs,
                                 unsigned grid, cudaStream_t stream) {
  FP8WIRE_DISPATCH_OUT(out, kOut, FP8WIRE_DISPATCH_FP8(fp8, F, FP8WIRE_DISPATCH_BOOL(native, kNative, {
    if (f32_inputs) reduce_f32_kernel<kOut, F, kNative><<<grid, kThreads, 0, stream>>>(p);
    else launch_fused<kOut, F, kNative>(p, grid, stream);
  })));
  return cudaGetLastError();
}

}  // namespace fp8wire::quant::detail
