// The CPU tier of the direct transports (sched/transport/direct_windows.hpp): the engine, unchanged, over the
// simulated machine, with windows every simulated rank maps and the flag handshakes as simulated
// stream memory operations.
//   - every direct algorithm (one-shot, two-shot, reduce-scatter, all-gather), both kinds (peer
//     memory, host memory): bit for bit the reference algorithm (so the same bytes as over NCCL),
//     identical on every rank, within the bound, for 2, 3, 4, 8 and 16 ranks (16 not in the sanitizer
//     tier: kSanitizerTier), every dtype, sum/avg, odd counts,
//     one stage and many, back-to-back calls (the flags must be back in their initial state);
//   - faults: each flag operation, codec launch and window operation fails in turn on the first and
//     last rank: every rank returns an error, sees the communicator's error, or holds the right
//     result; nothing hangs once the application aborts (the abort releases the waits); nothing
//     leaks, windows included;
//   - a rank that never arrives: the others' lanes wait on its flags until an abort from another
//     thread releases them;
//   - a rank's streams on one or two shared first-in first-out hardware queues (as
//     CUDA_DEVICE_MAX_CONNECTIONS makes them): every program, with each copy and flag option, completes.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "common/log.hpp"
#include "sched/algorithms/algorithms.hpp"
#include "sched/transport/direct_windows.hpp"
#include "sched/engine/engine.hpp"
#include "sched/engine/engine_probe.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;

namespace {

const Variant kVariants[] = {{Collective::all_reduce, Path::two_shot},
                             {Collective::all_reduce, Path::one_shot},
                             {Collective::reduce_scatter, Path::two_shot},
                             {Collective::all_gather, Path::one_shot}};

Config direct_config(DirectMode kind, size_t window, size_t stage_bytes = 8 << 20) {
  Config c = sim_config();
  c.direct_transport = kind;
  c.direct_assume_one_host = true;  // the simulated ranks are separate hosts to NCCL, as emulated ranks are
  c.direct_window_bytes = window;
  c.direct_stage_bytes = stage_bytes;
  return c;
}

// The stage of a direct call of `count` elements of `t`: the library's rule over one buffer set of
// the window `c` describes; 0 when not even one unit fits (the call goes over NCCL).
size_t direct_stage_for(const Config& c, Collective collective, Path path, size_t count, DataType t, int n) {
  const size_t set = sched::direct_set_bytes_of(c.direct_window_bytes, static_cast<int>(c.direct_sets));
  return sched::direct_stage_elems(c, set, collective, path, count, dtype_size(t), n, quant::WireFormat::from(c));
}

Carrier kind_of(DirectMode m) {
  return m == DirectMode::peer_memory ? Carrier::peer_memory : Carrier::host_memory;
}

// check_clean, and every rank's calls carried by `kind`; with a second call, its bytes those of the first.
std::string check_carried(const Run& cfg, const Spec& spec, const std::vector<Bytes>& inputs, const Outcome& o,
                                Carrier kind) {
  std::string e = check_clean(cfg, spec, inputs, o);
  const int n = static_cast<int>(inputs.size());
  for (int r = 0; r < n && e.empty(); ++r) {
    if (o.transports[static_cast<size_t>(r)] != kind)
      e = fmt::format("{}: rank {} went over {}", describe(spec, n, cfg.config), r,
                      to_string(o.transports[static_cast<size_t>(r)]));
    else if (cfg.second_call && o.second[static_cast<size_t>(r)].out != o.first[static_cast<size_t>(r)].out)
      e = fmt::format("{}: rank {}: the second call differs from the first", describe(spec, n, cfg.config), r);
  }
  return e;
}

}  // namespace

