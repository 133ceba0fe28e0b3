// CPU tier of the scheduler: every planning rule, the cost model's crossovers, shard and pipeline
// arithmetic, coalescing caps, group nesting, the fabric agreement and the accounting ring.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "sched/engine/accounting.hpp"
#include "sched/plan/agreement.hpp"
#include "sched/plan/coalesce.hpp"
#include "sched/plan/cost_model.hpp"
#include "sched/plan/hierarchy.hpp"
#include "sched/plan/plan.hpp"
#include "sched/plan/stages.hpp"

using namespace fp8wire;
using namespace fp8wire::sched;

namespace {
CallShape ar(size_t count, int nranks = 2, DataType dtype = DataType::bf16, ReduceOp op = ReduceOp::sum) {
  CallShape c;
  c.collective = Collective::all_reduce;
  c.count = count;
  c.nranks = nranks;
  c.dtype = dtype;
  c.op = op;
  return c;
}
constexpr size_t MiB = 1 << 20;
}  // namespace

TEST_CASE("eligibility: every pass-through rule") {
  Config c;
  CHECK(static_eligibility(c, ar(1 << 20)) == PassReason::none);
  for (DataType t : {DataType::int8, DataType::uint8, DataType::int32, DataType::uint32, DataType::int64, DataType::uint64, DataType::f64})
    CHECK(static_eligibility(c, ar(1 << 20, 2, t)) == PassReason::dtype);
  for (DataType t : {DataType::f32, DataType::f16, DataType::bf16})
    CHECK(static_eligibility(c, ar(1 << 20, 2, t)) == PassReason::none);
  for (ReduceOp op : {ReduceOp::max, ReduceOp::min, ReduceOp::prod, static_cast<ReduceOp>(6)})
    CHECK(static_eligibility(c, ar(1 << 20, 2, DataType::f32, op)) == PassReason::op);
  CHECK(static_eligibility(c, ar(1 << 20, 2, DataType::f32, ReduceOp::avg)) == PassReason::none);
  CHECK(static_eligibility(c, ar(1 << 20, 1)) == PassReason::single_rank);
  CHECK(static_eligibility(c, ar(0, 4)) == PassReason::empty);
  CHECK(static_eligibility(c, ar(1 << 20, quant::kMaxReduceInputs + 1)) == PassReason::too_many_ranks);
  CHECK(std::string(to_string(PassReason::too_many_ranks)) == "too_many_ranks");

  Config off;
  off.enable = false;
  CHECK(static_eligibility(off, ar(1 << 20)) == PassReason::disabled);
  // all_gather is off by default (lossy on weights); opt-in through collectives.all_gather.
  CallShape ag = ar(1 << 20);
  ag.collective = Collective::all_gather;
  ag.op = ReduceOp::max;  // all_gather ignores the op
  CHECK(static_eligibility(c, ag) == PassReason::collective_disabled);
  Config ag_on;
  ag_on.collective_enable[static_cast<int>(Collective::all_gather)] = true;
  CHECK(static_eligibility(ag_on, ag) == PassReason::none);
  Config ar_off;
  ar_off.collective_enable[static_cast<int>(Collective::all_reduce)] = false;
  CHECK(static_eligibility(ar_off, ar(1 << 20)) == PassReason::collective_disabled);
}

TEST_CASE("thresholds per collective and fabric") {
  Config c;  // defaults (all-reduce): nvlink 256 MiB, pcie 1 MiB, net 256 KiB
  const CallShape half_mib = ar(256 * 1024);  // 512 KiB of bf16
  CHECK(plan_call(c, half_mib, Fabric::net).path != Path::passthrough);
  CHECK(plan_call(c, half_mib, Fabric::pcie).reason == PassReason::below_threshold);
  CHECK(plan_call(c, half_mib, Fabric::nvlink).reason == PassReason::below_threshold);
  // Exactly at the threshold goes FP8; one element less does not.
  c.thresholds[0][static_cast<int>(Fabric::pcie)] = 1000;
  CHECK(plan_call(c, ar(500), Fabric::pcie).path != Path::passthrough);
  CHECK(plan_call(c, ar(499), Fabric::pcie).path == Path::passthrough);
  // reduce_scatter compares the full send buffer (nranks * recvcount).
  CallShape rs = ar(100 * 1024, 4, DataType::f32);
  rs.collective = Collective::reduce_scatter;
  CHECK(threshold_bytes(rs) == 4ull * 100 * 1024 * 4);
  Config t;
  t.thresholds[1][static_cast<int>(Fabric::pcie)] = 1 * MiB;
  CHECK(plan_call(t, rs, Fabric::pcie).path == Path::two_shot);
  rs.count = 60 * 1024;
  CHECK(plan_call(t, rs, Fabric::pcie).reason == PassReason::below_threshold);
  // Threshold 0: everything eligible goes FP8 (the DDP parity test relies on it).
  Config zero;
  zero.thresholds[0] = {0, 0, 0};
  CHECK(plan_call(zero, ar(1), Fabric::nvlink).path != Path::passthrough);
  CHECK(plan_call(zero, ar(1, 2, DataType::int32), Fabric::nvlink).path == Path::passthrough);
}

