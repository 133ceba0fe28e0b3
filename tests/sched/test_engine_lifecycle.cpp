// The engine's lifecycle and groups over the simulated machine: the agreement at communicator
// creation (configuration errors and differences, communicators created inside a group, an abort
// releasing an agreement that waits for a rank that never comes), groups across communicators in
// different orders, destroy while a call is queued, ncclGroupSimulateEnd, pass-through-only
// communicators, and error feedback keyed by identity, never by address.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/log.hpp"
#include "quant/reference.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/engine/engine.hpp"
#include "sched/engine/engine_probe.hpp"
#include "sched/comm/budgets.hpp"
#include "sched/comm/error_feedback.hpp"
#include "sched/platform/nccl_types.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;

namespace {

// One rank's buffers on the simulated device.
struct Buffers {
  const Platform* p;
  void* in = nullptr;
  void* out = nullptr;
  size_t bytes = 0;
  Buffers(const Platform& platform, const Bytes& input) : p(&platform), bytes(input.size()) {
    p->cuda.Malloc(&in, bytes);
    p->cuda.Malloc(&out, bytes);
    std::memcpy(in, input.data(), bytes);
  }
  ~Buffers() {
    p->cuda.Free(in);
    p->cuda.Free(out);
  }
  Bytes result() const { return Bytes(static_cast<char*>(out), static_cast<char*>(out) + bytes); }
};

cudaStream_t new_stream(const Platform& p) {
  cudaStream_t s = nullptr;
  p.cuda.StreamCreateWithFlags(&s, cudaStreamNonBlocking);
  return s;
}

ncclResult_t all_reduce(sched::Engine& eng, const Buffers& b, size_t count, DataType t, ncclComm_t comm,
                        cudaStream_t s) {
  return eng.all_reduce(b.in, b.out, count, nccl_dtype(t), ncclSum, comm, s);
}

Path last_path() {
  std::vector<CallRecord> recs(Accounting::kCapacity);
  const size_t n = Accounting::instance().snapshot(recs.data(), recs.size(), 0);
  return n ? recs[n - 1].path : Path::passthrough;
}

}  // namespace

TEST_CASE("a rank whose configuration failed takes part: every rank passes through and names it") {
  const Spec spec{Collective::all_reduce, Path::two_shot, DataType::f32, ReduceOp::sum, 2000, 1};
  const auto inputs = inputs_for(spec, 3);
  sim::World world(sim::Options{.nranks = 3});
  const auto comms = world.create_comm();
  std::vector<sched::CommInfo> infos(3);
  std::vector<Bytes> outs(3);
  world.run_ranks([&](int r) {
    sched::LocalIdentity me;
    me.version = 100;
    if (r == 1) {
      me.usable = false;  // its configuration failed to load: the library runs, pass-through only
      me.problem = "configuration error: block_size";
    }
    sched::Engine eng(sim_config(), world.platform(), me);
    eng.comm_created(comms[static_cast<size_t>(r)]);
    infos[static_cast<size_t>(r)] = sched::EngineProbe(eng).comm_info(comms[static_cast<size_t>(r)]);
    Buffers b(world.platform(), inputs[static_cast<size_t>(r)]);
    cudaStream_t s = new_stream(world.platform());
    CHECK(all_reduce(eng, b, spec.count, spec.dtype, comms[static_cast<size_t>(r)], s) == ncclSuccess);
    CHECK(last_path() == Path::fallback);
    world.synchronize_rank();
    outs[static_cast<size_t>(r)] = b.result();
    eng.comm_destroyed(comms[static_cast<size_t>(r)]);
  });
  for (const auto& info : infos) {
    CHECK(info.agreed);
    CHECK_FALSE(info.fp8_ok);
    CHECK(info.reason == "rank 1: configuration error: block_size");
  }
  CHECK(outs[0] == outs[1]);
  CHECK(outs[1] == outs[2]);
  CHECK(world.races().empty());
  CHECK_FALSE(world.deadlocked());
}

