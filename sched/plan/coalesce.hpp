// Groups and coalescing, the pure part: the application's ncclGroupStart/End depth on one thread,
// and which consecutive grouped calls are packed into one FP8 collective. Only calls the
// application grouped itself are ever packed, and never past its own ncclGroupEnd (docs/DESIGN.md,
// "The lesson": merging calls that were hidden behind compute puts them on the critical path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/config.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

// One call the application issued inside its group, as the coalescer sees it.
struct PendingShape {
  const void* comm = nullptr;
  const void* stream = nullptr;  // calls on different streams are never packed together
  bool fp8 = true;               // false: a pass-through call queued for ordering only
  Collective collective = Collective::all_reduce;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  uint64_t bytes = 0;
};
// Length of the batch that starts at items[0]: consecutive FP8 all-reduces of the same communicator,
// stream, dtype and op, packed while the total stays within coalesce_max_bytes (and the staging area) and
// the number of calls within coalesce_max_calls. Always >= 1 for a non-empty list; 1 when coalescing
// is off, the call is not an all-reduce, or the first call alone exceeds the cap.
size_t coalesce_batch_length(const Config& config, size_t staging_bytes,
                             std::span<const PendingShape> items);

// The application's ncclGroupStart/End depth on one thread. FP8 calls issued at depth > 0 are queued
// and run after the outermost GroupEnd.
class GroupState {
 public:
  void start() { ++depth_; }
  // Returns true when this end closes the outermost group (the moment queued calls run).
  // An unbalanced end (depth already 0) returns false and is reported by `unbalanced()`.
  bool end();
  int depth() const { return depth_; }
  bool inside() const { return depth_ > 0; }
  bool unbalanced() const { return unbalanced_; }

 private:
  int depth_ = 0;
  bool unbalanced_ = false;
};

}  // namespace fp8wire::sched