TEST_CASE("cost model: one-shot vs two-shot vs pass-through") {
  Config c;
  c.thresholds[0] = {0, 0, 0};
  const auto fmt = quant::WireFormat::from(c);
  SUBCASE("two ranks: one-shot moves no more bytes and saves an operation") {
    for (size_t n : {size_t{1024}, size_t{1} << 20, size_t{1} << 26})
      CHECK(plan_call(c, ar(n, 2), Fabric::pcie).path == Path::one_shot);
  }
  SUBCASE("many ranks, large buffers: two-shot; small buffers: one-shot (latency bound)") {
    CHECK(plan_call(c, ar(64 * MiB, 8), Fabric::pcie).path == Path::two_shot);
    CHECK(plan_call(c, ar(1024, 8), Fabric::pcie).path == Path::one_shot);
  }
  SUBCASE("crossover with given parameters") {
    // lat 100 us, 10 GB/s, codec infinitely fast: one-shot = 100 + 7w/bw, two-shot = 200 + 1.75w/bw
    // -> equal at w = 100 us * 10e3 B/us / 5.25 = 190476 wire bytes (~0.36 MB of bf16 elements).
    for (CostModel& m : c.cost_model) m = {100.0, 10.0, 1e12, 1e-9, false};  // 0 would mean "default"
    const double w_cross = 100.0 * 10e3 / 5.25;
    const double per_elem = 1.0 + 4.0 / 128;
    const size_t elems_cross = static_cast<size_t>(w_cross / per_elem);
    CHECK(plan_call(c, ar(elems_cross * 9 / 10, 8), Fabric::net).path == Path::one_shot);
    CHECK(plan_call(c, ar(elems_cross * 11 / 10, 8), Fabric::net).path == Path::two_shot);
    CHECK(predicted_us(effective_cost_model(c, Fabric::net), Collective::all_reduce, Path::two_shot,
                       0, 8, fmt) == doctest::Approx(200.0));
  }
  SUBCASE("only a calibrated model may prefer pass-through") {
    // Tiny latency, huge bandwidth, slow codec: FP8 never pays off.
    CostModel slow_codec{.op_latency_us = 1.0, .bus_bandwidth_gbps = 1000.0, .codec_gbps = 1.0, .kernel_launch_us = 5.0};
    c.cost_model[static_cast<int>(Fabric::nvlink)] = slow_codec;
    CHECK(plan_call(c, ar(MiB, 4), Fabric::nvlink).path != Path::passthrough);
    c.cost_model[static_cast<int>(Fabric::nvlink)].calibrated = true;
    const Plan p = plan_call(c, ar(MiB, 4), Fabric::nvlink);
    CHECK(p.path == Path::passthrough);
    CHECK(p.reason == PassReason::cost_model);
    // A forced algorithm in the config is obeyed regardless.
    c.algorithm = Algorithm::ring;
    CHECK(plan_call(c, ar(MiB, 4), Fabric::nvlink).path == Path::ring);
  }
  SUBCASE("configured algorithm, and the single FP8 path of reduce_scatter / all_gather") {
    c.algorithm = Algorithm::two_shot;
    CHECK(plan_call(c, ar(1024, 2), Fabric::net).path == Path::two_shot);
    c.algorithm = Algorithm::one_shot;
    CHECK(plan_call(c, ar(64 * MiB, 8), Fabric::net).path == Path::one_shot);
    CallShape rs = ar(MiB, 3);
    rs.collective = Collective::reduce_scatter;
    c.thresholds[1] = {0, 0, 0};
    CHECK(plan_call(c, rs, Fabric::net).path == Path::two_shot);
  }
  SUBCASE("partial profile: given fields win one by one") {
    c.cost_model[static_cast<int>(Fabric::pcie)].op_latency_us = 4500;
    c.cost_model[static_cast<int>(Fabric::pcie)].allgather_latency_us = 900;
    const CostModel m = effective_cost_model(c, Fabric::pcie);
    CHECK(m.op_latency_us == 4500);
    CHECK(m.bus_bandwidth_gbps == default_cost_model(Fabric::pcie).bus_bandwidth_gbps);
    // Per-operation figures: their own where given, else the generic ones.
    CHECK(m.latency_us(NcclOp::all_gather) == 900);
    CHECK(m.latency_us(NcclOp::all_reduce) == 4500);
    CHECK(m.latency_us(NcclOp::all_to_all) == 4500);
    CHECK(m.bandwidth_gbps(NcclOp::all_gather) == m.bus_bandwidth_gbps);
  }
  SUBCASE("gather transport: send/recv costs the gather step as an all_to_all") {
    CostModel m = default_cost_model(Fabric::net);
    m.allgather_latency_us = 11000;
    m.alltoall_latency_us = 7000;
    const auto sr = GatherMethod::sendrecv;
    CHECK(fixed_latency_us(m, Collective::all_reduce, Path::one_shot, 4, sr) == 7000);
    CHECK(fixed_latency_us(m, Collective::all_reduce, Path::two_shot, 4, sr) == 14000);
    CHECK(fixed_latency_us(m, Collective::all_reduce, Path::ring, 4, sr) == 4 * 7000);
    CHECK(fixed_latency_us(m, Collective::all_gather, Path::one_shot, 4, sr) == 7000);
    CHECK(fixed_latency_us(m, Collective::reduce_scatter, Path::two_shot, 4, sr) == 7000);
    CHECK(fixed_latency_us(m, Collective::all_reduce, Path::passthrough, 4, sr) == m.op_latency_us);
    // Same bytes: with equal figures the two transports predict the same time.
    CostModel flat = default_cost_model(Fabric::net);
    CHECK(predicted_us(flat, Collective::all_reduce, Path::one_shot, 64 * MiB, 4, fmt, sr) ==
          doctest::Approx(predicted_us(flat, Collective::all_reduce, Path::one_shot, 64 * MiB, 4, fmt)));
    CHECK_FALSE(has_gather_step(Collective::reduce_scatter, Path::two_shot));
    CHECK_FALSE(has_gather_step(Collective::all_reduce, Path::passthrough));
    CHECK(has_gather_step(Collective::all_reduce, Path::ring));
    CHECK(has_gather_step(Collective::all_gather, Path::one_shot));

    Config t = c;
    t.thresholds[0].fill(0);
    // The built-in figures tie: the all-gather.
    CHECK(plan_call(t, ar(2 * MiB, 4), Fabric::net).gather == GatherMethod::allgather);
    // Forced by the config, for paths with a gather step only.
    t.gather_transport = sr;
    CHECK(plan_call(t, ar(2 * MiB, 4), Fabric::net).gather == sr);
    CHECK(gather_method_for(t, Collective::reduce_scatter, Path::two_shot, 64 * MiB, 4, Fabric::net) ==
          GatherMethod::allgather);
    // Calibrated on the emulated 4-rank testbed (send/recv exchange 9.1 ms vs all-gather 14.5 ms for
    // 2.1 MiB per rank): automatic picks send/recv, and one-shot stays the choice at 4 MiB.
    t.gather_transport = GatherMethod::automatic;
    t.cost_model[static_cast<int>(Fabric::net)] = {.op_latency_us = 14000, .bus_bandwidth_gbps = 1.16,
                                                    .codec_gbps = 2100, .kernel_launch_us = 5,
                                                    .allreduce_latency_us = 14000, .allgather_latency_us = 11000,
                                                    .alltoall_latency_us = 4000, .allgather_bandwidth_gbps = 0.87,
                                                    .alltoall_bandwidth_gbps = 1.5, .calibrated = true};
    const Plan p = plan_call(t, ar(2 * MiB, 4), Fabric::net);
    CHECK(p.path == Path::one_shot);
    CHECK(p.gather == sr);
    CHECK(gather_method_for(t, Collective::all_reduce, Path::two_shot, 64 * MiB, 4, Fabric::net) == sr);
    // And an all-gather that is the cheaper operation keeps the all-gather.
    t.cost_model[static_cast<int>(Fabric::net)].alltoall_latency_us = 20000;
    t.cost_model[static_cast<int>(Fabric::net)].alltoall_bandwidth_gbps = 0.5;
    CHECK(plan_call(t, ar(2 * MiB, 4), Fabric::net).gather == GatherMethod::allgather);
  }
  SUBCASE("each path costs the latencies of the operations it issues") {
    CostModel m = default_cost_model(Fabric::net);
    // Without per-operation figures the model is the former one: two-shot pays two operations.
    CHECK(predicted_us(m, Collective::all_reduce, Path::two_shot, 0, 4, fmt) ==
          doctest::Approx(2 * m.op_latency_us + 3 * m.kernel_launch_us));
    m.allreduce_latency_us = 27000;  // the emulated 4-rank testbed: all-reduce >> all-gather
    m.allgather_latency_us = 11000;
    m.alltoall_latency_us = 7000;
    m.reduce_scatter_latency_us = 3000;
    CHECK(fixed_latency_us(m, Collective::all_reduce, Path::passthrough, 4) == 27000);
    CHECK(fixed_latency_us(m, Collective::all_reduce, Path::one_shot, 4) == 11000);
    CHECK(fixed_latency_us(m, Collective::all_reduce, Path::two_shot, 4) == 18000);
    CHECK(fixed_latency_us(m, Collective::all_reduce, Path::ring, 4) == 3 * 7000 + 11000);
    CHECK(fixed_latency_us(m, Collective::reduce_scatter, Path::passthrough, 4) == 3000);
    CHECK(fixed_latency_us(m, Collective::reduce_scatter, Path::two_shot, 4) == 7000);
    CHECK(fixed_latency_us(m, Collective::all_gather, Path::one_shot, 4) == 11000);
    CHECK(predicted_us(m, Collective::all_reduce, Path::one_shot, 0, 4, fmt) ==
          doctest::Approx(11000 + 2 * m.kernel_launch_us));
    // A slower all-gather bandwidth slows one-shot (all bytes through the all-gather) and leaves
    // plain all-reduce alone.
    const double one = predicted_us(m, Collective::all_reduce, Path::one_shot, 64 * MiB, 4, fmt);
    const double plain = predicted_us(m, Collective::all_reduce, Path::passthrough, 64 * MiB, 4, fmt);
    m.allgather_bandwidth_gbps = m.bus_bandwidth_gbps / 2;
    CHECK(predicted_us(m, Collective::all_reduce, Path::one_shot, 64 * MiB, 4, fmt) > one);
    CHECK(predicted_us(m, Collective::all_reduce, Path::passthrough, 64 * MiB, 4, fmt) == plain);
    // A calibrated profile with these figures: one-shot at 4 MiB (one cheap all-gather beats the
    // all-reduce), where a single latency chose two-shot.
    Config t = c;
    t.thresholds[0].fill(0);
    t.cost_model[static_cast<int>(Fabric::net)] = {.op_latency_us = 14000, .bus_bandwidth_gbps = 1.16,
                                                    .codec_gbps = 2100, .kernel_launch_us = 5,
                                                    .allreduce_latency_us = 14000, .allgather_latency_us = 11000,
                                                    .alltoall_latency_us = 7200, .allgather_bandwidth_gbps = 0.87,
                                                    .alltoall_bandwidth_gbps = 0.93, .calibrated = true};
    CHECK(plan_call(t, ar(2 * MiB, 4), Fabric::net).path == Path::one_shot);    // 4 MiB of bf16
    CHECK(plan_call(t, ar(32 * MiB, 4), Fabric::net).path == Path::two_shot);   // 64 MiB
  }
}

