// Device building blocks shared by the codec kernels (quantize.cu, dequantize.cu, reduce.cu).
// Geometry: a CTA of kThreads threads works on tiles of kTileElems elements; each thread owns kVec = 16
// consecutive elements (one 16-byte FP8 store, one or more 16-byte loads of the caller's dtype). An FP8
// block of B elements is owned by B/16 consecutive threads ("a group"); its amax is reduced with warp
// shuffles, and through shared memory when B > 512 (the group spans several warps).
// All arithmetic goes through quant/fp8_math.hpp, the same code the CPU reference runs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "quant/fp8_math.hpp"
#include "quant/kernel_params.hpp"
#include "quant/telemetry.hpp"
#include "quant/wire_format.hpp"

namespace fp8wire::quant {
namespace detail {

template <ElemType T>
struct Storage { using type = uint16_t; };
template <>
struct Storage<ElemType::f32> { using type = float; };

// The conversion instructions of sm_80+ give the reference's results bit for bit (fp16 -> fp32 is
// exact; fp32 -> bf16/fp16 rounds to nearest even, overflows to Inf and turns NaN into 0x7FFF, which is
// math::kCanonicalNan16), at one instruction per value or pair instead of a dozen integer operations.
template <ElemType T>
__device__ __forceinline__ float to_f32(typename Storage<T>::type v) {
  if constexpr (T == ElemType::f32) return v;
  else if constexpr (T == ElemType::bf16) return math::bf16_to_f32(v);
  else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
#else
    return math::f16_to_f32(v);
#endif
  }
}

template <ElemType T>
__device__ __forceinline__ typename Storage<T>::type from_f32(float v) {
  if constexpr (T == ElemType::f32) return math::bits_f32(math::is_nan_bits(math::f32_bits(v)) ? math::kCanonicalNanF32 : math::f32_bits(v));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  else if constexpr (T == ElemType::bf16) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
  } else {
    unsigned short r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
  }
#else
  else if constexpr (T == ElemType::bf16) return math::f32_to_bf16(v);
  else return math::f32_to_f16(v);
#endif
}

// Two fp32 values -> one word of two 16-bit elements (lo in the low half), as from_f32 each.
template <ElemType T>
__device__ __forceinline__ uint32_t pack2_from_f32(float lo, float hi) {
  static_assert(T != ElemType::f32, "pairs of 16-bit elements only");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  if constexpr (T == ElemType::bf16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return uint32_t(from_f32<T>(lo)) | (uint32_t(from_f32<T>(hi)) << 16);
#endif
}

// y[0..N) in T's storage as N * sizeof(element) / 4 little-endian words: 16-bit types converted a pair
// per instruction, fp32 as is (NaN canonical). What store16 and dequantize's store_unit write.
template <ElemType T, int N>
__device__ __forceinline__ void pack_words(const float (&y)[N], uint32_t* w) {
  if constexpr (T == ElemType::f32) {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = math::f32_bits(from_f32<T>(y[i]));
  } else {
#pragma unroll
    for (int i = 0; i < N; i += 2) w[i / 2] = pack2_from_f32<T>(y[i], y[i + 1]);
  }
}

// Loads elements [e, e + n) of `base` as fp32 into x[0..n), zeros after; one or more 16-byte loads
// when the group is full and the buffer 16-byte aligned.
template <ElemType T, bool kStreaming = true>
__device__ __forceinline__ void load16(const void* base, size_t e, int n, bool aligned, float (&x)[kVec]) {
  using S = typename Storage<T>::type;
  const S* p = static_cast<const S*>(base) + e;
  if (n == kVec && aligned) {
    constexpr int kWords = kVec * sizeof(S) / 16;
    union { uint4 v[kWords]; S s[kVec]; } u;
#pragma unroll
    for (int w = 0; w < kWords; ++w)
      u.v[w] = kStreaming ? __ldcs(reinterpret_cast<const uint4*>(p) + w) : __ldg(reinterpret_cast<const uint4*>(p) + w);
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] = to_f32<T>(u.s[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] = i < n ? to_f32<T>(p[i]) : 0.0f;
  }
}

template <ElemType T>
__device__ __forceinline__ void store16(void* base, size_t e, int n, bool aligned, const float (&y)[kVec]) {
  using S = typename Storage<T>::type;
  S* p = static_cast<S*>(base) + e;
  if (n == kVec && aligned) {
    constexpr int kWords = kVec * sizeof(S) / 16;
    union { uint4 v[kWords]; uint32_t w[kWords * 4]; } u;
    pack_words<T, kVec>(y, u.w);
#pragma unroll
    for (int w = 0; w < kWords; ++w) reinterpret_cast<uint4*>(p)[w] = u.v[w];
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i)
      if (i < n) p[i] = from_f32<T>(y[i]);
  }
}

