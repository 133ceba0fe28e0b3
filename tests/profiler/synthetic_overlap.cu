// Validation workload for the exposure profiler (scripts/gpu/profiler.sh runs it under
// libfp8wire_prof.so). N ranks on GPU 0, each a fresh process started by the project's launcher
// (common/rank_launcher.hpp: its own NCCL_HOSTID, so NCCL joins them over sockets; side by side under
// a private MPS daemon where one can be started, FP8WIRE_MPS=0 for time slicing). Each step is an NVTX range "step <n>" and runs one scenario:
//   overlap   compute kernel (spins a known time) on one stream, all-reduce on another: hidden
//   serial    the all-reduce waits for the compute kernel (event dependency): fully exposed
//   partial   the all-reduce starts after 3/4 of the compute: partly exposed
//   delayed   as serial, but the last rank starts its compute --delay-ms late (a host sleep), so
//             every other rank's all-reduce waits that long for its peer. Not in the
//             default list; its designed wait (designed_delay_ms) checks the profiler's split of
//             exposed time into waiting for peers and moving data (the direct transports' waits)
//   launches  1000 short compute kernels (host launch rate; for the overhead figure), launched by 8
//             fresh threads per step: CUPTI keeps a buffer per recording thread, so this also checks
//             that no record is dropped or late when many threads launch (the trainer's case)
//   bucketed  "backward": L layers, one small all-reduce per layer issued as its gradient is ready
//   merged    the same bytes as one all-reduce after the last layer (the coalescing lesson)
// The designed figures come from CUDA events around every kernel, measured independently of the
// profiler: designed exposed = |union(all-reduces) \ union(compute)|. Each rank writes them, with
// the host-measured step time, to DIR/designed.rank<R>.jsonl (--designed-dir DIR).
//
// Exit codes: 0 ok, 77 no CUDA device (skipped), 1 failure.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <nvtx3/nvToolsExt.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/rank_launcher.hpp"
#include "common/status.hpp"

namespace {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A compute kernel of known length: one thread spins on the global timer.
__global__ void spin_kernel(uint64_t ns) {
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
  }
}

struct Options {
  int ranks = 2;
  int steps = 5;
  std::string scenarios = "overlap,serial,partial,launches,bucketed,merged";
  std::string designed_dir;
  double compute_ms = 20;
  size_t ar_bytes = 4 << 20;
  int layers = 8;
  double layer_ms = 15;
  size_t bucket_bytes = 4 << 20;
  double delay_ms = 5;
  std::string nccl_id_hex;  // set: this process is a rank (RANK from the launcher)
};

struct Span {
  double begin, end;  // ms from the step's reference event
};

