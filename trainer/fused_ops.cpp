#include "trainer/fused_ops.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

#ifdef FP8WIRE_TRAINER_FUSED
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include "trainer/fused_kernels.hpp"
#endif

namespace fp8wire::trainer {

using at::Tensor;

#ifdef FP8WIRE_TRAINER_FUSED

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmt::format("fused {} kernel: {}", what, cudaGetErrorString(e)));
}
cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
bool aligned16(const Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15u) == 0; }
bool bf16_cuda(const Tensor& t) { return t.defined() && t.is_cuda() && t.scalar_type() == at::kBFloat16; }
// The kernels read 16-byte vectors: a contiguous view at an odd offset is copied.
Tensor aligned_contiguous(const Tensor& t) {
  Tensor c = t.contiguous();
  return aligned16(c) ? c : c.clone();
}

// x [rows, D] bf16; scale [G, D] fp32; shift [G, D] fp32 or empty (no shift: autograd's custom
// functions take no undefined tensor inputs). Rows of one group are consecutive (a sample's
// tokens), rows / G per group.
struct NormFunction : public torch::autograd::Function<NormFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x_in, const Tensor& scale_in, const Tensor& shift_in,
                        double eps) {
    Tensor x = aligned_contiguous(x_in), scale = aligned_contiguous(scale_in);
    const bool has_shift = shift_in.numel() > 0;
    Tensor shift = has_shift ? aligned_contiguous(shift_in) : shift_in;
    const fused::NormShape s{x.size(0), x.size(1), x.size(0) / scale.size(0)};
    Tensor y = at::empty_like(x);
    Tensor rstd = at::empty({s.rows}, x.options().dtype(at::kFloat));
    check(fused::norm_forward(x.data_ptr(), scale.data_ptr<float>(), has_shift ? shift.data_ptr<float>() : nullptr,
                              float(eps), s, y.data_ptr(), rstd.data_ptr<float>(), current_stream()),
          "RMSNorm forward");
    ctx->save_for_backward({x, scale, rstd});
    ctx->saved_data["shift"] = has_shift;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &scale = saved[1], &rstd = saved[2];
    const bool has_shift = ctx->saved_data["shift"].toBool();
    Tensor dy = aligned_contiguous(grads[0].to(at::kBFloat16));
    const fused::NormShape s{x.size(0), x.size(1), x.size(0) / scale.size(0)};
    const int64_t parts = fused::norm_backward_parts(s);
    Tensor dx = at::empty_like(x);
    auto fopts = x.options().dtype(at::kFloat);
    Tensor dscale_parts = at::empty({s.groups(), parts, s.dim}, fopts);
    Tensor dshift_parts = has_shift ? at::empty({s.groups(), parts, s.dim}, fopts) : Tensor();
    check(fused::norm_backward(dy.data_ptr(), x.data_ptr(), rstd.data_ptr<float>(), scale.data_ptr<float>(), s,
                               dx.data_ptr(), dscale_parts.data_ptr<float>(),
                               has_shift ? dshift_parts.data_ptr<float>() : nullptr, current_stream()),
          "RMSNorm backward");
    return {dx, dscale_parts.sum(1), has_shift ? dshift_parts.sum(1) : Tensor(), Tensor()};
  }
};

fused::RopeShape rope_shape(const Tensor& x, const Tensor& out, const Tensor& cos) {
  fused::RopeShape s;
  s.batch = x.size(0);
  s.heads = x.size(1);
  s.seq = x.size(2);
  s.dim = x.size(3);
  for (int i = 0; i < 3; ++i) {
    s.x_stride[i] = x.stride(i);
    s.out_stride[i] = out.stride(i);
  }
  s.cs_stride[0] = cos.stride(0);
  s.cs_stride[1] = cos.stride(2);
  return s;
}

struct RopeFunction : public torch::autograd::Function<RopeFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& cos, const Tensor& sin) {
    Tensor out = at::empty(x.sizes(), x.options());
    check(fused::rope(x.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(), rope_shape(x, out, cos), false,
                      out.data_ptr(), current_stream()),
          "RoPE forward");
    ctx->save_for_backward({cos, sin});
    // The gradient takes x's layout (a transposed projection, usually), so the views between the
    // projection and here pass it back without a copy.
    const bool dense = x.is_non_overlapping_and_dense();
    ctx->saved_data["sizes"] = x.sizes().vec();
    ctx->saved_data["strides"] = dense ? x.strides().vec() : out.strides().vec();
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const Tensor &cos = saved[0], &sin = saved[1];
    Tensor d = grads[0].to(at::kBFloat16);
    Tensor dx = at::empty_strided(ctx->saved_data["sizes"].toIntVector(), ctx->saved_data["strides"].toIntVector(),
                                  d.options());
    fused::RopeShape s = rope_shape(d, dx, cos);
    if (!fused::rope_supported(s, d.data_ptr(), dx.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>())) {
      d = aligned_contiguous(d);
      s = rope_shape(d, dx, cos);
    }
    check(fused::rope(d.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(), s, true, dx.data_ptr(),
                      current_stream()),
          "RoPE backward");
    return {dx, Tensor(), Tensor()};
  }
};

