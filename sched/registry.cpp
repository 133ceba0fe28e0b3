#include "sched/comm_setup.hpp"
#include "sched/comm_state.hpp"
#include "sched/telemetry.hpp"

namespace fp8wire::sched {

CommState::CommState(const Platform& p, std::atomic<int64_t>& feedback_budget, ncclComm_t c, uint64_t i)
    : platform(&p), comm(c), id(i), transport(*p.nccl, c, 0, 1), host_transport(*p.nccl, nullptr, 0, 1),
      rail_transport(*p.nccl, nullptr, 0, 1), feedback(p.cuda, feedback_budget) {}

CommState::~CommState() {
  // After an abort the sub-communicators may hold operations that will never finish: abort them
  // before the lanes are synchronised; else destroy them once the lanes are done.
  const NcclApi& api = *platform->nccl;
  const bool abort = aborting.load(std::memory_order_acquire);
  if (abort)
    for (ncclComm_t c : {hierarchy.host, hierarchy.rail})
      if (c && api.CommAbort) api.CommAbort(c);
  release_resources(*this);
  if (!abort)
    for (ncclComm_t c : {hierarchy.host, hierarchy.rail})
      if (c && api.CommDestroy) api.CommDestroy(c);
}

CommRef Registry::add(ncclComm_t comm) {
  auto state = std::make_shared<CommState>(*platform_, *feedback_budget_, comm, 0);
  std::lock_guard lock(mutex_);
  state->id = next_id_++;
  CommRef& slot = comms_[comm];
  if (slot) slot->dead.store(true, std::memory_order_release);  // a stale entry whose destroy we missed
  slot = state;
  return state;
}

CommRef Registry::find(ncclComm_t comm) const {
  std::lock_guard lock(mutex_);
  auto it = comms_.find(comm);
  return it == comms_.end() ? nullptr : it->second;
}

bool Registry::identity(ncclComm_t comm, CommIdentity* out) const {
  std::lock_guard lock(mutex_);
  auto it = comms_.find(comm);
  if (it == comms_.end()) return false;
  *out = it->second->identity();
  return true;
}

CommRef Registry::detach(ncclComm_t comm) {
  std::lock_guard lock(mutex_);
  auto it = comms_.find(comm);
  if (it == comms_.end()) return nullptr;
  CommRef state = std::move(it->second);
  comms_.erase(it);
  state->dead.store(true, std::memory_order_release);
  return state;
}

void Registry::clear() {
  std::unordered_map<ncclComm_t, CommRef> all;
  {
    std::lock_guard lock(mutex_);
    all.swap(comms_);
  }
  for (auto& [comm, state] : all) state->dead.store(true, std::memory_order_release);
}

}  // namespace fp8wire::sched
