// libfp8wire_prof.so: the thin layer between CUPTI/NVTX and the tested host logic (exposure.hpp).
// Loaded alone (LD_PRELOAD=libfp8wire_prof.so FP8WIRE_PROFILER_ENABLE=1) or next to libfp8wire.so,
// which then hands it every intercepted call through fp8wire_prof_start()'s hooks.
//
// Sources of data:
//  - CUPTI activity records: CONCURRENT_KERNEL, MEMCPY, MEMSET (timing), API records of the kernel
//    launch functions only (cuptiActivityEnableRuntimeApi/DriverApi: CUPTI emits
//    EXTERNAL_CORRELATION records only next to API records, and tracing every CUDA call, queries
//    and event polls included, costs a record each), and EXTERNAL_CORRELATION: kind CUSTOM0 = the
//    shim's call sequence number (pushed by the begin hook), kind CUSTOM1 = hash of the
//    application's innermost NVTX range (pushed by our NVTX handlers). The Collector joins them to
//    kernels by correlation id when it reports a step: with CUPTI's per-thread buffers a kernel
//    record may arrive before or after the external-correlation record of its launch.
//  - Delivery: CUPTI hands back a buffer when it is full, or on a flush once all its records are
//    complete. A background thread calls cuptiActivityFlushAll(0) every kFlushIntervalMs and then
//    reports the steps that ended at least CollectorOptions::settle_ns ago.
//  - NVTX: this library is its own NVTX injection (InitializeInjectionNvtx2; fp8wire-prof points
//    NVTX_INJECTION64_PATH at it). We chose our own injection over CUPTI's marker activity because
//    the marker records only say when a range ran, not which kernels were launched inside it; with
//    our handlers a push costs one CUPTI external-id push and a copy of the name the first time a
//    thread sees it. Only the default domain's ranges are handled (what torch.cuda.nvtx uses);
//    fp8wire's own "fp8wire" domain ranges are therefore never mistaken for the application's.
//  - Step windows: NVTX ranges whose name starts with a Config::profiler_step_ranges prefix, or
//    fp8wire_prof_step(). Times are on CUPTI's clock (cuptiGetTimestamp), the clock of the records.
//
// Application threads only post fixed-size events into lock-free rings; everything else runs on the
// thread that delivers CUPTI buffers (or on flush/exit), under one mutex.
#include <cupti.h>
#include <dlfcn.h>
#include <nvtx3/nvToolsExt.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "common/config.hpp"
#include "common/cuda_devices.hpp"
#include "common/log.hpp"
#include "common/output_file.hpp"
#include "profiler/classify.hpp"
#include "profiler/event_ring.hpp"
#include "profiler/exit_flush.hpp"
#include "profiler/exposure.hpp"
#include "profiler/kineto.hpp"
#include "profiler/report.hpp"
#include "sched/engine/accounting.hpp"

#define FP8WIRE_PROF_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using namespace fp8wire;
using namespace fp8wire::prof;

constexpr size_t kNameChars = 64;
constexpr int kMaxRangeDepth = 128;
constexpr uint64_t kStepRangeFlag = 1ull << 63;  // marks nvtxRangeStart ids that opened a step
// CUPTI buffers: kBufferCount preallocated, up to kMaxBufferCount when CUPTI asks for more. CUPTI
// keeps one buffer per thread that records activity (per-thread buffers are its default), so the
// pool must cover every such thread (main, autograd, NCCL, ...) plus buffers waiting for delivery;
// when none can be had CUPTI drops records (counted in the summary).
constexpr int kBufferCount = 32;
constexpr int kMaxBufferCount = 128;
constexpr size_t kMinBufferBytes = 256 << 10;
constexpr uint32_t kFlushPeriodMs = 100;     // CUPTI's own periodic flush (returns full buffers)
constexpr uint32_t kFlushIntervalMs = 50;    // our flush thread (returns completed partial buffers)

struct NvtxEvent {
  enum class Kind : uint8_t { step_begin, step_end, range_name };
  Kind kind = Kind::range_name;
  int64_t step = 0;
  int64_t time = 0;
  uint64_t hash = 0;
  char name[kNameChars] = {};
};

struct CallEvent {
  CallRecord record;
  int64_t issue_time = 0;
  uint64_t range_hash = 0;
};

uint64_t fnv1a(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 1099511628211ull;
  return h | 1;  // never 0: 0 means "no range"
}

int64_t now_ns() {
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  return static_cast<int64_t>(t);
}

const char* dtype_name(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclUint32: return "uint32";
    case ncclInt64: return "int64";
    case ncclUint64: return "uint64";
    case ncclFloat16: return "fp16";
    case ncclFloat32: return "fp32";
    case ncclFloat64: return "fp64";
    case ncclBfloat16: return "bf16";
    default: return "other";
  }
}

int rank_from_env() {
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    if (end && *end == '\0' && r >= 0 && r < (1 << 24)) return static_cast<int>(r);
  }
  return -1;
}

