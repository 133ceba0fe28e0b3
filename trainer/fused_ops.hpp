// The trainer's fused element-wise operations as autograd functions over trainer/fused_kernels.cu.
// Each computes what its ATen counterpart in trainer/model.cpp computes (rms_norm, ada_rms_norm's
// normalisation, apply_rope, the MLP's gelu(gate) * up), in one kernel forward and one backward,
// and saves less for backward (no fp32 temporaries, no GELU output). They apply to bf16 CUDA
// tensors of supported shapes (`*_applies`); the model falls back to ATen elsewhere (CPU, fp32,
// odd widths) and when train.fused_kernels is false.
#pragma once

#include <ATen/ATen.h>

namespace fp8wire::trainer {

// Whether this build has the kernels (LibTorch with CUDA).
bool fused_kernels_built();

// y = bf16(x * rsqrt(mean(x^2) + eps) * (1 + scale) + shift) over the last dimension of x.
// x: bf16 [B, T, D]; scale, shift: fp32 [B, 1, D] (one row per sample) or [D] (every row; shift
// undefined for a plain RMSNorm).
bool fused_norm_applies(const at::Tensor& x);
at::Tensor fused_rms_modulate(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift, double eps);

// x: bf16 [B, H, S, D] (any strides with the last dimension contiguous); cos, sin: fp32 [B, 1, S, D/2].
// Returns a contiguous [B, H, S, D].
bool fused_rope_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// gelu_tanh(gate) * up, both bf16 of one shape.
bool fused_gelu_mul_applies(const at::Tensor& gate, const at::Tensor& up);
at::Tensor fused_gelu_mul(const at::Tensor& gate, const at::Tensor& up);

}  // namespace fp8wire::trainer
