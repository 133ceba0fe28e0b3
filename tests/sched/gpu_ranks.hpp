// How the multi-rank GPU tests of this folder start: the same program is the launching parent and,
// started again by launch_local_ranks (common/rank_launcher.hpp), each rank.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "common/rank_launcher.hpp"
#include "common/status.hpp"

namespace fp8wire::test {

// True (and SKIPPED printed: exit 77, a skip to ctest) when no CUDA device is visible.
inline bool no_gpu() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return false;
  std::printf("SKIPPED: no CUDA device\n");
  return true;
}

// In a rank: rank 0's NCCL unique id shared with every rank, then `rank_main`'s exit status. In the
// launching parent: nothing (it goes on to launch the ranks).
inline std::optional<int> as_rank(const std::function<int(const RankEnv&, const ncclUniqueId&)>& rank_main) {
  std::string error;
  const std::optional<RankEnv> env = rank_env_from_environment(error);
  if (!env) return std::nullopt;
  ncclUniqueId id{};
  if (env->rank == 0) FP8WIRE_NCCL_OR(ncclGetUniqueId(&id), return 1);
  if (!exchange_bootstrap_blob(*env, &id, sizeof(id), 60, error)) {
    std::printf("FAIL: bootstrap: %s\n", error.c_str());
    return 1;
  }
  return rank_main(*env, id);
}

}  // namespace fp8wire::test