bool make_directories(const std::string& dir) {
  std::string partial;
  for (size_t i = 0; i < dir.size(); ++i) {
    partial += dir[i];
    if ((dir[i] == '/' || i + 1 == dir.size()) && partial.size() > 1)
      if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

struct KernelName {
  uint32_t id;
  ActivityClass cls;
};

class Profiler {
 public:
  explicit Profiler(const Config& config)
      : config_(config),
        classifier_(config.profiler_comm_pattern),
        collector_(CollectorOptions{.top_n = config.profiler_top}) {}

  bool start();
  bool active() const { return active_.load(std::memory_order_acquire); }
  const Config& config() const { return config_; }

  // --- any thread, never blocks ---
  // Steps come from NVTX step ranges or from the C API (fp8wire_prof_step / fp8wire_step_begin);
  // once a job uses the API, its NVTX step ranges are ignored, so a job marking both ways does not
  // open nested windows.
  enum class StepSource { nvtx, api };
  void post_step(bool begin, int64_t step, StepSource source) {
    if (source == StepSource::api) {
      if (!explicit_steps_.load(std::memory_order_relaxed)) explicit_steps_.store(true, std::memory_order_relaxed);
    } else if (explicit_steps_.load(std::memory_order_relaxed)) {
      return;
    }
    NvtxEvent e;
    e.kind = begin ? NvtxEvent::Kind::step_begin : NvtxEvent::Kind::step_end;
    e.step = step;
    e.time = now_ns();
    nvtx_events_.push(e);
  }
  void post_range_name(uint64_t hash, const char* name) {
    NvtxEvent e;
    e.kind = NvtxEvent::Kind::range_name;
    e.hash = hash;
    std::strncpy(e.name, name, kNameChars - 1);
    nvtx_events_.push(e);
  }
  void post_call(const CallEvent& e) {
    if (e.record.rank >= 0 && call_rank_.load(std::memory_order_relaxed) < 0)
      call_rank_.store(e.record.rank, std::memory_order_relaxed);
    call_events_.push(e);
  }
  // Whether an NVTX range name marks a step; its number comes from the name ("ProfilerStep#12"),
  // else from a per-process counter ("step").
  bool is_step_name(const char* name, int64_t& step) {
    if (!match_step_name(name, config_.profiler_step_ranges, -1, step)) return false;
    if (step < 0) step = unnumbered_steps_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  // --- CUPTI callbacks ---
  void buffer_requested(uint8_t** buffer, size_t* size);
  void buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t valid);

  void flush(bool at_exit);

 private:
  void ensure_flush_thread();
  void flush_thread_main();
  void stop_flush_thread();
  void ingest_locked(uint8_t* buffer, size_t valid);
  void drain_events_locked();
  void report_locked(std::vector<Collector::Finalized>&& steps);
  void open_outputs_locked();
  void write_summary_locked();

  Config config_;
  KernelClassifier classifier_;
  std::atomic<bool> active_{false};
  std::atomic<int> call_rank_{-1};
  std::atomic<int64_t> unnumbered_steps_{0};
  std::atomic<bool> explicit_steps_{false};
  EventRing<NvtxEvent> nvtx_events_{1 << 14};
  EventRing<CallEvent> call_events_{1 << 15};

  std::mutex mutex_;  // everything below
  Collector collector_;
  std::unordered_map<const char*, KernelName> kernel_names_;  // CUPTI's name pointers are stable

  std::mutex pool_mutex_;  // the CUPTI buffer pool (never more than kMaxBufferCount buffers)
  std::vector<uint8_t*> free_buffers_;
  int allocated_buffers_ = 0;
  int held_buffers_ = 0;      // handed to CUPTI and not yet given back
  int max_held_buffers_ = 0;  // the most CUPTI held at once: what the pool had to cover
  // The threads CUPTI asked for a buffer on (it asks on the thread whose activity needs one): a
  // count that keeps rising means the application keeps starting threads that launch GPU work,
  // each holding a buffer of its own.
  std::set<pid_t> requesting_threads_;
  size_t buffer_bytes_ = 0;

  // Below: guarded by mutex_ again.
  int rank_ = -1;
  bool outputs_opened_ = false;
  FILE* jsonl_ = nullptr;
  TraceWriter trace_;
  std::deque<StepReport> recent_;  // for the periodic and final tables
  uint64_t steps_since_table_ = 0;
  struct Totals {
    uint64_t steps = 0;
    double step_ms = 0, compute_ms = 0, comm_ms = 0, exposed_comm_ms = 0, exposed_wait_ms = 0, exposed_memcpy_ms = 0,
           idle_ms = 0;
    uint64_t app_bytes = 0, wire_bytes = 0, plain_wire_bytes = 0;
  } totals_;
  uint64_t cupti_dropped_per_context_ = 0;  // drops reported with a context's buffers
  uint64_t incomplete_records_ = 0;         // kernel/memory records without a valid start and end
  bool finished_ = false;
  bool all_api_records_ = false;  // RUNTIME + DRIVER kinds on (fallback), not only launch functions

  // The flush thread: started when CUPTI first asks for a buffer (a process that never touches the
  // GPU, such as a launcher, never gets one), in the process that runs it (pid: after a fork the
  // child has no such thread).
  std::atomic<pid_t> flush_thread_pid_{0};
  std::mutex flush_thread_mutex_;
  std::condition_variable flush_thread_wake_;
  bool flush_thread_stop_ = false;     // guarded by flush_thread_mutex_
  bool flush_thread_running_ = false;  // guarded by flush_thread_mutex_
};

Profiler* g_profiler = nullptr;  // created once, never destroyed (atexit and CUPTI threads use it)
std::atomic<Profiler*> g_active_profiler{nullptr};
std::mutex g_start_mutex;

Profiler* active_profiler() {
  Profiler* p = g_active_profiler.load(std::memory_order_acquire);
  return (p && p->active()) ? p : nullptr;
}

void CUPTIAPI on_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *max_records = 0;
  if (g_profiler) g_profiler->buffer_requested(buffer, size);
  else { *buffer = nullptr; *size = 0; }
}

// Nothing may unwind into CUPTI (a C library calling us) or out of an atexit handler.
void CUPTIAPI on_buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t, size_t valid) {
  try {
    if (g_profiler) g_profiler->buffer_completed(context, stream_id, buffer, valid);
  } catch (const std::exception& e) {
    FP8WIRE_WARN_ONCE("fp8wire profiler: dropped a CUPTI buffer: {}", e.what());
  } catch (...) {
    FP8WIRE_WARN_ONCE("fp8wire profiler: dropped a CUPTI buffer (unknown error)");
  }
}

