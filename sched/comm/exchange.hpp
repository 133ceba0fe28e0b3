// The exchanges between a communicator's ranks at its set-up, through real NCCL all-gathers on the
// communicator's own lanes: the buffer the 64-byte agreement exchange uses, the wait that an abort
// or an NCCL error releases, and the small all-gathers of the later rounds (sched/comm/rounds.hpp).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "common/config.hpp"
#include "sched/comm/comm_state.hpp"
#include "sched/platform/cuda_api.hpp"

namespace fp8wire::sched {

// The exchange buffer: a slice of the scratch when there is one, else a small allocation, else
// mapped host memory (NCCL's kernels reach it as well). Only if all three fail can this rank not take
// part, the same situation as NCCL failing its own initialisation on one rank.
struct ExchangeBuffer {
  const CudaApi* cuda = nullptr;
  char* data = nullptr;
  bool owned_device = false;
  bool owned_host = false;
  ExchangeBuffer() = default;
  ExchangeBuffer(const ExchangeBuffer&) = delete;
  ExchangeBuffer& operator=(const ExchangeBuffer&) = delete;
  // An exchange that did not complete may still write into the buffer (until the application aborts
  // the communicator): it is then left allocated, a few bytes, rather than freed under NCCL's feet.
  void abandon() { owned_device = owned_host = false; }
  ~ExchangeBuffer() {
    if (owned_device) cuda->Free(data);
    if (owned_host) cuda->FreeHost(data);
  }
};
bool get_exchange_buffer(CommState& s, size_t bytes, ExchangeBuffer* out);

// Starts the set-up's one deadline (setup_timeout_s, none when 0): every exchange below gives up
// once it has passed, counted from the start of the agreement, not per exchange.
void start_setup_clock(CommState& s, const Config& config);

// The set-up's blocking NCCL host calls run on a thread of their own: the launch of a communicator's
// first collective may connect to its peers and wait for them inside the call, and a split waits for
// every rank; neither has a deadline or a way to be stopped from outside. call_with_deadline runs
// `call` so and waits for it with the set-up's deadline and an abort of any of `comms` (the earliest
// deadline counts), and returns its result, or why it was given up. A call given up on stays with its
// thread: when NCCL returns, that thread runs `undo` (aborts what the call made) and aborts those of
// `comms` whose abort or destroy was asked meanwhile (defer_release); their exchanges count as in
// flight, and their lanes and scratch stay. `call` must own everything it touches on the host.
struct HostCall;
ncclResult_t call_with_deadline(std::span<CommState* const> comms, const char* what,
                                std::function<ncclResult_t()> call, std::function<void()> undo = {});
// True when a call given up on still uses the communicator: its real abort or destroy is then that
// call's thread's to do, and the caller must do neither.
bool defer_release(CommState& s);
// Whether a call given up on still runs in NCCL with the communicator (its lanes and scratch stay).
bool host_call_running(CommState& s);
// Such calls still inside NCCL, in this process (the CPU tier waits for none before its simulated
// machine goes).
int host_calls_in_flight();

// Waits for `stream` without blocking in the driver, so that an abort from another thread (which
// sets `aborting` before calling NCCL's abort), an asynchronous NCCL error or the set-up's deadline
// releases the wait. `what` names the exchange for the log. On the deadline: ncclRemoteError, and the
// exchange, which may still write, is left in flight (CommState::exchange_in_flight).
ncclResult_t wait_exchange(CommState& s, cudaStream_t stream, const char* what);

// An all-gather of `bytes` per rank through the scratch (FP8 is on, so there is one), for the rounds
// that follow the agreement. Every rank calls it with the same size; the result is every rank's
// bytes in rank order, or an error. An error means this rank cannot know what its peers concluded
// (some may have all the bytes): the set-up must then fail, never go on without the feature.
ncclResult_t gather_bytes(CommState& s, const void* mine, size_t bytes, std::vector<char>& all, const char* what);

// Whether every rank answered yes (a 4-byte all-gather), in `*all`; an error as gather_bytes.
ncclResult_t all_agree(CommState& s, bool mine, bool* all, const char* what);

}  // namespace fp8wire::sched
