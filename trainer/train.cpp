#include "trainer/train.hpp"

#include <nvtx3/nvToolsExt.h>

#include <dlfcn.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "common/output_file.hpp"
#include "shim/fp8wire.h"
#include "trainer/data.hpp"

namespace fp8wire::trainer {

using at::Tensor;
namespace fs = std::filesystem;

namespace {

bool parse_int(const std::string& text, int64_t& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

// v2: v1 plus the checksum (data.hpp kChecksumKey), which resume() requires.
constexpr const char* kCheckpointFormat = "fp8wire-trainer-v2";
// The first steps of a run pay for allocator warm-up and NCCL setup; the summary's means leave them out.
constexpr int64_t kUntimedSteps = 2;

// The epoch length as checkpoints record it; unbounded sources have no epoch boundary.
std::string epoch_samples_text(const SampleOrder& order) {
  return order.epoch_samples == kUnboundedSource ? "unbounded" : std::to_string(order.epoch_samples);
}

// Phase ranges for Nsight and for fp8wire's profiler, which finds step windows by the name "step".
struct NvtxRange {
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

void device_synchronize(at::Device device) {
#ifdef USE_C10D_NCCL
  if (device.is_cuda()) c10::cuda::device_synchronize();
#else
  (void)device;
#endif
}

// Names in openpi/LeRobot checkpoints written by older transformers versions, mapped to ours.
std::string canonical_name(std::string name) {
  static const std::pair<const char*, const char*> kAliases[] = {
      {"paligemma_with_expert.paligemma.language_model.model.", "paligemma_with_expert.paligemma.model.language_model."},
      {"paligemma_with_expert.paligemma.language_model.", "paligemma_with_expert.paligemma.model.language_model."},
      {"paligemma_with_expert.paligemma.vision_tower.", "paligemma_with_expert.paligemma.model.vision_tower."},
      {"paligemma_with_expert.paligemma.multi_modal_projector.",
       "paligemma_with_expert.paligemma.model.multi_modal_projector."},
  };
  if (name.rfind("model.", 0) == 0) name = name.substr(6);  // LeRobot's policy wrapper prefix
  for (const auto& [from, to] : kAliases)
    if (name.rfind(from, 0) == 0) return to + name.substr(std::strlen(from));
  return name;
}

// The C API of an LD_PRELOADed libfp8wire.so (shim/fp8wire.h: its declarations only; the trainer
// links none of its code, so decltype names a function's type without using it), resolved at run
// time: null without the library.
template <class Fn>
Fn* fp8wire_symbol(const char* name) {
  return reinterpret_cast<Fn*>(dlsym(RTLD_DEFAULT, name));
}

// Under libfp8wire.so: how many collectives took each of its paths, so a run that meant to use FP8
// shows that it did.
void print_fp8wire_totals() {
  auto* get = fp8wire_symbol<decltype(fp8wire_get_totals)>("fp8wire_get_totals");
  auto* name = fp8wire_symbol<decltype(fp8wire_path_name)>("fp8wire_path_name");
  auto* is_fp8 = fp8wire_symbol<decltype(fp8wire_path_is_fp8)>("fp8wire_path_is_fp8");
  if (!get || !name || !is_fp8) return;
  fp8wire_totals totals{};
  get(&totals);
  uint64_t all = 0, fp8 = 0;
  std::string by_path;
  for (int i = 0; i < FP8WIRE_MAX_PATHS; ++i) {
    if (!totals.calls[i]) continue;
    all += totals.calls[i];
    if (is_fp8(i)) fp8 += totals.calls[i];
    by_path += fmt::format("{}{} {}", by_path.empty() ? "" : ", ", name(i), totals.calls[i]);
  }
  // Which transport carried them (a library without the transport totals says nothing of it).
  std::string by_transport;
  auto* get_transports = fp8wire_symbol<decltype(fp8wire_get_transport_totals)>("fp8wire_get_transport_totals");
  auto* transport_name = fp8wire_symbol<decltype(fp8wire_transport_name)>("fp8wire_transport_name");
  if (get_transports && transport_name) {
    fp8wire_transport_totals transports{};
    get_transports(&transports);
    for (int i = 0; i < FP8WIRE_MAX_TRANSPORTS; ++i)
      if (transports.calls[i])
        by_transport += fmt::format("{}{} {}", by_transport.empty() ? "; over " : ", ", transport_name(i),
                                    transports.calls[i]);
  }
  // By the NCCL function called, with its FP8 share (a library without these totals says nothing).
  std::string by_kind;
  auto* get_kinds = fp8wire_symbol<decltype(fp8wire_get_kind_totals)>("fp8wire_get_kind_totals");
  auto* kind_name = fp8wire_symbol<decltype(fp8wire_call_kind_name)>("fp8wire_call_kind_name");
  if (get_kinds && kind_name) {
    fp8wire_kind_totals kinds{};
    kinds.size = sizeof(kinds);
    get_kinds(&kinds);
    for (int k = 0; k < FP8WIRE_MAX_CALL_KINDS; ++k) {
      uint64_t calls = 0, fp8_calls = 0;
      for (int p = 0; p < FP8WIRE_MAX_PATHS; ++p) {
        calls += kinds.calls[k][p];
        if (is_fp8(p)) fp8_calls += kinds.calls[k][p];
      }
      if (calls)
        by_kind += fmt::format("{}{} {} ({} FP8)", by_kind.empty() ? "; by call: " : ", ", kind_name(k), calls, fp8_calls);
    }
  }
  fmt::print("fp8wire: rank 0: {} collectives, {} on FP8 paths ({}){}{}\n", all, fp8, by_path.empty() ? "none" : by_path,
             by_transport, by_kind);
}

// Under libfp8wire.so with telemetry on (telemetry.sample_every, audit.every): what the measured FP8
// calls' quantization did since the previous report, per "collective/path": calls measured, the
// relative error of the inputs' quantization and of the all-reduce's requantization, the audit's true
// end-to-end error where it ran, and the guard's trips. Empty when nothing was measured (or no library).
class Fp8wireErrors {
 public:
  Fp8wireErrors()
      : get_(fp8wire_symbol<decltype(fp8wire_get_error_totals)>("fp8wire_get_error_totals")),
        collective_(fp8wire_symbol<decltype(fp8wire_collective_name)>("fp8wire_collective_name")),
        path_(fp8wire_symbol<decltype(fp8wire_path_name)>("fp8wire_path_name")) {}

  nlohmann::json since_last() {
    nlohmann::json out = nlohmann::json::object();
    if (!get_ || !collective_ || !path_) return out;
    fp8wire_error_totals now{};
    get_(&now);
    for (int c = 0; c < FP8WIRE_MAX_COLLECTIVES; ++c) {
      const char* cn = collective_(c);
      if (!cn || !*cn) continue;
      for (int p = 0; p < FP8WIRE_MAX_PATHS; ++p) {
        const uint64_t measured = now.measured_calls[c][p] - last_.measured_calls[c][p];
        const uint64_t audited = now.audited_calls[c][p] - last_.audited_calls[c][p];
        if (!measured && !audited) continue;
        nlohmann::json e = {{"measured_calls", measured},
                            {"input_rel_error", rel(now.input[c][p], last_.input[c][p])},
                            {"requant_rel_error", rel(now.requant[c][p], last_.requant[c][p])},
                            {"nonfinite", now.input[c][p].nonfinite - last_.input[c][p].nonfinite}};
        if (audited) {
          const double err = now.audit_sq_error[c][p] - last_.audit_sq_error[c][p];
          const double exact = now.audit_sq_exact[c][p] - last_.audit_sq_exact[c][p];
          e["audited_calls"] = audited;
          e["audit_rel_error"] = exact > 0 ? std::sqrt(err / exact) : 0.0;
        }
        out[fmt::format("{}/{}", cn, path_(p))] = e;
      }
      if (const uint64_t trips = now.guard_trips[c] - last_.guard_trips[c]) out[fmt::format("{}/guard_trips", cn)] = trips;
    }
    last_ = now;
    return out;
  }

 private:
  static double rel(const fp8wire_error_stats& now, const fp8wire_error_stats& before) {
    const double input = now.sq_input - before.sq_input;
    return input > 0 ? std::sqrt((now.sq_error - before.sq_error) / input) : 0.0;
  }
  decltype(fp8wire_get_error_totals)* get_;
  decltype(fp8wire_collective_name)* collective_;
  decltype(fp8wire_path_name)* path_;
  fp8wire_error_totals last_{};
};

}  // namespace

double learning_rate(const TrainConfig& t, int64_t step) {
  if (step < t.warmup_steps) {
    const double init = t.peak_lr / double(t.warmup_steps + 1);
    return init + (t.peak_lr - init) * double(step) / double(t.warmup_steps);
  }
  const double span = double(std::max<int64_t>(t.decay_steps - t.warmup_steps, 1));
  const double progress = std::min(1.0, double(step - t.warmup_steps) / span);
  return t.end_lr + (t.peak_lr - t.end_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

std::vector<std::vector<size_t>> cut_buckets(const std::vector<NamedParam>& params, double cap_bytes) {
  std::vector<std::vector<size_t>> out;
  double bytes = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const double n = double(params[k].tensor.numel()) * double(params[k].tensor.element_size());
    if (out.empty() || (bytes > 0 && bytes + n > cap_bytes)) {
      out.emplace_back();
      bytes = 0;
    }
    out.back().push_back(k);
    bytes += n;
  }
  return out;
}

double bucket_cap_bytes(const TrainConfig& t) {
  return t.allreduce == "after_backward" ? INFINITY : t.bucket_cap_mb * 1024 * 1024;
}

// --- gradient buckets --------------------------------------------------------------------------
// Our own buckets rather than c10d's Reducer: the Reducer's C++ API is internal to PyTorch's DDP
// (its constructor changes between releases and it expects DDP's Python side for bucket rebuilding
// and logging), whereas what we need is small: parameters and their .grad live as views of one flat
// buffer per bucket, in the compute dtype (bf16 on GPU: the gradient traffic fp8wire is built for),
// and a post-accumulate hook launches a bucket's all-reduce as soon as its last gradient lands.
// Each bucket also owns the fp32 master weights, fp32 gradients and AdamW moments of its elements,
// so the optimiser is a handful of fused multi-tensor calls over flat buffers.
class GradientBuckets {
 public:
  struct Bucket {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;
    int64_t numel = 0;
    Tensor param_flat, grad_flat, master, exp_avg, exp_avg_sq;
    int pending = 0;
    bool ready = false;
    bool launched = false;
    c10::intrusive_ptr<c10d::Work> work;
  };

  GradientBuckets(const std::vector<NamedParam>& params, const TrainConfig& t, int world,
                  c10::intrusive_ptr<c10d::Backend> pg)
      : params_(params), overlap_(t.allreduce == "overlap"), skip_(t.allreduce == "skip"), world_(world),
        pg_(std::move(pg)) {
    at::NoGradGuard no_grad;
    for (auto& indices : cut_buckets(params, bucket_cap_bytes(t))) {
      buckets_.push_back(std::make_unique<Bucket>());
      Bucket& b = *buckets_.back();
      for (size_t k : indices) {
        b.params.push_back(k);
        b.offsets.push_back(b.numel);
        b.numel += params[k].tensor.numel();
      }
    }
    owner_.assign(params.size(), {0, 0});
    for (size_t bi = 0; bi < buckets_.size(); ++bi) {
      Bucket& b = *buckets_[bi];
      const Tensor& first = params[b.params[0]].tensor;
      b.param_flat = at::empty({b.numel}, first.options().requires_grad(false));
      b.grad_flat = at::zeros({b.numel}, first.options().requires_grad(false));
      const bool fp32 = first.scalar_type() == at::kFloat;
      b.master = fp32 ? b.param_flat : at::empty({b.numel}, b.param_flat.options().dtype(at::kFloat));
      b.exp_avg = at::zeros({b.numel}, b.master.options());
      b.exp_avg_sq = at::zeros({b.numel}, b.master.options());
      for (size_t j = 0; j < b.params.size(); ++j) {
        Tensor p = params[b.params[j]].tensor;
        const int64_t n = p.numel();
        b.param_flat.narrow(0, b.offsets[j], n).copy_(p.reshape({-1}));
        // The parameter now lives inside the flat buffer, so one copy refreshes all of it after the
        // optimiser step, and autograd accumulates straight into the bucket (no extra grad copy).
        p.set_data(b.param_flat.narrow(0, b.offsets[j], n).view(p.sizes()));
        p.mutable_grad() = b.grad_flat.narrow(0, b.offsets[j], n).view(p.sizes());
        owner_[b.params[j]] = {bi, j};
        torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<ReadyHook>(this, bi));
      }
      if (!fp32) b.master.copy_(b.param_flat);
    }
  }

  ~GradientBuckets() {
    for (const auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
  }

  std::vector<std::unique_ptr<Bucket>>& buckets() { return buckets_; }
  std::pair<size_t, size_t> owner(size_t param) const { return owner_[param]; }

  void begin_step() {
    for (auto& b : buckets_) {
      b->grad_flat.zero_();
      b->pending = int(b->params.size());
      b->ready = b->launched = false;
      b->work.reset();
    }
    next_launch_ = 0;
    launched_in_backward_ = 0;
  }

  int launched_in_backward() const { return launched_in_backward_; }

  // Waits for every bucket's all-reduce: grad_flat then holds the sum over ranks (the optimiser
  // widens and averages it bucket by bucket).
  void finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& b : buckets_) {
        if (!b->ready && !warned_missing_) {
          fmt::print(stderr, "trainer: warning: a gradient bucket was not complete after backward "
                             "(a parameter received no gradient); reducing it anyway\n");
          warned_missing_ = true;
        }
        b->ready = true;
      }
      launch_ready_locked(/*from_hook=*/false);
    }
    for (auto& b : buckets_) {
      if (b->work) b->work->wait();
    }
  }