void CUPTIAPI on_cupti_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void*) {
  // The records of a context must be collected before it goes away (at exit the CUDA runtime
  // destroys its contexts before our atexit handler runs).
  if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING)
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

void at_exit() {
  try {
    if (Profiler* p = active_profiler()) p->flush(/*at_exit=*/true);
  } catch (...) {
    FP8WIRE_WARN_ONCE("fp8wire profiler: the final report could not be written");
  }
}

// SIGTERM / SIGINT / _exit (exit_flush.hpp): the process ends without atexit handlers. Final: as
// at_exit. Otherwise the application's own signal handler runs next and may keep the process going:
// report the closed steps now, without waiting for their settle time.
void on_exit_flush(bool final) {
  try {
    if (Profiler* p = active_profiler()) p->flush(/*at_exit=*/final);
  } catch (...) {
    FP8WIRE_WARN_ONCE("fp8wire profiler: the report could not be written at the end of the process");
  }
}

// API records only for the functions that launch kernels: they carry the external ids (NVTX range,
// shim call) that CUPTI attaches to the launch. Runtime launches are listed as well as driver ones
// because which of the two CUPTI reports for a runtime launch is its choice; a kernel's correlation
// id matches the API record of its launch either way.
// Returns false when it had to fall back to tracing every API call.
bool enable_launch_api_records() {
  static constexpr CUpti_CallbackId kRuntimeLaunches[] = {
      CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
      CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
      CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000,
      CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000,
      CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernelMultiDevice_v9000,
      CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
      CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
      CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000,
      CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000,
      CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000,
      CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000,
  };
  static constexpr CUpti_CallbackId kDriverLaunches[] = {
      CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
      CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
      CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,  // NCCL launches this way
      CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
      CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
      CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
      CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernelMultiDevice,
      CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
      CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
  };
  bool ok = true;
  for (CUpti_CallbackId id : kRuntimeLaunches) ok = ok && cuptiActivityEnableRuntimeApi(id, 1) == CUPTI_SUCCESS;
  for (CUpti_CallbackId id : kDriverLaunches) ok = ok && cuptiActivityEnableDriverApi(id, 1) == CUPTI_SUCCESS;
  if (ok) return true;
  // An older CUPTI without per-function control: every API call then costs a record.
  FP8WIRE_WARN_ONCE("fp8wire profiler: CUPTI cannot trace launch functions alone; tracing every CUDA API call "
                    "(more overhead)");
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
  return false;
}

// Set once any thread pushed an external id (NVTX range or shim call): from then on CUPTI should be
// emitting external-correlation records.
std::atomic<bool> g_external_pushed{false};
void note_external_pushed() {
  if (!g_external_pushed.load(std::memory_order_relaxed)) g_external_pushed.store(true, std::memory_order_relaxed);
}

bool Profiler::start() {
  // profiler.buffer_bytes is the memory of 8 buffers (the pool holds kBufferCount).
  buffer_bytes_ = std::max<size_t>(config_.profiler_buffer_bytes / 8, kMinBufferBytes);
  buffer_bytes_ = (buffer_bytes_ + 7) & ~size_t{7};  // CUPTI wants 8-byte aligned buffers
  free_buffers_.reserve(kMaxBufferCount);
  for (int i = 0; i < kBufferCount; ++i) {
    if (void* b = std::aligned_alloc(8, buffer_bytes_)) {
      free_buffers_.push_back(static_cast<uint8_t*>(b));
      ++allocated_buffers_;
    }
  }

  CUpti_SubscriberHandle subscriber = nullptr;
  const CUptiResult sub = cuptiSubscribe(&subscriber, on_cupti_callback, nullptr);
  if (sub != CUPTI_SUCCESS) {
    const char* text = nullptr;
    cuptiGetResultString(sub, &text);
    // Every process of a job loads this library; on a machine without a GPU driver a warning from
    // each says nothing that fp8wire-prof does not say once ("no GPU: the profiler recorded nothing").
    if (!cuda_driver_present())
      FP8WIRE_INFO("fp8wire profiler: no CUDA driver ({}); nothing to record", text ? text : "?");
    else if (sub == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
      FP8WIRE_WARN_ONCE("fp8wire profiler: CUPTI is already in use by another tool (torch.profiler, nsys, ncu); "
                        "carrying on without the exposure profiler");
    else
      FP8WIRE_WARN_ONCE("fp8wire profiler: CUPTI could not start ({}); carrying on without the exposure profiler",
                        text ? text : "?");
    return false;
  }
  cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING);
  // Before any context exists (the library loads ahead of the application's CUDA use), so every
  // context gets its device buffers up front: CUPTI otherwise starts with 3 and allocates more on
  // the launching thread when they are all in use, which stalls that launch; and with CUDA 13.0's
  // CUPTI and 3 buffers, one rank of a fast run was seen to keep every buffer from some step on
  // (3.2 MB of device and 3.4 MiB of host memory per ~100k kernels, profiler/README.md).
  const auto set_device_attribute = [](CUpti_ActivityAttribute attribute, size_t value, const char* key) {
    size_t value_size = sizeof value;
    if (cuptiActivitySetAttribute(attribute, &value_size, &value) != CUPTI_SUCCESS)
      FP8WIRE_WARN("fp8wire profiler: CUPTI did not take {} = {}; it keeps its own default", key, value);
  };
  set_device_attribute(CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE, config_.profiler_device_buffer_bytes,
                       "profiler.device_buffer_bytes");
  set_device_attribute(CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE, config_.profiler_device_buffers,
                       "profiler.device_buffers");
  if (cuptiActivityRegisterCallbacks(on_buffer_requested, on_buffer_completed) != CUPTI_SUCCESS) {
    FP8WIRE_WARN_ONCE("fp8wire profiler: cuptiActivityRegisterCallbacks failed; profiler off");
    return false;
  }
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                  CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION}) {
    const CUptiResult r = cuptiActivityEnable(kind);
    if (r != CUPTI_SUCCESS) {
      const char* text = nullptr;
      cuptiGetResultString(r, &text);
      FP8WIRE_WARN("fp8wire profiler: cannot enable CUPTI activity kind {} ({})", static_cast<int>(kind),
                   text ? text : "?");
      if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) return false;
    }
  }
  all_api_records_ = !enable_launch_api_records();
  cuptiActivityFlushPeriod(kFlushPeriodMs);
  rank_ = rank_from_env();
  if (rank_ >= 0) collector_.set_rank(rank_);
  active_.store(true, std::memory_order_release);
  std::atexit(at_exit);
  FP8WIRE_INFO("fp8wire profiler on: step ranges {}, output '{}', classifier patterns {}",
               fmt::join(config_.profiler_step_ranges, ","), config_.profiler_output,
               fmt::join(classifier_.patterns(), "|"));
  return true;
}

