// Exposure of communication per step (docs/DESIGN.md "Exposed communication"), in plain C++ so CI tests
// it without a GPU. The CUPTI layer (prof_preload.cpp) and the Kineto reader (kineto.cpp) both reduce
// their input to Activity / CallInfo / step windows and call the same code here.
//
// A collective k is one shim call (every kernel it launched, codec and NCCL, grouped by the call's
// sequence number) or, without the shim, one NCCL kernel. Its span S_k runs from its call-begin mark
// (classify.hpp; else its first kernel's start) to its last kernel's end: the time its lanes were
// inside it, the waits between its kernels included (a direct transport's lanes wait on their peers'
// flags with stream memory operations, which no kernel record shows). For a step window W:
// C = union of compute kernels, K = union of communication kernels, M = K ∪ (every S_k) (the time
// spent communicating, moving data or waiting for peers), Y = union of memcpy/memset.
//   compute_ms        = |C ∩ W|
//   comm_ms           = |M ∩ W|
//   exposed_comm_ms   = |(M \ C) ∩ W|  = exposed_data_ms + exposed_wait_ms, where
//     exposed_data_ms = |(K \ C) ∩ W|  (a communication kernel runs: data moves, or NCCL waits
//                                        inside its kernel, which CUPTI cannot tell apart)
//     exposed_wait_ms = |(M \ (K ∪ C)) ∩ W| (inside a collective, no kernel of it running: waiting
//                                        for peers, for the call's other lane, or for the GPU)
//   exposed_memcpy_ms = |(Y \ (C ∪ M)) ∩ W|
//   idle_ms           = |W| - compute - exposed comm - exposed memcpy   (the four add up to the step)
//   overlap_pct       = 100 * |M ∩ C ∩ W| / |M ∩ W|     (100 when there is no communication)
// Per collective the exposed time is split so that the collectives add up to the step exactly: each
// instant of exposed data belongs to the earliest-starting collective with a kernel running then,
// each instant of exposed wait to the earliest-starting collective whose span covers it. Without
// overlapping collectives that is exposed_k = |(S_k ∩ W) \ C|; the sum over every collective of a
// step equals exposed_comm_ms, its data and wait parts exposed_data_ms and exposed_wait_ms.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "profiler/classify.hpp"
#include "profiler/intervals.hpp"

namespace fp8wire::prof {

inline constexpr uint32_t kNoName = std::numeric_limits<uint32_t>::max();

// Interned strings (kernel names, NVTX range names, dtype names): activities carry 4-byte ids.
class NameTable {
 public:
  uint32_t intern(std::string_view name);
  std::string_view name(uint32_t id) const;  // "" for kNoName or an unknown id
  size_t size() const { return names_.size(); }

