// What the multi-rank GPU tests that launch their own ranks share (guard_gpu.cpp,
// multirank_collectives.cpp): the world sizes of --ranks, and the start of one launched rank.
#pragma once

#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "common/rank_launcher.hpp"
#include "common/status.hpp"

namespace fp8wire {

// "2,3,4": the world sizes to run.
inline std::vector<int> world_sizes(const std::string& list) {
  std::vector<int> worlds;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) worlds.push_back(std::atoi(item.c_str()));
  return worlds;
}

// One rank the test's launcher started (RANK, WORLD_SIZE, MASTER_PORT, and NCCL_HOSTID when emulated,
// set): killed by SIGALRM after `timeout_s` (a hang kills the rank, not the CI job), the NCCL unique
// id served by rank 0, then run(env, id); returns the rank's exit code.
template <class Run>
int run_launched_rank(int timeout_s, Run run) {
  std::string error;
  const auto env = rank_env_from_environment(error);
  if (!env) {
    std::fprintf(stderr, "rank: %s\n", error.empty() ? "RANK/WORLD_SIZE not set" : error.c_str());
    return 2;
  }
  alarm(static_cast<unsigned>(timeout_s));
  ncclUniqueId id{};
  if (env->rank == 0) FP8WIRE_NCCL_OR(ncclGetUniqueId(&id), return 4);
  if (!exchange_bootstrap_blob(*env, &id, sizeof(id), 60, error)) {
    std::fprintf(stderr, "rank %d: %s\n", env->rank, error.c_str());
    return 4;
  }
  return run(*env, id);
}

}  // namespace fp8wire