void Profiler::buffer_requested(uint8_t** buffer, size_t* size) {
  ensure_flush_thread();
  // Its own lock: an application thread asking for a buffer must not wait for a report being built.
  std::lock_guard lock(pool_mutex_);
  requesting_threads_.insert(static_cast<pid_t>(syscall(SYS_gettid)));
  if (free_buffers_.empty() && allocated_buffers_ < kMaxBufferCount) {
    // More threads record activity than the preallocated pool covers. A rare allocation beats
    // losing records; the pool never shrinks, so this happens at most kMaxBufferCount times.
    if (void* b = std::aligned_alloc(8, buffer_bytes_)) {
      free_buffers_.push_back(static_cast<uint8_t*>(b));
      ++allocated_buffers_;
    }
  }
  if (free_buffers_.empty()) {
    // CUPTI counts the records it cannot store; the summary reports them.
    *buffer = nullptr;
    *size = 0;
    return;
  }
  *buffer = free_buffers_.back();
  free_buffers_.pop_back();
  *size = buffer_bytes_;
  max_held_buffers_ = std::max(max_held_buffers_, ++held_buffers_);
}

void Profiler::buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t valid) {
  std::lock_guard lock(mutex_);
  // Records CUPTI could not store for this buffer's queue (a context's, or the global one): the
  // count the summary reads at the end covers only the global queue.
  size_t dropped = 0;
  if (context && cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped) == CUPTI_SUCCESS)
    cupti_dropped_per_context_ += dropped;
  if (buffer) {
    if (!finished_) ingest_locked(buffer, valid);
    std::lock_guard pool_lock(pool_mutex_);
    free_buffers_.push_back(buffer);
    --held_buffers_;
  }
  // Steps are reported by the flush thread (or at flush/exit), after their settle time.
}

void Profiler::ensure_flush_thread() {
  const pid_t pid = getpid();
  if (flush_thread_pid_.load(std::memory_order_acquire) == pid) return;
  std::lock_guard lock(flush_thread_mutex_);
  if (flush_thread_pid_.load(std::memory_order_relaxed) == pid || !active()) return;
  flush_thread_stop_ = false;
  flush_thread_running_ = true;
  try {
    std::thread([this] { flush_thread_main(); }).detach();  // detached: a forked child must not join it
  } catch (const std::exception& e) {
    flush_thread_running_ = false;
    FP8WIRE_WARN_ONCE("fp8wire profiler: no flush thread ({}); steps are reported at exit only", e.what());
  }
  flush_thread_pid_.store(pid, std::memory_order_release);
  // Here, not at load: the first GPU activity comes after the runtime installed its own handlers
  // (Python's SIGINT handler goes in only where it finds the default), so ours chains to theirs.
  if (!install_exit_flush(on_exit_flush))
    FP8WIRE_WARN_ONCE("fp8wire profiler: no exit-flush thread; SIGTERM, SIGINT and _exit lose the unreported steps");
}

namespace {
// The shim's per-call telemetry (shim/fp8wire.h fp8wire_call_error), resolved at run time: null
// without libfp8wire.so (or one older than it). Resolved first outside mutex_ (the flushes below):
// dlsym takes the loader's lock, which a thread loading a library may hold while it waits for
// mutex_ (a CUPTI delivery from a library's constructor).
using CallErrorFn = int (*)(uint64_t, double*, double*);
CallErrorFn call_error_fn() {
  static const CallErrorFn fn = reinterpret_cast<CallErrorFn>(dlsym(RTLD_DEFAULT, "fp8wire_call_error"));
  return fn;
}
}  // namespace

