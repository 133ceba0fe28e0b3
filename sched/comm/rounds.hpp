// The agreement's later rounds, run only where it allowed FP8 (each one a few small all-gathers, taken
// by every rank alike, so a "no" anywhere leaves every rank without the feature, never out of step).
// An exchange that fails on this rank (its deadline, an abort, an NCCL error) is returned: this rank
// cannot know what its peers concluded, so the communicator's creation fails (comm_setup.cpp).
#pragma once

#include <nccl.h>

#include <cstdint>
#include <span>

#include "common/config.hpp"
#include "sched/comm/comm_state.hpp"
#include "sched/plan/agreement.hpp"

namespace fp8wire::sched {

// A communicator spanning hosts with several ranks on each: the host and rail sub-communicators
// (collective over the parent, every rank in the same order), between two 4-byte all-gathers: one
// that every rank is there (so that a rank killed or stopped before its splits is found by an
// exchange with a deadline, not by NCCL's split, which has none), one that every rank has both.
// Without the second nobody uses them (hierarchy_round.cpp).
ncclResult_t split_hierarchy(CommState& s, const Agreement& a);

// Every rank on this machine: the direct windows, peer memory or host memory, tried in order; any
// failure anywhere and every rank goes on over NCCL's transports (direct_round.cpp). `gpu`: this
// rank's HostFacts::gpu_hash, offered to the peers.
ncclResult_t setup_direct(CommState& s, const Config& config, std::span<const RankFacts> facts, uint64_t gpu);

}  // namespace fp8wire::sched
