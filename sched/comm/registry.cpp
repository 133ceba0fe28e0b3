#include "sched/comm/registry.hpp"

namespace fp8wire::sched {

CommRef Registry::add(ncclComm_t comm) {
  auto state = std::make_shared<CommState>(*platform_, *budgets_, comm, 0);
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

std::vector<CommRef> Registry::all() const {
  std::lock_guard lock(mutex_);
  std::vector<CommRef> out;
  for (const auto& [comm, state] : comms_) out.push_back(state);
  return out;
}

}  // namespace fp8wire::sched
