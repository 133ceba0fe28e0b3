// What fp8wire-bench and the tests ask of an engine beyond the shim's entry points (engine.hpp): the
// collectives with the algorithm forced (the same code as the shim's calls from the route on), and a
// communicator's agreed view. The shim never uses it.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <string>

#include "sched/engine/engine.hpp"
#include "sched/plan/agreement.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

// The agreed view of one communicator, for logs, the benchmark and tests.
struct CommInfo {
  bool registered = false;
  bool agreed = false;   // the agreement ran
  bool fp8_ok = false;   // and allows FP8
  Fabric fabric = Fabric::net;
  int nranks = 0;
  int hosts = 0;
  std::string reason;    // why FP8 is off
  ncclResult_t failure = ncclSuccess;  // the first error of an FP8 call on it (sticky)
  // The direct windows set up on it (sched/transport/direct_windows.hpp), false when none.
  bool direct = false;
  Carrier direct_kind = Carrier::nccl;
  uint64_t scratch_bytes = 0;  // the scratch its ranks agreed on (Agreement::scratch_bytes)
};

class EngineProbe {
 public:
  explicit EngineProbe(Engine& engine) : engine_(&engine) {}

  CommInfo comm_info(ncclComm_t comm) const;
  // The fabric class agreed for a communicator (the override, or net, before it is agreed).
  Fabric fabric_of(ncclComm_t comm) const;
  // Scratch the process's communicators hold (scratch.process_max_bytes bounds it).
  uint64_t scratch_held() const;

  // The collectives with the algorithm forced (Path::passthrough = plain NCCL): the benchmark's
  // and the tests' way to time or check one path where the planner would choose another.
  ncclResult_t all_reduce_forced(Path path, const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t dtype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t reduce_scatter_forced(Path path, const void* sendbuff, void* recvbuff, size_t recvcount,
                                     ncclDataType_t dtype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t all_gather_forced(Path path, const void* sendbuff, void* recvbuff, size_t sendcount,
                                 ncclDataType_t dtype, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t all_to_all_forced(Path path, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t dtype,
                                 ncclComm_t comm, cudaStream_t stream);

 private:
  Engine* engine_;
};

}  // namespace fp8wire::sched
