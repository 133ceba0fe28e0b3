// CPU tier of StageOps' gates (sched/exec/stage_ops.hpp). The produce gate (LaneHandover::produce_gate):
// with a gate set, a fetch (the copy-in of what the peers wrote) is issued before the lane waits for the
// stage's produce, and every other operation of the stage only after that wait, which is issued once.
// The send gate (DirectRecipe::paced_sends) holds writes into a window only. A fake CUDA and codec
// table record the order of what reaches the lane. Copy lanes (LaneHandover::copy_lanes): which lane
// each operation reaches, and the hops between them, one way only in each half.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <vector>

#include "quant/quant.hpp"
#include "sched/comm/comm_state.hpp"
#include "sched/exec/stage_ops.hpp"
#include "sched/platform/platform.hpp"

using namespace fp8wire;

namespace {
std::vector<std::string> g_log;
bool g_lanes = false;  // log which lane each operation reaches (" @k" for lane 0x1k)

std::string at(cudaStream_t lane) {
  return g_lanes ? " @" + std::to_string(reinterpret_cast<uintptr_t>(lane) - 0x10) : "";
}
cudaError_t fake_wait(cudaStream_t lane, cudaEvent_t event, unsigned int) {
  g_log.push_back((event == reinterpret_cast<cudaEvent_t>(0x20) ? "wait produce" : "wait other") + at(lane));
  return cudaSuccess;
}
cudaError_t fake_record(cudaEvent_t, cudaStream_t lane) {
  g_log.push_back("record" + at(lane));
  return cudaSuccess;
}
cudaError_t fake_copy(void*, const void*, size_t bytes, cudaMemcpyKind, cudaStream_t lane) {
  g_log.push_back("copy " + std::to_string(bytes) + at(lane));
  return cudaSuccess;
}
cudaError_t fake_memset(void*, int, size_t, cudaStream_t lane) {
  g_log.push_back("zero" + at(lane));
  return cudaSuccess;
}
cudaError_t fake_reduce(const void* const*, int, size_t, float, quant::ReduceOutput, const quant::WireFormat&,
                        cudaStream_t lane, quant::LaunchOptions) {
  g_log.push_back("reduce" + at(lane));
  return cudaSuccess;
}

struct Fixture {
  NcclApi nccl{};
  Platform platform;
  sched::ProcessBudgets budgets{Config{}};
  sched::CommState state;
  sched::StageOps ops;
  char device[64] = {};
  Fixture()
      : platform(make_platform(nccl)),
        state(platform, budgets, nullptr, 1),
        ops(state, quant::ElemType::bf16, quant::WireFormat{}, quant::LaunchOptions{}) {
    g_log.clear();
    g_lanes = false;
    ops.set_lane(reinterpret_cast<cudaStream_t>(0x10));
  }
  static Platform make_platform(const NcclApi& nccl) {
    Platform p;
    p.nccl = &nccl;
    p.cuda.StreamWaitEvent = fake_wait;
    p.cuda.EventRecord = fake_record;
    p.cuda.MemcpyAsync = fake_copy;
    p.cuda.MemsetAsync = fake_memset;
    p.codec.dequantize_reduce = fake_reduce;
    return p;
  }
  void reduce() {
    const void* in[2] = {device, device + 16};
    quant::ReduceOutput out;
    out.plain = device + 32;
    CHECK(ops.reduce(in, 2, 8, 1.0f, out, 0) == ncclSuccess);
  }
};
const cudaEvent_t kProduced = reinterpret_cast<cudaEvent_t>(0x20);
}  // namespace

TEST_CASE("a fetch runs before the produce gate, the first other operation waits for it, once") {
  Fixture f;
  f.ops.gate_produce(kProduced);
  CHECK(f.ops.fetch(f.device, f.device + 8, 8) == ncclSuccess);
  CHECK(f.ops.fetch(f.device + 8, f.device + 16, 4) == ncclSuccess);
  f.reduce();
  CHECK(f.ops.copy(f.device, f.device + 8, 2) == ncclSuccess);
  CHECK(f.ops.pass_produce_gate() == ncclSuccess);
  CHECK(g_log == std::vector<std::string>{"copy 8", "copy 4", "wait produce", "reduce", "copy 2"});
}

