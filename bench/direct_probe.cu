// fp8wire-direct-probe: what the direct transports rely on, measured on this machine before any
// transport code depends on it. Two processes share the first GPU (as emulated ranks do) and a
// POSIX shared-memory segment registered with CUDA in both:
//   caps       device attributes: stream memory operations, host-pointer use of registered memory
//   pingpong   a flag round trip between the two processes through cuStreamWriteValue32 /
//              cuStreamWaitValue32 on shared host memory (the barrier the transports use), with memory
//              operations only and with a 132-CTA kernel on each side per turn
//   starve     while one process's stream waits on a flag (a memory-operation wait, then a kernel
//              spinning on it), do the other process's kernels still run, and does a host store
//              release the wait
//   graph      the wait / reset / signal sequence captured into a CUDA graph and replayed
//   ipc        device memory of one process opened by the other (cudaIpc*), written and read back
//   bandwidth  kernels storing to / loading from the shared host memory with 1..all SMs, against
//              cudaMemcpyAsync of the same bytes (the pinned host-copy ceiling), same run
//   duplex     the direct pipeline's data movement alone, both processes at once: per call 8 stages,
//              each a D2H copy into this process's slot (produce lane) and an H2D copy of the peer's
//              slot (transfer lane), two slots deep. Timed four ways: both directions on one stream
//              (serial: the sum), on two streams with nothing between them (what the link gives at
//              once), with the transports' flag handshakes between the processes (ready per stage,
//              free per slot), with those plus the executor's events between its lanes (each event
//              alone, then both), with the same lane order kept by stream memory operations on
//              the process's own flags instead of events, and with events and four slots instead of
//              two (a stage's slot is reused four stages later), with one hand-over by event and the other
//              by memory operation (both mixes); each line also gives the host's time to
//              issue one call. duplex_gated: the same with every operation of a call issued before
//              any runs (the GPU's time alone). Where a way takes the one-stream time or
//              more while the free one does not, its waits are what serialises the two directions.
//   duplex_fused the same bytes and handshakes with no stream in between: one kernel per process and
//              call, half its thread blocks storing this process's stages into its host slots and
//              half loading the peer's, block pairs handing slots over by flags in host memory
//              (16, 32, 64 pairs; four slots; and no handshake at all).
// Prints one line per finding; exit status 0 when every functional check passed.
//   build/bench/fp8wire-direct-probe [MiB] [probe,...]   (scripts/gpu/direct_probe.sh; default every probe)
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common/status.hpp"

namespace {

// A failed check ends this process at once: it is one of two forked probes, so no exit handlers.
[[noreturn]] void die() {
  std::fflush(stdout);
  _exit(1);
}


using WaitFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using AttrFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);
WaitFn wait_value = nullptr;
WriteFn write_value = nullptr;
AttrFn device_attr = nullptr;

void* entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  FP8WIRE_CUDA_OR(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q), die());
  if (!fn || q != cudaDriverEntryPointSuccess) {
    std::printf("FAIL entry point %s not found\n", name);
    _exit(1);
  }
  return fn;
}

// Shared segment: control words the two processes step through on the host, then the flags the
// GPUs use, then the bulk region.
struct Control {
  std::atomic<int> phase[2];
  std::atomic<int> go;
  cudaIpcMemHandle_t ipc;
  std::atomic<int> ipc_ok;
  double numbers[32];
};
constexpr size_t kFlagsAt = 4096;
constexpr size_t kBulkAt = 1 << 20;

struct Shared {
  char* base = nullptr;
  size_t bytes = 0;
  Control* ctl() const { return reinterpret_cast<Control*>(base); }
  uint32_t* flag(int i) const { return reinterpret_cast<uint32_t*>(base + kFlagsAt) + 64 * i; }  // own cache lines
  char* bulk() const { return base + kBulkAt; }
};

void step(Shared& s, int me, int phase) {  // host barrier between the two processes
  s.ctl()->phase[me].store(phase);
  while (s.ctl()->phase[1 - me].load() < phase) std::this_thread::yield();
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__global__ void count_kernel(unsigned* c) { atomicAdd(c, 1u); }

// Streams bytes src -> dst with 16-byte accesses; either side may be mapped host memory.
__global__ void copy16(const int4* __restrict__ src, int4* __restrict__ dst, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    int4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

__global__ void fill(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(i) * 2654435761u ^ seed;
}
__global__ void check(const uint32_t* p, size_t n, uint32_t seed, unsigned* bad) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (p[i] != (uint32_t(i) * 2654435761u ^ seed)) atomicAdd(bad, 1u);
}

CUdeviceptr dptr(void* host) {
  void* d = nullptr;
  FP8WIRE_CUDA_OR(cudaHostGetDevicePointer(&d, host, 0), die());
  return reinterpret_cast<CUdeviceptr>(d);
}

float time_ms(cudaStream_t st, const std::function<void()>& work, int reps = 5) {
  cudaEvent_t a, b;
  FP8WIRE_CUDA_OR(cudaEventCreate(&a), die());
  FP8WIRE_CUDA_OR(cudaEventCreate(&b), die());
  work();  // warm-up
  FP8WIRE_CUDA_OR(cudaStreamSynchronize(st), die());
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    FP8WIRE_CUDA_OR(cudaEventRecord(a, st), die());
    work();
    FP8WIRE_CUDA_OR(cudaEventRecord(b, st), die());
    FP8WIRE_CUDA_OR(cudaEventSynchronize(b), die());
    float ms = 0;
    FP8WIRE_CUDA_OR(cudaEventElapsedTime(&ms, a, b), die());
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  FP8WIRE_CUDA_OR(cudaEventDestroy(a), die());
  FP8WIRE_CUDA_OR(cudaEventDestroy(b), die());
  return t[t.size() / 2];
}

// The phase each process is in, for the watchdog: a phase that has not ended after its deadline is
// reported (with how far it got) and the process exits, so a hang is a finding, not a lost call.
std::atomic<int> g_phase{0};
std::atomic<double> g_phase_start{0};
const char* g_phase_name = "";
void enter(const char* name, int phase) {
  g_phase_name = name;
  g_phase_start = now_us();
  g_phase = phase;
}
void watchdog(int me, double deadline_s) {
  std::thread([me, deadline_s] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (g_phase > 0 && now_us() - g_phase_start > deadline_s * 1e6) {
        std::printf("HUNG: process %d stuck in phase '%s' for %.0f s\n", me, g_phase_name, deadline_s);
        std::fflush(stdout);
        _exit(3);
      }
    }
  }).detach();
}

