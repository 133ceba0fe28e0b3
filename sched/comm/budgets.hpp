// Memory the communicators of one process share, each pool capped for the whole process: however
// many communicators a job creates (PyTorch makes one per pair of ranks that send to each other),
// fp8wire holds at most these bounds on top of what NCCL itself holds.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/config.hpp"
#include "sched/plan/stages.hpp"

namespace fp8wire::sched {

// The scratch of every communicator where FP8 may run (scratch.process_max_bytes). A communicator
// offers at its agreement what it takes from here, and keeps what every rank could offer (the least
// offer; sched/comm/comm_setup.cpp). An offer is the configured cap (scratch.max_bytes) or half of
// what is left, whichever is less: the first communicator of a job gets the whole cap under the
// defaults, later ones less and less (their larger calls then run in more pipeline stages) and never
// nothing at once; below kSmallest it is none (its collectives pass through; its messages still go
// FP8, they take no scratch).
class ScratchBudget {
 public:
  static constexpr uint64_t kSmallest = 16 << 20; // a part of the budget smaller than this is not offered
  explicit ScratchBudget(uint64_t total) : total_(total), left_(total) {}
  // Takes the offer of a new communicator whose cap is `cap` from the budget (0: nothing left).
  uint64_t take(uint64_t cap);
  // Returns bytes taken before (a communicator released, or keeping less than it offered).
  void give_back(uint64_t bytes) { left_.fetch_add(bytes, std::memory_order_relaxed); }
  uint64_t total() const { return total_; }
  uint64_t held() const { return total_ - left_.load(std::memory_order_relaxed); }

 private:
  const uint64_t total_;
  std::atomic<uint64_t> left_;
};

struct ProcessBudgets {
  explicit ProcessBudgets(const Config& c)
      : feedback(static_cast<int64_t>(c.error_feedback_max_bytes)), scratch(c.scratch_process_max_bytes) {}
  std::atomic<int64_t> feedback;  // error feedback residuals (error_feedback.max_bytes)
  ScratchBudget scratch;
};

}  // namespace fp8wire::sched
