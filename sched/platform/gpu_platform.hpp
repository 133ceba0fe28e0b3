// The platform of the library and of fp8wire-bench: the CUDA runtime, the codec kernels and this
// host's facts. Linking it brings in the CUDA runtime and fp8wire_quant; the execution core itself
// (fp8wire_sched_core) needs neither.
#pragma once

#include "sched/platform/platform.hpp"

namespace fp8wire {

// `nccl` must outlive every engine built on the result.
Platform gpu_platform(const NcclApi& nccl);
// NCCL's own notion of this host (NCCL_HOSTID, else hostname + boot id), NCCL_P2P_DISABLE, and NVLink
// from `device` to every other GPU this process sees.
HostFacts gpu_host_facts(int device);
// The direct transports' part (sched/transport/direct_memory_gpu.cpp): shared host memory and CUDA IPC windows,
// the driver's stream memory operations.
void fill_direct_platform(Platform& p);

}  // namespace fp8wire