__global__ void touch_kernel(unsigned* c, int n) {
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(c, 1u);
  for (int i = 0; i < n; ++i) __nanosleep(100);
}
// Spins until *flag != 0 (a peer's flag in host memory), the pattern that could starve another
// process's kernels on a shared GPU.
__global__ void spin_on_flag(const volatile uint32_t* flag) {
  while (*flag == 0) __nanosleep(1000);
}

// The duplex probe (above). Each process's window: two slots of `stage` bytes in the shared bulk
// region; flags in the shared page, counters that only grow (stage g of all calls), so no reset.
enum class Duplex {
  serial, free, flags, flags_ready, flags_done, flags_events, flags_memops, deep_events, ready_event_done_memop,
  ready_memop_done_event
};
constexpr Duplex kDuplexWays[] = {Duplex::serial,       Duplex::free,         Duplex::flags,
                                  Duplex::flags_ready,  Duplex::flags_done,   Duplex::flags_events,
                                  Duplex::flags_memops, Duplex::deep_events,  Duplex::ready_event_done_memop,
                                  Duplex::ready_memop_done_event};
constexpr int kDuplexWayCount = sizeof(kDuplexWays) / sizeof(kDuplexWays[0]);
constexpr int kDuplexMaxSlots = 4;
const char* duplex_name(Duplex d) {
  switch (d) {
    case Duplex::serial: return "one stream per process (D2H then H2D)";
    case Duplex::free: return "two streams, no handshake";
    case Duplex::flags: return "two streams, flag handshakes";
    case Duplex::flags_ready: return "  + event: transfer(i) after produce(i)";
    case Duplex::flags_done: return "  + event: produce(i+2) after transfer(i)";
    case Duplex::flags_events: return "two streams, flag handshakes and lane events";
    case Duplex::flags_memops: return "  the same lane order by memory operations";
    case Duplex::deep_events: return "  the same with four slots instead of two";
    case Duplex::ready_event_done_memop: return "  ready by event, reuse by memory operation";
    case Duplex::ready_memop_done_event: return "  ready by memory operation, reuse by event";
  }
  return "?";
}