// ---- FP8 conversions, native (sm_89+ cvt) or software ---------------------------------------------
// The native instructions only exist on sm_89+; compiled for older targets the native variant falls
// back to the software code (the launchers never select it there), so every kernel still builds.
template <Fp8Format F>
__device__ __forceinline__ uint32_t cvt_pair_native(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short r;
  if constexpr (F == Fp8Format::e4m3)
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return math::f32_to_fp8_rne_branchless<F>(lo) | (math::f32_to_fp8_rne_branchless<F>(hi) << 8);
#endif
}

template <Fp8Format F>
__device__ __forceinline__ void decode_pair_native(uint32_t pair, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h2;
  const unsigned short in = static_cast<unsigned short>(pair);
  if constexpr (F == Fp8Format::e4m3)
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
  else
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(in));
  const unsigned short hlo = static_cast<unsigned short>(h2 & 0xFFFFu);
  const unsigned short hhi = static_cast<unsigned short>(h2 >> 16);
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(hlo));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(hhi));
#else
  lo = math::fp8_to_f32_sw<F>(uint8_t(pair));
  hi = math::fp8_to_f32_sw<F>(uint8_t(pair >> 8));
#endif
}

// Encodes x[0..16) with the block's scale into 16 payload bytes (elements >= n encode as 0).
template <Fp8Format F, bool kNative>
__device__ __forceinline__ uint4 encode16(const float (&x)[kVec], int n, const math::BlockScale& bs,
                                          bool stochastic, uint64_t seed, uint64_t index0) {
  uint32_t w[4] = {0, 0, 0, 0};
  if (bs.kind == 0) {
    float v[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = i < n ? math::mul_rn(x[i], bs.encode) : 0.0f;
    if (stochastic) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const uint32_t q = i < n ? math::f32_to_fp8_sr<F>(v[i], math::sr_bits(seed, index0 + i)) : 0u;
        w[i / 4] |= q << (8 * (i % 4));
      }
    } else if constexpr (kNative) {
#pragma unroll
      for (int i = 0; i < kVec; i += 2) w[i / 4] |= cvt_pair_native<F>(v[i], v[i + 1]) << (8 * (i % 4));
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) w[i / 4] |= math::f32_to_fp8_rne_branchless<F>(v[i]) << (8 * (i % 4));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Decodes N payload bytes (N / 4 little-endian words, N even) with decode multiplier s.
template <Fp8Format F, bool kNative, int N>
__device__ __forceinline__ void decode_bytes(const uint32_t (&w)[(N + 3) / 4], float s, float (&y)[N]) {
#pragma unroll
  for (int i = 0; i < N; i += 2) {
    const uint32_t pair = (w[i / 4] >> (8 * (i % 4))) & 0xFFFFu;
    float lo, hi;
    if constexpr (kNative) {
      decode_pair_native<F>(pair, lo, hi);
    } else {
      lo = math::fp8_to_f32_sw<F>(uint8_t(pair));
      hi = math::fp8_to_f32_sw<F>(uint8_t(pair >> 8));
    }
    y[i] = math::mul_rn(lo, s);
    y[i + 1] = math::mul_rn(hi, s);
  }
}

// Decodes 16 payload bytes with decode multiplier s.
template <Fp8Format F, bool kNative>
__device__ __forceinline__ void decode16(uint4 payload, float s, float (&y)[kVec]) {
  const uint32_t w[4] = {payload.x, payload.y, payload.z, payload.w};
  decode_bytes<F, kNative, kVec>(w, s, y);
}

__device__ __forceinline__ uint32_t load_scale(const uint8_t* p, ScaleType st) {
  if (st == ScaleType::fp32) return __ldg(reinterpret_cast<const uint32_t*>(p));
  if (st == ScaleType::bf16) return __ldg(reinterpret_cast<const unsigned short*>(p));
  return __ldg(p);
}

__device__ __forceinline__ void store_scale(uint8_t* p, ScaleType st, uint32_t v) {
  if (st == ScaleType::fp32) *reinterpret_cast<uint32_t*>(p) = v;
  else if (st == ScaleType::bf16) *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(v);
  else *p = static_cast<uint8_t>(v);
}

__device__ __forceinline__ uint32_t abs_max_bits(const float (&x)[kVec]) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < kVec; ++i) m = max(m, math::f32_bits(x[i]) & 0x7FFFFFFFu);
  return m;
}

