#include "sched/exec/pipeline.hpp"

#include <algorithm>
#include <utility>

#include "common/log.hpp"
#include "common/nvtx.hpp"
#include "common/status.hpp"
#include "sched/transport/direct_windows.hpp"

namespace fp8wire::sched {

namespace {
// Makes `caller` wait for both lanes of `s`: the transfer lane's end covers every finished stage,
// the produce lane's end a stage an error cut short before its hand-over.
cudaError_t join_lanes(const CudaApi& cuda, CommState& s, cudaStream_t caller, bool capturing) {
  CommResources& r = s.res;
  cudaEvent_t produce_end = capturing ? r.capture_produce_end : r.produce_end;
  cudaEvent_t transfer_end = capturing ? r.capture_transfer_end : r.last;
  cudaError_t err = cuda.EventRecord(produce_end, r.produce);
  if (err == cudaSuccess) err = cuda.EventRecord(transfer_end, r.transfer);
  if (err == cudaSuccess) err = cuda.StreamWaitEvent(caller, produce_end, 0);
  if (err == cudaSuccess) err = cuda.StreamWaitEvent(caller, transfer_end, 0);
  return err;
}
}  // namespace

ncclResult_t JoinList::join_all() {
  ncclResult_t first = ncclSuccess;
  for (Pending& p : joins_) {
    const CudaApi& cuda = p.state->platform->cuda;
    const cudaError_t err = join_lanes(cuda, *p.state, p.caller, p.capturing);
    if (err != cudaSuccess) {
      FP8WIRE_ERROR("comm {}: joining the caller's stream failed: {}", p.state->id, cuda.GetErrorString(err));
      p.state->fail(ncclUnhandledCudaError);
      if (first == ncclSuccess) first = ncclUnhandledCudaError;
    }
  }
  joins_.clear();
  return first;
}

PipelineRun::PipelineRun(const CommRef& s, cudaStream_t caller, bool capturing, bool mark_begin, JoinList* deferred)
    : s_(s), cuda_(&s->platform->cuda), caller_(caller), capturing_(capturing), deferred_(deferred) {
  CommResources& r = s->res;
  // A previous call may still read the scratch on the transfer lane, also one of the same group
  // (whose join is deferred) or of the same capture: the produce lane waits for the transfer lane as
  // it stands after the fork. Both lanes are in the caller's context by then (a capture's branches
  // once forked), so the event is recorded and waited on in one context. Work of an earlier eager call
  // is not in a capture's graph; the application orders eager work and graph replays on its stream,
  // as PyTorch's process group does.
  cudaError_t err = cuda_->EventRecord(r.fork, caller);
  if (err == cudaSuccess) err = cuda_->StreamWaitEvent(r.produce, r.fork, 0);
  if (err == cudaSuccess) err = cuda_->StreamWaitEvent(r.transfer, r.fork, 0);
  if (err == cudaSuccess) err = cuda_->EventRecord(r.tail, r.transfer);
  if (err == cudaSuccess) err = cuda_->StreamWaitEvent(r.produce, r.tail, 0);
  begin_ = check(err, "forking the pipeline lanes");
  // With the exposure profiler's hooks installed (the caller says), an empty kernel marks when the
  // lanes entered the call: the waits on the peers that follow show in no record of their own
  // (quant/call_mark.cu). A mark that could not be launched only shortens the call's span in the
  // report, so the call goes on.
  if (begin_ == ncclSuccess && mark_begin && s->platform->codec.mark_call_begin)
    (void)s->platform->codec.mark_call_begin(r.produce);
}

PipelineRun::~PipelineRun() {
  if (!joined_) finish(ncclSuccess);
}

ncclResult_t PipelineRun::check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return ncclSuccess;
  FP8WIRE_ERROR("comm {}: {} failed: {}", s_->id, what, cuda_->GetErrorString(err));
  return ncclUnhandledCudaError;
}

