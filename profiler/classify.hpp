// Which kernels count as communication. The rule (documented in profiler/README.md) has to survive
// NCCL renaming its kernels between releases (ncclKernel_AllReduce_RING_LL_Sum_float in 2.18,
// ncclDevKernel_AllReduce_Sum_f32_RING_LL in 2.19+), so it matches substrings, not exact names:
//   communication = name contains "nccl" or "fp8wire" (case-insensitive), or any extra pattern;
//   memory        = memcpy / memset activity (not a kernel);
//   call mark     = fp8wire's call-begin marker (below): neither, it only says when a call began;
//   compute       = every other kernel.
// Every fp8wire codec kernel lives in namespace fp8wire::quant, so its (mangled or demangled) name
// contains "fp8wire".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp8wire::prof {

enum class ActivityClass : uint8_t { compute = 0, communication = 1, memory = 2, call_mark = 3 };

// The name of the empty kernel libfp8wire.so launches on an FP8 call's first lane, after the lane
// waited for the caller's stream and before it waits on its peers, when the profiler is loaded
// (quant::mark_call_begin). Its start is when the lanes entered the call: the call's span reaches
// back to it, so a wait before the call's first codec kernel counts as the call's (exposure.hpp).
inline constexpr std::string_view kCallMarkKernel = "call_begin_mark";
const char* to_string(ActivityClass);

class KernelClassifier {
 public:
  // extra_patterns: more case-insensitive substrings marking communication, separated by '|'
  // (e.g. "allreduce|cross_device_reduce" for a custom all-reduce). Empty pieces are ignored.
  explicit KernelClassifier(std::string_view extra_patterns = {});
  ActivityClass classify_kernel(std::string_view kernel_name) const;
  const std::vector<std::string>& patterns() const { return patterns_; }

 private:
  std::vector<std::string> patterns_;  // lower case
};

// Collective named by an NCCL kernel ("ncclDevKernel_AllReduce_Sum_f32_RING_LL" -> "AllReduce"),
// so reports without the shim still say which collective a kernel ran. "" when not recognised.
std::string_view nccl_collective_of(std::string_view kernel_name);

}  // namespace fp8wire::prof