void Profiler::flush_thread_main() {
  // SIGTERM/SIGINT go to another thread: their handler waits for a flush that needs mutex_, which
  // this thread may hold.
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  pthread_sigmask(SIG_BLOCK, &block, nullptr);
  std::unique_lock lock(flush_thread_mutex_);
  while (!flush_thread_stop_) {
    flush_thread_wake_.wait_for(lock, std::chrono::milliseconds(kFlushIntervalMs));
    if (flush_thread_stop_) break;
    lock.unlock();
    try {
      // Default flush (not forced): only buffers whose records are all complete come back, so no
      // kernel is delivered without its timestamps. Outside mutex_: delivery takes it.
      cuptiActivityFlushAll(0);
      bool trace_all_apis = false;
      call_error_fn();  // report_locked's, resolved before mutex_ is taken
      {
        std::lock_guard guard(mutex_);
        if (!finished_) {
          drain_events_locked();
          report_locked(collector_.finalize(now_ns(), /*everything=*/false));
          // Ranges were pushed and steps went by, yet not one external-correlation record came:
          // this CUPTI ties them to the whole RUNTIME/DRIVER kinds, not to per-function API
          // records. Attribution matters more than the extra records: switch, once, and say so.
          const CollectorCounters& c = collector_.counters();
          if (!all_api_records_ && c.steps_reported >= 3 && c.external_records == 0 &&
              g_external_pushed.load(std::memory_order_relaxed)) {
            all_api_records_ = true;
            trace_all_apis = true;
          }
        }
      }
      if (trace_all_apis) {
        FP8WIRE_WARN("fp8wire profiler: no external-correlation records with launch-only API tracing; tracing "
                     "every CUDA API call from now on (NVTX range / shim call attribution; more overhead)");
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
      }
    } catch (const std::exception& e) {
      FP8WIRE_WARN_ONCE("fp8wire profiler: periodic report failed: {}", e.what());
    } catch (...) {
      FP8WIRE_WARN_ONCE("fp8wire profiler: periodic report failed");
    }
    lock.lock();
  }
  flush_thread_running_ = false;
  flush_thread_wake_.notify_all();
}

void Profiler::stop_flush_thread() {
  std::unique_lock lock(flush_thread_mutex_);
  if (flush_thread_pid_.load(std::memory_order_relaxed) != getpid()) return;  // none in this process
  flush_thread_stop_ = true;
  flush_thread_wake_.notify_all();
  // Bounded: at exit we must not hang on a thread stuck in CUPTI.
  flush_thread_wake_.wait_for(lock, std::chrono::seconds(2), [this] { return !flush_thread_running_; });
}

void Profiler::ingest_locked(uint8_t* buffer, size_t valid) {
  // A record with no positive duration is skipped; it is a loss (counted) unless it is an empty
  // activity (start == end), which takes no time anyway.
  const auto unusable = [this](uint64_t start, uint64_t end) {
    if (end > start) return false;
    incomplete_records_ += start == 0 || end < start;
    return true;
  };
  // Memory activity (a copy or a set) needs no attribution, only its time counts; false where the
  // record is unusable.
  const auto memory = [&unusable](const auto* m, Activity& a) {
    if (unusable(m->start, m->end)) return false;
    a.time = {static_cast<int64_t>(m->start), static_cast<int64_t>(m->end)};
    a.cls = ActivityClass::memory;
    return true;
  };
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    Activity a;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        // Joined to kernels by correlation id when their step is reported (either may come first).
        const auto* ext = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
        if (ext->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
          collector_.add_external(ext->correlationId, ext->externalId, 0);
        else if (ext->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1)
          collector_.add_external(ext->correlationId, 0, ext->externalId);
        continue;
      }
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        if (unusable(k->start, k->end)) continue;
        auto [it, inserted] = kernel_names_.try_emplace(k->name, KernelName{});
        if (inserted) {
          const std::string_view name = k->name ? k->name : "?";
          it->second = {collector_.names().intern(name), classifier_.classify_kernel(name)};
        }
        a.time = {static_cast<int64_t>(k->start), static_cast<int64_t>(k->end)};
        a.cls = it->second.cls;
        a.name = it->second.id;
        a.correlation = k->correlationId;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY:
        if (!memory(reinterpret_cast<const CUpti_ActivityMemcpy6*>(record), a)) continue;
        break;
      case CUPTI_ACTIVITY_KIND_MEMSET:
        if (!memory(reinterpret_cast<const CUpti_ActivityMemset4*>(record), a)) continue;
        break;
      default:
        continue;  // API records exist only to carry external ids
    }
    collector_.add_activity(a);
  }
}

void Profiler::drain_events_locked() {
  nvtx_events_.drain([this](const NvtxEvent& e) {
    switch (e.kind) {
      case NvtxEvent::Kind::step_begin: collector_.step_begin(e.step, e.time); break;
      case NvtxEvent::Kind::step_end: collector_.step_end(e.step, e.time); break;
      case NvtxEvent::Kind::range_name: collector_.name_range(e.hash, e.name); break;
    }
  });
  call_events_.drain([this](const CallEvent& e) {
    CallInfo c;
    c.seq = e.record.seq;
    c.issue_ns = e.issue_time;
    c.kind = collector_.names().intern(to_string(e.record.kind));
    c.dtype = collector_.names().intern(dtype_name(e.record.dtype));
    c.path = collector_.names().intern(to_string(e.record.path));
    c.range = collector_.range_name(e.range_hash);
    c.app_bytes = e.record.app_bytes;
    c.wire_bytes = e.record.wire_bytes;
    c.plain_wire_bytes = e.record.plain_wire_bytes;
    c.coalesced_calls = e.record.coalesced_calls;
    c.transport = collector_.names().intern(to_string(e.record.transport));
    collector_.add_call(c);
  });
}

