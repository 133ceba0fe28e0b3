#include "sched/comm/budgets.hpp"

#include <algorithm>

namespace fp8wire::sched {

uint64_t ScratchBudget::take(uint64_t cap) {
  cap = cap / kScratchUnit * kScratchUnit;
  uint64_t left = left_.load(std::memory_order_relaxed);
  for (;;) {
    uint64_t offer = std::min(cap, left / 2 / kScratchUnit * kScratchUnit);
    // A small cap is offered whole or not at all; a large one is not cut below kSmallest.
    if (offer < cap && offer < kSmallest) offer = 0;
    if (offer == 0) return 0;
    if (left_.compare_exchange_weak(left, left - offer, std::memory_order_relaxed)) return offer;
  }
}

}  // namespace fp8wire::sched