 private:
  struct ReadyHook : torch::autograd::PostAccumulateGradHook {
    ReadyHook(GradientBuckets* owner, size_t bucket) : owner_(owner), bucket_(bucket) {}
    void operator()(const torch::autograd::Variable&) override { owner_->on_ready(bucket_); }
    GradientBuckets* owner_;
    size_t bucket_;
  };

  void on_ready(size_t bi) {
    std::lock_guard<std::mutex> lock(mu_);
    Bucket& b = *buckets_[bi];
    if (--b.pending == 0) {
      b.ready = true;
      if (overlap_) launch_ready_locked(/*from_hook=*/true);
    }
  }

  // Buckets launch strictly in index order on every rank (NCCL needs the same order everywhere),
  // each as soon as it and all before it are complete.
  void launch_ready_locked(bool from_hook) {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_]->ready) {
      Bucket& b = *buckets_[next_launch_++];
      b.launched = true;
      if (from_hook) ++launched_in_backward_;
      if (world_ > 1 && pg_ && !skip_) {
        std::vector<Tensor> tensors{b.grad_flat};
        name_next_allreduce(next_launch_);  // bucket index + 1: the same tensor every step
        b.work = pg_->allreduce(tensors, c10d::AllreduceOptions{});
      }
    }
  }

  // Names the tensor of the next all-reduce on this thread for libfp8wire.so's error feedback
  // (fp8wire_set_feedback_key). Without the library, or with error feedback off, it does nothing.
  static void name_next_allreduce(uint64_t key) {
    static auto* const set_key = fp8wire_symbol<decltype(fp8wire_set_feedback_key)>("fp8wire_set_feedback_key");
    if (set_key) set_key(key);
  }

  const std::vector<NamedParam>& params_;
  bool overlap_;
  bool skip_;  // train.allreduce = "skip": no all-reduce (a measurement switch)
  int world_;
  c10::intrusive_ptr<c10d::Backend> pg_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<std::pair<size_t, size_t>> owner_;
  std::mutex mu_;
  size_t next_launch_ = 0;
  int launched_in_backward_ = 0;
  bool warned_missing_ = false;
};

