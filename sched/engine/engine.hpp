// The scheduler's entry points: what the shim forwards every intercepted NCCL call to, and nothing
// else (fp8wire-bench and the tests reach further through sched/engine/engine_probe.hpp: forced
// algorithms, a communicator's agreed view). The CPU tier drives it over a simulated platform.
// The engine decides per call, from facts agreed once per communicator at its creation: pass
// through (the real NCCL function, no extra work), or an FP8 algorithm run by the pipeline executor.
//
// Every function returns an ncclResult_t (or nothing) and never throws.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/config.hpp"
#include "sched/plan/agreement.hpp"
#include "sched/plan/types.hpp"
// What the engine calls CUDA, NCCL and the codec through (Platform), the GPU's platform (gpu_platform)
// and the real-NCCL table (NcclApi, filled by name with nccl_api_from_lookup): with them this header
// is all the shim needs of sched/ to build and drive an engine (shim/README.md).
#include "sched/platform/gpu_platform.hpp"

namespace fp8wire::sched {

// How a communicator came to be, as the shim saw its creation.
struct CommCreation {
  bool nonblocking = false;     // ncclConfig_t::blocking = 0, or NCCL_COMM_BLOCKING=0: always passes through
  bool single_process = false;  // ncclCommInitAll (or a split of one): one thread drives every rank
};

class Engine {
 public:
  // `platform` must outlive the engine. `me`: this process's identity in every agreement (a process
  // whose configuration failed passes `usable = false` and the reason, and still takes part).
  Engine(const Config& config, const Platform& platform, LocalIdentity me = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Config& config() const;

  // --- communicator lifecycle: called by the shim after the real call succeeded -----------------
  // Registers the communicator and runs its agreement (blocking: one all-gather of 64 bytes per rank
  // with every other rank of it). Inside an application group the communicator is only ready at the
  // group's end, so its agreement runs there, for all communicators created in that group together
  // (group_end then returns a set-up's failure). An error when an exchange of the set-up failed (a
  // peer killed or stopped: setup_timeout_s; an abort; an NCCL error): the creation must then fail,
  // and the communicator be aborted (comm_abort), which stops what the exchange left in flight.
  ncclResult_t comm_created(ncclComm_t comm, CommCreation how = {});
  // Whether a registered communicator is driven by one thread for all its ranks (a split or shrink
  // of it is too).
  bool comm_single_process(ncclComm_t comm) const;
  // Before the real ncclCommDestroy: unregisters it; its resources go with the last call using them.
  // ncclRemoteError when that release found an FP8 call still waiting on a direct peer that has gone
  // (the wait is released so that the lanes end, and that call's output is not valid). `deferred`
  // (when given) says the real destroy must not be called: a host call of its set-up, given up on,
  // is still inside NCCL with it, and fp8wire aborts it once that returns.
  ncclResult_t comm_destroyed(ncclComm_t comm, bool* deferred = nullptr);
  // ncclCommAbort in place of the real one: unregisters the communicator and releases an agreement
  // waiting on it, runs the real abort, and only then releases its resources. The abort is what
  // stops a collective that will never finish; freeing first would wait for it and hang the abort.
  ncclResult_t comm_abort(ncclComm_t comm);
  // True when an operation of the communicator's direct transport waits, or will wait, on a peer
  // that has gone (closed its communicator or ended): a flag nobody will set. The shim reports it
  // through ncclCommGetAsyncError as ncclRemoteError, so the application's watchdog aborts. A peer
  // gone while nothing waits on it is not reported.
  bool comm_peer_lost(ncclComm_t comm) const;
  // What fp8wire knows of the communicator's health beyond NCCL's own answer, for the shim's
  // ncclCommGetAsyncError (ncclSuccess: nothing): its set-up failed, an FP8 call on it failed, an
  // operation waits on a gone direct peer (comm_peer_lost), or one of its own sub-communicators (the
  // hierarchical path's host and rail) reports an asynchronous error.
  ncclResult_t comm_async_error(ncclComm_t comm) const;
  // Every registered communicator's state, one line each (its set-up, its failure, its lanes busy or
  // idle, the direct windows' flags, its last call), for a stalled job's diagnosis: the C API's
  // fp8wire_debug_state, which a test's watchdog or signal handler prints.
  std::string debug_state() const;

  // --- collectives with an FP8 path ------------------------------------------------------------
  ncclResult_t all_reduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t dtype,
                          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t reduce_scatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                              ncclDataType_t dtype, ncclRedOp_t op, ncclComm_t comm,
                              cudaStream_t stream);
  ncclResult_t all_gather(const void* sendbuff, void* recvbuff, size_t sendcount,
                          ncclDataType_t dtype, ncclComm_t comm, cudaStream_t stream);
  // ncclAlltoAll: `count` elements to and from every rank (chunk j of sendbuff goes to rank j). Its
  // pass-through is the real ncclAlltoAll, which NCCL has from 2.28: with an older one a call that
  // would pass through returns ncclSystemError, and says why (the shim refuses every call then).
  ncclResult_t all_to_all(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t dtype,
                          ncclComm_t comm, cudaStream_t stream);

  // --- point-to-point: the application's ncclSend / ncclRecv ----------------------------------------
  // FP8 where collectives.send_recv and the threshold say so (both ends decide alike from the count,
  // the dtype and the agreed configuration), else the real call. Inside an application group the
  // real send or receive joins that group; a received message is decoded after its outermost end.
  ncclResult_t send(const void* sendbuff, size_t count, ncclDataType_t dtype, int peer, ncclComm_t comm,
                    cudaStream_t stream);
  ncclResult_t recv(void* recvbuff, size_t count, ncclDataType_t dtype, int peer, ncclComm_t comm,
                    cudaStream_t stream);

  // --- groups: FP8 calls issued inside the application's group run at its outermost GroupEnd -----
  ncclResult_t group_start();
  ncclResult_t group_end();
  // ncclGroupSimulateEnd closes the group like ncclGroupEnd but runs nothing: the FP8 calls queued
  // in it are dropped, not run later (NCCL's estimate covers only the calls it saw: pass-through).
  ncclResult_t group_simulate_end(ncclSimInfo_t* sim_info);

  // Error feedback: the identity the next FP8 all-reduce issued on this thread carries (0: none).
  static void set_feedback_key(uint64_t key);

  struct Impl;

 private:
  friend class EngineProbe;  // sched/engine/engine_probe.hpp: the benchmark's and the tests' view
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8wire::sched
