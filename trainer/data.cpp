#include "trainer/data.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/input_limits.hpp"
#include "common/output_file.hpp"
#include "trainer/safetensors_header.hpp"

namespace fp8wire::trainer {

using at::Tensor;
namespace fs = std::filesystem;

namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},    {at::kBool, "BOOL"},
};

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  return nullptr;
}

bool dtype_from_name(const std::string& name, at::ScalarType& out) {
  for (const auto& d : kDtypes)
    if (name == d.name) {
      out = d.type;
      return true;
    }
  return false;
}

// Reads exactly `bytes` at `offset`; pread so the loader thread needs no shared file position.
bool read_at(int fd, void* dst, uint64_t bytes, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n <= 0) return false;
    p += n;
    bytes -= uint64_t(n);
    offset += uint64_t(n);
  }
  return true;
}

struct Fd {
  int fd = -1;
  explicit Fd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

namespace {

// The checksum this trainer writes into every safetensors file (__metadata__.fp8wire_crc32, 8 hex
// digits) and verifies when it reads one back: CRC-32 (zlib) of the header in canonical form (keys
// sorted, no spaces, the checksum entry left out), then of every tensor's bytes in file order. A
// flipped bit anywhere in the header's names, shapes, offsets and metadata or in the tensor data
// changes it.
uint32_t header_crc(nlohmann::json header) {
  if (auto m = header.find("__metadata__"); m != header.end() && m->is_object()) m->erase(kChecksumKey);
  const std::string canonical = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return static_cast<uint32_t>(crc32_z(0, reinterpret_cast<const Bytef*>(canonical.data()), canonical.size()));
}

uint32_t data_crc(uint32_t crc, const void* data, uint64_t bytes) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), static_cast<z_size_t>(bytes)));
}

std::string crc_text(uint32_t crc) { return fmt::format("{:08x}", crc); }

// The header, read and checked entry by entry (safetensors_header.hpp); every error names the file
// and the entry. The parsed JSON is returned for the checksum.
std::string parse_header(const std::string& path, int fd, std::map<std::string, SafetensorsEntry>& entries,
                         Metadata* metadata, nlohmann::json& header) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fmt::format("{}: cannot stat: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fmt::format("{}: not a regular file", path);
  const uint64_t file_size = uint64_t(st.st_size);
  unsigned char len[8];
  if (file_size < 8 || !read_at(fd, len, 8, 0))
    return fmt::format("{}: shorter than the 8-byte header length: not a safetensors file", path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
  if (n > file_size - 8)
    return fmt::format("{}: header length {} does not fit the file ({} bytes): not a safetensors file", path, n, file_size);
  if (n > kMaxSafetensorsHeaderBytes)  // before the header is read into memory
    return fmt::format("{}: a header of {} bytes, more than the limit of {}", path, n,
                       bytes_and_mib(kMaxSafetensorsHeaderBytes));
  std::string text(n, '\0');
  if (!read_at(fd, text.data(), n, 8)) return fmt::format("{}: cannot read the header", path);
  std::map<std::string, SafetensorsHeaderEntry> parsed;
  if (auto err = parse_safetensors_header(path, text, file_size, parsed, metadata, header); !err.empty()) return err;
  for (auto& [name, p] : parsed) {
    SafetensorsEntry entry;
    if (!dtype_from_name(p.dtype, entry.dtype) || c10::elementSize(entry.dtype) != safetensors_element_bytes(p.dtype))
      return fmt::format("{}: tensor '{}': dtype '{}' has no LibTorch type of its size here", path, name, p.dtype);
    entry.shape = std::move(p.shape);
    entry.begin = p.begin;
    entry.bytes = p.bytes;
    entries[name] = std::move(entry);
  }
  return "";
}

}  // namespace

