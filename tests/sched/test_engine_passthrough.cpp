// CPU tier of the engine: everything that must pass through does so with no GPU work, no agreement
// exchange and the application's group structure intact. A fake NCCL table records the real calls
// and a fake CUDA table counts every call (there must be none on these paths). The FP8 paths, the
// agreement and the faults are tested over the simulated platform (test_engine_sim.cpp).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/engine/engine.hpp"
#include "sched/engine/engine_probe.hpp"
#include "sched/platform/platform.hpp"

using namespace fp8wire;

namespace {
std::vector<std::string> g_calls;
std::vector<uint64_t> g_hook_seqs;
int g_comm_queries = 0;  // CommCount calls: the registry asked NCCL about a communicator

ncclComm_t comm_of(uintptr_t v) { return reinterpret_cast<ncclComm_t>(v); }
const ncclComm_t kFourRanks = comm_of(0x1000);
const ncclComm_t kOneRank = comm_of(0x2000);
const ncclComm_t kNotReady = comm_of(0x3000);
// Set while a test wants the fake ncclCommAbort to register a new communicator at the address it
// just freed (another thread's ncclCommInitRank reusing the memory).
sched::Engine* g_reuse_on_abort = nullptr;

int g_cuda_calls = 0;  // any call into the CUDA table: none is expected on a pass-through path

// A function of the CUDA table (cuda_functions.def), counted and refused.
template <class Type>
struct NoCuda;
template <class... Args>
struct NoCuda<cudaError_t(Args...)> {
  static cudaError_t call(Args...) {
    ++g_cuda_calls;
    return cudaErrorNoDevice;
  }
};
template <>
struct NoCuda<const char*(cudaError_t)> {
  static const char* call(cudaError_t) { return "no device (fake)"; }
};

NcclApi fake_api() {
  NcclApi api;
  api.AllReduce = [](const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    g_calls.push_back("AllReduce");
    return ncclSuccess;
  };
  api.ReduceScatter = [](const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    g_calls.push_back("ReduceScatter");
    return ncclSuccess;
  };
  api.AllGather = [](const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
    g_calls.push_back("AllGather");
    return ncclSuccess;
  };
  api.GroupStart = [] {
    g_calls.push_back("GroupStart");
    return ncclSuccess;
  };
  api.GroupEnd = [] {
    g_calls.push_back("GroupEnd");
    return ncclSuccess;
  };
  api.CommCount = [](const ncclComm_t c, int* n) {
    ++g_comm_queries;
    if (c == kNotReady) return ncclInvalidArgument;  // e.g. still initialising inside a group
    *n = c == kOneRank ? 1 : 4;
    return ncclSuccess;
  };
  api.GroupSimulateEnd = [](ncclSimInfo_t*) {
    g_calls.push_back("GroupSimulateEnd");
    return ncclSuccess;
  };
  api.CommAbort = [](ncclComm_t c) {
    g_calls.push_back("CommAbort");
    if (g_reuse_on_abort) g_reuse_on_abort->comm_created(c, sched::CommCreation{.nonblocking = true});
    return ncclSuccess;
  };
  api.CommUserRank = [](const ncclComm_t, int* r) {
    *r = 0;
    return ncclSuccess;
  };
  api.CommCuDevice = [](const ncclComm_t, int* d) {
    *d = 0;
    return ncclSuccess;
  };
  return api;
}

// The fake NCCL table as a platform whose CUDA table refuses everything, counting the attempts.
Platform fake_platform(const NcclApi& api) {
  Platform p;
  p.nccl = &api;
#define FP8WIRE_CUDA_FN(name, type) p.cuda.name = NoCuda<type>::call;
#include "sched/platform/cuda_functions.def"
#undef FP8WIRE_CUDA_FN
  p.cuda.GetLastError = [] { return cudaSuccess; };
  return p;
}

// Registers a communicator without an agreement (as non-blocking ones are): size known, no exchange.
void register_plain(sched::Engine& eng, ncclComm_t comm) {
  eng.comm_created(comm, sched::CommCreation{.nonblocking = true});
}

// An engine over the fake platform, the fake's call logs cleared once it stands (a doctest fixture:
// a test case's body sees its members).
struct FakeEngine {
  explicit FakeEngine(const Config& config = {}) : eng(config, platform) { clear_logs(); }
  static void clear_logs() {
    g_calls.clear();
    g_cuda_calls = 0;
  }
  const NcclApi api = fake_api();
  const Platform platform = fake_platform(api);
  sched::Engine eng;
};

// The same with kFourRanks registered without an agreement.
struct RegisteredEngine : FakeEngine {
  RegisteredEngine() {
    register_plain(eng, kFourRanks);
    clear_logs();
  }
};

constexpr size_t kBig = 64 << 20;  // elements: above every default threshold
void* const kBuf = reinterpret_cast<void*>(0x10000);

CallRecord last_record() {
  std::vector<CallRecord> recs(Accounting::kCapacity);
  const size_t n = Accounting::instance().snapshot(recs.data(), recs.size(), 0);
  REQUIRE(n > 0);
  return recs[n - 1];
}
}  // namespace

