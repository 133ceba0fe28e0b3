// The NCCL functions libfp8wire.so exports (shim/exports.map). Each one only resolves and forwards:
// the decisions live in sched/, which is tested without preloading anything.
//
// Every export has the same shape (intercept() below):
//   guard this thread -> set up on first use -> re-entered? real function -> not routed to the
//   engine (collectives: not active; lifecycle and groups: no engine)? real function -> the engine
//   (collectives, groups, lifecycle) or the real function (the rest).
// Nothing escapes: an exception becomes ncclInternalError and a log line.
#include <nccl.h>

#include <exception>

#include "common/status.hpp"
#include "shim/reentry_guard.hpp"
#include "shim/runtime.hpp"

#define FP8WIRE_EXPORT extern "C" __attribute__((visibility("default")))

namespace fp8wire::shim {
namespace {

template <auto Member, class... Args>
ncclResult_t call_real(Runtime& rt, const char* name, Args... args) {
  auto fn = rt.real.api.*Member;
  if (__builtin_expect(fn == nullptr, 0))
    return rt.real.found ? report_missing_function(name) : report_no_nccl(name);
  return fn(args...);
}

// Which calls reach the engine: collectives only when the shim is active (configuration valid and
// enabled); the lifecycle and group calls whenever the engine exists, so that every process takes
// part in each communicator's agreement whatever its configuration says.
enum class Route { when_active, when_engine };

// `engine_path` runs on the route's condition; `args` are the real function's arguments, used on
// every other path. `caller` is the export's return address, to tell NCCL re-entering its own API
// from fp8wire doing so by mistake.
template <auto Member, Route route = Route::when_active, class EnginePath, class... Args>
ncclResult_t intercept(const char* name, const void* caller, EnginePath&& engine_path, Args... args) noexcept {
  ReentryGuard guard;
  try {
    if (__builtin_expect(guard.reentered(), 0)) {
      Runtime* rt = detail::g_runtime.load(std::memory_order_acquire);
      if (!rt) return report_exception(name, "re-entered while fp8wire was being set up");
      report_reentry(name, caller);
      return call_real<Member>(*rt, name, args...);
    }
    Runtime& rt = runtime();
    if constexpr (route == Route::when_active) {
      if (__builtin_expect(!active(), 0)) return call_real<Member>(rt, name, args...);
    } else {
      if (__builtin_expect(rt.engine == nullptr, 0)) return call_real<Member>(rt, name, args...);
    }
    return engine_path(rt);
  } catch (const std::exception& e) {
    return report_exception(name, e.what());
  } catch (...) {
    return report_exception(name, "unknown exception");
  }
}

// Functions without an FP8 path: the real function, still behind the guard.
template <auto Member, class... Args>
ncclResult_t forward(const char* name, const void* caller, Args... args) noexcept {
  return intercept<Member>(
      name, caller, [&](Runtime& rt) { return call_real<Member>(rt, name, args...); }, args...);
}

// After a real init: the new communicator joins the engine's registry. `config` (may be null) is
// the application's ncclConfig_t, read only for its blocking flag. `parent` (split, shrink): a
// child of an ncclCommInitAll communicator has all its ranks in this process too.
template <auto Member, class... Args>
ncclResult_t create(const char* name, const void* caller, ncclComm_t* out, const ncclConfig_t* config,
                    ncclComm_t parent, Args... args) noexcept {
  return intercept<Member, Route::when_engine>(
      name, caller,
      [&](Runtime& rt) {
        const bool single_process = parent && rt.engine->comm_single_process(parent);
        const ncclResult_t result = call_real<Member>(rt, name, args...);
        if (out && nccl_ok(result))
          if (const ncclResult_t setup = comm_created(rt, *out, result, config, single_process); !nccl_ok(setup)) {
            *out = nullptr;  // aborted: as NCCL leaves it after a failed blocking creation
            return setup;
          }
        return result;
      },
      args...);
}

// Before the real destroy: the engine frees the communicator's scratch and state (a destroy waits
// for the communicator's work anyway; ncclCommAbort is handled apart, below). The engine's error (an
// FP8 call released from a wait on a gone peer) is returned when NCCL's destroy succeeds. A
// communicator still in use by a host call of fp8wire's set-up that was given up (a launch that
// waits for its peers, a split) is aborted by fp8wire once NCCL returns from it, not destroyed here.
template <auto Member>
ncclResult_t destroy(const char* name, const void* caller, ncclComm_t comm) noexcept {
  return intercept<Member, Route::when_engine>(
      name, caller,
      [&](Runtime& rt) {
        bool deferred = false;
        const ncclResult_t ours = comm_destroyed(rt, comm, &deferred);
        if (deferred) return ours;
        const ncclResult_t real = call_real<Member>(rt, name, comm);
        return nccl_ok(real) ? ours : real;
      },
      comm);
}

}  // namespace
}  // namespace fp8wire::shim