TEST_CASE("ranks with different configurations, or one disabled: FP8 off everywhere, no hang") {
  for (int variant = 0; variant < 2; ++variant) {
    sim::World world(sim::Options{.nranks = 4});
    const auto comms = world.create_comm();
    std::vector<sched::CommInfo> infos(4);
    world.run_ranks([&](int r) {
      Config c = sim_config();
      if (r == 2 && variant == 0) c.thresholds[0][2] = 1;  // another threshold on one rank
      if (r == 3 && variant == 1) c.enable = false;        // fp8wire disabled on one rank
      sched::Engine eng(c, world.platform());
      eng.comm_created(comms[static_cast<size_t>(r)]);
      infos[static_cast<size_t>(r)] = sched::EngineProbe(eng).comm_info(comms[static_cast<size_t>(r)]);
      eng.comm_destroyed(comms[static_cast<size_t>(r)]);
    });
    for (const auto& info : infos) {
      CHECK_FALSE(info.fp8_ok);
      CHECK(info.reason.find(variant == 0 ? "rank 2" : "rank 3") != std::string::npos);
    }
    CHECK_FALSE(world.deadlocked());
  }
}

TEST_CASE("communicators created inside an application group are agreed at its end, together") {
  sim::World world(sim::Options{.nranks = 2});
  const auto a = world.create_comm();
  const auto b = world.create_comm();
  std::vector<sched::CommInfo> infos(4);
  world.run_ranks([&](int r) {
    sched::Engine eng(sim_config(), world.platform());
    const size_t i = static_cast<size_t>(r);
    CHECK(eng.group_start() == ncclSuccess);
    eng.comm_created(a[i]);
    eng.comm_created(b[i]);
    CHECK_FALSE(sched::EngineProbe(eng).comm_info(a[i]).agreed);  // not ready inside the group
    CHECK(eng.group_end() == ncclSuccess);
    infos[2 * i] = sched::EngineProbe(eng).comm_info(a[i]);
    infos[2 * i + 1] = sched::EngineProbe(eng).comm_info(b[i]);
    eng.comm_destroyed(a[i]);
    eng.comm_destroyed(b[i]);
  });
  for (const auto& info : infos) CHECK(info.fp8_ok);
  CHECK_FALSE(world.deadlocked());
}

TEST_CASE("two ranks of one communicator in one process: agreed in one group, then pass-through") {
  // One thread drives both ranks (as nccl-tests -g 2 does): both handles created in one group.
  sim::World two(sim::Options{.nranks = 2, .hosts = {7, 7}});
  const auto c = two.create_comm();
  std::vector<sched::CommInfo> infos(2);
  sim::set_thread_rank(0);  // the main thread acts as rank 0's process for both handles
  {
    sched::Engine eng(sim_config(), two.platform());
    CHECK(eng.group_start() == ncclSuccess);
    eng.comm_created(c[0]);
    eng.comm_created(c[1]);
    CHECK(eng.group_end() == ncclSuccess);
    infos[0] = sched::EngineProbe(eng).comm_info(c[0]);
    infos[1] = sched::EngineProbe(eng).comm_info(c[1]);
    eng.comm_destroyed(c[0]);
    eng.comm_destroyed(c[1]);
  }
  for (const auto& info : infos) {
    CHECK(info.agreed);
    CHECK_FALSE(info.fp8_ok);
    CHECK(info.reason == "ranks 0 and 1 are driven by one process");
  }
  CHECK_FALSE(two.deadlocked());
}

