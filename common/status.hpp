// One error model, with a hard boundary at the exported functions. Internal functions return
// ncclResult_t (host logic) or cudaError_t (quant launchers); these macros add file:line to the log
// and return early. Nothing here throws or exits: the exported nccl* functions catch everything and
// return an ncclResult_t.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>

#include "common/log.hpp"

namespace fp8wire {
// An NCCL call that did not fail: ncclInProgress (non-blocking communicators) is not a failure.
inline bool nccl_ok(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }
}  // namespace fp8wire

// The one family of CUDA / NCCL checks, for the library and for every program (tools, tests):
//   FP8WIRE_CUDA_OR(call, action)   on failure: one log line "<call> failed: <error> (file:line)",
//   FP8WIRE_NCCL_OR(call, action)   then `action` (return 2; std::exit(1); throw ...), the caller's
//                                   choice of what failing means for it.
//   FP8WIRE_CUDA_CHECK(call)        the library's: ..., then return ncclUnhandledCudaError.
//   FP8WIRE_NCCL_CHECK(call)        the library's: ..., then return the same NCCL code.
//   FP8WIRE_CUDA_OR_EXIT(call)      programs' (tools, probes, tests): ..., then exit(1).
//   FP8WIRE_NCCL_OR_EXIT(call)
//   FP8WIRE_DRIVER_OR(call, action) a CUDA driver call (CUresult; reached through an entry point, so
//                                   no driver header here): "<call> failed: CUresult N (file:line)".
//   FP8WIRE_CUDA_RETURN(call)       inside a function returning cudaError_t: return the error.
//   FP8WIRE_TRY(expr)               an ncclResult_t already logged: return it unchanged.
// ncclInProgress (non-blocking communicators) is not a failure. NCCL's error names come from a table
// here, not ncclGetErrorString: libfp8wire.so does not link NCCL.
namespace fp8wire {
inline const char* nccl_result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "unknown NCCL result";
  }
}
}  // namespace fp8wire

#define FP8WIRE_CUDA_OR(call, action)                                                     \
  do {                                                                                    \
    const cudaError_t fp8wire_err_ = (call);                                              \
    if (__builtin_expect(fp8wire_err_ != cudaSuccess, 0)) {                               \
      FP8WIRE_ERROR("{} failed: {} ({}) ({}:{})", #call, cudaGetErrorName(fp8wire_err_),  \
                    cudaGetErrorString(fp8wire_err_), __FILE__, __LINE__);                \
      action;                                                                             \
    }                                                                                     \
  } while (0)

#define FP8WIRE_NCCL_OR(call, action)                                                     \
  do {                                                                                    \
    const ncclResult_t fp8wire_res_ = (call);                                             \
    if (__builtin_expect(!::fp8wire::nccl_ok(fp8wire_res_), 0)) {                         \
      FP8WIRE_ERROR("{} failed: {} ({}:{})", #call, ::fp8wire::nccl_result_name(fp8wire_res_), \
                    __FILE__, __LINE__);                                                  \
      action;                                                                             \
    }                                                                                     \
  } while (0)

#define FP8WIRE_DRIVER_OR(call, action)                                                   \
  do {                                                                                    \
    const int fp8wire_cu_ = static_cast<int>(call);                                       \
    if (__builtin_expect(fp8wire_cu_ != 0, 0)) {                                          \
      FP8WIRE_ERROR("{} failed: CUresult {} ({}:{})", #call, fp8wire_cu_, __FILE__, __LINE__); \
      action;                                                                             \
    }                                                                                     \
  } while (0)

#define FP8WIRE_CUDA_CHECK(call) FP8WIRE_CUDA_OR(call, return ncclUnhandledCudaError)
#define FP8WIRE_CUDA_OR_EXIT(call) FP8WIRE_CUDA_OR(call, std::exit(1))
#define FP8WIRE_NCCL_OR_EXIT(call) FP8WIRE_NCCL_OR(call, std::exit(1))

// Evaluates a CUDA call inside a function that returns cudaError_t; returns the error unchanged.
#define FP8WIRE_CUDA_RETURN(call)                                                         \
  do {                                                                                    \
    cudaError_t fp8wire_err_ = (call);                                                    \
    if (__builtin_expect(fp8wire_err_ != cudaSuccess, 0)) return fp8wire_err_;            \
  } while (0)

// The library's NCCL check returns the very code it met (the caller may tell ncclRemoteError apart).
#define FP8WIRE_NCCL_CHECK(call)                                                          \
  do {                                                                                    \
    const ncclResult_t fp8wire_nccl_checked_ = (call);                                    \
    FP8WIRE_NCCL_OR(fp8wire_nccl_checked_, return fp8wire_nccl_checked_);                 \
  } while (0)

// Evaluates an ncclResult_t expression that has already logged its failure; returns it unchanged.
#define FP8WIRE_TRY(expr)                                                                 \
  do {                                                                                    \
    ncclResult_t fp8wire_try_ = (expr);                                                   \
    if (__builtin_expect(fp8wire_try_ != ncclSuccess, 0)) return fp8wire_try_;            \
  } while (0)
