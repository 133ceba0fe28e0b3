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
  // A communicator of ncclCommInitAll: every rank is in this process and one thread drives them
  // all, so it always passes through (plan.hpp: CallShape::single_process). All its ranks are
  // created by the same call, so all of them decide alike.
  void comm_created_single_process(ncclComm_t comm);
  // Whether a registered communicator is such a one (a split or shrink of it is one too).
  bool comm_single_process(ncclComm_t comm) const;
  // Before the real ncclCommDestroy: frees this communicator's scratch and state.
  void comm_destroyed(ncclComm_t comm);
  // ncclCommAbort in place of the real one: takes the communicator out of the registry, runs the
  // real abort, and only then frees its scratch and streams. The abort is what stops a collective
  // that will never finish (a dead peer, a hang the job's watchdog caught); freeing first would wait
  // for that collective (stream synchronize, cudaFree) and hang the abort itself.
  ncclResult_t comm_abort(ncclComm_t comm);

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
  // ncclGroupSimulateEnd closes the group like ncclGroupEnd but runs nothing: the FP8 calls queued
  // in it are dropped, not run later (NCCL's estimate covers only the calls it saw: pass-through).
  ncclResult_t group_simulate_end(ncclSimInfo_t* sim_info);

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
