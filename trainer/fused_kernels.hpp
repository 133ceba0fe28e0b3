// The trainer's own CUDA kernels for the element-wise work around its matmuls: RMSNorm and adaRMS
// (one pass over a row instead of ~8 ATen ops through fp32 temporaries), RoPE, and the gated GELU
// of the MLPs. bf16 in and out, fp32 inside, as the ATen path in trainer/model.cpp computes them;
// where the ATen path rounds an intermediate to fp32 or bf16, so do these (RoPE is bit-exact with
// it, forward and backward). A plain C++ interface (raw pointers, a stream): no LibTorch header
// reaches nvcc. trainer/fused_ops.cpp wraps them as autograd functions.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp8wire::trainer::fused {

// Row normalisation: y = bf16(xhat * (1 + scale[g]) + shift[g]), xhat = x * rstd,
// rstd = rsqrt(mean(x^2) + eps), g = row / rows_per_group. x, y: bf16 [rows, dim], contiguous;
// scale, shift: fp32 [rows / rows_per_group, dim], contiguous (shift may be null: plain RMSNorm is
// one group with scale = the norm's weight).
struct NormShape {
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t rows_per_group = 0;
  int64_t groups() const { return rows_per_group > 0 ? rows / rows_per_group : 0; }
};
// dim a multiple of 8 (16-byte vectors) and at most 32768; rows a multiple of rows_per_group.
bool norm_supported(const NormShape& s);
cudaError_t norm_forward(const void* x, const float* scale, const float* shift, float eps, const NormShape& s,
                         void* y, float* rstd, cudaStream_t stream);
// Blocks per group of the backward; each writes one row of partial sums of dscale (and dshift).
int64_t norm_backward_parts(const NormShape& s);
// dx: bf16 [rows, dim]; dscale_parts, dshift_parts: fp32 [groups, norm_backward_parts(s), dim], to be
// summed over the middle dimension (fixed partition: the result does not vary from run to run).
// dshift_parts may be null (no shift).
cudaError_t norm_backward(const void* dy, const void* x, const float* rstd, const float* scale, const NormShape& s,
                          void* dx, float* dscale_parts, float* dshift_parts, cudaStream_t stream);

// Rotary embedding on the two halves of the head dimension:
//   out[:half] = x1 * cos - x2 * sin,  out[half:] = x2 * cos + x1 * sin  (inverse: sin negated,
// which is the backward). x, out: bf16 [batch, heads, seq, dim] with the given strides (elements,
// the last dimension contiguous); cos, sin: fp32 [batch, seq, dim / 2] with the given strides.
struct RopeShape {
  int64_t batch = 0, heads = 0, seq = 0, dim = 0;
  int64_t x_stride[3] = {0, 0, 0};    // batch, head, position
  int64_t out_stride[3] = {0, 0, 0};
  int64_t cs_stride[2] = {0, 0};      // batch, position (cos and sin alike)
};
// dim a multiple of 16, every stride and pointer 16-byte aligned.
bool rope_supported(const RopeShape& s, const void* x, const void* out, const float* cos, const float* sin);
cudaError_t rope(const void* x, const float* cos, const float* sin, const RopeShape& s, bool inverse, void* out,
                 cudaStream_t stream);

// The gated GELU of the Gemma MLPs: z = bf16(bf16(gelu_tanh(g)) * u), n elements, contiguous.
bool gelu_mul_supported(int64_t n, const void* a, const void* b, const void* c);
cudaError_t gelu_mul_forward(const void* g, const void* u, int64_t n, void* z, cudaStream_t stream);
// dg = bf16(gelu_tanh'(g) * bf16(dz * u)), du = bf16(dz * bf16(gelu_tanh(g))): what autograd computes
// through ATen's gelu and mul, without the saved GELU output.
cudaError_t gelu_mul_backward(const void* dz, const void* g, const void* u, int64_t n, void* dg, void* du,
                              cudaStream_t stream);

}  // namespace fp8wire::trainer::fused
