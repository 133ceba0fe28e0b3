// Dequantize kernel (segmented wire buffer -> caller dtype) and its raw launch.
#include "quant/dispatch.hpp"
#include "quant/kernels.cuh"

namespace fp8wire::quant::detail {

// No cross-thread work: every thread decodes its own 16 elements, so a plain grid-stride loop.
template <ElemType T, Fp8Format F, bool kNative>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const __grid_constant__ DequantizeParams p) {
  const size_t groups = (p.count + kVec - 1) / kVec;
  const WireTarget t{const_cast<uint8_t*>(p.wire), p.count, p.seg_elems, p.seg_stride, p.block_shift, p.scale};
  for (size_t g = size_t(blockIdx.x) * kThreads + threadIdx.x; g < groups; g += size_t(gridDim.x) * kThreads) {
    const size_t e = g * kVec;
    const int n = p.count - e < size_t(kVec) ? int(p.count - e) : kVec;
    const WireSlot slot = wire_slot(t, e);
    const uint4 q = __ldcs(reinterpret_cast<const uint4*>(slot.payload));
    const float s = math::decode_scale(load_scale(slot.scale, p.scale), p.scale);
    float y[kVec];
    decode16<F, kNative>(q, s, y);
    store16<T>(p.out, e, n, p.out_aligned, y);
  }
}

cudaError_t launch_dequantize_kernel(const DequantizeParams& p, ElemType out_type, Fp8Format fp8, bool native,
                                     unsigned grid, cudaStream_t stream) {
  FP8WIRE_DISPATCH_ELEM(out_type, T, FP8WIRE_DISPATCH_FP8(fp8, F, FP8WIRE_DISPATCH_BOOL(native, kNative, {
    dequantize_kernel<T, F, kNative><<<grid, kThreads, 0, stream>>>(p);
  })));
  return cudaGetLastError();
}

}  // namespace fp8wire::quant::detail
