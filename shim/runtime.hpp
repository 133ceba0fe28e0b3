// Process-wide state of libfp8wire.so: the configuration (read at load), the real-NCCL table and
// the scheduler engine (both set up at the first intercepted call, since NCCL may be loaded after
// us), the "active" flag the exports test, and the profiler companion.
#pragma once

#include <atomic>

#include "common/config.hpp"
#include "sched/engine/engine.hpp"
#include "shim/real_nccl.hpp"

namespace fp8wire::shim {

struct Runtime {
  ConfigResult config;            // effective configuration and the errors met reading it
  RealNccl real;                  // the table; real.found false: every export returns ncclSystemError
  Platform platform;              // CUDA runtime, codec kernels and host facts over `real`
  // Present whenever NCCL was found, also with a failed or disabled configuration: every process of
  // a job takes part in each communicator's agreement (a process that reports "not usable" makes the
  // whole communicator pass through instead of hanging its peers). Collectives reach it only when
  // `active()`.
  sched::Engine* engine = nullptr;
};

namespace detail {
extern std::atomic<Runtime*> g_runtime;  // published once, after set-up
extern std::atomic<bool> g_active;       // FP8 scheduling on: config valid, enabled, NCCL complete
Runtime& runtime_slow();
}  // namespace detail

// The configuration, read once when the library is loaded (never fails; errors are in it).
const ConfigResult& loaded_config();

// The runtime, set up on first use. One acquire load once it exists.
inline Runtime& runtime() {
  Runtime* rt = detail::g_runtime.load(std::memory_order_acquire);
  return __builtin_expect(rt != nullptr, 1) ? *rt : detail::runtime_slow();
}

// True when collectives go to the engine; false: straight to the real function, nothing else.
inline bool active() { return detail::g_active.load(std::memory_order_relaxed); }

// Communicator lifecycle as the exports report it (whenever the engine exists). A communicator that
// is non-blocking (its ncclConfig_t says blocking = 0, or its init returned ncclInProgress) is
// registered as pass-through: the agreement's blocking exchange would break its contract.
// `single_process`: a communicator of ncclCommInitAll, whose ranks one thread drives (passes through).
// An error when fp8wire's set-up of it failed (a peer killed or stopped during it, setup_timeout_s):
// the communicator has then been aborted, and the creation must return that error.
ncclResult_t comm_created(Runtime& rt, ncclComm_t comm, ncclResult_t init_result, const ncclConfig_t* config,
                          bool single_process = false);
// An error when closing it found an FP8 call waiting on a direct peer that has gone (its result is void).
// `deferred`: NCCL's destroy must not be called (sched::Engine::comm_destroyed).
ncclResult_t comm_destroyed(Runtime& rt, ncclComm_t comm, bool* deferred);

// Logging helpers for the exports' rare paths.
ncclResult_t report_no_nccl(const char* function);
ncclResult_t report_missing_function(const char* function);
ncclResult_t report_exception(const char* function, const char* what);
void report_reentry(const char* function, const void* caller);

// Profiler companion (libfp8wire_prof.so), resolved once; any of these may be null.
struct ProfilerCompanion {
  void (*step)(int64_t step, int begin) = nullptr;
  void (*flush)() = nullptr;
};
const ProfilerCompanion& profiler_companion();

}  // namespace fp8wire::shim