// --- trainer -----------------------------------------------------------------------------------

Trainer::Trainer(const Config& config, int rank, int world, c10::intrusive_ptr<c10d::Backend> pg)
    : cfg_(config), rank_(rank), world_(world),
      device_(config.train.device == "cpu" ? at::Device(at::kCPU) : at::Device(at::kCUDA, 0)),
      gen_(at::detail::createCPUGenerator(config.train.seed * 1000003ull + uint64_t(rank) * 7919ull + 17)) {
#ifdef USE_C10D_NCCL
  if (device_.is_cuda()) device_ = at::Device(at::kCUDA, c10::cuda::current_device());
#endif
  const auto dtype = (cfg_.train.dtype == "bf16" && device_.is_cuda()) ? at::kBFloat16 : at::kFloat;
  model_ = std::make_unique<Pi05Model>(cfg_.model, cfg_.data.num_images, cfg_.data.max_token_len, dtype, device_,
                                       cfg_.train.seed);
  model_->set_remat(parse_remat(cfg_.train.remat), cfg_.train.remat_every);
  model_->set_fused_kernels(cfg_.train.fused_kernels);
  buckets_ = std::make_unique<GradientBuckets>(model_->parameters(), cfg_.train, world_, std::move(pg));
}

Trainer::~Trainer() = default;

