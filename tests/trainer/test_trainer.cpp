// CPU tests of the Pi0.5 reference trainer on the `tiny` preset.
#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ftw.h>
#include <map>
#include <set>
#include <unistd.h>

#include <fmt/format.h>

#include "trainer/config.hpp"
#include "trainer/data.hpp"
#include "trainer/fused_ops.hpp"
#include "trainer/model.hpp"
#include "trainer/train.hpp"

#define DOCTEST_CONFIG_IMPLEMENT
#include "tests/trainer/trainer_test.hpp"

using namespace fp8wire::trainer;
using at::Tensor;
namespace fs = std::filesystem;

namespace {

Batch tiny_batch(const Config& c, int64_t first = 0) { return make_synthetic_source(c)->get(first, c.train.micro_batch); }

// One scratch directory per test process, removed by main() after the run.
fs::path scratch_path() {
  return fs::temp_directory_path() / ("fp8wire-trainer-test-" + std::to_string(::getpid()));
}
fs::path temp_dir() {
  fs::create_directories(scratch_path());
  return scratch_path();
}

Tensor all_params(Pi05Model& m) {
  std::vector<Tensor> flat;
  for (const auto& p : m.parameters()) flat.push_back(p.tensor.detach().reshape({-1}));
  return at::cat(flat);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("the fused kernels apply only to bf16 CUDA tensors: on the CPU the ATen path runs either way") {
  Config c = tiny_config();
  CHECK(c.train.fused_kernels);  // on by default
  CHECK(apply_override("train.fused_kernels=false", c) == "");
  CHECK_FALSE(c.train.fused_kernels);
  CHECK(apply_override("train.fused_kernels=sometimes", c).find("train.fused_kernels") != std::string::npos);
  CHECK_FALSE(fused_norm_applies(at::zeros({2, 3, 64}, at::kBFloat16)));
  Batch b = tiny_batch(c);
  Tensor n = at::randn({4, 6, 8});
  Tensor t = at::full({4}, 0.45);
  Tensor losses[2];
  for (int k = 0; k < 2; ++k) {
    Pi05Model m(c.model, c.data.num_images, c.data.max_token_len, at::kFloat, at::kCPU, 5);
    m.set_fused_kernels(k == 1);
    losses[k] = m.loss(b, n, t);
  }
  CHECK(at::equal(losses[0], losses[1]));
}

TEST_CASE("config: presets load, unknown keys and bad values are errors naming the key") {
  Config c = tiny_config();
  CHECK(c.preset_name == "tiny");
  CHECK(c.model.width == 64);
  for (const char* preset : {"pi05", "pi05_small"}) {
    Config p;
    CHECK(load_config_file(std::string(FP8WIRE_TRAINER_CONFIG_DIR) + "/" + preset + ".toml", p) == "");
  }
  Config full;
  CHECK(load_config_file(std::string(FP8WIRE_TRAINER_CONFIG_DIR) + "/pi05.toml", full) == "");
  CHECK(full.seq_len() == 762);
  CHECK(apply_override("train.steps=7", c) == "");
  CHECK(c.train.steps == 7);
  CHECK(apply_override("train.stepz=7", c).find("train.stepz") != std::string::npos);
  const std::string bad = apply_override("train.micro_batch=lots", c);
  CHECK(bad.find("train.micro_batch") != std::string::npos);
  CHECK(bad.find("lots") != std::string::npos);
  REQUIRE(apply_override("train.remat=sometimes", c) == "");  // typed here, checked by validate()
  CHECK(validate(c).find("train.remat") != std::string::npos);
  c.train.remat = "none";
  CHECK(load_config_string("[model]\nwidth = \"wide\"\n", c).find("model.width") != std::string::npos);
}

TEST_CASE("mask and positions match hand-computed cases (empty slot, language padding)") {
  // Tokens: image, image (empty camera slot), language, language padding, action block start, action.
  Tensor ar = at::tensor({0, 0, 0, 0, 1, 0}, at::kLong).unsqueeze(0);
  Tensor valid = at::tensor({1, 0, 1, 0, 1, 1}).to(at::kBool).unsqueeze(0);
  Tensor allowed = attention_allowed(ar, valid)[0];
  // c = cumsum(ar) = [0,0,0,0,1,1]; allowed(i,j) = c[j] <= c[i] && valid[i] && valid[j]
  const int expected[6][6] = {
      {1, 0, 1, 0, 0, 0},  // prefix token sees the valid prefix only (bidirectional)
      {0, 0, 0, 0, 0, 0},  // empty slot: fully masked row
      {1, 0, 1, 0, 0, 0},
      {0, 0, 0, 0, 0, 0},  // padding: fully masked row
      {1, 0, 1, 0, 1, 1},  // actions see the valid prefix and each other
      {1, 0, 1, 0, 1, 1},
  };
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) CHECK_MESSAGE(allowed[i][j].item<bool>() == bool(expected[i][j]), "i=", i, " j=", j);
  Tensor pos = joint_positions(valid)[0];
  const int64_t expected_pos[6] = {0, 0, 1, 1, 2, 3};
  for (int i = 0; i < 6; ++i) CHECK(pos[i].item<int64_t>() == expected_pos[i]);
}

TEST_CASE("shapes, parameter count and the pi05 parameter count") {
  Config c = tiny_config();
  Pi05Model m(c.model, c.data.num_images, c.data.max_token_len, at::kFloat, at::kCPU, 0);
  Batch b = tiny_batch(c);
  auto [prefix, valid] = m.embed_prefix(b);
  CHECK(prefix.sizes() == at::IntArrayRef({4, c.prefix_len(), c.model.width}));
  CHECK(valid.sizes() == at::IntArrayRef({4, c.prefix_len()}));
  Tensor v = m.velocity(b, at::randn({4, 6, 8}), at::full({4}, 0.5));
  CHECK(v.sizes() == at::IntArrayRef({4, 6, 8}));
  CHECK(m.parameter_count() > 0);
  // The full preset's count, from the shapes alone (meta device: nothing is allocated).
  Config full;
  REQUIRE(load_config_file(std::string(FP8WIRE_TRAINER_CONFIG_DIR) + "/pi05.toml", full) == "");
  Pi05Model big(full.model, 2, 200, at::kBFloat16, at::Device(at::kMeta), 0);
  const double billions = double(big.parameter_count()) / 1e9;
  MESSAGE("pi05 parameters used by the loss: ", big.parameter_count());
  CHECK(billions > 3.2);
  CHECK(billions < 3.3);
  // With the tensors openpi keeps but no loss reaches, it is openpi's 3.35 B.
  const double with_dead = double(big.parameter_count() + big.unreached_parameter_count()) / 1e9;
  CHECK(with_dead == doctest::Approx(3.35).epsilon(0.01));
}

TEST_CASE("adaRMS is the identity at zero init and the expert starts as a pass-through") {
  Tensor x = at::randn({2, 3, 8});
  Tensor cond = at::randn({2, 8});
  AdaNormOut out = ada_rms_norm(x, cond, at::zeros({24, 8}), at::zeros({24}));
  CHECK(at::allclose(out.y, rms_normalize(x)));
  CHECK(at::count_nonzero(out.gate).item<int64_t>() == 0);
  CHECK(at::allclose(rms_norm(x, at::zeros({8})), rms_normalize(x)));

  // With all adaRMS projections zero, every gated residual of the expert adds nothing, so the
  // velocity cannot depend on the prefix (images, language) at initialisation.
  Config c = tiny_config();
  Pi05Model m(c.model, c.data.num_images, c.data.max_token_len, at::kFloat, at::kCPU, 0);
  Batch a = tiny_batch(c, 0), b = tiny_batch(c, 100);
  b.actions = a.actions;
  Tensor x_t = at::randn({4, 6, 8});
  Tensor t = at::full({4}, 0.3);
  at::NoGradGuard no_grad;
  CHECK(at::allclose(m.velocity(a, x_t, t), m.velocity(b, x_t, t)));
}

TEST_CASE("no NaN on fully masked rows (no camera, no language)") {
  Config c = tiny_config();
  Pi05Model m(c.model, c.data.num_images, c.data.max_token_len, at::kFloat, at::kCPU, 1);
  Batch b = tiny_batch(c);
  b.image_mask.zero_();
  b.token_mask.zero_();
  b.token_mask[1].narrow(0, 0, 3).fill_(true);  // one sample keeps a little language
  Tensor loss = m.loss(b, at::randn({4, 6, 8}), at::full({4}, 0.7));
  CHECK(std::isfinite(loss.item<double>()));
  loss.backward();
  for (const auto& p : m.parameters())
    if (p.tensor.grad().defined()) CHECK_MESSAGE(at::isfinite(p.tensor.grad()).all().item<bool>(), p.name);
}

TEST_CASE("loss formula and flow-matching time") {
  Tensor v = at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 2, 2});
  Tensor noise = at::tensor({0.5f, 0.5f, 0.0f, 1.0f}).view({1, 2, 2});
  Tensor actions = at::tensor({0.0f, 1.0f, -1.0f, 2.0f}).view({1, 2, 2});
  // u = noise - actions = [0.5, -0.5, 1, -1]; (v-u)^2 = [0.25, 6.25, 4, 25] -> mean 8.875
  CHECK(flow_matching_loss(v, noise, actions).item<double>() == doctest::Approx(8.875));

  Config c = tiny_config();
  Pi05Model m(c.model, c.data.num_images, c.data.max_token_len, at::kFloat, at::kCPU, 2);
  Batch b = tiny_batch(c);
  Tensor n = at::randn({4, 6, 8});
  Tensor t = at::tensor({0.1f, 0.4f, 0.6f, 0.999f});
  Tensor tt = t.view({-1, 1, 1});
  Tensor x_t = tt * n + (1 - tt) * b.actions;
  Tensor manual = (m.velocity(b, x_t, t) - (n - b.actions)).pow(2).mean();
  CHECK(m.loss(b, n, t).item<double>() == doctest::Approx(manual.item<double>()).epsilon(1e-6));

  at::Generator gen = at::detail::createCPUGenerator(3);
  Tensor times = sample_flow_time(20000, gen, at::kCPU);
  CHECK(times.min().item<double>() >= 0.001);
  CHECK(times.max().item<double>() <= 1.0);
  // Beta(1.5, 1) has mean 0.6, so t has mean 0.6 * 0.999 + 0.001.
  CHECK(times.mean().item<double>() == doctest::Approx(0.6 * 0.999 + 0.001).epsilon(0.01));
  Tensor emb = sincos_time_embedding(at::tensor({0.0f}), 8, 4e-3, 4.0);
  CHECK(emb[0][0].item<double>() == doctest::Approx(0.0));  // sin(0)
  CHECK(emb[0][4].item<double>() == doctest::Approx(1.0));  // cos(0)
}