// Max over the `lanes` consecutive threads of one FP8 block. Every thread of the CTA must call it
// (shuffles use the full mask; groups larger than a warp meet in shared memory).
__device__ __forceinline__ uint32_t group_max(uint32_t v, int lanes, uint32_t* smem) {
  // Unrolled (lanes is uniform): a max is exact, so the order of the butterfly does not matter.
#pragma unroll
  for (int o = 1; o < 32; o <<= 1)
    if (o < lanes) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  if (lanes <= 32) return v;
  const int warp = threadIdx.x >> 5;
  __syncthreads();   // the previous tile's readers are done with smem
  if ((threadIdx.x & 31) == 0) smem[warp] = v;
  __syncthreads();
  const int warps = lanes >> 5;
  const int first = warp & ~(warps - 1);
  uint32_t m = 0;
  for (int w = 0; w < warps; ++w) m = max(m, smem[first + w]);
  return m;
}

// The chunk (segment) of a wire buffer that holds element e < count: its index, first element and
// element count (segment_elems), from one division, 32-bit when the values allow; single-chunk
// layouts skip the division.
struct ChunkOf {
  size_t seg;
  size_t start;
  size_t n;
};

__device__ __forceinline__ ChunkOf chunk_of(const WireTarget& t, size_t e) {
  size_t seg = 0;
  if (t.seg_elems < t.count)
    seg = ((e | t.seg_elems) >> 32) == 0 ? size_t(uint32_t(e) / uint32_t(t.seg_elems)) : e / t.seg_elems;
  return {seg, seg * t.seg_elems, segment_elems(t.count, Segmented{t.seg_elems, t.seg_stride}, seg)};
}

// That chunk's bytes: its first payload byte, its scales, and its last block (whose thread also
// zeroes the scale padding).
struct ChunkView {
  uint8_t* payload;
  uint8_t* scales;
  size_t last_block;
};

__device__ __forceinline__ ChunkView chunk_view(const WireTarget& t, const ChunkOf& c) {
  uint8_t* chunk = t.wire + c.seg * t.seg_stride;
  return {chunk, chunk + payload_bytes(c.n), ((c.n + (size_t(1) << t.block_shift) - 1) >> t.block_shift) - 1};
}

// Where a segmented buffer keeps element e < count: its payload bytes, the scale of its block, and
// whether that block is its chunk's last (whose thread also zeroes the scale padding).
struct WireSlot {
  uint8_t* payload;       // 16 bytes for this thread's group
  uint8_t* scale;         // this block's scale
  uint8_t* scale_pad;     // non-null for the chunk's last block: [scale_pad, scale_pad_end) to zero
  uint8_t* scale_pad_end;
};

__device__ __forceinline__ WireSlot wire_slot(const WireTarget& t, size_t e) {
  const ChunkOf c = chunk_of(t, e);
  const ChunkView v = chunk_view(t, c);
  const size_t local = e - c.start;
  const size_t ssize = scale_bytes(t.scale);
  const size_t block = local >> t.block_shift;
  WireSlot s{v.payload + local, v.scales + block * ssize, nullptr, nullptr};
  if (block == v.last_block) {
    s.scale_pad = v.scales + (block + 1) * ssize;
    s.scale_pad_end = v.scales + align_up((block + 1) * ssize, kWireAlign);
  }
  return s;
}

