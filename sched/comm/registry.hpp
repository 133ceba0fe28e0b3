// The registry: every communicator fp8wire saw created, by NCCL handle. It holds one reference to each
// CommState; lookups hand out more (a call in flight, a call queued in an open group).
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "sched/comm/comm_state.hpp"

namespace fp8wire::sched {

class Registry {
 public:
  Registry(const Platform& platform, ProcessBudgets& budgets) : platform_(&platform), budgets_(&budgets) {}
  // Registers a communicator (replacing a stale entry at the same address).
  CommRef add(ncclComm_t comm);
  CommRef find(ncclComm_t comm) const;
  // A registered communicator's identity, copied under the lock: no reference taken (the cheap
  // lookup of calls that pass through anyway).
  bool identity(ncclComm_t comm, CommIdentity* out) const;
  // Takes it out of the registry and marks it dead; the caller drops the last registry reference.
  CommRef detach(ncclComm_t comm);
  // Everything registered, for the engine's destructor.
  void clear();
  // A reference to everything registered (a diagnosis of every communicator's state).
  std::vector<CommRef> all() const;

 private:
  const Platform* platform_;
  ProcessBudgets* budgets_;
  mutable std::mutex mutex_;
  std::unordered_map<ncclComm_t, CommRef> comms_;
  uint64_t next_id_ = 1;
};

}  // namespace fp8wire::sched