TEST_CASE("learning rate: step 0 is non-zero, warmup then cosine") {
  TrainConfig t;
  t.peak_lr = 1.0;
  t.end_lr = 0.1;
  t.warmup_steps = 4;
  t.decay_steps = 14;
  CHECK(learning_rate(t, 0) == doctest::Approx(0.2));
  CHECK(learning_rate(t, 4) == doctest::Approx(1.0));
  CHECK(learning_rate(t, 9) == doctest::Approx(0.55));
  CHECK(learning_rate(t, 14) == doctest::Approx(0.1));
  CHECK(learning_rate(t, 100) == doctest::Approx(0.1));
}

TEST_CASE("step 0 moves every parameter that has a gradient; step 1 reaches the rest") {
  Config c = tiny_config();
  Trainer trainer(c, 0, 1, {});
  const auto& params = trainer.model().parameters();
  auto snapshot = [&] {
    std::vector<Tensor> out;
    for (size_t k = 0; k < params.size(); ++k) out.push_back(trainer.master(k).clone());
    return out;
  };
  const std::vector<Tensor> before = snapshot();
  StepStats s = trainer.step(tiny_batch(c));
  CHECK(s.lr > 0);
  CHECK(s.lr == learning_rate(c.train, 0));
  CHECK(std::isfinite(s.loss));
  CHECK(s.grad_norm > 0);
  CHECK(trainer.steps_done() == 1);
  // openpi zero-initialises the adaRMS projections, so every expert gate is 0 at step 0: the
  // gradient reaches only the path around the gated branches (action_in/out_proj, the adaRMS
  // projections). Those must all move; once the gates are non-zero, step 1 reaches the rest.
  std::vector<std::string> unmoved;
  int with_grad = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const bool has_grad = params[k].tensor.grad().abs().max().item<float>() > 0;
    with_grad += has_grad;
    if (has_grad) CHECK_MESSAGE(!at::equal(before[k], trainer.master(k)), params[k].name, " did not move at step 0");
  }
  CHECK(with_grad > 0);
  for (size_t k = 0; k < params.size(); ++k)
    if (params[k].name == "action_out_proj.weight" ||
        params[k].name == "paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm.dense.weight")
      CHECK_MESSAGE(!at::equal(before[k], trainer.master(k)), params[k].name, " did not move at step 0");
  trainer.step(tiny_batch(c, c.train.micro_batch));
  for (size_t k = 0; k < params.size(); ++k)
    if (at::equal(before[k], trainer.master(k))) unmoved.push_back(params[k].name);
  for (const auto& name : unmoved) CHECK_MESSAGE(false, name, " has not moved after two steps");
  CHECK(unmoved.empty());
}