void Profiler::open_outputs_locked() {
  outputs_opened_ = true;
  // The rank may have been set after this library loaded (a launcher that forks, then sets RANK),
  // and the shim's records carry the communicator rank.
  if (rank_ < 0) rank_ = rank_from_env();
  if (rank_ < 0) rank_ = call_rank_.load(std::memory_order_relaxed);
  collector_.set_rank(rank_ >= 0 ? rank_ : 0);
  const std::string& prefix = config_.profiler_output;
  if (prefix.empty()) return;  // tables on stderr only
  const std::string who = rank_ >= 0 ? fmt::format("rank{}", rank_) : fmt::format("pid{}", getpid());
  std::string base;
  if (prefix.back() == '/') {
    if (!make_directories(prefix))
      FP8WIRE_WARN("fp8wire profiler: cannot create profiler.output directory '{}': {}", prefix, strerror(errno));
    base = prefix + who;
  } else {
    base = prefix + "." + who;
  }
  std::string error;
  jsonl_ = fopen_output(base + ".jsonl", OutputMode::truncate, error);
  if (!jsonl_) FP8WIRE_WARN("fp8wire profiler: {} (profiler.output)", error);
  if (!trace_.open(base + ".trace.json", rank_ >= 0 ? rank_ : 0, error))
    FP8WIRE_WARN("fp8wire profiler: {} (profiler.output)", error);
}

void Profiler::report_locked(std::vector<Collector::Finalized>&& steps) {
  if (steps.empty()) return;
  // A measured call's error is in by now: the step was reported after its settle time, and the
  // query folds every completed record.
  if (const CallErrorFn error_of = call_error_fn())
    for (Collector::Finalized& f : steps)
      for (CollectiveReport& c : f.report.top) {
        double input = 0;
        if (c.seq && error_of(c.seq, &input, nullptr)) c.rel_error = input;
      }
  if (!outputs_opened_) {
    open_outputs_locked();
    for (auto& f : steps) f.report.rank = collector_.options().rank;
  }
  for (Collector::Finalized& f : steps) {
    const StepReport& r = f.report;
    if (jsonl_) std::fprintf(jsonl_, "%s\n", dump_json(to_json(r)).c_str());
    trace_.write_step(r, f.timeline);
    ++totals_.steps;
    totals_.step_ms += r.step_ms;
    totals_.compute_ms += r.compute_ms;
    totals_.comm_ms += r.comm_ms;
    totals_.exposed_comm_ms += r.exposed_comm_ms;
    totals_.exposed_wait_ms += r.exposed_wait_ms;
    totals_.exposed_memcpy_ms += r.exposed_memcpy_ms;
    totals_.idle_ms += r.idle_ms;
    totals_.app_bytes += r.app_bytes;
    totals_.wire_bytes += r.wire_bytes;
    totals_.plain_wire_bytes += r.plain_wire_bytes;
    recent_.push_back(r);
    const size_t keep = std::max<size_t>(config_.profiler_report_every, 20);
    while (recent_.size() > keep) recent_.pop_front();
    if (config_.profiler_report_every > 0 && ++steps_since_table_ >= config_.profiler_report_every) {
      steps_since_table_ = 0;
      std::vector<StepReport> last(recent_.end() - config_.profiler_report_every, recent_.end());
      fmt::print(stderr, "{}", format_table(merge_ranks(last, config_.profiler_top), 40));
    }
  }
  if (jsonl_) std::fflush(jsonl_);
}

void Profiler::write_summary_locked() {
  if (totals_.steps == 0) {
    // A process that never ran a kernel (a launcher such as torchrun's parent) leaves no files.
    FP8WIRE_INFO("fp8wire profiler: no GPU activity recorded in this process; no report written");
    return;
  }
  const CollectorCounters& c = collector_.counters();
  size_t global_dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &global_dropped);
  const uint64_t cupti_dropped = global_dropped + cupti_dropped_per_context_;
  const double n = totals_.steps ? static_cast<double>(totals_.steps) : 1.0;
  nlohmann::json buffers;
  {
    std::lock_guard pool_lock(pool_mutex_);
    buffers = {{"allocated", allocated_buffers_}, {"max_held", max_held_buffers_}, {"limit", kMaxBufferCount},
               {"bytes_each", buffer_bytes_}, {"requesting_threads", requesting_threads_.size()},
               {"device_preallocated", config_.profiler_device_buffers},
               {"device_bytes_each", config_.profiler_device_buffer_bytes}};
  }
  nlohmann::json summary{{"type", "summary"},
                         {"rank", collector_.options().rank},
                         {"steps", totals_.steps},
                         {"mean_step_ms", totals_.step_ms / n},
                         {"mean_compute_ms", totals_.compute_ms / n},
                         {"mean_comm_ms", totals_.comm_ms / n},
                         {"mean_exposed_comm_ms", totals_.exposed_comm_ms / n},
                         {"mean_exposed_wait_ms", totals_.exposed_wait_ms / n},
                         {"mean_exposed_memcpy_ms", totals_.exposed_memcpy_ms / n},
                         {"mean_idle_ms", totals_.idle_ms / n},
                         {"app_bytes", totals_.app_bytes},
                         {"wire_bytes", totals_.wire_bytes},
                         {"plain_wire_bytes", totals_.plain_wire_bytes},
                         {"counters", to_json(c)},
                         {"dropped_nvtx_events", nvtx_events_.dropped()},
                         {"dropped_call_events", call_events_.dropped()},
                         {"dropped_cupti_records", cupti_dropped},
                         {"incomplete_cupti_records", incomplete_records_},
                         {"dropped_trace_events", trace_.dropped_events()},
                         {"cupti_buffers", buffers}};
  if (jsonl_) std::fprintf(jsonl_, "%s\n", dump_json(summary).c_str());
  if (!recent_.empty()) {
    std::vector<StepReport> last(recent_.begin(), recent_.end());
    fmt::print(stderr, "fp8wire profiler, rank {}: last {} step(s)\n{}", collector_.options().rank, last.size(),
               format_table(merge_ranks(last, config_.profiler_top), 40));
  }
  fmt::print(stderr,
             "fp8wire profiler, rank {}: {} steps, mean step {:.3f} ms, compute {:.3f}, exposed comm {:.3f} "
             "(waiting {:.3f}), exposed memcpy {:.3f}, idle {:.3f}; dropped: {} activities, {} late, {} CUPTI records, {} incomplete; "
             "launch ids: {} received, {} kernels joined, {} not\n",
             collector_.options().rank, totals_.steps, totals_.step_ms / n, totals_.compute_ms / n,
             totals_.exposed_comm_ms / n, totals_.exposed_wait_ms / n, totals_.exposed_memcpy_ms / n, totals_.idle_ms / n,
             c.dropped_activities, c.late_activities, cupti_dropped, incomplete_records_, c.external_records,
             c.joined_activities, c.unjoined_activities);
  if (c.late_activities > 0 || cupti_dropped > 0 || incomplete_records_ > 0)
    FP8WIRE_WARN("fp8wire profiler, rank {}: {} records came after their step was reported, {} were dropped by "
                 "CUPTI (no free buffer) and {} had no valid start and end; the figures above undercount GPU "
                 "activity",
                 collector_.options().rank, c.late_activities, cupti_dropped, incomplete_records_);
}