void Trainer::sync_params_from_masters() {
  at::NoGradGuard no_grad;
  for (auto& b : buckets_->buckets())
    if (!b->master.is_same(b->param_flat)) b->param_flat.copy_(b->master);
}

StepStats Trainer::step(const Batch& batch) {
  const int64_t bsz = batch.actions.size(0);
  Tensor noise = at::randn(batch.actions.sizes(), gen_, at::kFloat);
  Tensor time = sample_flow_time(bsz, gen_, at::kCPU);
  return step(batch, noise.to(device_), time.to(device_));
}

StepStats Trainer::step(const Batch& batch, const Tensor& noise, const Tensor& time) {
  const auto& t = cfg_.train;
  StepStats stats;
  buckets_->begin_step();
  Tensor loss;
  {
    NvtxRange r("forward");
    loss = model_->loss(batch, noise, time);
  }
  {
    NvtxRange r("backward");
    loss.backward();
  }
  {
    NvtxRange r("allreduce");
    buckets_->finish();
  }
  NvtxRange r("optimizer");
  at::NoGradGuard no_grad;
  auto& buckets = buckets_->buckets();
  std::vector<Tensor> summed;
  for (auto& b : buckets) summed.push_back(b->grad_flat);
  // Global norm of the averaged gradient, accumulated in fp32 straight from the (bf16) buckets.
  Tensor norm = at::stack(at::_foreach_norm(summed, 2, at::kFloat)).norm() * (1.0 / double(world_));
  // One factor turns the all-reduced sum into the clipped average.
  Tensor scale = at::full({}, 1.0 / double(world_), norm.options());
  if (t.clip_norm > 0) scale = scale * at::clamp_max(t.clip_norm / (norm + 1e-6), 1.0);
  stats.lr = learning_rate(t, step_);
  stats.buckets = int(buckets.size());
  stats.buckets_launched_in_backward = buckets_->launched_in_backward();
  // One step counter shared by every flat buffer: the fused kernel only reads it.
  Tensor step_count = at::full({}, double(step_ + 1), buckets[0]->master.options());
  // Bucket by bucket, so the fp32 gradient exists for one bucket at a time (a full fp32 gradient
  // copy of pi05 would hold 12 GiB for the whole step); in fp32 the bucket itself is scaled.
  for (auto& b : buckets) {
    Tensor grad = b->grad_flat.scalar_type() == at::kFloat ? b->grad_flat : b->grad_flat.to(at::kFloat);
    grad.mul_(scale);
    at::_fused_adamw_({b->master}, {grad}, {b->exp_avg}, {b->exp_avg_sq}, {}, {step_count}, stats.lr, t.beta1,
                      t.beta2, t.weight_decay, t.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
  sync_params_from_masters();
  ++step_;
  stats.loss = loss.item<double>();
  stats.grad_norm = norm.item<double>();
  return stats;
}

std::string Trainer::save(const std::string& path) const {
  TensorMap out;
  const auto& params = model_->parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    auto [bi, j] = buckets_->owner(k);
    const auto& b = *buckets_->buckets()[bi];
    const Tensor& p = params[k].tensor;
    auto slice = [&](const Tensor& flat) { return flat.narrow(0, b.offsets[j], p.numel()).view(p.sizes()); };
    out["model/" + params[k].name] = slice(b.master);
    out["optim/exp_avg/" + params[k].name] = slice(b.exp_avg);
    out["optim/exp_avg_sq/" + params[k].name] = slice(b.exp_avg_sq);
  }
  out["rng/noise_generator"] = gen_.get_state();
  nlohmann::json meta_json = {{"step", step_}, {"world", world_}, {"micro_batch", cfg_.train.micro_batch},
                              {"seed", cfg_.train.seed}};
  const DataPosition data = data_position();
  Metadata meta = {{"format", kCheckpointFormat},
                   {"step", std::to_string(step_)},
                   {"data_position_samples", std::to_string(step_ * cfg_.train.micro_batch * world_)},
                   {"data_epoch", std::to_string(data.epoch)},
                   {"data_offset_samples", std::to_string(data.offset)},
                   {"data_epoch_samples", epoch_samples_text(order_)},
                   {"data_shuffle", order_.shuffle ? "true" : "false"},
                   {"data_seed", std::to_string(order_.seed)},
                   {"world", std::to_string(world_)},
                   {"rank", std::to_string(rank_)}};
  fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  return write_safetensors(path, out, meta);
}

DataPosition Trainer::data_position() const { return order_.position(step_ * cfg_.train.micro_batch * world_); }

std::string Trainer::check_data_position(Metadata& meta, int64_t step) const {
  if (!meta.count("data_epoch")) {
    // Written before the sample order was recorded: such runs read their data in dataset order.
    if (!order_.shuffle) return "";
    return "has no data position (data_epoch), so it was written by a trainer that read samples in dataset "
           "order; resume it with data.shuffle=false";
  }
  if (meta["data_epoch_samples"] != epoch_samples_text(order_))
    return fmt::format("written with {} samples per epoch, this run's data has {}: the sample order would "
                       "differ (data.shard_dir)", meta["data_epoch_samples"], epoch_samples_text(order_));
  if (meta["data_shuffle"] != (order_.shuffle ? "true" : "false"))
    return fmt::format("written with data.shuffle={}, this run has data.shuffle={}", meta["data_shuffle"],
                       order_.shuffle);
  if (order_.shuffle && meta["data_seed"] != std::to_string(order_.seed))
    return fmt::format("written with train.seed {}, this run has {}: the seed orders the shuffled samples",
                       meta["data_seed"], order_.seed);
  DataPosition saved;
  if (!parse_int(meta["data_epoch"], saved.epoch) || !parse_int(meta["data_offset_samples"], saved.offset))
    return fmt::format("data position (data_epoch '{}', data_offset_samples '{}') is not two integers",
                       meta["data_epoch"], meta["data_offset_samples"]);
  const DataPosition here = order_.position(step * cfg_.train.micro_batch * world_);
  if (saved != here)
    return fmt::format("its data position (epoch {}, offset {}) is not where step {} of {} x {} samples lands "
                       "(epoch {}, offset {}): train.micro_batch differs from the run that wrote it",
                       saved.epoch, saved.offset, step, cfg_.train.micro_batch, world_, here.epoch, here.offset);
  return "";
}

std::string Trainer::resume(const std::string& path) {
  TensorMap in;
  Metadata meta;
  bool verified = false;
  if (auto err = read_safetensors(path, in, &meta, &verified); !err.empty()) return err;
  // v2 carries a checksum, verified by read_safetensors; one that lacks it has lost it to damage.
  // v1 (written before checksums) still resumes, unverified, with a warning.
  if (meta["format"] == kCheckpointFormat) {
    if (!verified)
      return fmt::format("{}: __metadata__.{} is missing from a {} checkpoint: the file is damaged", path,
                         kChecksumKey, kCheckpointFormat);
  } else if (meta["format"] == "fp8wire-trainer-v1") {
    if (rank_ == 0)
      fmt::print(stderr, "fp8wire-train: warning: {} was written before checkpoints carried a checksum; "
                         "it cannot be verified\n", path);
  } else {
    return fmt::format("{}: not an fp8wire trainer checkpoint (__metadata__.format '{}', expected '{}')", path,
                       meta["format"], kCheckpointFormat);
  }
  if (meta["world"] != std::to_string(world_))
    return fmt::format("{}: written by a run of {} ranks, this run has {}: the data position would not "
                       "resume bit for bit", path, meta["world"], world_);
  int64_t step = 0;
  if (!parse_int(meta["step"], step) || step < 0)
    return fmt::format("{}: __metadata__.step is '{}', expected a non-negative integer", path, meta["step"]);
  if (auto err = check_data_position(meta, step); !err.empty()) return fmt::format("{}: {}", path, err);
  at::NoGradGuard no_grad;
  const auto& params = model_->parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    auto [bi, j] = buckets_->owner(k);
    auto& b = *buckets_->buckets()[bi];
    const Tensor& p = params[k].tensor;
    for (auto [prefix, flat] : {std::pair{"model/", b.master}, std::pair{"optim/exp_avg/", b.exp_avg},
                                std::pair{"optim/exp_avg_sq/", b.exp_avg_sq}}) {
      auto it = in.find(prefix + params[k].name);
      if (it == in.end()) return fmt::format("{}: missing '{}{}'", path, prefix, params[k].name);
      if (it->second.sizes() != p.sizes())
        return fmt::format("{}: '{}{}' has shape {}, the model expects {}", path, prefix, params[k].name,
                           c10::str(it->second.sizes()), c10::str(p.sizes()));
      if (!at::isFloatingType(it->second.scalar_type()))
        return fmt::format("{}: '{}{}' has dtype {}, expected a floating-point type", path, prefix, params[k].name,
                           c10::toString(it->second.scalar_type()));
      flat.narrow(0, b.offsets[j], p.numel()).copy_(it->second.reshape({-1}));
    }
  }
  const auto rng = in.find("rng/noise_generator");
  if (rng == in.end()) return fmt::format("{}: missing 'rng/noise_generator'", path);
  const Tensor expected_state = gen_.get_state();
  if (rng->second.scalar_type() != at::kByte || rng->second.sizes() != expected_state.sizes())
    return fmt::format("{}: 'rng/noise_generator' is {} {}, expected U8 {} (a CPU generator state)", path,
                       c10::toString(rng->second.scalar_type()), c10::str(rng->second.sizes()),
                       c10::str(expected_state.sizes()));
  gen_.set_state(rng->second);
  step_ = step;
  sync_params_from_masters();
  return "";
}

