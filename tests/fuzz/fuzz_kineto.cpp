// libFuzzer target: the Kineto trace reader (profiler/kineto.cpp) on arbitrary text. Must never
// crash, hang or trip a sanitizer (signed overflow included); every problem must come back as an
// error. Oracle on success: every step's partition adds up to the step and overlap is a percentage.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "profiler/kineto.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fp8wire::prof::KinetoAnalysis a;
  std::string error;
  static const fp8wire::prof::KernelClassifier classifier("allreduce");
  if (!fp8wire::prof::analyze_kineto_text(text, classifier, fp8wire::prof::KinetoOptions{}, a, error)) {
    if (error.empty()) std::abort();  // a refusal must say why
    return 0;
  }
  for (const auto& s : a.steps) {
    const double parts = s.compute_ms + s.exposed_comm_ms + s.exposed_memcpy_ms + s.idle_ms;
    if (std::fabs(parts - s.step_ms) > 1e-6 * std::max(1.0, s.step_ms)) std::abort();
    if (!(s.overlap_pct >= 0 && s.overlap_pct <= 100.0 + 1e-9)) std::abort();
    if (s.idle_ms < -1e-9 || s.exposed_comm_ms < -1e-9) std::abort();
  }
  return 0;
}
