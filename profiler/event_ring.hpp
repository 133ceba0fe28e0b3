// Bounded multi-producer, single-consumer ring for events the application's threads post (NVTX
// ranges, step marks, intercepted calls). Producers never block and never allocate: when the ring is
// full the event is dropped and counted, so a
// full ring never stalls the application. The consumer drains under its own lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace fp8wire::prof {

template <class T>
class EventRing {
 public:
  explicit EventRing(size_t capacity) : capacity_(capacity), slots_(new Slot[capacity]) {}

  // Any thread. False when full (the event is counted in dropped()).
  bool push(const T& value) {
    uint64_t position = head_.load(std::memory_order_relaxed);
    do {
      if (position - tail_.load(std::memory_order_acquire) >= capacity_) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
    } while (!head_.compare_exchange_weak(position, position + 1, std::memory_order_relaxed));
    Slot& slot = slots_[position % capacity_];
    slot.value = value;
    // turn == position + 1 tells the consumer this slot holds the event for `position`.
    slot.turn.store(position + 1, std::memory_order_release);
    return true;
  }

  // One consumer at a time. Calls f(const T&) for every published event in order; stops at the
  // first slot a producer has reserved but not yet filled (it is picked up by the next drain).
  template <class F>
  size_t drain(F&& f) {
    size_t n = 0;
    uint64_t position = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Slot& slot = slots_[position % capacity_];
      if (slot.turn.load(std::memory_order_acquire) != position + 1) break;
      f(static_cast<const T&>(slot.value));
      ++position;
      ++n;
      tail_.store(position, std::memory_order_release);
    }
    return n;
  }

  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  size_t capacity() const { return capacity_; }

 private:
  struct Slot {
    std::atomic<uint64_t> turn{0};
    T value{};
  };
  const size_t capacity_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> head_{0};
  std::atomic<uint64_t> tail_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace fp8wire::prof
