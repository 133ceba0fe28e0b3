// Telemetry and the guard per communicator (sched/plan/guard.hpp has the protocol, quant/telemetry.hpp the
// figures): a pool of per-call records (device memory, a pinned host copy, an event), each scope's
// history, and the process-wide error totals the C API reports.
//
// A measured call gets a record: zeroed on the produce lane before its first quantize, filled by the
// codec kernels of both lanes, copied to pinned host memory at the end of the transfer lane, and an
// event recorded after the copy. Nothing waits for it on the call path: a later FP8 call on the
// communicator (or a totals query, or its destruction) folds every completed record into the totals.
// The one wait is the guard's: before the scope's call that reads a guarded call's votes
// (guard.decide_after calls later), that call must be complete; by then it usually is.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "quant/telemetry.hpp"
#include "sched/plan/guard.hpp"
#include "sched/plan/recipe.hpp"
#include "sched/platform/platform.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

// Figures of the measured calls, per collective and path, and what the guard did.
inline constexpr int kErrorCollectives = 8;   // the C API's layout (FP8WIRE_MAX_COLLECTIVES)
static_assert(kCollectiveCount <= kErrorCollectives, "every collective needs its own slot in the C API's totals");
struct ErrorTotals {
  uint64_t measured_calls[kErrorCollectives][kMaxPaths] = {};
  quant::ErrorStats input[kErrorCollectives][kMaxPaths] = {};
  quant::ErrorStats requant[kErrorCollectives][kMaxPaths] = {};
  uint64_t guard_trips[kErrorCollectives] = {};       // decisions to go to full precision
  uint64_t guard_full_calls[kErrorCollectives] = {};  // calls the guard ran in full precision
  uint64_t guard_resumed[kErrorCollectives] = {};     // scopes that went back to FP8 after retry_after
  // The audit (audit.every): the FP8 result against the same collective in full precision through
  // the real NCCL, over the finite elements of the exact result.
  uint64_t audited_calls[kErrorCollectives][kMaxPaths] = {};
  double audit_sq_error[kErrorCollectives][kMaxPaths] = {};  // sum (fp8 - exact)^2
  double audit_sq_exact[kErrorCollectives][kMaxPaths] = {};  // sum exact^2
  uint64_t audit_nonfinite[kErrorCollectives][kMaxPaths] = {};  // elements where only one is finite
};
// The process-wide totals (every communicator's completed records; pending ones are folded first).
ErrorTotals error_totals();
// Zeroes them (after folding what completed), as Accounting::reset does the call totals.
void reset_error_totals();

// One measured call's figures, by the call's sequence number (the profiler's per-call column).
struct MeasuredCall {
  uint64_t seq = 0;
  double input_rel_error = 0;    // its inputs' quantization on this rank
  double requant_rel_error = 0;  // the requantization inside it (two-shot, ring), 0 where none
};
// The figures of call `seq` once its record completed (folded first), among the latest 1024 measured
// calls of the process; false for a call that was not measured or whose record is not in yet.
bool measured_call(uint64_t seq, MeasuredCall* out);

class TelemetryMonitor {
 public:
  static constexpr int kSlots = 64;
  TelemetryMonitor(const Platform& platform, uint64_t comm_id, int rank);
  ~TelemetryMonitor();  // folds what completed; the lanes are idle by then (release_resources)
  TelemetryMonitor(const TelemetryMonitor&) = delete;
  TelemetryMonitor& operator=(const TelemetryMonitor&) = delete;

  // One call's telemetry, from its record to its end.
  struct Call {
    uint64_t scope = 0;
    int slot = -1;                       // the record (measure only)
    uint64_t decide_at = 0;              // a guarded call: the scope's call that reads its votes
    quant::TelemetryOptions options;     // for LaunchOptions::telemetry
  };
  // Before an FP8 call's recipe (sched/plan/recipe.hpp): folds completed records and, where the pending
  // decision of `scope` (a feedback key, 0 = the communicator) is due, reads it, waiting for its call
  // to complete if it has not (never under capture); then the scope's state, the recipe's input. An
  // error when the decision cannot be read.
  ncclResult_t settle(uint64_t scope, bool capturing, ScopeState* out);
  // The communicator's auditable calls so far (the recipe's input).
  uint64_t audit_calls();
  // After the recipe: keeps the scope's new count and full-precision spell and the audit's count (a
  // collective's: Watch::scoped), counts what the guard did, and takes a record for a measured call
  // (an error when it gets none).
  ncclResult_t begin(const Watch& watch, Collective collective, Path path, uint64_t seq, Call* call);
  // Where a measured call's record lives on the device (zeroed before its first quantize).
  quant::CallTelemetry* device_record(int slot) const { return device_ + slot; }
  // On `stream`, after the call's last quantize: its record copied to pinned host memory and its
  // event recorded, for fold to read once the event has passed.
  cudaError_t read_back(int slot, cudaStream_t stream) const;
  // After the call was issued: with `recorded` (its copy-back and event were issued) the record goes
  // in flight, else back to the pool.
  void end(const Call& call, bool recorded);
  // Folds every completed record into the totals (never waits).
  void fold_completed();
  // The same, unless another thread holds the monitor (which may be waiting on the GPU): then nothing.
  void fold_completed_if_free();

  // The audit (audit.every), for a call its recipe audits.
  // Device copies for the audited call (grown, never shrunk; waits for the previous audit first).
  ncclResult_t audit_buffers(size_t send_bytes, size_t recv_bytes, void** in, void** out);
  // After the FP8 call has joined the caller's stream: both results copied to pinned host memory on
  // `stream` and an event recorded; compared when a later call or query finds it complete.
  ncclResult_t audit_read_back(cudaStream_t stream, const void* fp8_out, size_t recv_bytes, DataType dtype,
                               Collective collective, Path path, uint64_t seq);

 private:
  struct Slot {
    bool busy = false;
    bool in_flight = false;
    uint64_t seq = 0;
    uint64_t order = 0;   // when it went in flight: the oldest is waited for when none is free
    uint64_t scope = 0;
    Collective collective = Collective::all_reduce;
    Path path = Path::two_shot;
    bool guard = false;
    cudaEvent_t done = nullptr;
  };
  bool allocate();
  int take_slot();
  ncclResult_t wait(int slot);
  void fold(int slot);
  void fold_completed_locked();
  void fold_audit();

  const Platform* platform_;
  uint64_t comm_id_;
  int rank_;
  std::mutex mutex_;
  bool allocated_ = false;
  bool failed_ = false;
  quant::CallTelemetry* device_ = nullptr;   // kSlots records
  quant::CallTelemetry* host_ = nullptr;     // pinned copies
  std::array<Slot, kSlots> slots_{};
  uint64_t order_ = 0;
  std::unordered_map<uint64_t, ScopeState> scopes_;
  struct AuditState {
    uint64_t calls = 0;
    void* in = nullptr;         // device
    void* out = nullptr;        // device
    size_t in_bytes = 0, out_bytes = 0;
    char* host = nullptr;       // pinned: exact result, then the FP8 result
    size_t host_bytes = 0;
    cudaEvent_t done = nullptr;
    bool in_flight = false;
    size_t bytes = 0;
    DataType dtype = DataType::f32;
    Collective collective = Collective::all_reduce;
    Path path = Path::two_shot;
    uint64_t seq = 0;
  } audit_;
};

}  // namespace fp8wire::sched
