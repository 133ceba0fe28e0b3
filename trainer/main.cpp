// fp8wire-train: the Pi0.5 reference trainer's command line and rank launcher.
//   fp8wire-train --config trainer/configs/pi05_small.toml --ranks 2 --steps 20 --set train.micro_batch=8
// With --ranks N (and no RANK in the environment) it starts N copies of itself, one per GPU, or all
// on GPU 0 with a distinct NCCL_HOSTID each when there are fewer GPUs than ranks (NCCL then joins
// them over sockets, as separate hosts). Children inherit the environment, LD_PRELOAD included.
// Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set) it runs that one rank.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "trainer/config.hpp"
#include "trainer/run.hpp"

extern char** environ;

namespace {

using fp8wire::trainer::Config;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

// Ranks started by this launcher, for the signal handler: a launcher stopped by Ctrl-C or a timeout
// takes its ranks with it instead of leaving them waiting in NCCL.
constexpr int kMaxRanks = 1024;
pid_t g_children[kMaxRanks];
volatile sig_atomic_t g_child_count = 0;

void forward_signal(int sig) {
  for (sig_atomic_t i = 0; i < g_child_count; ++i) ::kill(g_children[i], SIGTERM);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

int launch(const std::vector<std::string>& argv, int ranks, const Config& cfg) {
  if (cfg.train.device != "cuda") {
    fmt::print(stderr, "fp8wire-train: --ranks {}: train.device \"{}\" runs one rank only\n", ranks, cfg.train.device);
    return 2;
  }
  const int gpus = fp8wire::trainer::visible_gpu_count();
  const bool shared_gpu = ranks > gpus;
  const std::string store = (std::filesystem::temp_directory_path() /
                             fmt::format("fp8wire-train-store-{}", ::getpid())).string();
  ::unlink(store.c_str());  // a stale store from a recycled pid would confuse the rendezvous
  std::vector<pid_t> children;
  ::signal(SIGINT, forward_signal);
  ::signal(SIGTERM, forward_signal);
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      fmt::print(stderr, "fp8wire-train: fork failed for rank {}\n", r);
      for (pid_t c : children) ::kill(c, SIGTERM);
      return 2;
    }
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("FP8WIRE_TRAIN_STORE", store.c_str(), 1);
      ::unsetenv("MASTER_ADDR");
      // Several ranks on one GPU: a distinct host id per rank, set before the communicator exists.
      if (shared_gpu) ::setenv("NCCL_HOSTID", fmt::format("emulated-host-{}", r).c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv("/proc/self/exe", args.data());
      std::_Exit(127);
    }
    children.push_back(pid);
    g_children[g_child_count] = pid;
    g_child_count = g_child_count + 1;
  }
  int rc = 0;
  size_t alive = children.size();
  while (alive > 0) {
    int status = 0;
    const pid_t done = ::wait(&status);
    if (done < 0) break;
    --alive;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && rc == 0) {
      rc = code;
      // One rank failed: the others would wait for it in NCCL forever.
      for (pid_t c : children)
        if (c != done) ::kill(c, SIGTERM);
      fmt::print(stderr, "fp8wire-train: a rank exited with code {}; stopped the others\n", code);
    }
  }
  ::unlink(store.c_str());
  return rc;
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
  app.add_option("--ranks", ranks, "data-parallel ranks to start on this host (1 to 1024)");
  app.add_option("--steps", steps, "optimiser steps (overrides train.steps)");
  app.add_option("--set", overrides, "key=value override, e.g. --set train.micro_batch=16 (repeatable)");
  app.add_flag("--print-config", print_config, "print the resolved configuration and exit");
  CLI11_PARSE(app, argc, argv);
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