void Profiler::flush(bool at_exit) {
  if (at_exit) stop_flush_thread();
  // Outside the mutex: FlushAll delivers buffers through buffer_completed, which takes it.
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  call_error_fn();  // report_locked's, resolved before mutex_ is taken
  std::lock_guard lock(mutex_);
  if (finished_) return;
  drain_events_locked();
  if (at_exit) {
    report_locked(collector_.finalize(now_ns(), /*everything=*/true));
    write_summary_locked();
    if (jsonl_) std::fclose(jsonl_);
    jsonl_ = nullptr;
    trace_.close();
    finished_ = true;
    active_.store(false, std::memory_order_release);
  } else {
    // Every closed step, without waiting for the next one (the caller asked for it now).
    report_locked(collector_.finalize_closed());
  }
}

// ---------------------------------------------------------------------------------------------
// NVTX handlers (default domain). Per-thread stack of what each push did, so pop undoes it.

enum class FrameKind : uint8_t { untracked, range, step };
struct RangeStack {
  FrameKind kinds[kMaxRangeDepth];
  uint64_t hashes[kMaxRangeDepth];
  int depth = 0;
  uint64_t posted[256] = {};  // names this thread already sent (direct-mapped by hash)
};
thread_local RangeStack t_ranges;

uint64_t innermost_range_hash() {
  for (int i = t_ranges.depth - 1; i >= 0; --i)
    if (i < kMaxRangeDepth && t_ranges.kinds[i] == FrameKind::range) return t_ranges.hashes[i];
  return 0;
}

int push_range(const char* name) {
  const int level = t_ranges.depth++;
  if (level >= kMaxRangeDepth) return level;
  t_ranges.kinds[level] = FrameKind::untracked;
  Profiler* p = active_profiler();
  if (!p || !name) return level;
  int64_t step = 0;
  if (p->is_step_name(name, step)) {
    t_ranges.kinds[level] = FrameKind::step;
    p->post_step(true, step, Profiler::StepSource::nvtx);
    return level;
  }
  const uint64_t hash = fnv1a(name);
  uint64_t& slot = t_ranges.posted[hash % 256];
  if (slot != hash) {
    slot = hash;
    p->post_range_name(hash, name);
  }
  cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1, hash);
  note_external_pushed();
  t_ranges.kinds[level] = FrameKind::range;
  t_ranges.hashes[level] = hash;
  return level;
}

int pop_range() {
  if (t_ranges.depth == 0) return -1;
  const int level = --t_ranges.depth;
  if (level >= kMaxRangeDepth) return level;
  switch (t_ranges.kinds[level]) {
    case FrameKind::range: cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1, nullptr); break;
    case FrameKind::step:
      if (Profiler* p = active_profiler()) p->post_step(false, -1, Profiler::StepSource::nvtx);
      break;
    case FrameKind::untracked: break;
  }
  return level;
}

const char* ascii_message(const nvtxEventAttributes_t* attr) {
  if (!attr || attr->messageType != NVTX_MESSAGE_TYPE_ASCII) return nullptr;
  return attr->message.ascii;
}

int NVTX_API nvtx_range_push_a(const char* message) { return push_range(message); }
int NVTX_API nvtx_range_push_ex(const nvtxEventAttributes_t* attr) { return push_range(ascii_message(attr)); }
int NVTX_API nvtx_range_pop() { return pop_range(); }

std::atomic<uint64_t> g_next_range_id{1};

nvtxRangeId_t range_start(const char* name) {
  const uint64_t id = g_next_range_id.fetch_add(1, std::memory_order_relaxed);
  Profiler* p = active_profiler();
  int64_t step = 0;
  if (!p || !name || !p->is_step_name(name, step)) return id;
  p->post_step(true, step, Profiler::StepSource::nvtx);
  return id | kStepRangeFlag;
}
nvtxRangeId_t NVTX_API nvtx_range_start_a(const char* message) { return range_start(message); }
nvtxRangeId_t NVTX_API nvtx_range_start_ex(const nvtxEventAttributes_t* attr) { return range_start(ascii_message(attr)); }
void NVTX_API nvtx_range_end(nvtxRangeId_t id) {
  if (!(id & kStepRangeFlag)) return;
  if (Profiler* p = active_profiler()) p->post_step(false, -1, Profiler::StepSource::nvtx);
}

// ---------------------------------------------------------------------------------------------
// Call hooks handed to the shim.

thread_local int64_t t_call_issue = 0;

void hook_begin(const CallRecord& r) {
  if (!active_profiler()) return;
  t_call_issue = now_ns();
  // Every kernel launched until hook_end carries this call's sequence number (CUSTOM0; the NVTX
  // range hashes use CUSTOM1, so the two never mix).
  cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, r.seq);
  note_external_pushed();
}

