// Error feedback: the quantization residual of one all-reduce is added to the same logical tensor's
// next all-reduce. Keyed by an identity the application gives (fp8wire_set_feedback_key: a DDP
// bucket index, a parameter group...), never by buffer address: a caching allocator hands the same
// address to different tensors, and one tensor's residual must never reach another. A call that
// carries no key gets no feedback. A key met again with another element count or dtype starts over
// from a zero residual instead of adding a residual of another shape.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "sched/platform/cuda_api.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

// The key the next FP8 all-reduce issued on this thread carries (consumed by it). 0 = none.
void set_thread_feedback_key(uint64_t key);
uint64_t take_thread_feedback_key();

class FeedbackStore {
 public:
  // `budget`: bytes of residual memory left for the whole process (error_feedback.max_bytes).
  FeedbackStore(const CudaApi& cuda, std::atomic<int64_t>& budget) : cuda_(&cuda), budget_(&budget) {}
  ~FeedbackStore();
  FeedbackStore(const FeedbackStore&) = delete;
  FeedbackStore& operator=(const FeedbackStore&) = delete;

  // The fp32 residual of `key` for a call of `count` elements of `dtype`, zeroed on `stream` when
  // new. nullptr (no feedback for this call) when the key is 0, the budget is spent, or the stream
  // is being captured and the key has no residual of this shape (nothing is allocated or freed
  // under capture). A residual a captured graph was given is never freed while the store lives,
  // even when its key comes back with another shape: the graph may be replayed later.
  float* residual_for(uint64_t key, size_t count, DataType dtype, cudaStream_t stream, bool capturing);
  size_t size() const;

 private:
  struct Residual {
    float* data = nullptr;
    size_t count = 0;
    DataType dtype = DataType::f32;
    bool captured = false;  // handed to a call under capture: a graph holds the address
  };
  void drop(Residual& r);
  const CudaApi* cuda_;
  std::atomic<int64_t>* budget_;
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, Residual> residuals_;
  std::vector<Residual> retired_;  // replaced residuals a captured graph may still use; freed with the store
};

}  // namespace fp8wire::sched
