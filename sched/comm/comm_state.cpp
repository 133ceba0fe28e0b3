#include "sched/comm/comm_state.hpp"

#include "common/log.hpp"
#include "sched/comm/exchange.hpp"
#include "sched/comm/telemetry_monitor.hpp"
#include "sched/platform/device_guard.hpp"
#include "sched/platform/platform.hpp"
#include "sched/transport/direct_windows.hpp"

namespace fp8wire::sched {

CommState::CommState(const Platform& p, ProcessBudgets& budgets, ncclComm_t c, uint64_t i)
    : platform(&p), scratch_budget(&budgets.scratch), comm(c), id(i), transport(*p.nccl, c, 0, 1), hierarchy(*p.nccl),
      feedback(p.cuda, budgets.feedback) {}

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

ncclResult_t release_resources(CommState& s) {
  CommResources& r = s.res;
  if (!r.produce && !r.transfer && !r.scratch && !r.fork && !s.direct) return ncclSuccess;  // touch no device it never used
  if (host_call_running(s)) {
    // NCCL still runs a launch or a split of its set-up that was given up on: it may yet enqueue on
    // the lanes and write into the scratch.
    FP8WIRE_WARN("comm {}: closed while NCCL still runs a call of its set-up: its lanes and scratch stay allocated",
                 s.id);
    r = CommResources{};
    return ncclSuccess;
  }
  const CudaApi& cuda = s.platform->cuda;
  DeviceGuard guard(cuda, s.device);
  if (s.exchange_in_flight && !s.aborting.load(std::memory_order_acquire)) {
    // A set-up exchange given up without the real abort (a destroy after a failed set-up): while it
    // runs, NCCL may still write into the scratch from the transfer lane, and synchronizing the lane
    // could wait forever.
    bool idle = true;
    for (cudaStream_t lane : {r.produce, r.transfer, r.send, r.fetch})
      if (lane && cuda.StreamQuery(lane) == cudaErrorNotReady) idle = false;
    if (!idle) {
      FP8WIRE_WARN("comm {}: destroyed while its set-up's given-up exchange still runs: its lanes and scratch stay "
                   "allocated (ncclCommAbort stops the exchange)", s.id);
      r = CommResources{};
      return ncclSuccess;
    }
  }
  ncclResult_t result = ncclSuccess;
  if (s.direct) {
    // A lane may wait on a peer's flag: after an abort, or once that peer is gone, no signal comes,
    // and this rank releases its own waits. Then the windows go once every peer has read what this
    // rank wrote (their release flags), so that no peer's kernel reads freed memory. A call whose wait
    // on a gone peer was released completes on data that peer never wrote: its end is an error.
    const cudaStream_t lanes[] = {r.produce, r.transfer, r.send, r.fetch};
    if (const int gone = s.direct->drain(lanes, 4, s.aborting); gone >= 0) {
      FP8WIRE_ERROR("comm {}: its FP8 call in flight waited on rank {}, which has gone, when the communicator was "
                    "closed: that call's output is not valid (ncclRemoteError)", s.id, gone);
      s.fail(ncclRemoteError);
      result = ncclRemoteError;
    }
    // Every release this rank owes is written: from here its peers may see it as closed in order.
    s.direct->mark_closed();
    if (!s.direct->wait_peers_done(s.aborting)) s.direct->keep_own_window();
    s.direct.reset();
  }
  // The lanes may still run an FP8 call of this communicator (its last one, or one an abort cut
  // short): wait for them before freeing what they read.
  for (cudaStream_t lane : {r.produce, r.transfer, r.send, r.fetch})
    if (lane) cuda.StreamSynchronize(lane);
  for (CommState::AbandonedWindow& a : s.abandoned_windows) (a.own ? s.platform->direct.destroy : s.platform->direct.close)(a.window);
  s.abandoned_windows.clear();
  if (r.scratch) cuda.Free(r.scratch);
  s.scratch_budget->give_back(r.scratch_taken);
  for (cudaEvent_t e : {r.fork, r.tail, r.produce_end, r.last, r.capture_produce_end, r.capture_transfer_end,
                        r.to_copy_lane, r.to_kernel_lane, r.send_end})
    if (e) cuda.EventDestroy(e);
  for (int i = 0; i < kMaxBufferSets; ++i)
    for (cudaEvent_t e : {r.ready[i], r.done[i], r.acquired[i]})
      if (e) cuda.EventDestroy(e);
  for (cudaStream_t lane : {r.produce, r.transfer, r.send, r.fetch})
    if (lane) cuda.StreamDestroy(lane);
  r = CommResources{};
  return result;
}

}  // namespace fp8wire::sched