// gated: each call's operations are all issued before any runs (the caller's stream waits on a host
// store made after the issue), so the time is the GPU's alone, not the host's issue rate.
int duplex(Shared& s, int me, size_t bulk_bytes, const std::function<void()>& sync_step, bool gated) {
  constexpr int kStages = 8;
  constexpr int kCalls = 7;  // the first warms up
  const size_t stage = std::min<size_t>(4u << 20, bulk_bytes / (2 * kDuplexMaxSlots)) / 256 * 256;
  // window[p]: process p's slots (two, or four in the deep way)
  char* window[2] = {s.bulk(), s.bulk() + kDuplexMaxSlots * stage};
  char *src = nullptr, *dst = nullptr;
  FP8WIRE_CUDA_OR(cudaMalloc(&src, kDuplexMaxSlots * stage), die());
  FP8WIRE_CUDA_OR(cudaMalloc(&dst, kDuplexMaxSlots * stage), die());
  FP8WIRE_CUDA_OR(cudaMemset(src, me + 1, kDuplexMaxSlots * stage), die());
  cudaStream_t produce, transfer, caller;
  for (cudaStream_t* st : {&produce, &transfer, &caller})
    FP8WIRE_CUDA_OR(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking), die());
  cudaEvent_t ready[kDuplexMaxSlots], done[kDuplexMaxSlots], fork, join_p, join_t, t0, t1;
  for (int k = 0; k < kDuplexMaxSlots; ++k) {
    FP8WIRE_CUDA_OR(cudaEventCreateWithFlags(&ready[k], cudaEventDisableTiming), die());
    FP8WIRE_CUDA_OR(cudaEventCreateWithFlags(&done[k], cudaEventDisableTiming), die());
  }
  for (cudaEvent_t* e : {&fork, &join_p, &join_t}) FP8WIRE_CUDA_OR(cudaEventCreateWithFlags(e, cudaEventDisableTiming), die());
  FP8WIRE_CUDA_OR(cudaEventCreate(&t0), die());
  FP8WIRE_CUDA_OR(cudaEventCreate(&t1), die());
  // ready_in[p]: stages process p may read (set by its peer); free_in[p]: stages whose slot p's peer
  // has finished reading (set by that peer). Fresh flags per way.
  const int peer = 1 - me;
  uint64_t g = 0;  // stages issued so far in this way
  static_assert(2 * kDuplexWayCount <= sizeof(Control::numbers) / sizeof(double), "both processes' medians in Control");
  double issue_ms[kDuplexWayCount] = {};  // process 0's host time to issue one call, per way (median)
  uint32_t* gate = s.flag(200 + me);
  uint32_t gate_seq = __atomic_load_n(gate, __ATOMIC_SEQ_CST);
  for (Duplex way : kDuplexWays) {
    const int base = 32 + 4 * static_cast<int>(way);
    const CUdeviceptr ready_in_me = dptr(s.flag(base + me)), ready_in_peer = dptr(s.flag(base + peer));
    const CUdeviceptr free_in_me = dptr(s.flag(base + 2 + me)), free_in_peer = dptr(s.flag(base + 2 + peer));
    const int local = 128 + 4 * static_cast<int>(way) + 2 * me;  // this process's lane flags
    const CUdeviceptr produced = dptr(s.flag(local)), transferred = dptr(s.flag(local + 1));
    g = 0;
    std::vector<float> times;
    std::vector<double> issue_us;  // host time to issue the call's operations
    sync_step();
    enter("duplex", 1);
    for (int call = 0; call < kCalls; ++call) {
      sync_step();  // both processes start each call together
      enter("duplex", 1);
      const double issue_begin = now_us();
      if (gated) FP8WIRE_DRIVER_OR(wait_value(caller, dptr(gate), gate_seq + 1, CU_STREAM_WAIT_VALUE_GEQ), die());
      FP8WIRE_CUDA_OR(cudaEventRecord(t0, caller), die());
      FP8WIRE_CUDA_OR(cudaEventRecord(fork, caller), die());
      const bool two = way != Duplex::serial;
      const bool handshakes = way != Duplex::serial && way != Duplex::free;
      const bool ready_event = way == Duplex::flags_ready || way == Duplex::flags_events || way == Duplex::deep_events ||
                               way == Duplex::ready_event_done_memop;
      const bool done_event = way == Duplex::flags_done || way == Duplex::flags_events || way == Duplex::deep_events ||
                              way == Duplex::ready_memop_done_event;
      const int slots = way == Duplex::deep_events ? kDuplexMaxSlots : 2;
      // The lanes' order of flags_events, by stream memory operations on this process's own flags
      // (stages that only grow: no reset) instead of events.
      const bool memops = way == Duplex::flags_memops;
      const bool ready_memop = memops || way == Duplex::ready_memop_done_event;
      const bool done_memop = memops || way == Duplex::ready_event_done_memop;
      cudaStream_t p_lane = two ? produce : caller, t_lane = two ? transfer : caller;
      if (two) {
        FP8WIRE_CUDA_OR(cudaStreamWaitEvent(produce, fork, 0), die());
        FP8WIRE_CUDA_OR(cudaStreamWaitEvent(transfer, fork, 0), die());
      }
      for (int i = 0; i < kStages; ++i, ++g) {
        const int slot = static_cast<int>(g % slots);
        // produce: reclaim the slot (the peer read stage g-slots from it), D2H, publish.
        const auto reused = static_cast<cuuint32_t>(g + 1 - slots);  // the stage that last used the slot, + 1
        if (done_event && i >= slots) FP8WIRE_CUDA_OR(cudaStreamWaitEvent(produce, done[slot], 0), die());
        if (done_memop && g >= 2) FP8WIRE_DRIVER_OR(wait_value(produce, transferred, reused, CU_STREAM_WAIT_VALUE_GEQ), die());
        if (handshakes && g >= static_cast<uint64_t>(slots)) FP8WIRE_DRIVER_OR(wait_value(p_lane, free_in_me, reused, CU_STREAM_WAIT_VALUE_GEQ), die());
        FP8WIRE_CUDA_OR(cudaMemcpyAsync(window[me] + slot * stage, src + slot * stage, stage, cudaMemcpyDeviceToHost, p_lane), die());
        if (handshakes) FP8WIRE_DRIVER_OR(write_value(p_lane, ready_in_peer, static_cast<cuuint32_t>(g + 1), 0), die());
        if (ready_memop) {
          FP8WIRE_DRIVER_OR(write_value(produce, produced, static_cast<cuuint32_t>(g + 1), 0), die());
          FP8WIRE_DRIVER_OR(wait_value(transfer, produced, static_cast<cuuint32_t>(g + 1), CU_STREAM_WAIT_VALUE_GEQ), die());
        }
        if (ready_event) {
          FP8WIRE_CUDA_OR(cudaEventRecord(ready[slot], produce), die());
          FP8WIRE_CUDA_OR(cudaStreamWaitEvent(transfer, ready[slot], 0), die());
        }
        // transfer: acquire the peer's stage, H2D, release its slot.
        if (handshakes) FP8WIRE_DRIVER_OR(wait_value(t_lane, ready_in_me, static_cast<cuuint32_t>(g + 1), CU_STREAM_WAIT_VALUE_GEQ), die());
        FP8WIRE_CUDA_OR(cudaMemcpyAsync(dst + slot * stage, window[peer] + slot * stage, stage, cudaMemcpyHostToDevice, t_lane), die());
        if (handshakes) FP8WIRE_DRIVER_OR(write_value(t_lane, free_in_peer, static_cast<cuuint32_t>(g + 1), 0), die());
        if (done_event) FP8WIRE_CUDA_OR(cudaEventRecord(done[slot], transfer), die());
        if (done_memop) FP8WIRE_DRIVER_OR(write_value(transfer, transferred, static_cast<cuuint32_t>(g + 1), 0), die());
      }
      if (two) {
        FP8WIRE_CUDA_OR(cudaEventRecord(join_p, produce), die());
        FP8WIRE_CUDA_OR(cudaEventRecord(join_t, transfer), die());
        FP8WIRE_CUDA_OR(cudaStreamWaitEvent(caller, join_p, 0), die());
        FP8WIRE_CUDA_OR(cudaStreamWaitEvent(caller, join_t, 0), die());
      }
      FP8WIRE_CUDA_OR(cudaEventRecord(t1, caller), die());
      const double issued = now_us() - issue_begin;
      if (gated) __atomic_store_n(gate, ++gate_seq, __ATOMIC_SEQ_CST);
      FP8WIRE_CUDA_OR(cudaEventSynchronize(t1), die());
      float t = 0;
      FP8WIRE_CUDA_OR(cudaEventElapsedTime(&t, t0, t1), die());
      if (call > 0) times.push_back(t), issue_us.push_back(issued);
    }
    std::sort(times.begin(), times.end());
    std::sort(issue_us.begin(), issue_us.end());
    s.ctl()->numbers[kDuplexWayCount * me + static_cast<int>(way)] = times[times.size() / 2];
    issue_ms[static_cast<int>(way)] = issue_us[issue_us.size() / 2] / 1e3;
  }
  sync_step();
  if (me == 0) {
    const double mib = static_cast<double>(kStages * stage) / (1 << 20);
    // Both processes' bytes cross the one link each way: the link's time at the pinned rates is
    // the slower direction's; "serial" is the sum of both directions.
    std::printf("duplex%s: 2 processes x %d stages of %.1f MiB each way per call (%.0f MiB per direction on the link), median of %d calls, slower process:\n",
                gated ? " (gated: every operation issued before any runs)" : "", kStages, static_cast<double>(stage) / (1 << 20), 2 * mib, kCalls - 1);
    for (Duplex way : kDuplexWays) {
      const int w = static_cast<int>(way);
      const double t = std::max(s.ctl()->numbers[w], s.ctl()->numbers[kDuplexWayCount + w]);
      std::printf("duplex: %-45s %.3f ms, %.1f GB/s per direction (%.2fx the one-stream time); issued in %.3f ms\n",
                  duplex_name(way), t, 2 * mib * (1 << 20) / (t * 1e6),
                  t / std::max(s.ctl()->numbers[0], s.ctl()->numbers[kDuplexWayCount]), issue_ms[w]);
    }
  }
  std::fflush(stdout);
  for (int k = 0; k < kDuplexMaxSlots; ++k) {
    cudaEventDestroy(ready[k]);
    cudaEventDestroy(done[k]);
  }
  for (cudaEvent_t e : {fork, join_p, join_t, t0, t1}) cudaEventDestroy(e);
  for (cudaStream_t st : {produce, transfer, caller}) cudaStreamDestroy(st);
  cudaFree(src);
  cudaFree(dst);
  return 0;
}