TEST_CASE("gradient buckets: bf16, cut at the cap in reverse registration order") {
  // The presets' real layouts, built on the meta device (shapes only, no memory).
  for (const char* preset : {"pi05_small", "pi05"}) {
    Config c;
    REQUIRE(load_config_file(std::string(FP8WIRE_TRAINER_CONFIG_DIR) + "/" + preset + ".toml", c) == "");
    Pi05Model m(c.model, c.data.num_images, c.data.max_token_len, at::kBFloat16, at::Device(at::kMeta), 0);
    const auto& params = m.parameters();
    const double cap = bucket_cap_bytes(c.train);
    CHECK(cap == c.train.bucket_cap_mb * 1024 * 1024);
    const auto buckets = cut_buckets(params, cap);
    size_t next = params.size();
    std::string sizes;
    double total = 0;
    for (const auto& b : buckets) {
      double bytes = 0;
      for (size_t k : b) {
        CHECK(k + 1 == next);  // launch order = reverse registration order, every parameter once
        next = k;
        bytes += double(params[k].tensor.nbytes());
      }
      CHECK((bytes <= cap || b.size() == 1));
      total += bytes;
      sizes += fmt::format(" {:.1f}", bytes / (1 << 20));
    }
    CHECK(next == 0);
    MESSAGE(std::string(preset), ": ", buckets.size(), " bf16 buckets, ", total / (1 << 20), " MiB per step; MiB:", sizes);
    Config one = c;
    one.train.allreduce = "after_backward";
    CHECK(cut_buckets(params, bucket_cap_bytes(one.train)).size() == 1);
  }
}

