// fp8wire-train: the Pi0.5 reference trainer's command line and rank launcher.
//   fp8wire-train --config trainer/configs/pi05_small.toml --ranks 2 --steps 20 --set train.micro_batch=8
// With --ranks N (and no RANK in the environment) it starts N copies of itself, one per GPU, or all
// on GPU 0 with a distinct NCCL_HOSTID each when there are fewer GPUs than ranks (NCCL then joins
// them over sockets, as separate hosts; a private MPS daemon runs them side by side where possible,
// FP8WIRE_MPS=0 turns it off). Children inherit the environment, LD_PRELOAD included.
// Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set) it runs that one rank.
#include <signal.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/command_line.hpp"
#include "common/rank_launcher.hpp"
#include "trainer/config.hpp"
#include "trainer/run.hpp"

namespace {

using fp8wire::trainer::Config;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

constexpr int kMaxRanks = 1024;  // ranks one launcher starts on one host

// Ranks go through the project's one launcher (common/rank_launcher.hpp): torchrun's variables, a
// rendezvous on a free port, every rank stopped when one fails or the launcher is interrupted, and
// ranks sharing GPU 0 under a private MPS daemon where one can be started.
int launch(const std::vector<std::string>& argv, int ranks, const Config& cfg) {
  if (cfg.train.device != "cuda") {
    fmt::print(stderr, "fp8wire-train: --ranks {}: train.device \"{}\" runs one rank only\n", ranks, cfg.train.device);
    return 2;
  }
  const int gpus = fp8wire::trainer::visible_gpu_count();  // main() has refused a machine without one
  fp8wire::LaunchSpec spec;
  spec.argv = argv;
  spec.argv[0] = "/proc/self/exe";
  spec.nranks = ranks;
  spec.timeout_s = 0;  // a training run takes as long as it takes
  spec.one_gpu = ranks > gpus;
  const fp8wire::LaunchResult res = fp8wire::launch_local_ranks(spec);
  if (!res.testbed.empty()) fmt::print("ranks: {} on one GPU, {}\n", ranks, res.testbed_note);
  if (res.ok) return 0;
  fmt::print(stderr, "fp8wire-train: {}\n", res.error);
  for (int code : res.exit_codes)
    if (code != 0 && code != 128 + SIGTERM) return code;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fp8wire-train: Pi0.5 reference trainer (LibTorch, data parallel over NCCL)"};
  std::string config_path;
  int ranks = 1;
  int64_t steps = 0;
  std::vector<std::string> overrides;
  bool print_config = false;
  app.add_option("--config", config_path, "TOML preset, e.g. trainer/configs/pi05.toml")->required();
  app.add_option("--ranks", ranks, "data-parallel ranks to start on this host, 1 to 1024 (more than GPUs: sharing GPU 0, under a "
                 "private MPS daemon unless FP8WIRE_MPS=0)");
  app.add_option("--steps", steps, "optimiser steps (overrides train.steps)");
  app.add_option("--set", overrides, "key=value override, e.g. --set train.micro_batch=16 (repeatable)");
  app.add_flag("--print-config", print_config, "print the resolved configuration and exit");
  if (const auto status = fp8wire::parse_command_line(app, argc, argv, "fp8wire-train")) return *status;
  if (ranks < 1 || ranks > kMaxRanks) {
    fmt::print(stderr, "fp8wire-train: --ranks {}: expected 1 to {} data-parallel ranks on this host\n", ranks,
               kMaxRanks);
    return 2;
  }

  Config cfg;
  if (auto err = fp8wire::trainer::load_config_file(config_path, cfg); !err.empty()) {
    fmt::print(stderr, "fp8wire-train: --config {}\n", err);
    return 2;
  }
  for (const auto& o : overrides)
    if (auto err = fp8wire::trainer::apply_override(o, cfg); !err.empty()) {
      fmt::print(stderr, "fp8wire-train: {}\n", err);
      return 2;
    }
  if (app.count("--steps")) {
    if (steps < 0) {
      fmt::print(stderr, "fp8wire-train: --steps {}: expected 0 or more optimiser steps\n", steps);
      return 2;
    }
    cfg.train.steps = steps;
  }
  if (auto err = fp8wire::trainer::validate(cfg); !err.empty()) {
    fmt::print(stderr, "fp8wire-train: {}\n", err);
    return 2;
  }
  if (print_config) {
    fmt::print("{}", fp8wire::trainer::describe(cfg));
    return 0;
  }
  // Before any rank starts: LibTorch's own error here is a driver message and a page of stack.
  if (cfg.train.device == "cuda" && fp8wire::trainer::visible_gpu_count() == 0) {
    fmt::print(stderr, "fp8wire-train: train.device is \"cuda\" but no GPU is visible "
                       "(train.device = \"cpu\" runs on the CPU, as trainer/configs/tiny.toml does)\n");
    return 2;
  }
  if (std::getenv("RANK")) {
    const int rank = env_int("RANK", 0), world = env_int("WORLD_SIZE", 1), local = env_int("LOCAL_RANK", rank);
    if (cfg.train.device == "cuda") {
      const int gpus = fp8wire::trainer::visible_gpu_count();
      if (gpus > 0) fp8wire::trainer::select_gpu(local % gpus);
      // torchrun with more local ranks than GPUs: ranks sharing a GPU must look like separate hosts
      // to NCCL, or it refuses duplicate GPUs; set before the communicator exists.
      const int local_world = env_int("LOCAL_WORLD_SIZE", world);
      if (gpus > 0 && local_world > gpus && !std::getenv("NCCL_HOSTID"))
        ::setenv("NCCL_HOSTID", fmt::format("emulated-host-{}", rank).c_str(), 1);
    }
    return fp8wire::trainer::run_rank(cfg, rank, world, local);
  }
  if (ranks == 1) return fp8wire::trainer::run_rank(cfg, 0, 1, 0);
  return launch(std::vector<std::string>(argv, argv + argc), ranks, cfg);
}
