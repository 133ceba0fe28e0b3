// GPU smoke test of the trainer on the `tiny` preset in bf16: parameters bf16 on the device with fp32
// masters, step 0 updates, the loss is finite and falls on a fixed batch, remat matches.
// Skips (exit 77) where no CUDA device is visible.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>

#include "trainer/config.hpp"
#include "trainer/data.hpp"
#include "trainer/model.hpp"
#include "trainer/run.hpp"
#include "trainer/train.hpp"

using namespace fp8wire::trainer;

namespace {
int failures = 0;
void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "PASS" : "FAIL", what);
  if (!ok) ++failures;
}
}  // namespace

int main() {
  if (visible_gpu_count() == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  try {
    Config c;
    std::string err = load_config_file(std::string(FP8WIRE_TRAINER_CONFIG_DIR) + "/tiny.toml", c);
    check(err.empty(), "tiny preset loads");
    c.train.device = "cuda";
    c.train.dtype = "bf16";
    c.train.peak_lr = 3e-3;
    c.train.end_lr = 3e-3;
    c.train.warmup_steps = 0;
    Trainer trainer(c, 0, 1, {});
    const auto& params = trainer.model().parameters();
    check(params.front().tensor.is_cuda() && params.front().tensor.scalar_type() == at::kBFloat16,
          "parameters are bf16 on the GPU");
    Batch batch = make_synthetic_source(c)->get(0, c.train.micro_batch).to(trainer.device(), false);
    std::vector<at::Tensor> masters_before;
    for (size_t k = 0; k < params.size(); ++k) masters_before.push_back(trainer.master(k).clone());
    at::Generator gen = at::detail::createCPUGenerator(1);
    at::Tensor noise = at::randn(batch.actions.sizes(), gen, at::kFloat).to(trainer.device());
    at::Tensor time = sample_flow_time(c.train.micro_batch, gen, at::kCPU).to(trainer.device());
    StepStats first = trainer.step(batch, noise, time);
    check(std::isfinite(first.loss) && first.grad_norm > 0, "step 0: finite loss and gradient");
    check(first.lr > 0 && first.lr == learning_rate(c.train, 0), "step 0: learning rate > 0");
    // "Step 0 updates" means the optimiser moved the fp32 masters of every parameter that received a
    // gradient. With openpi's zero-initialised adaRMS gates only the expert's output path receives
    // one at step 0, and an update of ~lr may be below bf16 resolution for a given weight, so the
    // bf16 copy is checked to be exactly the rounded master, not to differ from before.
    int with_grad = 0, moved = 0;
    bool device_is_rounded_master = true;
    for (size_t k = 0; k < params.size(); ++k) {
      const at::Tensor& p = params[k].tensor;
      if (p.grad().defined() && p.grad().abs().max().item<float>() > 0) {
        ++with_grad;
        if (!at::equal(masters_before[k], trainer.master(k))) ++moved;
        else std::printf("  master of %s did not move\n", params[k].name.c_str());
      }
      device_is_rounded_master &= at::equal(p.detach(), trainer.master(k).to(at::kBFloat16));
    }
    std::printf("step 0: %d of %zu parameters received a gradient, %d masters moved\n", with_grad, params.size(),
                moved);
    check(with_grad > 0 && moved == with_grad, "step 0 moves the fp32 master of every parameter with a gradient");
    check(device_is_rounded_master, "bf16 parameters are the rounded fp32 masters after the step");
    double last = first.loss;
    for (int i = 0; i < 200 && last > first.loss / 10; ++i) last = trainer.step(batch, noise, time).loss;
    std::printf("fixed-batch loss %.4f -> %.4f in %lld steps\n", first.loss, last, (long long)trainer.steps_done());
    check(last < first.loss / 10, "bf16 on GPU overfits a fixed batch (loss / 10)");

    at::Tensor losses[2];
    for (int k = 0; k < 2; ++k) {
      Pi05Model m(c.model, c.data.num_images, c.data.max_token_len, at::kBFloat16, trainer.device(), 3);
      m.set_remat(k ? Remat::layers : Remat::none);
      losses[k] = m.loss(batch, noise, time).detach();
    }
    check(at::equal(losses[0], losses[1]), "remat gives the same bf16 loss");
  } catch (const std::exception& e) {
    std::printf("FAIL: exception: %s\n", e.what());
    return 1;
  }
  return failures ? 1 : 0;
}
