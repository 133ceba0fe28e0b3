// One communicator's FP8 pipeline resources: its two lanes, their events and the scratch, allocated
// at the agreement (sched/comm/comm_setup.cpp) only where FP8 may run, released with the communicator.
#pragma once

#include <cuda_runtime_api.h>

#include <array>

#include "sched/plan/stages.hpp"

namespace fp8wire::sched {

// Streams, events and scratch of one communicator's FP8 pipeline (sched/exec/pipeline.hpp), allocated at
// the agreement. Two lanes of its own: `produce` quantizes stage i+1 while `transfer` moves and
// reduces stage i; the caller's stream only forks to them and joins them.
struct CommResources {
  cudaStream_t produce = nullptr;
  cudaStream_t transfer = nullptr;
  // Copy lanes (LaneHandover::copy_lanes): the stage's sends (beside the produce lane) and its copy-in
  // (beside the transfer lane) on lanes of their own, and the events that hand a stage from a kernel
  // lane to its copy lane and back (StageOps::set_lanes), and the send lane's end for the call's join.
  // Each of these three is recorded on one lane only, so a record never completes before an earlier
  // one still pending.
  cudaStream_t send = nullptr;
  cudaStream_t fetch = nullptr;
  cudaEvent_t to_copy_lane = nullptr;    // recorded on the produce lane (also the copy lanes' start)
  cudaEvent_t to_kernel_lane = nullptr;  // recorded on the fetch lane (also its end)
  cudaEvent_t send_end = nullptr;        // recorded on the send lane
  cudaEvent_t fork = nullptr;
  // The transfer lane as a call starts (after the fork), which the call's produce lane waits for
  // before it reuses the scratch: the previous call's transfer work may still read it, also inside
  // one group (joins deferred) and one capture. Recorded and waited on in the same context each time.
  cudaEvent_t tail = nullptr;
  // End of the most recent eager FP8 call on each lane (its join).
  cudaEvent_t produce_end = nullptr;
  cudaEvent_t last = nullptr;
  // The joins of a captured call. Apart from the eager ones so that a capture does not re-record
  // `last` inside a graph (an eager stream may not wait on that).
  cudaEvent_t capture_produce_end = nullptr;
  cudaEvent_t capture_transfer_end = nullptr;
  std::array<cudaEvent_t, kMaxBufferSets> ready{};  // stage i quantized (produce -> transfer), per buffer set
  std::array<cudaEvent_t, kMaxBufferSets> done{};   // stage i finished with its buffer set (transfer -> produce)
  std::array<cudaEvent_t, kMaxBufferSets> acquired{};  // stage i's peers published (transfer -> produce; paced sends)
  char* scratch = nullptr;
  uint64_t scratch_taken = 0;  // bytes of the process's scratch budget it holds (ScratchBudget)
  ScratchLayout layout;
};

}  // namespace fp8wire::sched
