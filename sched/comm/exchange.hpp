// The exchanges between a communicator's ranks at its set-up, through real NCCL all-gathers on the
// communicator's own lanes: the buffer the 64-byte agreement exchange uses, the wait that an abort
// or an NCCL error releases, and the small all-gathers of the later rounds (sched/comm/rounds.hpp).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <vector>

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

// Waits for `stream` without blocking in the driver, so that an abort from another thread (which
// sets `aborting` before calling NCCL's abort) or an asynchronous NCCL error releases the wait.
ncclResult_t wait_exchange(CommState& s, cudaStream_t stream);

// An all-gather of `bytes` per rank through the scratch (FP8 is on, so there is one), for the rounds
// that follow the agreement. Every rank calls it with the same size; the result is every rank's
// bytes in rank order, or an error (then on every rank: the all-gather either ran everywhere or the
// communicator is broken).
ncclResult_t gather_bytes(CommState& s, const void* mine, size_t bytes, std::vector<char>& all);

// Whether every rank answered yes (a 4-byte all-gather); false on any error too.
bool all_agree(CommState& s, bool mine);

}  // namespace fp8wire::sched
