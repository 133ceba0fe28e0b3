#include "trainer/model.hpp"

#include "trainer/fused_ops.hpp"

#include <cmath>
#include <functional>
#include <stdexcept>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

namespace fp8wire::trainer {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// Masked logits get this bias rather than -inf: a query whose whole row is masked (an empty camera
// slot, language padding) then gets a uniform softmax instead of NaN, and the bias stays finite in
// bf16 even after logits are added to it.
constexpr double kMaskBias = -1e30;
constexpr double kNormEps = 1e-6;

// Activation checkpointing by recomputation (the "reentrant" scheme): forward runs the segment
// without saving activations; backward reruns it with grad enabled and back-propagates through the
// rerun, which accumulates parameter gradients directly (firing their gradient hooks, so bucketed
// all-reduce still overlaps) and yields the gradients of the segment's inputs.
using Segment = std::function<variable_list(const variable_list&)>;

// The segment rides in the graph node (as a capsule), so it lives exactly as long as the graph that
// may call it again in backward.
struct SegmentHolder : torch::CustomClassHolder {
  explicit SegmentHolder(Segment f) : fn(std::move(f)) {}
  Segment fn;
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  // Inputs arrive as a TensorList: that is the argument type autograd unpacks into separate
  // differentiable inputs (a std::vector would count as one opaque argument and cut the graph).
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs,
                               const c10::intrusive_ptr<SegmentHolder>& segment) {
    ctx->saved_data["segment"] = c10::IValue::make_capsule(segment);
    variable_list in(inputs.begin(), inputs.end());
    ctx->save_for_backward(in);
    return segment->fn(in);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto segment = c10::static_intrusive_pointer_cast<SegmentHolder>(ctx->saved_data["segment"].toCapsule());
    variable_list saved = ctx->get_saved_variables();
    variable_list inputs;
    inputs.reserve(saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      Tensor x = saved[i].detach();
      x.set_requires_grad(ctx->needs_input_grad(i));
      inputs.push_back(x);
    }
    variable_list outputs;
    {
      at::AutoGradMode enable_grad(true);
      outputs = segment->fn(inputs);
    }
    variable_list roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    variable_list result;
    for (auto& x : inputs) result.push_back(x.requires_grad() ? x.grad() : Tensor());
    result.push_back(Tensor());  // the segment itself
    return result;
  }
};

variable_list run_segment(bool checkpoint, Segment fn, const variable_list& inputs) {
  if (!checkpoint || !at::GradMode::is_enabled()) return fn(inputs);
  return CheckpointFunction::apply(at::TensorList(inputs), c10::make_intrusive<SegmentHolder>(std::move(fn)));
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) { return at::linear(x, w, b); }

}  // namespace

Batch Batch::to(at::Device device, bool non_blocking) const {
  auto move = [&](const Tensor& t) { return t.defined() ? t.to(device, non_blocking) : t; };
  return {move(images), move(image_mask), move(tokens), move(token_mask), move(actions)};
}

Tensor attention_allowed(const Tensor& ar, const Tensor& valid) {
  Tensor c = ar.to(at::kLong).cumsum(1);
  Tensor causal = c.unsqueeze(1) <= c.unsqueeze(2);  // [B, i, j]: c[j] <= c[i]
  Tensor v = valid.to(at::kBool);
  return causal & v.unsqueeze(2) & v.unsqueeze(1);
}

Tensor joint_positions(const Tensor& valid) { return valid.to(at::kLong).cumsum(1) - 1; }

Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  // x [B, H, S, D]; cos/sin [B, 1, S, D/2]; rotation in fp32 as openpi does, on the two halves.
  const int64_t half = x.size(-1) / 2;
  Tensor xf = x.to(at::kFloat);
  Tensor x1 = xf.narrow(-1, 0, half);
  Tensor x2 = xf.narrow(-1, half, half);
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1).to(x.scalar_type());
}

Tensor rms_normalize(const Tensor& x) {
  Tensor xf = x.to(at::kFloat);
  return xf * at::rsqrt(xf.pow(2).mean(-1, true) + kNormEps);
}

Tensor rms_norm(const Tensor& x, const Tensor& weight) {
  return (rms_normalize(x) * (1.0 + weight.to(at::kFloat))).to(x.scalar_type());
}

