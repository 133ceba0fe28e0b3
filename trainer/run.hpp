// The entry point of one rank, declared without LibTorch headers so the launcher compiles quickly.
#pragma once

#include "trainer/config.hpp"

namespace fp8wire::trainer {

// The whole run for one rank: process group, data, loop, logs, checkpoints, sync check.
// Returns the process exit code; every error is printed with its cause.
int run_rank(const Config& config, int rank, int world, int local_rank);

// GPUs visible to this process (0 without CUDA).
int visible_gpu_count();
// Makes `index` the current CUDA device of this process (no-op without CUDA).
void select_gpu(int index);

}  // namespace fp8wire::trainer