TEST_CASE("activation checkpointing gives the same loss and gradients") {
  Config c = tiny_config();
  Batch b = tiny_batch(c);
  Tensor n = at::randn({4, 6, 8});
  Tensor t = at::full({4}, 0.45);
  // none, every layer, every other layer (tiny has 2 vision and 2 joint layers: one of each rerun).
  std::vector<Tensor> grads[3];
  double losses[3];
  for (int k = 0; k < 3; ++k) {
    Pi05Model m(c.model, c.data.num_images, c.data.max_token_len, at::kFloat, at::kCPU, 5);
    m.set_remat(k == 0 ? Remat::none : Remat::layers, k == 2 ? 2 : 1);
    Tensor loss = m.loss(b, n, t);
    loss.backward();
    losses[k] = loss.item<double>();
    for (const auto& p : m.parameters()) {
      REQUIRE_MESSAGE(p.tensor.grad().defined(), p.name, " has no gradient (remat ", k, ")");
      grads[k].push_back(p.tensor.grad().clone());
    }
  }
  for (int k = 1; k < 3; ++k) {
    CHECK(losses[0] == losses[k]);
    REQUIRE(grads[0].size() == grads[k].size());
    for (size_t i = 0; i < grads[0].size(); ++i) CHECK(at::allclose(grads[0][i], grads[k][i], 1e-5, 1e-6));
  }
}

TEST_CASE("overfits one fixed batch: the loss falls by 10x") {
  Config c = tiny_config();
  c.train.peak_lr = 3e-3;
  c.train.end_lr = 3e-3;
  c.train.warmup_steps = 0;
  c.train.decay_steps = 1;
  Trainer trainer(c, 0, 1, {});
  Batch b = tiny_batch(c);
  at::Generator gen = at::detail::createCPUGenerator(11);
  Tensor n = at::randn({4, 6, 8}, gen, at::kFloat);
  Tensor t = sample_flow_time(4, gen, at::kCPU);
  const double first = trainer.step(b, n, t).loss;
  double last = first;
  for (int i = 0; i < 300 && last > first / 10; ++i) last = trainer.step(b, n, t).loss;
  MESSAGE("fixed-batch loss ", first, " -> ", last, " after ", trainer.steps_done(), " steps");
  CHECK(last < first / 10);
}

TEST_CASE("checkpoint round trip resumes bit for bit") {
  Config c = tiny_config();
  auto source = make_synthetic_source(c);
  const fs::path path = temp_dir() / "ckpt.safetensors";
  Tensor straight;
  {
    Trainer a(c, 0, 1, {});
    for (int s = 0; s < 2; ++s) a.step(source->get(s * 4, 4));
    REQUIRE(a.save(path.string()) == "");
    for (int s = 2; s < 4; ++s) a.step(source->get(s * 4, 4));
    straight = all_params(a.model()).clone();
  }
  Config other = c;
  other.train.seed = 99;  // a different initialisation, fully replaced by the checkpoint
  Trainer b(other, 0, 1, {});
  REQUIRE(b.resume(path.string()) == "");
  CHECK(b.steps_done() == 2);
  for (int s = 2; s < 4; ++s) b.step(source->get(s * 4, 4));
  CHECK(bitwise_equal(straight, all_params(b.model())));
  Config four_ranks = c;
  Trainer wrong_world(four_ranks, 0, 4, {});
  CHECK(wrong_world.resume(path.string()).find("ranks") != std::string::npos);
}