std::string write_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata) {
  nlohmann::ordered_json header;
  header["__metadata__"] = metadata;
  std::vector<Tensor> blobs;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const char* dt = dtype_name(tensor.scalar_type());
    if (!dt) return fmt::format("{}: tensor '{}' has dtype {}, which safetensors cannot hold", path, name,
                                c10::toString(tensor.scalar_type()));
    Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = uint64_t(cpu.nbytes());
    header[name] = {{"dtype", dt}, {"shape", cpu.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    blobs.push_back(cpu);
  }
  uint32_t crc = header_crc(nlohmann::json::parse(header.dump()));
  for (const auto& b : blobs) crc = data_crc(crc, b.data_ptr(), uint64_t(b.nbytes()));
  header["__metadata__"][kChecksumKey] = crc_text(crc);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format pads the header with spaces to 8 bytes
  // Written beside the target and renamed over it (common/output_file.hpp), so a crash never leaves a
  // truncated checkpoint, and a symbolic link planted at the path is refused.
  std::string error;
  const bool written = write_file_atomically(
      path,
      [&](FILE* out) {
        const uint64_t n = text.size();
        unsigned char len[8];
        for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
        bool ok = std::fwrite(len, 1, 8, out) == 8 && std::fwrite(text.data(), 1, text.size(), out) == text.size();
        for (const auto& b : blobs)
          ok = ok && std::fwrite(b.data_ptr(), 1, b.nbytes(), out) == b.nbytes();
        return ok;
      },
      error);
  return written ? "" : error;
}

std::string read_safetensors_header(const std::string& path, std::map<std::string, SafetensorsEntry>& entries,
                                    Metadata* metadata) {
  Fd f(path);
  if (f.fd < 0) return fmt::format("{}: cannot open: {}", path, std::strerror(errno));
  nlohmann::json header;
  return parse_header(path, f.fd, entries, metadata, header);
}

std::string read_safetensors(const std::string& path, TensorMap& tensors, Metadata* metadata, bool* verified) {
  if (verified) *verified = false;
  Fd f(path);
  if (f.fd < 0) return fmt::format("{}: cannot open: {}", path, std::strerror(errno));
  std::map<std::string, SafetensorsEntry> entries;
  Metadata meta;
  nlohmann::json header;
  if (auto err = parse_header(path, f.fd, entries, &meta, header); !err.empty()) return err;
  TensorMap loaded;
  for (const auto& [name, e] : entries) {
    Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    if (!read_at(f.fd, t.data_ptr(), e.bytes, e.begin)) return fmt::format("{}: cannot read tensor '{}'", path, name);
    loaded[name] = t;
  }
  if (auto stored = meta.find(kChecksumKey); stored != meta.end()) {
    std::vector<std::pair<uint64_t, const std::string*>> order;  // tensors in file order
    for (const auto& [name, e] : entries) order.emplace_back(e.begin, &name);
    std::sort(order.begin(), order.end());
    uint32_t crc = header_crc(header);
    for (const auto& [begin, name] : order) {
      const Tensor& t = loaded.at(*name);
      crc = data_crc(crc, t.data_ptr(), uint64_t(t.nbytes()));
    }
    if (stored->second != crc_text(crc))
      return fmt::format("{}: checksum mismatch ({} {}, computed {}): the file is damaged", path, kChecksumKey,
                         stored->second, crc_text(crc));
    if (verified) *verified = true;
  }
  for (auto& [name, t] : loaded) tensors[name] = std::move(t);
  if (metadata)
    for (auto& [k, v] : meta) (*metadata)[k] = std::move(v);
  return "";
}

// --- synthetic source --------------------------------------------------------------------------

namespace {

// A batch of `count` samples on the host, before a source fills it: images unwritten (every source
// writes every pixel), every camera present, no tokens, zero actions (padding to action_dim stays 0).
Batch host_batch(const Config& cfg, int64_t count) {
  const auto& d = cfg.data;
  const auto& m = cfg.model;
  Batch b;
  b.images = at::empty({count, d.num_images, d.camera_size, d.camera_size, 3}, at::kByte);
  b.image_mask = at::ones({count, d.num_images}, at::kBool);
  b.tokens = at::zeros({count, d.max_token_len}, at::kLong);
  b.token_mask = at::zeros({count, d.max_token_len}, at::kBool);
  b.actions = at::zeros({count, m.action_horizon, m.action_dim}, at::kFloat);
  return b;
}

class SyntheticSource : public DataSource {
 public:
  explicit SyntheticSource(const Config& c) : cfg_(c) {}
  int64_t size() const override { return kUnboundedSource; }

  Batch get(const std::vector<int64_t>& indices) const override {
    const int64_t count = int64_t(indices.size());
    Batch b = host_batch(cfg_, count);
    for (int64_t i = 0; i < count; ++i) {
      if (indices[size_t(i)] < 0)
        throw std::out_of_range(fmt::format("synthetic source: sample index {} is negative", indices[size_t(i)]));
      fill(indices[size_t(i)], b, i);
    }
    return b;
  }

 private:
  // Sample `index` depends only on (seed, index). Actions are a smooth function of the state so
  // the model has something to learn; the state also appears, discretised, among the prompt tokens.
  void fill(int64_t index, Batch& b, int64_t row) const {
    const auto& d = cfg_.data;
    const auto& m = cfg_.model;
    at::Generator gen = at::detail::createCPUGenerator(cfg_.train.seed * 0x9E3779B97F4A7C15ull + uint64_t(index) + 1);
    if (d.num_images > 0) b.images[row].copy_(at::randint(0, 256, b.images[row].sizes(), gen, at::kByte));
    Tensor state = at::randn({d.state_dim}, gen, at::kFloat).clamp(-1, 1);
    // LIBERO prompts are short: 1..24 words here, then the discretised state, then padding.
    const int64_t words = 1 + index % std::max<int64_t>(1, std::min<int64_t>(24, d.max_token_len / 2));
    const int64_t state_tokens = std::min<int64_t>(d.state_dim, d.max_token_len - words);
    Tensor tokens = b.tokens[row];
    tokens.narrow(0, 0, words).copy_(at::randint(1, m.vocab_size, {words}, gen, at::kLong));
    if (state_tokens > 0) {
      // 256 bins in [-1, 1] mapped onto the top of the vocabulary, as pi05's discrete state prompt.
      Tensor bins = ((state.narrow(0, 0, state_tokens) + 1) * 127.5).floor().clamp(0, 255).to(at::kLong);
      tokens.narrow(0, words, state_tokens).copy_(std::max<int64_t>(m.vocab_size - 256, 0) + bins % m.vocab_size);
    }
    b.token_mask[row].narrow(0, 0, words + state_tokens).fill_(true);
    Tensor h = at::arange(m.action_horizon, at::kFloat).unsqueeze(1);            // [H, 1]
    Tensor dims = at::arange(d.raw_action_dim, at::kFloat).unsqueeze(0);         // [1, A]
    Tensor s0 = state.index({at::remainder(at::arange(d.raw_action_dim), d.state_dim)}).unsqueeze(0);
    Tensor s1 = state.index({at::remainder(at::arange(1, d.raw_action_dim + 1), d.state_dim)}).unsqueeze(0);
    Tensor actions = at::tanh(s0 + 0.5 * at::sin(0.2 * h * (dims + 1) + 3.0 * s1));
    b.actions[row].narrow(1, 0, d.raw_action_dim).copy_(actions);
  }
  Config cfg_;
};

// Shard records: see trainer/README.md. Each sample is read row by row with pread.
class ShardSource : public DataSource {
 public:
  struct Shard {
    std::string path;
    int64_t samples = 0;
    std::map<std::string, SafetensorsEntry> entries;
  };
  ShardSource(const Config& c, std::vector<Shard> shards) : cfg_(c), shards_(std::move(shards)) {
    for (const auto& s : shards_) {
      starts_.push_back(total_);
      total_ += s.samples;
    }
  }
  int64_t size() const override { return total_; }

  Batch get(const std::vector<int64_t>& indices) const override {
    const int64_t count = int64_t(indices.size());
    Batch b = host_batch(cfg_, count);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t index = indices[size_t(i)];
      if (index < 0 || index >= total_)
        throw std::out_of_range(
            fmt::format("shard source: sample index {} is outside [0, {}) (data.shard_dir)", index, total_));
      const size_t s = size_t(std::upper_bound(starts_.begin(), starts_.end(), index) - starts_.begin() - 1);
      const int64_t local = index - starts_[s];
      const Shard& shard = shards_[s];
      Fd f(shard.path);
      auto row = [&](const char* key, const Tensor& dst) {
        const auto& e = shard.entries.at(key);
        const uint64_t bytes = e.bytes / uint64_t(e.shape[0]);
        Tensor tmp = at::empty(dst.sizes(), at::TensorOptions().dtype(e.dtype));
        if (bytes != uint64_t(tmp.nbytes()) || !read_at(f.fd, tmp.data_ptr(), bytes, e.begin + bytes * uint64_t(local)))
          throw std::runtime_error(fmt::format("{}: cannot read sample {} of '{}'", shard.path, local, key));
        dst.copy_(tmp);
      };
      row("images", b.images[i]);
      row("image_mask", b.image_mask[i]);
      row("tokens", b.tokens[i]);
      row("token_mask", b.token_mask[i]);
      row("actions", b.actions[i].narrow(1, 0, cfg_.data.raw_action_dim));
    }
    return b;
  }

 private:
  Config cfg_;
  std::vector<Shard> shards_;
  std::vector<int64_t> starts_;
  int64_t total_ = 0;
};

}  // namespace