// The fused duplex probe (above): one kernel per process and call moves both directions, its thread
// blocks split into writers (device -> this process's host slot, then a ready flag per block) and
// readers (the peer's ready flag, host slot -> device, then a free flag per block); writer block c
// reuses a slot once the peer's reader block c has freed it. Flags are per block pair, so no block
// waits on more than one other; they only grow (stage g of all calls of one way).
struct FusedFlags {
  volatile uint32_t* ready_out;      // the peer's "stage g of block c is in my slot" (I write)
  const volatile uint32_t* ready_in;  // mine (the peer writes)
  volatile uint32_t* free_out;       // the peer's "I have read your slot" (I write)
  const volatile uint32_t* free_in;   // mine
};
constexpr int kFlagStride = 64;  // uint32 words: each flag its own cache line (Shared::flag)

__device__ void wait_geq(const volatile uint32_t* f, uint32_t v) {
  if (threadIdx.x == 0)
    while (*f < v) __nanosleep(200);
  __syncthreads();
}
__device__ void signal(volatile uint32_t* f, uint32_t v) {
  __syncthreads();  // every thread's accesses of the stage are done
  if (threadIdx.x == 0) {
    __threadfence_system();
    *f = v;
  }
}

__global__ void duplex_fused_kernel(const int4* __restrict__ src, int4* __restrict__ dst, int4* mine,
                                    const int4* peer_slots, FusedFlags f, uint32_t g0, int stages, int slots,
                                    size_t stage_vec, bool handshakes) {
  const int pairs = gridDim.x / 2;
  const bool writer = blockIdx.x < pairs;
  const int c = blockIdx.x % pairs;
  const size_t per = stage_vec / pairs;
  for (int i = 0; i < stages; ++i) {
    const uint32_t g = g0 + i;
    const size_t at = (g % slots) * stage_vec + c * per;
    if (writer) {
      if (handshakes && g >= static_cast<uint32_t>(slots)) wait_geq(f.free_in + c * kFlagStride, g + 1 - slots);
      for (size_t k = threadIdx.x; k < per; k += blockDim.x) mine[at + k] = src[at + k];
      if (handshakes) signal(f.ready_out + c * kFlagStride, g + 1);
    } else {
      if (handshakes) wait_geq(f.ready_in + c * kFlagStride, g + 1);
      for (size_t k = threadIdx.x; k < per; k += blockDim.x) dst[at + k] = __ldcv(peer_slots + at + k);
      if (handshakes) signal(f.free_out + c * kFlagStride, g + 1);
    }
  }
}

