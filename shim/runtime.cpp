#include "shim/runtime.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "common/commands.hpp"
#include "common/log.hpp"
#include "common/status.hpp"
#include "sched/engine/accounting.hpp"

namespace fp8wire::shim {

namespace detail {
std::atomic<Runtime*> g_runtime{nullptr};
std::atomic<bool> g_active{false};
}  // namespace detail

namespace {

LogLevel level_from_name(const std::string& name) {
  for (LogLevel l : {LogLevel::off, LogLevel::error, LogLevel::warn, LogLevel::info, LogLevel::debug, LogLevel::trace}) {
    std::string lower = log_level_name(l);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == name) return l;
  }
  return LogLevel::warn;  // unreachable: the config parser accepts only the names above
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// Read once, at load (so log.level and log.file apply from the first line), and never freed: the
// exports may still be called from atexit handlers and other libraries' destructors.
ConfigResult* read_configuration() {
  auto* result = new ConfigResult(load_config());
  const Config& c = result->config;
  log_set_level(level_from_name(c.log_level));
  if (!c.log_file.empty()) log_set_file(c.log_file);
  for (const auto& e : result->errors) FP8WIRE_ERROR("configuration: {}", e.message());
  if (!result->ok())
    FP8WIRE_ERROR("{} configuration error(s): fp8wire runs in pass-through, every NCCL call goes "
                  "straight to NCCL (check a file with {})",
                  result->errors.size(), tool_command("config", "--check FILE"));
  FP8WIRE_INFO("libfp8wire.so {} loaded; configuration from {}", FP8WIRE_VERSION_STRING,
               join(result->sources, "; "));
  FP8WIRE_DEBUG("effective configuration:\n{}", to_toml(c));
  return result;
}

__attribute__((constructor)) void read_configuration_at_load() {
  try {
    loaded_config();
  } catch (...) {
    // Nothing here may take the process down; the first call retries and then passes through.
  }
}

std::mutex g_setup_mutex;

Runtime* set_up() {
  auto* rt = new Runtime;  // never freed, like the configuration
  rt->config = loaded_config();
  rt->real = resolve_real_nccl(rt->config.config.nccl_library);
  if (!rt->real.found) {
    FP8WIRE_ERROR("no usable NCCL found ({}); every intercepted NCCL call returns ncclSystemError. "
                  "Set FP8WIRE_NCCL_LIBRARY=/path/to/libnccl.so.2 if NCCL is loaded in an unusual way",
                  rt->real.failure);
  } else {
    int version = 0;
    rt->real.api.GetVersion(&version);
    FP8WIRE_INFO("resolved real NCCL {} from {}", version, rt->real.origin);
  }
  const Config& c = rt->config.config;
  if (rt->real.found && rt->config.ok() && !c.enable)
    FP8WIRE_INFO("enable = false: every NCCL call passes through untouched");
  if (rt->real.found) {
    sched::LocalIdentity me;
    me.version = 10000 * FP8WIRE_VERSION_MAJOR + 100 * FP8WIRE_VERSION_MINOR + FP8WIRE_VERSION_PATCH;
    me.usable = rt->config.ok();
    if (!me.usable) {
      const ConfigError& e = rt->config.errors.front();
      me.problem = "configuration error: " + (e.key.empty() ? e.source : e.key);
    }
    try {
      rt->platform = gpu_platform(rt->real.api);
      rt->engine = new sched::Engine(c, rt->platform, me);  // never freed, like the runtime
    } catch (const std::exception& e) {
      FP8WIRE_ERROR("scheduler could not start ({}); running in pass-through", e.what());
    } catch (...) {
      FP8WIRE_ERROR("scheduler could not start; running in pass-through");
    }
  }
  // The profiler starts even with enable = false: measuring exposed communication of the plain
  // NCCL run is the baseline the FP8 run is judged against.
  profiler_companion();
  detail::g_active.store(rt->engine != nullptr && rt->config.ok() && c.enable, std::memory_order_relaxed);
  return rt;
}

}  // namespace

const ConfigResult& loaded_config() {
  static const ConfigResult* config = read_configuration();
  return *config;
}

namespace {

// --- communicator registry hand-off ---------------------------------------------------------------

std::atomic<bool> g_rank_set{false};

}  // namespace

namespace detail {
Runtime& runtime_slow() {
  std::lock_guard lock(g_setup_mutex);
  Runtime* rt = g_runtime.load(std::memory_order_acquire);
  if (!rt) {
    rt = set_up();
    g_runtime.store(rt, std::memory_order_release);
  }
  return *rt;
}
}  // namespace detail

ncclResult_t comm_created(Runtime& rt, ncclComm_t comm, ncclResult_t init_result, const ncclConfig_t* config,
                          bool single_process) {
  if (!comm) return ncclSuccess;  // e.g. ncclCommSplit with NCCL_SPLIT_NOCOLOR
  if (!nccl_ok(init_result)) return ncclSuccess;
  const bool nonblocking = init_result == ncclInProgress || (config && config->blocking == 0);
  // The log shows the rank of the first communicator that can tell it (a non-blocking one may not
  // know yet).
  if (!g_rank_set.load(std::memory_order_relaxed)) {
    int rank = -1;
    if (rt.real.api.CommUserRank(comm, &rank) == ncclSuccess && rank >= 0 && !g_rank_set.exchange(true))
      log_set_rank(rank);
  }
  try {
    const ncclResult_t setup = rt.engine->comm_created(comm, sched::CommCreation{nonblocking, single_process});
    if (nccl_ok(setup)) return ncclSuccess;
    // Its peers may have concluded otherwise: the communicator must not be used. The abort also
    // stops what fp8wire's exchange left in flight.
    rt.engine->comm_abort(comm);
    return setup;
  } catch (const std::exception& e) {
    FP8WIRE_ERROR("engine could not register communicator {} ({}); its calls pass through",
                  static_cast<const void*>(comm), e.what());
  } catch (...) {
    FP8WIRE_ERROR("engine could not register communicator {}; its calls pass through", static_cast<const void*>(comm));
  }
  return ncclSuccess;
}

ncclResult_t comm_destroyed(Runtime& rt, ncclComm_t comm, bool* deferred) {
  *deferred = false;
  try {
    return rt.engine->comm_destroyed(comm, deferred);
  } catch (...) {
    FP8WIRE_ERROR("engine failed to release communicator {}", static_cast<const void*>(comm));
  }
  return ncclInternalError;
}

// --- rare paths -----------------------------------------------------------------------------------

ncclResult_t report_no_nccl(const char* function) {
  FP8WIRE_WARN_ONCE("{}: no real NCCL was found, returning ncclSystemError (the reason was logged at "
                    "set-up; FP8WIRE_NCCL_LIBRARY names one explicitly)", function);
  FP8WIRE_DEBUG("{}: no real NCCL, ncclSystemError", function);
  return ncclSystemError;
}

ncclResult_t report_missing_function(const char* function) {
  FP8WIRE_WARN_ONCE("{}: the real NCCL ({}) does not provide this function; returning ncclSystemError",
                    function, runtime().real.origin);
  return ncclSystemError;
}

ncclResult_t report_exception(const char* function, const char* what) {
  FP8WIRE_ERROR("{}: internal error ({}); returning ncclInternalError", function, what);
  return ncclInternalError;
}

void report_reentry(const char* function, const void* caller) {
  if (is_own_address(caller)) {
    FP8WIRE_WARN_ONCE("{} was called by fp8wire itself through its exported symbol (a bug: internal "
                      "calls must use the NcclApi table); forwarded straight to the real function", function);
  } else {
    Dl_info info{};
    const char* from = dladdr(caller, &info) && info.dli_fname ? info.dli_fname : "?";
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true, std::memory_order_relaxed))
      FP8WIRE_INFO("{} re-entered from {} during an intercepted call on the same thread (NCCL calling "
                   "its own API); forwarded straight to the real function (logged once)", function, from);
  }
}

