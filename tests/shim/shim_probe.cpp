// A small "job" that the shim tests start as a sub-process, so every scenario gets a fresh process
// (the shim's state is process-wide and set up once). It reaches NCCL the way the scenario says:
//   --mode linked   linked against the fake libnccl.so.2, run under LD_PRELOAD (RTLD_NEXT path);
//                   only in shim_probe_linked
//   --mode noload   dlopen the fake RTLD_LOCAL, then dlopen libfp8wire.so (RTLD_NOLOAD path, as
//                   under PyTorch)
//   --mode dlopen   dlopen only libfp8wire.so (explicit nccl.library path, or no NCCL at all)
// and runs a script: all (every export once), reenter, capi, bench. It prints "rc <fn> <code>"
// lines, then the fake's record between "fake-log-begin" and "fake-log-end".
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "probe_script.hpp"
#include "shim/fp8wire.h"
#ifdef PROBE_LINKED
#include "sched/platform/nccl_api_linked.hpp"
#endif

namespace {

struct FakeControls {
  const char* (*log)() = nullptr;
  void (*configure)(int comm_count, int user_rank, int reenter, int recording) = nullptr;
};

FakeControls controls_from(void* handle) {
  FakeControls c;
  if (!handle) return c;
  c.log = reinterpret_cast<const char* (*)()>(dlsym(handle, "fake_nccl_log"));
  c.configure = reinterpret_cast<void (*)(int, int, int, int)>(dlsym(handle, "fake_nccl_configure"));
  return c;
}

fp8wire::NcclApi api_from(void* handle) {
  fp8wire::NcclApi api;
#define FP8WIRE_NCCL_FN(name) api.name = reinterpret_cast<decltype(api.name)>(dlsym(handle, "nccl" #name));
#include "sched/platform/nccl_functions.def"
#undef FP8WIRE_NCCL_FN
  return api;
}

double thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// Median over repeats of the mean CPU time of one call; CPU time, not wall time, so a busy CI
// machine that deschedules us does not inflate the figure.
template <class Fn>
double ns_per_call(Fn&& call) {
  constexpr int kCalls = 100000, kRepeats = 7;
  for (int i = 0; i < kCalls / 10; ++i) call();  // warm-up: set-up, caches, branch predictors
  std::vector<double> means;
  for (int r = 0; r < kRepeats; ++r) {
    const double t0 = thread_cpu_ns();
    for (int i = 0; i < kCalls; ++i) call();
    means.push_back((thread_cpu_ns() - t0) / kCalls);
  }
  std::sort(means.begin(), means.end());
  return means[kRepeats / 2];
}

// One of the C API's totals as an application reads it: a null argument must be harmless, and every
// byte of the struct gets written (it starts as 0xff).
template <class Totals>
Totals read_totals(void (*get)(Totals*)) {
  get(nullptr);
  Totals t;
  std::memset(&t, 0xff, sizeof(t));
  get(&t);
  return t;
}

template <class Totals>
unsigned long long calls_of(const Totals& t) {
  unsigned long long n = 0;
  for (uint64_t c : t.calls) n += c;
  return n;
}

// The C API's names of slots -1 .. `slots` ("null" for none, "-" for an unused slot), comma-separated;
// "*" after those `starred` says.
std::string names_of(const char* (*name)(int), int slots, int (*starred)(int) = nullptr) {
  std::string names;
  for (int i = -1; i <= slots; ++i) {
    const char* n = name(i);
    names += n ? (*n ? n : "-") : "null";
    if (starred && starred(i)) names += "*";
    names += i < slots ? "," : "";
  }
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, script = "all", shim_path, fake_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mode") mode = argv[i + 1];
    else if (flag == "--script") script = argv[i + 1];
    else if (flag == "--shim") shim_path = argv[i + 1];
    else if (flag == "--fake") fake_path = argv[i + 1];
  }