int duplex_fused(Shared& s, int me, size_t bulk_bytes, const std::function<void()>& sync_step) {
  constexpr int kStages = 8;
  constexpr int kCalls = 7;  // the first warms up
  constexpr int kSlots = 4;
  struct Way { int pairs, slots; bool handshakes; };
  constexpr Way kWays[] = {{16, 2, true}, {32, 2, true}, {64, 2, true}, {32, 4, true}, {32, 2, false}};
  constexpr int kWayCount = sizeof(kWays) / sizeof(kWays[0]);
  static_assert(2 * kWayCount <= sizeof(Control::numbers) / sizeof(double), "both processes' medians in Control");
  const size_t stage = std::min<size_t>(4u << 20, bulk_bytes / (2 * kSlots)) / (16 * 64 * 512) * (16 * 64 * 512);
  if (stage == 0) {
    std::printf("FAIL duplex_fused: the bulk region is too small for a stage\n");
    return 1;
  }
  const int peer = 1 - me;
  char* window[2] = {s.bulk(), s.bulk() + kSlots * stage};
  char *src = nullptr, *dst = nullptr;
  unsigned* bad = nullptr;
  FP8WIRE_CUDA_OR(cudaMalloc(&src, kSlots * stage), die());
  FP8WIRE_CUDA_OR(cudaMalloc(&dst, kSlots * stage), die());
  FP8WIRE_CUDA_OR(cudaMalloc(&bad, sizeof(unsigned)), die());
  FP8WIRE_CUDA_OR(cudaMemset(bad, 0, sizeof(unsigned)), die());
  fill<<<264, 256>>>(reinterpret_cast<uint32_t*>(src), kSlots * stage / 4, 100 + me);
  cudaStream_t st;
  FP8WIRE_CUDA_OR(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), die());
  cudaEvent_t t0, t1;
  FP8WIRE_CUDA_OR(cudaEventCreate(&t0), die());
  FP8WIRE_CUDA_OR(cudaEventCreate(&t1), die());
  FP8WIRE_CUDA_OR(cudaDeviceSynchronize(), die());
  auto dev = [](void* host) { return reinterpret_cast<uint32_t*>(dptr(host)); };
  for (int w = 0; w < kWayCount; ++w) {
    const Way way = kWays[w];
    // Fresh flags per way: [ready for process 0, ready for 1, free for 0, free for 1] x 64 blocks.
    const int base = 400 + w * 4 * 64;
    FusedFlags f;
    f.ready_out = dev(s.flag(base + 64 * peer));
    f.ready_in = dev(s.flag(base + 64 * me));
    f.free_out = dev(s.flag(base + 128 + 64 * peer));
    f.free_in = dev(s.flag(base + 128 + 64 * me));
    std::vector<float> times;
    uint32_t g = 0;
    for (int call = 0; call < kCalls; ++call, g += kStages) {
      sync_step();
      enter("duplex_fused", 1);
      FP8WIRE_CUDA_OR(cudaEventRecord(t0, st), die());
      duplex_fused_kernel<<<2 * way.pairs, 512, 0, st>>>(
          reinterpret_cast<const int4*>(src), reinterpret_cast<int4*>(dst), reinterpret_cast<int4*>(dptr(window[me])),
          reinterpret_cast<const int4*>(dptr(window[peer])), f, g, kStages, way.slots, stage / 16, way.handshakes);
      FP8WIRE_CUDA_OR(cudaGetLastError(), die());
      FP8WIRE_CUDA_OR(cudaEventRecord(t1, st), die());
      FP8WIRE_CUDA_OR(cudaEventSynchronize(t1), die());
      float t = 0;
      FP8WIRE_CUDA_OR(cudaEventElapsedTime(&t, t0, t1), die());
      if (call > 0) times.push_back(t);
    }
    std::sort(times.begin(), times.end());
    s.ctl()->numbers[kWayCount * me + w] = times[times.size() / 2];
    if (way.handshakes) {  // the stages last read hold the peer's pattern
      const size_t used = std::min(kSlots, way.slots) * stage;
      check<<<264, 256, 0, st>>>(reinterpret_cast<const uint32_t*>(dst), used / 4, 100 + peer, bad);
    }
  }
  unsigned b = 0;
  FP8WIRE_CUDA_OR(cudaMemcpy(&b, bad, sizeof b, cudaMemcpyDeviceToHost), die());
  sync_step();
  if (me == 0) {
    const double mib = static_cast<double>(kStages * stage) / (1 << 20);
    std::printf("duplex_fused: 2 processes x %d stages of %.1f MiB each way per call in one kernel each (%.0f MiB per direction on the link), median of %d calls, slower process:\n",
                kStages, static_cast<double>(stage) / (1 << 20), 2 * mib, kCalls - 1);
    for (int w = 0; w < kWayCount; ++w) {
      const double t = std::max(s.ctl()->numbers[w], s.ctl()->numbers[kWayCount + w]);
      std::printf("duplex_fused: %2d writer + %2d reader blocks, %d slots, %-13s %.3f ms, %.1f GB/s per direction\n",
                  kWays[w].pairs, kWays[w].pairs, kWays[w].slots, kWays[w].handshakes ? "flags" : "no handshake", t,
                  2 * mib * (1 << 20) / (t * 1e6));
    }
  }
  std::printf("duplex_fused: process %d read the peer's bytes with %u mismatches\n", me, b);
  std::fflush(stdout);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaStreamDestroy(st);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(bad);
  return b != 0;
}