Batch DataSource::get(int64_t first, int64_t count) const {
  std::vector<int64_t> indices(size_t(std::max<int64_t>(count, 0)));
  std::iota(indices.begin(), indices.end(), first);
  return get(indices);
}

std::unique_ptr<DataSource> make_synthetic_source(const Config& config) {
  return std::make_unique<SyntheticSource>(config);
}

std::string make_shard_source(const Config& config, std::unique_ptr<DataSource>& out) {
  const auto& d = config.data;
  std::error_code ec;
  if (!fs::is_directory(d.shard_dir, ec))
    return fmt::format("data.shard_dir: '{}' is not a directory", d.shard_dir);
  std::vector<std::string> paths;
  for (const auto& e : fs::directory_iterator(d.shard_dir))
    if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) return fmt::format("data.shard_dir: '{}' holds no *.safetensors shard", d.shard_dir);
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"images", {d.num_images, d.camera_size, d.camera_size, 3}},
      {"image_mask", {d.num_images}},
      {"tokens", {d.max_token_len}},
      {"token_mask", {d.max_token_len}},
      {"actions", {config.model.action_horizon, d.raw_action_dim}},
  };
  const std::map<std::string, std::vector<at::ScalarType>> dtypes = {
      {"images", {at::kByte}}, {"image_mask", {at::kBool}}, {"tokens", {at::kInt, at::kLong}},
      {"token_mask", {at::kBool}}, {"actions", {at::kFloat}}};
  std::vector<ShardSource::Shard> shards;
  for (const auto& p : paths) {
    ShardSource::Shard s;
    s.path = p;
    Metadata meta;
    if (auto err = read_safetensors_header(p, s.entries, &meta); !err.empty()) return err;
    if (meta["format"] != "fp8wire-libero-v1")
      return fmt::format("{}: __metadata__.format is '{}', expected 'fp8wire-libero-v1'", p, meta["format"]);
    for (const auto& [key, row_shape] : expected) {
      auto it = s.entries.find(key);
      if (it == s.entries.end()) return fmt::format("{}: missing tensor '{}'", p, key);
      const std::vector<int64_t>& shape = it->second.shape;
      // One leading sample dimension, then the row; anything else (a scalar, a missing dimension)
      // would be read out of bounds.
      if (shape.size() != row_shape.size() + 1)
        return fmt::format("{}: tensor '{}' has shape [{}], expected [samples, {}] (data.num_images, data.camera_size, "
                           "data.max_token_len, model.action_horizon, data.raw_action_dim)", p, key,
                           fmt::join(shape, ", "), fmt::join(row_shape, ", "));
      const auto allowed = dtypes.at(key);
      if (std::find(allowed.begin(), allowed.end(), it->second.dtype) == allowed.end())
        return fmt::format("{}: tensor '{}' has dtype {}, expected {}", p, key, dtype_name(it->second.dtype),
                           key == "tokens" ? "I32 or I64" : dtype_name(allowed.front()));
      std::vector<int64_t> got(shape.begin() + 1, shape.end());
      if (got != row_shape)
        return fmt::format("{}: tensor '{}' has rows of shape [{}], expected [{}] from the config (data.num_images, "
                           "data.camera_size, data.max_token_len, model.action_horizon, data.raw_action_dim)", p, key,
                           fmt::join(got, ", "), fmt::join(row_shape, ", "));
      if (s.samples == 0) s.samples = it->second.shape[0];
      if (it->second.shape[0] != s.samples) return fmt::format("{}: tensor '{}' has a different sample count", p, key);
    }
    shards.push_back(std::move(s));
  }
  int64_t total = 0;
  for (const auto& s : shards) total += s.samples;
  if (total == 0) return fmt::format("data.shard_dir: '{}' holds shards without any sample", d.shard_dir);
  out = std::make_unique<ShardSource>(config, std::move(shards));
  return "";
}

