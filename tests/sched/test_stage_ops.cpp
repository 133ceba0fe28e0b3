// CPU tier of StageOps' gates (sched/exec/stage_ops.hpp). The produce gate (direct.early_copy_in): with a gate
// set, a fetch (the copy-in of what the peers wrote) is issued before the lane waits for the stage's
// produce, and every other operation of the stage only after that wait, which is issued once. The
// send gate (direct.paced_sends) holds writes into a window only. A fake CUDA and codec table record
// the order of what reaches the lane.
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

cudaError_t fake_wait(cudaStream_t, cudaEvent_t event, unsigned int) {
  g_log.push_back(event == reinterpret_cast<cudaEvent_t>(0x20) ? "wait produce" : "wait other");
  return cudaSuccess;
}
cudaError_t fake_copy(void*, const void*, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  g_log.push_back("copy " + std::to_string(bytes));
  return cudaSuccess;
}
cudaError_t fake_memset(void*, int, size_t, cudaStream_t) {
  g_log.push_back("zero");
  return cudaSuccess;
}
cudaError_t fake_reduce(const void* const*, int, size_t, float, quant::ReduceOutput, const quant::WireFormat&,
                        cudaStream_t, quant::LaunchOptions) {
  g_log.push_back("reduce");
  return cudaSuccess;
}

struct Fixture {
  NcclApi nccl{};
  Platform platform;
  std::atomic<int64_t> budget{0};
  sched::CommState state;
  sched::StageOps ops;
  char device[64] = {};
  Fixture()
      : platform(make_platform(nccl)),
        state(platform, budget, nullptr, 1),
        ops(state, quant::ElemType::bf16, quant::WireFormat{}, quant::LaunchOptions{}) {
    g_log.clear();
    ops.set_lane(reinterpret_cast<cudaStream_t>(0x10));
  }
  static Platform make_platform(const NcclApi& nccl) {
    Platform p;
    p.nccl = &nccl;
    p.cuda.StreamWaitEvent = fake_wait;
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