std::string Trainer::load_weights(const std::string& path) {
  TensorMap in;
  if (auto err = read_safetensors(path, in); !err.empty()) return err;
  std::map<std::string, Tensor> by_name;
  for (auto& [k, v] : in) by_name[canonical_name(k)] = v;
  at::NoGradGuard no_grad;
  const auto& params = model_->parameters();
  std::vector<std::string> missing;
  size_t used = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    auto it = by_name.find(params[k].name);
    if (it == by_name.end()) {
      missing.push_back(params[k].name);
      continue;
    }
    const Tensor& p = params[k].tensor;
    if (it->second.sizes() != p.sizes())
      return fmt::format("{}: '{}' has shape {}, the config expects {}", path, params[k].name,
                         c10::str(it->second.sizes()), c10::str(p.sizes()));
    if (!at::isFloatingType(it->second.scalar_type()))
      return fmt::format("{}: '{}' has dtype {}, expected a floating-point type", path, params[k].name,
                         c10::toString(it->second.scalar_type()));
    auto [bi, j] = buckets_->owner(k);
    auto& b = *buckets_->buckets()[bi];
    b.master.narrow(0, b.offsets[j], p.numel()).copy_(it->second.reshape({-1}));
    ++used;
  }
  if (!missing.empty())
    return fmt::format("{}: {} of the model's {} parameters are missing, e.g. '{}' (trainer/README.md lists the "
                       "expected names)", path, missing.size(), params.size(), missing.front());
  if (used < by_name.size() && rank_ == 0)
    fmt::print("trainer: {} tensors of {} were not used (lm_head, the backbone's final norm, the last "
               "layer's prefix MLP: nothing the loss reaches)\n", by_name.size() - used, path);
  sync_params_from_masters();
  return "";
}