ncclResult_t PipelineRun::run(StageProgram& program, StageOps& ops, size_t count, size_t stage_elems) {
  if (begin_ != ncclSuccess) return begin_;
  CommResources& r = s_->res;
  // direct.copy_lanes (StageOps::set_lanes): calls ordered by events, not under capture. A program
  // with a gather (two-shot) sends from its transfer lane too (the reduced shard it computed, then
  // its publish): those stay there, behind the reduce they follow; its gather's acquire and copy-in
  // go to the fetch lane like the finish's. The copy lanes start where the produce lane
  // stands: after the fork, the transfer lane's work of the previous call (whose reduce may still
  // read the copy-in slots the fetch lane fills) and whatever the call put on the produce lane first
  // (a new error-feedback residual is zeroed there, and a quantize on the send lane reads it). At
  // the end the transfer lane waits for both (the fetch lane's end is its hop event, which only
  // that lane records), so the join covers them whatever the call's outcome.
  const bool copy_lanes = ops.copy_lanes() && !capturing_ && r.send && r.fetch && !ops.lanes_by_flags() &&
                          ops.handover() == LaneHandover::both;
  if (!copy_lanes) return run_stages(program, ops, count, stage_elems, false);
  cudaError_t err = cuda_->EventRecord(r.to_copy_lane, r.produce);
  for (cudaStream_t lane : {r.send, r.fetch})
    if (err == cudaSuccess) err = cuda_->StreamWaitEvent(lane, r.to_copy_lane, 0);
  ncclResult_t res = check(err, "forking the copy lanes");
  if (res == ncclSuccess) res = run_stages(program, ops, count, stage_elems, true);
  err = cudaSuccess;
  for (auto [lane, end] : {std::pair{r.send, r.send_end}, std::pair{r.fetch, r.to_kernel_lane}}) {
    if (err == cudaSuccess) err = cuda_->EventRecord(end, lane);
    if (err == cudaSuccess) err = cuda_->StreamWaitEvent(r.transfer, end, 0);
  }
  const ncclResult_t joined = check(err, "joining the copy lanes");
  return res != ncclSuccess ? res : joined;
}