TEST_CASE_FIXTURE(RegisteredEngine, "ineligible calls pass through, once, with no agreement") {
  SUBCASE("integer sum") {
    CHECK(eng.all_reduce(kBuf, kBuf, kBig, ncclInt32, ncclSum, kFourRanks, nullptr) == ncclSuccess);
    const CallRecord r = last_record();
    CHECK(r.path == Path::passthrough);
    CHECK(r.kind == CallKind::all_reduce);
    CHECK(r.app_bytes == kBig * 4);
    // Rejected before the communicator lookup (the cheap path): size unknown, the caller's bytes
    // stand in for the wire bytes.
    CHECK(r.nranks == 0);
    CHECK(r.wire_bytes == kBig * 4);
    CHECK(r.plain_wire_bytes == r.wire_bytes);
  }
  SUBCASE("max / min / prod") {
    for (ncclRedOp_t op : {ncclMax, ncclMin, ncclProd})
      CHECK(eng.all_reduce(kBuf, kBuf, kBig, ncclBfloat16, op, kFourRanks, nullptr) == ncclSuccess);
    CHECK(g_calls.size() == 3);
  }
  SUBCASE("below every fabric's threshold") {
    CHECK(eng.all_reduce(kBuf, kBuf, 1000, ncclBfloat16, ncclSum, kFourRanks, nullptr) == ncclSuccess);
    CHECK(eng.reduce_scatter(kBuf, kBuf, 1000, ncclFloat32, ncclAvg, kFourRanks, nullptr) == ncclSuccess);
    // Below the threshold the record names the world size: NCCL's ring sends N-1 chunks of recvcount.
    const CallRecord r = last_record();
    CHECK(r.kind == CallKind::reduce_scatter);
    CHECK(r.nranks == 4);
    CHECK(r.plain_wire_bytes == 3 * 1000 * 4);
    CHECK(r.wire_bytes == r.plain_wire_bytes);
  }
  SUBCASE("1-rank communicator, and one that cannot answer yet") {
    CHECK(eng.all_reduce(kBuf, kBuf, kBig, ncclBfloat16, ncclSum, kOneRank, nullptr) == ncclSuccess);
    CHECK(eng.all_reduce(kBuf, kBuf, kBig, ncclBfloat16, ncclSum, kNotReady, nullptr) == ncclSuccess);
  }
  SUBCASE("all_gather is off by default; reduce_scatter of integers") {
    CHECK(eng.all_gather(kBuf, kBuf, kBig, ncclBfloat16, kFourRanks, nullptr) == ncclSuccess);
    CHECK(eng.reduce_scatter(kBuf, kBuf, kBig, ncclInt8, ncclSum, kFourRanks, nullptr) == ncclSuccess);
    CHECK(g_calls == std::vector<std::string>{"AllGather", "ReduceScatter"});
  }
  SUBCASE("forced pass-through is plain NCCL") {
    CHECK(sched::EngineProbe(eng).all_reduce_forced(Path::passthrough, kBuf, kBuf, kBig, ncclBfloat16, ncclSum, kFourRanks, nullptr) ==
          ncclSuccess);
    const CallRecord r = last_record();
    CHECK(r.path == Path::passthrough);
    CHECK(r.nranks == 4);
    CHECK(r.wire_bytes == 2 * 3 * kBig * 2 / 4);  // ring all-reduce: 2(N-1)/N of the buffer
    CHECK(r.plain_wire_bytes == r.wire_bytes);        // NCCL's own algorithm carried it
  }
  for (const std::string& c : g_calls) CHECK(c != "GroupStart");  // nothing of an FP8 exchange
  CHECK(!g_calls.empty());
  CHECK(g_cuda_calls == 0);
  CHECK(sched::EngineProbe(eng).fabric_of(kFourRanks) == Fabric::net);  // not agreed: the override or "net"
}