std::vector<Tensor> ada_modulation(const Tensor& cond, const Tensor& dense_w, const Tensor& dense_b) {
  return at::linear(cond, dense_w, dense_b).unsqueeze(1).to(at::kFloat).chunk(3, -1);  // 3 x [B, 1, D]
}

AdaNormOut ada_rms_norm(const Tensor& x, const Tensor& cond, const Tensor& dense_w, const Tensor& dense_b) {
  auto parts = ada_modulation(cond, dense_w, dense_b);
  Tensor y = rms_normalize(x) * (1.0 + parts[0]) + parts[1];
  return {y.to(x.scalar_type()), parts[2].to(x.scalar_type())};
}

Tensor sincos_time_embedding(const Tensor& t, int64_t dim, double min_period, double max_period) {
  auto opts = at::TensorOptions().dtype(at::kDouble).device(t.device());
  Tensor fraction = at::linspace(0.0, 1.0, dim / 2, opts);
  Tensor period = min_period * at::pow(max_period / min_period, fraction);
  Tensor angle = t.to(at::kDouble).unsqueeze(1) * (1.0 / period).unsqueeze(0) * (2.0 * M_PI);
  return at::cat({at::sin(angle), at::cos(angle)}, 1).to(at::kFloat);
}

Tensor flow_matching_loss(const Tensor& v, const Tensor& noise, const Tensor& actions) {
  Tensor u = noise.to(at::kFloat) - actions.to(at::kFloat);
  return (v.to(at::kFloat) - u).pow(2).mean();
}

Tensor sample_flow_time(int64_t batch, const at::Generator& gen, at::Device device) {
  Tensor u = at::rand({batch}, gen, at::TensorOptions().dtype(at::kFloat).device(device));
  return at::pow(u, 1.0 / 1.5) * 0.999 + 0.001;
}

Remat parse_remat(const std::string& name) {
  if (name == "vision") return Remat::vision;
  if (name == "layers") return Remat::layers;
  return Remat::none;
}

// --- construction ------------------------------------------------------------------------------

Tensor Pi05Model::add(const std::string& name, std::vector<int64_t> shape, const std::string& init, double scale) {
  // Initialise in fp32 (same numbers whatever the compute dtype), then cast.
  auto opts = at::TensorOptions().dtype(at::kFloat).device(device_);
  Tensor t;
  if (init == "zeros") t = at::zeros(shape, opts);
  else if (init == "ones") t = at::ones(shape, opts);
  else if (init == "normal") t = at::randn(shape, opts) * scale;
  else if (init == "lecun") t = at::randn(shape, opts) * (1.0 / std::sqrt(double(shape[1])));  // fan_in
  else if (init == "lecun_conv") {
    const double fan_in = double(shape[1] * shape[2] * shape[3]);
    t = at::randn(shape, opts) * (1.0 / std::sqrt(fan_in));
  } else if (init == "xavier") {
    const double limit = std::sqrt(6.0 / double(shape[0] + shape[1]));
    t = at::rand(shape, opts) * (2 * limit) - limit;
  } else {
    throw std::logic_error("unknown init rule " + init);
  }
  t = t.to(dtype_).set_requires_grad(true);
  params_.push_back({name, t});
  return t;
}

Pi05Model::Linear Pi05Model::add_linear(const std::string& name, int64_t in, int64_t out, bool bias,
                                        const std::string& init) {
  Linear l;
  l.w = add(name + ".weight", {out, in}, init);
  if (bias) l.b = add(name + ".bias", {out}, "zeros");
  return l;
}

