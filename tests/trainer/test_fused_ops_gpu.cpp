// The trainer's fused kernels (trainer/fused_ops.hpp) against the ATen path they replace and an
// fp64 reference, forward and backward, at the pi05 shapes: RoPE bit-exact with the ATen path;
// RMSNorm, adaRMS and the gated GELU no further from fp64 than the ATen path is; a whole model with
// and without them: the same loss and gradients within bf16 noise; and the ATen fallback where a
// shape does not qualify. Skips (exit 77) where no CUDA device is visible or the kernels are not built.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "trainer/config.hpp"
#include "trainer/data.hpp"
#include "trainer/fused_ops.hpp"
#include "trainer/model.hpp"
#include "trainer/run.hpp"

using namespace fp8wire::trainer;
using at::Tensor;

namespace {
int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "PASS" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// ||a - ref|| / ||ref|| in fp64.
double rel_err(const Tensor& a, const Tensor& ref) {
  Tensor r = ref.to(at::kDouble), d = a.to(at::kDouble) - r;
  return d.norm().item<double>() / std::max(r.norm().item<double>(), 1e-300);
}
// Fraction of elements where two bf16 tensors differ, and whether every difference is within one
// bf16 step (2^-7 relative, with a floor for values near zero).
struct Diff {
  double fraction;
  bool within_one_step;
};
Diff bf16_diff(const Tensor& a, const Tensor& b) {
  Tensor fa = a.to(at::kFloat), fb = b.to(at::kFloat);
  Tensor ne = fa.ne(fb);
  Tensor step = at::maximum(fa.abs(), fb.abs()) * (1.0 / 128) + 1e-30;
  return {ne.to(at::kDouble).mean().item<double>(), (fa - fb).abs().le(step * 1.001).all().item<bool>()};
}
std::string fmt_err(const char* what, double fused, double aten) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s: fused %.3e, ATen %.3e from fp64", what, fused, aten);
  return buf;
}
// The fused path is as close to fp64 as the ATen path (within 1.5x plus a little) and close outright.
bool no_worse(double fused, double aten, double bound) { return fused <= 1.5 * aten + 1e-6 && fused <= bound; }

Tensor grad_of(const Tensor& out, const Tensor& dout, const Tensor& input) {
  return torch::autograd::grad({out}, {input}, {dout}, /*retain_graph=*/false)[0];
}

// A normalisation's outputs, fused, ATen's and fp64's, from the inputs `in` (`in64` for fp64): the
// forward checked (the fused one within one bf16 step of ATen's for 99 % of the outputs, and no
// further from fp64 than ATen's), and the three gradients for one random output gradient.
struct Gradients {
  torch::autograd::variable_list fused, aten, ref;
};
Gradients check_forward(const char* name, const Tensor& y_fused, const Tensor& y_aten, const Tensor& y64,
                        const torch::autograd::variable_list& in, const torch::autograd::variable_list& in64) {
  Diff fw = bf16_diff(y_fused, y_aten);
  check(fw.within_one_step && fw.fraction < 0.01, std::string(name) + " forward: " + std::to_string(fw.fraction * 100) +
                                                      " % of outputs differ from ATen, each by <= 1 bf16 step");
  const double ef = rel_err(y_fused, y64), ea = rel_err(y_aten, y64);
  check(no_worse(ef, ea, 1e-2), fmt_err((std::string(name) + " forward").c_str(), ef, ea));
  Tensor dout = at::randn(y_aten.sizes(), y_aten.options().dtype(at::kFloat)).to(at::kBFloat16);
  return {torch::autograd::grad({y_fused}, in, {dout}), torch::autograd::grad({y_aten}, in, {dout}),
          torch::autograd::grad({y64}, in64, {dout.to(at::kDouble)})};
}

void check_rope(at::Device dev) {
  // pi05: B 4 here, 8 query heads and 1 KV head of 256, 812 positions; x a transposed projection.
  const int64_t b = 4, s = 812, d = 256;
  auto fopts = at::TensorOptions().dtype(at::kFloat).device(dev);
  Tensor pos = at::arange(s, fopts).unsqueeze(0).expand({b, s}) + at::arange(b, fopts).unsqueeze(1) * 3;
  Tensor inv = at::pow(10000.0, at::arange(0, d / 2, fopts) * (-2.0 / double(d)));
  Tensor angle = (pos.unsqueeze(-1) * inv).unsqueeze(1);
  Tensor cos = at::cos(angle), sin = at::sin(angle);
  for (int64_t heads : {8, 1}) {
    Tensor proj = (at::randn({b, s, heads * d}, fopts) * 3).to(at::kBFloat16);
    for (bool narrowed : {false, true}) {
      // narrowed: the last layer's queries, the 50 action positions against cos/sin narrowed to them.
      const int64_t first = narrowed ? s - 50 : 0, len = narrowed ? 50 : s;
      Tensor x = proj.narrow(1, first, len).contiguous().view({b, len, heads, d}).transpose(1, 2).detach();
      x.set_requires_grad(true);
      Tensor c = cos.narrow(2, first, len), sn = sin.narrow(2, first, len);
      const std::string name = "RoPE " + std::to_string(heads) + " head(s)" + (narrowed ? ", narrowed cos/sin" : "");
      check(fused_rope_applies(x, c, sn), name + ": the fused kernel applies");
      Tensor y_fused = fused_rope(x, c, sn), y_aten = apply_rope(x, c, sn);
      check(at::equal(y_fused, y_aten) && y_fused.is_contiguous(), name + ": forward bit-exact with ATen");
      Tensor dout = at::randn(y_aten.sizes(), fopts).to(at::kBFloat16);
      Tensor g_fused = grad_of(y_fused, dout, x), g_aten = grad_of(y_aten, dout, x);
      check(at::equal(g_fused, g_aten), name + ": backward bit-exact with ATen");
      check(g_fused.strides() == x.strides(), name + ": the gradient takes the input's layout");
    }
  }
}