std::vector<Span> merged(std::vector<Span> parts) {
  std::sort(parts.begin(), parts.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  std::vector<Span> out;
  for (const Span& p : parts) {
    if (!out.empty() && p.begin <= out.back().end) out.back().end = std::max(out.back().end, p.end);
    else out.push_back(p);
  }
  return out;
}

double total(const std::vector<Span>& parts) {
  double t = 0;
  for (const Span& p : merged(parts)) t += p.end - p.begin;
  return t;
}

// |x \ union(cover)|
double uncovered(Span x, const std::vector<Span>& cover) {
  double covered = 0;
  for (const Span& c : merged(cover)) covered += std::max(0.0, std::min(c.end, x.end) - std::max(c.begin, x.begin));
  return (x.end - x.begin) - covered;
}

// Events recorded on either stream, all timed against the first one of the step.
class Timeline {
 public:
  explicit Timeline(int capacity) : events_(capacity) {
    for (auto& e : events_) FP8WIRE_CUDA_OR_EXIT(cudaEventCreate(&e));
  }
  void reset(cudaStream_t s) {
    used_ = 1;
    FP8WIRE_CUDA_OR_EXIT(cudaEventRecord(events_[0], s));
  }
  int mark(cudaStream_t s) {
    if (used_ >= static_cast<int>(events_.size())) {
      std::fprintf(stderr, "FAIL: too many timeline events in one step\n");
      std::exit(1);
    }
    FP8WIRE_CUDA_OR_EXIT(cudaEventRecord(events_[used_], s));
    return used_++;
  }
  double at(int i) const {
    float ms = 0;
    FP8WIRE_CUDA_OR_EXIT(cudaEventElapsedTime(&ms, events_[0], events_[i]));
    return ms;
  }
  cudaEvent_t event(int i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
  int used_ = 0;
};

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  for (size_t start = 0; start <= list.size();) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    if (comma > start) out.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

int run_rank(const Options& opt, int rank) {
  ncclUniqueId id;
  if (opt.nccl_id_hex.size() != 2 * sizeof(id.internal)) {
    std::fprintf(stderr, "FAIL: --nccl-id must be %zu hex digits\n", 2 * sizeof(id.internal));
    return 1;
  }
  for (size_t i = 0; i < sizeof(id.internal); ++i)
    id.internal[i] = static_cast<char>(std::stoi(opt.nccl_id_hex.substr(2 * i, 2), nullptr, 16));
  FP8WIRE_CUDA_OR_EXIT(cudaSetDevice(0));
  ncclComm_t comm;
  FP8WIRE_NCCL_OR_EXIT(ncclCommInitRank(&comm, opt.ranks, id, rank));

  cudaStream_t compute, comms;
  FP8WIRE_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  FP8WIRE_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&comms, cudaStreamNonBlocking));
  const size_t big = std::max(opt.ar_bytes, opt.bucket_bytes * opt.layers);
  float* buffer = nullptr;
  float* barrier = nullptr;
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&buffer, big));
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&barrier, sizeof(float)));
  FP8WIRE_CUDA_OR_EXIT(cudaMemset(buffer, 0, big));
  Timeline tl(4 * opt.layers + 16);
  const uint64_t compute_ns = static_cast<uint64_t>(opt.compute_ms * 1e6);
  const uint64_t layer_ns = static_cast<uint64_t>(opt.layer_ms * 1e6);

  // Between steps, outside any window: lines the ranks up so each step starts together.
  auto sync_ranks = [&] {
    FP8WIRE_NCCL_OR_EXIT(ncclAllReduce(barrier, barrier, 1, ncclFloat32, ncclSum, comm, comms));
    FP8WIRE_CUDA_OR_EXIT(cudaStreamSynchronize(comms));
    FP8WIRE_CUDA_OR_EXIT(cudaStreamSynchronize(compute));
  };
  size_t step_bytes = 0;  // bytes all-reduced inside the current step
  auto all_reduce = [&](const char* range, void* data, size_t bytes) {
    step_bytes += bytes;
    nvtxRangePushA(range);
    FP8WIRE_NCCL_OR_EXIT(ncclAllReduce(data, data, bytes / sizeof(float), ncclFloat32, ncclSum, comm, comms));
    nvtxRangePop();
  };
  // Warm-up: NCCL connects lazily on first use.
  for (int i = 0; i < 3; ++i) {
    all_reduce("warmup", buffer, big);
    all_reduce("warmup", buffer, opt.bucket_bytes);
    spin_kernel<<<1, 1, 0, compute>>>(1000000);
    sync_ranks();
  }

  FILE* designed = nullptr;
  if (!opt.designed_dir.empty()) {
    const std::string path = opt.designed_dir + "/designed.rank" + std::to_string(rank) + ".jsonl";
    designed = std::fopen(path.c_str(), "w");
    if (!designed) {
      std::fprintf(stderr, "FAIL: cannot write %s\n", path.c_str());
      return 1;
    }
  }

  std::map<std::string, std::pair<double, int>> host_step_ms;  // sum, count
  int step = 0;
  for (const std::string& scenario : split(opt.scenarios)) {
    for (int s = 0; s < opt.steps; ++s, ++step) {
      sync_ranks();
      char name[64];
      std::snprintf(name, sizeof name, "step %d", step);
      const auto host_begin = std::chrono::steady_clock::now();
      nvtxRangePushA(name);
      step_bytes = 0;
      tl.reset(compute);
      std::vector<std::pair<int, int>> compute_marks, comm_marks;
      if (scenario == "overlap") {
        FP8WIRE_CUDA_OR_EXIT(cudaStreamWaitEvent(comms, tl.event(0)));
        const int c0 = tl.mark(compute);
        spin_kernel<<<1, 1, 0, compute>>>(compute_ns);
        compute_marks.push_back({c0, tl.mark(compute)});
        const int a0 = tl.mark(comms);
        all_reduce("allreduce_overlap", buffer, opt.ar_bytes);
        comm_marks.push_back({a0, tl.mark(comms)});
      } else if (scenario == "serial" || scenario == "delayed") {
        // delayed: the late rank starts its compute late (a host sleep before the launch), so its
        // all-reduce, queued behind that compute like every rank's, reaches its peers delay_ms late.
        if (scenario == "delayed" && rank == opt.ranks - 1)
          std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(opt.delay_ms));
        const int c0 = tl.mark(compute);
        spin_kernel<<<1, 1, 0, compute>>>(compute_ns);
        const int c1 = tl.mark(compute);
        compute_marks.push_back({c0, c1});
        FP8WIRE_CUDA_OR_EXIT(cudaStreamWaitEvent(comms, tl.event(c1)));
        const int a0 = tl.mark(comms);
        all_reduce(scenario == "serial" ? "allreduce_serial" : "allreduce_delayed", buffer, opt.ar_bytes);
        comm_marks.push_back({a0, tl.mark(comms)});
      } else if (scenario == "partial") {
        const int c0 = tl.mark(compute);
        spin_kernel<<<1, 1, 0, compute>>>(compute_ns * 3 / 4);
        const int c1 = tl.mark(compute);
        spin_kernel<<<1, 1, 0, compute>>>(compute_ns / 4);
        compute_marks.push_back({c0, c1});
        compute_marks.push_back({c1, tl.mark(compute)});
        FP8WIRE_CUDA_OR_EXIT(cudaStreamWaitEvent(comms, tl.event(c1)));
        const int a0 = tl.mark(comms);
        all_reduce("allreduce_partial", buffer, opt.ar_bytes);
        comm_marks.push_back({a0, tl.mark(comms)});
      } else if (scenario == "launches") {
        const int c0 = tl.mark(compute);
        std::vector<std::thread> launchers;
        for (int t = 0; t < 8; ++t)
          launchers.emplace_back([compute] {
            nvtxRangePushA("launcher");  // each launch then also carries an external-correlation record
            for (int k = 0; k < 125; ++k) spin_kernel<<<1, 1, 0, compute>>>(20000);
            nvtxRangePop();
          });
        for (std::thread& t : launchers) t.join();
        compute_marks.push_back({c0, tl.mark(compute)});  // back-to-back kernels; gaps are launch gaps
      } else if (scenario == "bucketed" || scenario == "merged") {
        int last_ready = 0;
        for (int l = 0; l < opt.layers; ++l) {
          const int c0 = tl.mark(compute);
          spin_kernel<<<1, 1, 0, compute>>>(layer_ns);
          last_ready = tl.mark(compute);
          compute_marks.push_back({c0, last_ready});
          if (scenario == "bucketed") {
            FP8WIRE_CUDA_OR_EXIT(cudaStreamWaitEvent(comms, tl.event(last_ready)));
            const int a0 = tl.mark(comms);
            char range[32];
            std::snprintf(range, sizeof range, "grad_bucket_%d", l);
            all_reduce(range, reinterpret_cast<char*>(buffer) + l * opt.bucket_bytes, opt.bucket_bytes);
            comm_marks.push_back({a0, tl.mark(comms)});
          }
        }
        if (scenario == "merged") {
          FP8WIRE_CUDA_OR_EXIT(cudaStreamWaitEvent(comms, tl.event(last_ready)));
          const int a0 = tl.mark(comms);
          all_reduce("merged_allreduce", buffer, opt.bucket_bytes * opt.layers);
          comm_marks.push_back({a0, tl.mark(comms)});
        }
      } else {
        std::fprintf(stderr,
                     "FAIL: unknown scenario '%s' (expected overlap, serial, partial, delayed, launches, bucketed, merged)\n",
                     scenario.c_str());
        return 1;
      }
      FP8WIRE_CUDA_OR_EXIT(cudaStreamSynchronize(compute));
      FP8WIRE_CUDA_OR_EXIT(cudaStreamSynchronize(comms));
      nvtxRangePop();
      const double host_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_begin).count();
      auto& [sum, n] = host_step_ms[scenario];
      sum += host_ms;
      ++n;

      std::vector<Span> computes, comm_spans;
      for (auto [b, e] : compute_marks) computes.push_back({tl.at(b), tl.at(e)});
      for (auto [b, e] : comm_marks) comm_spans.push_back({tl.at(b), tl.at(e)});
      double exposed = 0;
      for (const Span& m : merged(comm_spans)) exposed += uncovered(m, computes);
      const double last_exposed = comm_spans.empty() ? 0 : uncovered(comm_spans.back(), computes);
      // The wait designed into the step: the late rank's host sleep, seen by every other rank.
      const double delay = scenario == "delayed" && rank != opt.ranks - 1 ? opt.delay_ms : 0.0;
      if (designed)
        std::fprintf(designed,
                     "{\"step\":%d,\"scenario\":\"%s\",\"designed_compute_ms\":%.4f,\"designed_comm_ms\":%.4f,"
                     "\"designed_exposed_ms\":%.4f,\"designed_last_collective_exposed_ms\":%.4f,"
                     "\"designed_delay_ms\":%.4f,\"host_step_ms\":%.4f,\"allreduce_bytes\":%zu}\n",
                     step, scenario.c_str(), total(computes), total(comm_spans), exposed, last_exposed, delay,
                     host_ms, step_bytes);
    }
  }
  if (designed) std::fclose(designed);
  if (rank == 0) {
    std::printf("synthetic_overlap rank 0: mean host step time per scenario\n");
    for (const auto& [scenario, v] : host_step_ms)
      std::printf("  %-10s %9.3f ms  (%d steps)\n", scenario.c_str(), v.first / v.second, v.second);
  }
  // Resolved at run time: the same program, without the profiler, is the overhead baseline.
  using flush_fn = void (*)();
  if (auto flush = reinterpret_cast<flush_fn>(dlsym(RTLD_DEFAULT, "fp8wire_prof_flush"))) flush();
  FP8WIRE_NCCL_OR_EXIT(ncclCommDestroy(comm));
  FP8WIRE_CUDA_OR_EXIT(cudaFree(buffer));
  FP8WIRE_CUDA_OR_EXIT(cudaFree(barrier));
  return 0;
}