using fp8wire::NcclApi;
using fp8wire::shim::Runtime;
namespace shim = fp8wire::shim;

#define FP8WIRE_CALLER __builtin_return_address(0)

// --- collectives with an FP8 path -----------------------------------------------------------------

FP8WIRE_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                          ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                          cudaStream_t stream) {
  return shim::intercept<&NcclApi::AllReduce>(
      "ncclAllReduce", FP8WIRE_CALLER,
      [&](Runtime& rt) {
        return rt.engine->all_reduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
      },
      sendbuff, recvbuff, count, datatype, op, comm, stream);
}

FP8WIRE_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                              ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                              cudaStream_t stream) {
  return shim::intercept<&NcclApi::ReduceScatter>(
      "ncclReduceScatter", FP8WIRE_CALLER,
      [&](Runtime& rt) {
        return rt.engine->reduce_scatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
      },
      sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

FP8WIRE_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return shim::intercept<&NcclApi::AllGather>(
      "ncclAllGather", FP8WIRE_CALLER,
      [&](Runtime& rt) {
        return rt.engine->all_gather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
      },
      sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

// NCCL has it from 2.28: with an older one every call returns ncclSystemError naming it, also where
// FP8 could carry it (its own send/recv round needs no ncclAlltoAll), so that a job sees the same
// answer whatever its sizes and configuration.
FP8WIRE_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         ncclComm_t comm, cudaStream_t stream) {
  return shim::intercept<&NcclApi::AlltoAll>(
      "ncclAlltoAll", FP8WIRE_CALLER,
      [&](Runtime& rt) {
        if (!rt.real.api.AlltoAll) return shim::report_missing_function("ncclAlltoAll");
        return rt.engine->all_to_all(sendbuff, recvbuff, count, datatype, comm, stream);
      },
      sendbuff, recvbuff, count, datatype, comm, stream);
}

// --- point-to-point: FP8 where collectives.send_recv says so (sched/engine/point_to_point.cpp) ------

FP8WIRE_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                     ncclComm_t comm, cudaStream_t stream) {
  return shim::intercept<&NcclApi::Send>(
      "ncclSend", FP8WIRE_CALLER,
      [&](Runtime& rt) { return rt.engine->send(sendbuff, count, datatype, peer, comm, stream); },
      sendbuff, count, datatype, peer, comm, stream);
}

FP8WIRE_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                     ncclComm_t comm, cudaStream_t stream) {
  return shim::intercept<&NcclApi::Recv>(
      "ncclRecv", FP8WIRE_CALLER,
      [&](Runtime& rt) { return rt.engine->recv(recvbuff, count, datatype, peer, comm, stream); },
      recvbuff, count, datatype, peer, comm, stream);
}

// --- groups ---------------------------------------------------------------------------------------

FP8WIRE_EXPORT ncclResult_t ncclGroupStart() {
  return shim::intercept<&NcclApi::GroupStart, shim::Route::when_engine>(
      "ncclGroupStart", FP8WIRE_CALLER, [](Runtime& rt) { return rt.engine->group_start(); });
}

FP8WIRE_EXPORT ncclResult_t ncclGroupEnd() {
  return shim::intercept<&NcclApi::GroupEnd, shim::Route::when_engine>(
      "ncclGroupEnd", FP8WIRE_CALLER, [](Runtime& rt) { return rt.engine->group_end(); });
}

FP8WIRE_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  return shim::intercept<&NcclApi::GroupSimulateEnd, shim::Route::when_engine>(
      "ncclGroupSimulateEnd", FP8WIRE_CALLER, [&](Runtime& rt) { return rt.engine->group_simulate_end(simInfo); },
      simInfo);
}

// --- no FP8 path: straight to NCCL ----------------------------------------------------------------

FP8WIRE_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                          ncclDataType_t datatype, int root, ncclComm_t comm,
                                          cudaStream_t stream) {
  return shim::forward<&NcclApi::Broadcast>("ncclBroadcast", FP8WIRE_CALLER, sendbuff, recvbuff, count,
                                            datatype, root, comm, stream);
}