void check_norm(at::Device dev) {
  auto fopts = at::TensorOptions().dtype(at::kFloat).device(dev);
  // Plain RMSNorm at the Gemma width (rows of very different scales), and adaRMS at the expert's.
  {
    Tensor x = (at::randn({4, 712, 2048}, fopts) * at::exp(at::randn({4, 712, 1}, fopts) * 2)).to(at::kBFloat16);
    x.set_requires_grad(true);
    Tensor w = (at::randn({2048}, fopts) * 0.3).to(at::kBFloat16).set_requires_grad(true);
    check(fused_norm_applies(x), "RMSNorm: the fused kernel applies");
    Tensor y_fused = fused_rms_modulate(x, w, Tensor(), 1e-6), y_aten = rms_norm(x, w);
    Tensor x64 = x.detach().to(at::kDouble).requires_grad_(true), w64 = w.detach().to(at::kDouble).requires_grad_(true);
    Tensor y64 = x64 * at::rsqrt(x64.pow(2).mean(-1, true) + 1e-6) * (1 + w64);
    const Gradients g = check_forward("RMSNorm", y_fused, y_aten, y64, {x, w}, {x64, w64});
    for (int i = 0; i < 2; ++i) {
      const double f = rel_err(g.fused[i], g.ref[i]), a = rel_err(g.aten[i], g.ref[i]);
      check(no_worse(f, a, 1e-2) && g.fused[i].scalar_type() == g.aten[i].scalar_type(),
            fmt_err(i == 0 ? "RMSNorm dx" : "RMSNorm dweight", f, a));
    }
  }
  {
    Tensor x = (at::randn({16, 50, 1024}, fopts) * 2).to(at::kBFloat16).set_requires_grad(true);
    Tensor mod = (at::randn({16, 1, 3072}, fopts) * 0.5).set_requires_grad(true);
    auto parts = mod.chunk(3, -1);
    Tensor y_fused = fused_rms_modulate(x, parts[0], parts[1], 1e-6);
    Tensor y_aten = (rms_normalize(x) * (1.0 + parts[0]) + parts[1]).to(at::kBFloat16);
    Tensor x64 = x.detach().to(at::kDouble).requires_grad_(true), m64 = mod.detach().to(at::kDouble).requires_grad_(true);
    auto p64 = m64.chunk(3, -1);
    Tensor y64 = x64 * at::rsqrt(x64.pow(2).mean(-1, true) + 1e-6) * (1 + p64[0]) + p64[1];
    const Gradients g = check_forward("adaRMS", y_fused, y_aten, y64, {x, mod}, {x64, m64});
    // The modulation's gradient: scale and shift parts (the gate's third is zero here).
    Tensor used = at::arange(0, 2048, at::TensorOptions().dtype(at::kLong).device(dev));
    for (int i = 0; i < 2; ++i) {
      Tensor f = i ? g.fused[i].index_select(-1, used) : g.fused[i], a = i ? g.aten[i].index_select(-1, used) : g.aten[i];
      Tensor r = i ? g.ref[i].index_select(-1, used) : g.ref[i];
      const double ef2 = rel_err(f, r), ea2 = rel_err(a, r);
      check(no_worse(ef2, ea2, 1e-2), fmt_err(i == 0 ? "adaRMS dx" : "adaRMS dscale/dshift", ef2, ea2));
    }
  }
}

