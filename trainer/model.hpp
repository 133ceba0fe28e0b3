// Pi0.5 (openpi's pi05) in plain ATen ops with autograd: SigLIP So400m/14 + projector, a Gemma-2B
// backbone over the prefix [images | language] and a gemma_300m action expert over the suffix
// [50 action tokens], joined by one attention per layer; flow-matching loss on the velocity.
// Parameter names follow openpi's PyTorch port (the names LeRobot's pi05 checkpoints use), so a
// checkpoint loads by name (trainer/README.md lists the mapping and the accepted legacy prefixes).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "trainer/config.hpp"

namespace fp8wire::trainer {

struct NamedParam {
  std::string name;
  at::Tensor tensor;
};

// One micro-batch on the model's device. Images stay uint8 until the model normalises them.
struct Batch {
  at::Tensor images;      // uint8 [B, num_images, H, W, 3] (num_images may be 0)
  at::Tensor image_mask;  // bool [B, num_images]: false = this sample lacks that camera
  at::Tensor tokens;      // int64 [B, max_token_len]
  at::Tensor token_mask;  // bool [B, max_token_len]: false = language padding
  at::Tensor actions;     // float32 [B, action_horizon, action_dim], normalised, zero-padded
  Batch to(at::Device device, bool non_blocking) const;
};

// --- pieces exposed for the tests -------------------------------------------------------------
// openpi's make_attn_mask: c = cumsum(ar); allowed(i, j) = c[j] <= c[i] && valid[i] && valid[j].
// ar, valid: [B, S] (ar integer or bool). Returns bool [B, S, S].
at::Tensor attention_allowed(const at::Tensor& ar, const at::Tensor& valid);
// Joint positions: cumsum(valid) - 1, int64 [B, S].
at::Tensor joint_positions(const at::Tensor& valid);
// RMSNorm in fp32: x * rsqrt(mean(x^2) + 1e-6) * (1 + w), cast back to x's dtype.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight);
struct AdaNormOut {
  at::Tensor y;     // norm(x) * (1 + scale) + shift
  at::Tensor gate;  // [B, 1, D], multiplies the residual branch
};
at::Tensor rms_normalize(const at::Tensor& x);  // no weight
// adaRMS's [scale, shift, gate], each fp32 [B, 1, D], from the condition through the dense layer.
std::vector<at::Tensor> ada_modulation(const at::Tensor& cond, const at::Tensor& dense_w, const at::Tensor& dense_b);
AdaNormOut ada_rms_norm(const at::Tensor& x, const at::Tensor& cond, const at::Tensor& dense_w,
                        const at::Tensor& dense_b);
// Rotary embedding of x [B, H, S, D] by cos/sin [B, 1, S, D/2] on the two halves, in fp32 as openpi.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// sincos(t, dim, min_period, max_period) as openpi's posemb_sincos: [B, dim], fp32.
at::Tensor sincos_time_embedding(const at::Tensor& t, int64_t dim, double min_period, double max_period);
// mean((v - (noise - actions))^2) in fp32.
at::Tensor flow_matching_loss(const at::Tensor& v, const at::Tensor& noise, const at::Tensor& actions);
// t = Beta(1.5, 1) * 0.999 + 0.001, drawn as u^(1/1.5) (Beta(a, 1) is the a-th root of a uniform).
at::Tensor sample_flow_time(int64_t batch, const at::Generator& gen, at::Device device);

enum class Remat { none, vision, layers };
Remat parse_remat(const std::string& name);

class Pi05Model {
 public:
  // Parameters are created on `device` in `dtype` (bf16 on GPU; the optimiser keeps fp32 masters),
  // initialised from `seed` by openpi's rules, identically on every rank.
  Pi05Model(const ModelConfig& config, int64_t num_images, int64_t max_token_len, at::ScalarType dtype,
            at::Device device, uint64_t seed);