FP8WIRE_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                      ncclComm_t comm, cudaStream_t stream) {
  return shim::forward<&NcclApi::Bcast>("ncclBcast", FP8WIRE_CALLER, buff, count, datatype, root, comm, stream);
}

FP8WIRE_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  return shim::forward<&NcclApi::Reduce>("ncclReduce", FP8WIRE_CALLER, sendbuff, recvbuff, count, datatype,
                                         op, root, comm, stream);
}

FP8WIRE_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return shim::forward<&NcclApi::CommFinalize>("ncclCommFinalize", FP8WIRE_CALLER, comm);
}

// --- communicator lifecycle -----------------------------------------------------------------------

FP8WIRE_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return shim::create<&NcclApi::CommInitRank>("ncclCommInitRank", FP8WIRE_CALLER, comm, nullptr, nullptr, comm, nranks, commId, rank);
}

FP8WIRE_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                   ncclConfig_t* config) {
  return shim::create<&NcclApi::CommInitRankConfig>("ncclCommInitRankConfig", FP8WIRE_CALLER, comm, config, nullptr, comm, nranks,
                                                    commId, rank, config);
}

FP8WIRE_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                     ncclUniqueId* commIds, ncclConfig_t* config) {
  return shim::create<&NcclApi::CommInitRankScalable>("ncclCommInitRankScalable", FP8WIRE_CALLER, newcomm,
                                                      config, nullptr, newcomm, nranks, myrank, nId, commIds, config);
}

FP8WIRE_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                          ncclConfig_t* config) {
  return shim::create<&NcclApi::CommSplit>("ncclCommSplit", FP8WIRE_CALLER, newcomm, config, comm, comm, color, key, newcomm,
                                           config);
}

FP8WIRE_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                           ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  return shim::create<&NcclApi::CommShrink>("ncclCommShrink", FP8WIRE_CALLER, newcomm, config, comm, comm, excludeRanksList,
                                            excludeRanksCount, newcomm, config, shrinkFlags);
}

// One process, several devices: every communicator it returns joins the registry, marked as driven
// by one thread (its calls must all sit in one group; fp8wire's FP8 stages and agreement exchange
// run one communicator at a time and would wait forever on the ranks not yet issued).
FP8WIRE_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return shim::intercept<&NcclApi::CommInitAll, shim::Route::when_engine>(
      "ncclCommInitAll", FP8WIRE_CALLER,
      [&](Runtime& rt) {
        const ncclResult_t result = shim::call_real<&NcclApi::CommInitAll>(rt, "ncclCommInitAll", comms, ndev, devlist);
        if (comms && fp8wire::nccl_ok(result))
          for (int i = 0; i < ndev; ++i) shim::comm_created(rt, comms[i], result, nullptr, /*single_process=*/true);
        return result;
      },
      comms, ndev, devlist);
}

FP8WIRE_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return shim::destroy<&NcclApi::CommDestroy>("ncclCommDestroy", FP8WIRE_CALLER, comm);
}

// The real answer, but where NCCL sees nothing wrong, what fp8wire knows (Engine::comm_async_error):
// a direct transport's operation waiting on a peer that has gone (NCCL's own transports may be idle),
// an error on the hierarchical path's sub-communicators (which the application never holds), an FP8
// call or a set-up that failed. PyTorch's watchdog, which polls this, then aborts the communicator
// instead of waiting for its timeout. A peer that has gone while nothing waits on it is no error
// (ranks end at different times).
FP8WIRE_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return shim::intercept<&NcclApi::CommGetAsyncError, shim::Route::when_engine>(
      "ncclCommGetAsyncError", FP8WIRE_CALLER,
      [&](Runtime& rt) {
        const ncclResult_t result =
            shim::call_real<&NcclApi::CommGetAsyncError>(rt, "ncclCommGetAsyncError", comm, asyncError);
        if (result == ncclSuccess && asyncError && *asyncError == ncclSuccess)
          *asyncError = rt.engine->comm_async_error(comm);
        return result;
      },
      comm, asyncError);
}

// The real abort runs before fp8wire frees anything (Engine::comm_abort): it is what stops a
// collective that will never finish, which freeing the scratch first would wait for.
FP8WIRE_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return shim::intercept<&NcclApi::CommAbort, shim::Route::when_engine>(
      "ncclCommAbort", FP8WIRE_CALLER, [&](Runtime& rt) { return rt.engine->comm_abort(comm); }, comm);
}