void check_gelu_mul(at::Device dev) {
  auto fopts = at::TensorOptions().dtype(at::kFloat).device(dev);
  Tensor g = (at::randn({4, 712, 4096}, fopts) * 2).to(at::kBFloat16).set_requires_grad(true);
  Tensor u = at::randn({4, 712, 4096}, fopts).to(at::kBFloat16).set_requires_grad(true);
  check(fused_gelu_mul_applies(g, u), "gated GELU: the fused kernel applies");
  Tensor z_fused = fused_gelu_mul(g, u), z_aten = at::gelu(g, "tanh") * u;
  Diff fw = bf16_diff(z_fused, z_aten);
  check(fw.within_one_step && fw.fraction < 0.01,
        "gated GELU forward: " + std::to_string(fw.fraction * 100) + " % differ from ATen, each by <= 1 bf16 step");
  Tensor dout = at::randn(z_aten.sizes(), fopts).to(at::kBFloat16);
  auto gf = torch::autograd::grad({z_fused}, {g, u}, {dout});
  auto ga = torch::autograd::grad({z_aten}, {g, u}, {dout});
  for (int i = 0; i < 2; ++i) {
    Diff bw = bf16_diff(gf[i], ga[i]);
    check(bw.within_one_step && bw.fraction < 0.01,
          std::string(i ? "gated GELU dup: " : "gated GELU dgate: ") + std::to_string(bw.fraction * 100) +
              " % differ from ATen, each by <= 1 bf16 step");
  }
}

void check_fallbacks(at::Device dev) {
  auto bopts = at::TensorOptions().dtype(at::kBFloat16).device(dev);
  check(!fused_norm_applies(at::zeros({2, 3, 12}, bopts)), "RMSNorm of width 12 (not a multiple of 8) falls back");
  check(!fused_norm_applies(at::zeros({2, 3, 64}, bopts.dtype(at::kFloat))), "fp32 RMSNorm falls back");
  check(!fused_norm_applies(at::zeros({2, 3, 64}, at::TensorOptions().dtype(at::kBFloat16))), "CPU RMSNorm falls back");
  Tensor cs = at::zeros({2, 1, 5, 4}, bopts.dtype(at::kFloat));
  check(!fused_rope_applies(at::zeros({2, 1, 5, 8}, bopts), cs, cs), "RoPE of head width 8 (not 16k) falls back");
  Tensor odd = at::zeros({1, 13}, bopts);
  check(!fused_gelu_mul_applies(odd, odd), "gated GELU of 13 elements falls back");
  bool threw = false;
  try {
    fused_rope(at::zeros({2, 1, 5, 8}, bopts), cs, cs);
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("fused_rope") != std::string::npos;
  }
  check(threw, "fused_rope on an unsupported shape throws an error naming itself");
}

void check_model(at::Device dev) {
  Config c;
  std::string err = load_config_file(std::string(FP8WIRE_TRAINER_CONFIG_DIR) + "/tiny.toml", c);
  check(err.empty(), "tiny preset loads");
  Batch batch = make_synthetic_source(c)->get(0, 4).to(dev, false);
  at::Generator gen = at::detail::createCPUGenerator(5);
  Tensor noise = at::randn(batch.actions.sizes(), gen, at::kFloat).to(dev);
  Tensor time = sample_flow_time(4, gen, at::kCPU).to(dev);
  Tensor loss[2], grads[2];
  for (int k = 0; k < 2; ++k) {
    Pi05Model m(c.model, c.data.num_images, c.data.max_token_len, at::kBFloat16, dev, 3);
    m.set_fused_kernels(k == 1);
    // adaRMS projections start at zero (the expert starts as identity): move them so every path
    // carries signal.
    {
      at::NoGradGuard no_grad;
      at::manual_seed(11);
      for (const auto& p : m.parameters())
        if (p.name.find("layernorm.dense") != std::string::npos || p.name.find("norm.dense") != std::string::npos ||
            p.name.find("input_layernorm.weight") != std::string::npos)
          p.tensor.copy_(at::randn(p.tensor.sizes(), p.tensor.options().dtype(at::kFloat)) * 0.05);
    }
    loss[k] = m.loss(batch, noise, time);
    loss[k].backward();
    std::vector<Tensor> flat;
    for (const auto& p : m.parameters())
      if (p.tensor.grad().defined()) flat.push_back(p.tensor.grad().to(at::kDouble).flatten());
    grads[k] = at::cat(flat);
  }
  const double l0 = loss[0].item<double>(), l1 = loss[1].item<double>();
  const double cosine = (grads[0] * grads[1]).sum().item<double>() / (grads[0].norm() * grads[1].norm()).item<double>();
  char buf[200];
  std::snprintf(buf, sizeof buf, "tiny model, fused vs ATen: loss %.6f vs %.6f, gradient cosine %.6f", l1, l0, cosine);
  check(std::fabs(l1 - l0) <= 1e-2 * std::fabs(l0) && cosine >= 0.999 && grads[0].numel() == grads[1].numel(), buf);
}
}  // namespace

int main() {
  if (visible_gpu_count() == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  if (!fused_kernels_built()) {
    std::printf("SKIPPED: built without the fused kernels (LibTorch without CUDA)\n");
    return 77;
  }
  try {
    at::manual_seed(1);
    const at::Device dev(at::kCUDA, 0);
    check_rope(dev);
    check_norm(dev);
    check_gelu_mul(dev);
    check_fallbacks(dev);
    check_model(dev);
  } catch (const std::exception& e) {
    std::printf("FAIL: exception: %s\n", e.what());
    return 1;
  }
  return failures ? 1 : 0;
}
