// Data for the trainer: a safetensors reader/writer (the weights format of openpi's/LeRobot's PyTorch
// checkpoints, our own checkpoints, and our dataset shards), a deterministic synthetic LIBERO-shaped
// source, an on-disk shard source, and a loader thread that prepares batches ahead of compute.
#pragma once

#include <ATen/ATen.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trainer/config.hpp"
#include "trainer/model.hpp"

namespace fp8wire::trainer {

// --- safetensors: 8-byte little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets}, "__metadata__": {str: str}}, then the raw little-endian tensor bytes. --------------
using TensorMap = std::map<std::string, at::Tensor>;
using Metadata = std::map<std::string, std::string>;
// Returns "" or an error naming the file and what was wrong. Tensors are written contiguous from CPU.
std::string write_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata = {});
std::string read_safetensors(const std::string& path, TensorMap& tensors, Metadata* metadata = nullptr);

struct SafetensorsEntry {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // absolute file offset of the first byte
  uint64_t bytes = 0;
};
// Only the header: lets the shard source read one sample's rows without loading the whole file.
std::string read_safetensors_header(const std::string& path, std::map<std::string, SafetensorsEntry>& entries,
                                    Metadata* metadata = nullptr);

// --- sources -----------------------------------------------------------------------------------
// A source returns the samples [first, first + count) as a CPU batch; sample i is the same on every
// call and on every rank (that is what makes a data position resumable).
class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual Batch get(int64_t first, int64_t count) const = 0;
  virtual int64_t size() const = 0;  // samples (synthetic: unbounded, reported as INT64_MAX)
};

// LIBERO-shaped synthetic data: num_images cameras of camera_size^2 uint8, state_dim state values
// (also discretised into the prompt, as pi05 does), raw_action_dim actions padded to action_dim,
// action_horizon steps, prompts of varying length padded to max_token_len.
std::unique_ptr<DataSource> make_synthetic_source(const Config& config);
// Shards written by scripts/convert_lerobot_libero.py (format in trainer/README.md). Error text on
// failure, source in `out` on success.
std::string make_shard_source(const Config& config, std::unique_ptr<DataSource>& out);
// Writes `batch` as one shard file in the same format (the tests use it; so can a custom converter).
std::string write_shard(const std::string& path, const Batch& batch, int64_t raw_action_dim);

// Prepares batches for consecutive positions on a background thread, in pinned memory when the
// target is a GPU, and hands them over already copied with non_blocking, so loading overlaps compute.
class Loader {
 public:
  // Batch k holds samples [start + k*stride + offset, ... + micro_batch): stride = micro_batch *
  // world, offset = rank * micro_batch.
  Loader(const DataSource& source, int64_t micro_batch, int64_t world, int64_t rank, int64_t start_step,
         int64_t prefetch, at::Device device);
  ~Loader();
  Batch next();  // on the device

 private:
  void run();
  const DataSource& source_;
  int64_t micro_batch_, world_, rank_, next_step_, prefetch_;
  at::Device device_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  bool stop_ = false;
  std::string error_;
  std::thread thread_;
};

}  // namespace fp8wire::trainer