  fp8wire::NcclApi api;
  void* shim = nullptr;  // where the fp8wire_* C API is looked up
  void* fake = nullptr;  // where the fake's controls are looked up (may be null until after the calls)
  if (mode == "linked") {
#ifdef PROBE_LINKED
    api = fp8wire::nccl_api_from_linked();  // binds like any linked job: to the preloaded shim first
    shim = RTLD_DEFAULT;
    fake = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD);  // the fake this binary was linked with
#else
    std::fprintf(stderr, "--mode linked needs shim_probe_linked\n");
    return 2;
#endif
  } else if (mode == "noload" || mode == "dlopen") {
    if (mode == "noload" && !(fake = dlopen(fake_path.c_str(), RTLD_NOW | RTLD_LOCAL))) {
      std::fprintf(stderr, "cannot load the fake NCCL: %s\n", dlerror());
      return 2;
    }
    if (!(shim = dlopen(shim_path.c_str(), RTLD_NOW | RTLD_LOCAL))) {
      std::fprintf(stderr, "cannot load the shim: %s\n", dlerror());
      return 2;
    }
    api = api_from(shim);
  } else {
    std::fprintf(stderr, "usage: %s --mode linked|noload|dlopen --script all|reenter|initall|capi|bench --shim P --fake P\n",
                 argv[0]);
    return 2;
  }

  FakeControls controls = controls_from(fake);
  // The user rank shows in the shim's log prefix once the first communicator exists.
  if (controls.configure) controls.configure(2, 1, script == "reenter", script != "bench");

  probe::Results results;
  if (script == "all") {
    results = probe::run_all(api);
  } else if (script == "reenter") {
    ncclComm_t comm = nullptr;
    results.emplace_back("ncclCommInitRank", api.CommInitRank(&comm, 2, probe::unique_id(1), 1));
    for (int i = 0; i < 2; ++i)
      results.emplace_back("ncclAllReduce", api.AllReduce(probe::ptr(probe::kSend), probe::ptr(probe::kRecv), 1000,
                                                          ncclFloat32, ncclSum, comm, probe::stream()));
  } else if (script == "initall") {
    // One thread drives both ranks of an ncclCommInitAll clique, so their calls sit in one group;
    // 128 MiB of bf16 each, above every default threshold.
    ncclComm_t comms[2] = {};
    const int devlist[2] = {0, 1};
    results.emplace_back("ncclCommInitAll", api.CommInitAll(comms, 2, devlist));
    results.emplace_back("ncclGroupStart", api.GroupStart());
    for (ncclComm_t comm : comms)
      results.emplace_back("ncclAllReduce", api.AllReduce(probe::ptr(probe::kSend), probe::ptr(probe::kRecv),
                                                          64u << 20, ncclBfloat16, ncclSum, comm, probe::stream()));
    results.emplace_back("ncclGroupEnd", api.GroupEnd());
    // Their split (one thread, one group) is a single-process clique as well.
    ncclComm_t children[2] = {};
    results.emplace_back("ncclGroupStart", api.GroupStart());
    for (int i = 0; i < 2; ++i) results.emplace_back("ncclCommSplit", api.CommSplit(comms[i], 0, i, &children[i], nullptr));
    results.emplace_back("ncclGroupEnd", api.GroupEnd());
    results.emplace_back("ncclGroupStart", api.GroupStart());
    for (ncclComm_t comm : children)
      results.emplace_back("ncclAllReduce", api.AllReduce(probe::ptr(probe::kSend), probe::ptr(probe::kRecv),
                                                          64u << 20, ncclBfloat16, ncclSum, comm, probe::stream()));
    results.emplace_back("ncclGroupEnd", api.GroupEnd());
  } else if (script == "capi") {
    auto version = reinterpret_cast<int (*)()>(dlsym(shim, "fp8wire_version"));
    auto totals = reinterpret_cast<void (*)(fp8wire_totals*)>(dlsym(shim, "fp8wire_get_totals"));
    auto step_begin = reinterpret_cast<void (*)(int64_t)>(dlsym(shim, "fp8wire_step_begin"));
    auto step_end = reinterpret_cast<void (*)(int64_t)>(dlsym(shim, "fp8wire_step_end"));
    auto flush = reinterpret_cast<void (*)()>(dlsym(shim, "fp8wire_profiler_flush"));
    auto active = reinterpret_cast<int (*)()>(dlsym(shim, "fp8wire_active"));
    auto path_name = reinterpret_cast<const char* (*)(int)>(dlsym(shim, "fp8wire_path_name"));
    auto path_is_fp8 = reinterpret_cast<int (*)(int)>(dlsym(shim, "fp8wire_path_is_fp8"));
    auto transport_name = reinterpret_cast<const char* (*)(int)>(dlsym(shim, "fp8wire_transport_name"));
    auto transport_totals =
        reinterpret_cast<void (*)(fp8wire_transport_totals*)>(dlsym(shim, "fp8wire_get_transport_totals"));
    if (!version || !totals || !step_begin || !step_end || !flush || !active || !path_name || !path_is_fp8 ||
        !transport_name || !transport_totals) {
      std::printf("capi missing\n");
      return 3;
    }
    // Before any NCCL call the answer comes from the configuration alone (no set-up).
    std::printf("capi active_before=%d\n", active());
    ncclComm_t comm = nullptr;
    api.CommInitRank(&comm, 2, probe::unique_id(1), 0);
    api.AllReduce(probe::ptr(probe::kSend), probe::ptr(probe::kRecv), 1000, ncclFloat32, ncclSum, comm, probe::stream());
    std::printf("capi active_after=%d\n", active());
    std::printf("capi paths=%s\n", names_of(path_name, FP8WIRE_MAX_PATHS, path_is_fp8).c_str());
    step_begin(1);
    step_end(1);
    flush();
    const fp8wire_totals t = read_totals(totals);
    std::printf("capi version=%d calls=%llu dropped=%llu\n", version(), calls_of(t),
                static_cast<unsigned long long>(t.dropped_records));
    const fp8wire_transport_totals by_transport = read_totals(transport_totals);
    // Every call here is a pass-through: NCCL's transport carried all of them.
    std::printf("capi transports=%s carried=%llu nccl=%llu\n", names_of(transport_name, FP8WIRE_MAX_TRANSPORTS).c_str(),
                calls_of(by_transport), static_cast<unsigned long long>(by_transport.calls[0]));
    auto collective_name = reinterpret_cast<const char* (*)(int)>(dlsym(shim, "fp8wire_collective_name"));
    std::string collectives;
    for (int i = -1; collective_name && i <= FP8WIRE_MAX_COLLECTIVES; ++i) {
      const char* n = collective_name(i);
      collectives += n ? (*n ? n : "-") : "null";
      collectives += i < FP8WIRE_MAX_COLLECTIVES ? "," : "";
    }
    std::printf("capi collectives=%s\n", collectives.c_str());
    // Totals by the NCCL function called, in this layout and in an older, smaller one (calls only).
    auto kind_name = reinterpret_cast<const char* (*)(int)>(dlsym(shim, "fp8wire_call_kind_name"));
    auto kind_totals = reinterpret_cast<void (*)(fp8wire_kind_totals*)>(dlsym(shim, "fp8wire_get_kind_totals"));
    if (kind_name && kind_totals) {
      fp8wire_kind_totals k{};
      k.size = sizeof(k);
      kind_totals(&k);
      fp8wire_kind_totals older;
      std::memset(&older, 0xab, sizeof(older));
      older.size = offsetof(fp8wire_kind_totals, app_bytes);
      kind_totals(&older);
      unsigned long long all_reduce = 0, older_all_reduce = 0;
      for (int p = 0; p < FP8WIRE_MAX_PATHS; ++p) all_reduce += k.calls[0][p], older_all_reduce += older.calls[0][p];
      std::printf("capi kinds=%s all_reduce_calls=%llu app_bytes=%llu plain_wire_bytes=%llu size_ok=%d "
                  "older_calls=%llu older_tail_untouched=%d\n",
                  names_of(kind_name, FP8WIRE_MAX_CALL_KINDS).c_str(), all_reduce,
                  static_cast<unsigned long long>(k.app_bytes[0]), static_cast<unsigned long long>(k.plain_wire_bytes[0]),
                  k.size == sizeof(k) ? 1 : 0, older_all_reduce, older.app_bytes[0] == 0xababababababababull ? 1 : 0);
    }
  } else if (script == "bench") {
    ncclComm_t comm = nullptr;
    api.CommInitRank(&comm, 2, probe::unique_id(1), 0);
    // The fake's own ncclAllReduce, bypassing the shim: a handle lookup starts at the fake itself.
    auto direct = reinterpret_cast<decltype(&ncclAllReduce)>(fake ? dlsym(fake, "ncclAllReduce") : nullptr);
    if (!direct || reinterpret_cast<void*>(direct) == reinterpret_cast<void*>(api.AllReduce)) {
      std::printf("bench cannot tell the shim from the fake\n");
      return 3;
    }
    const void* send = probe::ptr(probe::kSend);
    void* recv = probe::ptr(probe::kRecv);
    const double via_shim = ns_per_call([&] { api.AllReduce(send, recv, 1000, ncclFloat32, ncclSum, comm, probe::stream()); });
    const double via_fake = ns_per_call([&] { direct(send, recv, 1000, ncclFloat32, ncclSum, comm, probe::stream()); });
    std::printf("bench shim_ns=%.1f direct_ns=%.1f\n", via_shim, via_fake);
  }

  std::printf("config-at %s\n", fmt::format("{}", static_cast<const void*>(probe::config())).c_str());
  for (const auto& [name, rc] : results) std::printf("rc %s %d\n", name.c_str(), static_cast<int>(rc));
  if (!controls.log) controls = controls_from(dlopen("libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD));
  if (controls.log) std::printf("fake-log-begin\n%sfake-log-end\n", controls.log());
  else std::printf("fake not loaded\n");
  std::fflush(stdout);
  return 0;
}
