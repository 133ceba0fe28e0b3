#include "sched/comm/comm_state.hpp"

#include "sched/comm/comm_setup.hpp"
#include "sched/comm/telemetry.hpp"
#include "sched/platform/platform.hpp"
#include "sched/transport/direct_windows.hpp"

namespace fp8wire::sched {

CommState::CommState(const Platform& p, std::atomic<int64_t>& feedback_budget, ncclComm_t c, uint64_t i)
    : platform(&p), comm(c), id(i), transport(*p.nccl, c, 0, 1), hierarchy(*p.nccl),
      feedback(p.cuda, feedback_budget) {}

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

}  // namespace fp8wire::sched
