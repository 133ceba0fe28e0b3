// Training: bucketed data-parallel gradient all-reduce over c10d, AdamW on fp32 master weights,
// the warmup + cosine schedule, checkpoints, and the step loop with NVTX ranges and JSON-lines logs.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "trainer/config.hpp"
#include "trainer/data.hpp"
#include "trainer/model.hpp"
#include "trainer/run.hpp"


namespace fp8wire::trainer {

struct StepStats {
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  int buckets = 0;                       // gradient buckets all-reduced this step
  int buckets_launched_in_backward = 0;  // of those, launched by gradient hooks (overlapping backward)
};

// warmup from peak/(warmup+1) to peak, then cosine to end_lr at decay_steps (optax's
// warmup_cosine_decay_schedule, as openpi). lr(0) > 0, so step 0 updates.
double learning_rate(const TrainConfig& t, int64_t step);

// Gradient buckets as the trainer cuts them: parameter indices per bucket, in launch order (the
// parameters in reverse registration order, a new bucket whenever the next one would pass
// `cap_bytes`; one bucket alone may exceed it when a single tensor does). Bytes count the
// parameters' own dtype, which is the dtype the bucket is all-reduced in (bf16 on the GPU).
std::vector<std::vector<size_t>> cut_buckets(const std::vector<NamedParam>& params, double cap_bytes);
// The cap in bytes for a config: train.bucket_cap_mb MiB with "overlap", unlimited (one bucket)
// with "after_backward".
double bucket_cap_bytes(const TrainConfig& t);

class GradientBuckets;

class Trainer {
 public:
  // `pg` may be null (one rank). The model is built here from config (seeded identically on every
  // rank), then optionally loaded from train.init_weights and train.resume.
  Trainer(const Config& config, int rank, int world, c10::intrusive_ptr<c10d::Backend> pg);
  ~Trainer();

  // One optimiser step on `batch` (on the model's device). Noise and time are drawn from the
  // trainer's generator unless given (the tests fix them to overfit one batch).
  StepStats step(const Batch& batch);
  StepStats step(const Batch& batch, const at::Tensor& noise, const at::Tensor& time);

  int64_t steps_done() const { return step_; }
  Pi05Model& model() { return *model_; }
  at::Device device() const { return device_; }

  // The order this run's samples follow (make_sample_order); the default is an unbounded source in
  // dataset order (the synthetic source). Set it before resume(), which checks it.
  void set_sample_order(const SampleOrder& order) { order_ = order; }
  // Where the data stream stands after steps_done() steps of micro_batch x world samples.
  DataPosition data_position() const;

  // Own checkpoints: fp32 masters, AdamW moments, step, generator state, data position (epoch and
  // offset in the sample order) (safetensors + metadata). resume() refuses a checkpoint whose data
  // order or position this run could not continue exactly (another world size, micro-batch, dataset
  // size, data.shuffle, or train.seed when shuffling).
  std::string save(const std::string& path) const;
  std::string resume(const std::string& path);
  // openpi/LeRobot Pi0.5 PyTorch weights by name (trainer/README.md); "" or an error.
  std::string load_weights(const std::string& path);
  // {sum, sum of squares} of the fp32 masters and of the device parameters, as doubles.
  std::vector<double> parameter_checksum() const;
  // The fp32 master copy of parameter `index` (in model().parameters() order), shaped like it: the
  // optimiser updates this, the device parameter is its rounding to the compute dtype.
  at::Tensor master(size_t index) const;
  // Bytes of each gradient bucket as all-reduced, in launch order.
  std::vector<int64_t> bucket_bytes() const;

 private:
  void sync_params_from_masters();
  // "" when a checkpoint's data metadata continues this run's sample order exactly at `step`.
  std::string check_data_position(Metadata& meta, int64_t step) const;
  Config cfg_;
  int rank_, world_;
  at::Device device_;
  std::unique_ptr<Pi05Model> model_;
  std::unique_ptr<GradientBuckets> buckets_;
  at::Generator gen_;
  int64_t step_ = 0;
  SampleOrder order_;
};


}  // namespace fp8wire::trainer
