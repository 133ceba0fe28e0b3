// The CUDA runtime functions the execution core calls, as a table like NcclApi (one line per runtime
// function in cuda_functions.def). The GPU build fills it with the runtime's own functions
// (sched/platform/gpu_platform.hpp); the CPU tier with a simulated device (tests/sched/sim/), so every
// line of the core runs in CI without a GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

namespace fp8wire {

struct CudaApi {
#define FP8WIRE_CUDA_FN(name, type) std::add_pointer_t<type> name = nullptr;
#include "sched/platform/cuda_functions.def"
#undef FP8WIRE_CUDA_FN
  // Stream memory operations, the direct transports' barrier (no SM is held while a stream waits):
  // the stream waits until the 32-bit word at `addr` (an address GPU work of this process reaches)
  // equals `value`; or, once its earlier work is done and visible system-wide, writes `value` there.
  // Null where the driver offers none (the driver's, not the runtime's: the direct platform fills them).
  cudaError_t (*StreamWaitValue32)(cudaStream_t, void* addr, uint32_t value) = nullptr;
  cudaError_t (*StreamWriteValue32)(cudaStream_t, void* addr, uint32_t value) = nullptr;
  // Stream-ordered memory for what outlives one call's scratch (a point-to-point message's wire
  // buffer): usable from its place in `stream`'s order until FreeAsync's. On the GPU from a pool of
  // fp8wire's own that keeps its memory between calls (the application's default pool is not
  // touched), and under graph capture a graph allocation.
  cudaError_t (*MallocAsync)(void** out, size_t bytes, cudaStream_t stream) = nullptr;
  cudaError_t (*FreeAsync)(void* p, cudaStream_t stream) = nullptr;
};

}  // namespace fp8wire