 private:
  std::deque<std::string> names_;  // deque: references stay valid as it grows
  std::unordered_map<std::string_view, uint32_t> ids_;
};

struct Activity {
  Interval time;
  ActivityClass cls = ActivityClass::compute;
  uint32_t name = kNoName;   // kernel name
  uint32_t range = kNoName;  // the application's innermost NVTX range when the kernel was issued
  uint64_t call_seq = 0;     // the shim's call sequence number (0: not issued inside a shim call)
  // CUPTI correlation id of the launch (0: none). range / call_seq are filled from it when the
  // Collector reports the step, because CUPTI may deliver a kernel record before the
  // external-correlation record of its launch (they sit in different per-thread buffers).
  uint32_t correlation = 0;
};

// One call the shim intercepted (sched/engine/accounting.hpp CallRecord, as the profiler keeps it).
struct CallInfo {
  uint64_t seq = 0;
  int64_t issue_ns = 0;      // on the profiler's clock (the one activities use)
  uint32_t kind = kNoName;   // "all_reduce", ...
  uint32_t dtype = kNoName;  // "bf16", ...
  uint32_t path = kNoName;   // "two_shot", "passthrough", ...
  uint32_t range = kNoName;  // application's NVTX range at issue time
  uint64_t app_bytes = 0;
  uint64_t wire_bytes = 0;
  uint64_t plain_wire_bytes = 0;  // what NCCL's own algorithm would send for the same call
  uint32_t coalesced_calls = 1;
  uint32_t transport = kNoName;  // "nccl", "host_memory", "peer_memory": what carried the bytes
};

struct StepWindow {
  int64_t step = 0;
  Interval time;
};

struct CollectiveReport {
  uint64_t seq = 0;          // shim sequence number; 0 without the shim
  uint32_t ordinal = 0;      // position among this step's collectives, by start time
  std::string name;          // call kind (shim) or collective from the NCCL kernel name
  std::string kernel;        // first kernel's name
  std::string range;         // application's NVTX range at issue time
  std::string dtype;
  std::string path;
  std::string transport;     // what carried an FP8 call's bytes ("" without the shim)
  uint64_t app_bytes = 0;
  uint64_t wire_bytes = 0;
  uint64_t plain_wire_bytes = 0;
  uint32_t kernels = 0;
  int64_t begin_ns = 0;
  double duration_ms = 0;    // |S_k ∩ W|
  double exposed_ms = 0;     // its share of the step's exposed communication: data + wait
  double exposed_data_ms = 0;
  double exposed_wait_ms = 0;
  // Telemetry (telemetry.sample_every): the relative quantization error of its inputs on this rank,
  // -1 when the call was not measured (or without the shim).
  double rel_error = -1;
};

struct StepReport {
  int rank = 0;
  int64_t step = 0;
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  double step_ms = 0;
  double compute_ms = 0;
  double comm_ms = 0;          // |M ∩ W|, hidden or not
  double exposed_comm_ms = 0;
  double exposed_data_ms = 0;  // the two parts of exposed_comm_ms
  double exposed_wait_ms = 0;
  double exposed_memcpy_ms = 0;
  double idle_ms = 0;
  double overlap_pct = 100;
  uint64_t app_bytes = 0;      // from the shim's records; 0 without the shim
  uint64_t wire_bytes = 0;
  uint64_t plain_wire_bytes = 0;  // what plain NCCL sends for the same calls (CallRecord)
  uint64_t calls = 0;          // collectives in the step
  uint64_t compute_kernels = 0;
  uint64_t comm_kernels = 0;
  uint64_t memory_ops = 0;
  std::vector<CollectiveReport> top;  // most exposed first
};

// The sets behind a report, for the trace (clipped to the window).
struct StepTimeline {
  IntervalSet compute;
  IntervalSet comm;
  IntervalSet exposed_comm;
  IntervalSet exposed_wait;  // the part of exposed_comm where no communication kernel runs
  IntervalSet exposed_memcpy;
};

struct StepInput {
  StepWindow window;
  std::span<const Activity> activities;  // any order; those outside the window are ignored
  std::span<const CallInfo> calls;       // any order; matched to activities by seq
  const NameTable* names = nullptr;
  size_t top_n = 10;
  int rank = 0;
};

StepReport compute_step(const StepInput& input, StepTimeline* timeline = nullptr);

// compute_step for many windows at once, in the order given. Each window sees only the activities
// that overlap it (found by binary search over activities sorted by start and windows sorted by
// start, with a running maximum of window ends), so the cost is O((A + W) log A + overlaps) rather
// than A x W: a trace of thousands of steps and millions of kernels stays linear. The result is the
// same as calling compute_step once per window with every activity (a shim call's activities count
// as overlapping a window when the call's span does).
std::vector<StepReport> compute_steps(std::span<const StepWindow> windows, std::span<const Activity> activities,
                                      std::span<const CallInfo> calls, const NameTable* names, size_t top_n,
                                      int rank);

struct CollectorOptions {
  size_t max_activities = 1 << 19;  // raw records kept at once (about 20 MiB); more are dropped
  size_t max_calls = 1 << 16;
  size_t top_n = 10;
  int rank = 0;
  // A step is reported once `settle_ns` has passed since it ended, so the activity records of its
  // kernels (delivered by CUPTI in batches, by a flush every few tens of ms) are in. Records that
  // still come later are counted as late, never silently mixed into another step.
  int64_t settle_ns = 2'000'000'000;
  size_t max_externals = 1 << 17;  // launch correlation ids kept for attribution
};

struct CollectorCounters {
  uint64_t dropped_activities = 0;  // store full
  uint64_t dropped_calls = 0;
  uint64_t late_activities = 0;     // arrived after their step was reported
  uint64_t dropped_externals = 0;   // correlation table full: oldest launches forgotten
  uint64_t external_records = 0;    // launch external ids received (NVTX range / shim call)
  uint64_t joined_activities = 0;   // kernels whose launch's external ids were found
  uint64_t unjoined_activities = 0; // kernels dropped after reporting whose launch had none known
  uint64_t call_marks = 0;          // fp8wire call-begin marks received (classify.hpp)
  uint64_t unmatched_step_ends = 0;
  uint64_t nested_step_begins = 0;  // a step began while another was open: ignored
  uint64_t steps_reported = 0;
};

// Keeps raw records only until the steps they belong to are reported (bounded memory on long runs).
// Not thread-safe: the caller serialises access.
class Collector {
 public:
  explicit Collector(CollectorOptions options);
  NameTable& names() { return names_; }
  const CollectorOptions& options() const { return options_; }
  void set_rank(int rank) { options_.rank = rank; }

