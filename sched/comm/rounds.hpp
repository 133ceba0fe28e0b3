// The agreement's later rounds, run only where it allowed FP8 (each one a few small all-gathers, taken
// by every rank alike, so a failure anywhere leaves every rank without the feature, never out of step).
#pragma once

#include <cstdint>
#include <span>

#include "common/config.hpp"
#include "sched/comm/comm_state.hpp"
#include "sched/plan/agreement.hpp"

namespace fp8wire::sched {

// A communicator spanning hosts with several ranks on each: the host and rail sub-communicators
// (collective over the parent, every rank in the same order), then a 4-byte all-gather confirming
// that every rank has both. Without it nobody uses them (hierarchy_round.cpp).
void split_hierarchy(CommState& s, const Agreement& a);

// Every rank on this machine: the direct windows, peer memory or host memory, tried in order; any
// failure anywhere and every rank goes on over NCCL's transports (direct_round.cpp). `gpu`: this
// rank's HostFacts::gpu_hash, offered to the peers.
void setup_direct(CommState& s, const Config& config, std::span<const RankFacts> facts, uint64_t gpu);

}  // namespace fp8wire::sched
