// One error model (STYLE.md 5). Internal functions return ncclResult_t (host logic) or cudaError_t
// (quant launchers); these macros add file:line to the log and return early. Nothing here throws or
// exits: the exported nccl* functions catch everything and return an ncclResult_t.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/log.hpp"

namespace fp8wire {
// An NCCL call that did not fail: ncclInProgress (non-blocking communicators) is not a failure.
inline bool nccl_ok(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }
}  // namespace fp8wire

// Evaluates a CUDA runtime call; on failure logs it and returns ncclUnhandledCudaError.
#define FP8WIRE_CUDA_CHECK(call)                                                          \
  do {                                                                                    \
    cudaError_t fp8wire_err_ = (call);                                                    \
    if (__builtin_expect(fp8wire_err_ != cudaSuccess, 0)) {                               \
      FP8WIRE_ERROR("CUDA error {} ({}) in {}", cudaGetErrorName(fp8wire_err_),           \
                    cudaGetErrorString(fp8wire_err_), #call);                             \
      return ncclUnhandledCudaError;                                                      \
    }                                                                                     \
  } while (0)

// Evaluates a CUDA call inside a function that returns cudaError_t; returns the error unchanged.
#define FP8WIRE_CUDA_RETURN(call)                                                         \
  do {                                                                                    \
    cudaError_t fp8wire_err_ = (call);                                                    \
    if (__builtin_expect(fp8wire_err_ != cudaSuccess, 0)) return fp8wire_err_;            \
  } while (0)

// Evaluates an ncclResult_t expression; on failure logs it and returns the same code.
// ncclInProgress (non-blocking communicators) is not a failure.
#define FP8WIRE_NCCL_CHECK(call)                                                          \
  do {                                                                                    \
    ncclResult_t fp8wire_res_ = (call);                                                   \
    if (__builtin_expect(!::fp8wire::nccl_ok(fp8wire_res_), 0)) {                         \
      FP8WIRE_ERROR("NCCL error {} in {}", static_cast<int>(fp8wire_res_), #call);        \
      return fp8wire_res_;                                                                \
    }                                                                                     \
  } while (0)

// Evaluates an ncclResult_t expression that has already logged its failure; returns it unchanged.
#define FP8WIRE_TRY(expr)                                                                 \
  do {                                                                                    \
    ncclResult_t fp8wire_try_ = (expr);                                                   \
    if (__builtin_expect(fp8wire_try_ != ncclSuccess, 0)) return fp8wire_try_;            \
  } while (0)
