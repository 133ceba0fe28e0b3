// The scheduler's entry points. The shim forwards every intercepted NCCL call here; fp8wire-bench
// drives the same code with a forced algorithm. The engine decides per call: pass through (the real
// NCCL function, no extra work), or an FP8 algorithm (plan.hpp), and runs it through the real-NCCL
// table and the quant launchers.
//
// Every function returns an ncclResult_t and never throws.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <memory>

#include "common/config.hpp"
#include "sched/accounting.hpp"
#include "sched/nccl_api.hpp"

namespace fp8wire::sched {

class Engine {
 public:
  // api must stay valid for the life of the engine.
  Engine(const Config& config, const NcclApi& api);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Config& config() const;
  const NcclApi& nccl() const;

  // --- communicator lifecycle: called by the shim after the real call succeeded -----------------
  void comm_created(ncclComm_t comm);
  // Same, telling whether the communicator was created non-blocking (ncclConfig_t::blocking = 0):
  // such communicators always pass through. NCCL_COMM_BLOCKING=0 in the environment counts too.
  void comm_created(ncclComm_t comm, bool nonblocking);
  // Before the real ncclCommDestroy/Abort: frees this communicator's scratch and state.
  void comm_destroyed(ncclComm_t comm);

  // --- collectives with an FP8 path ------------------------------------------------------------
  ncclResult_t all_reduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t dtype,
                          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t reduce_scatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                              ncclDataType_t dtype, ncclRedOp_t op, ncclComm_t comm,
                              cudaStream_t stream);
  ncclResult_t all_gather(const void* sendbuff, void* recvbuff, size_t sendcount,
                          ncclDataType_t dtype, ncclComm_t comm, cudaStream_t stream);

  // --- groups: FP8 calls issued inside the application's group run at its outermost GroupEnd -----
  ncclResult_t group_start();
  ncclResult_t group_end();

  // --- benchmark entry: the same code with the algorithm forced (Path::passthrough = plain NCCL) ---
  ncclResult_t all_reduce_forced(Path path, const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t dtype, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream);
  ncclResult_t reduce_scatter_forced(Path path, const void* sendbuff, void* recvbuff,
                                     size_t recvcount, ncclDataType_t dtype, ncclRedOp_t op,
                                     ncclComm_t comm, cudaStream_t stream);
  ncclResult_t all_gather_forced(Path path, const void* sendbuff, void* recvbuff, size_t sendcount,
                                 ncclDataType_t dtype, ncclComm_t comm, cudaStream_t stream);

  // The fabric class the engine decided for a communicator (after its first candidate call or
  // comm_created), for logs and the benchmark.
  Fabric fabric_of(ncclComm_t comm) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8wire::sched
