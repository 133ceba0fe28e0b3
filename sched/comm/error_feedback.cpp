#include "sched/comm/error_feedback.hpp"

#include "common/log.hpp"

namespace fp8wire::sched {

namespace {
thread_local uint64_t tl_feedback_key = 0;
}  // namespace

void set_thread_feedback_key(uint64_t key) { tl_feedback_key = key; }
uint64_t take_thread_feedback_key() {
  const uint64_t key = tl_feedback_key;
  tl_feedback_key = 0;
  return key;
}

FeedbackStore::~FeedbackStore() {
  for (auto& [key, r] : residuals_) drop(r);
  for (auto& r : retired_) drop(r);
}

void FeedbackStore::drop(Residual& r) {
  if (!r.data) return;
  cuda_->Free(r.data);
  budget_->fetch_add(static_cast<int64_t>(r.count * sizeof(float)), std::memory_order_relaxed);
  r = Residual{};
}

size_t FeedbackStore::size() const {
  std::lock_guard lock(mutex_);
  return residuals_.size();
}

float* FeedbackStore::residual_for(uint64_t key, size_t count, DataType dtype, cudaStream_t stream, bool capturing) {
  if (key == 0) {
    FP8WIRE_WARN_ONCE("error_feedback.enable is set but an FP8 all-reduce carried no feedback key: no "
                      "feedback for such calls (give one with fp8wire_set_feedback_key / "
                      "fp8wire.feedback_key(), e.g. the DDP bucket index)");
    return nullptr;
  }
  std::lock_guard lock(mutex_);
  Residual& r = residuals_[key];
  if (r.data && r.count == count && r.dtype == dtype) {
    r.captured |= capturing;
    return r.data;
  }
  // Nothing is allocated or freed under capture (cudaFree would end the application's capture).
  if (capturing) return nullptr;
  if (r.data) {
    FP8WIRE_WARN_ONCE("feedback key {} came back with {} elements of another shape than its residual ({}); "
                      "starting it over from zero", key, count, r.count);
    // cudaFree waits for the device, so eager work is done with it; a graph may replay it later.
    if (r.captured) retired_.push_back(r);
    else drop(r);
    r = Residual{};
  }
  // Beyond the budget the call simply goes without feedback.
  const int64_t need = static_cast<int64_t>(count * sizeof(float));
  if (budget_->fetch_sub(need, std::memory_order_relaxed) < need) {
    budget_->fetch_add(need, std::memory_order_relaxed);
    FP8WIRE_WARN_ONCE("error_feedback.max_bytes reached: further tensors go without feedback");
    return nullptr;
  }
  void* p = nullptr;
  if (cuda_->Malloc(&p, count * sizeof(float)) != cudaSuccess) {
    cuda_->GetLastError();
    budget_->fetch_add(need, std::memory_order_relaxed);
    return nullptr;
  }
  if (cuda_->MemsetAsync(p, 0, count * sizeof(float), stream) != cudaSuccess) {
    cuda_->Free(p);
    budget_->fetch_add(need, std::memory_order_relaxed);
    return nullptr;
  }
  r = Residual{static_cast<float*>(p), count, dtype};
  return r.data;
}

}  // namespace fp8wire::sched