// --- profiler companion ---------------------------------------------------------------------------

namespace {

std::string own_directory() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<const void*>(&own_directory), &info) || !info.dli_fname) return ".";
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

ProfilerCompanion start_profiler_companion() {
  ProfilerCompanion companion;
  const ConfigResult& cfg = loaded_config();
  constexpr const char* kName = "libfp8wire_prof.so";
  void* handle = dlopen(kName, RTLD_LAZY | RTLD_NOLOAD);
  std::string where = handle ? "already loaded" : "";
  if (!handle && cfg.ok() && cfg.config.profiler_enable) {
    // Next to libfp8wire.so (installed layout), the build tree's profiler/ folder, then the
    // loader's search path.
    const std::string dir = own_directory();
    std::string tried;
    for (const std::string& candidate : {dir + "/" + kName, dir + "/../profiler/" + kName, std::string(kName)}) {
      handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle) {
        where = candidate;
        break;
      }
      const char* why = dlerror();
      tried += fmt::format("{}{} ({})", tried.empty() ? "" : ", ", candidate, why ? why : "?");
    }
    if (!handle) FP8WIRE_WARN("profiler.enable is set but {} could not be loaded: {}", kName, tried);
  }
  if (!handle) return companion;
  if (!cfg.ok()) {
    FP8WIRE_WARN("{} is loaded but the configuration has errors; the profiler is not started", kName);
    return companion;
  }
  using StartFn = const CallHooks* (*)(const Config*);
  auto start = reinterpret_cast<StartFn>(dlsym(handle, "fp8wire_prof_start"));
  companion.step = reinterpret_cast<void (*)(int64_t, int)>(dlsym(handle, "fp8wire_prof_step"));
  companion.flush = reinterpret_cast<void (*)()>(dlsym(handle, "fp8wire_prof_flush"));
  if (!start) FP8WIRE_WARN("{} has no fp8wire_prof_start: no per-call profiler hooks", kName);
  if (!companion.step) FP8WIRE_WARN("{} has no fp8wire_prof_step: fp8wire_step_begin/end are ignored", kName);
  if (!companion.flush) FP8WIRE_WARN("{} has no fp8wire_prof_flush: fp8wire_profiler_flush is ignored", kName);
  if (start) {
    if (const CallHooks* hooks = start(&cfg.config)) set_call_hooks(hooks);
  }
  FP8WIRE_INFO("profiler companion {} started ({})", kName, where);
  return companion;
}

}  // namespace

const ProfilerCompanion& profiler_companion() {
  static const ProfilerCompanion companion = [] {
    try {
      return start_profiler_companion();
    } catch (...) {
      FP8WIRE_ERROR("profiler companion failed to start; profiling is off");
      return ProfilerCompanion{};
    }
  }();
  return companion;
}

}  // namespace fp8wire::shim