TEST_CASE("shard layout: block-aligned shards, short and empty tails, odd world sizes") {
  quant::WireFormat f;  // e4m3, fp32 scales, block 128
  SUBCASE("odd world size") {
    const ShardLayout l = shard_layout(1000, 3, f);
    CHECK(l.shard_elems == 384);  // ceil(1000/3) = 334 -> 3 blocks
    CHECK(l.length(0) == 384);
    CHECK(l.length(1) == 384);
    CHECK(l.length(2) == 232);
    CHECK(l.begin(2) == 768);
    CHECK(l.seg_stride == quant::chunk_bytes(384, f));
    CHECK(l.seg_stride % quant::kWireAlign == 0);
    CHECK(l.bytes(2, f) == quant::chunk_bytes(232, f));
  }
  SUBCASE("count < nranks: one short shard, the rest empty") {
    const ShardLayout l = shard_layout(3, 4, f);
    CHECK(l.shard_elems == 128);
    CHECK(l.length(0) == 3);
    for (int j = 1; j < 4; ++j) {
      CHECK(l.length(j) == 0);
      CHECK(l.bytes(j, f) == 0);
      CHECK(l.begin(j) == 3);
    }
  }
  SUBCASE("every count and world size covers the buffer exactly once") {
    for (int n : {2, 3, 4, 5, 7, 8}) {
      for (size_t count : {size_t{1}, size_t{127}, size_t{128}, size_t{129}, size_t{1000}, size_t{4096},
                           size_t{99991}, size_t{1} << 20}) {
        const ShardLayout l = shard_layout(count, n, f);
        size_t covered = 0;
        for (int j = 0; j < n; ++j) {
          if (l.length(j)) CHECK(l.begin(j) % f.block == 0);
          CHECK(l.begin(j) == covered);
          CHECK(l.length(j) <= l.shard_elems);
          covered += l.length(j);
        }
        CHECK(covered == count);
        CHECK(l.shard_elems % f.block == 0);
        CHECK(quant::segment_count(count, l.segmented()) <= static_cast<size_t>(n));
      }
    }
  }
  SUBCASE("block size follows the format") {
    f.block = 32;
    CHECK(shard_layout(100, 2, f).shard_elems == 64);
  }
}