Pi05Model::Pi05Model(const ModelConfig& config, int64_t num_images, int64_t max_token_len,
                     at::ScalarType dtype, at::Device device, uint64_t seed)
    : cfg_(config), num_images_(num_images), max_token_len_(max_token_len), dtype_(dtype), device_(device) {
  at::NoGradGuard no_grad;
  // Every rank seeds the same generator, so replicas start identical without a broadcast.
  at::manual_seed(seed);
  const auto& c = cfg_;
  // Init rules from openpi (flax): SigLIP dense kernels xavier-uniform, conv and Gemma kernels
  // lecun-normal (openpi truncates the normal at 2 sigma; we do not), biases zero, RMSNorm scales
  // zero (they multiply as 1 + w), LayerNorm scales one, token embedding N(0, 0.01^2), SigLIP
  // position embedding N(0, 1/width), adaRMS projections zero so the expert starts as identity.
  // Registration order is the reverse of the order in which backward finishes each gradient
  // (gradient buckets are cut from the reversed list and must launch in order): the time MLP and
  // action_in_proj feed every layer, so their gradients are complete last; action_out_proj first.
  time_in_ = add_linear("time_mlp_in", c.expert_width, c.expert_width, true, "lecun");
  time_out_ = add_linear("time_mlp_out", c.expert_width, c.expert_width, true, "lecun");
  action_in_ = add_linear("action_in_proj", c.action_dim, c.expert_width, true, "lecun");
  const std::string vt = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.";
  if (num_images_ > 0) {
    patch_w_ = add(vt + "embeddings.patch_embedding.weight", {c.vision_width, 3, c.patch_size, c.patch_size}, "lecun_conv");
    patch_b_ = add(vt + "embeddings.patch_embedding.bias", {c.vision_width}, "zeros");
    const int64_t tokens = (c.image_size / c.patch_size) * (c.image_size / c.patch_size);
    pos_emb_ = add(vt + "embeddings.position_embedding.weight", {tokens, c.vision_width}, "normal",
                   1.0 / std::sqrt(double(c.vision_width)));
    for (int64_t i = 0; i < c.vision_depth; ++i) {
      const std::string p = vt + "encoder.layers." + std::to_string(i) + ".";
      VisionLayer l;
      l.ln1_w = add(p + "layer_norm1.weight", {c.vision_width}, "ones");
      l.ln1_b = add(p + "layer_norm1.bias", {c.vision_width}, "zeros");
      l.q = add_linear(p + "self_attn.q_proj", c.vision_width, c.vision_width, true, "xavier");
      l.k = add_linear(p + "self_attn.k_proj", c.vision_width, c.vision_width, true, "xavier");
      l.v = add_linear(p + "self_attn.v_proj", c.vision_width, c.vision_width, true, "xavier");
      l.o = add_linear(p + "self_attn.out_proj", c.vision_width, c.vision_width, true, "xavier");
      l.ln2_w = add(p + "layer_norm2.weight", {c.vision_width}, "ones");
      l.ln2_b = add(p + "layer_norm2.bias", {c.vision_width}, "zeros");
      l.fc1 = add_linear(p + "mlp.fc1", c.vision_width, c.vision_mlp, true, "xavier");
      l.fc2 = add_linear(p + "mlp.fc2", c.vision_mlp, c.vision_width, true, "xavier");
      vision_.push_back(l);
    }
    post_ln_w_ = add(vt + "post_layernorm.weight", {c.vision_width}, "ones");
    post_ln_b_ = add(vt + "post_layernorm.bias", {c.vision_width}, "zeros");
    projector_ = add_linear("paligemma_with_expert.paligemma.model.multi_modal_projector.linear", c.vision_width,
                            c.width, true, "lecun");
  }
  embed_tokens_ = add("paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight",
                      {c.vocab_size, c.width}, "normal", 0.01);
  const int64_t q_out = c.heads * c.head_dim, kv_out = c.kv_heads * c.head_dim;
  for (int64_t i = 0; i < c.depth; ++i) {
    JointLayer layer;
    // The last layer's prefix outputs feed nothing (only the suffix reaches the loss), so its
    // o_proj/post-attention norm/MLP are neither created nor computed: a parameter without a
    // gradient would also leave its all-reduce bucket waiting forever.
    layer.prefix_tail = i + 1 < c.depth;
    for (int expert = 0; expert < 2; ++expert) {
      const bool suffix = expert == 1;
      const int64_t w = suffix ? c.expert_width : c.width;
      const int64_t mlp = suffix ? c.expert_mlp : c.mlp;
      const std::string p = std::string("paligemma_with_expert.") +
                            (suffix ? "gemma_expert.model.layers." : "paligemma.model.language_model.layers.") +
                            std::to_string(i) + ".";
      ExpertWeights& e = suffix ? layer.suffix : layer.prefix;
      if (suffix) e.ada1 = add_linear(p + "input_layernorm.dense", w, 3 * w, true, "zeros");
      else e.ln1 = add(p + "input_layernorm.weight", {w}, "zeros");
      // The last layer's prefix queries would only produce prefix outputs: not created either.
      if (suffix || layer.prefix_tail) e.q = add_linear(p + "self_attn.q_proj", w, q_out, false, "lecun");
      e.k = add_linear(p + "self_attn.k_proj", w, kv_out, false, "lecun");
      e.v = add_linear(p + "self_attn.v_proj", w, kv_out, false, "lecun");
      if (!suffix && !layer.prefix_tail) continue;
      e.o = add_linear(p + "self_attn.o_proj", q_out, w, false, "lecun");
      if (suffix) e.ada2 = add_linear(p + "post_attention_layernorm.dense", w, 3 * w, true, "zeros");
      else e.ln2 = add(p + "post_attention_layernorm.weight", {w}, "zeros");
      e.gate = add_linear(p + "mlp.gate_proj", w, mlp, false, "lecun");
      e.up = add_linear(p + "mlp.up_proj", w, mlp, false, "lecun");
      e.down = add_linear(p + "mlp.down_proj", mlp, w, false, "lecun");
    }
    layers_.push_back(layer);
  }
  expert_final_ada_ = add_linear("paligemma_with_expert.gemma_expert.model.norm.dense", c.expert_width,
                                 3 * c.expert_width, true, "zeros");
  action_out_ = add_linear("action_out_proj", c.expert_width, c.action_dim, true, "lecun");
}

