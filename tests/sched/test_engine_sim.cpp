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

namespace {

// Every rank's record of `kind` made since `seq` on an `n`-rank communicator (the simulated ranks
// share the process's accounting).
std::vector<CallRecord> records_since(uint64_t seq, int n, CallKind kind) {
  std::vector<CallRecord> all(4096);
  all.resize(Accounting::instance().snapshot(all.data(), all.size(), seq));
  std::vector<CallRecord> out;
  for (const CallRecord& r : all)
    if (r.nranks == n && r.kind == kind) out.push_back(r);
  return out;
}

// Runs `spec` on `n` ranks; the records of its calls, once every rank's call succeeded.
std::vector<CallRecord> records_of_run(const Run& cfg, const Spec& spec, int n, CallKind kind) {
  const uint64_t seq = Accounting::instance().last_seq();
  const Outcome o = run(cfg, spec, inputs_for(spec, n, std::max(cfg.group, 1)));
  for (const RankResult& a : o.first) CHECK(a.result == ncclSuccess);
  return records_since(seq, n, kind);
}

}  // namespace

TEST_CASE("call records: what NCCL's own algorithm sends for the same call, whichever path carried it") {
  log_set_level(LogLevel::error);
  SUBCASE("FP8 all-reduce at 2 and 4 ranks: 2(N-1)/N of the buffer, more than FP8 sends") {
    for (int n : {2, 4}) {
      const Spec spec{Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, 6144, 5};
      const uint64_t plain = 2 * static_cast<uint64_t>(n - 1) * spec.count * 2 / static_cast<uint64_t>(n);
      const std::vector<CallRecord> recs = records_of_run(Run{}, spec, n, CallKind::all_reduce);
      REQUIRE(recs.size() == static_cast<size_t>(n));
      for (const CallRecord& r : recs) {
        CHECK(r.path == Path::two_shot);
        CHECK(r.app_bytes == spec.count * 2);
        CHECK(r.plain_wire_bytes == plain);
        CHECK(r.wire_bytes > 0);
        CHECK(r.wire_bytes < plain);
      }
      // Only at 2 ranks does NCCL's ring send what the caller asked for.
      CHECK((plain == spec.count * 2) == (n == 2));
    }
  }
  SUBCASE("FP8 reduce-scatter: N-1 chunks of recvcount") {
    const Spec spec{Collective::reduce_scatter, Path::two_shot, DataType::f32, ReduceOp::sum, 1024, 7};
    const std::vector<CallRecord> recs = records_of_run(Run{}, spec, 4, CallKind::reduce_scatter);
    REQUIRE(recs.size() == 4);
    for (const CallRecord& r : recs) {
      CHECK(is_fp8(r.path));
      CHECK(r.plain_wire_bytes == 3 * 1024 * 4);
      CHECK(r.wire_bytes < r.plain_wire_bytes);
    }
  }
  SUBCASE("pass-through and fallback: NCCL's algorithm carries the call, so the two agree") {
    const Spec passed{Collective::all_reduce, Path::passthrough, DataType::f32, ReduceOp::sum, 1000, 3};
    for (const CallRecord& r : records_of_run(Run{}, passed, 4, CallKind::all_reduce)) {
      CHECK(r.path == Path::passthrough);
      CHECK(r.plain_wire_bytes == 2 * 3 * 1000 * 4 / 4);
      CHECK(r.wire_bytes == r.plain_wire_bytes);
    }
    Run small;
    small.config = sim_config(1 << 10);  // not one stage fits: the FP8 route falls back to NCCL
    const Spec fell{Collective::all_reduce, Path::two_shot, DataType::f32, ReduceOp::sum, 10000, 3};
    const std::vector<CallRecord> recs = records_of_run(small, fell, 4, CallKind::all_reduce);
    REQUIRE(recs.size() == 4);
    for (const CallRecord& r : recs) {
      CHECK(r.path == Path::fallback);
      CHECK(r.plain_wire_bytes == 2 * 3 * 10000 * 4 / 4);
      CHECK(r.wire_bytes == r.plain_wire_bytes);
    }
  }
  SUBCASE("three grouped all-reduces coalesced into one FP8 call: the sum over its calls") {
    Run cfg;
    cfg.config.algorithm = Algorithm::two_shot;
    cfg.forced = false;
    cfg.group = 3;
    const Spec spec{Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, 1536, 9};
    const std::vector<CallRecord> recs = records_of_run(cfg, spec, 4, CallKind::all_reduce);
    REQUIRE(recs.size() == 4);
    for (const CallRecord& r : recs) {
      CHECK(r.coalesced_calls == 3);
      CHECK(r.count == 3 * spec.count);
      CHECK(r.plain_wire_bytes == 3 * (2 * 3 * spec.count * 2 / 4));
      CHECK(r.wire_bytes < r.plain_wire_bytes);
    }
  }
}
