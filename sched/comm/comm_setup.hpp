// The agreement at communicator creation (docs/DESIGN.md has its rules): right after the real
// ncclCommInitRank*/ncclCommSplit returns, every process running fp8wire allocates its pipeline
// resources, then tells the others its facts (RankFacts) with one real all-gather of 64 bytes per
// rank, and decides from the gathered bytes (agree). A process whose configuration failed still
// takes part (it reports "not usable" and why), so the whole communicator passes through on every
// rank alike instead of hanging one rank in an exchange its peers never start.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <span>
#include <string>

#include "common/config.hpp"
#include "sched/comm/comm_state.hpp"

namespace fp8wire::sched {

// Queries the communicator (ranks, rank, device). False while NCCL cannot answer yet.
bool query_comm(CommState& s);
// The agreement of the communicators one thread just created (usually one; several when one thread
// drives several ranks, whose all-gathers are then issued in one NCCL group so none waits for
// another). Blocking: the thread waits for the exchanges, but gives up, without freeing anything in
// use, once `aborting` is set, NCCL reports an error on the communicator or the set-up's deadline
// (setup_timeout_s) passes; the communicator's set-up has then failed (CommSetup::failed, with the
// error in `failed()`), and its creation must fail.
void agree_at_creation(std::span<CommState* const> comms, const Config& config, const LocalIdentity& me);

}  // namespace fp8wire::sched
