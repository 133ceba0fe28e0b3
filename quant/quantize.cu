// Quantize kernel (plain, or with the error-feedback residual) and its raw launch.
#include "quant/dispatch.hpp"
#include "quant/kernels.cuh"

namespace fp8wire::quant::detail {

template <ElemType T, Fp8Format F, bool kNative, bool kResidual, bool kStreaming = true,
          int kMinBlocks = kResidual ? 4 : 6>
__global__ void __launch_bounds__(kThreads, kMinBlocks) quantize_kernel(const __grid_constant__ QuantizeParams p) {
  __shared__ uint32_t smem[kThreads / 32];
  const size_t count = p.target.count;
  const size_t tiles = (count + kTileElems - 1) / kTileElems;
  for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const size_t e = tile * kTileElems + size_t(threadIdx.x) * kVec;
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
    if constexpr (kResidual) {
      if (n == 0) continue;
      float y[kVec];
      decode16<F, kNative>(q, bs.decode, y);
#pragma unroll
      for (int i = 0; i < kVec; ++i) y[i] = bs.kind == 2 ? 0.0f : math::sub_rn(x[i], y[i]);
      store16<ElemType::f32>(p.residual, e, n, true, y);
    }
  }
}

cudaError_t launch_quantize_kernel(const QuantizeParams& p, ElemType in_type, Fp8Format fp8, bool native,
                                   unsigned grid, cudaStream_t stream) {
  FP8WIRE_DISPATCH_ELEM(in_type, T, FP8WIRE_DISPATCH_FP8(fp8, F, FP8WIRE_DISPATCH_BOOL(native, kNative, {
    if (p.residual) quantize_kernel<T, F, kNative, true><<<grid, kThreads, 0, stream>>>(p);
    else if (p.variant == 1) quantize_kernel<T, F, kNative, false, false><<<grid, kThreads, 0, stream>>>(p);
    else if (p.variant == 2) quantize_kernel<T, F, kNative, false, true, 8><<<grid, kThreads, 0, stream>>>(p);
    else quantize_kernel<T, F, kNative, false><<<grid, kThreads, 0, stream>>>(p);
  })));
  return cudaGetLastError();
}

}  // namespace fp8wire::quant::detail