TEST_CASE("disabled, non-blocking: even large float sums pass through") {
  Config off;
  off.enable = false;
  FakeEngine disabled(off);
  CHECK(disabled.eng.all_reduce(kBuf, kBuf, kBig, ncclBfloat16, ncclSum, kFourRanks, nullptr) == ncclSuccess);
  CHECK(g_calls == std::vector<std::string>{"AllReduce"});

  RegisteredEngine plain;
  CHECK(plain.eng.all_reduce(kBuf, kBuf, kBig, ncclFloat32, ncclSum, kFourRanks, nullptr) == ncclSuccess);
  CHECK(g_calls == std::vector<std::string>{"AllReduce"});
  CHECK(g_cuda_calls == 0);
  CHECK(sched::EngineProbe(plain.eng).comm_info(kFourRanks).reason == "non-blocking communicator");

  Config pcie;
  pcie.fabric_override = Fabric::pcie;
  FakeEngine forced_fabric(pcie);
  CHECK(sched::EngineProbe(forced_fabric.eng).fabric_of(kFourRanks) == Fabric::pcie);
}

TEST_CASE_FIXTURE(FakeEngine, "groups: pass-through calls stay inside the application's real group") {
  CHECK(eng.group_start() == ncclSuccess);
  CHECK(eng.all_reduce(kBuf, kBuf, 10, ncclInt32, ncclSum, kFourRanks, nullptr) == ncclSuccess);
  CHECK(eng.group_start() == ncclSuccess);
  CHECK(eng.all_reduce(kBuf, kBuf, 10, ncclBfloat16, ncclSum, kFourRanks, nullptr) == ncclSuccess);
  CHECK(eng.group_end() == ncclSuccess);
  CHECK(eng.all_gather(kBuf, kBuf, 10, ncclFloat32, kFourRanks, nullptr) == ncclSuccess);
  CHECK(eng.group_end() == ncclSuccess);
  CHECK(g_calls == std::vector<std::string>{"GroupStart", "AllReduce", "GroupStart", "AllReduce", "GroupEnd",
                                            "AllGather", "GroupEnd"});
  // An unbalanced end is forwarded: NCCL reports the error, the engine keeps no state.
  g_calls.clear();
  CHECK(eng.group_end() == ncclSuccess);
  CHECK(g_calls == std::vector<std::string>{"GroupEnd"});
}

TEST_CASE_FIXTURE(FakeEngine, "call hooks run around every call, with the sequence number") {
  static const CallHooks hooks{[](const CallRecord& r) { g_hook_seqs.push_back(r.seq); },
                               [](const CallRecord& r) { g_hook_seqs.push_back(r.seq); }};
  set_call_hooks(&hooks);
  g_hook_seqs.clear();
  CHECK(eng.all_reduce(kBuf, kBuf, 10, ncclInt32, ncclSum, kFourRanks, nullptr) == ncclSuccess);
  CHECK(eng.all_reduce(kBuf, kBuf, 10, ncclInt32, ncclSum, kFourRanks, nullptr) == ncclSuccess);
  set_call_hooks(nullptr);
  REQUIRE(g_hook_seqs.size() == 4);
  CHECK(g_hook_seqs[0] == g_hook_seqs[1]);
  CHECK(g_hook_seqs[2] == g_hook_seqs[1] + 1);
}