struct GeluMulFunction : public torch::autograd::Function<GeluMulFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& gate, const Tensor& up) {
    Tensor z = at::empty_like(gate);
    check(fused::gelu_mul_forward(gate.data_ptr(), up.data_ptr(), gate.numel(), z.data_ptr(), current_stream()),
          "gated GELU forward");
    ctx->save_for_backward({gate, up});
    return z;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const Tensor &gate = saved[0], &up = saved[1];
    Tensor dz = aligned_contiguous(grads[0].to(at::kBFloat16));
    Tensor dgate = at::empty_like(gate), dup = at::empty_like(up);
    check(fused::gelu_mul_backward(dz.data_ptr(), gate.data_ptr(), up.data_ptr(), gate.numel(), dgate.data_ptr(),
                                   dup.data_ptr(), current_stream()),
          "gated GELU backward");
    return {dgate, dup};
  }
};

}  // namespace

bool fused_kernels_built() { return true; }

bool fused_norm_applies(const Tensor& x) {
  if (!bf16_cuda(x) || x.dim() != 3) return false;
  return fused::norm_supported({x.size(0) * x.size(1), x.size(2), x.size(1)});
}

Tensor fused_rms_modulate(const Tensor& x, const Tensor& scale, const Tensor& shift, double eps) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  const bool per_sample = scale.dim() == 3;
  if (!fused_norm_applies(x) || scale.size(-1) != d || (per_sample && scale.size(0) != b))
    throw std::invalid_argument(fmt::format("fused_rms_modulate: x {} with scale {}: expected bf16 CUDA [B, T, D] "
                                            "with scale [B, 1, D] or [D]",
                                            fmt::join(x.sizes(), "x"), fmt::join(scale.sizes(), "x")));
  Tensor s = scale.to(at::kFloat).reshape({per_sample ? b : 1, d});
  Tensor sh = shift.defined() ? shift.to(at::kFloat).reshape({per_sample ? b : 1, d})
                              : at::empty({0}, x.options().dtype(at::kFloat));
  Tensor y = NormFunction::apply(x.reshape({b * t, d}), s, sh, eps);
  return y.view({b, t, d});
}

bool fused_rope_applies(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  if (!bf16_cuda(x) || x.dim() != 4 || cos.dim() != 4 || !cos.is_cuda() || cos.scalar_type() != at::kFloat ||
      sin.sizes() != cos.sizes() || sin.strides() != cos.strides() || sin.scalar_type() != at::kFloat)
    return false;
  if (cos.size(0) != x.size(0) || cos.size(1) != 1 || cos.size(2) != x.size(2) || cos.size(3) * 2 != x.size(3) ||
      cos.stride(3) != 1 || x.stride(3) != 1)
    return false;
  // The output is a fresh contiguous tensor: its strides are products of the sizes.
  fused::RopeShape s = rope_shape(x, x, cos);
  s.out_stride[2] = x.size(3);
  s.out_stride[1] = x.size(2) * s.out_stride[2];
  s.out_stride[0] = x.size(1) * s.out_stride[1];
  return fused::rope_supported(s, x.data_ptr(), x.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>());
}

Tensor fused_rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  if (!fused_rope_applies(x, cos, sin))
    throw std::invalid_argument(fmt::format("fused_rope: x {} with cos {}: expected bf16 CUDA [B, H, S, D] and fp32 "
                                            "[B, 1, S, D/2], 16-byte aligned",
                                            fmt::join(x.sizes(), "x"), fmt::join(cos.sizes(), "x")));
  return RopeFunction::apply(x, cos, sin);
}

bool fused_gelu_mul_applies(const Tensor& gate, const Tensor& up) {
  return bf16_cuda(gate) && bf16_cuda(up) && gate.sizes() == up.sizes() && gate.is_contiguous() &&
         up.is_contiguous() && fused::gelu_mul_supported(gate.numel(), gate.data_ptr(), up.data_ptr(), gate.data_ptr());
}

Tensor fused_gelu_mul(const Tensor& gate, const Tensor& up) {
  if (!fused_gelu_mul_applies(gate, up))
    throw std::invalid_argument(fmt::format("fused_gelu_mul: gate {} and up {}: expected contiguous bf16 CUDA tensors "
                                            "of one shape, a multiple of 8 elements",
                                            fmt::join(gate.sizes(), "x"), fmt::join(up.sizes(), "x")));
  return GeluMulFunction::apply(gate, up);
}

#else  // LibTorch without CUDA: the model keeps its ATen path.

bool fused_kernels_built() { return false; }
bool fused_norm_applies(const Tensor&) { return false; }
bool fused_rope_applies(const Tensor&, const Tensor&, const Tensor&) { return false; }
bool fused_gelu_mul_applies(const Tensor&, const Tensor&) { return false; }
namespace {
[[noreturn]] void not_built(const char* what) {
  throw std::logic_error(fmt::format("{}: this build has no CUDA kernels (LibTorch without CUDA)", what));
}
}  // namespace
Tensor fused_rms_modulate(const Tensor&, const Tensor&, const Tensor&, double) { not_built("fused_rms_modulate"); }
Tensor fused_rope(const Tensor&, const Tensor&, const Tensor&) { not_built("fused_rope"); }
Tensor fused_gelu_mul(const Tensor&, const Tensor&) { not_built("fused_gelu_mul"); }

#endif

}  // namespace fp8wire::trainer