TEST_CASE("pipelining: stages fit the scratch, as few as the fabric's latency makes worthwhile") {
  Config c;
  const auto f = quant::WireFormat::from(c);
  const ScratchLayout s = scratch_layout(c);
  CHECK(s.total_bytes <= c.scratch_max_bytes);
  CHECK(s.staging_bytes == 64 * MiB);  // min(coalesce.max_bytes, scratch/4)
  CHECK(s.set_offset(1) == s.staging_bytes + s.set_bytes);
  const Collective AR = Collective::all_reduce;

  SUBCASE("small buffers: one stage") {
    CHECK(stage_elems(c, s, AR, Path::two_shot, 1000, 2, 4, f, Fabric::net) == 1000);
    CHECK(stage_count(1000, 1000) == 1);
  }
  SUBCASE("two-shot keeps two wire copies (sent, received + gathered)") {
    const ShardLayout l = shard_layout(1 << 20, 4, f);
    CHECK(stage_scratch_bytes(AR, Path::two_shot, 1 << 20, 4, f) == 2 * l.total_bytes());
  }
  SUBCASE("a call that fits both buffer sets runs as one stage, whatever pipeline.chunk_bytes says") {
    // 64 MiB of bf16: two wire copies are ~66 MiB, more than one set (96 MiB) only for one-shot at 4.
    for (int n : {2, 3, 4}) {
      CHECK(stage_elems(c, s, AR, Path::two_shot, 32 * MiB, 2, n, f, Fabric::net) == 32 * MiB);
      CHECK(stage_elems(c, s, AR, Path::one_shot, 32 * MiB, 2, n, f, Fabric::net) == 32 * MiB);
    }
  }
  SUBCASE("256 MiB of bf16 on net: as few stages as the scratch allows (not 8 chunks of 32 MiB)") {
    // A 256 MiB cap (the default is larger, and fits this call in one stage).
    Config c = Config{};
    c.scratch_max_bytes = 256 * MiB;
    const ScratchLayout s = scratch_layout(c);
    const size_t count = 128 * MiB;
    for (Path p : {Path::two_shot, Path::one_shot}) {
      for (int n : {2, 4}) {
        CAPTURE(n);
        const size_t st = stage_elems(c, s, AR, p, count, 2, n, f, Fabric::net);
        REQUIRE(st > 0);
        CHECK(st % stage_unit_elems(AR, p, n, f) == 0);
        CHECK(stage_scratch_bytes(AR, p, st, n, f) <= s.set_bytes);
        // The fewest stages whose scratch fits one set.
        const size_t bigger = st + stage_unit_elems(AR, p, n, f) * 1024;
        CHECK((stage_count(count, st) == 1 || stage_count(count, bigger) == stage_count(count, st) ||
               stage_scratch_bytes(AR, p, (count + stage_count(count, st) - 2) / (stage_count(count, st) - 1), n, f) > s.set_bytes));
        if (p == Path::two_shot && n == 2) CHECK(stage_count(count, st) == 3);
        if (p == Path::one_shot && n == 4) CHECK(stage_count(count, st) <= 6);
      }
    }
  }
  SUBCASE("uncalibrated net: no stage beyond what the scratch forces") {
    Config big = c;
    big.scratch_max_bytes = 384 * MiB;  // both sets: 320 MiB, two wire copies of 256 MiB bf16: 264 MiB
    const ScratchLayout bs = scratch_layout(big);
    CHECK(stage_elems(big, bs, AR, Path::two_shot, 128 * MiB, 2, 2, f, Fabric::net) == 128 * MiB);
    CHECK(stage_elems(big, bs, AR, Path::one_shot, 128 * MiB, 2, 2, f, Fabric::net) == 128 * MiB);
    // The same call on nvlink's (trusted) defaults pipelines: 15 us operations hide the quantize.
    const size_t st = stage_elems(big, bs, AR, Path::two_shot, 128 * MiB, 2, 2, f, Fabric::nvlink);
    CHECK(stage_count(128 * MiB, st) > 1);
  }
  SUBCASE("a calibrated high-latency fabric never pipelines beyond the scratch minimum") {
    Config slow = c;
    slow.cost_model[static_cast<int>(Fabric::net)] = {
        .op_latency_us = 4500.0, .bus_bandwidth_gbps = 3.0, .codec_gbps = 2000.0, .kernel_launch_us = 5.0, .calibrated = true};
    CHECK(stage_elems(slow, s, AR, Path::two_shot, 16 * MiB, 2, 2, f, Fabric::net) == 16 * MiB);
    Config fast = c;  // cheap operations, slow codec: pipelining pays, down to pipeline.chunk_bytes
    fast.cost_model[static_cast<int>(Fabric::nvlink)] = {
        .op_latency_us = 1.0, .bus_bandwidth_gbps = 300.0, .codec_gbps = 50.0, .kernel_launch_us = 2.0, .calibrated = true};
    const size_t st = stage_elems(fast, s, AR, Path::two_shot, 16 * MiB, 2, 2, f, Fabric::nvlink);
    CHECK(stage_count(16 * MiB, st) == 1);  // 32 MiB of caller bytes: one 32 MiB chunk already
    fast.pipeline_chunk_bytes = 4 * MiB;
    const size_t st4 = stage_elems(fast, s, AR, Path::two_shot, 16 * MiB, 2, 2, f, Fabric::nvlink);
    CHECK(stage_count(16 * MiB, st4) == 8);  // sqrt(quantize / latency) is larger: capped by the chunk
    CHECK(st4 * 2 >= 4 * MiB);
  }
  SUBCASE("a small scratch cap forces more, smaller stages") {
    Config small = c;
    small.scratch_max_bytes = 4 * MiB;
    const ScratchLayout ss = scratch_layout(small);
    CHECK(ss.staging_bytes == MiB);
    const size_t st = stage_elems(small, ss, AR, Path::two_shot, 16 * MiB, 4, 4, f, Fabric::net);
    REQUIRE(st > 0);
    CHECK(stage_scratch_bytes(AR, Path::two_shot, st, 4, f) <= ss.set_bytes);
    // Not much smaller than what fits: two wire copies of ~1.03 bytes per element in 1.5 MiB.
    CHECK(st >= 600000);
    CHECK(stage_count(16 * MiB, st) > 20);
  }
  SUBCASE("scratch too small for one unit: 0 (the call falls back on every rank)") {
    Config tiny = c;
    tiny.scratch_max_bytes = 4096;
    tiny.coalesce_enable = false;
    const ScratchLayout ts = scratch_layout(tiny);
    CHECK(ts.staging_bytes == 0);
    CHECK(stage_elems(tiny, ts, AR, Path::two_shot, 1 << 20, 2, 8, f, Fabric::net) == 0);
  }
  SUBCASE("reduce_scatter and all_gather: stages of whole blocks that fit") {
    const size_t st = stage_elems(c, s, Collective::reduce_scatter, Path::two_shot, 64 * MiB, 4, 4, f, Fabric::net);
    REQUIRE(st > 0);
    CHECK(st % f.block == 0);
    CHECK(stage_scratch_bytes(Collective::reduce_scatter, Path::two_shot, st, 4, f) <= s.set_bytes);
    const size_t ag = stage_elems(c, s, Collective::all_gather, Path::one_shot, 100, 4, 3, f, Fabric::net);
    CHECK(ag == 100);
  }
}

