// The public C API of libfp8wire.so (shim/fp8wire.h). Safe at any time, never fails the job.
#include "shim/fp8wire.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/cuda_devices.hpp"
#include "common/log.hpp"
#include "sched/comm/telemetry_monitor.hpp"
#include "sched/engine/accounting.hpp"
#include "shim/real_nccl.hpp"
#include "shim/runtime.hpp"

#define FP8WIRE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

static_assert(FP8WIRE_MAX_PATHS == fp8wire::kMaxPaths);
static_assert(FP8WIRE_MAX_TRANSPORTS == fp8wire::kMaxTransports);
static_assert(FP8WIRE_MAX_CALL_KINDS == fp8wire::kMaxCallKinds);
static_assert(FP8WIRE_MAX_COLLECTIVES == fp8wire::sched::kErrorCollectives);
static_assert(sizeof(fp8wire_error_stats) == sizeof(fp8wire::quant::ErrorStats));
static_assert(sizeof(fp8wire_error_totals) == sizeof(fp8wire::sched::ErrorTotals));

void step_mark(int64_t step, int begin) {
  try {
    const auto& companion = fp8wire::shim::profiler_companion();
    if (companion.step) {
      companion.step(step, begin);
      return;
    }
    // The trainer marks steps whether or not profiling is on, so this is not worth a warning.
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true, std::memory_order_relaxed))
      FP8WIRE_INFO("fp8wire_step_begin/end: profiler not running (profiler.enable = false); step marks ignored");
  } catch (...) {
    FP8WIRE_ERROR("fp8wire_step_{}: internal error; ignored", begin ? "begin" : "end");
  }
}

// Entry i of a list of names whose to_string is the one list and answers "unknown" past its last
// entry: "" there, null outside the C API's `slots`.
template <class E>
const char* name_in(int i, int slots) {
  if (i < 0 || i >= slots) return nullptr;
  const char* name = fp8wire::to_string(static_cast<E>(i));
  return std::strcmp(name, "unknown") == 0 ? "" : name;
}

// *out zeroed, then fill(*out); an internal error leaves the zeros and one log line naming
// `function`. A null `out` is ignored.
template <class Out, class Fill>
void fill_zeroed(const char* function, Out* out, Fill fill) {
  if (!out) return;
  std::memset(out, 0, sizeof(*out));
  try {
    fill(*out);
  } catch (...) {
    FP8WIRE_ERROR("{}: internal error; returning zeros", function);
  }
}

// The per-slot calls, caller bytes and wire bytes both call totals carry (by path, by transport).
template <class Out, class Counts>
void copy_counts(Out& o, const Counts& calls, const Counts& app_bytes, const Counts& wire_bytes) {
  static_assert(sizeof(o.calls) == sizeof(calls) && sizeof(o.app_bytes) == sizeof(app_bytes) &&
                sizeof(o.wire_bytes) == sizeof(wire_bytes));
  std::memcpy(o.calls, calls, sizeof(o.calls));
  std::memcpy(o.app_bytes, app_bytes, sizeof(o.app_bytes));
  std::memcpy(o.wire_bytes, wire_bytes, sizeof(o.wire_bytes));
}

}  // namespace

FP8WIRE_EXPORT int fp8wire_version(void) {
  return 10000 * FP8WIRE_VERSION_MAJOR + 100 * FP8WIRE_VERSION_MINOR + FP8WIRE_VERSION_PATCH;
}

FP8WIRE_EXPORT int fp8wire_active(void) {
  try {
    using namespace fp8wire::shim;
    // Set up already (the job has made an NCCL call): the engine's own answer, and a GPU the driver
    // sees; asking the driver initialises it, harmless in a process already using NCCL.
    if (detail::g_runtime.load(std::memory_order_acquire)) {
      static const bool device_visible = fp8wire::visible_cuda_devices() > 0;
      return active() && device_visible ? 1 : 0;
    }
    // Not yet: the configuration, NCCL in the process (or nccl.library) and a CUDA driver on the
    // machine, all without setting up or initialising CUDA (this may run before the job forks).
    const fp8wire::ConfigResult& config = loaded_config();
    return config.ok() && config.config.enable && real_nccl_present(config.config.nccl_library) &&
                   fp8wire::cuda_driver_present()
               ? 1
               : 0;
  } catch (...) {
    return 0;
  }
}

FP8WIRE_EXPORT const char* fp8wire_path_name(int i) { return name_in<fp8wire::Path>(i, FP8WIRE_MAX_PATHS); }

FP8WIRE_EXPORT int fp8wire_path_is_fp8(int i) {
  if (i < 0 || i >= fp8wire::kPathCount) return 0;
  return fp8wire::is_fp8(static_cast<fp8wire::Path>(i)) ? 1 : 0;
}

FP8WIRE_EXPORT void fp8wire_step_begin(int64_t step) { step_mark(step, 1); }
FP8WIRE_EXPORT void fp8wire_step_end(int64_t step) { step_mark(step, 0); }

FP8WIRE_EXPORT void fp8wire_profiler_flush(void) {
  try {
    const auto& companion = fp8wire::shim::profiler_companion();
    if (companion.flush) companion.flush();
    else FP8WIRE_WARN_ONCE("fp8wire_profiler_flush: profiler not running (profiler.enable = false)");
  } catch (...) {
    FP8WIRE_ERROR("fp8wire_profiler_flush: internal error; ignored");
  }
}

FP8WIRE_EXPORT void fp8wire_get_totals(fp8wire_totals* out) {
  fill_zeroed("fp8wire_get_totals", out, [](fp8wire_totals& o) {
    const fp8wire::AccountingTotals totals = fp8wire::Accounting::instance().totals();
    copy_counts(o, totals.calls, totals.app_bytes, totals.wire_bytes);
    o.dropped_records = totals.dropped_records;
  });
}

