// The table of real NCCL entry points. fp8wire's own NCCL calls always go through this table, never
// through the exported nccl* symbols of libfp8wire.so (which would re-enter the shim).
// The shim fills it by symbol resolution (nccl_api_from_lookup, from shim/real_nccl.cpp); fp8wire-bench
// and the tests, which link NCCL directly, fill it with nccl_api_from_linked()
// (sched/platform/nccl_api_linked.hpp).
#pragma once

#include <nccl.h>

#include <functional>
#include <string>

namespace fp8wire {

struct NcclApi {
#define FP8WIRE_NCCL_FN(name) decltype(&::nccl##name) name = nullptr;
#include "sched/platform/nccl_functions.def"
#undef FP8WIRE_NCCL_FN
  // True when every function fp8wire itself calls was resolved (optional ones may stay null).
  bool has_required() const;
};

// The table filled by name: `lookup` gives the address of the function it is asked for by its NCCL
// name ("ncclAllReduce"), or null. The names it had none for are appended to `missing`, comma-separated.
NcclApi nccl_api_from_lookup(const std::function<void*(const char* name)>& lookup, std::string& missing);

}  // namespace fp8wire