std::vector<double> Trainer::parameter_checksum() const {
  at::NoGradGuard no_grad;
  double s = 0, s2 = 0, p = 0, p2 = 0;
  for (auto& b : buckets_->buckets()) {
    Tensor m = b->master.to(at::kDouble);
    Tensor d = b->param_flat.to(at::kDouble);
    s += m.sum().item<double>();
    s2 += m.pow(2).sum().item<double>();
    p += d.sum().item<double>();
    p2 += d.pow(2).sum().item<double>();
  }
  return {s, s2, p, p2};
}

Tensor Trainer::master(size_t index) const {
  auto [bi, j] = buckets_->owner(index);
  const auto& b = *buckets_->buckets()[bi];
  const Tensor& p = model_->parameters().at(index).tensor;
  return b.master.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
}

std::vector<int64_t> Trainer::bucket_bytes() const {
  std::vector<int64_t> out;
  for (const auto& b : buckets_->buckets()) out.push_back(int64_t(b->grad_flat.nbytes()));
  return out;
}

// --- one rank's run ----------------------------------------------------------------------------

namespace {

// The caching allocator's peak of allocated memory, and what it holds from the device now
// (allocated or cached): with the process's GPU memory the second tells a growth of the
// application's tensors from one outside the allocator. Zeros off CUDA.
struct AllocatorMemory {
  double peak_gib = 0.0;
  double reserved_gib = 0.0;
};
AllocatorMemory allocator_memory(at::Device device) {
  AllocatorMemory m;
#ifdef USE_C10D_NCCL
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    m.peak_gib = double(stats.allocated_bytes[0].peak) / double(1ull << 30);
    m.reserved_gib = double(stats.reserved_bytes[0].current) / double(1ull << 30);
  }
#endif
  (void)device;
  return m;
}

c10::intrusive_ptr<c10d::Backend> make_process_group(const Config& cfg, int rank, int world, std::string& error) {
#ifdef USE_C10D_NCCL
  if (world <= 1) return {};
  if (cfg.train.device != "cuda") {
    error = fmt::format("train.device \"{}\" supports one rank only; got WORLD_SIZE {}", cfg.train.device, world);
    return {};
  }
  c10::intrusive_ptr<c10d::Store> store;
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  const char* file = std::getenv("FP8WIRE_TRAIN_STORE");
  if (addr && port) {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(std::atoi(port));
    opts.isServer = rank == 0;
    opts.numWorkers = world;
    store = c10::make_intrusive<c10d::TCPStore>(addr, opts);
  } else if (file) {
    store = c10::make_intrusive<c10d::FileStore>(file, world);
  } else {
    error = "a multi-rank run needs MASTER_ADDR and MASTER_PORT (torchrun style) or FP8WIRE_TRAIN_STORE (a file "
            "every rank can reach), or fp8wire-train --ranks N";
    return {};
  }
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, opts);
#else
  if (world > 1) error = "this build of the trainer has no NCCL process group (LibTorch without CUDA)";
  (void)cfg;
  (void)rank;
  return {};
#endif
}

// The PNG is a convenience: matplotlib may be missing (it is on the CI machine), so a failure is a
// note, never an error of the run.
void plot_loss_curve(const std::string& log_path, const std::string& png) {
  const fs::path script = fs::path(FP8WIRE_TRAINER_SOURCE_ROOT) / "scripts" / "plot_loss.py";
  if (!fs::exists(script)) return;
  const std::string cmd = fmt::format("python3 '{}' '{}' -o '{}' >/dev/null 2>&1", script.string(), log_path, png);
  if (std::system(cmd.c_str()) == 0) fmt::print("loss curve: {}\n", png);
  else fmt::print("loss curve: not drawn (python3 with matplotlib needed; scripts/plot_loss.py {})\n", log_path);
}

// Rank-consistent check that data-parallel replicas hold identical weights: max and min of every
// checksum over ranks must agree bit for bit.
bool ranks_in_sync(Trainer& trainer, c10d::Backend& pg, std::vector<double>& local) {
  local = trainer.parameter_checksum();
  std::vector<double> both;
  for (double x : local) both.push_back(x);
  for (double x : local) both.push_back(-x);
  Tensor t = at::tensor(both, at::TensorOptions().dtype(at::kDouble)).to(trainer.device());
  std::vector<Tensor> v{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MAX;
  pg.allreduce(v, opts)->wait();
  Tensor host = t.cpu();
  const auto* r = host.data_ptr<double>();
  const size_t n = local.size();
  for (size_t i = 0; i < n; ++i)
    if (r[i] != -r[n + i]) return false;
  return true;
}

}  // namespace

int visible_gpu_count() {
#ifdef USE_C10D_NCCL
  return int(c10::cuda::device_count());
#else
  return 0;
#endif
}

void select_gpu(int index) {
#ifdef USE_C10D_NCCL
  c10::cuda::set_device(c10::DeviceIndex(index));
#else
  (void)index;
#endif
}

// train.profile_from / profile_steps: LibTorch's own profiler (Kineto: CPU ops and every GPU kernel)
// around whole steps on rank 0, saved as a Chrome trace. Steps end with a device synchronisation,
// so the window holds exactly the profiled steps' kernels.
class StepProfiler {
 public:
  StepProfiler(const TrainConfig& t, int rank, const torch::Device& device)
      : from_(rank == 0 ? t.profile_from : -1), steps_(t.profile_steps),
        path_((fs::path(t.out_dir) / "torch_trace.json").string()), cuda_(device.is_cuda()) {}
  ~StepProfiler() {
    if (active_) stop();
  }
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;
  void before_step(int64_t s) {
    if (from_ < 0 || s != from_) return;
    using torch::profiler::impl::ActivityType;
    const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
    std::set<ActivityType> activities{ActivityType::CPU};
    if (cuda_) activities.insert(ActivityType::CUDA);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    active_ = true;
  }
  void after_step(int64_t s) {
    if (active_ && s + 1 == from_ + steps_) stop();
  }

