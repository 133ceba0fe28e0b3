// The CUDA runtime functions the execution core calls, as a table like NcclApi. The GPU build fills
// it with the runtime's own functions (sched/platform/gpu_platform.hpp); the CPU tier with a simulated device
// (tests/sched/sim/), so every line of the core runs in CI without a GPU. Explicit signatures: the
// runtime's C++ header overloads some of these names, so decltype(&::cudaX) would be ambiguous.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp8wire {

struct CudaApi {
  cudaError_t (*GetDevice)(int*) = nullptr;
  cudaError_t (*SetDevice)(int) = nullptr;
  cudaError_t (*StreamCreateWithFlags)(cudaStream_t*, unsigned int) = nullptr;
  cudaError_t (*StreamDestroy)(cudaStream_t) = nullptr;
  cudaError_t (*StreamQuery)(cudaStream_t) = nullptr;
  cudaError_t (*StreamSynchronize)(cudaStream_t) = nullptr;
  cudaError_t (*StreamWaitEvent)(cudaStream_t, cudaEvent_t, unsigned int) = nullptr;
  cudaError_t (*StreamIsCapturing)(cudaStream_t, cudaStreamCaptureStatus*) = nullptr;
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t*, unsigned int) = nullptr;
  cudaError_t (*EventDestroy)(cudaEvent_t) = nullptr;
  cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t) = nullptr;
  cudaError_t (*EventQuery)(cudaEvent_t) = nullptr;        // telemetry records (sched/comm/telemetry_monitor.hpp)
  // This thread's capture mode, swapped: the telemetry's event queries run in relaxed mode, so that a
  // graph another thread captures in global mode (PyTorch's default) is not invalidated by them.
  cudaError_t (*ThreadExchangeStreamCaptureMode)(cudaStreamCaptureMode*) = nullptr;
  cudaError_t (*EventSynchronize)(cudaEvent_t) = nullptr;
  cudaError_t (*Malloc)(void**, size_t) = nullptr;
  cudaError_t (*Free)(void*) = nullptr;
  cudaError_t (*HostAlloc)(void**, size_t, unsigned int) = nullptr;
  cudaError_t (*FreeHost)(void*) = nullptr;
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t) = nullptr;
  cudaError_t (*Memcpy)(void*, const void*, size_t, cudaMemcpyKind) = nullptr;
  cudaError_t (*MemsetAsync)(void*, int, size_t, cudaStream_t) = nullptr;
  cudaError_t (*GetLastError)() = nullptr;
  const char* (*GetErrorString)(cudaError_t) = nullptr;
  // Stream memory operations, the direct transports' barrier (no SM is held while a stream waits):
  // the stream waits until the 32-bit word at `addr` (an address GPU work of this process reaches)
  // equals `value`; or, once its earlier work is done and visible system-wide, writes `value` there.
  // Null where the driver offers none.
  cudaError_t (*StreamWaitValue32)(cudaStream_t, void* addr, uint32_t value) = nullptr;
  cudaError_t (*StreamWriteValue32)(cudaStream_t, void* addr, uint32_t value) = nullptr;
};

}  // namespace fp8wire
