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

namespace fp8wire {

enum class Path : uint8_t {
  passthrough = 0,  // not eligible: the real NCCL call, untouched
  two_shot = 1,     // FP8 all-to-all + all-gather (DESIGN.md default)
  one_shot = 2,     // FP8 all-gather of quantized inputs, every rank reduces
  ring = 3,         // FP8 ring (comparison only)
  fallback = 4,     // eligible, but the FP8 path could not run; passed through (reason logged once)
};
// Inline, so the profiler companion and the benchmark name paths the same way without linking sched.
inline const char* to_string(Path p) {
  switch (p) {
    case Path::passthrough: return "passthrough";
    case Path::two_shot: return "two_shot";
    case Path::one_shot: return "one_shot";
    case Path::ring: return "ring";
    case Path::fallback: return "fallback";
  }
  return "unknown";
}

// Whether an FP8 path ends by gathering every rank's quantized slot (one-shot's exchange, two-shot's
// and ring's final all-gather, the FP8 all-gather), the step Config::gather_transport chooses the
// NCCL calls of. The FP8 reduce-scatter ends with its local reduce; plain NCCL has none. Inline here,
// beside Path, so the planner and the benchmark's host code share one definition.
inline bool has_gather_step(Collective collective, Path path) {
  if (path == Path::passthrough || path == Path::fallback) return false;
  return collective != Collective::reduce_scatter;
}

enum class CallKind : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, reduce, send, recv };
inline const char* to_string(CallKind k) {
  switch (k) {
    case CallKind::all_reduce: return "all_reduce";
    case CallKind::reduce_scatter: return "reduce_scatter";
    case CallKind::all_gather: return "all_gather";
    case CallKind::broadcast: return "broadcast";
    case CallKind::reduce: return "reduce";
    case CallKind::send: return "send";
    case CallKind::recv: return "recv";
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
  uint32_t coalesced_calls = 1;// >1 when several grouped calls were packed into this one
  // FP8 paths with a gather step: how the quantized slots were gathered (allgather or sendrecv);
  // automatic for pass-through, fallback and the FP8 reduce-scatter.
  GatherTransport gather = GatherTransport::automatic;
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

// Slots for paths in the totals: room for paths yet to come, so the C API (shim/fp8wire.h,
// FP8WIRE_MAX_PATHS) keeps its layout when one is added. Index = static_cast<int>(Path).
inline constexpr int kMaxPaths = 16;
static_assert(static_cast<int>(Path::fallback) < kMaxPaths);

struct AccountingTotals {
  uint64_t calls[kMaxPaths] = {};       // by Path
  uint64_t app_bytes[kMaxPaths] = {};
  uint64_t wire_bytes[kMaxPaths] = {};
  uint64_t gather_calls[3] = {};  // FP8 calls by CallRecord::gather (index = GatherTransport; [0] unused)
  uint64_t dropped_records = 0;
};

// Process-wide ring of the most recent records.
class Accounting {
 public:
  static constexpr size_t kCapacity = 1 << 16;
  static Accounting& instance();
  uint64_t next_seq() { return seq_.fetch_add(1, std::memory_order_relaxed) + 1; }
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