// Quantizes this thread's 16 values (x, n valid, starting at element e) into the wire buffer. The
// whole CTA must call it (group_max); threads with n == 0 only take part in the reduction.
template <Fp8Format F, bool kNative>
__device__ __forceinline__ math::BlockScale quantize_group(const float (&x)[kVec], int n, size_t e,
                                                           const WireTarget& t, bool stochastic,
                                                           uint64_t seed, uint64_t sr_index0,
                                                           uint32_t* smem, uint4* payload_out) {
  const int lanes = (1 << t.block_shift) / kVec;
  const uint32_t amax = group_max(abs_max_bits(x), lanes, smem);
  const math::BlockScale bs = math::make_scale<F>(amax, t.scale);
  if (n == 0) return bs;
  const uint4 q = encode16<F, kNative>(x, n, bs, stochastic, seed, sr_index0);
  *payload_out = q;
  const WireSlot slot = wire_slot(t, e);
  *reinterpret_cast<uint4*>(slot.payload) = q;   // padding bytes of a short last group are zeros
  if ((threadIdx.x & (lanes - 1)) == 0) {
    store_scale(slot.scale, t.scale, bs.stored);
    for (uint8_t* p = slot.scale_pad; p < slot.scale_pad_end; ++p) *p = 0;
  }
  return bs;
}


// ---- telemetry (quant/telemetry.hpp) ---------------------------------------------------------------
// A thread's running figures. The squared sums are taken per 16-element group in the scaled domain
// (v = x / s, |v| <= 464 or 61440, so fp32 neither overflows nor loses tiny blocks) and multiplied by
// s^2 in fp64 once per group: the residual measured is s (v - q) instead of x - s q, which differs by
// the two fp32 roundings (<= 3 * 2^-24 |x| per element); the counts are exact.
struct StatsAcc {
  double sq_error = 0;
  double sq_input = 0;
  uint32_t elements = 0;
  uint32_t saturated = 0;
  uint32_t flushed = 0;
  uint32_t nonfinite = 0;
};

// Adds the figures of this thread's group (x[0..n), its block scale, its 16 payload bytes q).
template <Fp8Format F, bool kNative>
__device__ __forceinline__ void measure16(const float (&x)[kVec], int n, const math::BlockScale& bs, uint4 q,
                                          StatsAcc& a) {
  a.elements += uint32_t(n);
  if (bs.kind == 2) {   // non-finite block: it decodes to NaN whatever its finite values
#pragma unroll
    for (int i = 0; i < kVec; ++i)
      if (i < n && (math::f32_bits(x[i]) & 0x7FFFFFFFu) >= 0x7F800000u) ++a.nonfinite;
    return;
  }
  if (bs.kind == 1) {   // zero block: every element decodes to 0 (rare: fp64 directly)
    double sq = 0;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (i < n) {
        if ((math::f32_bits(x[i]) & 0x7FFFFFFFu) != 0) ++a.flushed;
        sq += double(x[i]) * double(x[i]);
      }
    }
    a.sq_error += sq;
    a.sq_input += sq;
    return;
  }
  float fq[kVec];
  decode16<F, kNative>(q, 1.0f, fq);
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  float e2 = 0.0f, v2 = 0.0f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    if (i < n) {
      const float v = math::mul_rn(x[i], bs.encode);
      const float d = math::sub_rn(v, fq[i]);
      e2 = math::add_rn(e2, math::mul_rn(d, d));
      v2 = math::add_rn(v2, math::mul_rn(v, v));
      const uint32_t byte = (w[i / 4] >> (8 * (i % 4))) & 0x7Fu;
      if (byte == 0 && (math::f32_bits(x[i]) & 0x7FFFFFFFu) != 0) ++a.flushed;
      if (fabsf(v) > kSaturationLimit<F>) ++a.saturated;
    }
  }
  const double s = double(bs.decode);
  a.sq_error += double(e2) * s * s;
  a.sq_input += double(v2) * s * s;
}

