// Everything the execution core needs from outside itself, in one place: the real-NCCL table, the
// CUDA runtime table, the codec table and the host's facts. The library and fp8wire-bench use the
// GPU platform (sched/platform/gpu_platform.hpp); the CPU tier a simulated one. The core calls nothing else.
#pragma once

#include <cstdint>

#include "sched/platform/codec_api.hpp"
#include "sched/platform/cuda_api.hpp"
#include "sched/platform/direct_memory.hpp"
#include "sched/platform/nccl_api.hpp"

namespace fp8wire {

// What this process knows about its host and device, for the agreement (sched/plan/agreement.hpp).
struct HostFacts {
  uint64_t host_hash = 0;    // NCCL's own notion of a host: NCCL_HOSTID, else hostname + boot id
  bool p2p_disabled = false; // NCCL_P2P_DISABLE=1
  bool nvlink_local = false; // `device` reaches every other GPU this process sees over NVLink
  uint32_t process_id = 0;   // this process (two ranks of one communicator in one process: no FP8)
  // A hash of `device`'s UUID (0: unknown): ranks with the same one share a GPU, so its host link
  // too (ranks emulated on one GPU), which sets how a direct call is cut (the shared bounds of the fabric's direct pipeline shape, CostModel::direct_shared_*).
  uint64_t gpu_hash = 0;
};

struct Platform {
  const NcclApi* nccl = nullptr;  // must outlive the engine
  CudaApi cuda;
  CodecApi codec;
  DirectMemoryApi direct;  // windows of the direct transports (empty: none on this platform)
  HostFacts (*host_facts)(int device) = nullptr;
  // What a thread the core starts for a blocking call (sched/comm/exchange.hpp) takes over from the
  // thread that started it: the simulated machine's rank the caller acts as (null here: nothing; the
  // GPU's calls set their device themselves).
  void* (*thread_context)() = nullptr;
  void (*adopt_thread_context)(void* context) = nullptr;
};

}  // namespace fp8wire
