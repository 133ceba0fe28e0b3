// Data for the trainer: a safetensors reader/writer (the weights format of openpi's/LeRobot's PyTorch
// checkpoints, our own checkpoints, and our dataset shards), a deterministic synthetic LIBERO-shaped
// source, an on-disk shard source, and a loader thread that prepares batches ahead of compute.
#pragma once

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <limits>
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
// Returns "" or an error naming the file and what was wrong. Tensors are written contiguous from CPU,
// with a checksum in __metadata__[kChecksumKey] (CRC-32 of the canonical header and every tensor's
// bytes, data.cpp); read_safetensors verifies it where present (files of other tools have none) and
// sets *verified. A damaged header (wrong JSON types, sizes that overflow or overrun the file) is an
// error naming the file and the entry.
inline constexpr const char* kChecksumKey = "fp8wire_crc32";
std::string write_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata = {});
std::string read_safetensors(const std::string& path, TensorMap& tensors, Metadata* metadata = nullptr,
                             bool* verified = nullptr);

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
// A source returns the samples it is asked for as a CPU batch, in the order asked; sample i is the
// same on every call and on every rank (that is what makes a data position resumable).
inline constexpr int64_t kUnboundedSource = std::numeric_limits<int64_t>::max();
class DataSource {
 public:
  virtual ~DataSource() = default;
  // indices in [0, size()); an index outside is an error (std::out_of_range naming it).
  virtual Batch get(const std::vector<int64_t>& indices) const = 0;
  virtual int64_t size() const = 0;  // samples (synthetic: unbounded, reported as kUnboundedSource)
  // The samples [first, first + count), in dataset order.
  Batch get(int64_t first, int64_t count) const;
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

// --- sample order -------------------------------------------------------------------------------
// The order in which a run visits a source's samples: one stream of epochs, epoch e being the whole
// dataset in the order of epoch_permutation(size, seed, e) (or in dataset order without shuffling).
// Global batch k is the stream positions [k*G, (k+1)*G) with G = micro_batch * world, rank r taking
// [k*G + r*micro_batch, +micro_batch): the ranks' slices of a batch are disjoint and together are the
// batch, as with PyTorch's DistributedSampler (which interleaves ranks instead of cutting blocks; the
// samples of each global batch are the same). Epochs are concatenated, not padded or truncated, so a
// batch may straddle two epochs and no sample is ever dropped; every rank computes the same order
// from (size, seed, epoch) alone, so nothing is communicated.
struct DataPosition {
  int64_t epoch = 0;   // epochs completed
  int64_t offset = 0;  // samples of this epoch's order already consumed by all ranks together
  bool operator==(const DataPosition&) const = default;
};

struct SampleOrder {
  int64_t epoch_samples = kUnboundedSource;  // the source's size; unbounded sources have one endless epoch
  bool shuffle = false;
  uint64_t seed = 0;

  // Where the stream stands after `consumed` samples, and back.
  DataPosition position(int64_t consumed) const;
  int64_t consumed(const DataPosition& position) const;
};
// data.shuffle applies to sources with a finite size (shards). The synthetic source is unbounded and
// its samples are already independent draws of (seed, index): it keeps dataset order.
SampleOrder make_sample_order(const Config& config, const DataSource& source);

// A permutation of [0, size) that depends only on (size, seed, epoch), identical on every platform:
// Fisher-Yates driven by std::mt19937_64 (whose output the C++ standard fixes) seeded through
// std::seed_seq (also fixed), with an unbiased bounded draw of our own (std::uniform_int_distribution
// differs between standard libraries).
std::vector<int64_t> epoch_permutation(int64_t size, uint64_t seed, int64_t epoch);

// Maps stream positions to sample indices, keeping the current epoch's permutation (a few MiB for
// LIBERO's ~270k frames, regenerated in milliseconds once per epoch). Not thread-safe: one per loader.
class SampleStream {
 public:
  explicit SampleStream(SampleOrder order) : order_(order) {}
  // The sample indices at stream positions [first, first + count).
  std::vector<int64_t> indices(int64_t first, int64_t count);
  const SampleOrder& order() const { return order_; }

 private:
  SampleOrder order_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> permutation_;
};

// Prepares batches for consecutive positions on a background thread, in pinned memory when the
// target is a GPU, and hands them over already copied with non_blocking, so loading overlaps compute.
class Loader {
 public:
  // The i-th batch delivered is rank `rank`'s slice of global batch start_step + i of `order` (see
  // SampleOrder): stream positions [(start_step + i)*G + rank*micro_batch, +micro_batch), G = micro_batch
  // * world. Permutations are drawn on the loader thread, so a new epoch costs compute nothing.
  Loader(const DataSource& source, const SampleOrder& order, int64_t micro_batch, int64_t world, int64_t rank,
         int64_t start_step, int64_t prefetch, at::Device device);
  ~Loader();
  Batch next();  // on the device

 private:
  void run();
  const DataSource& source_;
  SampleStream stream_;
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
