// The CPU tier of the direct transports (sched/transport/direct_windows.hpp): the engine, unchanged, over the
// simulated machine, with windows every simulated rank maps and the flag handshakes as simulated
// stream memory operations.
//   - every direct algorithm (one-shot, two-shot, reduce-scatter, all-gather, all-to-all), both kinds (peer
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
#include "sched/plan/cost_model.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;

namespace {

const Variant kVariants[] = {{Collective::all_reduce, Path::two_shot},
                             {Collective::all_reduce, Path::one_shot},
                             {Collective::reduce_scatter, Path::two_shot},
                             {Collective::all_gather, Path::one_shot},
                             {Collective::all_to_all, Path::one_shot}};

Config direct_config(DirectMode kind, size_t window, size_t stage_bytes = 8 << 20) {
  Config c = sim_config();
  c.direct_transport = kind;
  c.direct_assume_one_host = true;  // the simulated ranks are separate hosts to NCCL, as emulated ranks are
  c.direct_window_bytes = window;
  for (CostModel& m : c.cost_model) m.direct_stage_bytes = stage_bytes;
  return c;
}

bool reduces(Collective c) { return c == Collective::all_reduce || c == Collective::reduce_scatter; }

// The direct pipeline's shape the simulated calls are cut by (the same on every fabric here).
CostModel stage_model(const Config& c) { return sched::effective_cost_model(c, Fabric::net); }

// The stage of a direct call of `count` elements of `t`: the library's rule over one buffer set of
// the window `c` describes; 0 when not even one unit fits (the call goes over NCCL).
size_t direct_stage_for(const Config& c, Collective collective, Path path, size_t count, DataType t, int n) {
  const size_t set = sched::direct_set_bytes_of(c.direct_window_bytes, static_cast<int>(c.direct_sets));
  return sched::direct_stage_elems(stage_model(c), set, collective, path, count, dtype_size(t), n,
                                   quant::WireFormat::from(c));
}

// Rank 0's calls at `site` in the first call.
int calls_at(const Outcome& o, sim::Site site) {
  const int i = static_cast<int>(site);
  return o.after_calls[0][i] - o.after_setup[0][i];
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
            if (!reduces(v.collective) && op == ReduceOp::avg) continue;
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

TEST_CASE("the protocols over host memory (kernels, copy_engine), eager and captured: the same bytes, the windows still written for the peers") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, copied = 0, copied_out = 0;
  for (DirectProtocol protocol : {DirectProtocol::kernels, DirectProtocol::copy_engine})
  for (bool capturing : {false, true})
  for (int n : {2, 3, 4, 8}) {
    if (kSanitizerTier && n == 8) continue;
    for (const Variant& v : kVariants) {
      for (DataType t : {DataType::f32, DataType::bf16}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
          if (!reduces(v.collective) && op == ReduceOp::avg) continue;
          for (size_t count : {size_t{127}, size_t(3 * n * 128 + 5), size_t{4099}}) {
            // One stage in a 1 MiB window; many in 24 KiB; and a device buffer set of 3 KiB
            // (scratch.max_bytes 8 KiB): the larger stages' data then goes through the window.
            for (auto [window, stage, scratch] : {std::tuple<size_t, size_t, size_t>{1 << 20, 8 << 20, 512 << 10},
                                                  {24 << 10, 2 << 10, 512 << 10},
                                                  {1 << 20, 8 << 20, 8 << 10}}) {
              Run cfg;
              cfg.config = direct_config(DirectMode::host_memory, window, stage);
              cfg.config.direct_protocol = protocol;
              cfg.config.scratch_max_bytes = scratch;
              cfg.config.telemetry_sample_every = 0;  // a measured call copies its record back: count data only
              cfg.machine.capturing = capturing;
              cfg.abort_all = true;
              cfg.second_call = count == 4099;
              Spec spec{v.collective, v.path, t, op, count, 11u + count};
              const size_t stage_len = direct_stage_for(cfg.config, v.collective, v.path, count, t, n);
              if (stage_len == 0) continue;
              const auto inputs = inputs_for(spec, n);
              const Outcome o = run(cfg, spec, inputs);
              ++runs;
              std::string e = check_carried(cfg, spec, inputs, o, Carrier::host_memory);
              const int copies = calls_at(o, sim::Site::memcpy_async);
              const std::string what = fmt::format("{} ({}{})", describe(spec, n, cfg.config), to_string(protocol),
                                                   capturing ? ", captured" : "");
              // kernels: the codec kernels move every byte, no copy engine. copy_engine: what its peers
              // read of its own (one-shot and all-gather: its input; two-shot: its reduced shard) reaches
              // its window by a copy, every peer's data reaches the device set by copies (the
              // reduce-scatter's too: one per run of inbox slots), and what it writes for one peer alone
              // (the reduce-scatter's blocks, two-shot's shards) reaches that peer by a copy each (127
              // elements leave some shards empty). The all-to-all copies its own chunk on the GPU, once
              // per stage, under either protocol (as over NCCL's transports).
              const int own_copies = v.collective == Collective::all_to_all ? static_cast<int>(sched::stage_count(count, stage_len)) : 0;
              if (e.empty() && protocol == DirectProtocol::kernels && copies != own_copies)
                e = fmt::format("{}: rank 0 copied {} times, {} expected", what, copies, own_copies);
              if (e.empty() && protocol == DirectProtocol::copy_engine && scratch > (8 << 10)) {
                const bool writes_for_peers = v.collective == Collective::reduce_scatter ||
                                              v.collective == Collective::all_to_all || v.path == Path::two_shot;
                const int least = (v.collective == Collective::reduce_scatter ? 1 : 2) +
                                  (writes_for_peers && count > 127 ? n - 1 : 0);
                if (copies < least) e = fmt::format("{}: rank 0 copied {} times, at least {} expected", what, copies, least);
                else ++copied;
                if (e.empty() && writes_for_peers && count > 127) ++copied_out;
              }
              if (!e.empty()) failures.push_back(e);
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(copied > 100);
  CHECK(copied_out > 50);
  MESSAGE(runs << " runs of both protocols over host memory: bit-exact, alike, in bound");
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

TEST_CASE("the lane hand-overs of the recipe: copy lanes outside capture, events under capture; copy_engine paces its sends but two-shot's") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, on_copy_lanes = 0, paced_calls = 0;
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (int n : {2, 3, 4}) {
      for (const Variant& v : kVariants) {
        for (bool in_place : {false, true}) {
          // Three sets (two-shot's gather one stage late, after the next stage's finish) and two (right
          // after its own); 4099 elements reuse every set.
          for (auto [count, sets] : {std::pair{size_t(3 * n * 128 + 5), 3u}, {size_t{4099}, 3u}, {size_t{4099}, 2u}}) {
            // Stream waits of rank 0: [protocol kernels, copy_engine][eager, captured].
            int waits[2][2] = {};
            for (int protocol : {0, 1}) {
              if (mode == DirectMode::peer_memory && protocol == 0) continue;  // peer memory runs kernels either way
              for (bool capturing : {false, true}) {
                Run cfg = many_stages(mode, in_place, count);
                cfg.config.direct_protocol = protocol == 0 ? DirectProtocol::kernels : DirectProtocol::copy_engine;
                cfg.config.direct_sets = sets;
                cfg.machine.capturing = capturing;
                Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::sum, count, 29u + count};
                const size_t st = direct_stage_for(cfg.config, v.collective, v.path, count, DataType::bf16, n);
                if (st == 0 || st >= count) continue;  // one stage: nothing to hand over or pace
                ++runs;
                waits[protocol][capturing] = run_carried(cfg, spec, n, mode, failures);
              }
            }
            const std::string what = fmt::format("{} {} n={} {} sets={} count={}", to_string(v.collective),
                                                 to_string(v.path), n, to_string(mode), sets, count);
            // Outside capture the copy lanes hop to and from the kernel lanes: more waits, for every
            // program and protocol (two-shot's gather included).
            for (int protocol : {0, 1}) {
              if (waits[protocol][0] == 0) continue;  // not run
              if (waits[protocol][0] <= waits[protocol][1])
                failures.push_back(fmt::format("{} protocol {}: {} stream waits eager, {} captured", what, protocol,
                                               waits[protocol][0], waits[protocol][1]));
              else
                ++on_copy_lanes;
            }
            // Under capture (no copy lanes) the copy_engine protocol adds one wait per stage but the
            // first where it paces (every program without a second handshake), the kernels one none.
            if (mode == DirectMode::host_memory && waits[0][1] && waits[1][1]) {
              const bool pacing = !(v.collective == Collective::all_reduce && v.path == Path::two_shot);
              const bool more = waits[1][1] > waits[0][1];
              if (more != pacing)
                failures.push_back(fmt::format("{}: captured, copy_engine {} stream waits, kernels {}", what,
                                               waits[1][1], waits[0][1]));
              else if (more)
                ++paced_calls;
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(on_copy_lanes > 20);
  CHECK(paced_calls > 10);
  MESSAGE(runs << " runs eager and captured: bit-exact, alike, in bound; " << on_copy_lanes << " on copy lanes, "
               << paced_calls << " paced");
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
  for (int queues : {1, 2}) {
    for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
      for (int n : {2, 3, 4}) {
        for (const Variant& v : kVariants) {
          // Each protocol, with its copy lanes (eager) and without (captured).
          for (DirectProtocol protocol : {DirectProtocol::kernels, DirectProtocol::copy_engine}) {
            if (mode == DirectMode::peer_memory && protocol == DirectProtocol::copy_engine) continue;
            for (bool capturing : {false, true}) {
              for (size_t count : {size_t(3 * n * 128 + 5), size_t{4099}}) {
                Run cfg = many_stages(mode, false, count);
                cfg.machine.hw_queues = queues;
                cfg.machine.capturing = capturing;
                cfg.config.direct_protocol = protocol;
                Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::sum, count, 37u + count};
                ++runs;
                const size_t before = failures.size();
                run_carried(cfg, spec, n, mode, failures);
                for (size_t i = before; i < failures.size(); ++i)
                  failures[i] = fmt::format("{} queue(s), {}{}: {}", queues, to_string(protocol),
                                            capturing ? ", captured" : "", failures[i]);
              }
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  MESSAGE(runs << " runs on shared hardware queues: no hang, bit-exact, alike, in bound");
}

TEST_CASE("ranks that share a GPU cut a call into fewer stages (the shared bounds of the direct pipeline's shape): the same bytes, no race") {
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
        // 4-7 stages of the test's stage size with a GPU each (at most 8 stages does not bound them),
        // 2-3 where ranks share one (a bound of 2, then as large as a set holds).
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

TEST_CASE("direct.sets 3 and 4: stages take the sets in turn, each reused; the same bytes, no race, calls back to back") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0;
  for (DirectMode mode : {DirectMode::host_memory, DirectMode::peer_memory}) {
    for (int sets : {3, 4}) {
      for (int n : {2, 3, 4}) {
        for (const Variant& v : kVariants) {
          // Host memory: each protocol; peer memory runs kernels either way.
          for (DirectProtocol protocol : {DirectProtocol::copy_engine, DirectProtocol::kernels}) {
            if (mode == DirectMode::peer_memory && protocol == DirectProtocol::copy_engine) continue;
            for (bool in_place : {false, true}) {
              // Many stages of 1 KiB in a 24 KiB window (every set reused), and in a device scratch of
              // 12 KiB cut into `sets` (a full stage's slots then do not fit it, a short last stage's may).
              for (auto [window, stage, scratch] : {std::tuple<size_t, size_t, size_t>{24 << 10, 1 << 10, 512 << 10},
                                                    {24 << 10, 1 << 10, 12 << 10}}) {
                Run cfg;
                cfg.config = direct_config(mode, window, stage);
                cfg.config.direct_sets = static_cast<uint32_t>(sets);
                cfg.config.direct_protocol = protocol;
                cfg.config.scratch_max_bytes = scratch;
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
  CHECK(runs > 150);
  MESSAGE(runs << " runs with 3 and 4 buffer sets: bit-exact, alike, no race");
}

TEST_CASE("3 and 4 buffer sets with grouped all-reduces coalesced into one call, and with error feedback: the same bytes, no race") {
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
        // lanes fork). Also where the quantize writes straight into a window (the kernels protocol),
        // which with copy lanes runs on the send lane.
        for (auto [mode, protocol] : {std::pair{DirectMode::host_memory, DirectProtocol::copy_engine},
                                      std::pair{DirectMode::host_memory, DirectProtocol::kernels},
                                      std::pair{DirectMode::peer_memory, DirectProtocol::kernels}}) {
          Run cfg;
          cfg.config = direct_config(mode, 24 << 10, 1 << 10);
          cfg.config.direct_protocol = protocol;
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
  REQUIRE(sched::direct_stage_elems(stage_model(cfg.config), 32 << 10, spec.collective, spec.path, spec.count, 2, n, f) == 0);
  const auto inputs = inputs_for(spec, n);
  const Outcome o = run(cfg, spec, inputs);
  CHECK(check_clean(cfg, spec, inputs, o) == "");
  for (int r = 0; r < n; ++r) CHECK(o.transports[static_cast<size_t>(r)] == Carrier::nccl);
}

TEST_CASE("direct transport sizes: one stage when the call fits, whole units otherwise, by the fabric's pipeline shape") {
  const quant::WireFormat f{};
  // The built-in shape: stages of 8 MiB, at most 8 of them; where ranks share a GPU at most 2, of at
  // most 32 MiB.
  const CostModel builtin = sched::default_cost_model(Fabric::pcie);
  CHECK(builtin.direct_stage_bytes == 8u << 20);
  CHECK(builtin.direct_max_stages == 8);
  CHECK(builtin.direct_shared_max_stages == 2);
  CHECK(builtin.direct_shared_stage_bytes == 32u << 20);
  // A profile's figures replace them one by one.
  Config c = direct_config(DirectMode::host_memory, 1 << 20, 64 << 10);
  CostModel m = stage_model(c);
  CHECK(m.direct_stage_bytes == 64u << 10);
  CHECK(m.direct_max_stages == 8);
  CHECK_FALSE(m.calibrated);  // the shape alone does not calibrate the model
  m.direct_max_stages = 1u << 30;  // stages of direct_stage_bytes however many
  // 4 ranks, bf16, two-shot: a unit is 4 x 128 elements.
  CHECK(sched::direct_stage_elems(m, 512 << 10, Collective::all_reduce, Path::two_shot, 1000, 2, 4, f) == 1000);
  const size_t big = sched::direct_stage_elems(m, 512 << 10, Collective::all_reduce, Path::two_shot, 1 << 20, 2, 4, f);
  CHECK(big % 512 == 0);
  CHECK(big * 2 <= (64u << 10));  // the stage cap in caller bytes
  CHECK(sched::direct_set_bytes(Collective::all_reduce, Path::two_shot, big, 4, f) <= (512u << 10));
  // At most 8 stages: a call of more than 8 stages of direct_stage_bytes gets 8 larger ones where a
  // set holds them, more (of whole units, as large as fit) where it does not; calls of up to 8 keep
  // direct_stage_bytes.
  const CostModel m8 = builtin;
  const size_t set64 = 32 << 20;
  for (const auto [mib, stages] : {std::pair<size_t, size_t>{16, 2}, {64, 8}, {256, 8}}) {
    const size_t count = mib << 19;  // bf16 elements
    const size_t st = sched::direct_stage_elems(m8, set64, Collective::all_reduce, Path::one_shot, count, 2, 2, f);
    CAPTURE(mib);
    CHECK(sched::stage_count(count, st) == stages);
    CHECK(sched::direct_set_bytes(Collective::all_reduce, Path::one_shot, st, 2, f) <= set64);
  }
  // Ranks sharing a GPU's host link (DirectWindows::ranks_per_gpu above 1): the shared bounds, so
  // 16 MiB keeps two stages of direct_stage_bytes, 64 MiB goes in 2 of 32 MiB, 256 MiB in 8 of
  // 32 MiB; with a size cap as large as a set, 256 MiB in stages as large as a set holds (5 here).
  CostModel shared = builtin;
  for (const uint64_t cap : {uint64_t{32} << 20, uint64_t{1} << 40}) {
    shared.direct_shared_stage_bytes = cap;
    for (const auto [mib, stages] : {std::pair<size_t, size_t>{16, 2}, {64, 2}, {256, cap < set64 * 2 ? 8u : 5u}}) {
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
  shared.direct_shared_stage_bytes = 32u << 20;
  CHECK(sched::stage_count(size_t{8} << 20, sched::direct_stage_elems(shared, set64, Collective::reduce_scatter,
                                                                      Path::two_shot, size_t{8} << 20, 2, 4, f, 4)) == 2);
  // The reduce-scatter's stage counts every rank's block: blocks of 16 Mi elements (128 MiB of bf16
  // over 4 ranks) in 8 stages, not 16 of 8 MiB.
  const size_t rs = sched::direct_stage_elems(m8, set64, Collective::reduce_scatter, Path::two_shot, size_t{16} << 20, 2, 4, f);
  CHECK(sched::stage_count(size_t{16} << 20, rs) == 8);
  // A set too small for count / 8: as large as fit, so more stages.
  const size_t small_set = 4 << 20;
  const size_t capped = sched::direct_stage_elems(m8, small_set, Collective::all_reduce, Path::one_shot, size_t{128} << 20, 2, 2, f);
  CHECK(sched::direct_set_bytes(Collective::all_reduce, Path::one_shot, capped, 2, f) <= small_set);
  CHECK(sched::stage_count(size_t{128} << 20, capped) > 8);
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
    DirectProtocol protocol = DirectProtocol::automatic;  // direct.protocol
    uint32_t sets = 2;                                     // direct.sets
    bool capturing = false;                                // the captured calls' lane hand-overs
  };
  const Scenario scenarios[] = {
      {"two-shot, host memory, pipelined", {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::avg, 7000, 3}, DirectMode::host_memory},
      {"one-shot, peer memory, pipelined", {Collective::all_reduce, Path::one_shot, DataType::f32, ReduceOp::sum, 5000, 4}, DirectMode::peer_memory},
      {"reduce-scatter, host memory", {Collective::reduce_scatter, Path::two_shot, DataType::bf16, ReduceOp::sum, 2000, 6}, DirectMode::host_memory},
      {"all-gather, peer memory", {Collective::all_gather, Path::one_shot, DataType::bf16, ReduceOp::sum, 3000, 7}, DirectMode::peer_memory},
      {"all-to-all, host memory, pipelined", {Collective::all_to_all, Path::one_shot, DataType::bf16, ReduceOp::sum, 3000, 8}, DirectMode::host_memory},
      {"all-to-all, peer memory, pipelined, captured", {Collective::all_to_all, Path::one_shot, DataType::f32, ReduceOp::sum, 2500, 9}, DirectMode::peer_memory, DirectProtocol::automatic, 2, true},
      {"two-shot, host memory, pipelined, kernels", {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::avg, 7000, 3}, DirectMode::host_memory, DirectProtocol::kernels},
      {"reduce-scatter, host memory, pipelined, kernels", {Collective::reduce_scatter, Path::two_shot, DataType::bf16, ReduceOp::sum, 6000, 6}, DirectMode::host_memory, DirectProtocol::kernels},
      {"one-shot, host memory, pipelined, captured", {Collective::all_reduce, Path::one_shot, DataType::bf16, ReduceOp::sum, 5000, 4}, DirectMode::host_memory, DirectProtocol::automatic, 2, true},
      {"two-shot, peer memory, pipelined, captured", {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::avg, 7000, 3}, DirectMode::peer_memory, DirectProtocol::automatic, 2, true},
      {"reduce-scatter, host memory, pipelined, captured", {Collective::reduce_scatter, Path::two_shot, DataType::bf16, ReduceOp::sum, 6000, 6}, DirectMode::host_memory, DirectProtocol::automatic, 2, true},
      {"two-shot, host memory, pipelined, 4 sets", {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::avg, 7000, 3}, DirectMode::host_memory, DirectProtocol::automatic, 4},
  };
  std::vector<std::string> failures;
  size_t runs = 0;
  std::array<std::array<size_t, 3>, sim::kSiteCount> tally{};  // other ranks: error, async error, right
  for (const Scenario& sc : scenarios) {
    const int n = 3;
    Run base;
    base.config = direct_config(sc.mode, 24 << 10, 4 << 10);
    base.config.direct_protocol = sc.protocol;
    base.config.direct_sets = sc.sets;
    base.machine.capturing = sc.capturing;
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
      {Collective::all_to_all, Path::one_shot, DataType::bf16, ReduceOp::sum, 2001, 28},
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