void usage() {
  std::fprintf(stderr,
               "usage: synthetic_overlap [--ranks N] [--steps N] [--scenarios a,b,...] [--designed-dir DIR]\n"
               "       [--compute-ms MS] [--ar-bytes B] [--layers L] [--layer-ms MS] [--bucket-bytes B] [--delay-ms MS]\n");
}

bool parse(int argc, char** argv, Options& opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* what) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "FAIL: %s needs a value (%s)\n", a.c_str(), what);
        std::exit(1);
      }
      return argv[++i];
    };
    auto number = [&](const char* what) -> double {
      const char* v = value(what);
      char* end = nullptr;
      const double d = std::strtod(v, &end);
      if (!end || *end || d < 0) {
        std::fprintf(stderr, "FAIL: %s: '%s' is not %s\n", a.c_str(), v, what);
        std::exit(1);
      }
      return d;
    };
    if (a == "--ranks") opt.ranks = static_cast<int>(number("a rank count"));
    else if (a == "--steps") opt.steps = static_cast<int>(number("a step count"));
    else if (a == "--scenarios") opt.scenarios = value("a comma-separated list");
    else if (a == "--designed-dir") opt.designed_dir = value("a folder");
    else if (a == "--compute-ms") opt.compute_ms = number("milliseconds");
    else if (a == "--ar-bytes") opt.ar_bytes = static_cast<size_t>(number("bytes"));
    else if (a == "--layers") opt.layers = static_cast<int>(number("a layer count"));
    else if (a == "--layer-ms") opt.layer_ms = number("milliseconds");
    else if (a == "--bucket-bytes") opt.bucket_bytes = static_cast<size_t>(number("bytes"));
    else if (a == "--delay-ms") opt.delay_ms = number("milliseconds");
    else if (a == "--nccl-id") opt.nccl_id_hex = value("hex digits");
    else {
      usage();
      std::fprintf(stderr, "FAIL: unknown argument '%s'\n", a.c_str());
      return false;
    }
  }
  if (opt.ranks < 1 || opt.steps < 1 || opt.layers < 1) {
    std::fprintf(stderr, "FAIL: --ranks, --steps and --layers must be at least 1\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, opt)) return 1;
  if (!opt.nccl_id_hex.empty()) {
    std::string error;
    const auto env = fp8wire::rank_env_from_environment(error);
    if (!env) {
      std::fprintf(stderr, "FAIL: --nccl-id given but not started as a rank: %s\n", error.empty() ? "RANK not set" : error.c_str());
      return 1;
    }
    return run_rank(opt, env->rank);
  }

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  // The unique id is made here and handed to every rank. Ranks are fresh processes (exec), so each
  // has NCCL_HOSTID and RANK before anything initialises, and a preloaded profiler starts clean.
  ncclUniqueId id;
  FP8WIRE_NCCL_OR_EXIT(ncclGetUniqueId(&id));
  std::string hex;
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    char byte[3];
    std::snprintf(byte, sizeof byte, "%02x", static_cast<unsigned char>(id.internal[i]));
    hex += byte;
  }
  fp8wire::LaunchSpec spec;
  spec.argv = {"/proc/self/exe"};
  spec.argv.insert(spec.argv.end(), argv + 1, argv + argc);
  spec.argv.insert(spec.argv.end(), {"--nccl-id", hex});
  spec.nranks = opt.ranks;
  spec.timeout_s = 0;  // the caller's limit (ctest, the GPU script) applies
  spec.one_gpu = true;
  const fp8wire::LaunchResult res = fp8wire::launch_local_ranks(spec);
  int failures = 0;
  for (int code : res.exit_codes) failures += code != 0;
  if (!res.ok) std::fprintf(stderr, "FAIL: %s\n", res.error.c_str());
  std::printf("%s: synthetic_overlap %d ranks (%d failed), %s\n", failures ? "FAIL" : "PASS", opt.ranks, failures,
              res.testbed_note.c_str());
  return failures ? 1 : 0;
}