TEST_CASE("checkpoint resume continues the exact shuffled shard sequence, across an epoch boundary") {
  Config c = tiny_config();
  auto synthetic = make_synthetic_source(c);
  const fs::path dir = temp_dir() / "shuffle_shards";
  fs::create_directories(dir);
  // 10 samples in two shards; 4 per step, so steps 2..4 cross into epochs 1 and 2.
  REQUIRE(write_shard((dir / "shard-00000.safetensors").string(), synthetic->get(0, 6), c.data.raw_action_dim) == "");
  REQUIRE(write_shard((dir / "shard-00001.safetensors").string(), synthetic->get(6, 4), c.data.raw_action_dim) == "");
  c.data.source = "shards";
  c.data.shard_dir = dir.string();
  std::unique_ptr<DataSource> source;
  REQUIRE(make_shard_source(c, source) == "");
  const SampleOrder order = make_sample_order(c, *source);
  REQUIRE(order.shuffle);
  REQUIRE(order.epoch_samples == 10);

  const fs::path path = temp_dir() / "shuffle_ckpt.safetensors";
  Tensor straight;
  std::vector<Tensor> straight_batches;
  {
    Trainer a(c, 0, 1, {});
    a.set_sample_order(order);
    Loader loader(*source, order, 4, 1, 0, 0, 2, at::kCPU);
    for (int s = 0; s < 2; ++s) a.step(loader.next());
    CHECK(a.data_position() == DataPosition{0, 8});
    REQUIRE(a.save(path.string()) == "");
    for (int s = 2; s < 5; ++s) {
      Batch b = loader.next();
      straight_batches.push_back(b.tokens.clone());
      a.step(b);
    }
    CHECK(a.data_position() == DataPosition{2, 0});
    straight = all_params(a.model()).clone();
  }
  std::map<std::string, SafetensorsEntry> entries;
  Metadata meta;
  REQUIRE(read_safetensors_header(path.string(), entries, &meta) == "");
  CHECK(meta["data_epoch"] == "0");
  CHECK(meta["data_offset_samples"] == "8");
  CHECK(meta["data_epoch_samples"] == "10");
  CHECK(meta["data_shuffle"] == "true");

  Trainer b(c, 0, 1, {});
  b.set_sample_order(order);
  REQUIRE(b.resume(path.string()) == "");
  CHECK(b.steps_done() == 2);
  Loader loader(*source, order, 4, 1, 0, b.steps_done(), 2, at::kCPU);
  for (int s = 2; s < 5; ++s) {
    Batch batch = loader.next();
    CHECK(at::equal(batch.tokens, straight_batches[size_t(s - 2)]));  // the same samples, in the same order
    b.step(batch);
  }
  CHECK(bitwise_equal(straight, all_params(b.model())));

  // A run that could not continue the same sequence is refused, naming what differs.
  auto refusal = [&](Config cfg, SampleOrder o) {
    Trainer t(cfg, 0, 1, {});
    t.set_sample_order(o);
    return t.resume(path.string());
  };
  SampleOrder unshuffled = order;
  unshuffled.shuffle = false;
  CHECK(refusal(c, unshuffled).find("data.shuffle") != std::string::npos);
  SampleOrder other_size = order;
  other_size.epoch_samples = 9;
  CHECK(refusal(c, other_size).find("samples per epoch") != std::string::npos);
  Config other_seed = c;
  other_seed.train.seed = 5;
  SampleOrder reseeded = order;
  reseeded.seed = 5;
  CHECK(refusal(other_seed, reseeded).find("train.seed") != std::string::npos);
  Config other_micro = c;
  other_micro.train.micro_batch = 3;
  CHECK(refusal(other_micro, order).find("micro_batch") != std::string::npos);
}

TEST_CASE("safetensors reader round trip (dtypes, shapes, metadata) and bad files") {
  const fs::path path = temp_dir() / "t.safetensors";
  TensorMap out = {
      {"f32", at::randn({3, 5})},
      {"bf16", at::randn({7}).to(at::kBFloat16)},
      {"i64", at::arange(10, at::kLong).view({2, 5})},
      {"u8", at::randint(0, 256, {2, 2, 3}, at::kByte)},
      {"bool", at::tensor({1, 0, 1}).to(at::kBool)},
      {"scalar", at::full({}, 2.5, at::kDouble)},
  };
  REQUIRE(write_safetensors(path.string(), out, {{"format", "test"}, {"note", "hi"}}) == "");
  TensorMap in;
  Metadata meta;
  REQUIRE(read_safetensors(path.string(), in, &meta) == "");
  CHECK(meta["format"] == "test");
  CHECK(meta["note"] == "hi");
  REQUIRE(in.size() == out.size());
  for (const auto& [k, v] : out) CHECK_MESSAGE(bitwise_equal(v, in.at(k)), k);
  // Header layout: 8-byte little-endian length, JSON padded to 8 bytes.
  std::ifstream f(path, std::ios::binary);
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  CHECK(len[0] % 8 == 0);

  const fs::path junk = temp_dir() / "junk.safetensors";
  std::ofstream(junk) << "definitely not safetensors";
  TensorMap none;
  CHECK(read_safetensors(junk.string(), none).find("junk.safetensors") != std::string::npos);
  CHECK(read_safetensors((temp_dir() / "missing.safetensors").string(), none).find("cannot open") != std::string::npos);
}