TEST_CASE("coalescing: only grouped, same comm/stream/dtype/op, capped by bytes and calls") {
  Config c;
  c.coalesce_max_bytes = 1000;
  c.coalesce_max_calls = 3;
  int comm_a, comm_b, stream_a, stream_b;
  auto item = [&](uint64_t bytes, const void* comm, const void* stream = nullptr,
                  DataType t = DataType::bf16, ReduceOp op = ReduceOp::sum) {
    PendingShape p;
    p.comm = comm;
    p.stream = stream ? stream : &stream_a;
    p.bytes = bytes;
    p.dtype = t;
    p.op = op;
    return p;
  };
  std::vector<PendingShape> v = {item(100, &comm_a), item(100, &comm_a), item(100, &comm_a), item(100, &comm_a)};
  CHECK(coalesce_batch_length(c, 1 << 20, v) == 3);  // call cap
  v = {item(600, &comm_a), item(300, &comm_a), item(200, &comm_a)};
  CHECK(coalesce_batch_length(c, 1 << 20, v) == 2);  // byte cap: 600 + 300 <= 1000 < 1100
  CHECK(coalesce_batch_length(c, 800, v) == 1);      // the staging area caps too
  v = {item(2000, &comm_a), item(10, &comm_a)};
  CHECK(coalesce_batch_length(c, 1 << 20, v) == 1);  // alone beyond the cap: runs alone
  v = {item(10, &comm_a), item(10, &comm_b)};
  CHECK(coalesce_batch_length(c, 1 << 20, v) == 1);
  v = {item(10, &comm_a), item(10, &comm_a, &stream_b)};
  CHECK(coalesce_batch_length(c, 1 << 20, v) == 1);
  v = {item(10, &comm_a), item(10, &comm_a, nullptr, DataType::f32)};
  CHECK(coalesce_batch_length(c, 1 << 20, v) == 1);
  v = {item(10, &comm_a), item(10, &comm_a, nullptr, DataType::bf16, ReduceOp::avg)};
  CHECK(coalesce_batch_length(c, 1 << 20, v) == 1);
  v = {item(10, &comm_a), item(10, &comm_a)};
  v[1].fp8 = false;  // a pass-through call in between is never swallowed
  CHECK(coalesce_batch_length(c, 1 << 20, v) == 1);
  v[1].fp8 = true;
  v[0].collective = v[1].collective = Collective::reduce_scatter;
  CHECK(coalesce_batch_length(c, 1 << 20, v) == 1);  // only all-reduces are packed
  v[0].collective = v[1].collective = Collective::all_reduce;
  CHECK(coalesce_batch_length(c, 1 << 20, v) == 2);
  c.coalesce_enable = false;
  CHECK(coalesce_batch_length(c, 1 << 20, v) == 1);
  CHECK(coalesce_batch_length(c, 1 << 20, std::span<const PendingShape>()) == 0);
}

TEST_CASE("group nesting") {
  GroupState g;
  CHECK_FALSE(g.inside());
  g.start();
  g.start();
  CHECK(g.depth() == 2);
  CHECK_FALSE(g.end());  // inner end: queued calls wait
  CHECK(g.inside());
  CHECK(g.end());        // outermost end: queued calls run now
  CHECK_FALSE(g.inside());
  CHECK_FALSE(g.unbalanced());
  CHECK_FALSE(g.end());
  CHECK(g.unbalanced());
  CHECK(g.depth() == 0);
}

TEST_CASE("fabric agreement: identical facts give identical decisions") {
  Config c;
  const uint64_t fp = config_fingerprint(c);
  RankFacts a;
  a.host_hash = 1;
  a.config_fingerprint = fp;
  a.version = 100;
  a.usable = 1;
  a.lanes_ok = 1;
  a.nvlink_local = 1;
  a.scratch_units = 2048;  // 512 KiB
  RankFacts b = a;
  b.process = 2;
  SUBCASE("one host, NVLink everywhere") {
    std::vector<RankFacts> v = {a, b};
    const Agreement g = agree(c, v);
    CHECK(g.fabric == Fabric::nvlink);
    CHECK(g.fp8_ok);
  }
  SUBCASE("emulated hosts (distinct NCCL_HOSTID) are net") {
    b.host_hash = 2;
    std::vector<RankFacts> v = {a, b, a};
    CHECK(agree(c, v).fabric == Fabric::net);
  }
  SUBCASE("P2P disabled on any rank, or no NVLink: pcie") {
    b.p2p_disabled = 1;
    std::vector<RankFacts> v = {a, b};
    CHECK(agree(c, v).fabric == Fabric::pcie);
    b.p2p_disabled = 0;
    b.nvlink_local = 0;
    v = {a, b};
    CHECK(agree(c, v).fabric == Fabric::pcie);
  }
  SUBCASE("override wins") {
    c.fabric_override = Fabric::pcie;
    b.host_hash = 3;
    std::vector<RankFacts> v = {a, b};
    CHECK(agree(c, v).fabric == Fabric::pcie);
  }
  SUBCASE("the scratch is the least any rank offers; none on one rank leaves messages FP8 and no collective") {
    std::vector<RankFacts> v = {a, b};
    CHECK(agree(c, v).scratch_bytes == 512 * 1024);
    b.scratch_units = 100;
    v = {a, b, a};
    v[2].process = 3;
    CHECK(agree(c, v).scratch_bytes == 100 * kScratchUnit);
    v[1].scratch_units = 0;
    const Agreement none = agree(c, v);
    CHECK(none.fp8_ok);
    CHECK(none.scratch_bytes == 0);
  }
  SUBCASE("lanes missing on one rank, or different configs: FP8 off everywhere") {
    b.lanes_ok = 0;
    std::vector<RankFacts> v = {a, b};
    const Agreement lanes = agree(c, v);
    CHECK_FALSE(lanes.fp8_ok);
    CHECK(lanes.reason == "rank 1 could not create its streams and events");
    b.lanes_ok = 1;
    Config other = c;
    other.thresholds[0][0] = 1;
    b.config_fingerprint = config_fingerprint(other);
    v = {a, b};
    const Agreement g = agree(c, v);
    CHECK_FALSE(g.fp8_ok);
    CHECK(std::string(g.reason).find("configuration") != std::string::npos);
  }
  SUBCASE("a rank that is not usable names itself and its reason on every rank") {
    b.usable = 0;
    set_problem(b, "configuration error: block_size");
    RankFacts a2 = a;
    a2.process = 3;
    std::vector<RankFacts> v = {a, a2, b};
    const Agreement g = agree(c, v);
    CHECK_FALSE(g.fp8_ok);
    CHECK(g.reason == "rank 2: configuration error: block_size");
  }
  SUBCASE("two ranks of one process (one thread drives both): FP8 off") {
    std::vector<RankFacts> v = {a, b, a};
    const Agreement g = agree(c, v);
    CHECK_FALSE(g.fp8_ok);
    CHECK(g.reason == "ranks 0 and 2 are driven by one process");
    v[2].host_hash = 5;  // the same pid on another host is another process
    CHECK(agree(c, v).fp8_ok);
  }
  SUBCASE("another library version: FP8 off") {
    b.version = 101;
    std::vector<RankFacts> v = {a, b};
    const Agreement g = agree(c, v);
    CHECK_FALSE(g.fp8_ok);
    CHECK(g.reason.find("version") != std::string::npos);
  }
  SUBCASE("the scratch caps differ between ranks: they agree on the least, not on FP8 off") {
    Config small = c;
    small.scratch_max_bytes = 1 << 20;
    small.scratch_process_max_bytes = 4 << 20;
    CHECK(config_fingerprint(small) == config_fingerprint(c));
  }
  SUBCASE("a problem longer than its field is cut, never unterminated") {
    set_problem(b, std::string(100, 'x').c_str());
    CHECK(std::string(b.problem).size() == sizeof(b.problem) - 1);
  }
  SUBCASE("fingerprint ignores logging, sees the wire format") {
    Config log = c;
    log.log_level = "debug";
    CHECK(config_fingerprint(log) == fp);
    Config e5 = c;
    e5.format = Fp8Format::e5m2;
    CHECK(config_fingerprint(e5) != fp);
    // One rank gathering by send/recv while its peers all-gather would hang: ruled out at agreement.
    Config sr = c;
    sr.gather_transport = GatherMethod::sendrecv;
    CHECK(config_fingerprint(sr) != fp);
    // Ranks cutting a direct call into different stages would wait on different flags.
    Config cut = c;
    cut.cost_model[static_cast<int>(Fabric::pcie)].direct_max_stages = 3;
    CHECK(config_fingerprint(cut) != fp);
    // The direct protocol is each rank's own choice: the same bytes in the same windows either way.
    Config protocol = c;
    protocol.direct_protocol = DirectProtocol::kernels;
    CHECK(config_fingerprint(protocol) == fp);
  }
}

