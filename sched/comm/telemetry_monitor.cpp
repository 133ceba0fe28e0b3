#include "sched/comm/telemetry_monitor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "common/status.hpp"
#include "quant/fp8_math.hpp"

namespace fp8wire::sched {

namespace {

// The process-wide totals, and every live monitor (a totals query folds their completed records).
// Lock order: monitors_mutex, then a monitor's own mutex, then totals_mutex.
struct Store {
  std::mutex monitors_mutex;
  std::vector<TelemetryMonitor*> monitors;
  std::mutex totals_mutex;
  ErrorTotals totals;
  // The latest measured calls by sequence number (totals_mutex), for the profiler's per-call column.
  std::array<MeasuredCall, 1024> recent{};
  size_t next_recent = 0;
};
Store& store() {
  static Store* s = new Store();  // never destroyed: monitors may outlive static destruction
  return *s;
}

int collective_index(Collective c) {
  const int i = static_cast<int>(c);
  return i < kErrorCollectives ? i : kErrorCollectives - 1;
}

std::string reasons(uint32_t vote) {
  std::string out;
  auto add = [&](uint32_t bit, const char* name) {
    if (vote & bit) out += (out.empty() ? "" : ", ") + std::string(name);
  };
  add(quant::kGuardRelError, "relative error");
  add(quant::kGuardSaturated, "saturation");
  add(quant::kGuardFlushed, "flushed to zero");
  add(quant::kGuardNonfinite, "non-finite input");
  return out.empty() ? "none" : out;
}

double rel_error(const quant::ErrorStats& s) { return s.sq_input > 0 ? std::sqrt(s.sq_error / s.sq_input) : 0.0; }

std::string figures(const quant::ErrorStats& s) {
  return fmt::format("relative error {:.3e}, flushed {}, saturated {}, non-finite {} of {} elements", rel_error(s),
                     s.flushed, s.saturated, s.nonfinite, s.elements);
}

std::string scope_name(uint64_t scope) {
  return scope ? fmt::format("tensor (feedback key {})", scope) : std::string("communicator");
}

}  // namespace

ErrorTotals error_totals() {
  Store& st = store();
  {
    std::lock_guard lock(st.monitors_mutex);
    for (TelemetryMonitor* m : st.monitors) m->fold_completed();
  }
  std::lock_guard lock(st.totals_mutex);
  return st.totals;
}

bool measured_call(uint64_t seq, MeasuredCall* out) {
  if (seq == 0) return false;
  Store& st = store();
  {
    // Never behind a monitor that waits on the GPU (begin's wait for a guarded call, a slot's, an
    // audit's): the profiler asks while it holds its own lock, at exit too, when a peer may be gone.
    std::lock_guard lock(st.monitors_mutex);
    for (TelemetryMonitor* m : st.monitors) m->fold_completed_if_free();
  }
  std::lock_guard lock(st.totals_mutex);
  for (const MeasuredCall& c : st.recent)
    if (c.seq == seq) {
      *out = c;
      return true;
    }
  return false;
}

void reset_error_totals() {
  error_totals();
  Store& st = store();
  std::lock_guard lock(st.totals_mutex);
  st.totals = ErrorTotals{};
}

TelemetryMonitor::TelemetryMonitor(const Platform& platform, uint64_t comm_id, int rank)
    : platform_(&platform), comm_id_(comm_id), rank_(rank) {
  Store& st = store();
  std::lock_guard lock(st.monitors_mutex);
  st.monitors.push_back(this);
}

TelemetryMonitor::~TelemetryMonitor() {
  {
    Store& st = store();
    std::lock_guard lock(st.monitors_mutex);
    st.monitors.erase(std::remove(st.monitors.begin(), st.monitors.end(), this), st.monitors.end());
  }
  std::lock_guard lock(mutex_);
  fold_completed_locked();
  const CudaApi& cuda = platform_->cuda;
  if (audit_.done) cuda.EventDestroy(audit_.done);
  if (audit_.in) cuda.Free(audit_.in);
  if (audit_.out) cuda.Free(audit_.out);
  if (audit_.host) cuda.FreeHost(audit_.host);
  if (!allocated_) return;
  for (Slot& s : slots_)
    if (s.done) cuda.EventDestroy(s.done);
  cuda.Free(device_);
  cuda.FreeHost(host_);
}

bool TelemetryMonitor::allocate() {
  if (allocated_) return true;
  if (failed_) return false;
  const CudaApi& cuda = platform_->cuda;
  void* d = nullptr;
  void* h = nullptr;
  const size_t bytes = sizeof(quant::CallTelemetry) * kSlots;
  bool ok = cuda.Malloc(&d, bytes) == cudaSuccess;
  ok = ok && cuda.HostAlloc(&h, bytes, cudaHostAllocDefault) == cudaSuccess;
  int events = 0;
  for (; ok && events < kSlots; ++events)
    ok = cuda.EventCreateWithFlags(&slots_[static_cast<size_t>(events)].done, cudaEventDisableTiming) == cudaSuccess;
  if (!ok) {
    FP8WIRE_ERROR("comm {}: telemetry: cannot allocate its {} records (device, pinned host memory, events)", comm_id_,
                  kSlots);
    for (int i = 0; i < events; ++i) {
      cuda.EventDestroy(slots_[static_cast<size_t>(i)].done);
      slots_[static_cast<size_t>(i)].done = nullptr;
    }
    if (d) cuda.Free(d);
    if (h) cuda.FreeHost(h);
    failed_ = true;
    return false;
  }
  device_ = static_cast<quant::CallTelemetry*>(d);
  host_ = static_cast<quant::CallTelemetry*>(h);
  allocated_ = true;
  return true;
}

ncclResult_t TelemetryMonitor::wait(int slot) {
  const CudaApi& cuda = platform_->cuda;
  const cudaError_t err = cuda.EventSynchronize(slots_[static_cast<size_t>(slot)].done);
  if (err == cudaSuccess) return ncclSuccess;
  FP8WIRE_ERROR("comm {}: telemetry: waiting for the record of call {} failed: {}", comm_id_,
                slots_[static_cast<size_t>(slot)].seq, cuda.GetErrorString(err));
  return ncclUnhandledCudaError;
}

int TelemetryMonitor::take_slot() {
  for (int i = 0; i < kSlots; ++i)
    if (!slots_[static_cast<size_t>(i)].busy) return i;
  // Every record is in flight: the host is kSlots measured calls ahead of the GPU. Wait for the oldest.
  int oldest = -1;
  for (int i = 0; i < kSlots; ++i) {
    const Slot& s = slots_[static_cast<size_t>(i)];
    if (s.in_flight && (oldest < 0 || s.order < slots_[static_cast<size_t>(oldest)].order)) oldest = i;
  }
  if (oldest < 0 || wait(oldest) != ncclSuccess) return -1;
  fold(oldest);
  return oldest;
}

void TelemetryMonitor::fold(int slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  const quant::CallTelemetry& r = host_[slot];
  const int c = collective_index(s.collective);
  const int p = static_cast<int>(s.path) < kMaxPaths ? static_cast<int>(s.path) : 0;
  {
    Store& st = store();
    std::lock_guard lock(st.totals_mutex);
    ++st.totals.measured_calls[c][p];
    st.totals.input[c][p].add(r.input);
    st.totals.requant[c][p].add(r.requant);
    st.recent[st.next_recent++ % st.recent.size()] = {s.seq, rel_error(r.input), rel_error(r.requant)};
  }
  FP8WIRE_DEBUG("comm {} rank {}: seq {} {} {}: input {}; requantized {}{}", comm_id_, rank_, s.seq,
                to_string(s.collective), to_string(s.path), figures(r.input),
                r.requant.elements ? figures(r.requant) : std::string("none"),
                s.guard ? fmt::format("; guard: this rank's vote {}, decision {}", reasons(r.vote),
                                      r.decision ? "full precision" : "FP8")
                        : std::string());
  if (s.guard) {
    ScopeState& scope = scopes_[s.scope];
    if (scope.pending == slot) {
      scope.pending = -1;
      scope.has_decision = true;
      // With the rank's own vote: every guarded path's decoded flags hold it already (its chunks
      // come back to it, or through their shards' owners) but the all-to-all's, whose own chunk
      // never leaves the rank.
      scope.decision = r.decision != 0 || r.vote != 0;
      if (scope.decision)
        FP8WIRE_WARN("comm {} rank {}: seq {} {} {}: the guard votes crossed a bound (this rank: {}; {}; "
                     "requantized: {}); the {} goes to full precision at its call {} (guard.decide_after; later if that call is captured)",
                     comm_id_, rank_, s.seq, to_string(s.collective), to_string(s.path), reasons(r.vote),
                     figures(r.input), r.requant.elements ? figures(r.requant) : std::string("none"),
                     scope_name(s.scope), scope.decide_at);
    }
  }
  const cudaEvent_t done = s.done;
  s = Slot{};
  s.done = done;
}

void TelemetryMonitor::fold_completed_locked() {
  // Nothing in flight (most calls, as only 1 in telemetry.sample_every is measured): no CUDA call.
  bool any = audit_.in_flight;
  for (int i = 0; allocated_ && !any && i < kSlots; ++i) any = slots_[static_cast<size_t>(i)].in_flight;
  if (!any) return;
  const CudaApi& cuda = platform_->cuda;
  // An event query is not permitted while any thread captures a graph in global mode: in relaxed
  // mode this thread's queries leave such a capture intact. (A call being captured folds nothing.)
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  const bool exchanged =
      cuda.ThreadExchangeStreamCaptureMode && cuda.ThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  struct Restore {  // the thread's own mode back, on every way out
    const CudaApi& cuda;
    bool exchanged;
    cudaStreamCaptureMode& mode;
    ~Restore() {
      if (exchanged) cuda.ThreadExchangeStreamCaptureMode(&mode);
    }
  } restore{cuda, exchanged, mode};
  if (audit_.in_flight && cuda.EventQuery(audit_.done) == cudaSuccess) fold_audit();
  for (int i = 0; allocated_ && i < kSlots; ++i) {
    Slot& s = slots_[static_cast<size_t>(i)];
    if (s.in_flight && cuda.EventQuery(s.done) == cudaSuccess) fold(i);
  }
}

void TelemetryMonitor::fold_completed() {
  std::lock_guard lock(mutex_);
  fold_completed_locked();
}

void TelemetryMonitor::fold_completed_if_free() {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (lock.owns_lock()) fold_completed_locked();
}

ncclResult_t TelemetryMonitor::settle(uint64_t scope_key, bool capturing, ScopeState* out) {
  std::lock_guard lock(mutex_);
  if (!capturing) fold_completed_locked();  // the query of an event is not permitted under capture
  ScopeState& scope = scopes_[scope_key];
  // Never under capture: another rank may not have the record yet, and capturing it cannot wait.
  // Both ranks then read it at the scope's first call outside capture.
  if (!capturing && scope.calls >= scope.decide_at && scope.pending >= 0) {
    const int slot = scope.pending;
    if (const ncclResult_t r = wait(slot); r != ncclSuccess) return r;
    fold(slot);
  }
  *out = scope;
  return ncclSuccess;
}

uint64_t TelemetryMonitor::audit_calls() {
  std::lock_guard lock(mutex_);
  return audit_.calls;
}

ncclResult_t TelemetryMonitor::begin(const Watch& w, Collective collective, Path path, uint64_t seq, Call* call) {
  std::lock_guard lock(mutex_);
  *call = Call{};
  call->scope = w.scope;
  // What the recipe changed. A fold on another thread since settle() may have read a decision that is
  // not due yet: it stays.
  if (w.scoped) {
    ScopeState& scope = scopes_[w.scope];
    scope.calls = w.scope_after.calls;
    scope.full_until = w.scope_after.full_until;
    scope.resume_at = w.scope_after.resume_at;
    if (w.decision_read) scope.has_decision = false;
    audit_.calls = w.audit_calls_after;
  }
  const int c = collective_index(collective);
  Store& st = store();
  if (w.tripped) {
    std::lock_guard tl(st.totals_mutex);
    ++st.totals.guard_trips[c];
  }
  call->decide_at = w.decide_at;
  if (w.full_precision) {
    std::lock_guard tl(st.totals_mutex);
    ++st.totals.guard_full_calls[c];
    return ncclSuccess;
  }
  if (w.resumed) {
    FP8WIRE_INFO("comm {} rank {}: seq {}: the {} goes back to FP8 after {} calls in full precision (guard.retry_after)",
                 comm_id_, rank_, seq, scope_name(w.scope), w.guard.retry_after);
    std::lock_guard tl(st.totals_mutex);
    ++st.totals.guard_resumed[c];
  }
  if (!w.measured) return ncclSuccess;
  // No record: an error like any resource the call cannot get (with the guard, the other ranks would
  // read flags this rank never wrote).
  if (!allocate()) return ncclSystemError;
  const int slot = take_slot();
  if (slot < 0) return ncclUnhandledCudaError;
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.busy = true;
  s.seq = seq;
  s.scope = w.scope;
  s.collective = collective;
  s.path = path;
  s.guard = w.guarded;
  call->slot = slot;
  call->options.record = device_ + slot;
  call->options.guard = w.guarded;
  call->options.bounds = w.guard.bounds;
  return ncclSuccess;
}

cudaError_t TelemetryMonitor::read_back(int slot, cudaStream_t stream) const {
  const CudaApi& cuda = platform_->cuda;
  cudaError_t err = cuda.MemcpyAsync(host_ + slot, device_ + slot, sizeof(quant::CallTelemetry), cudaMemcpyDeviceToHost,
                                     stream);
  if (err == cudaSuccess) err = cuda.EventRecord(slots_[static_cast<size_t>(slot)].done, stream);
  return err;
}

void TelemetryMonitor::end(const Call& call, bool recorded) {
  if (call.slot < 0) return;
  std::lock_guard lock(mutex_);
  Slot& s = slots_[static_cast<size_t>(call.slot)];
  if (!recorded) {
    const cudaEvent_t done = s.done;
    s = Slot{};
    s.done = done;
    return;
  }
  s.in_flight = true;
  s.order = ++order_;
  if (s.guard) {
    ScopeState& scope = scopes_[call.scope];
    scope.pending = call.slot;
    scope.decide_at = call.decide_at;
  }
}

namespace {

float element(const char* base, DataType t, size_t i) {
  uint16_t h;
  switch (t) {
    case DataType::bf16: std::memcpy(&h, base + 2 * i, 2); return quant::math::bf16_to_f32(h);
    case DataType::f16: std::memcpy(&h, base + 2 * i, 2); return quant::math::f16_to_f32(h);
    default: {
      float f;
      std::memcpy(&f, base + 4 * i, 4);
      return f;
    }
  }
}

}  // namespace

ncclResult_t TelemetryMonitor::audit_buffers(size_t send_bytes, size_t recv_bytes, void** in, void** out) {
  std::lock_guard lock(mutex_);
  const CudaApi& cuda = platform_->cuda;
  // One audit at a time: the buffers of the previous one may still be read.
  if (audit_.in_flight) {
    if (const cudaError_t e = cuda.EventSynchronize(audit_.done); e != cudaSuccess) {
      FP8WIRE_ERROR("comm {}: audit: waiting for the previous audit failed: {}", comm_id_, cuda.GetErrorString(e));
      return ncclUnhandledCudaError;
    }
    fold_audit();
  }
  auto grow = [&](void** p, size_t* have, size_t need, bool host) {
    if (*have >= need && *p) return true;
    if (*p) host ? cuda.FreeHost(*p) : cuda.Free(*p);
    *p = nullptr;
    *have = 0;
    const cudaError_t e = host ? cuda.HostAlloc(p, need, cudaHostAllocDefault) : cuda.Malloc(p, need);
    if (e != cudaSuccess) {
      *p = nullptr;
      return false;
    }
    *have = need;
    return true;
  };
  void* host = audit_.host;
  const bool ok = (audit_.done || cuda.EventCreateWithFlags(&audit_.done, cudaEventDisableTiming) == cudaSuccess) &&
                  grow(&audit_.in, &audit_.in_bytes, send_bytes, false) &&
                  grow(&audit_.out, &audit_.out_bytes, recv_bytes, false) &&
                  grow(&host, &audit_.host_bytes, 2 * recv_bytes, true);
  audit_.host = static_cast<char*>(host);
  if (!ok) {
    FP8WIRE_ERROR("comm {}: audit: cannot allocate {} + {} B of device and {} B of pinned host memory", comm_id_,
                  send_bytes, recv_bytes, 2 * recv_bytes);
    return ncclSystemError;
  }
  *in = audit_.in;
  *out = audit_.out;
  return ncclSuccess;
}

ncclResult_t TelemetryMonitor::audit_read_back(cudaStream_t stream, const void* fp8_out, size_t recv_bytes,
                                               DataType dtype, Collective collective, Path path, uint64_t seq) {
  std::lock_guard lock(mutex_);
  const CudaApi& cuda = platform_->cuda;
  cudaError_t e = cuda.MemcpyAsync(audit_.host, audit_.out, recv_bytes, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess)
    e = cuda.MemcpyAsync(audit_.host + recv_bytes, fp8_out, recv_bytes, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cuda.EventRecord(audit_.done, stream);
  if (e != cudaSuccess) {
    FP8WIRE_ERROR("comm {}: audit: reading the results back failed: {}", comm_id_, cuda.GetErrorString(e));
    return ncclUnhandledCudaError;
  }
  audit_.in_flight = true;
  audit_.bytes = recv_bytes;
  audit_.dtype = dtype;
  audit_.collective = collective;
  audit_.path = path;
  audit_.seq = seq;
  return ncclSuccess;
}

void TelemetryMonitor::fold_audit() {
  audit_.in_flight = false;
  const size_t es = dtype_size(audit_.dtype);
  const size_t n = audit_.bytes / es;
  const char* exact = audit_.host;
  const char* fp8 = audit_.host + audit_.bytes;
  double sq_error = 0, sq_exact = 0;
  uint64_t nonfinite = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = element(exact, audit_.dtype, i), y = element(fp8, audit_.dtype, i);
    if (!std::isfinite(x) || !std::isfinite(y)) {
      nonfinite += std::isfinite(x) != std::isfinite(y);
      continue;
    }
    sq_error += (y - x) * (y - x);
    sq_exact += x * x;
  }
  const int c = collective_index(audit_.collective);
  const int p = static_cast<int>(audit_.path) < kMaxPaths ? static_cast<int>(audit_.path) : 0;
  {
    Store& st = store();
    std::lock_guard lock(st.totals_mutex);
    ++st.totals.audited_calls[c][p];
    st.totals.audit_sq_error[c][p] += sq_error;
    st.totals.audit_sq_exact[c][p] += sq_exact;
    st.totals.audit_nonfinite[c][p] += nonfinite;
  }
  FP8WIRE_INFO("comm {} rank {}: seq {} {} {}: audit against full precision: relative error {:.3e} over {} elements{}",
               comm_id_, rank_, audit_.seq, to_string(audit_.collective), to_string(audit_.path),
               sq_exact > 0 ? std::sqrt(sq_error / sq_exact) : 0.0, n,
               nonfinite ? fmt::format(", {} finite in only one of the two", nonfinite) : std::string());
}

}  // namespace fp8wire::sched