int64_t Pi05Model::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.tensor.numel();
  return n;
}

int64_t Pi05Model::unreached_parameter_count() const {
  const auto& c = cfg_;
  if (c.depth == 0) return 0;
  // q_proj and o_proj, post-attention norm, MLP, final norm.
  return 2 * c.heads * c.head_dim * c.width + c.width + 3 * c.width * c.mlp + c.width;
}

double Pi05Model::forward_flops_per_sample() const {
  const auto& c = cfg_;
  const double img_tok = double((c.image_size / c.patch_size) * (c.image_size / c.patch_size));
  const double vis_tokens = img_tok * double(num_images_);
  const double prefix = vis_tokens + double(max_token_len_);
  const double suffix = double(c.action_horizon);
  const double seq = prefix + suffix;
  // 2 FLOPs per multiply-add for every weight a token passes through, plus QK^T and PV.
  const double vis_layer = 4.0 * c.vision_width * c.vision_width + 2.0 * c.vision_width * c.vision_mlp;
  double flops = 2.0 * vis_tokens * (vis_layer * c.vision_depth + c.vision_width * c.width);
  flops += 2.0 * num_images_ * img_tok * img_tok * c.vision_width * 2.0 * c.vision_depth;
  const double qkv = double(c.heads + 2 * c.kv_heads) * c.head_dim;
  const double pre_layer = c.width * qkv + double(c.heads) * c.head_dim * c.width + 3.0 * c.width * c.mlp;
  const double suf_layer = c.expert_width * qkv + double(c.heads) * c.head_dim * c.expert_width +
                           3.0 * c.expert_width * c.expert_mlp + 6.0 * c.expert_width * c.expert_width;
  flops += 2.0 * c.depth * (prefix * pre_layer + suffix * suf_layer);
  flops += 2.0 * c.depth * 2.0 * seq * seq * c.heads * c.head_dim;
  return flops;
}

// --- forward -----------------------------------------------------------------------------------

Tensor Pi05Model::norm(const Tensor& x, const Tensor& weight) const {
  if (fused_ && fused_norm_applies(x)) return fused_rms_modulate(x, weight, Tensor(), kNormEps);
  return rms_norm(x, weight);
}

AdaNormOut Pi05Model::ada_norm(const Tensor& x, const Tensor& cond, const Linear& dense) const {
  if (!(fused_ && fused_norm_applies(x))) return ada_rms_norm(x, cond, dense.w, dense.b);
  auto parts = ada_modulation(cond, dense.w, dense.b);
  return {fused_rms_modulate(x, parts[0], parts[1], kNormEps), parts[2].to(x.scalar_type())};
}

Tensor Pi05Model::rope(const Tensor& x, const Tensor& cos, const Tensor& sin) const {
  if (fused_ && fused_rope_applies(x, cos, sin)) return fused_rope(x, cos, sin);
  return apply_rope(x, cos, sin);
}

Tensor Pi05Model::gated_mlp(const ExpertWeights& e, const Tensor& h) const {
  Tensor gate = at::linear(h, e.gate.w), up = at::linear(h, e.up.w);
  Tensor z = fused_ && fused_gelu_mul_applies(gate, up) ? fused_gelu_mul(gate, up) : at::gelu(gate, "tanh") * up;
  return at::linear(z, e.down.w);
}

