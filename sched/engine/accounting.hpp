// Per-call accounting: what the application asked for, what went on the wire, which path was taken.
// Read by the profiler (exposed ms per collective) and by fp8wire-bench. Records live in a fixed-size
// ring (no allocation on the call path); when readers fall behind, old records are overwritten and
// counted as dropped.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <nccl.h>

#include "common/config.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire {

// New kinds go last: the numbers are in records a reader may hold.
enum class CallKind : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, reduce, send, recv, all_to_all };
inline const char* to_string(CallKind k) {
  switch (k) {
    case CallKind::all_reduce: return "all_reduce";
    case CallKind::reduce_scatter: return "reduce_scatter";
    case CallKind::all_gather: return "all_gather";
    case CallKind::broadcast: return "broadcast";
    case CallKind::reduce: return "reduce";
    case CallKind::send: return "send";
    case CallKind::recv: return "recv";
    case CallKind::all_to_all: return "all_to_all";
  }
  return "unknown";
}

struct CallRecord {
  uint64_t seq = 0;            // per-process sequence number of intercepted collectives, from 1
  uint64_t comm_id = 0;        // registry id of the communicator (stable, unlike the pointer)
  CallKind kind = CallKind::all_reduce;
  Path path = Path::passthrough;
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int nranks = 0;
  int rank = 0;
  uint64_t count = 0;          // elements, as the application passed them
  uint64_t app_bytes = 0;      // bytes of the caller's buffer (count * dtype size; per rank)
  uint64_t wire_bytes = 0;     // bytes this rank sent on the wire for this call
  // Bytes NCCL's own algorithm sends from this rank for the same call (a coalesced batch: summed
  // over its calls), whichever path carried it: plain NCCL's wire bytes, the baseline of wire_bytes.
  uint64_t plain_wire_bytes = 0;
  uint32_t coalesced_calls = 1;// >1 when several grouped calls were packed into this one
  // FP8 paths with a gather step: how the quantized slots were gathered (allgather or sendrecv);
  // automatic for pass-through, fallback and the FP8 reduce-scatter.
  GatherMethod gather = GatherMethod::automatic;
  // Which transport carried an FP8 call's bytes (NCCL's, or a direct transport's windows).
  Carrier transport = Carrier::nccl;
  uint64_t issue_ns = 0;       // host CLOCK_MONOTONIC when the application issued the call
};

// Hooks the profiler installs (null when off). Called on the application's thread, around the real
// NCCL/codec launches of one call; must not block.
struct CallHooks {
  void (*begin)(const CallRecord&) = nullptr;
  void (*end)(const CallRecord&) = nullptr;
};
void set_call_hooks(const CallHooks* hooks);   // nullptr removes them
const CallHooks* call_hooks();                 // one acquire load; nullptr when none

// One call's hooks: begin now, end exactly once, at end() or when the scope closes on an early exit
// (an exception): a begin without its end would leave the profiler's per-thread state (a pushed
// correlation id) open for every later launch of the thread. `rec` is read again at the end.
class CallHookScope {
 public:
  explicit CallHookScope(const CallRecord& rec) : hooks_(call_hooks()), rec_(rec) {
    if (hooks_ && hooks_->begin) hooks_->begin(rec_);
  }
  ~CallHookScope() { end(); }
  CallHookScope(const CallHookScope&) = delete;
  CallHookScope& operator=(const CallHookScope&) = delete;
  void end() {
    if (!ended_ && hooks_ && hooks_->end) hooks_->end(rec_);
    ended_ = true;
  }

 private:
  const CallHooks* hooks_;
  const CallRecord& rec_;
  bool ended_ = false;
};

// Slots per call kind (CallKind) and per transport (Carrier), room likewise.
inline constexpr int kMaxCallKinds = 16;
static_assert(static_cast<int>(CallKind::all_to_all) < kMaxCallKinds);
inline constexpr int kMaxTransports = 8;
static_assert(static_cast<int>(Carrier::host_memory) < kMaxTransports);
struct AccountingTotals {
  uint64_t calls[kMaxPaths] = {};       // by Path
  uint64_t app_bytes[kMaxPaths] = {};
  uint64_t wire_bytes[kMaxPaths] = {};
  uint64_t gather_calls[3] = {};  // FP8 calls by CallRecord::gather (index = GatherMethod; [0] unused)
  uint64_t direct_calls = 0;      // FP8 calls a direct transport carried (CallRecord::transport)
  // Every call by the transport that carried its bytes (CallRecord::transport; pass-through and
  // fallback calls are NCCL's), so a job can see which one it used.
  uint64_t transport_calls[kMaxTransports] = {};
  uint64_t transport_app_bytes[kMaxTransports] = {};
  uint64_t transport_wire_bytes[kMaxTransports] = {};
  // Every call by the NCCL function the application called (CallRecord::kind): its calls by path,
  // and its caller bytes, wire bytes and the bytes NCCL's own algorithm sends for the same calls.
  uint64_t kind_calls[kMaxCallKinds][kMaxPaths] = {};
  uint64_t kind_app_bytes[kMaxCallKinds] = {};
  uint64_t kind_wire_bytes[kMaxCallKinds] = {};
  uint64_t kind_plain_wire_bytes[kMaxCallKinds] = {};
  uint64_t dropped_records = 0;
};

// Process-wide ring of the most recent records.
class Accounting {
 public:
  static constexpr size_t kCapacity = 1 << 16;
  static Accounting& instance();
  uint64_t next_seq() { return seq_.fetch_add(1, std::memory_order_relaxed) + 1; }
  // The last sequence number handed out (snapshot(..., since = this) then returns only later calls).
  uint64_t last_seq() const { return seq_.load(std::memory_order_relaxed); }
  void record(const CallRecord& r);
  // Copies records with seq > since (oldest first) into out; returns how many.
  size_t snapshot(CallRecord* out, size_t max, uint64_t since) const;
  AccountingTotals totals() const;
  void reset();

 private:
  std::atomic<uint64_t> seq_{0};
  // implementation detail in accounting.cpp
};

}  // namespace fp8wire