// Below-threshold calls are decided by host rules alone: no communicator lookup or query, no
// agreement, and no CUDA call (on a machine without a GPU a failing cudaStreamIsCapturing would read
// as "capturing" and log a warning). Thresholds of 1 TiB make every call small.
TEST_CASE("thresholds above the call: host rules only, no registry, no CUDA, no warning") {
  Config c;
  c.collective_enable.fill(true);
  for (auto& per : c.thresholds) per = {1ull << 40, 1ull << 40, 1ull << 40};
  char log_path[] = "/tmp/fp8wire_sched_threshold_XXXXXX";
  const int fd = mkstemp(log_path);
  REQUIRE(fd >= 0);
  close(fd);
  const LogLevel previous = log_level();
  log_set_level(LogLevel::info);
  log_set_file(log_path);
  {
    FakeEngine fake(c);
    sched::Engine& eng = fake.eng;
    g_comm_queries = 0;
    CHECK(eng.all_reduce(kBuf, kBuf, 1000, ncclFloat32, ncclSum, kFourRanks, nullptr) == ncclSuccess);
    CHECK(eng.reduce_scatter(kBuf, kBuf, 250, ncclBfloat16, ncclAvg, kFourRanks, nullptr) == ncclSuccess);
    CHECK(eng.all_gather(kBuf, kBuf, 333, ncclFloat16, kFourRanks, nullptr) == ncclSuccess);
    CHECK(eng.group_start() == ncclSuccess);
    CHECK(eng.all_reduce(kBuf, kBuf, kBig, ncclBfloat16, ncclSum, kFourRanks, nullptr) == ncclSuccess);
    CHECK(eng.group_end() == ncclSuccess);
    CHECK(g_comm_queries == 0);
    CHECK(g_calls == std::vector<std::string>{"AllReduce", "ReduceScatter", "AllGather", "GroupStart", "AllReduce",
                                              "GroupEnd"});
    const CallRecord r = last_record();
    CHECK(r.path == Path::passthrough);
    CHECK(r.app_bytes == kBig * 2);
    // A registered communicator keeps its size in the record (lookup only, still no query).
    register_plain(eng, kFourRanks);
    const int queries = g_comm_queries;
    CHECK(eng.all_reduce(kBuf, kBuf, 1000, ncclFloat32, ncclSum, kFourRanks, nullptr) == ncclSuccess);
    CHECK(g_comm_queries == queries);
    CHECK(last_record().nranks == 4);
    g_cuda_calls = 0;
    eng.comm_destroyed(kFourRanks);  // never agreed: releases nothing, touches no device
    CHECK(g_cuda_calls == 0);
  }
  log_set_file("");
  log_set_level(previous);
  std::ifstream in(log_path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(log_path);
  INFO(text.str());
  CHECK(text.str().find("WARN") == std::string::npos);
  CHECK(text.str().find("captur") == std::string::npos);
  CHECK(text.str().find("agree") == std::string::npos);
}

// ncclCommInitAll: one thread drives every rank and must issue their calls in one group. The FP8
// path would run the agreement exchange (an all-gather plus a stream synchronize) for the first
// communicator alone and wait forever for ranks the thread has not issued: such communicators pass
// through, inside the application's real group, with no exchange.
TEST_CASE_FIXTURE(FakeEngine, "communicators of ncclCommInitAll always pass through") {
  eng.comm_created(kFourRanks, sched::CommCreation{.single_process = true});
  CHECK(eng.comm_single_process(kFourRanks));
  g_calls.clear();
  g_cuda_calls = 0;
  CHECK(eng.group_start() == ncclSuccess);
  CHECK(eng.all_reduce(kBuf, kBuf, kBig, ncclBfloat16, ncclSum, kFourRanks, nullptr) == ncclSuccess);
  CHECK(eng.reduce_scatter(kBuf, kBuf, kBig, ncclFloat32, ncclSum, kFourRanks, nullptr) == ncclSuccess);
  CHECK(eng.group_end() == ncclSuccess);
  CHECK(g_calls == std::vector<std::string>{"GroupStart", "AllReduce", "ReduceScatter", "GroupEnd"});
  CHECK(last_record().path == Path::passthrough);
  CHECK(eng.all_reduce(kBuf, kBuf, kBig, ncclFloat32, ncclAvg, kFourRanks, nullptr) == ncclSuccess);
  CHECK(last_record().path == Path::passthrough);
  CHECK(sched::EngineProbe(eng).fabric_of(kFourRanks) == Fabric::net);  // never agreed
  CHECK(g_cuda_calls == 0);
}

// ncclCommAbort: the real abort runs, once, with the communicator already out of the registry (its
// scratch is freed only after the abort; that order needs an agreed communicator, i.e. a GPU, to be
// seen). A communicator created at the same address while the abort runs keeps its own state.
TEST_CASE_FIXTURE(RegisteredEngine, "ncclCommAbort: real abort with the communicator already detached") {
  g_reuse_on_abort = &eng;
  CHECK(eng.comm_abort(kFourRanks) == ncclSuccess);
  g_reuse_on_abort = nullptr;
  CHECK(g_calls == std::vector<std::string>{"CommAbort"});
  // The new communicator is non-blocking: a large float sum on it passes through untouched.
  g_calls.clear();
  CHECK(eng.all_reduce(kBuf, kBuf, kBig, ncclFloat32, ncclSum, kFourRanks, nullptr) == ncclSuccess);
  CHECK(g_calls == std::vector<std::string>{"AllReduce"});
  CHECK(last_record().path == Path::passthrough);
  // Aborting a communicator the engine never saw still reaches NCCL.
  g_calls.clear();
  CHECK(eng.comm_abort(kNotReady) == ncclSuccess);
  CHECK(g_calls == std::vector<std::string>{"CommAbort"});
}

// ncclGroupSimulateEnd closes the group without running it, and the thread must leave the group
// (else every later FP8 candidate would wait in the queue for a GroupEnd that may never come). That
// FP8 calls queued in it are dropped is checked over the simulated platform.
TEST_CASE_FIXTURE(RegisteredEngine, "ncclGroupSimulateEnd closes the group and runs nothing it queued") {
  CHECK(eng.group_start() == ncclSuccess);
  CHECK(eng.all_reduce(kBuf, kBuf, kBig, ncclBfloat16, ncclSum, kFourRanks, nullptr) == ncclSuccess);  // passes through
  CHECK(eng.group_simulate_end(nullptr) == ncclSuccess);
  CHECK(g_calls == std::vector<std::string>{"GroupStart", "AllReduce", "GroupSimulateEnd"});
  // A later group is a group of its own: its outermost end runs its calls and nothing simulated.
  g_calls.clear();
  CHECK(eng.group_start() == ncclSuccess);
  CHECK(eng.all_reduce(kBuf, kBuf, 10, ncclInt32, ncclSum, kFourRanks, nullptr) == ncclSuccess);
  CHECK(eng.group_end() == ncclSuccess);
  CHECK(g_calls == std::vector<std::string>{"GroupStart", "AllReduce", "GroupEnd"});
  // Nested: only the outermost simulated end drops the queue.
  g_calls.clear();
  CHECK(eng.group_start() == ncclSuccess);
  CHECK(eng.group_start() == ncclSuccess);
  CHECK(eng.group_simulate_end(nullptr) == ncclSuccess);
  CHECK(eng.group_end() == ncclSuccess);
  CHECK(g_calls == std::vector<std::string>{"GroupStart", "GroupStart", "GroupSimulateEnd", "GroupEnd"});
}
