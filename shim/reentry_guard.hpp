// Marks "this thread is inside an intercepted NCCL call" (heaptrack's RecursionGuard).
// fp8wire's own NCCL calls go through the NcclApi table, never through the exported symbols; when a
// call does come back through an export on the same thread (real NCCL calling its own public API,
// or a bug in fp8wire), the export sees reentered() and goes straight to the real function instead
// of entering the scheduler a second time.
#pragma once

namespace fp8wire::shim {

class ReentryGuard {
 public:
  ReentryGuard() noexcept : reentered_(inside_) { inside_ = true; }
  ~ReentryGuard() {
    if (!reentered_) inside_ = false;  // only the outermost guard clears the mark
  }
  ReentryGuard(const ReentryGuard&) = delete;
  ReentryGuard& operator=(const ReentryGuard&) = delete;

  bool reentered() const noexcept { return reentered_; }
  static bool inside() noexcept { return inside_; }

 private:
  static inline thread_local bool inside_ = false;
  const bool reentered_;
};

}  // namespace fp8wire::shim