 private:
  void stop() {
    active_ = false;
    std::unique_ptr<torch::autograd::profiler::ProfilerResult> result = torch::autograd::profiler::disableProfiler();
    std::error_code ec;
    fs::create_directories(fs::path(path_).parent_path(), ec);
    result->save(path_);
    fmt::print("profile: steps {}..{} written to {} (scripts/kernel_breakdown.py {})\n", from_, from_ + steps_ - 1,
               path_, path_);
  }
  int64_t from_;
  int64_t steps_;
  std::string path_;
  bool cuda_;
  bool active_ = false;
};

int run_rank(const Config& cfg, int rank, int world, int local_rank) {
  (void)local_rank;
  try {
    std::string error;
    auto pg = make_process_group(cfg, rank, world, error);
    if (!error.empty()) {
      fmt::print(stderr, "fp8wire-train[rank {}]: {}\n", rank, error);
      return 2;
    }
    Trainer trainer(cfg, rank, world, pg);
    const auto& t = cfg.train;
    if (!t.init_weights.empty())
      if (auto err = trainer.load_weights(t.init_weights); !err.empty()) {
        fmt::print(stderr, "fp8wire-train[rank {}]: train.init_weights: {}\n", rank, err);
        return 2;
      }
    // The source comes before resume: the checkpoint's data position is checked against its order.
    std::unique_ptr<DataSource> source;
    if (cfg.data.source == "synthetic") source = make_synthetic_source(cfg);
    else if (auto err = make_shard_source(cfg, source); !err.empty()) {
      fmt::print(stderr, "fp8wire-train[rank {}]: {}\n", rank, err);
      return 2;
    }
    const SampleOrder order = make_sample_order(cfg, *source);
    trainer.set_sample_order(order);
    if (!t.resume.empty())
      if (auto err = trainer.resume(t.resume); !err.empty()) {
        fmt::print(stderr, "fp8wire-train[rank {}]: train.resume: {}\n", rank, err);
        return 2;
      }
    const int64_t nparams = trainer.model().parameter_count();
    const double flops = 3.0 * trainer.model().forward_flops_per_sample();  // forward + backward
    if (rank == 0)
      fmt::print("fp8wire-train: preset {} | {} parameters ({:.3f} B trained; {:.3f} B with the tensors openpi "
                 "keeps that no loss reaches) | {} rank(s) | micro-batch {} | seq {} tokens | dtype {} | remat {} | "
                 "allreduce {} (cap {} MiB)\n",
                 cfg.preset_name, nparams, double(nparams) / 1e9,
                 double(nparams + trainer.model().unreached_parameter_count()) / 1e9, world, t.micro_batch,
                 cfg.seq_len(), t.dtype,
                 t.remat == "none" || t.remat_every == 1 ? t.remat : fmt::format("{} every {}", t.remat, t.remat_every),
                 t.allreduce, t.bucket_cap_mb);
    if (rank == 0) {
      // The all-reduce traffic per step, bucket by bucket in launch order: what fp8wire will see.
      const auto sizes = trainer.bucket_bytes();
      int64_t total = 0, largest = 0;
      std::string list;
      for (int64_t b : sizes) {
        total += b;
        largest = std::max(largest, b);
        if (list.size() < 400) list += fmt::format("{}{:.1f}", list.empty() ? "" : " ", double(b) / (1 << 20));
      }
      fmt::print("gradient buckets: {} per step in {}, {:.1f} MiB in all, largest {:.1f} MiB; MiB in launch "
                 "order: {}{}\n",
                 sizes.size(), c10::toString(trainer.model().dtype()), double(total) / (1 << 20),
                 double(largest) / (1 << 20), list, list.size() >= 400 ? " ..." : "");
    }

    if (rank == 0 && order.epoch_samples != kUnboundedSource) {
      const DataPosition at = trainer.data_position();
      fmt::print("data: {} samples per epoch, {} | starting at epoch {}, sample {} of it\n", order.epoch_samples,
                 order.shuffle ? fmt::format("shuffled each epoch (train.seed {})", order.seed) : "dataset order",
                 at.epoch, at.offset);
    }
    Loader loader(*source, order, t.micro_batch, world, rank, trainer.steps_done(), cfg.data.prefetch,
                  trainer.device());

    std::unique_ptr<FILE, int (*)(FILE*)> jsonl(nullptr, &std::fclose);
    const std::string log_path =
        t.log_jsonl.empty() ? (fs::path(t.out_dir) / "train_log.jsonl").string() : t.log_jsonl;
    if (rank == 0) {
      std::error_code ec;
      if (fs::path(log_path).has_parent_path()) fs::create_directories(fs::path(log_path).parent_path(), ec);
      std::string error;
      jsonl.reset(fp8wire::fopen_output(log_path, fp8wire::OutputMode::append, error));  // refuses a link
      if (!jsonl) fmt::print(stderr, "fp8wire-train: log: {}; continuing without it\n", error);
    }
    double sum_ms = 0, sum_sps = 0;
    int64_t timed = 0;
    double first_loss = NAN, last_loss = NAN;
    const int64_t first_step = trainer.steps_done();
    StepProfiler profiler(t, rank, trainer.device());
    Fp8wireErrors fp8_errors;
    for (int64_t s = trainer.steps_done(); s < t.steps; ++s) {
      profiler.before_step(s);
      const auto start = std::chrono::steady_clock::now();
      StepStats st;
      {
        NvtxRange step_range("step");
        Batch batch;
        {
          NvtxRange r("data");
          batch = loader.next();
        }
        st = trainer.step(batch);
        device_synchronize(trainer.device());
      }
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      profiler.after_step(s);
      const double sps = double(t.micro_batch * world) * 1000.0 / ms;
      const double mfu = flops * double(t.micro_batch) / (ms / 1000.0) / (t.peak_tflops * 1e12);
      const AllocatorMemory memory = allocator_memory(trainer.device());
      const double mem = memory.peak_gib;
      if (std::isnan(first_loss)) first_loss = st.loss;
      last_loss = st.loss;
      if (s - first_step >= kUntimedSteps) {
        sum_ms += ms;
        sum_sps += sps;
        ++timed;
      }
      if (rank == 0 && (s % t.log_every == 0 || s + 1 == t.steps)) {
        nlohmann::json line = {{"step", s},        {"loss", st.loss},   {"grad_norm", st.grad_norm},
                               {"lr", st.lr},      {"step_ms", ms},     {"samples_per_s", sps},
                               {"peak_mem_gib", mem}, {"reserved_mem_gib", memory.reserved_gib},
                               {"mfu", mfu},          {"world", world},
                               {"buckets", st.buckets}, {"buckets_in_backward", st.buckets_launched_in_backward}};
        if (nlohmann::json errors = fp8_errors.since_last(); !errors.empty()) line["fp8wire_errors"] = errors;
        if (jsonl) {
          std::fputs((line.dump() + "\n").c_str(), jsonl.get());
          std::fflush(jsonl.get());
        }
        fmt::print("step {:>5}/{} | loss {:.4f} | grad {:.3f} | lr {:.3e} | {:.1f} ms | {:.1f} samples/s | "
                   "peak {:.1f} GiB | MFU {:.1f}%\n",
                   s + 1, t.steps, st.loss, st.grad_norm, st.lr, ms, sps, mem, 100.0 * mfu);
        std::fflush(stdout);
      }
      if (!std::isfinite(st.loss)) {
        fmt::print(stderr, "fp8wire-train[rank {}]: loss is {} at step {}; stopping\n", rank, st.loss, s);
        return 3;
      }
      if (t.save_every > 0 && (s + 1) % t.save_every == 0 && !t.save_path.empty())
        if (auto err = trainer.save(world > 1 ? fmt::format("{}.rank{}", t.save_path, rank) : t.save_path);
            !err.empty())
          fmt::print(stderr, "fp8wire-train[rank {}]: save: {}\n", rank, err);
    }
    if (!t.save_path.empty())
      if (auto err = trainer.save(world > 1 ? fmt::format("{}.rank{}", t.save_path, rank) : t.save_path);
          !err.empty()) {
        fmt::print(stderr, "fp8wire-train[rank {}]: save: {}\n", rank, err);
        return 2;
      }
    int rc = 0;
    if (rank == 0) {
      const double peak_gib = allocator_memory(trainer.device()).peak_gib;
      // Ranks sharing a GPU: whether they ran side by side (MPS) or time-sliced, as their launcher said.
      const char* testbed = world > 1 ? std::getenv("FP8WIRE_TESTBED_MODE") : nullptr;
      const std::string testbed_note = testbed && *testbed ? fmt::format(" | testbed {}", testbed) : std::string();
      if (first_step >= t.steps) {
        // No step ran (train.steps 0, or a checkpoint resumed at or past it): there is no loss to
        // show, only what the run did do (the model built, weights loaded, a checkpoint saved).
        fmt::print("summary: params {} | no step run: train.steps is {}{} | peak {:.1f} GiB{}\n", nparams, t.steps,
                   first_step > 0 ? fmt::format(" and the resumed checkpoint has done {}", first_step) : "", peak_gib,
                   testbed_note);
      } else if (timed == 0) {
        fmt::print("summary: params {} | loss {:.4f} -> {:.4f} | mean step not measured: the first {} steps of a "
                   "run are warm-up and not timed (run {} or more steps) | peak {:.1f} GiB{}\n",
                   nparams, first_loss, last_loss, kUntimedSteps, kUntimedSteps + 1, peak_gib, testbed_note);
      } else {
        fmt::print("summary: params {} | loss {:.4f} -> {:.4f} | mean step {:.1f} ms | mean {:.1f} samples/s | "
                   "peak {:.1f} GiB | MFU {:.1f}% | means over the last {} steps (the first {} warm up){}\n",
                   nparams, first_loss, last_loss, sum_ms / timed, sum_sps / timed, peak_gib,
                   100.0 * flops * double(t.micro_batch) / (sum_ms / timed / 1000.0) / (t.peak_tflops * 1e12), timed,
                   kUntimedSteps, testbed_note);
      }
    }
    if (pg && t.check_sync && t.allreduce == "skip" && rank == 0)
      fmt::print("ranks in sync: not checked (train.allreduce = skip: each rank trained on its own gradients)\n");
    if (pg && t.check_sync && t.allreduce != "skip") {
      std::vector<double> local;
      const bool ok = ranks_in_sync(trainer, *pg, local);
      fmt::print("rank {} parameter checksum {:.17g} {:.17g} | ranks in sync: {}\n", rank, local[0], local[1],
                 ok ? "PASS" : "FAIL");
      if (!ok) rc = 4;
    }
    if (rank == 0) print_fp8wire_totals();
    if (rank == 0 && t.plot && first_step < t.steps) plot_loss_curve(log_path, (fs::path(t.out_dir) / "loss.png").string());
    if (pg) pg->shutdown();  // orderly NCCL teardown instead of the destructor's warning
    return rc;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fp8wire-train[rank {}]: {}\n", rank, e.what());
    return 1;
  }
}

}  // namespace fp8wire::trainer
