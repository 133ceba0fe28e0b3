// The direct transports at the end of a job (sched/transport/direct_windows.hpp, "Liveness"), on the simulated
// machine: ranks end at different times and in different ways, as real jobs do.
//   - every order in which 2, 3 and 4 ranks end, each by destroying its communicator, shutting the
//     process group down (the watchdog's error poll, then an abort), aborting, or its process ending
//     with nothing torn down: no rank still running ever sees an error (the shim's
//     ncclCommGetAsyncError asks Engine::comm_peer_lost), nothing hangs, every window is freed;
//   - a peer gone while this rank's collective waits on it (its process ended, or it closed its
//     communicator out of step): the error is reported, and the application's abort then releases
//     the waiting lanes: never a hang; a destroy instead of the abort releases them too, and returns
//     ncclRemoteError (that call's output is not valid), never success.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/log.hpp"
#include "sched/engine/engine.hpp"
#include "sched/engine/engine_probe.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;

namespace {

enum class Ending : uint8_t { destroy, shutdown, abort, process_end };
constexpr Ending kEndings[] = {Ending::destroy, Ending::shutdown, Ending::abort, Ending::process_end};

const char* to_string(Ending e) {
  switch (e) {
    case Ending::destroy: return "destroy";
    case Ending::shutdown: return "shutdown";
    case Ending::abort: return "abort";
    case Ending::process_end: return "process end";
  }
  return "?";
}

Config direct_config(DirectMode kind) {
  Config c = sim_config();
  c.direct_transport = kind;
  c.direct_assume_one_host = true;  // the simulated ranks are separate hosts to NCCL, as emulated ranks are
  c.direct_window_bytes = 1 << 20;
  return c;
}

constexpr size_t kCount = 3 * 128 + 5;  // bf16 elements per call: a short last shard

// One job: every rank runs `calls` all-reduces over the direct transport and waits for them; then the
// ranks end one after the other in `order`, rank r by `endings[r]`. While waiting for its turn each
// rank polls the communicator's error as PyTorch's watchdog does. Returns "" or what went wrong.
std::string run_job(DirectMode mode, const std::vector<Ending>& endings, const std::vector<int>& order,
                    Path path = Path::one_shot, int calls = 2) {
  const int n = static_cast<int>(endings.size());
  sim::Options machine;
  machine.nranks = n;
  sim::World world(machine);
  const Platform& p = world.platform();
  const std::vector<ncclComm_t> comms = world.create_comm();
  const Config config = direct_config(mode);
  std::vector<int> turn_of(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) turn_of[static_cast<size_t>(order[static_cast<size_t>(i)])] = i;
  std::atomic<int> turn{-1};  // -1: the collectives are still running somewhere
  std::atomic<int> finished_calls{0};
  std::vector<std::string> failures(static_cast<size_t>(n));
  std::vector<std::unique_ptr<sched::Engine>> ended(static_cast<size_t>(n));  // torn down after the job
  world.run_ranks([&](int r) {
    const auto ru = static_cast<size_t>(r);
    std::string& failure = failures[ru];
    auto eng = std::make_unique<sched::Engine>(config, p);
    const ncclComm_t comm = comms[ru];
    eng->comm_created(comm);
    if (!sched::EngineProbe(*eng).comm_info(comm).direct) failure = "the direct transport was not set up";
    cudaStream_t stream = nullptr;
    p.cuda.StreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    void *in = nullptr, *out = nullptr;
    p.cuda.Malloc(&in, kCount * 2);
    p.cuda.Malloc(&out, kCount * 2);
    std::memset(in, 0x3c, kCount * 2);  // bf16 1.46...: finite, non-zero
    for (int i = 0; i < calls; ++i)
      if (sched::EngineProbe(*eng).all_reduce_forced(path, in, out, kCount, ncclBfloat16, ncclSum, comm, stream) != ncclSuccess)
        failure = fmt::format("call {} failed", i);
    if (p.cuda.StreamSynchronize(stream) != cudaSuccess) failure = "the stream did not complete";
    p.cuda.Free(in);
    p.cuda.Free(out);
    p.cuda.StreamDestroy(stream);
    if (++finished_calls == n) turn = 0;
    // Until its turn, the rank's watchdog polls while the ranks before it end.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (turn.load() != turn_of[ru]) {
      if (turn.load() >= 0 && eng->comm_peer_lost(comm) && failure.empty())
        failure = fmt::format("an error reported after {} rank(s) ended", turn.load());
      if (std::chrono::steady_clock::now() > deadline) {
        failure = "its turn never came (a rank before it hung)";
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    switch (endings[ru]) {
      case Ending::destroy:
        if (eng->comm_destroyed(comm) != ncclSuccess && failure.empty()) failure = "its destroy returned an error";
        p.nccl->CommDestroy(comm);
        break;
      case Ending::shutdown:
        if (eng->comm_peer_lost(comm) && failure.empty()) failure = "shutdown's error poll reported an error";
        eng->comm_abort(comm);
        break;
      case Ending::abort:
        eng->comm_abort(comm);
        break;
      case Ending::process_end:
        // Nothing torn down: the process is gone. Its engine is destroyed after the job, only to
        // free the simulator's memory.
        world.end_process(r);
        ended[ru] = std::move(eng);
        break;
    }
    eng.reset();
    ++turn;
  });
  for (int r = 0; r < n; ++r) {
    sim::set_thread_rank(r);
    ended[static_cast<size_t>(r)].reset();
  }
  std::string out;
  for (int r = 0; r < n; ++r)
    if (!failures[static_cast<size_t>(r)].empty()) out += fmt::format("rank {}: {}; ", r, failures[static_cast<size_t>(r)]);
  return out + world_problems(world);
}

std::string describe(DirectMode mode, const std::vector<Ending>& endings, const std::vector<int>& order) {
  std::string s = fmt::format("{}, {} ranks, ending in order", to_string(mode), endings.size());
  for (int r : order) s += fmt::format(" {}:{}", r, to_string(endings[static_cast<size_t>(r)]));
  return s;
}

}  // namespace

TEST_CASE("teardown: every order and way of ending among 2-4 ranks is no error, never a hang, nothing left") {
  log_set_level(LogLevel::off);
  std::vector<std::string> failures;
  int jobs = 0;
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (int n = 2; n <= 4; ++n) {
      std::vector<Ending> endings(static_cast<size_t>(n));
      // Every way of ending for every rank; every order of the ranks at 2 and 3, and at 4 the orders
      // in which each rank is first and each is last (a rotation and its reverse).
      const int ways = 1 << (2 * n);
      for (int code = 0; code < ways; ++code) {
        for (int r = 0; r < n; ++r) endings[static_cast<size_t>(r)] = kEndings[(code >> (2 * r)) & 3];
        std::vector<int> order(static_cast<size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        std::vector<std::vector<int>> orders;
        if (n <= 3) {
          do orders.push_back(order);
          while (std::next_permutation(order.begin(), order.end()));
        } else {
          std::rotate(order.begin(), order.begin() + code % n, order.end());
          orders.push_back(order);
          std::reverse(order.begin(), order.end());
          orders.push_back(order);
        }
        for (const std::vector<int>& o : orders) {
          ++jobs;
          if (std::string f = run_job(mode, endings, o); !f.empty()) failures.push_back(describe(mode, endings, o) + ": " + f);
        }
      }
    }
  }
  INFO(first_failures(failures));
  CHECK(failures.empty());
  MESSAGE(jobs, " jobs ended cleanly");
}

TEST_CASE("teardown: after two-shot all-reduces, ranks end as cleanly") {
  log_set_level(LogLevel::off);
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory})
    for (const std::vector<int>& order : {std::vector<int>{0, 1, 2}, std::vector<int>{2, 1, 0}}) {
      const std::vector<Ending> endings = {Ending::process_end, Ending::destroy, Ending::shutdown};
      INFO(describe(mode, endings, order));
      CHECK(run_job(mode, endings, order, Path::two_shot, 3) == "");
    }
}