namespace {
int g_begins = 0, g_ends = 0;
void on_begin(const CallRecord&) { ++g_begins; }
void on_end(const CallRecord&) { ++g_ends; }
}  // namespace

TEST_CASE("accounting ring, totals and hooks") {
  Accounting& acc = Accounting::instance();
  acc.reset();
  const uint64_t first = acc.next_seq();
  CallRecord r;
  r.seq = first;
  r.path = Path::two_shot;
  r.app_bytes = 1000;
  r.wire_bytes = 520;
  acc.record(r);
  r.seq = acc.next_seq();
  r.path = Path::passthrough;
  acc.record(r);
  const AccountingTotals t = acc.totals();
  CHECK(t.calls[static_cast<int>(Path::two_shot)] == 1);
  CHECK(t.wire_bytes[static_cast<int>(Path::two_shot)] == 520);
  CHECK(t.calls[static_cast<int>(Path::passthrough)] == 1);
  std::vector<CallRecord> out(8);
  CHECK(acc.snapshot(out.data(), out.size(), first - 1) == 2);
  CHECK(out[0].seq == first);
  CHECK(out[1].seq == first + 1);
  CHECK(acc.snapshot(out.data(), out.size(), first) == 1);
  CHECK(std::string(to_string(Path::one_shot)) == "one_shot");
  CHECK(std::string(to_string(CallKind::reduce_scatter)) == "reduce_scatter");

  SUBCASE("unread records overwritten by a full ring are counted as dropped") {
    acc.reset();
    for (size_t i = 0; i < Accounting::kCapacity + 10; ++i) {
      r.seq = acc.next_seq();
      acc.record(r);
    }
    CHECK(acc.totals().dropped_records == 10);
  }

  CHECK(call_hooks() == nullptr);
  static const CallHooks hooks{on_begin, on_end};
  set_call_hooks(&hooks);
  CHECK(call_hooks() == &hooks);
  set_call_hooks(nullptr);
  CHECK(call_hooks() == nullptr);
}

TEST_CASE("host map: hosts in order of first appearance, local ranks, uneven hosts") {
  auto facts = [](std::vector<uint64_t> hosts) {
    std::vector<RankFacts> v(hosts.size());
    for (size_t i = 0; i < hosts.size(); ++i) v[i].host_hash = hosts[i];
    return v;
  };
  HostMap m = host_map(facts({7, 7, 9, 9}));
  CHECK(m.hosts == 2);
  CHECK(m.host_of == std::vector<int>{0, 0, 1, 1});
  CHECK(m.local_rank == std::vector<int>{0, 1, 0, 1});
  CHECK(m.ranks_per_host() == 2);
  m = host_map(facts({9, 7, 9, 7, 9, 7}));  // interleaved: host 0 is the one rank 0 is on
  CHECK(m.host_of == std::vector<int>{0, 1, 0, 1, 0, 1});
  CHECK(m.local_rank == std::vector<int>{0, 0, 1, 1, 2, 2});
  CHECK(m.ranks_per_host() == 3);
  m = host_map(facts({1, 1, 1, 2}));
  CHECK(m.hosts == 2);
  CHECK(m.ranks_per_host() == 0);  // uneven
  CHECK(host_map(facts({5})).ranks_per_host() == 1);
}

TEST_CASE("below every threshold: no agreement needed") {
  Config c;  // net 256 KiB is the smallest default
  CHECK(below_every_threshold(c, ar(100 * 1024)));        // 200 KiB of bf16
  CHECK_FALSE(below_every_threshold(c, ar(128 * 1024)));  // 256 KiB: net would take it
  c.fabric_override = Fabric::nvlink;
  CHECK(below_every_threshold(c, ar(128 * 1024)));        // only nvlink's 256 MiB counts
  CHECK(below_every_threshold(c, ar(32 * MiB)));          // 64 MiB of bf16
  CHECK_FALSE(below_every_threshold(c, ar(128 * MiB)));   // 256 MiB
}