int child(Shared s, int me, size_t bulk_bytes, const std::string& probes) {
  watchdog(me, 12);
  FP8WIRE_CUDA_OR(cudaSetDevice(0), die());
  wait_value = reinterpret_cast<WaitFn>(entry("cuStreamWaitValue32"));
  write_value = reinterpret_cast<WriteFn>(entry("cuStreamWriteValue32"));
  device_attr = reinterpret_cast<AttrFn>(entry("cuDeviceGetAttribute"));
  FP8WIRE_CUDA_OR(cudaHostRegister(s.base, s.bytes, cudaHostRegisterMapped | cudaHostRegisterPortable), die());
  cudaStream_t st;
  FP8WIRE_CUDA_OR(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), die());
  int fails = 0;
  int ph = 0;
  auto sync_step = [&] {
    g_phase = 0;
    step(s, me, ++ph);
  };
  // Both processes take the same probes, so they pass the same host barriers.
  auto want = [&](const char* name) { return probes.empty() || ("," + probes + ",").find(std::string(",") + name + ",") != std::string::npos; };

  // caps ---------------------------------------------------------------------------------------
  if (me == 0 && want("caps")) {
    int v = 0;
    FP8WIRE_CUDA_OR(cudaDeviceGetAttribute(&v, cudaDevAttrCanUseHostPointerForRegisteredMem, 0), die());
    std::printf("caps: host pointer usable for registered memory: %d\n", v);
    FP8WIRE_DRIVER_OR(device_attr(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, 0), die());
    std::printf("caps: stream wait NOR: %d\n", v);
    FP8WIRE_DRIVER_OR(device_attr(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 0), die());
    std::printf("caps: 64-bit stream mem ops: %d\n", v);
    FP8WIRE_CUDA_OR(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0), die());
    std::printf("caps: SMs %d\n", v);
    std::fflush(stdout);
  }
  sync_step();

  // pingpong across processes: memory operations only, then a kernel on each turn ---------------
  for (int with_kernel = 0; with_kernel < 2 && want("pingpong"); ++with_kernel) {
    enter(with_kernel ? "pingpong with a kernel per turn" : "pingpong", 1);
    const int iters = with_kernel ? 300 : 2000;
    CUdeviceptr f_ab = dptr(s.flag(with_kernel * 2)), f_ba = dptr(s.flag(with_kernel * 2 + 1));
    unsigned* counter = reinterpret_cast<unsigned*>(dptr(s.flag(20 + me)));
    sync_step();
    enter(with_kernel ? "pingpong with a kernel per turn" : "pingpong", 1);
    const double t0 = now_us();
    for (int i = 1; i <= iters; ++i) {
      if (me == 0) {
        if (with_kernel) touch_kernel<<<132, 128, 0, st>>>(counter, 10);
        FP8WIRE_DRIVER_OR(write_value(st, f_ab, i, 0), die());
        FP8WIRE_DRIVER_OR(wait_value(st, f_ba, i, CU_STREAM_WAIT_VALUE_GEQ), die());
      } else {
        FP8WIRE_DRIVER_OR(wait_value(st, f_ab, i, CU_STREAM_WAIT_VALUE_GEQ), die());
        if (with_kernel) touch_kernel<<<132, 128, 0, st>>>(counter, 10);
        FP8WIRE_DRIVER_OR(write_value(st, f_ba, i, 0), die());
      }
    }
    FP8WIRE_CUDA_OR(cudaStreamSynchronize(st), die());
    const double us = (now_us() - t0) / iters;
    if (me == 0)
      std::printf("pingpong: two processes, one GPU, host-memory flags%s: %.2f us per round trip\n",
                  with_kernel ? ", a 132-CTA kernel on each side per turn" : "", us);
    std::fflush(stdout);
    sync_step();
  }

  // graph: wait / reset / count captured and replayed, released by the host each time ------------
  if (me == 0 && want("graph")) {
    enter("graph", 1);
    uint32_t* f = s.flag(6);
    unsigned* counter = reinterpret_cast<unsigned*>(s.flag(7));
    *f = 0;
    *counter = 0;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    bool ok = true;
    FP8WIRE_CUDA_OR(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), die());
    CUresult r1 = wait_value(st, dptr(f), 1, CU_STREAM_WAIT_VALUE_EQ);
    CUresult r2 = write_value(st, dptr(f), 0, 0);
    count_kernel<<<1, 1, 0, st>>>(reinterpret_cast<unsigned*>(dptr(counter)));
    cudaError_t ce = cudaStreamEndCapture(st, &g);
    if (r1 != CUDA_SUCCESS || r2 != CUDA_SUCCESS || ce != cudaSuccess) {
      std::printf("graph: capture of stream memory operations FAILED (wait %d, write %d, end %s)\n", int(r1), int(r2),
                  cudaGetErrorString(ce));
      ok = false;
      cudaGetLastError();
    } else {
      FP8WIRE_CUDA_OR(cudaGraphInstantiate(&ge, g, 0), die());
      for (int rep = 1; rep <= 3; ++rep) {
        FP8WIRE_CUDA_OR(cudaGraphLaunch(ge, st), die());
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        const bool pending = cudaStreamQuery(st) == cudaErrorNotReady;
        __atomic_store_n(f, 1u, __ATOMIC_SEQ_CST);
        FP8WIRE_CUDA_OR(cudaStreamSynchronize(st), die());
        const unsigned c = __atomic_load_n(counter, __ATOMIC_SEQ_CST);
        const uint32_t fv = __atomic_load_n(f, __ATOMIC_SEQ_CST);
        if (!pending || c != unsigned(rep) || fv != 0) ok = false;
        std::printf("graph: replay %d: waited for the host %s, count %u, flag reset to %u\n", rep, pending ? "yes" : "NO", c, fv);
      }
    }
    std::printf("graph: %s\n", ok ? "ok" : "FAILED");
    fails += !ok;
    std::fflush(stdout);
  }
  sync_step();

  // ipc: process 0's device memory written by process 1 --------------------------------------------
  if (want("ipc")) {
    enter("ipc", 1);
    const size_t n = (64u << 20) / 4;
    uint32_t* mine = nullptr;
    unsigned* bad = nullptr;
    FP8WIRE_CUDA_OR(cudaMalloc(&bad, 4), die());
    FP8WIRE_CUDA_OR(cudaMemset(bad, 0, 4), die());
    if (me == 0) {
      FP8WIRE_CUDA_OR(cudaMalloc(&mine, n * 4), die());
      fill<<<264, 256, 0, st>>>(mine, n, 11);
      FP8WIRE_CUDA_OR(cudaStreamSynchronize(st), die());
      FP8WIRE_CUDA_OR(cudaIpcGetMemHandle(&s.ctl()->ipc, mine), die());
    }
    sync_step();
    enter("ipc", 1);
    if (me == 1) {
      void* peer = nullptr;
      cudaError_t e = cudaIpcOpenMemHandle(&peer, s.ctl()->ipc, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        std::printf("ipc: cudaIpcOpenMemHandle FAILED: %s\n", cudaGetErrorString(e));
        s.ctl()->ipc_ok = 0;
        fails++;
      } else {
        check<<<264, 256, 0, st>>>(static_cast<uint32_t*>(peer), n, 11, bad);
        fill<<<264, 256, 0, st>>>(static_cast<uint32_t*>(peer), n, 22);
        FP8WIRE_CUDA_OR(cudaStreamSynchronize(st), die());
        unsigned b = 0;
        FP8WIRE_CUDA_OR(cudaMemcpy(&b, bad, 4, cudaMemcpyDeviceToHost), die());
        std::printf("ipc: peer's pattern read with %u mismatches\n", b);
        s.ctl()->ipc_ok = b == 0 ? 1 : 0;
        fails += b != 0;
        FP8WIRE_CUDA_OR(cudaIpcCloseMemHandle(peer), die());
      }
    }
    sync_step();
    enter("ipc", 1);
    if (me == 0) {
      check<<<264, 256, 0, st>>>(mine, n, 22, bad);
      FP8WIRE_CUDA_OR(cudaStreamSynchronize(st), die());
      unsigned b = 0;
      FP8WIRE_CUDA_OR(cudaMemcpy(&b, bad, 4, cudaMemcpyDeviceToHost), die());
      std::printf("ipc: the other process's writes seen with %u mismatches: %s\n", b,
                  (b == 0 && s.ctl()->ipc_ok == 1) ? "ok" : "FAILED");
      fails += b != 0;
      FP8WIRE_CUDA_OR(cudaFree(mine), die());
    }
    FP8WIRE_CUDA_OR(cudaFree(bad), die());
    std::fflush(stdout);
    sync_step();
  }

  // bandwidth: process 0 alone, process 1 idle ---------------------------------------------------
  if (me == 0 && want("bandwidth")) {
    enter("bandwidth", 1);
    char* host = s.bulk();
    char* dev = nullptr;
    FP8WIRE_CUDA_OR(cudaMalloc(&dev, bulk_bytes), die());
    FP8WIRE_CUDA_OR(cudaMemset(dev, 1, bulk_bytes), die());
    char* host_dev = reinterpret_cast<char*>(dptr(host));
    const float d2h = time_ms(st, [&] { FP8WIRE_CUDA_OR(cudaMemcpyAsync(host, dev, bulk_bytes, cudaMemcpyDeviceToHost, st), die()); });
    const float h2d = time_ms(st, [&] { FP8WIRE_CUDA_OR(cudaMemcpyAsync(dev, host, bulk_bytes, cudaMemcpyHostToDevice, st), die()); });
    auto gbs = [&](float ms) { return bulk_bytes / (ms * 1e6); };
    std::printf("bandwidth: %zu MiB, cudaMemcpyAsync D2H %.1f GB/s, H2D %.1f GB/s (the pinned host-copy ceiling)\n",
                bulk_bytes >> 20, gbs(d2h), gbs(h2d));
    const size_t n16 = bulk_bytes / 16;
    for (int ctas : {1, 2, 4, 8, 16, 32, 66, 132}) {
      for (int threads : {512, 1024}) {
        const float st_ms = time_ms(st, [&] {
          copy16<<<ctas, threads, 0, st>>>(reinterpret_cast<const int4*>(dev), reinterpret_cast<int4*>(host_dev), n16);
        });
        const float ld_ms = time_ms(st, [&] {
          copy16<<<ctas, threads, 0, st>>>(reinterpret_cast<const int4*>(host_dev), reinterpret_cast<int4*>(dev), n16);
        });
        std::printf("bandwidth: %3d CTAs x %4d: kernel store to host %.1f GB/s (%.0f %% of D2H), load from host %.1f GB/s (%.0f %% of H2D)\n",
                    ctas, threads, gbs(st_ms), 100 * d2h / st_ms, gbs(ld_ms), 100 * h2d / ld_ms);
        std::fflush(stdout);
      }
    }
    FP8WIRE_CUDA_OR(cudaGetLastError(), die());
    FP8WIRE_CUDA_OR(cudaFree(dev), die());
  }
  sync_step();

  // starve: while process 1's stream waits (a memory-operation wait, then a spinning kernel) on a
  // flag nobody sets, process 0 launches 20 kernels of ~2 ms: how many run before a 3 s deadline,
  // and after the host releases process 1's wait. -------------------------------------------------
  for (int spin = 0; spin < 2 && want("starve"); ++spin) {
    const char* how = spin ? "a kernel spinning on a host flag" : "a stream memory-operation wait";
    uint32_t* f = s.flag(8 + spin);
    unsigned* ran = reinterpret_cast<unsigned*>(s.flag(10 + spin));
    std::atomic<int>& released = s.ctl()->go;
    if (me == 1) {
      *f = 0;
      if (spin) spin_on_flag<<<1, 32, 0, st>>>(reinterpret_cast<const volatile uint32_t*>(dptr(f)));
      else FP8WIRE_DRIVER_OR(wait_value(st, dptr(f), 1, CU_STREAM_WAIT_VALUE_EQ), die());
      count_kernel<<<1, 1, 0, st>>>(reinterpret_cast<unsigned*>(dptr(s.flag(12 + spin))));
    }
    sync_step();
    enter("starve", 1);
    if (me == 0) {
      *ran = 0;
      released = 0;
      const double t0 = now_us();
      for (int k = 0; k < 20; ++k) touch_kernel<<<132, 128, 0, st>>>(reinterpret_cast<unsigned*>(dptr(ran)), 20000);
      while (cudaStreamQuery(st) == cudaErrorNotReady && now_us() - t0 < 3e6) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const unsigned before = __atomic_load_n(ran, __ATOMIC_SEQ_CST);
      const double t_before = (now_us() - t0) / 1000;
      released = 1;  // process 1 now releases its wait
      FP8WIRE_CUDA_OR(cudaStreamSynchronize(st), die());
      std::printf("starve: while the other process waits by %s: %u/20 kernels of ~2 ms ran in %.1f ms%s; all 20 done %.1f ms after start\n",
                  how, before, t_before, before == 20 ? " (not starved)" : " (STARVED until released)", (now_us() - t0) / 1000);
    } else {
      while (released.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const bool still_waiting = cudaStreamQuery(st) == cudaErrorNotReady;
      const double t0 = now_us();
      __atomic_store_n(f, 1u, __ATOMIC_SEQ_CST);  // what an abort does: a host store releases the wait
      FP8WIRE_CUDA_OR(cudaStreamSynchronize(st), die());
      const bool after = __atomic_load_n(s.flag(12 + spin), __ATOMIC_SEQ_CST) == 1;
      std::printf("starve: %s still pending before release: %s; a host store released it in %.1f us; work after it ran: %s\n",
                  how, still_waiting ? "yes" : "NO", now_us() - t0, after ? "yes" : "NO");
      fails += !(still_waiting && after);
    }
    std::fflush(stdout);
    sync_step();
  }
  if (want("duplex")) fails += duplex(s, me, bulk_bytes, sync_step, false);
  if (want("duplex_gated")) fails += duplex(s, me, bulk_bytes, sync_step, true);
  if (want("duplex_fused")) fails += duplex_fused(s, me, bulk_bytes, sync_step);
  FP8WIRE_CUDA_OR(cudaHostUnregister(s.base), die());
  return fails;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  const std::string probes = argc > 2 ? argv[2] : "";  // e.g. "duplex,pingpong"; empty: every probe
  if (mib < 16) {
    std::printf("FAIL the bulk region: got %zu MiB, expected at least 16\n", mib);
    return 2;
  }
  const size_t bulk = mib << 20;
  Shared s;
  s.bytes = kBulkAt + bulk;
  char name[64];
  std::snprintf(name, sizeof name, "/fp8wire-direct-probe-%d", int(getpid()));
  const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(s.bytes)) != 0) {
    std::printf("FAIL shm_open/ftruncate %s: %s\n", name, std::strerror(errno));
    return 1;
  }
  s.base = static_cast<char*>(mmap(nullptr, s.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  shm_unlink(name);  // the mapping lives on; nothing is left behind if a process dies
  if (s.base == MAP_FAILED) {
    std::printf("FAIL mmap: %s\n", std::strerror(errno));
    return 1;
  }
  std::memset(s.base, 0, kBulkAt);
  // CUDA is first touched in the children (a CUDA context does not survive fork).
  pid_t pids[2];
  for (int me = 0; me < 2; ++me) {
    pids[me] = fork();
    if (pids[me] == 0) _exit(child(s, me, bulk, probes));
  }
  int fails = 0;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++fails;
  }
  std::printf("direct-probe: %s\n", fails ? "FAILED" : "all functional checks passed");
  return fails ? 1 : 0;
}
