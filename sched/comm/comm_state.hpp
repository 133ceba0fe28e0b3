// What fp8wire keeps per communicator (the registry that finds it: sched/comm/registry.hpp).
//
// A CommState is shared: the registry holds one reference, and every call in flight and every call
// queued in an open group holds another. Destroying or aborting a communicator takes it out of the
// registry and marks it dead; its streams, events and scratch are released when the last reference
// goes, so another thread's call or a queued call never uses freed memory (it sees `dead` instead).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sched/comm/budgets.hpp"
#include "sched/comm/error_feedback.hpp"
#include "sched/comm/resources.hpp"
#include "sched/plan/agreement.hpp"
#include "sched/platform/direct_memory.hpp"
#include "sched/transport/transport.hpp"

namespace fp8wire {
struct Platform;  // sched/platform/platform.hpp
}  // namespace fp8wire

namespace fp8wire::sched {

class DirectWindows;     // sched/transport/direct_windows.hpp
struct HostCall;         // sched/comm/exchange.hpp
class TelemetryMonitor;  // sched/comm/telemetry_monitor.hpp

// Who a communicator is, as a call record names it.
struct CommIdentity {
  uint64_t id = 0;
  int nranks = 0;
  int rank = 0;
};

// The sub-communicators of a communicator spanning hosts (sched/plan/hierarchy.hpp), split once at the
// agreement: the ranks of this rank's host (by local rank), and its rail, the ranks of every host with
// its local rank (by host).
struct Hierarchy {
  explicit Hierarchy(const NcclApi& api) : host_transport(api, nullptr, 0, 1), rail_transport(api, nullptr, 0, 1) {}
  bool ready = false;           // split on every rank (the agreement's second round)
  ncclComm_t host = nullptr;
  ncclComm_t rail = nullptr;
  NcclTransport host_transport;  // over `host`
  NcclTransport rail_transport;  // over `rail`
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
  failed,           // an exchange of its set-up failed (`failed()` says how): every call returns that error
};

struct CommState {
  CommState(const Platform& platform, ProcessBudgets& budgets, ncclComm_t comm, uint64_t id);
  ~CommState();  // releases the resources through the platform
  CommState(const CommState&) = delete;
  CommState& operator=(const CommState&) = delete;

  // --- who it is: set at registration and by query_comm (sched/comm/comm_setup.hpp) ---------------
  const Platform* platform;
  ScratchBudget* scratch_budget;  // the process's, which its scratch is taken from and given back to
  ncclComm_t comm;
  uint64_t id;              // registry id, stable (the pointer may be reused by a later communicator)
  int nranks = 1;
  int rank = 0;
  int device = -1;

  // --- the agreement's outcome: written once by its thread, read by every call after -------------
  CommSetup setup = CommSetup::pending;
  // When the set-up's exchanges give up (setup_timeout_s from the agreement's start; none: no deadline).
  std::optional<std::chrono::steady_clock::time_point> setup_deadline;
  // An exchange of the set-up was given up while NCCL may still run it on the transfer lane: the lanes
  // and the scratch it writes stay allocated unless the real abort has stopped it (release_resources).
  bool exchange_in_flight = false;
  std::string pass_reason;  // why pass_through, for the log
  bool single_process = false;  // ncclCommInitAll or a split of it: one thread drives every rank
  Agreement agreement;

  // --- what the agreement set up where FP8 may run: lanes and scratch, and what carries the data ---
  CommResources res;
  NcclTransport transport;
  Hierarchy hierarchy;
  // A blocking NCCL host call of its set-up given up while inside NCCL (sched/comm/exchange.hpp).
  std::shared_ptr<HostCall> host_call;
  // Set up at the agreement when every rank is on this machine and every rank could map every
  // other's windows (sched/transport/direct_windows.hpp); null otherwise.
  std::unique_ptr<DirectWindows> direct;
  // The windows of a direct-transport attempt whose exchange was given up on while it ran on the
  // transfer lane (the own ones' names already gone): released after the lanes, once the real abort
  // has stopped that exchange (release_resources); releasing one sooner could wait for it forever.
  struct AbandonedWindow {
    Window window;
    bool own = false;  // destroyed (this rank's) or closed (a peer's)
  };
  std::vector<AbandonedWindow> abandoned_windows;

  // --- what calls keep on it ----------------------------------------------------------------------
  FeedbackStore feedback;
  uint64_t logged_choices = 0;  // bit (collective * 16 + path * 2 + direct): first use of that route logged
  bool logged_messages = false;  // the first FP8 point-to-point message on it logged
  // Point-to-point messages so far, per peer: [0] sent to it, [1] received from it. A pair's two ends
  // count the same messages (NCCL matches them in order), so a message's number is the same at both.
  std::vector<uint64_t> messages[2];
  // Telemetry records and the guard's scopes; made at the first FP8 call when telemetry is on.
  std::unique_ptr<TelemetryMonitor> telemetry;

  // --- its life, across threads ------------------------------------------------------------------
  std::atomic<bool> dead{false};      // destroyed or aborted: queued calls return an error
  std::atomic<bool> aborting{false};  // an abort has begun: the agreement's wait gives up
  std::atomic<bool> reported_lost_peer{false};  // the direct transport's lost peer is logged once
  std::atomic<bool> reported_sub_error{false};  // a sub-communicator's asynchronous error is logged once

  CommIdentity identity() const { return {id, nranks, rank}; }
  bool fp8_allowed() const { return setup == CommSetup::agreed && agreement.fp8_ok; }
  // The first error of an FP8 call on it. The communicator is then out of step with its peers (they
  // may still wait in that call's exchange until the application aborts it), so every later FP8
  // call on it returns this error instead of starting another exchange.
  ncclResult_t failed() const { return static_cast<ncclResult_t>(failure_.load(std::memory_order_relaxed)); }
  void fail(ncclResult_t r) {
    int expected = ncclSuccess;
    failure_.compare_exchange_strong(expected, static_cast<int>(r));
  }

 private:
  std::atomic<int> failure_{ncclSuccess};
};
using CommRef = std::shared_ptr<CommState>;

// Frees the communicator's pipeline resources (streams synchronised first): at its end, or at the
// agreement where FP8 cannot run. Safe on a partial set. ncclRemoteError when an FP8 call still in
// flight waited on a direct peer that has gone and had to be released (its result is void).
ncclResult_t release_resources(CommState& s);

}  // namespace fp8wire::sched
