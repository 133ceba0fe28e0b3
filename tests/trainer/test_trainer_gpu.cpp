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
    const auto& p0 = trainer.model().parameters().front().tensor;
    check(p0.is_cuda() && p0.scalar_type() == at::kBFloat16, "parameters are bf16 on the GPU");
    Batch batch = make_synthetic_source(c)->get(0, c.train.micro_batch).to(trainer.device(), false);
    at::Tensor before = p0.detach().clone();
    at::Generator gen = at::detail::createCPUGenerator(1);
    at::Tensor noise = at::randn(batch.actions.sizes(), gen, at::kFloat).to(trainer.device());
    at::Tensor time = sample_flow_time(c.train.micro_batch, gen, at::kCPU).to(trainer.device());
    StepStats first = trainer.step(batch, noise, time);
    check(std::isfinite(first.loss) && first.grad_norm > 0, "step 0: finite loss and gradient");
    check(!at::equal(before, p0.detach()), "step 0 updates the parameters");
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