TEST_CASE("synthetic source is deterministic; shard round trip through the on-disk format") {
  Config c = tiny_config();
  auto source = make_synthetic_source(c);
  Batch a = source->get(5, 3), b = source->get(5, 3), one = source->get(6, 1);
  CHECK(at::equal(a.images, b.images));
  CHECK(at::equal(a.actions, b.actions));
  CHECK(at::equal(a.images[1], one.images[0]));
  CHECK(at::equal(a.tokens[1], one.tokens[0]));
  CHECK((a.images.scalar_type() == at::kByte));
  CHECK(a.images.sizes() == at::IntArrayRef({3, 2, 32, 32, 3}));
  CHECK(a.token_mask.any(1).all().item<bool>());
  CHECK_FALSE(a.token_mask.all().item<bool>());  // prompts are padded
  // actions padded with zeros beyond raw_action_dim
  CHECK(at::count_nonzero(a.actions.narrow(2, 3, 5)).item<int64_t>() == 0);

  const fs::path dir = temp_dir() / "shards";
  fs::create_directories(dir);
  REQUIRE(write_shard((dir / "shard-00000.safetensors").string(), source->get(0, 5), 3) == "");
  REQUIRE(write_shard((dir / "shard-00001.safetensors").string(), source->get(5, 4), 3) == "");
  Config sc = c;
  sc.data.source = "shards";
  sc.data.shard_dir = dir.string();
  std::unique_ptr<DataSource> shards;
  REQUIRE(make_shard_source(sc, shards) == "");
  CHECK(shards->size() == 9);
  Batch from_disk = shards->get(3, 4);  // crosses the shard boundary
  Batch expected = source->get(3, 4);
  CHECK(at::equal(from_disk.images, expected.images));
  CHECK(at::equal(from_disk.image_mask, expected.image_mask));
  CHECK(at::equal(from_disk.tokens, expected.tokens));
  CHECK(at::equal(from_disk.token_mask, expected.token_mask));
  CHECK(at::equal(from_disk.actions, expected.actions));

  Config wrong = sc;
  wrong.data.max_token_len = 13;
  const std::string err = make_shard_source(wrong, shards);
  CHECK(err.find("token_mask") != std::string::npos);
  CHECK(err.find("data.max_token_len") != std::string::npos);
}

TEST_CASE("loader delivers consecutive rank-strided batches (synthetic: dataset order)") {
  Config c = tiny_config();
  REQUIRE(c.data.shuffle);  // the default; the unbounded synthetic source keeps dataset order anyway
  auto source = make_synthetic_source(c);
  const SampleOrder order = make_sample_order(c, *source);
  CHECK_FALSE(order.shuffle);
  Loader loader(*source, order, 4, 2, 1, 3, 2, at::kCPU);  // rank 1 of 2, resuming at step 3
  Batch b = loader.next();
  CHECK(at::equal(b.actions, source->get(3 * 8 + 4, 4).actions));
  Batch b2 = loader.next();
  CHECK(at::equal(b2.actions, source->get(4 * 8 + 4, 4).actions));
}