  void add_activity(const Activity& a);
  void add_call(const CallInfo& c);
  // What was pushed around the launch with CUPTI correlation id `correlation`: the shim's call
  // sequence number and/or the hash of the application's innermost NVTX range (0: not set).
  void add_external(uint32_t correlation, uint64_t call_seq, uint64_t range_hash);
  // The name behind a range hash (posted once per thread and name by the NVTX handlers).
  void name_range(uint64_t range_hash, std::string_view name);
  uint32_t range_name(uint64_t range_hash) const;  // kNoName when not (yet) named
  void step_begin(int64_t step, int64_t t);
  // step < 0: ends whichever step is open.
  void step_end(int64_t step, int64_t t);
  bool step_open() const { return open_step_.has_value(); }

  struct Finalized {
    StepReport report;
    StepTimeline timeline;
  };
  // Reports the steps that ended at least settle_ns before `now` (or every closed step when
  // `everything`), oldest first, then drops the records no unreported step can need. With `everything` and no step ever
  // marked, the whole run (every kept record) is reported as step -1.
  std::vector<Finalized> finalize(int64_t now, bool everything);
  // Reports every closed step now, without waiting for a later one (an explicit flush).
  std::vector<Finalized> finalize_closed();

  const CollectorCounters& counters() const { return counters_; }
  size_t kept_activities() const { return activities_.size(); }
  size_t kept_externals() const { return externals_.size(); }

 private:
  CollectorOptions options_;
  NameTable names_;
  std::vector<Activity> activities_;
  std::vector<CallInfo> calls_;
  std::vector<StepWindow> closed_steps_;  // ended, not yet reported, by begin time
  std::optional<StepWindow> open_step_;
  int64_t reported_until_ = std::numeric_limits<int64_t>::min();  // end of the last reported step
  bool any_step_ = false;
  CollectorCounters counters_;
  struct External {
    uint64_t call_seq = 0;
    uint64_t range_hash = 0;
  };
  std::unordered_map<uint32_t, External> externals_;  // correlation id -> what was pushed
  uint32_t newest_correlation_ = 0;
  std::unordered_map<uint64_t, uint32_t> range_names_;  // range hash -> name id

  std::vector<Finalized> report_first(size_t ready);
  void resolve_externals();
};

}  // namespace fp8wire::prof