  const std::vector<NamedParam>& parameters() const { return params_; }
  int64_t parameter_count() const;
  // Tensors openpi's checkpoints carry that no loss reaches and this model therefore does not
  // create: the last layer's prefix q_proj/o_proj/post-attention norm/MLP and the backbone's final norm
  // (the LM head is tied to the embedding). parameter_count() + this = openpi's 3.35 B.
  int64_t unreached_parameter_count() const;
  const ModelConfig& config() const { return cfg_; }
  at::ScalarType dtype() const { return dtype_; }
  // `every` = k checkpoints layers 0, k, 2k, ... of the covered towers (1 = all of them): the others
  // keep their activations, trading memory for the recomputation (trainer/README.md, "Throughput").
  void set_remat(Remat remat, int64_t every = 1) {
    remat_ = remat;
    remat_every_ = every < 1 ? 1 : every;
  }

  // The fused CUDA kernels (trainer/fused_ops.hpp) where they apply; false = ATen throughout.
  void set_fused_kernels(bool on) { fused_ = on; }

  // v_t for noisy actions x_t at flow time t. Batch tensors must be on the model's device.
  at::Tensor velocity(const Batch& batch, const at::Tensor& x_t, const at::Tensor& time) const;
  // The training loss for given noise [B, H, action_dim] and time [B].
  at::Tensor loss(const Batch& batch, const at::Tensor& noise, const at::Tensor& time) const;
  // Prefix embeddings and masks (exposed for tests): tokens [B, P, width], valid [B, P].
  std::pair<at::Tensor, at::Tensor> embed_prefix(const Batch& batch) const;
  // Forward FLOPs of one sample (matmuls and attention), for MFU.
  double forward_flops_per_sample() const;

 private:
  struct Linear { at::Tensor w, b; };  // w [out, in] as torch.nn.Linear; b may be undefined
  struct VisionLayer { at::Tensor ln1_w, ln1_b, ln2_w, ln2_b; Linear q, k, v, o, fc1, fc2; };
  struct ExpertWeights { at::Tensor ln1, ln2; Linear ada1, ada2, q, k, v, o, gate, up, down; };
  struct JointLayer { ExpertWeights prefix, suffix; bool prefix_tail = true; };

  at::Tensor add(const std::string& name, std::vector<int64_t> shape, const std::string& init, double scale = 0);
  Linear add_linear(const std::string& name, int64_t in, int64_t out, bool bias, const std::string& init);
  at::Tensor vision_layer(const VisionLayer& l, const at::Tensor& x) const;
  // The element-wise pieces, fused or ATen (see set_fused_kernels).
  at::Tensor norm(const at::Tensor& x, const at::Tensor& weight) const;
  AdaNormOut ada_norm(const at::Tensor& x, const at::Tensor& cond, const Linear& dense) const;
  at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const;
  at::Tensor gated_mlp(const ExpertWeights& e, const at::Tensor& h) const;
  std::vector<at::Tensor> joint_layer(const JointLayer& l, const at::Tensor& x_prefix, const at::Tensor& x_suffix,
                                      const at::Tensor& cond, const at::Tensor& mask, const at::Tensor& cos,
                                      const at::Tensor& sin) const;

  ModelConfig cfg_;
  int64_t num_images_;
  int64_t max_token_len_;
  at::ScalarType dtype_;
  at::Device device_;
  Remat remat_ = Remat::none;
  int64_t remat_every_ = 1;
  bool fused_ = true;
  std::vector<NamedParam> params_;
  // vision
  at::Tensor patch_w_, patch_b_, pos_emb_, post_ln_w_, post_ln_b_;
  std::vector<VisionLayer> vision_;
  Linear projector_;
  // language + joint layers
  at::Tensor embed_tokens_;
  std::vector<JointLayer> layers_;
  Linear expert_final_ada_;
  Linear action_in_, action_out_, time_in_, time_out_;
};

}  // namespace fp8wire::trainer
