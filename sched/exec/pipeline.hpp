// The pipeline executor: runs one FP8 collective's stage program on the communicator's two lanes
// and joins the caller's stream on every exit path.
//
//   caller:   fork ........................................................ join (waits both lanes)
//   produce:   \-> [wait last] produce(0) | produce(1) | [wait done 0] produce(2) ...  -^
//   transfer:   \-> [wait ready 0] finish(0) | [wait ready 1] finish(1) | ...           -^
//
// Stage i uses buffer set i % 2 (over a direct transport i % direct.sets), so the quantize of stage
// i+1 overlaps the transfer of stage i, and the produce lane waits for stage i-2 (i-sets) to finish
// with a set before reusing it. Only events link the
// streams, so the same code is legal under CUDA graph capture (fork/join of a captured stream), and
// nothing allocates or synchronises. Over a direct transport with direct.lane_flags, the hand-overs
// between the two lanes (ready, done) are the transport's stream memory operations on this rank's
// own flags instead (DirectWindows::lanes_*) in calls not under capture; the fork and join stay
// events. With direct.lanes_apart a call the direct programs allow it for (StageOps::handover) has
// its produce lane wait for nothing of the transfer lane's, and its transfer lane wait for a stage's
// produce only before the stage's release (in place: before the stage's finish, as without). With
// direct.early_copy_in the ready hand-over by event is waited for inside the stage's finish, just before
// its first operation that touches what the produce lane writes or reads (StageOps::gate_produce):
// its copy-in of the peers' data goes first. With direct.paced_sends (host memory, programs without
// a gather) a stage's first write into a window waits for the transfer lane's acquire of the stage
// before it (StageOps::gate_send), so the ranks' copies reach the copy engines stage by stage. With
// direct.copy_lanes (events, not under capture) each lane's copies over the link run on a copy lane
// of its own: the produce lane's sends (reclaim, copy-out, publish) on the send lane, which waits for
// the kernels they follow; the transfer lane's copy-in (acquire, fetch) on the fetch lane, which the
// transfer lane waits for before its next operation; a stage's ready hand-over is recorded on the
// send lane after its publish, and both copy lanes wait for a buffer set's done like the produce
// lane; a gather's acquire and copy-in go to the fetch lane too, while what a finish sends (two-shot's
// reduced shard) stays on the transfer lane behind the reduce that computes it. So a copy never waits
// behind a kernel that waits for the lane's previous copy, and the copy engines have the next copy
// queued (docs/PERF.md "Host-link limit"). At its start a call's produce lane (and each copy lane)
// waits for the transfer lane as it stands (the previous call's work); at its end the transfer lane
// waits for both copy lanes.
// The caller's stream itself runs none of the work: calls of one application group on different
// communicators never wait for one another, whatever order each rank issued them in.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <vector>

#include "sched/comm/comm_state.hpp"
#include "sched/exec/stage_ops.hpp"

namespace fp8wire::sched {

// One stage of a call: elements [offset, offset + length) of the call's count, buffer set `set`.
struct Stage {
  size_t index = 0;
  size_t offset = 0;
  size_t length = 0;
  char* set = nullptr;
  int set_index = 0;  // which buffer set (of two, or of a direct transport's direct.sets)
  bool only = false;  // the call's single stage (it may use both buffer sets)
  bool last = false;
};

// An FP8 algorithm as a stage program: what runs on the produce lane (quantize into the stage's
// buffer set) and what runs on the transfer lane (exchange, reduce, gather, decode), per stage.
// gather() is the rest of a stage's transfer part, run after its finish(): nothing, unless the
// program's transfer part has a second handshake with the peers (two-shot over a direct transport:
// the reduced shards) and it splits there (has_gather: finish() up to that handshake's publish,
// gather() the rest, down to the stage's release). Such a gather runs one stage late with three or
// more buffer sets, after stage i+1's finish, so the lane does not wait on the peers' second signal
// of a stage while the next stage's data is there to move; every other gather right after its finish.
class StageProgram {
 public:
  virtual ~StageProgram() = default;
  virtual ncclResult_t produce(StageOps& ops, const Stage& stage) = 0;
  virtual ncclResult_t finish(StageOps& ops, const Stage& stage) = 0;
  virtual bool has_gather() const { return false; }
  virtual ncclResult_t gather(StageOps&, const Stage&) { return ncclSuccess; }
};

// Joins gathered from several calls, made together at the end of a batch (a group flush).
class JoinList {
 public:
  JoinList() = default;
  JoinList(const JoinList&) = delete;
  JoinList& operator=(const JoinList&) = delete;
  ~JoinList() { join_all(); }
  void add(CommRef state, cudaStream_t caller, bool capturing) { joins_.push_back({std::move(state), caller, capturing}); }
  // Makes every caller stream wait for its call's lanes; returns the first error.
  ncclResult_t join_all();

 private:
  struct Pending {
    CommRef state;
    cudaStream_t caller;
    bool capturing;
  };
  std::vector<Pending> joins_;
};

class PipelineRun {
 public:
  // Forks the communicator's lanes from `caller`; with `deferred`, the join is left to that list.
  // `mark_begin`: launch the call-begin mark (the exposure profiler's hooks are installed).
  PipelineRun(const CommRef& s, cudaStream_t caller, bool capturing, bool mark_begin, JoinList* deferred = nullptr);
  ~PipelineRun();  // joins if finish() was not reached: no exit path leaves the lanes unjoined
  PipelineRun(const PipelineRun&) = delete;
  PipelineRun& operator=(const PipelineRun&) = delete;

  ncclResult_t started() const { return begin_; }
  // Runs `program` over `count` elements in stages of `stage_elems` (a multiple of the program's
  // unit, stages.hpp). Returns at the first error; the join still follows.
  ncclResult_t run(StageProgram& program, StageOps& ops, size_t count, size_t stage_elems);
  // Joins (or hands the join to the deferred list) and returns `result`, or the join's error.
  ncclResult_t finish(ncclResult_t result);

 private:
  ncclResult_t run_stages(StageProgram& program, StageOps& ops, size_t count, size_t stage_elems, bool copy_lanes);
  ncclResult_t join();
  ncclResult_t check(cudaError_t err, const char* what);

  CommRef s_;
  const CudaApi* cuda_;
  cudaStream_t caller_;
  bool capturing_;
  JoinList* deferred_;
  ncclResult_t begin_ = ncclSuccess;
  bool joined_ = false;
};

}  // namespace fp8wire::sched