ncclResult_t PipelineRun::run_stages(StageProgram& program, StageOps& ops, size_t count, size_t stage_elems,
                                     bool copy_lanes) {
  CommResources& r = s_->res;
  const size_t stages = stage_count(count, stage_elems);
  // direct.lane_flags: the lanes hand stages over by the transport's flags, not events. Each wait is
  // issued after the store it waits for, so an error cut short leaves no wait unsatisfiable; the flags
  // are then out of their initial state, which only a later FP8 call could trip on, and a failed
  // communicator runs none (CommState::failed). Not under capture: a graph orders its branches by its
  // edges only, and a flag between two branches is no edge (a replay could run one branch's wait
  // before the other's store), so captured calls keep the events.
  // direct.lanes_apart: the transfer lane reads nothing the produce lane writes into a buffer set
  // (sched/algorithms/direct.cpp, "Lanes apart"), so no stage waits for a set to drain; and out of
  // place, where it overwrites nothing the produce lane reads either, no stage is handed over but
  // for its release of the set, which waits for its produce (liveness, StageOps::gate_release). A
  // hand-over that stays is an event then: a flag is only reset safely by a waiter that the reuse
  // wait orders before the next store (a produce two stages on could set it before this one's reset).
  const LaneHandover handover = capturing_ ? LaneHandover::both : ops.handover();
  const DirectWindows* lanes = capturing_ || handover != LaneHandover::both ? nullptr : ops.lanes_by_flags();
  const bool reuse_wait = handover == LaneHandover::both;
  const bool ready_wait = handover != LaneHandover::none;
  // direct.early_copy_in: the hand-over by event waits at the stage's produce gate (StageOps::
  // gate_produce), after the copy-in of what the peers published, not before the stage's finish.
  const bool early_copy_in = ops.early_copy_in();
  // direct.paced_sends (events only): stage i's first write into a window waits until every peer has
  // published stage i-1 (its acquire, on the transfer lane or with copy lanes the fetch lane). The
  // ranks of one host share the copy engines in the order their copies arrive; unpaced, a rank ahead
  // queues all its stages' sends before its peers' first, and every rank's reads of the lagging
  // rank's stages wait behind them. Not for a program with a gather (two-shot): the lane of its
  // acquires reaches stage i's only after the gather of stage i-2, and tying the sends to that
  // serialised its two phases (measured 0.63-0.71x at 64 MiB, docs/PERF.md "Host-link limit").
  const bool paced = ops.paced_sends() && !lanes && !program.has_gather();
  // Buffer sets: two, or over a direct transport its windows' (direct.sets), the device scratch cut
  // alike (ScratchLayout::set_bytes_for, which the direct programs' device slots are sized by).
  static_assert(kDirectMaxSets <= kMaxBufferSets);
  const int sets = ops.direct() ? ops.direct()->sets() : 2;
  // A program's gather (StageProgram) one stage late where a third set leaves room: stage i+1's
  // produce then still has a set of its own while stages i-1 and i hold theirs.
  const bool late_gather = program.has_gather() && sets >= 3;
  // The end of a stage's transfer part: its gather, then the set handed back to the produce lane.
  auto end_stage = [&](const Stage& st) -> ncclResult_t {
    FP8WIRE_TRY(program.gather(ops, st));
    const size_t set = static_cast<size_t>(st.set_index);
    if (reuse_wait && lanes) return lanes->lanes_drained(r.transfer, st.set_index);
    if (reuse_wait) return check(cuda_->EventRecord(r.done[set], r.transfer), "releasing a buffer set");
    return ncclSuccess;
  };
  Stage previous;
  for (size_t i = 0; i < stages; ++i) {
    const size_t set = i % static_cast<size_t>(sets);
    Stage st;
    st.index = i;
    st.offset = i * stage_elems;
    st.length = std::min(stage_elems, count - st.offset);
    st.set = r.scratch + r.layout.set_offset(static_cast<int>(set), sets);
    st.set_index = static_cast<int>(set);
    st.only = stages == 1;
    st.last = i + 1 == stages;
    // The set was last read by stage i-sets' finish, or its gather where the program has one (with
    // lane flags, by the last stage that used it).
    if (reuse_wait && lanes) FP8WIRE_TRY(lanes->lanes_reuse(r.produce, st.set_index));
    else if (reuse_wait && i >= static_cast<size_t>(sets)) {
      FP8WIRE_TRY(check(cuda_->StreamWaitEvent(r.produce, r.done[set], 0), "waiting for a buffer set"));
      // The fetch lane refills the set's copy-in slots (two-shot's reduced slots too), and the send
      // lane the rank's own window, which stage i-sets' reduce or decode may have read (the peers'
      // reads of the window are the reclaim's).
      if (copy_lanes)
        for (cudaStream_t lane : {r.send, r.fetch})
          FP8WIRE_TRY(check(cuda_->StreamWaitEvent(lane, r.done[set], 0), "waiting for a buffer set"));
    }
    ops.set_lanes(r.produce, copy_lanes ? r.send : nullptr, StageOps::Half::produce, r.to_copy_lane);
    if (paced && i > 0) ops.gate_send(r.acquired[static_cast<size_t>(previous.set_index)]);
    cudaStream_t produced_on = r.produce;  // where the whole of the stage's produce is done
    {
      NvtxRange q("fp8wire produce");
      ncclResult_t produced = program.produce(ops, st);
      ops.gate_send(nullptr);
      if (produced == ncclSuccess) produced = ops.end_half(&produced_on);
      FP8WIRE_TRY(produced);
    }
    if (!ready_wait) {
      // Only the release waits for the produce (StageOps::gate_release), after the stage's reads.
      FP8WIRE_TRY(check(cuda_->EventRecord(r.ready[set], r.produce), "marking a stage produced"));
      ops.gate_release(r.ready[set]);
    } else if (lanes) {
      FP8WIRE_TRY(lanes->lanes_hand(r.produce, st.set_index));
      FP8WIRE_TRY(lanes->lanes_take(r.transfer, st.set_index));
    } else {
      FP8WIRE_TRY(check(cuda_->EventRecord(r.ready[set], produced_on), "handing a stage over"));
      if (early_copy_in) ops.gate_produce(r.ready[set]);
      else FP8WIRE_TRY(check(cuda_->StreamWaitEvent(r.transfer, r.ready[set], 0), "handing a stage over"));
    }
    ops.set_lanes(r.transfer, copy_lanes ? r.fetch : nullptr, StageOps::Half::finish, r.to_kernel_lane);
    if (paced) ops.mark_acquired(r.acquired[set]);
    ncclResult_t finished = program.finish(ops, st);
    cudaStream_t finished_on = r.transfer;  // the transfer lane, after the fetch lane's part
    if (finished == ncclSuccess) finished = ops.end_half(&finished_on);
    else ops.set_lane(r.transfer);  // a failed finish's last gate goes where the stage would have ended
    ops.mark_acquired(nullptr);
    ops.gate_release(nullptr);
    const ncclResult_t gated = ops.pass_produce_gate();
    FP8WIRE_TRY(finished);
    FP8WIRE_TRY(gated);
    if (!late_gather) FP8WIRE_TRY(end_stage(st));
    else if (i > 0) FP8WIRE_TRY(end_stage(previous));
    previous = st;
  }
  return late_gather && stages > 0 ? end_stage(previous) : ncclSuccess;
}

ncclResult_t PipelineRun::join() {
  if (deferred_) {
    deferred_->add(s_, caller_, capturing_);
    return ncclSuccess;
  }
  return check(join_lanes(*cuda_, *s_, caller_, capturing_), "joining the caller's stream");
}

ncclResult_t PipelineRun::finish(ncclResult_t result) {
  if (joined_) return result;
  joined_ = true;
  const ncclResult_t joined = join();
  if (joined != ncclSuccess) s_->fail(joined);  // the scratch may still be in use: no further FP8 here
  return result != ncclSuccess ? result : joined;
}

}  // namespace fp8wire::sched