FP8WIRE_EXPORT const char* fp8wire_transport_name(int i) {
  return name_in<fp8wire::Carrier>(i, FP8WIRE_MAX_TRANSPORTS);
}

FP8WIRE_EXPORT void fp8wire_get_transport_totals(fp8wire_transport_totals* out) {
  fill_zeroed("fp8wire_get_transport_totals", out, [](fp8wire_transport_totals& o) {
    const fp8wire::AccountingTotals totals = fp8wire::Accounting::instance().totals();
    copy_counts(o, totals.transport_calls, totals.transport_app_bytes, totals.transport_wire_bytes);
  });
}

FP8WIRE_EXPORT const char* fp8wire_call_kind_name(int i) {
  return name_in<fp8wire::CallKind>(i, FP8WIRE_MAX_CALL_KINDS);
}

FP8WIRE_EXPORT void fp8wire_get_kind_totals(fp8wire_kind_totals* out) {
  if (!out) return;
  try {
    // The caller's layout may be older (smaller) or newer (larger) than this one: fill the common part.
    const size_t caller = static_cast<size_t>(out->size);
    fp8wire_kind_totals o{};
    o.size = sizeof(o);
    const fp8wire::AccountingTotals t = fp8wire::Accounting::instance().totals();
    static_assert(sizeof(o.calls) == sizeof(t.kind_calls) && sizeof(o.app_bytes) == sizeof(t.kind_app_bytes) &&
                  sizeof(o.wire_bytes) == sizeof(t.kind_wire_bytes) &&
                  sizeof(o.plain_wire_bytes) == sizeof(t.kind_plain_wire_bytes));
    std::memcpy(o.calls, t.kind_calls, sizeof(o.calls));
    std::memcpy(o.app_bytes, t.kind_app_bytes, sizeof(o.app_bytes));
    std::memcpy(o.wire_bytes, t.kind_wire_bytes, sizeof(o.wire_bytes));
    std::memcpy(o.plain_wire_bytes, t.kind_plain_wire_bytes, sizeof(o.plain_wire_bytes));
    if (caller < sizeof(o.size)) {
      FP8WIRE_WARN_ONCE("fp8wire_get_kind_totals: size {} is too small (set it to sizeof(fp8wire_kind_totals), {})",
                        caller, sizeof(o));
      return;
    }
    std::memcpy(out, &o, std::min(caller, sizeof(o)));
    out->size = sizeof(o);
  } catch (...) {
    FP8WIRE_ERROR("fp8wire_get_kind_totals: internal error; nothing written");
  }
}

FP8WIRE_EXPORT void fp8wire_get_error_totals(fp8wire_error_totals* out) {
  fill_zeroed("fp8wire_get_error_totals", out, [](fp8wire_error_totals& o) {
    const fp8wire::sched::ErrorTotals t = fp8wire::sched::error_totals();
    std::memcpy(o.measured_calls, t.measured_calls, sizeof(o.measured_calls));
    std::memcpy(o.input, t.input, sizeof(o.input));
    std::memcpy(o.requant, t.requant, sizeof(o.requant));
    std::memcpy(o.guard_trips, t.guard_trips, sizeof(o.guard_trips));
    std::memcpy(o.guard_full_calls, t.guard_full_calls, sizeof(o.guard_full_calls));
    std::memcpy(o.guard_resumed, t.guard_resumed, sizeof(o.guard_resumed));
    std::memcpy(o.audited_calls, t.audited_calls, sizeof(o.audited_calls));
    std::memcpy(o.audit_sq_error, t.audit_sq_error, sizeof(o.audit_sq_error));
    std::memcpy(o.audit_sq_exact, t.audit_sq_exact, sizeof(o.audit_sq_exact));
    std::memcpy(o.audit_nonfinite, t.audit_nonfinite, sizeof(o.audit_nonfinite));
  });
}

FP8WIRE_EXPORT const char* fp8wire_collective_name(int i) {
  if (i < 0 || i >= FP8WIRE_MAX_COLLECTIVES) return nullptr;
  return i < fp8wire::kCollectiveCount ? fp8wire::to_string(static_cast<fp8wire::Collective>(i)) : "";
}

FP8WIRE_EXPORT int fp8wire_call_error(uint64_t seq, double* input_rel_error, double* requant_rel_error) {
  try {
    fp8wire::sched::MeasuredCall c;
    if (!fp8wire::sched::measured_call(seq, &c)) return 0;
    if (input_rel_error) *input_rel_error = c.input_rel_error;
    if (requant_rel_error) *requant_rel_error = c.requant_rel_error;
    return 1;
  } catch (...) {
    FP8WIRE_ERROR("fp8wire_call_error: internal error; reporting the call as not measured");
    return 0;
  }
}

FP8WIRE_EXPORT void fp8wire_set_feedback_key(uint64_t key) { fp8wire::sched::Engine::set_feedback_key(key); }

FP8WIRE_EXPORT size_t fp8wire_debug_state(char* buf, size_t size) {
  try {
    fp8wire::shim::Runtime* rt = fp8wire::shim::detail::g_runtime.load(std::memory_order_acquire);
    const std::string text = rt && rt->engine ? rt->engine->debug_state() : std::string();
    if (buf && size > 0) {
      const size_t n = std::min(text.size(), size - 1);
      std::memcpy(buf, text.data(), n);
      buf[n] = 0;
    }
    return text.size();
  } catch (...) {
    if (buf && size > 0) buf[0] = 0;
    return 0;
  }
}