TEST_CASE("an abort from another thread releases an agreement waiting for a rank that never comes") {
  sim::World world(sim::Options{.nranks = 2});
  const auto comms = world.create_comm();
  std::atomic<sched::Engine*> rank0{nullptr};
  std::atomic<bool> released{false};
  world.run_ranks([&](int r) {
    if (r == 0) {
      sched::Engine eng(sim_config(), world.platform());
      rank0 = &eng;
      eng.comm_created(comms[0]);  // blocks: rank 1 never takes part
      released = true;
      CHECK_FALSE(sched::EngineProbe(eng).comm_info(comms[0]).registered);  // the abort took it out
      rank0 = nullptr;
    } else {
      // Rank 1's process is alive but never creates its side; its watchdog aborts rank 0's.
      while (!rank0.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      CHECK_FALSE(released.load());
      CHECK(rank0.load()->comm_abort(comms[0]) == ncclSuccess);
    }
  });
  CHECK(released.load());
  CHECK_FALSE(world.deadlocked());
}

TEST_CASE("groups across communicators, issued in different orders on different ranks, never deadlock") {
  const Spec spec{Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, 9000, 2};
  const auto inputs = inputs_for(spec, 3);
  for (uint64_t seed : {1, 2, 3, 4, 5}) {
    sim::World world(sim::Options{.nranks = 3, .schedule_seed = seed});
    const auto a = world.create_comm();
    const auto b = world.create_comm();
    Config c = sim_config(8 << 10);  // pipelined: the produce lane waits for its own transfer lane
    c.algorithm = Algorithm::two_shot;
    std::vector<Bytes> out_a(3), out_b(3);
    world.run_ranks([&](int r) {
      const size_t i = static_cast<size_t>(r);
      sched::Engine eng(c, world.platform());
      eng.comm_created(a[i]);
      eng.comm_created(b[i]);
      Buffers ba(world.platform(), inputs[i]), bb(world.platform(), inputs[i]);
      cudaStream_t s = new_stream(world.platform());
      CHECK(eng.group_start() == ncclSuccess);
      if (r % 2 == 0) {
        CHECK(all_reduce(eng, ba, spec.count, spec.dtype, a[i], s) == ncclSuccess);
        CHECK(all_reduce(eng, bb, spec.count, spec.dtype, b[i], s) == ncclSuccess);
      } else {
        CHECK(all_reduce(eng, bb, spec.count, spec.dtype, b[i], s) == ncclSuccess);
        CHECK(all_reduce(eng, ba, spec.count, spec.dtype, a[i], s) == ncclSuccess);
      }
      CHECK(eng.group_end() == ncclSuccess);
      world.app_access(s, ba.out, ba.bytes, false);
      world.app_access(s, bb.out, bb.bytes, false);
      CHECK(world.synchronize_rank() == cudaSuccess);
      out_a[i] = ba.result();
      out_b[i] = bb.result();
      eng.comm_destroyed(a[i]);
      eng.comm_destroyed(b[i]);
    });
    INFO("schedule seed " << seed);
    CHECK_FALSE(world.deadlocked());
    CHECK(world.races().empty());
    const Bytes want = expected_output(spec, inputs, 0, quant::WireFormat::from(c), spec.count);
    for (int r = 0; r < 3; ++r) {
      CHECK(out_a[static_cast<size_t>(r)] == want);
      CHECK(out_b[static_cast<size_t>(r)] == want);
    }
  }
}

namespace {

// One rank inside an open group in which it has queued one FP8 all-reduce on its communicator.
struct Queued {
  int rank;
  sched::Engine& eng;
  ncclComm_t comm;
  Buffers& b;
  cudaStream_t s;
  int sends, gathers;  // its transport calls at those sites before the group
};
const Spec kQueued{Collective::all_reduce, Path::two_shot, DataType::f32, ReduceOp::sum, 3000, 3};

// On both ranks of `world` (two): a communicator, one call of kQueued queued in an open group, then
// `close` ends the group its way.
void with_call_queued_in_group(sim::World& world, const std::function<void(const Queued&)>& close) {
  const auto inputs = inputs_for(kQueued, 2);
  const auto comms = world.create_comm();
  world.run_ranks([&](int r) {
    const size_t i = static_cast<size_t>(r);
    sched::Engine eng(sim_config(), world.platform());
    eng.comm_created(comms[i]);
    Buffers b(world.platform(), inputs[i]);
    const Queued q{r, eng, comms[i], b, new_stream(world.platform()), world.calls_at(r, sim::Site::send),
                   world.calls_at(r, sim::Site::all_gather)};
    CHECK(eng.group_start() == ncclSuccess);
    CHECK(all_reduce(eng, b, kQueued.count, kQueued.dtype, q.comm, q.s) == ncclSuccess);
    close(q);
  });
}

}  // namespace

TEST_CASE("destroying a communicator while its call is queued in an open group: an error, not a use-after-free") {
  sim::World world(sim::Options{.nranks = 2});
  with_call_queued_in_group(world, [&](const Queued& q) {
    q.eng.comm_destroyed(q.comm);
    CHECK(q.eng.group_end() == ncclInvalidUsage);
    CHECK(world.synchronize_rank() == cudaSuccess);
  });
  CHECK_FALSE(world.deadlocked());
  CHECK(world.races().empty());
  CHECK(world.live_bytes(0) == 0);  // the scratch went with the communicator
}

TEST_CASE("after a failure in a group, the rest of the group is not issued and its communicators fail") {
  const Spec spec{Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, 3000, 3};
  const auto inputs = inputs_for(spec, 2);
  sim::World world(sim::Options{.nranks = 2});
  const auto a = world.create_comm();
  const auto b = world.create_comm();
  // The first codec launch of rank 0's group fails (after both agreements).
  std::vector<sched::CommInfo> info_b(2);
  std::atomic<bool> aborted{false};
  std::atomic<int> agreed{0};
  world.run_ranks([&](int r) {
    const size_t i = static_cast<size_t>(r);
    Config c = sim_config();
    c.algorithm = Algorithm::two_shot;
    sched::Engine eng(c, world.platform());
    CHECK(eng.comm_created(a[i]) == ncclSuccess);
    CHECK(eng.comm_created(b[i]) == ncclSuccess);
    // Both agreements are done everywhere before the fault's abort (an NCCL error during a rank's
    // set-up fails that rank's creation).
    ++agreed;
    while (agreed.load() < 2) std::this_thread::yield();
    Buffers ba(world.platform(), inputs[i]), bb(world.platform(), inputs[i]);
    cudaStream_t s = new_stream(world.platform());
    if (r == 0) world.set_fault(sim::Fault{0, sim::Site::codec, world.calls_at(0, sim::Site::codec)});
    CHECK(eng.group_start() == ncclSuccess);
    CHECK(all_reduce(eng, ba, spec.count, spec.dtype, a[i], s) == ncclSuccess);
    CHECK(all_reduce(eng, bb, spec.count, spec.dtype, b[i], s) == ncclSuccess);
    const ncclResult_t end = eng.group_end();
    if (end != ncclSuccess && !aborted.exchange(true)) {
      world.abort_comm(a[i]);
      world.abort_comm(b[i]);
    }
    if (r == 0) CHECK(end != ncclSuccess);
    world.synchronize_rank();
    info_b[i] = sched::EngineProbe(eng).comm_info(b[i]);
    eng.comm_destroyed(a[i]);
    eng.comm_destroyed(b[i]);
  });
  CHECK(info_b[0].failure != ncclSuccess);  // rank 0 never issued its call on b: out of step
  CHECK_FALSE(world.deadlocked());
  CHECK(world.races().empty());
}

TEST_CASE("ncclGroupSimulateEnd drops the FP8 calls queued in the group") {
  sim::World world(sim::Options{.nranks = 2});
  with_call_queued_in_group(world, [&](const Queued& q) {
    CHECK(q.eng.group_simulate_end(nullptr) == ncclSuccess);
    CHECK(world.calls_at(q.rank, sim::Site::send) == q.sends);  // nothing of an FP8 exchange was issued
    CHECK(world.calls_at(q.rank, sim::Site::all_gather) == q.gathers);
    // The thread left the group: the next call runs at once.
    CHECK(all_reduce(q.eng, q.b, kQueued.count, kQueued.dtype, q.comm, q.s) == ncclSuccess);
    CHECK(world.synchronize_rank() == cudaSuccess);
    q.eng.comm_destroyed(q.comm);
  });
  CHECK_FALSE(world.deadlocked());
}

TEST_CASE("non-blocking and single-process communicators pass through with no exchange") {
  sim::World world(sim::Options{.nranks = 2});
  const auto comms = world.create_comm();
  world.run_ranks([&](int r) {
    const size_t i = static_cast<size_t>(r);
    sched::Engine eng(sim_config(), world.platform());
    const int gathers = world.calls_at(r, sim::Site::all_gather);
    eng.comm_created(comms[i], sched::CommCreation{.nonblocking = true});
    CHECK(world.calls_at(r, sim::Site::all_gather) == gathers);  // no agreement exchange
    CHECK(sched::EngineProbe(eng).comm_info(comms[i]).reason == "non-blocking communicator");
    Buffers b(world.platform(), make_input(Spec{Collective::all_reduce, Path::two_shot, DataType::f32, ReduceOp::sum, 1000, 1}, r, 2));
    cudaStream_t s = new_stream(world.platform());
    CHECK(all_reduce(eng, b, 1000, DataType::f32, comms[i], s) == ncclSuccess);
    CHECK(last_path() == Path::passthrough);
    world.synchronize_rank();
    eng.comm_destroyed(comms[i]);
  });
}

TEST_CASE("error feedback follows the identity the application gives, never the buffer address") {
  const size_t count = 4096;
  // Two different tensors, X and Y, all-reduced from the same buffer (a caching allocator hands
  // the same address to both).
  const Spec sx{Collective::all_reduce, Path::one_shot, DataType::f32, ReduceOp::sum, count, 41};
  const Spec sy{Collective::all_reduce, Path::one_shot, DataType::f32, ReduceOp::sum, count, 42};
  const auto xs = inputs_for(sx, 2), ys = inputs_for(sy, 2);
  sim::World world(sim::Options{.nranks = 2});
  const auto comms = world.create_comm();
  std::vector<std::vector<Bytes>> outs(2);
  world.run_ranks([&](int r) {
    const size_t i = static_cast<size_t>(r);
    Config c = sim_config();
    c.error_feedback = true;
    sched::Engine eng(c, world.platform());
    eng.comm_created(comms[i]);
    Buffers b(world.platform(), xs[i]);
    cudaStream_t s = new_stream(world.platform());
    auto call = [&](const Bytes& data, uint64_t key) {
      world.synchronize_rank();
      std::memcpy(b.in, data.data(), data.size());
      sched::Engine::set_feedback_key(key);
      CHECK(sched::EngineProbe(eng).all_reduce_forced(Path::one_shot, b.in, b.out, count, ncclFloat32, ncclSum, comms[i], s) == ncclSuccess);
      world.synchronize_rank();
      outs[i].push_back(b.result());
    };
    call(xs[i], 7);  // 0: X, key 7: no residual yet
    call(ys[i], 9);  // 1: Y at the same address, key 9: must not get X's residual
    call(ys[i], 0);  // 2: Y, no key: no feedback
    call(xs[i], 7);  // 3: X again: its own residual applies
    eng.comm_destroyed(comms[i]);
  });
  // Without feedback, Y's result is what key 9's first call gave: X's residual never reached it.
  for (size_t r = 0; r < 2; ++r) {
    CHECK(outs[r][1] == outs[r][2]);
    CHECK(outs[r][3] != outs[r][0]);  // X's residual carried into X's next call
  }
  // And X's two calls average closer to the exact sum than either alone.
  double e_single = 0, e_mean = 0;
  for (size_t k = 0; k < count; ++k) {
    const double exact = double(quant::ref::load_elem(xs[0].data(), quant::ElemType::f32, k)) +
                         quant::ref::load_elem(xs[1].data(), quant::ElemType::f32, k);
    const double a = quant::ref::load_elem(outs[0][0].data(), quant::ElemType::f32, k);
    const double b = quant::ref::load_elem(outs[0][3].data(), quant::ElemType::f32, k);
    e_single += (a - exact) * (a - exact);
    e_mean += ((a + b) / 2 - exact) * ((a + b) / 2 - exact);
  }
  CHECK(e_mean < 0.6 * e_single);
  CHECK(world.races().empty());
  CHECK_MESSAGE(world.protocol_errors().empty(), first_failures(world.protocol_errors()));
  CHECK_FALSE(world.deadlocked());
}

// A host stand-in for the CUDA calls the residual store makes: every allocation and free recorded.
namespace store_cuda {
std::vector<void*> freed;
int allocations = 0;
cudaError_t malloc_fn(void** p, size_t n) {
  *p = std::malloc(n);
  ++allocations;
  return cudaSuccess;
}
cudaError_t free_fn(void* p) {
  freed.push_back(p);
  std::free(p);
  return cudaSuccess;
}
cudaError_t memset_fn(void* p, int v, size_t n, cudaStream_t) {
  std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t last_error_fn() { return cudaSuccess; }
}  // namespace store_cuda

TEST_CASE("error feedback: nothing allocated or freed under capture; a residual a graph holds outlives its key's new shape") {
  CudaApi api;
  api.Malloc = store_cuda::malloc_fn;
  api.Free = store_cuda::free_fn;
  api.MemsetAsync = store_cuda::memset_fn;
  api.GetLastError = store_cuda::last_error_fn;
  store_cuda::freed.clear();
  store_cuda::allocations = 0;
  const int64_t budget_bytes = 1 << 20;
  std::atomic<int64_t> budget{budget_bytes};
  float *a = nullptr, *b = nullptr, *c = nullptr;
  {
    sched::FeedbackStore store(api, budget);
    CHECK(store.residual_for(6, 10, DataType::f32, nullptr, /*capturing=*/true) == nullptr);  // a new key under capture
    a = store.residual_for(5, 100, DataType::f32, nullptr, false);
    REQUIRE(a != nullptr);
    CHECK(a[0] == 0.0f);
    CHECK(store.residual_for(5, 100, DataType::f32, nullptr, true) == a);  // captured: a graph now holds it
    CHECK(store.residual_for(5, 200, DataType::f32, nullptr, true) == nullptr);  // another shape under capture
    CHECK(store_cuda::freed.empty());
    CHECK(store_cuda::allocations == 1);
    b = store.residual_for(5, 200, DataType::f32, nullptr, false);  // eager: a new residual, the captured one kept
    REQUIRE(b != nullptr);
    CHECK(b != a);
    CHECK(store_cuda::freed.empty());
    c = store.residual_for(5, 300, DataType::f32, nullptr, false);  // b was never captured: freed at once
    REQUIRE(c != nullptr);
    CHECK(store_cuda::freed == std::vector<void*>{b});
    CHECK(budget.load() == budget_bytes - int64_t((100 + 300) * sizeof(float)));  // a is still held
  }
  // With the store (the communicator) gone, everything is freed and the budget is whole again.
  CHECK(store_cuda::freed.size() == 3);
  CHECK(std::count(store_cuda::freed.begin(), store_cuda::freed.end(), static_cast<void*>(a)) == 1);
  CHECK(std::count(store_cuda::freed.begin(), store_cuda::freed.end(), static_cast<void*>(c)) == 1);
  CHECK(budget.load() == budget_bytes);
}

// The engine's log is off for every case: they provoke its errors on purpose.
int main(int argc, char** argv) {
  log_set_level(LogLevel::off);
  return doctest::Context(argc, argv).run();
}

TEST_CASE("the process's scratch budget: the first communicator gets its cap, later ones half of what is left, then none") {
  sched::ScratchBudget budget(1ull << 30);  // the defaults: 1 GiB for the process, 512 MiB per communicator
  std::vector<uint64_t> offers;
  for (int i = 0; i < 9; ++i) offers.push_back(budget.take(512ull << 20) >> 20);
  CHECK(offers == std::vector<uint64_t>{512, 256, 128, 64, 32, 16, 0, 0, 0});
  CHECK(budget.held() == 1008ull << 20);
  budget.give_back(512ull << 20);  // the first communicator destroyed: 528 MiB left
  CHECK(budget.take(512ull << 20) == 264ull << 20);
  // A cap below the smallest cut is offered whole while half of what is left covers it, then none.
  sched::ScratchBudget small(1 << 20);
  CHECK(small.take(300 << 10) == (300u << 10));
  CHECK(small.take(300 << 10) == (300u << 10));  // half of the 724 KiB left covers it
  CHECK(small.take(300 << 10) == 0);             // half of the 424 KiB left does not
  CHECK(small.take(1000) == 768);     // whole 256-byte units
}
