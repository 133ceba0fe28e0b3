// A communicator's set-up on the simulated machine when a peer never answers (sched/README.md, "The
// agreement"): the set-up's deadline (setup_timeout_s), an abort from another thread, a set-up
// deferred to the group's end, host windows that do not fit the machine's shared memory, and the
// errors of fp8wire's own sub-communicators.
//   - a peer stopped or killed before each operation of the set-up (every all-gather, split, window
//     creation and opening), with NCCL's transports only, each direct kind and the hierarchical path,
//     2-4 ranks: every other rank's creation fails with the same error within the deadline (never
//     one rank going on while another gives up), nothing hangs, every window is freed.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/log.hpp"
#include "sched/comm/exchange.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/engine/engine.hpp"
#include "sched/engine/engine_probe.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;
using Clock = std::chrono::steady_clock;

namespace {

// --- a peer that stops at one operation of its set-up ------------------------------------------------
// The engines run over the simulated platform with its set-up operations (NCCL's all-gather and split,
// a window's creation and opening) wrapped: the victim's `at`-th one never happens. Its thread stops
// there (a stopped process) until the test lets it go, and then the operation fails, so that it too
// ends; with `kill` its process also ends there (its windows' owner gone).
struct Stop {
  const Platform* base = nullptr;
  sim::World* world = nullptr;
  int victim = -1;
  int at = -1;   // -1: never (counts the operations of a clean set-up)
  bool kill = false;
  std::atomic<int> count{0};
  std::atomic<bool> stopped{false};  // the victim has stopped
  std::atomic<bool> release{false};  // the test lets it go: this operation and every later one fail
  void reset(sim::World* w, int v, int a, bool k) {
    base = w ? &w->platform() : nullptr;
    world = w;
    victim = v;
    at = a;
    kill = k;
    count = 0;
    stopped = false;
    release = false;
  }
};
Stop g_stop;
thread_local int t_rank = -1;

bool stops_here(int rank = t_rank) {
  if (rank != g_stop.victim) return false;
  if (g_stop.stopped.load()) return true;  // let go: it fails what it does next, and ends
  if (g_stop.count++ != g_stop.at) return false;
  if (g_stop.kill) g_stop.world->end_process(rank);
  g_stop.stopped = true;
  while (!g_stop.release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return true;
}

// The set-up's NCCL calls run on threads of their own (sched/comm/exchange.hpp, call_with_deadline):
// the rank is the communicator's.
int rank_of(ncclComm_t comm) {
  int rank = -1;
  g_stop.base->nccl->CommUserRank(comm, &rank);
  return rank;
}

ncclResult_t w_all_gather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  return stops_here(rank_of(c)) ? ncclSystemError : g_stop.base->nccl->AllGather(s, r, n, t, c, st);
}
ncclResult_t w_split(ncclComm_t parent, int color, int key, ncclComm_t* out, ncclConfig_t* config) {
  return stops_here(rank_of(parent)) ? ncclSystemError : g_stop.base->nccl->CommSplit(parent, color, key, out, config);
}
cudaError_t w_create(WindowKind kind, size_t bytes, uint64_t tag, Window* out, WindowHandle* handle) {
  return stops_here() ? cudaErrorUnknown : g_stop.base->direct.create(kind, bytes, tag, out, handle);
}
cudaError_t w_open(const WindowHandle& handle, Window* out) {
  return stops_here() ? cudaErrorUnknown : g_stop.base->direct.open(handle, out);
}

// The world's platform with the set-up's operations wrapped.
struct WrappedPlatform {
  NcclApi nccl;
  Platform platform;
  explicit WrappedPlatform(const Platform& base) : nccl(*base.nccl), platform(base) {
    nccl.AllGather = w_all_gather;
    nccl.CommSplit = w_split;
    platform.nccl = &nccl;
    platform.direct.create = w_create;
    platform.direct.open = w_open;
  }
};

enum class Kind { nccl, host_memory, peer_memory, hierarchy };
const char* to_string(Kind k) {
  switch (k) {
    case Kind::nccl: return "NCCL's transports";
    case Kind::host_memory: return "direct host memory";
    case Kind::peer_memory: return "direct peer memory";
    case Kind::hierarchy: return "hierarchical path";
  }
  return "?";
}

constexpr double kDeadline = 0.3;  // setup_timeout_s of these runs

Config config_for(Kind kind, double timeout = kDeadline) {
  Config c = sim_config();
  c.setup_timeout_s = timeout;
  c.direct_transport = kind == Kind::host_memory   ? DirectMode::host_memory
                       : kind == Kind::peer_memory ? DirectMode::peer_memory
                                                   : DirectMode::off;
  c.direct_assume_one_host = true;
  c.direct_window_bytes = 1 << 20;
  return c;
}

sim::Options machine_for(Kind kind, int n) {
  sim::Options m;
  m.nranks = n;
  m.connect_at_first_collective = true;  // the agreement's launch waits for every peer, as NCCL's may
  if (kind == Kind::hierarchy) {
    m.nvlink = true;  // where the defaults take the hierarchical path
    for (int r = 0; r < n; ++r) m.hosts.push_back(static_cast<uint64_t>(100 + r / 2));
  }
  return m;
}

// A host call given up on (a launch that waits for its peers, a split) returns once its peers have
// ended; its thread must be gone before the machine. The count is process-wide: another rank (the
// victim, let go later) may start a call of its own just after this rank saw none, so the check is on
// what this wait saw, not on a second reading.
void wait_for_host_calls() {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  int in_flight = sched::host_calls_in_flight();
  while (in_flight > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    in_flight = sched::host_calls_in_flight();
  }
  CHECK(in_flight == 0);
}

struct SetupRun {
  std::vector<ncclResult_t> results;
  std::vector<double> seconds;
  std::vector<sched::CommInfo> infos;
  std::vector<char> registered_after;
  int operations = 0;  // the victim's set-up operations (all of them when it never stops)
  std::string problems;
};

// Every rank creates one communicator; the victim stops at its `at`-th set-up operation. Each live
// rank, once every live rank's creation has returned, aborts the communicator as the shim does after
// a failed creation; then the victim is let go.
SetupRun run_setup(Kind kind, int n, int victim, int at, bool kill) {
  sim::World world(machine_for(kind, n));
  const std::vector<ncclComm_t> comms = world.create_comm();
  WrappedPlatform wrapped(world.platform());
  g_stop.reset(&world, victim, at, kill);
  const Config config = config_for(kind);
  SetupRun out;
  out.results.assign(static_cast<size_t>(n), ncclSuccess);
  out.seconds.assign(static_cast<size_t>(n), 0);
  out.infos.resize(static_cast<size_t>(n));
  out.registered_after.assign(static_cast<size_t>(n), 0);
  std::atomic<int> returned{0};
  const int live = at < 0 ? n : n - 1;
  world.run_ranks([&](int r) {
    t_rank = r;
    const auto ru = static_cast<size_t>(r);
    sched::Engine eng(config, wrapped.platform);
    const auto start = Clock::now();
    out.results[ru] = eng.comm_created(comms[ru]);
    out.seconds[ru] = std::chrono::duration<double>(Clock::now() - start).count();
    out.infos[ru] = sched::EngineProbe(eng).comm_info(comms[ru]);
    if (at < 0 || r != victim) {
      // Every live rank has its answer before any aborts (the simulator's abort reaches every rank's
      // handle, NCCL's only the aborting rank's); then the victim goes on, and fails.
      if (++returned == live) g_stop.release = true;
      while (returned.load() < live) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // As the shim does after a failed creation; the victim ends its communicator either way (its
    // peers' NCCL then sees it gone, and a launch of theirs that waits for it returns).
    if (out.results[ru] != ncclSuccess || r == victim) eng.comm_abort(comms[ru]);
    else eng.comm_destroyed(comms[ru]);
    out.registered_after[ru] = sched::EngineProbe(eng).comm_info(comms[ru]).registered;
    // Every rank stays until the host calls given up on have returned (once the victim ended): the
    // simulator tells a deadlock by every rank waiting, and such a call's thread is none of them.
    wait_for_host_calls();
  });
  out.operations = g_stop.count.load();
  out.problems += world_problems(world);
  g_stop.reset(nullptr, -1, -1, false);
  return out;
}

}  // namespace

TEST_CASE("set-up: a peer stopped or killed before any of its set-up operations fails every live rank alike, within the deadline") {
  log_set_level(LogLevel::off);
  std::vector<std::string> failures;
  int runs = 0;
  for (Kind kind : {Kind::nccl, Kind::host_memory, Kind::peer_memory, Kind::hierarchy}) {
    for (int n : {2, 3, 4}) {
      if (kind == Kind::hierarchy && n != 4) continue;  // 2 hosts x 2 ranks
      // A clean set-up first: it succeeds everywhere and counts the victim's operations.
      const SetupRun clean = run_setup(kind, n, n - 1, -1, false);
      for (int r = 0; r < n; ++r)
        if (clean.results[static_cast<size_t>(r)] != ncclSuccess || !clean.infos[static_cast<size_t>(r)].fp8_ok ||
            clean.infos[static_cast<size_t>(r)].direct != (kind == Kind::host_memory || kind == Kind::peer_memory))
          failures.push_back(fmt::format("{}, {} ranks: the clean set-up failed on rank {}", to_string(kind), n, r));
      if (!clean.problems.empty()) failures.push_back(fmt::format("{}, {} ranks, clean: {}", to_string(kind), n, clean.problems));
      for (int at = 0; at < clean.operations; ++at) {
        for (bool kill : {false, true}) {
          const int victim = (at + (kill ? 1 : 0)) % n;  // every rank stops somewhere
          const SetupRun o = run_setup(kind, n, victim, at, kill);
          ++runs;
          const std::string what = fmt::format("{}, {} ranks, rank {} {} before its set-up operation {} of {}",
                                               to_string(kind), n, victim, kill ? "killed" : "stopped", at,
                                               clean.operations);
          if (!o.problems.empty()) failures.push_back(what + ": " + o.problems);
          for (int r = 0; r < n; ++r) {
            if (r == victim) continue;
            const auto ru = static_cast<size_t>(r);
            if (o.results[ru] != ncclRemoteError)
              failures.push_back(fmt::format("{}: rank {} returned {} (ncclRemoteError expected)", what, r,
                                             static_cast<int>(o.results[ru])));
            if (o.seconds[ru] < kDeadline * 0.9 || o.seconds[ru] > kDeadline + 5)
              failures.push_back(fmt::format("{}: rank {} returned after {:.2f} s (deadline {} s)", what, r,
                                             o.seconds[ru], kDeadline));
            if (o.registered_after[ru])
              failures.push_back(fmt::format("{}: rank {} still holds the communicator after its abort", what, r));
          }
        }
      }
    }
  }
  INFO(first_failures(failures));
  CHECK(failures.empty());
  MESSAGE(runs, " set-ups with a peer that never answered");
}

TEST_CASE("set-up: an abort from another thread releases a set-up waiting in a later round, without a deadline") {
  log_set_level(LogLevel::off);
  for (Kind kind : {Kind::host_memory, Kind::hierarchy}) {
    const int n = 4;
    sim::World world(machine_for(kind, n));
    const std::vector<ncclComm_t> comms = world.create_comm();
    WrappedPlatform wrapped(world.platform());
    g_stop.reset(&world, 3, 2, false);  // after the agreement: in the later round
    const Config config = config_for(kind, 0);  // no deadline: only the abort can end the wait
    std::vector<std::atomic<sched::Engine*>> engines(n);
    std::vector<ncclResult_t> results(n, ncclSuccess);
    std::vector<double> seconds(n, 0);
    std::atomic<bool> aborted{false};
    std::atomic<int> returned{0};
    std::thread watchdog([&] {
      // The application's watchdog on another thread: aborts every live rank's communicator a while
      // after the victim stopped.
      while (!g_stop.stopped.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      for (int r = 0; r < n - 1; ++r) {
        while (!engines[static_cast<size_t>(r)].load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        sim::set_thread_rank(r);
        engines[static_cast<size_t>(r)].load()->comm_abort(comms[static_cast<size_t>(r)]);
      }
      aborted = true;
    });
    world.run_ranks([&](int r) {
      t_rank = r;
      const auto ru = static_cast<size_t>(r);
      sched::Engine eng(config, wrapped.platform);
      engines[ru] = &eng;
      const auto start = Clock::now();
      results[ru] = eng.comm_created(comms[ru]);
      seconds[ru] = std::chrono::duration<double>(Clock::now() - start).count();
      if (r == 3) {
        eng.comm_abort(comms[3]);
      } else {
        if (++returned == n - 1) g_stop.release = true;
        while (!aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the watchdog is done with this engine
      }
      wait_for_host_calls();  // (as in run_setup)
    });
    watchdog.join();
    INFO(to_string(kind));
    for (int r = 0; r < n - 1; ++r) {
      CHECK(results[static_cast<size_t>(r)] != ncclSuccess);
      CHECK(seconds[static_cast<size_t>(r)] < 30);
    }
    CHECK_FALSE(world.deadlocked());
    CHECK(world.live_windows() == 0);
    g_stop.reset(nullptr, -1, -1, false);
  }
}

TEST_CASE("set-up: a communicator created in a group whose peer never answers fails at the group's end, and stays failed") {
  log_set_level(LogLevel::off);
  const int n = 3;
  sim::World world(machine_for(Kind::host_memory, n));
  const std::vector<ncclComm_t> comms = world.create_comm();
  WrappedPlatform wrapped(world.platform());
  g_stop.reset(&world, 2, 0, false);  // before the agreement's all-gather
  std::vector<ncclResult_t> ends(n), calls(n), asyncs(n);
  std::atomic<int> returned{0};
  world.run_ranks([&](int r) {
    t_rank = r;
    const auto ru = static_cast<size_t>(r);
    sched::Engine eng(config_for(Kind::host_memory), wrapped.platform);
    // Allocated first: a cudaFree synchronises the device, and the given-up exchange stays on the
    // communicator's lane until the application aborts it (sched/README.md, "The agreement").
    void *in = nullptr, *out = nullptr;
    world.platform().cuda.Malloc(&in, 4096);
    world.platform().cuda.Malloc(&out, 4096);
    cudaStream_t s = nullptr;
    world.platform().cuda.StreamCreateWithFlags(&s, cudaStreamNonBlocking);
    CHECK(eng.group_start() == ncclSuccess);
    CHECK(eng.comm_created(comms[ru]) == ncclSuccess);  // deferred to the group's end
    ends[ru] = eng.group_end();
    if (r != 2) {
      // The application goes on with it: a call returns the error instead of running on a
      // communicator whose peers may have concluded otherwise; so does its asynchronous error.
      calls[ru] = eng.all_reduce(in, out, 1024, ncclFloat32, ncclSum, comms[ru], s);
      asyncs[ru] = eng.comm_async_error(comms[ru]);
      if (++returned == n - 1) g_stop.release = true;
      while (returned.load() < n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    eng.comm_abort(comms[ru]);
    wait_for_host_calls();  // (as in run_setup)
    world.platform().cuda.Free(in);
    world.platform().cuda.Free(out);
    world.platform().cuda.StreamDestroy(s);
  });
  for (int r = 0; r < n - 1; ++r) {
    CHECK(ends[static_cast<size_t>(r)] == ncclRemoteError);
    CHECK(calls[static_cast<size_t>(r)] == ncclRemoteError);
    CHECK(asyncs[static_cast<size_t>(r)] == ncclRemoteError);
  }
  CHECK_FALSE(world.deadlocked());
  CHECK(world.live_windows() == 0);
  g_stop.reset(nullptr, -1, -1, false);
}

TEST_CASE("set-up: host windows that do not fit the machine's shared memory: every rank goes over NCCL alike, and one warning says why") {
  // Every warning of these runs, to count them.
  char log_path[] = "/tmp/fp8wire-setup-test-XXXXXX";
  const int log_fd = mkstemp(log_path);
  REQUIRE(log_fd >= 0);
  close(log_fd);
  log_set_file(log_path);
  log_set_level(LogLevel::warn);
  for (int n : {2, 3, 4}) {
    for (size_t room : {size_t{4096} * 4, (size_t{1} << 20) + 8 * 4096}) {  // the flag pages only; one window
      sim::Options m = machine_for(Kind::host_memory, n);
      m.host_window_room = room;
      sim::World world(m);
      const std::vector<ncclComm_t> comms = world.create_comm();
      std::vector<sched::CommInfo> infos(static_cast<size_t>(n));
      std::vector<ncclResult_t> results(static_cast<size_t>(n)), calls(static_cast<size_t>(n));
      const Spec spec{Collective::all_reduce, Path::one_shot, DataType::f32, ReduceOp::sum, 3000, 5};
      const auto inputs = inputs_for(spec, n);
      std::vector<Bytes> outs(static_cast<size_t>(n));
      world.run_ranks([&](int r) {
        const auto ru = static_cast<size_t>(r);
        sched::Engine eng(config_for(Kind::host_memory), world.platform());
        results[ru] = eng.comm_created(comms[ru]);
        infos[ru] = sched::EngineProbe(eng).comm_info(comms[ru]);
        void *in = nullptr, *out = nullptr;
        world.platform().cuda.Malloc(&in, inputs[ru].size());
        world.platform().cuda.Malloc(&out, inputs[ru].size());
        std::memcpy(in, inputs[ru].data(), inputs[ru].size());
        cudaStream_t s = nullptr;
        world.platform().cuda.StreamCreateWithFlags(&s, cudaStreamNonBlocking);
        calls[ru] = sched::EngineProbe(eng).all_reduce_forced(Path::one_shot, in, out, spec.count, ncclFloat32, ncclSum,
                                                               comms[ru], s);
        world.synchronize_rank();
        outs[ru] = Bytes(static_cast<char*>(out), static_cast<char*>(out) + inputs[ru].size());
        world.platform().cuda.Free(in);
        world.platform().cuda.Free(out);
        world.platform().cuda.StreamDestroy(s);
        eng.comm_destroyed(comms[ru]);
      });
      INFO(n, " ranks, ", room, " bytes of shared memory");
      for (int r = 0; r < n; ++r) {
        const auto ru = static_cast<size_t>(r);
        CHECK(results[ru] == ncclSuccess);
        CHECK(infos[ru].fp8_ok);
        CHECK_FALSE(infos[ru].direct);  // on no rank
        CHECK(calls[ru] == ncclSuccess);
        CHECK(outs[ru] == outs[0]);
      }
      CHECK_FALSE(world.deadlocked());
      CHECK(world.live_windows() == 0);
    }
  }
  log_set_level(LogLevel::off);
  log_set_file("");
  std::ifstream in(log_path);
  std::vector<std::string> warnings;
  for (std::string line; std::getline(in, line);)
    if (line.find(" WARN ") != std::string::npos) warnings.push_back(line);
  std::remove(log_path);
  INFO(fmt::format("{}", fmt::join(warnings, "\n")));
  REQUIRE(warnings.size() == 1);  // one, for the process (the first communicator that met it)
  CHECK(warnings[0].find("rank(s) 0, 1 found no room for it in /dev/shm") != std::string::npos);
  CHECK(warnings[0].find("docker run --shm-size=1g") != std::string::npos);
  CHECK(warnings[0].find("--ipc=host") != std::string::npos);
}

TEST_CASE("an asynchronous error of the hierarchical path's sub-communicators shows on the application's communicator") {
  log_set_level(LogLevel::off);
  const int n = 4;
  sim::World world(machine_for(Kind::hierarchy, n));
  const std::vector<ncclComm_t> comms = world.create_comm();
  std::vector<ncclResult_t> before(n), after(n);
  std::vector<Path> paths(n);
  std::atomic<int> ready{0}, checked{0};
  std::atomic<bool> failed{false};
  world.run_ranks([&](int r) {
    const auto ru = static_cast<size_t>(r);
    sched::Engine eng(config_for(Kind::hierarchy), world.platform());
    REQUIRE(eng.comm_created(comms[ru]) == ncclSuccess);
    const Spec spec{Collective::all_reduce, Path::hierarchical, DataType::bf16, ReduceOp::sum, 4000, 2};
    const Bytes input = make_input(spec, r, n);
    void *in = nullptr, *out = nullptr;
    world.platform().cuda.Malloc(&in, input.size());
    world.platform().cuda.Malloc(&out, input.size());
    std::memcpy(in, input.data(), input.size());
    cudaStream_t s = nullptr;
    world.platform().cuda.StreamCreateWithFlags(&s, cudaStreamNonBlocking);
    CHECK(eng.all_reduce(in, out, spec.count, ncclBfloat16, ncclSum, comms[ru], s) == ncclSuccess);
    world.synchronize_rank();
    std::vector<CallRecord> recs(Accounting::kCapacity);
    const size_t k = Accounting::instance().snapshot(recs.data(), recs.size(), 0);
    for (size_t i = k; i-- > 0;)
      if (recs[i].rank == r && recs[i].nranks == n) {
        paths[ru] = recs[i].path;
        break;
      }
    before[ru] = eng.comm_async_error(comms[ru]);
    ++ready;
    while (ready.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (r == 0) {
      world.abort_splits(comms[0]);  // NCCL fails the host and rail communicators
      failed = true;
    }
    while (!failed.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    after[ru] = eng.comm_async_error(comms[ru]);
    ++checked;
    while (checked.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    world.platform().cuda.Free(in);
    world.platform().cuda.Free(out);
    world.platform().cuda.StreamDestroy(s);
    eng.comm_abort(comms[ru]);
  });
  for (int r = 0; r < n; ++r) {
    CHECK(paths[static_cast<size_t>(r)] == Path::hierarchical);
    CHECK(before[static_cast<size_t>(r)] == ncclSuccess);
    CHECK(after[static_cast<size_t>(r)] == ncclRemoteError);
  }
  CHECK_FALSE(world.deadlocked());
}