TEST_CASE("the transport per call: the direct transport where configured or cheaper, NCCL's otherwise") {
  Config c;
  const uint64_t big = 64 * MiB, small = 64 * 1024;
  using TK = Carrier;
  // No direct transport on the communicator: always NCCL's.
  for (Fabric f : {Fabric::nvlink, Fabric::pcie, Fabric::net})
    CHECK(carrier_for(c, Collective::all_reduce, Path::two_shot, big, 4, f, TK::nccl) == TK::nccl);
  // Paths it does not carry: the ring (a comparison), the hierarchical path, pass-through.
  for (Path p : {Path::ring, Path::hierarchical, Path::passthrough, Path::fallback})
    CHECK(carrier_for(c, Collective::all_reduce, p, big, 4, Fabric::pcie, TK::host_memory) == TK::nccl);
  // auto over PCIe (built-in host-memory figures, measured on one H200): the direct transport.
  CHECK(carrier_for(c, Collective::all_reduce, Path::two_shot, big, 4, Fabric::pcie, TK::host_memory) == TK::host_memory);
  CHECK(carrier_for(c, Collective::all_reduce, Path::one_shot, big, 2, Fabric::pcie, TK::peer_memory) == TK::peer_memory);
  CHECK(carrier_for(c, Collective::reduce_scatter, Path::two_shot, big, 8, Fabric::pcie, TK::host_memory) == TK::host_memory);
  // auto over NVLink: no measured figures, so NCCL's until a profile gives them.
  CHECK(carrier_for(c, Collective::all_reduce, Path::two_shot, big, 4, Fabric::nvlink, TK::peer_memory) == TK::nccl);
  c.cost_model[static_cast<int>(Fabric::nvlink)].direct_latency_us = 10;
  c.cost_model[static_cast<int>(Fabric::nvlink)].direct_bandwidth_gbps = 400;
  CHECK(carrier_for(c, Collective::all_reduce, Path::two_shot, big, 4, Fabric::nvlink, TK::peer_memory) == TK::peer_memory);
  // A slow measured direct link loses to NCCL's figures.
  c.cost_model[static_cast<int>(Fabric::nvlink)].direct_bandwidth_gbps = 1;
  CHECK(carrier_for(c, Collective::all_reduce, Path::two_shot, big, 4, Fabric::nvlink, TK::peer_memory) == TK::nccl);
  // Configured: taken for every path it carries, whatever the model says; off: never.
  c.direct_transport = DirectMode::host_memory;
  CHECK(carrier_for(c, Collective::all_reduce, Path::two_shot, small, 4, Fabric::net, TK::host_memory) == TK::host_memory);
  CHECK(carrier_for(c, Collective::all_gather, Path::one_shot, small, 4, Fabric::nvlink, TK::host_memory) == TK::host_memory);
  c.direct_transport = DirectMode::off;
  CHECK(carrier_for(c, Collective::all_reduce, Path::two_shot, big, 4, Fabric::pcie, TK::host_memory) == TK::nccl);
  // Unmeasured figures price it out of reach; host memory moves every slot, its own included.
  const CostModel pcie = default_cost_model(Fabric::pcie);
  const quant::WireFormat fmt = quant::WireFormat::from(Config{});
  CHECK(predicted_direct_us(default_cost_model(Fabric::nvlink), Collective::all_reduce, Path::two_shot, big, 4, fmt,
                            TK::peer_memory) >= 1e30);
  CHECK(predicted_direct_us(pcie, Collective::all_reduce, Path::one_shot, big, 4, fmt, TK::host_memory) >
        predicted_direct_us(pcie, Collective::all_reduce, Path::one_shot, big, 4, fmt, TK::peer_memory));
}

TEST_CASE("hierarchy guard: the fabric inside the hosts decides the default, and the reason says why") {
  Topology t;
  t.hosts = 2;
  t.ranks_per_host = t.max_ranks_per_host = 8;
  const CallShape call = ar(32 * MiB, 16);  // 64 MiB bf16
  Config c;
  // NVLink inside: the hierarchical path, as before.
  t.intra = Fabric::nvlink;
  CHECK(hierarchy_guard_reason(c, t).empty());
  CHECK(plan_on(c, call, Fabric::net, t, true).path == Path::hierarchical);
  // PCIe inside: plain NCCL, with the reason (also when the sub-communicators were never made).
  t.intra = Fabric::pcie;
  const std::string why = hierarchy_guard_reason(c, t);
  CHECK(why.find("pcie inside the hosts") != std::string::npos);
  CHECK(why.find("(`fp8wire bench model --hierarchy` (in a build tree: `build/bench/fp8wire-bench model "
                 "--hierarchy`) predicts it slower than NCCL at every card speed)") != std::string::npos);
  for (bool ready : {true, false}) {
    const Plan p = plan_on(c, call, Fabric::net, t, ready);
    CHECK(p.path == Path::passthrough);
    CHECK(p.reason == PassReason::hierarchy_guard);
    CHECK(std::string(to_string(p.reason)) == "hierarchy_guard");
  }
  // A forced algorithm, or a host map forced for testing, keeps the path.
  Config forced = c;
  forced.algorithm = Algorithm::two_shot;
  CHECK(hierarchy_guard_reason(forced, t).empty());
  CHECK(plan_on(forced, call, Fabric::net, t, true).path == Path::hierarchical);
  Topology mapped = t;
  mapped.forced = true;
  CHECK(plan_on(c, call, Fabric::net, mapped, true).path == Path::hierarchical);
  // A calibrated network profile decides by its own prediction instead.
  Config calibrated = c;
  calibrated.cost_model[static_cast<int>(Fabric::net)].calibrated = true;
  calibrated.cost_model[static_cast<int>(Fabric::net)].bus_bandwidth_gbps = 0.5;  // a slow network: FP8 pays
  CHECK(hierarchy_guard_reason(calibrated, t).empty());
  CHECK(plan_on(calibrated, call, Fabric::net, t, true).path == Path::hierarchical);
}

TEST_CASE("all-to-all: off by default, float dtypes only, thresholds on the whole send buffer, one exchange") {
  auto a2a = [](size_t count, int nranks, DataType dtype = DataType::bf16) {
    CallShape c = ar(count, nranks, dtype);
    c.collective = Collective::all_to_all;
    return c;
  };
  // Off by default: these calls carry activations, not only gradients.
  Config c;
  CHECK_FALSE(c.collective_enable[static_cast<int>(Collective::all_to_all)]);
  CHECK(static_eligibility(c, a2a(1 << 20, 4)) == PassReason::collective_disabled);
  CHECK(plan_call(c, a2a(1 << 20, 4), Fabric::net).reason == PassReason::collective_disabled);
  Config on;
  on.collective_enable[static_cast<int>(Collective::all_to_all)] = true;
  // No reduction: the op is meaningless (as for the all-gather); the dtype rules and the empty call hold.
  CallShape any_op = a2a(1 << 20, 4);
  any_op.op = ReduceOp::max;
  CHECK(static_eligibility(on, any_op) == PassReason::none);
  for (DataType t : {DataType::int8, DataType::uint8, DataType::int32, DataType::int64, DataType::f64,
                     DataType::f8e4m3, DataType::f8e5m2})
    CHECK(static_eligibility(on, a2a(1 << 20, 4, t)) == PassReason::dtype);
  CHECK(static_eligibility(on, a2a(0, 4)) == PassReason::empty);
  CHECK(static_eligibility(on, a2a(1 << 20, 1)) == PassReason::single_rank);
  // The threshold compares the whole send buffer (count per peer x ranks), as nccl-tests reports it.
  CHECK(threshold_bytes(a2a(1000, 4, DataType::f32)) == 4u * 1000 * 4);
  for (int k = 0; k < kFabricCount; ++k)
    CHECK(on.thresholds[static_cast<int>(Collective::all_to_all)][k] ==
          on.thresholds[static_cast<int>(Collective::reduce_scatter)][k]);
  CHECK(plan_call(on, a2a(256 * 1024, 4), Fabric::pcie).path == Path::one_shot);  // 2 MiB: the pcie default
  CHECK(plan_call(on, a2a(256 * 1024 - 1, 4), Fabric::pcie).reason == PassReason::below_threshold);
  CHECK(plan_call(on, a2a(256 * 1024, 4), Fabric::nvlink).reason == PassReason::below_threshold);
  // One FP8 algorithm, reported as one_shot whatever `algorithm` says; no gather step.
  for (Algorithm a : {Algorithm::two_shot, Algorithm::ring, Algorithm::one_shot}) {
    Config forced = on;
    forced.algorithm = a;
    CHECK(plan_call(forced, a2a(4 * MiB, 8), Fabric::net).path == Path::one_shot);
  }
  CHECK_FALSE(has_gather_step(Collective::all_to_all, Path::one_shot));
  CHECK(gather_method_for(on, Collective::all_to_all, Path::one_shot, 64 * MiB, 8, Fabric::net) ==
        GatherMethod::allgather);  // the value for "none", as the reduce-scatter's
}