// Adds the CTA's figures to `dst`: one atomic per field per CTA. With `done`, also counts the CTA
// and returns true (in every thread) in the CTA that finished last, which then sees every CTA's
// figures and stores (the fence before the count orders them).
__device__ __forceinline__ bool commit_stats(StatsAcc a, ErrorStats* dst, uint32_t* done) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a.sq_error += __shfl_xor_sync(0xFFFFFFFFu, a.sq_error, o);
    a.sq_input += __shfl_xor_sync(0xFFFFFFFFu, a.sq_input, o);
    a.elements += __shfl_xor_sync(0xFFFFFFFFu, a.elements, o);
    a.saturated += __shfl_xor_sync(0xFFFFFFFFu, a.saturated, o);
    a.flushed += __shfl_xor_sync(0xFFFFFFFFu, a.flushed, o);
    a.nonfinite += __shfl_xor_sync(0xFFFFFFFFu, a.nonfinite, o);
  }
  constexpr int kWarps = kThreads / 32;
  __shared__ double sd[2][kWarps];
  __shared__ unsigned long long su[4][kWarps];
  __shared__ bool last;
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) {
    sd[0][warp] = a.sq_error;
    sd[1][warp] = a.sq_input;
    su[0][warp] = a.elements;
    su[1][warp] = a.saturated;
    su[2][warp] = a.flushed;
    su[3][warp] = a.nonfinite;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double d0 = 0, d1 = 0;
    unsigned long long u[4] = {0, 0, 0, 0};
    for (int i = 0; i < kWarps; ++i) {
      d0 += sd[0][i];
      d1 += sd[1][i];
      for (int f = 0; f < 4; ++f) u[f] += su[f][i];
    }
    if (d0 != 0) atomicAdd(&dst->sq_error, d0);
    if (d1 != 0) atomicAdd(&dst->sq_input, d1);
    if (u[0]) atomicAdd(&dst->elements, u[0]);
    if (u[1]) atomicAdd(&dst->saturated, u[1]);
    if (u[2]) atomicAdd(&dst->flushed, u[2]);
    if (u[3]) atomicAdd(&dst->nonfinite, u[3]);
    last = false;
    if (done) {
      __threadfence();
      last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
  }
  __syncthreads();
  return last;
}

// Whether the chunk of n elements at `chunk` carries the guard flag (the sign bit of its first scale).
__device__ __forceinline__ bool guard_flag_at(const uint8_t* chunk, size_t n, ScaleType st) {
  if (n == 0) return false;
  const uint8_t* scale = chunk + payload_bytes(n);
  if (st == ScaleType::fp32) return (*reinterpret_cast<const volatile uint32_t*>(scale) & 0x80000000u) != 0;
  if (st == ScaleType::bf16) return (*reinterpret_cast<const volatile unsigned short*>(scale) & 0x8000u) != 0;
  return false;
}

// The last CTA of a quantize or requantize, one thread: this rank's vote from the figures so far,
// written with the relayed flags as the flag of each non-empty chunk of `t`; resets the CTA count.
__device__ __forceinline__ void cast_vote(CallTelemetry* rec, const ErrorStats* figures, uint32_t* done,
                                          const GuardBounds& bounds, bool relayed, const WireTarget& t) {
  __threadfence();
  const volatile ErrorStats* v = figures;
  ErrorStats s;
  s.sq_error = v->sq_error;
  s.sq_input = v->sq_input;
  s.elements = v->elements;
  s.saturated = v->saturated;
  s.flushed = v->flushed;
  s.nonfinite = v->nonfinite;
  const uint32_t vote = guard_vote(s, bounds);
  if (vote) atomicOr(&rec->vote, vote);
  if (vote || relayed) {
    const Segmented layout{t.seg_elems, t.seg_stride};
    for (size_t seg = 0; seg < segment_count(t.count, layout); ++seg) {
      const size_t n = segment_elems(t.count, layout, seg);
      if (n == 0) continue;
      uint8_t* scale = t.wire + seg * t.seg_stride + payload_bytes(n);
      if (t.scale == ScaleType::fp32) *reinterpret_cast<volatile uint32_t*>(scale) |= 0x80000000u;
      else if (t.scale == ScaleType::bf16) *reinterpret_cast<volatile unsigned short*>(scale) |= 0x8000u;
    }
  }
  *done = 0;
  __threadfence();
}

}  // namespace detail
}  // namespace fp8wire::quant
