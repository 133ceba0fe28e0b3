// Dequantize kernel (segmented wire buffer -> caller dtype) and its raw launch.
//
// Layout of the work: a thread handles "units" of V = 16 / sizeof(out element) consecutive elements
// (8 for bf16/f16, 4 for f32), so that every output store is one 16-byte STG and a warp's store
// instruction covers 512 contiguous bytes (whole 32-byte sectors; the earlier 16-elements-per-thread
// layout wrote 2 x 16 bytes per thread at a 32-byte stride, i.e. half sectors per instruction). Unit u of
// thread t in a tile is unit u * kThreads + t, so payload loads (V bytes per thread) are contiguous
// across the warp as well. Each thread first issues the payload and scale loads of all its kUnits units,
// then decodes and stores, so 32 payload bytes per thread are in flight. One CTA per tile (see the
// launcher); counts too small for two waves of CTAs use fewer units per thread (down to one).
#include "quant/dispatch.hpp"
#include "quant/kernels.cuh"

namespace fp8wire::quant::detail {
namespace {

template <int V>
struct PayloadWord;
template <>
struct PayloadWord<8> {
  using type = uint2;
  static __device__ __forceinline__ void load(const uint8_t* p, uint32_t (&w)[2]) {
    const uint2 v = __ldcs(reinterpret_cast<const uint2*>(p));
    w[0] = v.x;
    w[1] = v.y;
  }
};
template <>
struct PayloadWord<4> {
  static __device__ __forceinline__ void load(const uint8_t* p, uint32_t (&w)[1]) {
    w[0] = __ldcs(reinterpret_cast<const unsigned int*>(p));
  }
};

// Stores one unit (16 bytes when full) with the widest accesses the output address allows; a partial
// last unit is stored element by element.
template <ElemType T, int V>
__device__ __forceinline__ void store_unit(void* base, size_t e, int n, uint32_t align, const float (&y)[V]) {
  using S = typename Storage<T>::type;
  S* p = static_cast<S*>(base) + e;
  union {
    uint4 v;
    uint2 d[2];
    uint32_t w[4];
    S s[V];
  } u;
  pack_words<T, V>(y, u.w);
  if (n == V) {
    if (align >= 16) {
      *reinterpret_cast<uint4*>(p) = u.v;
      return;
    }
    if (align >= 8) {
      reinterpret_cast<uint2*>(p)[0] = u.d[0];
      reinterpret_cast<uint2*>(p)[1] = u.d[1];
      return;
    }
    if (align >= 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) reinterpret_cast<uint32_t*>(p)[i] = u.w[i];
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i)
    if (i < n) p[i] = u.s[i];
}

}  // namespace

template <ElemType T>
inline constexpr int kDequantUnitElems = int(16 / sizeof(typename Storage<T>::type));
// At most 32 elements per thread per tile whatever the output type.
inline constexpr int kDequantElemsPerThread = 32;

template <ElemType T, Fp8Format F, bool kNative>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const __grid_constant__ DequantizeParams p) {
  constexpr int V = kDequantUnitElems<T>;
  constexpr int kUnits = kDequantElemsPerThread / V;
  const WireTarget t{const_cast<uint8_t*>(p.wire), p.count, p.seg_elems, p.seg_stride, p.block_shift, p.scale};
  const int units = int(p.units);   // <= kUnits; fewer for small counts so that the grid fills the GPU
  const size_t tile_elems = size_t(kThreads) * size_t(units) * V;
  const size_t tiles = (p.count + tile_elems - 1) / tile_elems;
  const bool single = p.seg_elems >= p.count;
  const uint8_t* const single_scales = p.wire + payload_bytes(p.count);
  const uint32_t scale_shift = p.scale == ScaleType::fp32 ? 2 : p.scale == ScaleType::bf16 ? 1 : 0;
  // This rank's last read of the call's chunks: their guard flags decide (quant/telemetry.hpp).
  if (p.guard && blockIdx.x == 0 && threadIdx.x == 0) {
    const Segmented layout{p.seg_elems, p.seg_stride};
    bool any = false;
    for (size_t seg = 0; seg < segment_count(p.count, layout); ++seg)
      any |= guard_flag_at(p.wire + seg * p.seg_stride, segment_elems(p.count, layout, seg), p.scale);
    if (any) atomicOr(&p.rec->decision, 1u);
  }
  for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    uint32_t w[kUnits][V / 4];
    uint32_t stored_scale[kUnits];
    int n[kUnits];
    // All loads first (a unit never straddles an FP8 block: blocks hold >= 32 elements, units start at
    // multiples of V).
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const size_t e = tile * tile_elems + (size_t(u) * kThreads + threadIdx.x) * V;
      n[u] = u < units && e < p.count ? int(p.count - e < size_t(V) ? p.count - e : V) : 0;
      if (n[u] > 0) {
        const uint8_t* payload;
        const uint8_t* scale;
        if (single) {   // uniform branch; the common one-chunk layout needs no division
          payload = p.wire + e;
          scale = single_scales + ((e >> p.block_shift) << scale_shift);
        } else {
          const WireSlot slot = wire_slot(t, e);
          payload = slot.payload;
          scale = slot.scale;
        }
        PayloadWord<V>::load(payload, w[u]);
        stored_scale[u] = load_scale(scale, p.scale);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      if (n[u] > 0) {
        const size_t e = tile * tile_elems + (size_t(u) * kThreads + threadIdx.x) * V;
        float y[V];
        decode_bytes<F, kNative, V>(w[u], math::decode_scale(stored_scale[u], p.scale), y);
        store_unit<T, V>(p.out, e, n[u], p.out_align, y);
      }
    }
  }
}