namespace {

// A source of `n` samples whose first token is the sample's index, so a batch says which samples it
// holds. Every other field is minimal: the loader only moves batches, it never looks inside.
class IndexSource : public DataSource {
 public:
  explicit IndexSource(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Batch get(const std::vector<int64_t>& indices) const override {
    const int64_t count = int64_t(indices.size());
    for (int64_t i : indices)
      if (i < 0 || i >= n_) throw std::out_of_range("IndexSource: index out of range");
    Batch b;
    b.images = at::zeros({count, 0, 1, 1, 3}, at::kByte);
    b.image_mask = at::zeros({count, 0}, at::kBool);
    b.tokens = at::tensor(indices, at::kLong).unsqueeze(1);
    b.token_mask = at::ones({count, 1}, at::kBool);
    b.actions = at::zeros({count, 1, 1}, at::kFloat);
    return b;
  }

 private:
  int64_t n_;
};

std::vector<int64_t> indices_of(const Batch& b) {
  Tensor t = b.tokens.select(1, 0).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

std::vector<int64_t> iota_vector(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

// The sample stream of a shuffled run: epoch permutations one after another.
std::vector<int64_t> shuffled_stream(int64_t n, uint64_t seed, int64_t epochs) {
  std::vector<int64_t> out;
  for (int64_t e = 0; e < epochs; ++e) {
    auto p = epoch_permutation(n, seed, e);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

}  // namespace

TEST_CASE("epoch permutation: a permutation, reproducible, new for every epoch and seed, unbiased") {
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    auto p = epoch_permutation(n, 5, 3);
    CHECK(p == epoch_permutation(n, 5, 3));  // a fresh computation (another rank, a resumed run) agrees
    std::sort(p.begin(), p.end());
    CHECK(p == iota_vector(n));
  }
  const auto base = epoch_permutation(1000, 0, 0);
  CHECK(base != iota_vector(1000));
  CHECK(base != epoch_permutation(1000, 0, 1));
  CHECK(base != epoch_permutation(1000, 1, 0));
  CHECK(epoch_permutation(1000, 1, 0) != epoch_permutation(1000, 0, 1));  // seed and epoch do not just add
  // Each of the 6 orders of 3 samples about equally often over 1200 epochs (expected 200 each; a
  // biased draw such as rng() % n with a naive swap range would skew these well past 150..250).
  std::map<std::vector<int64_t>, int> seen;
  for (int64_t e = 0; e < 1200; ++e) ++seen[epoch_permutation(3, 11, e)];
  CHECK(seen.size() == 6);
  for (const auto& [perm, count] : seen) CHECK_MESSAGE((count > 150 && count < 250), "count ", count);
}

TEST_CASE("sample order: epoch and offset of a stream position, and back") {
  SampleOrder order{30, true, 7};
  CHECK(order.position(0) == DataPosition{0, 0});
  CHECK(order.position(29) == DataPosition{0, 29});
  CHECK(order.position(84) == DataPosition{2, 24});
  for (int64_t consumed : {0, 1, 29, 30, 84, 1000}) CHECK(order.consumed(order.position(consumed)) == consumed);
  SampleOrder unbounded;  // the synthetic source: one endless epoch
  CHECK(unbounded.position(123456) == DataPosition{0, 123456});

  Config c = tiny_config();
  IndexSource finite(30);
  CHECK(make_sample_order(c, finite).shuffle);
  CHECK(make_sample_order(c, finite).epoch_samples == 30);
  CHECK(make_sample_order(c, finite).seed == c.train.seed);
  c.data.shuffle = false;
  CHECK_FALSE(make_sample_order(c, finite).shuffle);
  REQUIRE(apply_override("data.shuffle=true", c) == "");
  CHECK(c.data.shuffle);
  CHECK(apply_override("data.shuffle=maybe", c).find("data.shuffle") != std::string::npos);
}

TEST_CASE("shuffled loader: every rank's slices are disjoint, cover each global batch and each epoch") {
  // 24 samples, 3 ranks x micro-batch 4 = global batch 12: each epoch is exactly two global batches.
  const int64_t n = 24, world = 3, micro = 4, global = world * micro, steps = 6;
  IndexSource source(n);
  const SampleOrder order{n, true, 42};
  std::vector<std::vector<std::vector<int64_t>>> got(static_cast<size_t>(world));  // [rank][step] -> indices
  for (int64_t r = 0; r < world; ++r) {
    Loader loader(source, order, micro, world, r, 0, 2, at::kCPU);  // each rank on its own, as in a real run
    for (int64_t k = 0; k < steps; ++k) got[size_t(r)].push_back(indices_of(loader.next()));
  }
  const auto stream = shuffled_stream(n, 42, steps * global / n);
  for (int64_t k = 0; k < steps; ++k) {
    std::vector<int64_t> batch;
    for (int64_t r = 0; r < world; ++r) {
      const auto& slice = got[size_t(r)][size_t(k)];
      // rank r's slice is its block of the global batch, in the stream's order
      CHECK(slice == std::vector<int64_t>(stream.begin() + k * global + r * micro,
                                          stream.begin() + k * global + (r + 1) * micro));
      batch.insert(batch.end(), slice.begin(), slice.end());
    }
    std::set<int64_t> distinct(batch.begin(), batch.end());
    CHECK(distinct.size() == size_t(global));  // the slices of one global batch are disjoint
  }
  for (int64_t e = 0; e < steps * global / n; ++e) {  // every epoch visits every sample exactly once
    std::vector<int64_t> epoch;
    for (int64_t k = e * n / global; k < (e + 1) * n / global; ++k)
      for (int64_t r = 0; r < world; ++r) epoch.insert(epoch.end(), got[size_t(r)][size_t(k)].begin(), got[size_t(r)][size_t(k)].end());
    CHECK(epoch != iota_vector(n));  // shuffled: not consecutive frames
    std::sort(epoch.begin(), epoch.end());
    CHECK(epoch == iota_vector(n));
  }
  // Another epoch order each time.
  CHECK(std::vector<int64_t>(stream.begin(), stream.begin() + n) != std::vector<int64_t>(stream.begin() + n, stream.begin() + 2 * n));
}

TEST_CASE("shuffled loader: batches straddle epochs without dropping samples; a restart continues exactly") {
  // 30 samples, global batch 12: batches cross epoch boundaries mid-batch.
  const int64_t n = 30, world = 3, micro = 4, global = world * micro;
  IndexSource source(n);
  const SampleOrder order{n, true, 3};
  const auto stream = shuffled_stream(n, 3, 5);
  for (int64_t r = 0; r < world; ++r) {
    Loader from_start(source, order, micro, world, r, 0, 3, at::kCPU);
    std::vector<std::vector<int64_t>> straight;
    for (int64_t k = 0; k < 12; ++k) straight.push_back(indices_of(from_start.next()));
    for (int64_t k = 0; k < 12; ++k)
      CHECK(straight[size_t(k)] == std::vector<int64_t>(stream.begin() + k * global + r * micro,
                                                        stream.begin() + k * global + (r + 1) * micro));
    // Restarting at step 7 (stream position 84: epoch 2, offset 24) reproduces steps 7.. exactly.
    Loader resumed(source, order, micro, world, r, 7, 1, at::kCPU);
    for (int64_t k = 7; k < 12; ++k) CHECK(indices_of(resumed.next()) == straight[size_t(k)]);
  }
}

namespace {

// A process group that records each all-reduce (and reduces nothing: one process plays every rank).
class RecordingBackend : public c10d::Backend {
 public:
  struct DoneWork : c10d::Work {
    bool isCompleted() override { return true; }
    bool wait(std::chrono::milliseconds) override { return true; }
  };
  RecordingBackend(int world) : c10d::Backend(0, world) {}
  const std::string getBackendName() const override { return "recording"; }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions&) override {
    sizes.push_back(tensors.at(0).numel());
    return c10::make_intrusive<DoneWork>();
  }
  std::vector<int64_t> sizes;
};

}  // namespace

TEST_CASE("gradient buckets: overlap launches every bucket from backward, in order; after_backward uses one; skip none") {
  Config c = tiny_config();
  c.train.bucket_cap_mb = 0.02;  // ~5k fp32 elements: several buckets for the tiny model
  Batch b = tiny_batch(c);
  auto backend = c10::make_intrusive<RecordingBackend>(2);
  Trainer overlap(c, 0, 2, backend);
  const int64_t total = overlap.model().parameter_count();
  StepStats s = overlap.step(b);
  CHECK(s.buckets > 3);
  CHECK(s.buckets_launched_in_backward == s.buckets);
  REQUIRE(backend->sizes.size() == size_t(s.buckets));
  int64_t sum = 0;
  for (auto n : backend->sizes) sum += n;
  CHECK(sum == total);  // every gradient element travels exactly once
  overlap.step(b);
  CHECK(backend->sizes.size() == size_t(2 * s.buckets));
  for (int i = 0; i < s.buckets; ++i) CHECK(backend->sizes[i] == backend->sizes[s.buckets + i]);  // same order

  // One step of `c` with one setting changed, over a backend of its own: the step's stats and the
  // sizes it all-reduced.
  auto step_with = [&](std::string TrainConfig::*setting, const char* value) {
    Config changed = c;
    changed.train.*setting = value;
    auto recording = c10::make_intrusive<RecordingBackend>(2);
    Trainer trainer(changed, 0, 2, recording);
    const StepStats stats = trainer.step(b);
    return std::pair{stats, recording->sizes};
  };

  const auto [s2, sizes2] = step_with(&TrainConfig::allreduce, "after_backward");
  CHECK(s2.buckets == 1);
  CHECK(s2.buckets_launched_in_backward == 0);
  REQUIRE(sizes2.size() == 1);
  CHECK(sizes2[0] == total);

  // "skip", the measurement switch: the buckets of overlap, and no all-reduce at all.
  const auto [s4, sizes4] = step_with(&TrainConfig::allreduce, "skip");
  CHECK(s4.buckets == s.buckets);
  CHECK(sizes4.empty());

  // Recomputed layers (activation checkpointing) still fire the hooks inside backward.
  const auto [s3, sizes3] = step_with(&TrainConfig::remat, "layers");
  CHECK(s3.buckets == s.buckets);
  CHECK(s3.buckets_launched_in_backward == s3.buckets);
}

TEST_CASE("openpi/LeRobot weights load by name, with LeRobot's and older transformers' prefixes") {
  Config c = tiny_config();
  Pi05Model source(c.model, c.data.num_images, c.data.max_token_len, at::kFloat, at::kCPU, 21);
  TensorMap file;
  for (const auto& p : source.parameters()) {
    std::string name = "model." + p.name;  // LeRobot's policy wrapper
    const std::string modern = "model.paligemma_with_expert.paligemma.model.language_model.";
    if (name.rfind(modern, 0) == 0)  // older transformers layout for the backbone
      name = "model.paligemma_with_expert.paligemma.language_model.model." + name.substr(modern.size());
    file[name] = p.tensor.detach().to(at::kBFloat16).to(at::kFloat);  // as stored in bf16
  }
  file["model.paligemma_with_expert.paligemma.lm_head.weight"] = at::zeros({3, 3});  // unused, ignored
  const fs::path path = temp_dir() / "pi05.safetensors";
  REQUIRE(write_safetensors(path.string(), file) == "");
  Trainer trainer(c, 0, 1, {});
  REQUIRE(trainer.load_weights(path.string()) == "");
  const auto& loaded = trainer.model().parameters();
  for (size_t i = 0; i < loaded.size(); ++i)
    CHECK_MESSAGE(at::equal(loaded[i].tensor.detach(), source.parameters()[i].tensor.detach().to(at::kBFloat16).to(at::kFloat)),
                  loaded[i].name);

  TensorMap partial = file;
  partial.erase(partial.begin());
  REQUIRE(write_safetensors(path.string(), partial) == "");
  CHECK(trainer.load_weights(path.string()).find("missing") != std::string::npos);
  Config wider = c;
  wider.model.width = 96;
  Trainer mismatched(wider, 0, 1, {});
  REQUIRE(write_safetensors(path.string(), file) == "");
  CHECK(mismatched.load_weights(path.string()).find("shape") != std::string::npos);
}

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  // POSIX, not fs::remove_all: the binary resolves std::filesystem to libtorch.so's copy, whose
  // remove_all jumps through a null pointer.
  ::nftw(scratch_path().c_str(), [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); },
         16, FTW_DEPTH | FTW_PHYS);
  return rc;
}
