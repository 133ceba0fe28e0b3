// The real-NCCL table for programs that link NCCL directly (fp8wire-bench, tests): every field is
// the linked library's own function. Including this header makes the includer depend on libnccl;
// libfp8wire.so never includes it (it resolves NCCL at run time, shim/real_nccl.cpp).
#pragma once

#include "sched/platform/nccl_api.hpp"

namespace fp8wire {

inline NcclApi nccl_api_from_linked() {
  NcclApi api;
#define FP8WIRE_NCCL_FN(name) api.name = &::nccl##name;
#include "sched/platform/nccl_functions.def"
#undef FP8WIRE_NCCL_FN
  return api;
}

}  // namespace fp8wire