TEST_CASE("all-to-all: the cost model's plain and FP8 rounds, the stages per chunk, its direct transport priced like the reduce-scatter's") {
  const quant::WireFormat fmt = quant::WireFormat::from(Config{});
  const CostModel net = default_cost_model(Fabric::net);
  // One grouped send/recv round either way (NcclOp::all_to_all's figures); FP8 moves ~0.52 of the bytes.
  CHECK(fixed_latency_us(net, Collective::all_to_all, Path::passthrough, 8) == net.latency_us(NcclOp::all_to_all));
  CHECK(fixed_latency_us(net, Collective::all_to_all, Path::one_shot, 8) == net.latency_us(NcclOp::all_to_all));
  const double plain = predicted_us(net, Collective::all_to_all, Path::passthrough, 64 * MiB, 8, fmt);
  const double fp8 = predicted_us(net, Collective::all_to_all, Path::one_shot, 64 * MiB, 8, fmt);
  CHECK(plain == doctest::Approx(net.latency_us(NcclOp::all_to_all) + 7.0 / 8 * 64 * MiB / (5.0 * 1e3)));
  CHECK(fp8 < 0.6 * plain);
  // Tiny calls: the launches cost more than the bytes saved.
  CHECK(predicted_us(net, Collective::all_to_all, Path::one_shot, 4096, 8, fmt) >
        predicted_us(net, Collective::all_to_all, Path::passthrough, 4096, 8, fmt));
  // A calibrated model may send an above-threshold call back to plain NCCL, as for the others.
  Config cal;
  cal.collective_enable.fill(true);
  for (auto& per : cal.thresholds) per.fill(0);
  cal.cost_model[static_cast<int>(Fabric::net)].calibrated = true;
  CallShape tiny = ar(64, 8);
  tiny.collective = Collective::all_to_all;
  CHECK(plan_call(cal, tiny, Fabric::net).reason == PassReason::cost_model);

  // Over the windows where direct.transport sets them up; the automatic choice by the same link
  // bytes as the reduce-scatter (one inbox slot per writer), a little less codec (the own chunk is
  // copied, never quantized). Messages never.
  Config direct;
  direct.direct_transport = DirectMode::host_memory;
  for (Carrier k : {Carrier::peer_memory, Carrier::host_memory}) {
    CHECK(carrier_for(direct, Collective::all_to_all, Path::one_shot, 64 * MiB, 4, Fabric::pcie, k) == k);
    CHECK(carrier_for(direct, Collective::send_recv, Path::one_shot, 64 * MiB, 4, Fabric::pcie, k) == Carrier::nccl);
  }
  const CostModel pcie = default_cost_model(Fabric::pcie);
  const double a2a_direct = predicted_direct_us(pcie, Collective::all_to_all, Path::one_shot, 64 * MiB, 4, fmt, Carrier::host_memory);
  const double rs_direct = predicted_direct_us(pcie, Collective::reduce_scatter, Path::two_shot, 64 * MiB, 4, fmt, Carrier::host_memory);
  CHECK(a2a_direct < 1e30);
  CHECK(direct_cost_parts(pcie, Collective::all_to_all, Path::one_shot, 64 * MiB, 4, fmt, Carrier::host_memory).link_bytes ==
        direct_cost_parts(pcie, Collective::reduce_scatter, Path::two_shot, 64 * MiB, 4, fmt, Carrier::host_memory).link_bytes);
  CHECK(a2a_direct == doctest::Approx(rs_direct).epsilon(0.05));
  CHECK(direct_set_bytes(Collective::all_to_all, Path::one_shot, 130, 4, fmt) == 4 * quant::chunk_bytes(130, fmt));

  // Stage arithmetic: a stage is the same element range of every peer's chunk, each slot that range
  // padded to whole blocks on its own, never across chunks: one slot sent and one received per peer.
  CHECK(stage_scratch_bytes(Collective::all_to_all, Path::one_shot, 130, 4, fmt) == 2 * 4 * quant::chunk_bytes(130, fmt));
  CHECK(quant::scales_bytes(130, fmt) == quant::scales_bytes(256, fmt));  // its own two blocks' scales
  CHECK(stage_unit_elems(Collective::all_to_all, Path::one_shot, 4, fmt) == fmt.block);
  CHECK(nccl_ops_per_stage(Collective::all_to_all, Path::one_shot, 4) == 1);
  // A call larger than the scratch is staged, every stage but the last whole blocks of each chunk;
  // one that fits is one stage.
  Config small;
  small.scratch_max_bytes = 64 << 10;
  const ScratchLayout sl = scratch_layout(small);
  const size_t count = 20000;  // per peer, bf16, 4 ranks: ~160 KiB of wire, more than the scratch
  const size_t stage = stage_elems(small, sl, Collective::all_to_all, Path::one_shot, count, 2, 4, fmt, Fabric::pcie);
  REQUIRE(stage > 0);
  CHECK(stage < count);
  CHECK(stage % fmt.block == 0);
  CHECK(stage_scratch_bytes(Collective::all_to_all, Path::one_shot, stage, 4, fmt) <= sl.set_bytes);
  CHECK(stage_elems(Config{}, scratch_layout(Config{}), Collective::all_to_all, Path::one_shot, count, 2, 4, fmt,
                    Fabric::pcie) == count);
}

TEST_CASE("all-to-all across hosts: planned flat at every shape (NCCL's own is flat too), never hierarchical") {
  Topology t;
  t.hosts = 2;
  t.ranks_per_host = t.max_ranks_per_host = 8;
  t.intra = Fabric::pcie;
  Config c;
  c.collective_enable[static_cast<int>(Collective::all_to_all)] = true;
  CallShape call = ar(1 * MiB, 16);  // 32 MiB of bf16 in the send buffer
  call.collective = Collective::all_to_all;
  for (bool ready : {true, false}) {
    CHECK(plan_on(c, call, Fabric::net, t, ready).path == Path::one_shot);
    t.intra = Fabric::nvlink;
    CHECK(plan_on(c, call, Fabric::net, t, ready).path == Path::one_shot);
    t.intra = Fabric::pcie;
  }
}