void hook_end(const CallRecord& r) {
  Profiler* p = active_profiler();
  if (!p) return;
  cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, nullptr);
  CallEvent e;
  e.record = r;
  e.issue_time = t_call_issue;
  e.range_hash = innermost_range_hash();
  p->post_call(e);
}

const CallHooks g_hooks{hook_begin, hook_end};

LogLevel parse_log_level(const std::string& s) {
  for (LogLevel l : {LogLevel::off, LogLevel::error, LogLevel::warn, LogLevel::info, LogLevel::debug, LogLevel::trace}) {
    std::string name = log_level_name(l);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    if (name == s) return l;
  }
  return LogLevel::warn;
}

Profiler* start_profiler(const Config& config) {
  std::lock_guard lock(g_start_mutex);
  if (g_profiler) return g_active_profiler.load(std::memory_order_acquire);
  log_set_level(parse_log_level(config.log_level));
  if (!config.log_file.empty()) log_set_file(config.log_file);
  g_profiler = new Profiler(config);
  if (!g_profiler->start()) return nullptr;
  g_active_profiler.store(g_profiler, std::memory_order_release);
  return g_profiler;
}

// Runs when the library is loaded (LD_PRELOAD, or dlopen through NVTX_INJECTION64_PATH).
__attribute__((constructor)) void on_load() {
  try {
    const ConfigResult result = load_config();
    for (const ConfigError& e : result.errors) FP8WIRE_WARN("fp8wire profiler: {}", e.message());
    if (result.config.profiler_enable) start_profiler(result.config);
  } catch (...) {
    FP8WIRE_WARN_ONCE("fp8wire profiler: could not start; the job runs without it");
  }
}

}  // namespace

FP8WIRE_PROF_EXPORT const fp8wire::CallHooks* fp8wire_prof_start(const fp8wire::Config* cfg) {
  try {
    Profiler* p = nullptr;
    if (cfg) {
      p = start_profiler(*cfg);
    } else {
      Config config = load_config().config;
      config.profiler_enable = true;
      p = start_profiler(config);
    }
    return p ? &g_hooks : nullptr;
  } catch (...) {
    return nullptr;  // nothing exported throws
  }
}

FP8WIRE_PROF_EXPORT void fp8wire_prof_step(int64_t step, int begin) {
  if (Profiler* p = active_profiler()) p->post_step(begin != 0, begin ? step : -1, Profiler::StepSource::api);
}

FP8WIRE_PROF_EXPORT void fp8wire_prof_flush(void) {
  try {
    if (Profiler* p = active_profiler()) p->flush(/*at_exit=*/false);
  } catch (...) {
  }
}

// The public step API of shim/fp8wire.h, so a job that marks steps this way gets the same report
// with the profiler alone. With both libraries preloaded the first one in LD_PRELOAD order answers;
// the shim's versions forward here, so the result is the same.
FP8WIRE_PROF_EXPORT void fp8wire_step_begin(int64_t step) { fp8wire_prof_step(step, 1); }
FP8WIRE_PROF_EXPORT void fp8wire_step_end(int64_t step) { fp8wire_prof_step(step, 0); }
FP8WIRE_PROF_EXPORT void fp8wire_profiler_flush(void) { fp8wire_prof_flush(); }

// _exit and _Exit (Python's os._exit, and C programs that skip atexit): the final report first.
// Interposed because LD_PRELOAD puts this library ahead of libc. A forked or vforked child calling
// _exit after a failed exec does nothing extra (flush_before_exit checks the process).
namespace {
using ExitFn = void (*)(int);
// Resolved when the library loads, never at exit: a vforked child shares the parent's memory, and
// dlsym would take the loader's lock in it.
ExitFn g_real_exit = nullptr;
ExitFn g_real_Exit = nullptr;
__attribute__((constructor)) void resolve_exit() {
  g_real_exit = reinterpret_cast<ExitFn>(dlsym(RTLD_NEXT, "_exit"));
  g_real_Exit = reinterpret_cast<ExitFn>(dlsym(RTLD_NEXT, "_Exit"));
}
[[noreturn]] void exit_through(ExitFn real, int status) {
  fp8wire::prof::flush_before_exit();
  if (real) real(status);
  syscall(SYS_exit_group, status);
  __builtin_unreachable();
}
}  // namespace
FP8WIRE_PROF_EXPORT void _exit(int status) { exit_through(g_real_exit, status); }
FP8WIRE_PROF_EXPORT void _Exit(int status) { exit_through(g_real_Exit, status); }

// NVTX injection entry point (NVTX_INJECTION64_PATH=libfp8wire_prof.so).
FP8WIRE_PROF_EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (!callbacks) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) || !table) return 0;
  auto install = [&](unsigned id, NvtxFunctionPointer fn) {
    if (id < size && table[id]) *table[id] = fn;
  };
  install(NVTX_CBID_CORE_RangePushA, reinterpret_cast<NvtxFunctionPointer>(nvtx_range_push_a));
  install(NVTX_CBID_CORE_RangePushEx, reinterpret_cast<NvtxFunctionPointer>(nvtx_range_push_ex));
  install(NVTX_CBID_CORE_RangePop, reinterpret_cast<NvtxFunctionPointer>(nvtx_range_pop));
  install(NVTX_CBID_CORE_RangeStartA, reinterpret_cast<NvtxFunctionPointer>(nvtx_range_start_a));
  install(NVTX_CBID_CORE_RangeStartEx, reinterpret_cast<NvtxFunctionPointer>(nvtx_range_start_ex));
  install(NVTX_CBID_CORE_RangeEnd, reinterpret_cast<NvtxFunctionPointer>(nvtx_range_end));
  return 1;
}
