// The CPU tier of the execution core: the engine, unchanged, over a simulated machine of N ranks
// (tests/sched/sim/sim.hpp: simulated CUDA streams and events, NCCL and the reference codec).
//   - every FP8 algorithm, bit for bit against the reference algorithm, identical on every rank and
//     within the stated bound of the fp64 sum, for world sizes 2..16, every dtype, sum/avg, odd
//     counts, one stage and many, both gather transports, every wire format option;
//   - fault injection: each transport operation, codec launch and CUDA call of a collective fails in
//     turn on one rank; every rank then sees an error or holds the right result, no access races
//     (no scratch reused while a failed call may still read it, the caller's stream joined on every
//     exit), nothing hangs, the next call fails cleanly, nothing leaks;
//   - the agreement at communicator creation, groups, coalescing, error feedback and the lifecycle.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/log.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/engine/engine.hpp"
#include "sched/platform/nccl_types.hpp"
#include "sched/plan/stages.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;

namespace {

const Variant kVariants[] = {{Collective::all_reduce, Path::two_shot}, {Collective::all_reduce, Path::one_shot},
                             {Collective::all_reduce, Path::ring},     {Collective::reduce_scatter, Path::two_shot},
                             {Collective::all_gather, Path::one_shot}};

}  // namespace

TEST_CASE("every FP8 algorithm over the simulated transport: the reference bit for bit, alike on every rank, in bound") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, pipelined = 0;
  for (int n : {2, 3, 4, 5, 7, 8, 16}) {
    for (const Variant& v : kVariants) {
      for (DataType t : {DataType::f32, DataType::f16, DataType::bf16}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
          if (v.collective == Collective::all_gather && op == ReduceOp::avg) continue;
          for (size_t count : {size_t{1}, size_t{127}, size_t(3 * n * 128 + 5), size_t{4099}}) {
            for (size_t scratch : {size_t{512} << 10, size_t{40} << 10, size_t{12} << 10}) {
              if (n == 16 && count == 1) continue;
              Run cfg;
              cfg.config = sim_config(scratch);
              Spec spec{v.collective, v.path, t, op, count, 11u + count};
              const size_t stage = stage_for(cfg.config, spec, n);
              if (stage == 0) continue;  // does not fit even one stage: falls back (tested below)
              if (stage < count) ++pipelined;
              const auto inputs = inputs_for(spec, n);
              const Outcome o = run(cfg, spec, inputs);
              ++runs;
              if (std::string e = check_clean(cfg, spec, inputs, o); !e.empty()) failures.push_back(e);
            }
          }
        }
      }
    }
  }
  INFO(runs << " runs, " << pipelined << " pipelined");
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(pipelined > 200);
  MESSAGE(runs << " runs (" << pipelined << " pipelined) bit-exact, identical across ranks, in bound");
}

TEST_CASE("both gather transports and every wire format option") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0;
  for (GatherMethod g : {GatherMethod::allgather, GatherMethod::sendrecv}) {
    for (const FormatOption& fm : kFormatOptions) {
      for (int n : {3, 6}) {
        for (const Variant& v : kVariants) {
          for (size_t scratch : {size_t{512} << 10, size_t{24} << 10}) {
            Run cfg;
            cfg.config = sim_config(scratch);
            cfg.config.gather_transport = g;
            fm.set_on(cfg.config);
            Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::avg, 2500, 5};
            if (v.collective == Collective::all_gather) spec.op = ReduceOp::sum;
            if (stage_for(cfg.config, spec, n) == 0) continue;
            const auto inputs = inputs_for(spec, n);
            ++runs;
            if (std::string e = check_clean(cfg, spec, inputs, run(cfg, spec, inputs)); !e.empty()) failures.push_back(e);
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  MESSAGE(runs << " runs over both gather transports and 6 wire formats");
}

TEST_CASE("a call whose one stage does not fit the scratch passes through on every rank alike") {
  log_set_level(LogLevel::error);
  Run cfg;
  cfg.config = sim_config(1 << 10);  // not even one block per rank fits a buffer set
  const Spec spec{Collective::all_reduce, Path::two_shot, DataType::f32, ReduceOp::sum, 10000, 3};
  REQUIRE(stage_for(cfg.config, spec, 4) == 0);
  const auto inputs = inputs_for(spec, 4);
  const Outcome o = run(cfg, spec, inputs);
  CHECK(o.races.empty());
  CHECK(o.protocol.empty());
  // Plain NCCL's sum on every rank, not FP8.
  const Bytes want = plain_all_reduce(spec, inputs);
  for (const RankResult& a : o.first) {
    CHECK(a.result == ncclSuccess);
    CHECK(a.out == want);
  }
}

TEST_CASE("FP8 calls of one group on one communicator, not coalesced: each the reference bit for bit, no race") {
  // Their joins wait for the group's end, so only the call-start hand-over (the produce lane after
  // the transfer lane as the call starts) keeps a call's produce off the scratch the previous call's
  // transfer lane may still read.
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, pipelined = 0;
  for (int n : {2, 3, 4}) {
    for (Algorithm algorithm : {Algorithm::two_shot, Algorithm::one_shot}) {  // the ring cuts by stage
      // Multiples of 12 blocks: every rank's shard whole blocks at 2, 3 and 4 ranks, so the calls cut
      // the buffer as the reference's one call over the group's buffer does.
      for (size_t count : {size_t{4608}, size_t{9216}}) {
        Run cfg;
        cfg.config = sim_config(8 << 10);  // several stages per call
        cfg.config.coalesce_enable = false;
        cfg.config.algorithm = algorithm;
        cfg.forced = false;
        cfg.group = 3;
        Spec spec{Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, count, 21u + count};
        if (algorithm == Algorithm::one_shot) spec.path = Path::one_shot;
        pipelined += stage_for(cfg.config, spec, n) < count;
        const auto inputs = inputs_for(spec, n, cfg.group);
        const Outcome o = run(cfg, spec, inputs);
        ++runs;
        if (std::string e = check_clean(cfg, spec, inputs, o); !e.empty()) failures.push_back(e);
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(pipelined >= runs / 2);
  MESSAGE(runs << " groups of three all-reduces (" << pipelined << " pipelined) on one communicator: bit-exact, alike, no race");
}
