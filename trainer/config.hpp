// Configuration of the Pi0.5 reference trainer: every dimension, data and optimiser knob in one
// struct, filled from defaults, then a TOML preset (trainer/configs/*.toml), then --set key=value
// overrides. Keys are "<section>.<field>" (model., data., train.); an unknown key or a value of the
// wrong type is an error naming the key, the value and what was expected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp8wire::trainer {

struct ModelConfig {
  // SigLIP So400m/14 vision tower; its projector maps vision_width -> width.
  int64_t image_size = 224;
  int64_t patch_size = 14;
  int64_t vision_width = 1152;
  int64_t vision_depth = 27;
  int64_t vision_mlp = 4304;
  int64_t vision_heads = 16;
  // Gemma-2B backbone (prefix: image and language tokens).
  int64_t vocab_size = 257152;
  int64_t width = 2048;
  int64_t depth = 18;  // the action expert has the same depth: one joint attention per layer
  int64_t mlp = 16384;
  int64_t heads = 8;
  int64_t kv_heads = 1;
  int64_t head_dim = 256;
  // gemma_300m action expert (suffix: action tokens), adaRMSNorm conditioned on the flow time.
  int64_t expert_width = 1024;
  int64_t expert_mlp = 4096;
  int64_t action_dim = 32;      // actions padded to this width
  int64_t action_horizon = 50;  // tokens in the suffix
  double rope_base = 10000.0;
  double time_min_period = 4e-3;
  double time_max_period = 4.0;
};

struct DataConfig {
  std::string source = "synthetic";  // "synthetic" or "shards"
  std::string shard_dir;             // for source = "shards" (trainer/README.md describes the format)
  int64_t num_images = 2;            // camera slots allocated; no slot is computed for a missing camera
  int64_t camera_size = 256;         // raw uint8 frames, resized to model.image_size on the device
  int64_t state_dim = 8;
  int64_t raw_action_dim = 7;        // padded with zeros to model.action_dim
  int64_t max_token_len = 200;       // prompt tokens (language padding is masked)
  int64_t prefetch = 2;              // batches prepared ahead by the loader thread
  // Visit shard samples in a fresh permutation every epoch, seeded by train.seed and the epoch (as
  // openpi's shuffling loader); false keeps dataset order (consecutive frames of one episode per
  // batch). The synthetic source ignores it: its samples are independent draws already.
  bool shuffle = true;
};

struct TrainConfig {
  std::string device = "cuda";  // "cuda" or "cpu" (cpu: one rank, fp32; used by the tests)
  std::string dtype = "bf16";   // compute/parameter/gradient dtype on the device ("bf16" or "fp32")
  int64_t micro_batch = 32;
  int64_t steps = 10;
  uint64_t seed = 0;
  // AdamW with warmup + cosine (openpi's defaults).
  double peak_lr = 2.5e-5;
  double end_lr = 2.5e-6;
  int64_t warmup_steps = 1000;
  int64_t decay_steps = 30000;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 1e-10;
  double clip_norm = 1.0;
  // Activation checkpointing: "none", "vision" (vision tower layers) or "layers" (every layer).
  std::string remat = "none";
  // The trainer's CUDA kernels for RMSNorm/adaRMS, RoPE and the gated GELU (trainer/fused_ops.hpp)
  // instead of ATen's element-wise ops through fp32 temporaries; bf16 on CUDA only (elsewhere the
  // ATen path runs whatever this says). false = the ATen reference path.
  bool fused_kernels = true;
  // 1 = checkpoint every layer the policy covers; k = only layers 0, k, 2k, ... (less recompute,
  // more activation memory: pi05 at micro-batch 32 fits k = 2 on an H200, trainer/README.md).
  int64_t remat_every = 1;
  // Gradient all-reduce: "overlap" (buckets launch during backward) or "after_backward" (one
  // bucket after backward: docs/DESIGN.md, "The lesson"). "skip" is a measurement switch: the buckets of
  // "overlap" but no all-reduce, so the ranks run side by side with free communication (each then
  // trains on its own gradients, and the end-of-run sync check is skipped).
  std::string allreduce = "overlap";
  double bucket_cap_mb = 25.0;
  std::string log_jsonl;        // per-step JSON lines ("" = <out_dir>/train_log.jsonl on rank 0)
  std::string out_dir = "out/train";
  int64_t log_every = 1;
  std::string init_weights;     // optional safetensors checkpoint of openpi's/LeRobot's Pi0.5
  std::string save_path;        // own checkpoint written at the end ("" = none)
  int64_t save_every = 0;       // also every N steps (0 = only at the end)
  std::string resume;           // own checkpoint to resume from
  bool check_sync = true;       // compare parameter checksums across ranks at the end
  double peak_tflops = 989.0;   // denominator of MFU (H200 dense bf16)
  bool plot = true;             // rank 0 draws <out_dir>/loss.png with scripts/plot_loss.py at the end
  // Where the step's time goes: rank 0 records steps [profile_from, profile_from + profile_steps)
  // with LibTorch's profiler (CPU ops and every GPU kernel) into <out_dir>/torch_trace.json, which
  // scripts/kernel_breakdown.py sums by kernel family. -1 = off.
  int64_t profile_from = -1;
  int64_t profile_steps = 2;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  std::string preset_name = "default";

  int64_t image_tokens_per_camera() const {
    const int64_t side = model.image_size / model.patch_size;
    return side * side;
  }
  int64_t prefix_len() const { return data.num_images * image_tokens_per_camera() + data.max_token_len; }
  int64_t seq_len() const { return prefix_len() + model.action_horizon; }
};

// Each returns "" on success or the error message (nothing here throws to the caller).
// A preset (file or string) is validated as a whole; overrides are only parsed and typed, so that
// several of them may move related keys together (data.raw_action_dim with model.action_dim): call
// validate() once after the last one.
std::string load_config_file(const std::string& path, Config& config);
std::string load_config_string(const std::string& toml_text, Config& config);
std::string apply_override(const std::string& key_equals_value, Config& config);
std::string validate(const Config& config);
// "section.key = value" lines, for the run log.
std::string describe(const Config& config);

}  // namespace fp8wire::trainer