namespace {

// Rank 0 issues an all-reduce that needs rank 1; rank 1 never issues it and goes (its process ends,
// or it destroys its communicator out of step). Rank 0's watchdog must see the error, and its abort
// must release the lanes. Returns "" or what went wrong.
// How the pipeline's lanes hand stages over (the recipe's LaneHandover): with copy lanes (an eager
// call) or by events alone (a captured one).
// `queues`: sim::Options::hw_queues (1: every stream of a rank on one first-in first-out queue, where a
// waiting lane holds back all later work, the application's too).
enum class Lanes { copy_lanes, events };
const char* to_string(Lanes l) { return l == Lanes::copy_lanes ? "copy lanes" : "lane events (captured)"; }

// `close`: how rank 0 ends its communicator once the error shows: by an abort (what PyTorch's
// watchdog does), or by a destroy (a shutdown that does not look at the error first).
std::string run_gone_mid_collective(DirectMode mode, Ending how, Lanes lanes, int queues, Ending close) {
  sim::Options machine;
  machine.nranks = 2;
  machine.hw_queues = queues;
  machine.capturing = lanes == Lanes::events;
  sim::World world(machine);
  const Platform& p = world.platform();
  const std::vector<ncclComm_t> comms = world.create_comm();
  Config config = direct_config(mode);
  std::atomic<int> ready{0};
  std::atomic<bool> gone{false}, rank0_done{false};
  std::string failure;
  std::unique_ptr<sched::Engine> ended;
  world.run_ranks([&](int r) {
    auto eng = std::make_unique<sched::Engine>(config, p);
    eng->comm_created(comms[static_cast<size_t>(r)]);
    ++ready;
    while (ready.load() < 2) std::this_thread::yield();
    if (r == 1) {
      if (how == Ending::process_end) {
        world.end_process(1);
        ended = std::move(eng);
      } else {
        eng->comm_destroyed(comms[1]);
        p.nccl->CommDestroy(comms[1]);
      }
      gone = true;
      // The thread stays (not a simulated wait) until rank 0 is done, so the simulator's deadlock
      // check sees a rank that may still act.
      while (!rank0_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    while (!gone.load()) std::this_thread::yield();
    cudaStream_t stream = nullptr;
    p.cuda.StreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    void *in = nullptr, *out = nullptr;
    p.cuda.Malloc(&in, kCount * 2);
    p.cuda.Malloc(&out, kCount * 2);
    std::memset(in, 0x3c, kCount * 2);
    if (sched::EngineProbe(*eng).all_reduce_forced(Path::one_shot, in, out, kCount, ncclBfloat16, ncclSum, comms[0], stream) != ncclSuccess)
      failure = "the call was not issued";
    // The watchdog: polls until the error shows (the lanes run in the polls' stream queries).
    bool lost = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!lost && std::chrono::steady_clock::now() < deadline) {
      p.cuda.StreamQuery(stream);
      lost = eng->comm_peer_lost(comms[0]);
      if (!lost) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!lost && failure.empty()) failure = "no error within 30 s while the collective waits on a gone peer";
    if (eng->comm_async_error(comms[0]) != ncclRemoteError && failure.empty())
      failure = "the communicator's asynchronous error is not ncclRemoteError";
    // A stalled job's diagnosis names the gone peer (ended, or closed out of step) and the flag the
    // lanes wait on (a release flag of rank 1's that this rank reclaimed: free[set][1] = 0).
    if (const std::string state = eng->debug_state();
        (state.find(how == Ending::process_end ? "rank 1 gone" : "rank 1 closed") == std::string::npos ||
         state.find("][1]=0") == std::string::npos || state.find("busy") == std::string::npos) &&
        failure.empty())
      failure = "the state's diagnosis does not show the wait on rank 1: " + state;
    if (close == Ending::destroy) {
      const ncclResult_t destroyed = eng->comm_destroyed(comms[0]);
      p.nccl->CommDestroy(comms[0]);
      if (destroyed != ncclRemoteError && failure.empty())
        failure = fmt::format("the destroy returned {} where ncclRemoteError was expected", static_cast<int>(destroyed));
    } else {
      eng->comm_abort(comms[0]);
    }
    if (p.cuda.StreamSynchronize(stream) != cudaSuccess && failure.empty()) failure = "the abort did not release the lanes";
    p.cuda.Free(in);
    p.cuda.Free(out);
    p.cuda.StreamDestroy(stream);
    eng.reset();
    rank0_done = true;
  });
  sim::set_thread_rank(1);
  ended.reset();
  return (failure.empty() ? "" : failure + "; ") + world_problems(world);
}

// Every (direct kind, way rank 1 went, lane hand-over, hardware queues) of run_gone_mid_collective,
// rank 0 closing by `close`.
void check_gone_mid_collective(Ending close) {
  log_set_level(LogLevel::off);
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory})
    for (Ending how : {Ending::process_end, Ending::destroy})
      for (Lanes lanes : {Lanes::copy_lanes, Lanes::events})
        for (int queues : {0, 1}) {
          INFO(to_string(mode), ", rank 1 gone by ", to_string(how), ", ", to_string(lanes), ", hardware queues ", queues);
          CHECK(run_gone_mid_collective(mode, how, lanes, queues, close) == "");
        }
}

}  // namespace

TEST_CASE("teardown: a peer gone while a collective waits on it is an error, and the abort releases the wait") {
  check_gone_mid_collective(Ending::abort);
}

TEST_CASE("teardown: a destroy while a collective waits on a gone peer releases the wait and returns an error") {
  check_gone_mid_collective(Ending::destroy);
}