TEST_CASE("every algorithm over both direct transports: the reference bit for bit, alike on every rank, in bound") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, pipelined = 0;
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (int n : {2, 3, 4, 8, 16}) {
      if (kSanitizerTier && n == 16) continue;
      for (const Variant& v : kVariants) {
        for (DataType t : {DataType::f32, DataType::f16, DataType::bf16}) {
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
            if (v.collective == Collective::all_gather && op == ReduceOp::avg) continue;
            if (n == 16 && t != DataType::bf16) continue;
            for (size_t count : {size_t{1}, size_t{127}, size_t(3 * n * 128 + 5), size_t{4099}}) {
              // A window of 1 MiB takes each call in one stage; 24 KiB (and a 2 KiB stage cap) cuts
              // the larger ones into many, the buffer sets in turn.
              for (auto [window, stage] : {std::pair<size_t, size_t>{1 << 20, 8 << 20}, {24 << 10, 2 << 10}}) {
                if (count < 1000 && window < (1 << 20)) continue;  // one stage either way
                Run cfg;
                cfg.config = direct_config(mode, window, stage);
                cfg.abort_all = true;
                cfg.second_call = count == 4099;  // back to back, unsynchronised: the flags are reused
                Spec spec{v.collective, v.path, t, op, count, 7u + count};
                const size_t st = direct_stage_for(cfg.config, v.collective, v.path, count, t, n);
                if (st == 0) continue;  // does not fit one buffer set: over NCCL (tested below)
                if (st < count) ++pipelined;
                const auto inputs = inputs_for(spec, n);
                const Outcome o = run(cfg, spec, inputs);
                ++runs;
                const std::string e = check_carried(cfg, spec, inputs, o, kind_of(mode));
                if (!e.empty()) failures.push_back(e);
              }
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(pipelined > 100);
  MESSAGE(runs << " runs over the direct transports (" << pipelined << " pipelined): bit-exact, alike, in bound");
}

TEST_CASE("own data on the device (direct.own_on_device), with and without copy-in and copy-out: the same bytes, its windows still written for the peers") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, copied = 0, copied_in = 0, copied_out = 0;
  for (auto [copy_in, copy_out] : {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}, std::pair{true, true}})
  for (int n : {2, 3, 4, 8}) {
    if (kSanitizerTier && n == 8) continue;
    for (const Variant& v : kVariants) {
      for (DataType t : {DataType::f32, DataType::bf16}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
          if (v.collective == Collective::all_gather && op == ReduceOp::avg) continue;
          for (size_t count : {size_t{127}, size_t(3 * n * 128 + 5), size_t{4099}}) {
            // One stage in a 1 MiB window; many in 24 KiB; and a device buffer set of 3 KiB
            // (scratch.max_bytes 8 KiB): the larger stages' own data then goes through the window.
            for (auto [window, stage, scratch] : {std::tuple<size_t, size_t, size_t>{1 << 20, 8 << 20, 512 << 10},
                                                  {24 << 10, 2 << 10, 512 << 10},
                                                  {1 << 20, 8 << 20, 8 << 10}}) {
              Run cfg;
              cfg.config = direct_config(DirectMode::host_memory, window, stage);
              cfg.config.direct_own_on_device = true;
              cfg.config.direct_copy_in = copy_in;
              cfg.config.direct_copy_out = copy_out;
              cfg.config.scratch_max_bytes = scratch;
              cfg.abort_all = true;
              cfg.second_call = count == 4099;
              Spec spec{v.collective, v.path, t, op, count, 11u + count};
              if (direct_stage_for(cfg.config, v.collective, v.path, count, t, n) == 0) continue;
              const auto inputs = inputs_for(spec, n);
              const Outcome o = run(cfg, spec, inputs);
              ++runs;
              std::string e = check_carried(cfg, spec, inputs, o, Carrier::host_memory);
              // What its peers read of its own (one-shot and all-gather: its input; two-shot: its
              // reduced shard) reaches its window by a copy; the reduce-scatter's own block needs none.
              const auto copies = [&](int r) {
                const int site = static_cast<int>(sim::Site::memcpy_async);
                return o.after_calls[static_cast<size_t>(r)][site] - o.after_setup[static_cast<size_t>(r)][site];
              };
              if (e.empty() && v.collective != Collective::reduce_scatter && scratch > (8 << 10)) {
                if (copies(0) == 0) e = fmt::format("{}: rank 0 copied nothing into its window", describe(spec, n, cfg.config));
                else ++copied;
              }
              // Copy-in: every peer's data reaches the device set by a copy, the reduce-scatter's too
              // (one copy per run of inbox slots), so there are more copies than without it.
              if (e.empty() && copy_in && scratch > (8 << 10)) {
                if (copies(0) < (v.collective == Collective::reduce_scatter ? 1 : 2))
                  e = fmt::format("{}: rank 0 copied {} times with copy-in", describe(spec, n, cfg.config), copies(0));
                else ++copied_in;
              }
              // Copy-out: the reduce-scatter's blocks and two-shot's shards for the peers reach their
              // windows by copies, so there are more copies than without it (the one-shot all-reduce
              // and the all-gather write nothing for one peer alone; 127 elements leave some shards
              // empty, and more ranks' shards than a stage's blocks fill are empty too).
              const bool writes_for_peers = v.collective == Collective::reduce_scatter || v.path == Path::two_shot;
              if (e.empty() && copy_out && writes_for_peers && scratch > (8 << 10) && count > 127) {
                Run plain = cfg;
                plain.config.direct_copy_out = false;
                const Outcome p = run(plain, spec, inputs);
                const int site = static_cast<int>(sim::Site::memcpy_async);
                const int without = p.after_calls[0][site] - p.after_setup[0][site];
                if (copies(0) <= without)
                  e = fmt::format("{}: rank 0 copied {} times with copy-out, {} without", describe(spec, n, cfg.config),
                                  copies(0), without);
                else ++copied_out;
              }
              if (!e.empty()) failures.push_back(e);
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(copied > 50);
  CHECK(copied_in > 50);
  CHECK(copied_out > 50);
  MESSAGE(runs << " runs with own data on the device: bit-exact, alike, in bound");
}

namespace {
// A call of many stages (the sets in turn, each reused), every rank aborting its communicator at the
// end; with count 4099 a second call follows the first.
Run many_stages(DirectMode mode, bool in_place, size_t count) {
  Run cfg;
  cfg.config = direct_config(mode, 24 << 10, 2 << 10);
  cfg.abort_all = true;
  cfg.in_place = in_place;
  cfg.second_call = count == 4099;
  return cfg;
}
// Rank 0's calls at `site` in the first call.
int calls_at(const Outcome& o, sim::Site site) {
  const int i = static_cast<int>(site);
  return o.after_calls[0][i] - o.after_setup[0][i];
}
// Runs `spec` on its ranks under `cfg`, checks the bytes and that the direct transport of `mode`
// carried every call (a failure goes into `failures`); returns rank 0's calls at `site` (by default
// its stream waits).
int run_carried(const Run& cfg, const Spec& spec, int n, DirectMode mode, std::vector<std::string>& failures,
                sim::Site site = sim::Site::stream_wait) {
  const auto inputs = inputs_for(spec, n);
  const Outcome o = run(cfg, spec, inputs);
  if (std::string e = check_carried(cfg, spec, inputs, o, kind_of(mode)); !e.empty()) failures.push_back(std::move(e));
  return calls_at(o, site);
}
}  // namespace

TEST_CASE("the copy orders (direct.early_copy_in, direct.paced_sends), each on and off: the same bytes, no race; pacing waits where it should") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, paced_calls = 0;
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (int n : {2, 3, 4}) {
      for (const Variant& v : kVariants) {
        for (bool in_place : {false, true}) {
          for (size_t count : {size_t(3 * n * 128 + 5), size_t{4099}}) {
            // Stage waits of each (early, paced) run of this case: [early][paced].
            int waits[2][2] = {};
            for (bool early : {false, true}) {
              for (bool paced : {false, true}) {
                Run cfg = many_stages(mode, in_place, count);
                cfg.config.direct_early_copy_in = early;
                cfg.config.direct_paced_sends = paced;
                Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::sum, count, 13u + count};
                const size_t st = direct_stage_for(cfg.config, v.collective, v.path, count, DataType::bf16, n);
                if (st == 0 || st >= count) continue;  // one stage: nothing to order
                ++runs;
                waits[early][paced] = run_carried(cfg, spec, n, mode, failures);
              }
            }
            if (waits[0][0] == 0) continue;  // not run (one stage)
            // Early copy-in moves the stage's wait, it adds none; pacing adds one wait per stage but
            // the first, over host memory and for programs without a gather (not two-shot's all-reduce).
            const bool gather = v.collective == Collective::all_reduce && v.path == Path::two_shot;
            const bool pacing = mode == DirectMode::host_memory && !gather;
            for (bool early : {false, true}) {
              if (waits[early][0] != waits[0][0])
                failures.push_back(fmt::format("{} n={} {}: early copy-in changed the stage waits {} -> {}",
                                               to_string(v.collective), n, to_string(mode), waits[0][0], waits[early][0]));
              const bool more = waits[early][1] > waits[early][0];
              if (more != pacing)
                failures.push_back(fmt::format("{} {} n={} {}: paced {} stage waits, unpaced {}", to_string(v.collective),
                                               to_string(v.path), n, to_string(mode), waits[early][1], waits[early][0]));
              else if (more)
                ++paced_calls;
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(paced_calls > 20);
  MESSAGE(runs << " runs with the copy orders on and off: bit-exact, alike, in bound; " << paced_calls << " paced");
}

TEST_CASE("direct.copy_lanes: sends and copy-in on lanes of their own: the same bytes, no race; used by every program") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, on_copy_lanes = 0;
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (int n : {2, 3, 4}) {
      for (const Variant& v : kVariants) {
        for (bool in_place : {false, true}) {
          // Three sets (two-shot's gather one stage late, after the next stage's finish) and two (right
          // after its own); 4099 elements reuse every set.
          for (auto [count, sets] : {std::pair{size_t(3 * n * 128 + 5), 3u}, {size_t{4099}, 3u}, {size_t{4099}, 2u}}) {
            int waits[2] = {};  // stream waits of rank 0 without and with copy lanes
            for (bool copy_lanes : {false, true}) {
              Run cfg = many_stages(mode, in_place, count);
              cfg.config.direct_copy_lanes = copy_lanes;
              cfg.config.direct_sets = sets;
              Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::sum, count, 29u + count};
              ++runs;
              waits[copy_lanes] = run_carried(cfg, spec, n, mode, failures);
            }
            // The copy lanes hop to and from the kernel lanes: more waits, for every program (two-shot's
            // gather included).
            if (waits[1] <= waits[0])
              failures.push_back(fmt::format("{} {} n={} {}: {} stream waits with copy lanes, {} without",
                                             to_string(v.collective), to_string(v.path), n, to_string(mode), waits[1],
                                             waits[0]));
            else
              ++on_copy_lanes;
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(on_copy_lanes > 20);
  MESSAGE(runs << " runs with copy lanes on and off: bit-exact, alike, in bound; " << on_copy_lanes << " on copy lanes");
}

TEST_CASE("the simulator's hardware queues: a wait issued before the signal its peer waits for hangs on one queue, not on two") {
  // Each of two ranks waits on one stream for the other's flag, then signals its own on another
  // stream. On streams of their own both complete; on one queue each wait holds back its own signal.
  for (int queues : {0, 1, 2}) {
    sim::Options machine;
    machine.hw_queues = queues;
    sim::World world(machine);
    const Platform& p = world.platform();
    Window own{}, mapped{};
    WindowHandle handle{};
    sim::set_thread_rank(0);
    REQUIRE(p.direct.create(WindowKind::host, 256, 0, &own, &handle) == cudaSuccess);
    sim::set_thread_rank(1);
    REQUIRE(p.direct.open(handle, &mapped) == cudaSuccess);
    std::atomic<int> failed{0};
    world.run_ranks([&](int r) {
      auto* flags = reinterpret_cast<uint32_t*>((r == 0 ? own : mapped).device);
      cudaStream_t wait = nullptr, signal = nullptr;
      p.cuda.StreamCreateWithFlags(&wait, cudaStreamNonBlocking);
      p.cuda.StreamCreateWithFlags(&signal, cudaStreamNonBlocking);
      p.cuda.StreamWaitValue32(wait, flags + (1 - r), 1);
      p.cuda.StreamWriteValue32(signal, flags + r, 1);
      if (world.synchronize_rank() != cudaSuccess) ++failed;
    });
    INFO(queues << " queue(s)");
    CHECK(world.deadlocked() == (queues == 1));
    CHECK((failed.load() > 0) == (queues == 1));
  }
}

TEST_CASE("streams that share hardware queues (CUDA_DEVICE_MAX_CONNECTIONS of 1 or 2): every program completes, the same bytes") {
  // CUDA runs the streams of a process on a few first-in first-out connections: past that many
  // streams, or with CUDA_DEVICE_MAX_CONNECTIONS=1 as some training stacks set it, a stream's wait on
  // a peer's flag holds back whatever this rank issued after it on any stream of its connection. So a
  // rank must issue every signal its peers wait on before the waits that depend on theirs.
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0;
  struct Options {
    const char* name;
    void (*set)(Config&);
  };
  const Options options[] = {
      {"defaults", [](Config&) {}},
      {"no copy lanes", [](Config& c) { c.direct_copy_lanes = false; }},
      {"per-peer flags", [](Config& c) { c.direct_per_peer_flags = true; }},
      {"outbox", [](Config& c) { c.direct_outbox = true; }},
      {"lane flags", [](Config& c) { c.direct_lane_flags = true; }},
      {"lanes apart", [](Config& c) { c.direct_lanes_apart = true; }},
      {"no early copy-in, not paced", [](Config& c) { c.direct_early_copy_in = false, c.direct_paced_sends = false; }},
  };
  for (int queues : {1, 2}) {
    for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
      for (int n : {2, 3, 4}) {
        for (const Variant& v : kVariants) {
          for (const Options& opt : options) {
            for (size_t count : {size_t(3 * n * 128 + 5), size_t{4099}}) {
              Run cfg = many_stages(mode, false, count);
              cfg.machine.hw_queues = queues;
              opt.set(cfg.config);
              Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::sum, count, 37u + count};
              ++runs;
              const size_t before = failures.size();
              run_carried(cfg, spec, n, mode, failures);
              for (size_t i = before; i < failures.size(); ++i)
                failures[i] = fmt::format("{} queue(s), {}: {}", queues, opt.name, failures[i]);
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  MESSAGE(runs << " runs on shared hardware queues: no hang, bit-exact, alike, in bound");
}

TEST_CASE("direct.per_peer_flags: each peer signalled and copied in on its own: the same bytes, no race; used where a rank copies in") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, per_peer = 0;
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (int n : {2, 3, 4}) {
      for (const Variant& v : kVariants) {
        for (bool in_place : {false, true}) {
          for (bool copy_lanes : {false, true}) {
            for (auto [count, sets] : {std::pair{size_t(3 * n * 128 + 5), 3u}, {size_t{4099}, 3u}, {size_t{4099}, 2u}}) {
              int copies[2] = {};  // rank 0's copies without and with per-peer flags
              for (bool flags : {false, true}) {
                Run cfg = many_stages(mode, in_place, count);
                cfg.config.direct_copy_lanes = copy_lanes;
                cfg.config.direct_sets = sets;
                cfg.config.direct_per_peer_flags = flags;
                Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::sum, count, 31u + count};
                ++runs;
                copies[flags] = run_carried(cfg, spec, n, mode, failures, sim::Site::memcpy_async);
              }
              // The reduce-scatter's and two-shot's copy-in read one inbox, whose peers' slots a rank
              // otherwise copies in one piece (rank 0: slots 1..n-1); per peer it is a copy each. Only
              // over host memory, where a rank copies in; the one-shot and the all-gather copy each
              // peer's window apart either way.
              const bool inbox = v.collective == Collective::reduce_scatter || v.path == Path::two_shot;
              const bool more = mode == DirectMode::host_memory && inbox && n > 2;
              const std::string what = fmt::format("{} {} n={} {}", to_string(v.collective), to_string(v.path), n,
                                                   to_string(mode));
              if (more ? copies[1] <= copies[0] : copies[1] != copies[0])
                failures.push_back(fmt::format("{}: {} copies with per-peer flags, {} without", what, copies[1], copies[0]));
              else if (more)
                ++per_peer;
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(per_peer > 20);
  MESSAGE(runs << " runs with per-peer flags on and off: bit-exact, alike, in bound; " << per_peer
               << " copied in per peer");
}

TEST_CASE("direct.outbox: blocks and shards wait in their writer's window: the same bytes, no race; one copy-out, a copy-in per peer") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, fewer_out = 0, more_in = 0;
  // Own data on the device, with each copy option; and with the lanes apart (the reduce-scatter only),
  // whose copy-out slots lie in the produce lane's half of the device set.
  struct Own {
    bool on, copy_in, copy_out;
    bool apart = false;  // direct.lanes_apart (the reduce-scatter's transfer lane quantizes its own block again)
  };
  const Variant writes_for_one[] = {{Collective::all_reduce, Path::two_shot}, {Collective::reduce_scatter, Path::two_shot}};
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (int n : {2, 3, 4, 8}) {
      for (const Variant& v : writes_for_one) {
        for (Own own : {Own{true, true, true}, Own{false, false, false}, Own{true, false, false}, Own{true, true, false},
                        Own{true, false, true}, Own{true, true, true, true}, Own{true, false, false, true}}) {
          if (mode == DirectMode::peer_memory && own.on) continue;  // own data on the device: host memory only
          for (auto [copy_lanes, per_peer] : {std::pair{true, false}, {true, true}, {false, false}}) {
            if (n == 8 && (own.apart || !copy_lanes || per_peer)) continue;  // the copy options only
            if (own.apart && v.collective != Collective::reduce_scatter) continue;  // not two-shot's
            for (auto [count, in_place] : {std::pair{size_t(3 * n * 128 + 5), false}, {size_t{4099}, false},
                                           {size_t{4099}, true}}) {
              int copies[2] = {};  // rank 0's copies without and with an outbox
              for (bool outbox : {false, true}) {
                Run cfg = many_stages(mode, in_place, count);
                cfg.config.direct_own_on_device = own.on;
                cfg.config.direct_copy_in = own.copy_in;
                cfg.config.direct_copy_out = own.copy_out;
                cfg.config.direct_copy_lanes = copy_lanes;
                cfg.config.direct_per_peer_flags = per_peer;
                cfg.config.direct_outbox = outbox;
                cfg.config.direct_lanes_apart = own.apart;
                if (own.apart) cfg.config.telemetry_sample_every = 0;  // a measured call keeps its lanes together
                cfg.config.scratch_max_bytes = 512 << 10;
                Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::sum, count, 37u + count};
                ++runs;
                copies[outbox] = run_carried(cfg, spec, n, mode, failures, sim::Site::memcpy_async);
              }
              // Rank 0 copies out its n-1 parts in one piece and copies in each peer's apart, against a
              // copy per peer out and one piece in (slots 1..n-1 of its inbox; per peer with per-peer
              // flags): with only one of the two on, fewer or more copies at 3 ranks and up; with
              // neither, the same (none).
              const std::string what = fmt::format("{} {} n={} {} own={} in={} out={} apart={}", to_string(v.collective),
                                                   to_string(v.path), n, to_string(mode), own.on, own.copy_in,
                                                   own.copy_out, own.apart);
              const bool out_only = own.on && own.copy_out && !own.copy_in, in_only = own.on && own.copy_in && !own.copy_out;
              if (n > 2 && out_only) {
                if (copies[1] < copies[0]) ++fewer_out;
                else failures.push_back(fmt::format("{}: {} copies with an outbox, {} without", what, copies[1], copies[0]));
              } else if (n > 2 && in_only && !per_peer) {
                if (copies[1] > copies[0]) ++more_in;
                else failures.push_back(fmt::format("{}: {} copies with an outbox, {} without", what, copies[1], copies[0]));
              } else if (!own.copy_in && !own.copy_out && copies[1] != copies[0]) {
                failures.push_back(fmt::format("{}: {} copies with an outbox, {} without", what, copies[1], copies[0]));
              }
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(fewer_out > 10);
  CHECK(more_in > 10);
  MESSAGE(runs << " runs with an outbox and without: bit-exact, alike, in bound; " << fewer_out
               << " with fewer copy-outs, " << more_in << " with more copy-ins");
}

TEST_CASE("direct.shared_max_stages: ranks that share a GPU cut a call into fewer stages: the same bytes, no race") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, fewer = 0;
  // The GPU of each rank: unknown; each its own; all on one; two ranks on each of two (the most on
  // one GPU is what counts, alike on every rank).
  auto gpus_of = [](int n, int kind) {
    std::vector<uint64_t> g;
    for (int r = 0; r < n; ++r) g.push_back(kind == 0 ? 0 : kind == 1 ? 10 + r : kind == 2 ? 77 : 80 + r / 2);
    return g;
  };
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (int n : {2, 4}) {
      for (const Variant& v : kVariants) {
        // 4-7 stages of the test's stage size with a GPU each (direct.max_stages 8 does not bound
        // them), 2-3 where ranks share one (a bound of 2, then as large as a set holds).
        const size_t count = 4099;
        int waits[4] = {};
        for (int kind : {0, 1, 2, 3}) {
          if (kind == 3 && n < 4) continue;
          Run cfg = many_stages(mode, false, count);
          cfg.machine.gpus = gpus_of(n, kind);
          Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::sum, count, 41u + static_cast<uint32_t>(n)};
          ++runs;
          waits[kind] = run_carried(cfg, spec, n, mode, failures);
        }
        const std::string what = fmt::format("{} {} n={} {}", to_string(v.collective), to_string(v.path), n,
                                             to_string(mode));
        if (waits[1] != waits[0])
          failures.push_back(fmt::format("{}: a GPU per rank {} stream waits, unknown GPUs {}", what, waits[1], waits[0]));
        for (int kind : {2, 3}) {
          if (kind == 3 && n < 4) continue;
          if (waits[kind] < waits[0]) ++fewer;
          else failures.push_back(fmt::format("{}: GPUs {} {} stream waits, unknown GPUs {}", what,
                                              kind == 2 ? "shared by all" : "shared by two", waits[kind], waits[0]));
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(fewer > 20);
  MESSAGE(runs << " runs over unknown, own and shared GPUs: bit-exact, alike, in bound; " << fewer
               << " in fewer stages where ranks share a GPU");
}

TEST_CASE("direct.lane_flags: the lanes hand stages over by the transport's flags: the same bytes, no race, calls back to back") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0;
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (int n : {2, 3, 4}) {
      for (const Variant& v : kVariants) {
        for (auto [own, copy_in] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
          if (mode == DirectMode::peer_memory && own) continue;  // host memory only
          for (size_t count : {size_t(3 * n * 128 + 5), size_t{4099}}) {
            // Many stages (both sets in turn, each reused), and one.
            for (auto [window, stage] : {std::pair<size_t, size_t>{24 << 10, 2 << 10}, {1 << 20, 8 << 20}}) {
              uint64_t writes[2] = {0, 0};  // stream memory writes of rank 0, without and with lane flags
              for (bool lane_flags : {false, true}) {
                Run cfg;
                cfg.config = direct_config(mode, window, stage);
                cfg.config.direct_own_on_device = own;
                cfg.config.direct_copy_in = copy_in;
                cfg.config.direct_lane_flags = lane_flags;
                cfg.abort_all = true;
                cfg.second_call = true;  // the flags must be back in their initial state after a call
                Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::sum, count, 5u + count};
                const auto inputs = inputs_for(spec, n);
                const Outcome o = run(cfg, spec, inputs);
                ++runs;
                const std::string e = check_carried(cfg, spec, inputs, o, kind_of(mode));
                const int site = static_cast<int>(sim::Site::write_value);
                writes[lane_flags] = o.after_calls[0][site] - o.after_setup[0][site];
                if (!e.empty()) failures.push_back(e);
              }
              // Every stage of both calls hands over by flags: two more stores per stage and lane.
              if (writes[1] <= writes[0])
                failures.push_back(fmt::format("{} n={} count={}: {} stream writes with lane flags, {} without",
                                               to_string(v.collective), n, count, writes[1], writes[0]));
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  MESSAGE(runs << " runs with and without lane flags: bit-exact, alike, no race");
}

TEST_CASE("direct.lanes_apart: the same bytes with no hand-over between the lanes (one out of place), no race") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, apart = 0;
  for (int n : {2, 3, 4}) {
    for (const Variant& v : kVariants) {
      const bool eligible = v.collective != Collective::all_reduce || v.path == Path::one_shot;
      for (bool in_place : {false, true}) {
        // The lanes' own order by flags (unused apart) and the copy-in data flow (its slots beside
        // the transfer lane's own chunk).
        for (auto [lane_flags, copy_in, copy_out] : {std::tuple{false, false, false}, std::tuple{true, false, false},
                                                     std::tuple{false, true, false}, std::tuple{false, false, true},
                                                     std::tuple{false, true, true}}) {
          // Telemetry off, or sampling its default every 16th call: then the first call is measured
          // (its lanes hand over as before) and the second, apart, must give the same bytes.
          for (uint32_t sample : {0u, 16u}) {
          for (size_t count : {size_t(3 * n * 128 + 5), size_t{4099}}) {
            // Many stages (both sets in turn, each reused), and one; and many in a device set of 3
            // KiB (scratch.max_bytes 8 KiB), where a full stage's copy-in slots do not fit half of
            // it and a short last stage's do: each lane must keep to its half either way.
            for (auto [window, stage, scratch] : {std::tuple<size_t, size_t, size_t>{24 << 10, 2 << 10, 512 << 10},
                                                  {1 << 20, 8 << 20, 512 << 10},
                                                  {24 << 10, 2 << 10, 8 << 10}}) {
              // Rank 0's event waits and codec launches in the first call, without and with lanes apart.
              uint64_t waits[2] = {}, codec[2] = {};
              for (bool lanes_apart : {false, true}) {
                Run cfg;
                cfg.config = direct_config(DirectMode::host_memory, window, stage);
                cfg.config.direct_lane_flags = lane_flags;
                cfg.config.direct_lanes_apart = lanes_apart;
                cfg.config.direct_copy_in = copy_in;
                cfg.config.direct_copy_out = copy_out;
                cfg.config.scratch_max_bytes = scratch;
                cfg.config.direct_sets = 2;  // the device sets of 3 KiB above (3 and 4 sets: their own test)
                cfg.config.telemetry_sample_every = sample;
                cfg.in_place = in_place;
                cfg.abort_all = true;
                cfg.second_call = true;
                Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::sum, count, 11u + count};
                const auto inputs = inputs_for(spec, n);
                const Outcome o = run(cfg, spec, inputs);
                ++runs;
                const std::string e = check_carried(cfg, spec, inputs, o, Carrier::host_memory);
                if (!e.empty()) failures.push_back(e + (in_place ? " (in place)" : ""));
                const auto site = [&](sim::Site x) {
                  return static_cast<uint64_t>(o.after_calls[0][static_cast<int>(x)] - o.after_setup[0][static_cast<int>(x)]);
                };
                waits[lanes_apart] = site(lane_flags ? sim::Site::wait_value : sim::Site::stream_wait);
                codec[lanes_apart] = site(sim::Site::codec);
              }
              // Lanes apart: the own chunk quantized once more per stage, no more waits (fewer from
              // the third stage on: no set waits to drain; each stage's one wait is its hand-over, or
              // out of place its release's); two-shot as before.
              const bool took = codec[1] > codec[0] && waits[1] <= waits[0];
              const bool same = codec[1] == codec[0] && waits[1] == waits[0];
              apart += took;
              if (sample == 0 && (eligible ? !took : !same))
                failures.push_back(fmt::format("{} n={} count={}{}{}{}{}: codec launches {} -> {}, waits {} -> {} with lanes apart",
                                               to_string(v.collective), n, count, in_place ? " in place" : "",
                                               lane_flags ? " lane flags" : "", copy_in ? " copy-in" : "",
                                               copy_out ? " copy-out" : "", codec[0], codec[1], waits[0], waits[1]));
            }
          }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  MESSAGE(runs << " runs, " << apart << " pairs with the lanes apart: bit-exact, alike, no race");
}

TEST_CASE("direct.sets 3 and 4: stages take the sets in turn, each reused; the same bytes, no race, calls back to back") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0;
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (int sets : {3, 4}) {
      for (int n : {2, 3, 4}) {
        for (const Variant& v : kVariants) {
          // Host memory: the defaults (copy-in and copy-out), neither, the lanes apart, the lanes'
          // order by flags. Peer memory has none of them.
          for (auto [copies, lanes_apart, lane_flags] : {std::tuple{true, false, false}, std::tuple{false, false, false},
                                                         std::tuple{true, true, false}, std::tuple{true, false, true}}) {
            if (mode == DirectMode::peer_memory && (!copies || lanes_apart || lane_flags)) continue;
            for (bool in_place : {false, true}) {
              // Many stages of 1 KiB in a 24 KiB window (every set reused), and in a device scratch of
              // 12 KiB cut into `sets` (a full stage's slots then do not fit it, a short last stage's may).
              for (auto [window, stage, scratch] : {std::tuple<size_t, size_t, size_t>{24 << 10, 1 << 10, 512 << 10},
                                                    {24 << 10, 1 << 10, 12 << 10}}) {
                Run cfg;
                cfg.config = direct_config(mode, window, stage);
                cfg.config.direct_sets = static_cast<uint32_t>(sets);
                cfg.config.direct_copy_in = cfg.config.direct_copy_out = copies;
                cfg.config.direct_lanes_apart = lanes_apart;
                cfg.config.direct_lane_flags = lane_flags;
                cfg.config.scratch_max_bytes = scratch;
                if (lanes_apart) cfg.config.telemetry_sample_every = 0;
                cfg.in_place = in_place;
                cfg.abort_all = true;
                cfg.second_call = true;
                const size_t count = 4099;
                Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::sum, count, 13u + count};
                const size_t st = direct_stage_for(cfg.config, v.collective, v.path, count, spec.dtype, n);
                if (st == 0) continue;
                if (sched::stage_count(count, st) <= static_cast<size_t>(sets)) {
                  failures.push_back(fmt::format("{}: {} stages, no set reused", describe(spec, n, cfg.config),
                                                 sched::stage_count(count, st)));
                  continue;
                }
                const auto inputs = inputs_for(spec, n);
                const Outcome o = run(cfg, spec, inputs);
                ++runs;
                const std::string e = check_carried(cfg, spec, inputs, o, kind_of(mode));
                if (!e.empty()) failures.push_back(e + (in_place ? " (in place)" : ""));
              }
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(runs > 300);
  MESSAGE(runs << " runs with 3 and 4 buffer sets: bit-exact, alike, no race");
}

TEST_CASE("3 and 4 buffer sets with grouped all-reduces coalesced into one call, and with error feedback (with an outbox too): the same bytes, no race") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0;
  for (int sets : {3, 4}) {
    for (int n : {2, 3, 4}) {
      for (Algorithm algorithm : {Algorithm::two_shot, Algorithm::one_shot}) {
        const Path path = algorithm == Algorithm::two_shot ? Path::two_shot : Path::one_shot;
        // Three grouped all-reduces packed into one pipelined call through the staging area: its
        // copy-out follows the last stage's gather. Multiples of 12 blocks, so that the packed call
        // cuts the buffer as the reference's one call over the group's buffer does.
        {
          Run cfg;
          cfg.config = direct_config(DirectMode::host_memory, 24 << 10, 1 << 10);
          cfg.config.direct_sets = static_cast<uint32_t>(sets);
          cfg.config.algorithm = algorithm;
          cfg.forced = false;
          cfg.group = 3;
          cfg.abort_all = true;
          Spec spec{Collective::all_reduce, path, DataType::bf16, ReduceOp::sum, 1536, 31u};
          const size_t whole = 3 * spec.count;  // the packed call
          const size_t st = direct_stage_for(cfg.config, spec.collective, path, whole, spec.dtype, n);
          REQUIRE(st > 0);
          CHECK(sched::stage_count(whole, st) > static_cast<size_t>(sets));  // every set reused
          const auto inputs = inputs_for(spec, n, cfg.group);
          const Outcome o = run(cfg, spec, inputs);
          ++runs;
          if (std::string e = check_carried(cfg, spec, inputs, o, Carrier::host_memory); !e.empty())
            failures.push_back(e + " (three grouped)");
        }
        // Error feedback: the residual is read and written by the produce lane's quantize of each
        // stage while the transfer lane gathers the stage before; the first call's bytes are the
        // reference's (its residual starts at zero, zeroed on the produce lane before the call's
        // lanes fork). Also where the quantize writes straight into a window (own data in the
        // window, peer memory), which with copy lanes runs on the send lane; and two-shot with an
        // outbox (each shard quantized with its own stretch of the residual into the writer's window).
        for (auto [mode, own] : {std::pair{DirectMode::host_memory, true}, std::pair{DirectMode::host_memory, false},
                                 std::pair{DirectMode::peer_memory, false}})
        for (bool outbox : {false, true}) {
          if (outbox && path != Path::two_shot) continue;
          Run cfg;
          cfg.config = direct_config(mode, 24 << 10, 1 << 10);
          cfg.config.direct_own_on_device = own;
          cfg.config.direct_outbox = outbox;
          cfg.config.direct_sets = static_cast<uint32_t>(sets);
          cfg.config.error_feedback = true;
          cfg.config.telemetry_sample_every = 0;
          cfg.feedback_key = 77;
          cfg.abort_all = true;
          Spec spec{Collective::all_reduce, path, DataType::bf16, ReduceOp::avg, 4099, 37u};
          const size_t st = direct_stage_for(cfg.config, spec.collective, path, spec.count, spec.dtype, n);
          REQUIRE(st > 0);
          CHECK(sched::stage_count(spec.count, st) > static_cast<size_t>(sets));
          const auto inputs = inputs_for(spec, n);
          const Outcome o = run(cfg, spec, inputs);
          ++runs;
          if (std::string e = check_carried(cfg, spec, inputs, o, kind_of(mode)); !e.empty())
            failures.push_back(e + " (error feedback)");
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  MESSAGE(runs << " runs with 3 and 4 buffer sets, coalesced or fed back: bit-exact, alike, no race");
}

TEST_CASE("direct.min_stages cuts a call the stage size leaves whole: the same bytes, with and without own data on the device") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  for (int n : {2, 4}) {
    if (kSanitizerTier && n == 4) continue;
    for (const Variant& v : kVariants) {
      for (auto [own, copy_in] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
        // 3 MiB of bf16 input (all-reduce; the reduce-scatter and all-gather per rank's part): one
        // stage by direct.stage_bytes, at least 3 with direct.min_stages = 3 (stages >= 1 MiB).
        const size_t count = (size_t{3} << 20) / 2 / (v.collective == Collective::all_reduce ? 1 : n) + 5;
        Run cfg;
        cfg.config = direct_config(DirectMode::host_memory, 16 << 20, 8 << 20);
        cfg.config.direct_min_stages = 3;
        cfg.config.direct_own_on_device = own;
        cfg.config.direct_copy_in = copy_in;
        cfg.config.scratch_max_bytes = 16 << 20;
        cfg.abort_all = true;
        Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::sum, count, 3};
        const quant::WireFormat f = quant::WireFormat::from(cfg.config);
        const size_t st = sched::direct_stage_elems(cfg.config, 8 << 20, v.collective, v.path, count, 2, n, f);
        if (sched::stage_count(count, st) < 3) {
          failures.push_back(fmt::format("{}: {} stages", describe(spec, n, cfg.config), sched::stage_count(count, st)));
          continue;
        }
        const auto inputs = inputs_for(spec, n);
        const Outcome o = run(cfg, spec, inputs);
        if (std::string e = check_clean(cfg, spec, inputs, o); !e.empty()) failures.push_back(e);
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
}

TEST_CASE("a call whose unit does not fit one buffer set of the window goes over NCCL, on every rank alike") {
  log_set_level(LogLevel::error);
  // Blocks of 4096 elements, 8 ranks: one two-shot unit needs 9 shard slots of 4100 bytes, more
  // than a buffer set of the smallest window (32 KiB).
  Run cfg;
  cfg.config = direct_config(DirectMode::host_memory, 64 << 10);
  cfg.config.block_size = 4096;
  cfg.abort_all = true;
  const int n = 8;
  const Spec spec{Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, size_t{n} * 4096 + 17, 5};
  const quant::WireFormat f = quant::WireFormat::from(cfg.config);
  REQUIRE(sched::direct_stage_elems(cfg.config, 32 << 10, spec.collective, spec.path, spec.count, 2, n, f) == 0);
  const auto inputs = inputs_for(spec, n);
  const Outcome o = run(cfg, spec, inputs);
  CHECK(check_clean(cfg, spec, inputs, o) == "");
  for (int r = 0; r < n; ++r) CHECK(o.transports[static_cast<size_t>(r)] == Carrier::nccl);
}

TEST_CASE("direct transport sizes: one stage when the call fits, whole units otherwise") {
  Config c = direct_config(DirectMode::host_memory, 1 << 20, 64 << 10);
  c.direct_max_stages = 0;  // stages of direct.stage_bytes however many (direct.max_stages below)
  const quant::WireFormat f = quant::WireFormat::from(c);
  // 4 ranks, bf16, two-shot: a unit is 4 x 128 elements.
  CHECK(sched::direct_stage_elems(c, 512 << 10, Collective::all_reduce, Path::two_shot, 1000, 2, 4, f) == 1000);
  const size_t big = sched::direct_stage_elems(c, 512 << 10, Collective::all_reduce, Path::two_shot, 1 << 20, 2, 4, f);
  CHECK(big % 512 == 0);
  CHECK(big * 2 <= (64u << 10));  // the stage cap in caller bytes
  CHECK(sched::direct_set_bytes(Collective::all_reduce, Path::two_shot, big, 4, f) <= (512u << 10));
  // direct.min_stages 4: a call direct.stage_bytes would leave whole is cut into at least 4 stages
  // of whole units, none under 1 MiB of caller data; smaller calls are cut as before.
  Config k4 = direct_config(DirectMode::host_memory, 64 << 20, 64 << 20);
  k4.direct_min_stages = 4;
  const size_t set64 = 32 << 20;
  for (size_t count : {size_t{4} << 20, size_t{5} << 20, size_t{20} << 20}) {
    const size_t st = sched::direct_stage_elems(k4, set64, Collective::all_reduce, Path::two_shot, count, 2, 4, f);
    CHECK(st % 512 == 0);
    CHECK(st * 2 >= (1u << 20));
    CHECK(sched::stage_count(count, st) >= 4);
  }
  // 2 MiB of bf16: two stages of 1 MiB; 1 MiB: one stage, as without the option.
  CHECK(sched::direct_stage_elems(k4, set64, Collective::all_reduce, Path::two_shot, 1 << 20, 2, 4, f) == 1 << 19);
  CHECK(sched::direct_stage_elems(k4, set64, Collective::all_reduce, Path::two_shot, 1 << 19, 2, 4, f) == 1 << 19);
  k4.direct_min_stages = 1;
  CHECK(sched::direct_stage_elems(k4, set64, Collective::all_reduce, Path::two_shot, size_t{20} << 20, 2, 4, f) ==
        size_t{20} << 20);
  // direct.max_stages 8: a call of more than 8 stages of direct.stage_bytes gets 8 larger ones where
  // a set holds them, more (of whole units, as large as fit) where it does not; calls of up to 8
  // keep direct.stage_bytes.
  Config m8 = direct_config(DirectMode::host_memory, 64 << 20, 8 << 20);
  m8.direct_max_stages = 8;
  for (const auto [mib, stages] : {std::pair<size_t, size_t>{16, 2}, {64, 8}, {256, 8}}) {
    const size_t count = mib << 19;  // bf16 elements
    const size_t st = sched::direct_stage_elems(m8, set64, Collective::all_reduce, Path::one_shot, count, 2, 2, f);
    CAPTURE(mib);
    CHECK(sched::stage_count(count, st) == stages);
    CHECK(sched::direct_set_bytes(Collective::all_reduce, Path::one_shot, st, 2, f) <= set64);
  }
  // Ranks sharing a GPU's host link (DirectWindows::ranks_per_gpu above 1): direct.shared_max_stages
  // (2 by default) bounds the count instead and direct.shared_max_stage_bytes (32 MiB) the size, so
  // 16 MiB keeps two stages of direct.stage_bytes, 64 MiB goes in 2 of 32 MiB, 256 MiB in 8 of
  // 32 MiB; without the size cap, 256 MiB in stages as large as a set holds (5 here).
  Config shared = m8;
  REQUIRE(shared.direct_shared_max_stages == 2);
  REQUIRE(shared.direct_shared_max_stage_bytes == 32u << 20);
  for (const uint64_t cap : {uint64_t{32} << 20, uint64_t{0}}) {
    shared.direct_shared_max_stage_bytes = cap;
    for (const auto [mib, stages] : {std::pair<size_t, size_t>{16, 2}, {64, 2}, {256, cap ? 8u : 5u}}) {
      const size_t count = mib << 19;
      const size_t st = sched::direct_stage_elems(shared, set64, Collective::all_reduce, Path::one_shot, count, 2, 2, f, 2);
      CAPTURE(mib);
      CAPTURE(cap);
      CHECK(sched::stage_count(count, st) == stages);
      CHECK(sched::direct_set_bytes(Collective::all_reduce, Path::one_shot, st, 2, f) <= set64);
    }
  }
  // The reduce-scatter's stage counts every rank's block: 64 MiB over 4 ranks (8 Mi elements of
  // output) in 2 stages of 32 MiB of caller data.
  shared.direct_shared_max_stage_bytes = 32u << 20;
  CHECK(sched::stage_count(size_t{8} << 20, sched::direct_stage_elems(shared, set64, Collective::reduce_scatter,
                                                                      Path::two_shot, size_t{8} << 20, 2, 4, f, 4)) == 2);
  // 0 lifts the bound (not direct.max_stages in its place): 128 MiB in 16 stages of 8 MiB, not 8.
  shared.direct_shared_max_stages = 0;
  CHECK(sched::stage_count(size_t{128} << 19, sched::direct_stage_elems(shared, set64, Collective::all_reduce,
                                                                       Path::one_shot, size_t{128} << 19, 2, 2, f, 4)) ==
        16);
  // The reduce-scatter's stage counts every rank's block: blocks of 16 Mi elements (128 MiB of bf16
  // over 4 ranks) in 8 stages, not 16 of 8 MiB.
  const size_t rs = sched::direct_stage_elems(m8, set64, Collective::reduce_scatter, Path::two_shot, size_t{16} << 20, 2, 4, f);
  CHECK(sched::stage_count(size_t{16} << 20, rs) == 8);
  // A set too small for count / 8: as large as fit, so more stages.
  const size_t small_set = 4 << 20;
  const size_t capped = sched::direct_stage_elems(m8, small_set, Collective::all_reduce, Path::one_shot, size_t{128} << 20, 2, 2, f);
  CHECK(sched::direct_set_bytes(Collective::all_reduce, Path::one_shot, capped, 2, f) <= small_set);
  CHECK(sched::stage_count(size_t{128} << 20, capped) > 8);
  // direct.min_stages cuts after it.
  m8.direct_min_stages = 16;
  CHECK(sched::stage_count(size_t{128} << 19, sched::direct_stage_elems(m8, set64, Collective::all_reduce, Path::one_shot,
                                                                          size_t{128} << 19, 2, 2, f)) >= 16);
  // One-shot: only this rank's chunk lives in its window.
  CHECK(sched::direct_set_bytes(Collective::all_reduce, Path::one_shot, 128, 8, f) == quant::chunk_bytes(128, f));
  CHECK(sched::direct_set_bytes(Collective::reduce_scatter, Path::two_shot, 128, 8, f) == 8 * quant::chunk_bytes(128, f));
}

TEST_CASE("every fault of a direct collective, on the first and the last rank: an error or the right result, no hang") {
  log_set_level(LogLevel::off);
  const sim::Site sites[] = {sim::Site::codec,        sim::Site::wait_value, sim::Site::write_value,
                             sim::Site::event_record, sim::Site::stream_wait, sim::Site::is_capturing};
  struct Scenario {
    const char* name;
    Spec spec;
    DirectMode mode;
    bool lane_flags = false;  // direct.lane_flags: the lanes' hand-overs are flag waits too
    bool lanes_apart = false; // direct.lanes_apart (telemetry off, so that every call is apart)
    bool copy_in = false;     // direct.copy_in
    bool copy_out = false;    // direct.copy_out
    uint32_t sets = 2;        // direct.sets
  };
  const Scenario scenarios[] = {
      {"two-shot, host memory, pipelined", {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::avg, 7000, 3}, DirectMode::host_memory},
      {"one-shot, peer memory, pipelined", {Collective::all_reduce, Path::one_shot, DataType::f32, ReduceOp::sum, 5000, 4}, DirectMode::peer_memory},
      {"reduce-scatter, host memory", {Collective::reduce_scatter, Path::two_shot, DataType::bf16, ReduceOp::sum, 2000, 6}, DirectMode::host_memory},
      {"all-gather, peer memory", {Collective::all_gather, Path::one_shot, DataType::bf16, ReduceOp::sum, 3000, 7}, DirectMode::peer_memory},
      {"two-shot, host memory, pipelined, lane flags", {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::avg, 7000, 3}, DirectMode::host_memory, true},
      {"one-shot, peer memory, pipelined, lane flags", {Collective::all_reduce, Path::one_shot, DataType::f32, ReduceOp::sum, 5000, 4}, DirectMode::peer_memory, true},
      {"one-shot, host memory, pipelined, lanes apart", {Collective::all_reduce, Path::one_shot, DataType::bf16, ReduceOp::sum, 5000, 4}, DirectMode::host_memory, false, true},
      {"reduce-scatter, host memory, pipelined, lanes apart", {Collective::reduce_scatter, Path::two_shot, DataType::bf16, ReduceOp::sum, 6000, 6}, DirectMode::host_memory, false, true},
      {"one-shot, host memory, pipelined, lanes apart, copy-in", {Collective::all_reduce, Path::one_shot, DataType::bf16, ReduceOp::sum, 5000, 4}, DirectMode::host_memory, false, true, true},
      {"two-shot, host memory, pipelined, copy-in, copy-out", {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::avg, 7000, 3}, DirectMode::host_memory, false, false, true, true},
      {"reduce-scatter, host memory, pipelined, lanes apart, copy-out", {Collective::reduce_scatter, Path::two_shot, DataType::bf16, ReduceOp::sum, 6000, 6}, DirectMode::host_memory, false, true, false, true},
      {"two-shot, host memory, pipelined, copy-in, copy-out, 4 sets", {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::avg, 7000, 3}, DirectMode::host_memory, false, false, true, true, 4},
  };
  std::vector<std::string> failures;
  size_t runs = 0;
  std::array<std::array<size_t, 3>, sim::kSiteCount> tally{};  // other ranks: error, async error, right
  for (const Scenario& sc : scenarios) {
    const int n = 3;
    Run base;
    base.config = direct_config(sc.mode, 24 << 10, 4 << 10);
    base.config.direct_lane_flags = sc.lane_flags;
    base.config.direct_lanes_apart = sc.lanes_apart;
    base.config.direct_copy_in = sc.copy_in;
    base.config.direct_copy_out = sc.copy_out;
    base.config.direct_sets = sc.sets;
    if (sc.lanes_apart) base.config.telemetry_sample_every = 0;
    base.abort_all = true;
    const auto inputs = inputs_for(sc.spec, n);
    const Outcome clean = run(base, sc.spec, inputs);
    REQUIRE_MESSAGE(check_clean(base, sc.spec, inputs, clean).empty(), check_clean(base, sc.spec, inputs, clean));
    for (int r = 0; r < n; ++r) REQUIRE(clean.transports[static_cast<size_t>(r)] == kind_of(sc.mode));
    for (int rank : {0, n - 1}) {
      for (sim::Site site : sites) {
        const size_t i = static_cast<size_t>(site);
        for (int k = clean.after_setup[static_cast<size_t>(rank)][i]; k < clean.after_calls[static_cast<size_t>(rank)][i]; ++k) {
          Run faulty = base;
          faulty.second_call = true;
          faulty.fault = sim::Fault{rank, site, k};
          const Outcome o = run(faulty, sc.spec, inputs);
          ++runs;
          const std::string where = fmt::format("{}: {} #{} failing on rank {}", sc.name, sim::to_string(site), k, rank);
          if (o.deadlocked) { failures.push_back(where + ": deadlock"); continue; }
          if (!o.protocol.empty()) { failures.push_back(where + ": " + o.protocol.front()); continue; }
          if (!o.leaks.empty()) { failures.push_back(where + ": " + o.leaks.front()); continue; }
          // A peer's device window stays allocated after an abort (it may still be read); host windows go.
          if (sc.mode == DirectMode::host_memory && o.live_windows) {
            failures.push_back(where + ": windows left");
            continue;
          }
          if (o.first[static_cast<size_t>(rank)].result == ncclSuccess) {
            failures.push_back(where + ": the failing rank returned success");
            continue;
          }
          if (o.second[static_cast<size_t>(rank)].result == ncclSuccess) {
            failures.push_back(where + ": the next call on the failed communicator returned success");
            continue;
          }
          for (int r = 0; r < n; ++r) {
            if (r == rank) continue;
            const RankResult& got = o.first[static_cast<size_t>(r)];
            auto& t = tally[i];
            if (got.result != ncclSuccess) { ++t[0]; continue; }
            if (got.async != ncclSuccess) { ++t[1]; continue; }
            ++t[2];
            if (got.out != clean.first[static_cast<size_t>(r)].out)
              failures.push_back(fmt::format("{}: rank {} returned success with a wrong result", where, r));
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(runs > 100);
  std::string table = fmt::format("{} faulty runs over the direct transports\n{:<12} | other ranks: {:>6} {:>12} {:>13}\n",
                                  runs, "site", "error", "async error", "right result");
  for (sim::Site site : sites) {
    const auto& t = tally[static_cast<size_t>(site)];
    table += fmt::format("{:<12} | {:>19} {:>12} {:>13}\n", sim::to_string(site), t[0], t[1], t[2]);
  }
  MESSAGE(table);
}

TEST_CASE("a window that cannot be made or mapped on one rank: every rank goes over NCCL, the results right") {
  log_set_level(LogLevel::off);
  const Spec spec{Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, 3000, 4};
  const int n = 3;
  const auto inputs = inputs_for(spec, n);
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (sim::Site site : {sim::Site::window_create, sim::Site::window_open}) {
      for (int index : {0, 1}) {
        for (int rank : {0, n - 1}) {
          Run r;
          r.config = direct_config(mode, 1 << 20);
          r.abort_all = true;
          r.fault = sim::Fault{rank, site, index};
          const Outcome o = run(r, spec, inputs);
          INFO(to_string(mode) << ": " << sim::to_string(site) << " #" << index << " fails on rank " << rank);
          CHECK(check_clean(r, spec, inputs, o) == "");
          for (int k = 0; k < n; ++k) CHECK(o.transports[static_cast<size_t>(k)] == Carrier::nccl);
        }
      }
    }
  }
}

TEST_CASE("a rank that never arrives: the others wait on its flags until an abort from another thread releases them") {
  log_set_level(LogLevel::off);
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    sim::Options machine;
    machine.nranks = 2;
    sim::World world(machine);
    const Platform& p = world.platform();
    const std::vector<ncclComm_t> comms = world.create_comm();
    const Config config = direct_config(mode, 1 << 20);
    std::atomic<bool> abort_done{false};
    std::atomic<int> ready{0};
    ncclResult_t call = ncclInternalError;
    cudaError_t synced = cudaErrorUnknown;
    world.run_ranks([&](int r) {
      sched::Engine eng(config, p);
      eng.comm_created(comms[static_cast<size_t>(r)]);
      ++ready;
      while (ready.load() < 2) std::this_thread::yield();
      if (r == 0) {
        cudaStream_t stream = nullptr;
        p.cuda.StreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        void *in = nullptr, *out = nullptr;
        p.cuda.Malloc(&in, 4096 * 2);
        p.cuda.Malloc(&out, 4096 * 2);
        std::memset(in, 0, 4096 * 2);
        call = sched::EngineProbe(eng).all_reduce_forced(Path::one_shot, in, out, 4096, ncclBfloat16, ncclSum, comms[0], stream);
        // The application's watchdog, on another thread, after a while.
        std::thread watchdog([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          sim::set_thread_rank(0);
          eng.comm_abort(comms[0]);
          abort_done = true;
        });
        synced = p.cuda.StreamSynchronize(stream);  // waits until the abort released the lanes
        watchdog.join();
        p.cuda.Free(in);
        p.cuda.Free(out);
        p.cuda.StreamDestroy(stream);
      } else {
        // Rank 1 never issues the collective; it leaves once rank 0 is done.
        while (!abort_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        eng.comm_abort(comms[1]);
      }
    });
    INFO(to_string(mode));
    CHECK(call == ncclSuccess);   // issued; the abort came later
    CHECK(abort_done.load());
    CHECK(synced == cudaSuccess);  // released, not deadlocked
    CHECK_FALSE(world.deadlocked());
    CHECK(world.protocol_errors().empty());
  }
}

TEST_CASE("collectives of different kinds and sizes back to back on one communicator: each the reference bit for bit") {
  // The buffer sets are laid out differently by each collective and stage length; a write into a set
  // must wait for every earlier read of it, whatever lay there.
  log_set_level(LogLevel::error);
  const Spec sequence[] = {
      {Collective::reduce_scatter, Path::two_shot, DataType::bf16, ReduceOp::sum, 3000, 21},
      {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::avg, 9001, 22},
      {Collective::all_gather, Path::one_shot, DataType::bf16, ReduceOp::sum, 777, 23},
      {Collective::all_reduce, Path::one_shot, DataType::bf16, ReduceOp::sum, 5000, 24},
      {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, 131, 25},
      {Collective::reduce_scatter, Path::two_shot, DataType::bf16, ReduceOp::avg, 64, 26},
      {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, 12000, 27},
  };
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      const int n = 3;
      sim::Options machine;
      machine.nranks = n;
      machine.schedule_seed = seed;
      sim::World world(machine);
      const Platform& p = world.platform();
      const std::vector<ncclComm_t> comms = world.create_comm();
      const Config config = direct_config(mode, 64 << 10, 6 << 10);  // several stages per call
      const quant::WireFormat f = quant::WireFormat::from(config);
      std::vector<std::vector<Bytes>> inputs;
      for (const Spec& sp : sequence) inputs.push_back(inputs_for(sp, n));
      std::vector<std::string> failures;
      std::mutex mu;
      world.run_ranks([&](int r) {
        sched::Engine eng(config, p);
        ncclComm_t comm = comms[static_cast<size_t>(r)];
        eng.comm_created(comm);
        cudaStream_t stream = nullptr;
        p.cuda.StreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        std::vector<void*> ins, outs;
        for (size_t k = 0; k < std::size(sequence); ++k) {
          const Spec& sp = sequence[k];
          const size_t es = dtype_size(sp.dtype);
          void *in = nullptr, *out = nullptr;
          p.cuda.Malloc(&in, in_elems(sp, n) * es);
          p.cuda.Malloc(&out, out_elems(sp, n) * es);
          std::memcpy(in, inputs[k][static_cast<size_t>(r)].data(), in_elems(sp, n) * es);
          ins.push_back(in);
          outs.push_back(out);
        }
        for (size_t k = 0; k < std::size(sequence); ++k)  // no synchronisation between the calls
          if (issue(eng, sequence[k], true, ins[k], outs[k], comm, stream) != ncclSuccess) {
            std::lock_guard lock(mu);
            failures.push_back(fmt::format("rank {} call {} failed", r, k));
          }
        p.cuda.StreamSynchronize(stream);
        for (size_t k = 0; k < std::size(sequence); ++k) {
          const Spec& sp = sequence[k];
          const size_t bytes = out_elems(sp, n) * dtype_size(sp.dtype);
          const Bytes got(static_cast<char*>(outs[k]), static_cast<char*>(outs[k]) + bytes);
          if (got != expected_output(sp, inputs[k], r, f, 0)) {
            std::lock_guard lock(mu);
            failures.push_back(fmt::format("{} seed {}: rank {}: call {} ({}) differs from the reference",
                                           to_string(mode), seed, r, k, to_string(sp.collective)));
          }
          p.cuda.Free(ins[k]);
          p.cuda.Free(outs[k]);
        }
        eng.comm_destroyed(comm);
        p.cuda.StreamDestroy(stream);
      });
      CHECK_MESSAGE(failures.empty(), first_failures(failures));
      CHECK_FALSE(world.deadlocked());
      CHECK(world.protocol_errors().empty());
      CHECK(world.races().empty());
      CHECK(world.live_windows() == 0);
    }
  }
}