Tensor Pi05Model::vision_layer(const VisionLayer& l, const Tensor& x) const {
  const auto& c = cfg_;
  const int64_t n = x.size(0), s = x.size(1), hd = c.vision_width / c.vision_heads;
  Tensor h = at::layer_norm(x, {c.vision_width}, l.ln1_w, l.ln1_b, 1e-6);
  auto heads = [&](const Linear& p) { return linear(h, p.w, p.b).view({n, s, c.vision_heads, hd}).transpose(1, 2); };
  Tensor a = at::scaled_dot_product_attention(heads(l.q), heads(l.k), heads(l.v));
  Tensor out = x + linear(a.transpose(1, 2).reshape({n, s, c.vision_width}), l.o.w, l.o.b);
  h = at::layer_norm(out, {c.vision_width}, l.ln2_w, l.ln2_b, 1e-6);
  return out + linear(at::gelu(linear(h, l.fc1.w, l.fc1.b), "tanh"), l.fc2.w, l.fc2.b);
}

std::pair<Tensor, Tensor> Pi05Model::embed_prefix(const Batch& batch) const {
  const auto& c = cfg_;
  const int64_t b = batch.tokens.size(0);
  std::vector<Tensor> parts, valid;
  if (num_images_ > 0) {
    // uint8 frames arrive as they were stored; resize to the tower's input and map to [-1, 1] here
    // on the device (openpi's resize_with_pad is a no-op for square LIBERO frames).
    const int64_t h = batch.images.size(2), w = batch.images.size(3);
    Tensor img = batch.images.reshape({b * num_images_, h, w, 3}).permute({0, 3, 1, 2}).to(at::kFloat);
    if (h != c.image_size || w != c.image_size)
      img = at::upsample_bilinear2d(img, {c.image_size, c.image_size}, false);
    img = (img * (2.0 / 255.0) - 1.0).to(dtype_);
    Tensor x = at::conv2d(img, patch_w_, patch_b_, {c.patch_size, c.patch_size});
    x = x.flatten(2).transpose(1, 2) + pos_emb_;
    for (size_t i = 0; i < vision_.size(); ++i) {
      const VisionLayer& l = vision_[i];
      const bool ckpt = remat_ != Remat::none && int64_t(i) % remat_every_ == 0;
      x = run_segment(ckpt, [this, &l](const variable_list& in) { return variable_list{vision_layer(l, in[0])}; },
                      {x})[0];
    }
    x = at::layer_norm(x, {c.vision_width}, post_ln_w_, post_ln_b_, 1e-6);
    x = linear(x, projector_.w, projector_.b);  // [b * cams, tokens, width]
    const int64_t tokens = x.size(1);
    parts.push_back(x.reshape({b, num_images_ * tokens, c.width}));
    valid.push_back(batch.image_mask.to(at::kBool).unsqueeze(2).expand({b, num_images_, tokens}).reshape({b, -1}));
  }
  Tensor lang = at::embedding(embed_tokens_, batch.tokens) * std::sqrt(double(c.width));
  parts.push_back(lang.to(dtype_));
  valid.push_back(batch.token_mask.to(at::kBool));
  return {at::cat(parts, 1), at::cat(valid, 1)};
}

