// What fp8wire keeps per communicator, and the registry that finds it.
//
// A CommState is shared: the registry holds one reference, and every call in flight and every call
// queued in an open group holds another. Destroying or aborting a communicator takes it out of the
// registry and marks it dead; its streams, events and scratch are released when the last reference
// goes, so another thread's call or a queued call never uses freed memory (it sees `dead` instead).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "sched/agreement.hpp"
#include "sched/direct_transport.hpp"
#include "sched/error_feedback.hpp"
#include "sched/platform.hpp"
#include "sched/stages.hpp"
#include "sched/transport.hpp"

namespace fp8wire::sched {

class TelemetryMonitor;  // sched/telemetry.hpp

// Streams, events and scratch of one communicator's FP8 pipeline (sched/pipeline.hpp), allocated at
// the agreement. Two lanes of its own: `produce` quantizes stage i+1 while `transfer` moves and
// reduces stage i; the caller's stream only forks to them and joins them.
struct CommResources {
  cudaStream_t produce = nullptr;
  cudaStream_t transfer = nullptr;
  cudaEvent_t fork = nullptr;
  // End of the most recent eager FP8 call on each lane: the next call's produce lane waits for the
  // transfer lane's before it reuses the scratch.
  cudaEvent_t produce_end = nullptr;
  cudaEvent_t last = nullptr;
  bool has_last = false;
  // The joins of a captured call. Apart from the eager ones so that a capture neither re-records
  // `last` inside a graph (an eager stream may not wait on that) nor makes the next eager call forget
  // the previous eager one, whose transfer work may still be reading the scratch.
  cudaEvent_t capture_produce_end = nullptr;
  cudaEvent_t capture_transfer_end = nullptr;
  std::array<cudaEvent_t, 2> ready{};  // stage i quantized (produce -> transfer), per buffer set
  std::array<cudaEvent_t, 2> done{};   // stage i finished with its buffer set (transfer -> produce)
  char* scratch = nullptr;
  ScratchLayout layout;
};

// Who a communicator is, as a call record names it.
struct CommIdentity {
  uint64_t id = 0;
  int nranks = 0;
  int rank = 0;
};

// The sub-communicators of a communicator spanning hosts (sched/hierarchy.hpp), split once at the
// agreement: the ranks of this rank's host (by local rank), and its rail, the ranks of every host with
// its local rank (by host).
struct Hierarchy {
  bool ready = false;           // split on every rank (the agreement's second round)
  ncclComm_t host = nullptr;
  ncclComm_t rail = nullptr;
  int hosts = 0;
  int ranks_per_host = 0;
  int host_index = 0;
  int local_rank = 0;
  std::vector<int> rank_at;     // parent rank of (host h, local rank l) at h * ranks_per_host + l
};

enum class CommSetup : uint8_t {
  pending,          // registered, the agreement has not run (created inside an application group)
  pass_through,     // never FP8: non-blocking, one process drives every rank, a single rank, ...
  agreed,           // the agreement ran; `agreement` says whether FP8 may run
};

struct CommState {
  CommState(const Platform& platform, std::atomic<int64_t>& feedback_budget, ncclComm_t comm, uint64_t id);
  ~CommState();  // releases the resources through the platform
  CommState(const CommState&) = delete;
  CommState& operator=(const CommState&) = delete;

  const Platform* platform;
  ncclComm_t comm;
  uint64_t id;              // registry id, stable (the pointer may be reused by a later communicator)
  int nranks = 1;
  int rank = 0;
  int device = -1;
  CommSetup setup = CommSetup::pending;
  std::string pass_reason;  // why pass_through, for the log
  bool single_process = false;  // ncclCommInitAll or a split of it: one thread drives every rank
  Agreement agreement;
  CommResources res;
  NcclTransport transport;
  Hierarchy hierarchy;
  NcclTransport host_transport;   // over hierarchy.host
  NcclTransport rail_transport;   // over hierarchy.rail
  // Set up at the agreement when every rank is on this machine and every rank could map every
  // other's windows (sched/direct_transport.hpp); null otherwise.
  std::unique_ptr<DirectTransport> direct;
  FeedbackStore feedback;
  // Telemetry records and the guard's scopes; made at the first FP8 call when telemetry is on.
  std::unique_ptr<TelemetryMonitor> telemetry;
  std::atomic<bool> dead{false};      // destroyed or aborted: queued calls return an error
  std::atomic<bool> aborting{false};  // an abort has begun: the agreement's wait gives up
  std::atomic<bool> reported_lost_peer{false};  // the direct transport's lost peer is logged once
  // The first error of an FP8 call on it. The communicator is then out of step with its peers (they
  // may still wait in that call's exchange until the application aborts it), so every later FP8
  // call on it returns this error instead of starting another exchange.
  std::atomic<int> failure{ncclSuccess};
  uint64_t logged_choices = 0;  // bit (collective * 16 + path * 2 + direct): first use of that choice logged

  CommIdentity identity() const { return {id, nranks, rank}; }
  bool fp8_allowed() const { return setup == CommSetup::agreed && agreement.fp8_ok; }
  ncclResult_t failed() const { return static_cast<ncclResult_t>(failure.load(std::memory_order_relaxed)); }
  void fail(ncclResult_t r) {
    int expected = ncclSuccess;
    failure.compare_exchange_strong(expected, static_cast<int>(r));
  }
};
using CommRef = std::shared_ptr<CommState>;

class Registry {
 public:
  Registry(const Platform& platform, std::atomic<int64_t>& feedback_budget)
      : platform_(&platform), feedback_budget_(&feedback_budget) {}
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

 private:
  const Platform* platform_;
  std::atomic<int64_t>* feedback_budget_;
  mutable std::mutex mutex_;
  std::unordered_map<ncclComm_t, CommRef> comms_;
  uint64_t next_id_ = 1;
};

}  // namespace fp8wire::sched