std::string write_shard(const std::string& path, const Batch& batch, int64_t raw_action_dim) {
  TensorMap t = {
      {"images", batch.images.to(at::kByte)},
      {"image_mask", batch.image_mask.to(at::kBool)},
      {"tokens", batch.tokens.to(at::kInt)},
      {"token_mask", batch.token_mask.to(at::kBool)},
      {"actions", batch.actions.narrow(2, 0, raw_action_dim).to(at::kFloat)},
  };
  return write_safetensors(path, t, {{"format", "fp8wire-libero-v1"}});
}

// --- sample order ------------------------------------------------------------------------------

DataPosition SampleOrder::position(int64_t consumed) const {
  if (epoch_samples == kUnboundedSource) return {0, consumed};
  return {consumed / epoch_samples, consumed % epoch_samples};
}

int64_t SampleOrder::consumed(const DataPosition& p) const {
  if (epoch_samples == kUnboundedSource) return p.offset;
  return p.epoch * epoch_samples + p.offset;
}

SampleOrder make_sample_order(const Config& config, const DataSource& source) {
  const int64_t size = source.size();
  return {size, config.data.shuffle && size != kUnboundedSource, config.train.seed};
}

namespace {
// Uniform in [0, n) without modulo bias: draws below 2^64 mod n are rejected, so the accepted range
// is a whole number of copies of [0, n).
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t reject_below = (0 - n) % n;  // == 2^64 mod n
  uint64_t x;
  do x = rng();
  while (x < reject_below);
  return x % n;
}
}  // namespace

