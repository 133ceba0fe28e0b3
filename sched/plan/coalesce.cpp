#include "sched/plan/coalesce.hpp"

#include <algorithm>

namespace fp8wire::sched {

size_t coalesce_batch_length(const Config& config, size_t staging_bytes,
                             std::span<const PendingShape> items) {
  if (items.empty()) return 0;
  const PendingShape& first = items[0];
  if (!config.coalesce_enable || !first.fp8 || first.collective != Collective::all_reduce) return 1;
  const uint64_t cap = std::min<uint64_t>(config.coalesce_max_bytes, staging_bytes);
  if (first.bytes > cap) return 1;
  uint64_t total = first.bytes;
  size_t n = 1;
  while (n < items.size() && n < config.coalesce_max_calls) {
    const PendingShape& next = items[n];
    if (!next.fp8 || next.comm != first.comm || next.stream != first.stream ||
        next.collective != first.collective || next.dtype != first.dtype || next.op != first.op ||
        total + next.bytes > cap)
      break;
    total += next.bytes;
    ++n;
  }
  return n;
}

bool GroupState::end() {
  if (depth_ == 0) {
    unbalanced_ = true;
    return false;
  }
  return --depth_ == 0;
}

}  // namespace fp8wire::sched