TEST_CASE("every operation but a fetch passes the produce gate first") {
  Fixture f;
  SUBCASE("a copy") {
    f.ops.gate_produce(kProduced);
    CHECK(f.ops.copy(f.device, f.device + 8, 8) == ncclSuccess);
    CHECK(g_log == std::vector<std::string>{"wait produce", "copy 8"});
  }
  SUBCASE("zeroing") {
    f.ops.gate_produce(kProduced);
    CHECK(f.ops.zero(f.device, 8) == ncclSuccess);
    CHECK(g_log == std::vector<std::string>{"wait produce", "zero"});
  }
  SUBCASE("a reduce") {
    f.ops.gate_produce(kProduced);
    f.reduce();
    CHECK(g_log == std::vector<std::string>{"wait produce", "reduce"});
  }
}

TEST_CASE("a stage with no gated operation still ends after its produce; no gate, no wait") {
  Fixture f;
  f.ops.gate_produce(kProduced);
  CHECK(f.ops.fetch(f.device, f.device + 8, 8) == ncclSuccess);
  CHECK(f.ops.pass_produce_gate() == ncclSuccess);  // the executor, after the stage's finish
  CHECK(f.ops.pass_produce_gate() == ncclSuccess);
  f.reduce();
  CHECK(g_log == std::vector<std::string>{"copy 8", "wait produce", "reduce"});
}

TEST_CASE("a send gate holds writes into a window only: a copy into device memory goes unheld") {
  Fixture f;  // no direct transport: no address is in a window
  f.ops.gate_send(kProduced);
  CHECK(f.ops.copy(f.device, f.device + 8, 8) == ncclSuccess);
  f.reduce();
  CHECK(g_log == std::vector<std::string>{"copy 8", "reduce"});
}

TEST_CASE("copy lanes: the finish half's copy-in on its copy lane, the kernel lane waits for it once before its next operation") {
  Fixture f;
  g_lanes = true;
  const cudaStream_t transfer = reinterpret_cast<cudaStream_t>(0x10), fetch = reinterpret_cast<cudaStream_t>(0x11);
  f.ops.set_lanes(transfer, fetch, sched::StageOps::Half::finish, reinterpret_cast<cudaEvent_t>(0x30));
  f.ops.gate_produce(kProduced);
  CHECK(f.ops.fetch(f.device, f.device + 8, 8) == ncclSuccess);
  CHECK(f.ops.fetch(f.device + 8, f.device + 16, 4) == ncclSuccess);
  f.reduce();
  CHECK(f.ops.zero(f.device, 2) == ncclSuccess);
  cudaStream_t done = nullptr;
  CHECK(f.ops.end_half(&done) == ncclSuccess);
  CHECK(done == transfer);
  CHECK(g_log == std::vector<std::string>{"copy 8 @1", "copy 4 @1", "record @1", "wait other @0", "wait produce @0",
                                          "reduce @0", "zero @0"});
}

TEST_CASE("copy lanes: a produce half's kernels never wait for its copy lane; the half ends on the copy lane, after them") {
  Fixture f;  // no direct transport: nothing is a window, so every operation here is the kernel lane's
  g_lanes = true;
  const cudaStream_t produce = reinterpret_cast<cudaStream_t>(0x10), send = reinterpret_cast<cudaStream_t>(0x12);
  f.ops.set_lanes(produce, send, sched::StageOps::Half::produce, reinterpret_cast<cudaEvent_t>(0x30));
  f.reduce();
  CHECK(f.ops.copy(f.device, f.device + 8, 8) == ncclSuccess);
  cudaStream_t done = nullptr;
  CHECK(f.ops.end_half(&done) == ncclSuccess);
  CHECK(done == send);
  CHECK(g_log == std::vector<std::string>{"reduce @0", "copy 8 @0", "record @0", "wait other @2"});
}

TEST_CASE("without a copy lane a half ends where it ran, with no hop") {
  Fixture f;
  f.ops.set_lanes(reinterpret_cast<cudaStream_t>(0x10), nullptr, sched::StageOps::Half::finish, nullptr);
  CHECK(f.ops.fetch(f.device, f.device + 8, 8) == ncclSuccess);
  f.reduce();
  cudaStream_t done = nullptr;
  CHECK(f.ops.end_half(&done) == ncclSuccess);
  CHECK(done == reinterpret_cast<cudaStream_t>(0x10));
  CHECK(g_log == std::vector<std::string>{"copy 8", "reduce"});
}