std::vector<Tensor> Pi05Model::joint_layer(const JointLayer& l, const Tensor& xp, const Tensor& xs, const Tensor& cond,
                                           const Tensor& mask, const Tensor& cos, const Tensor& sin) const {
  const auto& c = cfg_;
  const int64_t b = xp.size(0), p = xp.size(1), a = xs.size(1), s = p + a;
  Tensor hp = norm(xp, l.prefix.ln1);
  AdaNormOut hs = ada_norm(xs, cond, l.suffix.ada1);
  auto project = [&](const Linear& wp, const Linear& ws, int64_t heads) {
    Tensor t = at::cat({linear(hp, wp.w, wp.b), linear(hs.y, ws.w, ws.b)}, 1);
    return t.view({b, s, heads, c.head_dim}).transpose(1, 2);
  };
  // In the last layer only the action tokens query (their outputs are all the loss reads); the
  // prefix still provides keys and values.
  Tensor q = l.prefix_tail ? rope(project(l.prefix.q, l.suffix.q, c.heads), cos, sin)
                           : rope(linear(hs.y, l.suffix.q.w, l.suffix.q.b).view({b, a, c.heads, c.head_dim}).transpose(1, 2),
                                  cos.narrow(2, p, a), sin.narrow(2, p, a));
  Tensor k = rope(project(l.prefix.k, l.suffix.k, c.kv_heads), cos, sin);
  Tensor v = project(l.prefix.v, l.suffix.v, c.kv_heads);
  // Grouped-query attention: expanding K/V keeps SDPA on its fused kernels with an arbitrary mask.
  const int64_t group = c.heads / c.kv_heads;
  if (group > 1) {
    k = k.repeat_interleave(group, 1);
    v = v.repeat_interleave(group, 1);
  }
  Tensor rows = l.prefix_tail ? mask : mask.narrow(2, p, a).contiguous();
  Tensor o = at::scaled_dot_product_attention(q, k, v, rows, 0.0, false, 1.0 / std::sqrt(double(c.head_dim)));
  o = o.transpose(1, 2).reshape({b, q.size(2), c.heads * c.head_dim});
  Tensor os = l.prefix_tail ? o.narrow(1, p, a) : o;
  Tensor ys = xs + linear(os, l.suffix.o.w, l.suffix.o.b) * hs.gate;
  AdaNormOut h2 = ada_norm(ys, cond, l.suffix.ada2);
  ys = ys + gated_mlp(l.suffix, h2.y) * h2.gate;
  Tensor yp = xp;
  if (l.prefix_tail) {
    yp = xp + linear(o.narrow(1, 0, p), l.prefix.o.w, l.prefix.o.b);
    yp = yp + gated_mlp(l.prefix, norm(yp, l.prefix.ln2));
  }
  return {yp, ys};
}

Tensor Pi05Model::velocity(const Batch& batch, const Tensor& x_t, const Tensor& time) const {
  const auto& c = cfg_;
  auto [prefix, prefix_valid] = embed_prefix(batch);
  const int64_t b = prefix.size(0), a = c.action_horizon;
  Tensor suffix = linear(x_t.to(dtype_), action_in_.w, action_in_.b);
  Tensor temb = sincos_time_embedding(time, c.expert_width, c.time_min_period, c.time_max_period).to(dtype_);
  Tensor cond = at::silu(linear(at::silu(linear(temb, time_in_.w, time_in_.b)), time_out_.w, time_out_.b));

  auto opts_long = at::TensorOptions().dtype(at::kLong).device(prefix.device());
  Tensor valid = at::cat({prefix_valid, at::ones({b, a}, opts_long.dtype(at::kBool))}, 1);
  Tensor ar = at::zeros({b, valid.size(1)}, opts_long);
  ar.select(1, prefix.size(1)).fill_(1);  // the action tokens attend as one block after the prefix
  Tensor allowed = attention_allowed(ar, valid);
  Tensor mask = at::zeros(allowed.sizes(), prefix.options()).masked_fill(allowed.logical_not(), kMaskBias).unsqueeze(1);

  Tensor pos = joint_positions(valid).to(at::kFloat);  // [B, S]
  auto fopts = at::TensorOptions().dtype(at::kFloat).device(prefix.device());
  Tensor inv = at::pow(c.rope_base, at::arange(0, c.head_dim / 2, fopts) * (-2.0 / double(c.head_dim)));
  Tensor angle = (pos.unsqueeze(-1) * inv).unsqueeze(1);  // [B, 1, S, D/2]
  Tensor cos = at::cos(angle), sin = at::sin(angle);

  Tensor xp = prefix, xs = suffix;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const JointLayer& l = layers_[i];
    const bool ckpt = remat_ == Remat::layers && int64_t(i) % remat_every_ == 0;
    auto out = run_segment(
        ckpt,
        [this, &l, mask, cos, sin](const variable_list& in) { return joint_layer(l, in[0], in[1], in[2], mask, cos, sin); },
        {xp, xs, cond});
    xp = out[0];
    xs = out[1];
  }
  AdaNormOut fin = ada_norm(xs, cond, expert_final_ada_);
  return linear(fin.y, action_out_.w, action_out_.b).to(at::kFloat);
}

Tensor Pi05Model::loss(const Batch& batch, const Tensor& noise, const Tensor& time) const {
  Tensor t = time.to(at::kFloat).view({-1, 1, 1});
  Tensor x_t = t * noise + (1.0 - t) * batch.actions;
  return flow_matching_loss(velocity(batch, x_t, time), noise, batch.actions);
}

}  // namespace fp8wire::trainer