std::vector<int64_t> epoch_permutation(int64_t size, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(size_t(std::max<int64_t>(size, 0)));
  std::iota(order.begin(), order.end(), int64_t{0});
  // All 64 bits of seed and epoch enter the state ("seed + epoch" would make seed 1 epoch 0 the same as
  // seed 0 epoch 1); the last word keeps these streams apart from any other use of the same seed.
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(uint64_t(epoch)), uint32_t(uint64_t(epoch) >> 32),
                    0x5348'5546u};
  std::mt19937_64 rng(seq);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[uniform_below(rng, i)]);
  return order;
}

std::vector<int64_t> SampleStream::indices(int64_t first, int64_t count) {
  std::vector<int64_t> out(size_t(std::max<int64_t>(count, 0)));
  for (size_t i = 0; i < out.size(); ++i) {
    const DataPosition p = order_.position(first + int64_t(i));
    if (!order_.shuffle) {
      out[i] = p.offset;
      continue;
    }
    if (p.epoch != cached_epoch_) {
      permutation_ = epoch_permutation(order_.epoch_samples, order_.seed, p.epoch);
      cached_epoch_ = p.epoch;
    }
    out[i] = permutation_[size_t(p.offset)];
  }
  return out;
}

// --- loader ------------------------------------------------------------------------------------

Loader::Loader(const DataSource& source, const SampleOrder& order, int64_t micro_batch, int64_t world, int64_t rank,
               int64_t start_step, int64_t prefetch, at::Device device)
    : source_(source), stream_(order), micro_batch_(micro_batch), world_(world), rank_(rank), next_step_(start_step),
      prefetch_(prefetch), device_(device) {
  thread_ = std::thread([this] { run(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Loader::run() {
  try {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || int64_t(ready_.size()) < prefetch_; });
        if (stop_) return;
      }
      const int64_t first = next_step_ * micro_batch_ * world_ + rank_ * micro_batch_;
      Batch b = source_.get(stream_.indices(first, micro_batch_));
      if (device_.is_cuda()) {
        // Pinned host memory makes the copy below asynchronous with respect to the compute stream.
        b = Batch{b.images.pin_memory(), b.image_mask.pin_memory(), b.tokens.pin_memory(),
                  b.token_mask.pin_memory(), b.actions.pin_memory()};
      }
      ++next_step_;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ready_.push_back(std::move(b));
      }
      cv_.notify_all();
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = e.what();
    cv_.notify_all();
  }
}

Batch Loader::next() {
  Batch host;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !ready_.empty() || !error_.empty(); });
    if (ready_.empty()) throw std::runtime_error("data loader: " + error_);
    host = std::move(ready_.front());
    ready_.pop_front();
  }
  cv_.notify_all();
  // The pinned buffers stay alive through the batch's tensors until the copies have been consumed.
  return host.to(device_, /*non_blocking=*/device_.is_cuda());
}

}  // namespace fp8wire::trainer