cudaError_t launch_dequantize_kernel(const DequantizeParams& p, ElemType out_type, Fp8Format fp8, bool native,
                                     int sms, unsigned max_ctas, cudaStream_t stream) {
  FP8WIRE_DISPATCH_ELEM(out_type, T, FP8WIRE_DISPATCH_FP8(fp8, F, FP8WIRE_DISPATCH_BOOL(native, kNative, {
    // Resident CTAs per SM of this instance, read once (not a stream operation: capture-safe).
    static const int per_sm = [] {
      int b = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, dequantize_kernel<T, F, kNative>, kThreads, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        b = 0;
      }
      return b > 0 ? b : 2048 / kThreads;
    }();
    // Full tiles (all units in flight) for large counts; for a count that would give fewer than two
    // waves of CTAs, fewer units per thread and more CTAs (a small dequantize is latency-bound: spread
    // it over every SM). One CTA per tile: the hardware hands tiles to SMs as CTAs retire, which
    // balances the end of the kernel better than a persistent grid whose CTAs own a fixed share (with
    // ~5 tiles per CTA at 64 MiB, one extra tile is a 20 % tail). The grid-stride loop only matters
    // beyond 64 waves.
    constexpr uint32_t kUnits = kDequantElemsPerThread / kDequantUnitElems<T>;
    const size_t wave = size_t(sms > 0 ? sms : 132) * size_t(per_sm);
    DequantizeParams q = p;
    const bool forced = p.units == 1 || p.units == 2 || p.units == 4;
    q.units = forced && p.units <= kUnits ? p.units : kUnits;
    auto tiles_for = [&](uint32_t units) {
      const size_t tile = size_t(kThreads) * units * kDequantUnitElems<T>;
      return (p.count + tile - 1) / tile;
    };
    while (!forced && q.units > 1 && tiles_for(q.units) < 2 * wave) q.units /= 2;
    const size_t tiles = tiles_for(q.units);
    const size_t cap = 64 * wave;
    unsigned grid = unsigned(tiles < cap ? (tiles ? tiles : 1) : cap);
    if (max_ctas > 0 && grid > max_ctas) grid = max_ctas;  // the kernel's tile loop covers the rest
    dequantize_kernel<T, F, kNative><<<grid, kThreads, 0, stream>>>(q);
  })));
  return cudaGetLastError();
}

}  // namespace fp8wire::quant::detail
