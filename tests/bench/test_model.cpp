#include <doctest/doctest.h>

#include <cmath>

#include "bench/host/hierarchy_model.hpp"
#include "bench/host/model.hpp"
#include "sched/plan/hierarchy.hpp"

using namespace fp8wire;
using namespace fp8wire::bench;

TEST_CASE("relative least squares recovers alpha and beta") {
  std::vector<double> x, t;
  for (double s = 4096; s <= (1 << 30); s *= 2) {
    x.push_back(s);
    t.push_back(25.0 + s / 20e3);  // 25 us + 20 GB/s
  }
  const LinearFit f = fit_linear_relative(x, t);
  REQUIRE(f.ok);
  CHECK(f.alpha_us == doctest::Approx(25.0).epsilon(1e-6));
  CHECK(1e-3 / f.us_per_byte == doctest::Approx(20.0).epsilon(1e-6));
  CHECK(f.max_rel_residual < 1e-9);
}

TEST_CASE("fit: too few points, or a latency-only curve, is not ok; never negative") {
  CHECK_FALSE(fit_linear_relative({1}, {1}).ok);
  const LinearFit flat = fit_linear_relative({1, 2, 3}, {10, 10, 10});
  CHECK_FALSE(flat.ok);
  CHECK(flat.alpha_us == doctest::Approx(10));
  // Noise that tilts the intercept below zero is clamped, not reported as a negative latency.
  const LinearFit f = fit_linear_relative({1000, 2000, 4000}, {0.9, 2.1, 4.0});
  CHECK(f.alpha_us >= 0);
  CHECK(f.us_per_byte > 0);
}

TEST_CASE("wire ratio: 132 bytes per 128 bf16 elements") {
  WireParams w{DType::bf16, 128, 4};
  CHECK(w.ratio() == doctest::Approx(132.0 / 256.0));
  w.dtype = DType::f32;
  CHECK(w.ratio() == doctest::Approx(132.0 / 512.0));
  w = {DType::bf16, 32, 1};
  CHECK(w.ratio() == doctest::Approx(33.0 / 64.0));
}

TEST_CASE("predicted times follow the documented path shapes") {
  const Link link{"test", 10.0, 100.0, "", false};  // 100 GB/s = 1e5 bytes/us
  const Codec codec{1000.0, 2.0, ""};               // 1e6 bytes/us
  const WireParams wire{DType::bf16, 128, 4};
  const double S = 1e8;
  // Baseline all-reduce on 4 ranks: 10 + 2*3/4 * 1e8 / 1e5 = 10 + 1500.
  CHECK(predict_us(Collective::all_reduce, Path::passthrough, 4, S, link, codec, wire) == doctest::Approx(1510));
  // two_shot: 2 ops + 1500 * r + 3 codec passes (3e8 / 1e6 = 300) + 3 launches.
  const double r = wire.ratio();
  CHECK(predict_us(Collective::all_reduce, Path::two_shot, 4, S, link, codec, wire) ==
        doctest::Approx(20 + 1500 * r + 300 + 6));
  // one_shot: 1 op + (n-1) S r / B + (1+n) S / C + 2 launches.
  CHECK(predict_us(Collective::all_reduce, Path::one_shot, 4, S, link, codec, wire) ==
        doctest::Approx(10 + 3000 * r + 500 + 4));
  // all_gather: 1 op + 3/4 S r / B + (1/4 + 1) S / C + 2 launches.
  CHECK(predict_us(Collective::all_gather, Path::two_shot, 4, S, link, codec, wire) ==
        doctest::Approx(10 + 750 * r + 125 + 4));
  CHECK(std::isnan(predict_us(Collective::all_gather, Path::ring, 4, S, link, codec, wire)));
  // all_to_all: one grouped send/recv round either way (3/4 S bus bytes), FP8 with (2 * 3/4 + 1/4) S
  // through the codec and 5 launches, as sched/plan/cost_model.cpp prices it.
  CHECK(predict_us(Collective::all_to_all, Path::passthrough, 4, S, link, codec, wire) == doctest::Approx(10 + 750));
  CHECK(predict_us(Collective::all_to_all, Path::one_shot, 4, S, link, codec, wire) ==
        doctest::Approx(10 + 750 * r + 175 + 10));
  CHECK(std::isnan(predict_us(Collective::all_to_all, Path::two_shot, 4, S, link, codec, wire)));
}

TEST_CASE("closed-form crossover is where predicted times cross") {
  const Link link{"pcie", 12.0, 20.0, "", false};
  const Codec codec{1500.0, 3.0, ""};
  const WireParams wire{DType::bf16, 128, 4};
  for (Collective c : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather}) {
    const PredictedCrossover p = predict_crossover(c, Path::two_shot, 8, link, codec, wire);
    REQUIRE(p.wins);
    REQUIRE(p.bytes > 0);
    const double below = static_cast<double>(p.bytes) * 0.99, at = static_cast<double>(p.bytes);
    CHECK(predict_us(c, Path::two_shot, 8, at, link, codec, wire) <
          predict_us(c, Path::passthrough, 8, at, link, codec, wire));
    CHECK(predict_us(c, Path::two_shot, 8, below, link, codec, wire) >=
          predict_us(c, Path::passthrough, 8, below, link, codec, wire));
    CHECK(p.asymptotic_speedup > 1.0);
  }
  // A link far faster than the codec: FP8 never pays.
  const Link fast{"fast", 1.0, 5000.0, "", false};
  CHECK_FALSE(predict_crossover(Collective::all_reduce, Path::two_shot, 8, fast, codec, wire).wins);
  // A free codec and equal latency on a slow link: cheaper at every size for reduce_scatter.
  const Codec free_codec{1e12, 0.0, ""};
  const PredictedCrossover always = predict_crossover(Collective::reduce_scatter, Path::two_shot, 8, link, free_codec, wire);
  CHECK(always.wins);
  CHECK(always.bytes == 0);
}

TEST_CASE("assumed links are labelled and plausible") {
  REQUIRE(assumed_links().size() >= 6);
  for (const auto& l : assumed_links()) {
    CHECK_FALSE(l.measured);
    CHECK(l.alpha_us > 0);
    CHECK(l.bus_gbps > 0);
    CHECK_FALSE(l.basis.empty());
  }
}

TEST_CASE("sendrecv gather transport: the gather step moves from all_gather to all_to_all, same bus bytes") {
  const int n = 4;
  const double part = 3.0 / 4.0;
  struct Case {
    Collective c;
    Path p;
    double gather_bus;  // bus bytes per byte of S of the gather step
  };
  const Case gathered[] = {{Collective::all_reduce, Path::two_shot, part},
                           {Collective::all_reduce, Path::one_shot, n - 1.0},
                           {Collective::all_reduce, Path::ring, part},
                           {Collective::all_gather, Path::one_shot, part}};
  for (const auto& k : gathered) {
    CAPTURE(path_name(k.p));
    CAPTURE(collective_name(k.c));
    const auto ag = path_shape(k.c, k.p, n);
    const auto sr = path_shape(k.c, k.p, n, GatherMethod::sendrecv);
    REQUIRE((ag && sr));
    CHECK(ag->ops.all_gather == 1);
    CHECK(sr->ops.all_gather == 0);
    CHECK(sr->ops.all_to_all == ag->ops.all_to_all + 1);
    CHECK(sr->op_bus.all_gather == 0);
    CHECK(ag->op_bus.all_gather == doctest::Approx(k.gather_bus));
    CHECK(sr->op_bus.all_to_all == doctest::Approx(ag->op_bus.all_to_all + k.gather_bus));
    CHECK(sr->bus_bytes_per_s == doctest::Approx(ag->bus_bytes_per_s));
    CHECK(sr->codec_bytes_per_s == ag->codec_bytes_per_s);
    CHECK(sr->launches == ag->launches);
    // automatic is the planner's choice per call, not a shape.
    CHECK_FALSE(path_shape(k.c, k.p, n, GatherMethod::automatic));
  }
  // No gather step: plain NCCL and the FP8 reduce-scatter are the same under any transport.
  for (const auto& [c, p] : {std::pair{Collective::reduce_scatter, Path::two_shot},
                             std::pair{Collective::all_reduce, Path::passthrough},
                             std::pair{Collective::all_gather, Path::passthrough}})
    for (GatherMethod g : {GatherMethod::automatic, GatherMethod::sendrecv}) {
      const auto base = path_shape(c, p, n);
      const auto other = path_shape(c, p, n, g);
      REQUIRE((base && other));
      for (NcclOp op : kNcclOps) {
        CHECK(other->ops.of(op) == base->ops.of(op));
        CHECK(other->op_bus.of(op) == base->op_bus.of(op));
      }
    }
}

TEST_CASE("sendrecv gather transport: predicted times use the all_to_all figures for the gather step") {
  Link link{"test", 10.0, 100.0, "", false};
  link.allgather_us = 1000;   // 1 ms per all-gather at 10 GB/s
  link.allgather_gbps = 10;
  link.alltoall_us = 400;     // 0.4 ms per grouped send/recv at 50 GB/s
  link.alltoall_gbps = 50;
  link.allreduce_gbps = 1;    // plain all-reduce slow enough for FP8 to win
  const Codec codec{1000.0, 2.0, ""};
  const WireParams wire{DType::bf16, 128, 4};
  const double r = wire.ratio(), S = 1e8;
  // one_shot, 4 ranks: (n-1) S r bus bytes, codec (1+n) S, 2 launches.
  const double codec_us = 5 * S / 1e6 + 4;
  CHECK(predict_us(Collective::all_reduce, Path::one_shot, 4, S, link, codec, wire) ==
        doctest::Approx(1000 + 3 * S * r / 1e4 + codec_us));
  CHECK(predict_us(Collective::all_reduce, Path::one_shot, 4, S, link, codec, wire, GatherMethod::sendrecv) ==
        doctest::Approx(400 + 3 * S * r / 5e4 + codec_us));
  // two_shot: the a2a was already there; the gather step becomes a second one.
  const double two_codec_us = 3 * S / 1e6 + 6;
  CHECK(predict_us(Collective::all_reduce, Path::two_shot, 4, S, link, codec, wire) ==
        doctest::Approx(400 + 1000 + 0.75 * S * r / 5e4 + 0.75 * S * r / 1e4 + two_codec_us));
  CHECK(predict_us(Collective::all_reduce, Path::two_shot, 4, S, link, codec, wire, GatherMethod::sendrecv) ==
        doctest::Approx(2 * 400 + 1.5 * S * r / 5e4 + two_codec_us));
  // Reduce-scatter has no gather step: unchanged.
  CHECK(predict_us(Collective::reduce_scatter, Path::two_shot, 4, S, link, codec, wire, GatherMethod::sendrecv) ==
        doctest::Approx(predict_us(Collective::reduce_scatter, Path::two_shot, 4, S, link, codec, wire)));
  CHECK(std::isnan(predict_us(Collective::all_gather, Path::one_shot, 4, S, link, codec, wire, GatherMethod::automatic)));
  // The faster send/recv figures move the crossover down.
  const auto ag = predict_crossover(Collective::all_reduce, Path::one_shot, 4, link, codec, wire);
  const auto sr = predict_crossover(Collective::all_reduce, Path::one_shot, 4, link, codec, wire, GatherMethod::sendrecv);
  REQUIRE((ag.wins && sr.wins));
  CHECK(sr.bytes < ag.bytes);
}

TEST_CASE("predictions for jobs spanning hosts: where the hierarchical path pays and where it does not") {
  using fp8wire::bench::HierarchyCase;
  using fp8wire::bench::predict_hierarchy;
  // 2 hosts x 8 H200s, NVLink inside, 25 Gb/s cards: the network is the bottleneck; the hierarchical
  // path sends 3.6x fewer bytes per card and wins from small sizes; flat FP8 loses (it sends 2.2x more).
  const auto slow = predict_hierarchy(HierarchyCase{2, 8, 25, fp8wire::Fabric::nvlink});
  CHECK(slow.card_bytes_ratio == doctest::Approx(3.6).epsilon(0.02));
  CHECK(slow.plain_us_64m / slow.hier_us_64m > 2.0);
  CHECK(slow.plain_us_64m / slow.flat_us_64m < 1.0);
  CHECK(slow.crossover_bytes > 0);
  CHECK(slow.crossover_bytes <= 4 << 20);
  // 400 Gb/s cards: inside-host phases in full precision cost more than the network saves.
  const auto fast = predict_hierarchy(HierarchyCase{2, 8, 400, fp8wire::Fabric::nvlink});
  CHECK(fast.plain_us_64m / fast.hier_us_64m < 1.0);
  CHECK(fast.crossover_bytes == 0);
  // The table covers 2-64 hosts, four card speeds, NVLink and PCIe inside.
  CHECK(fp8wire::bench::hierarchy_table().size() == 2u * 4 * 6);
}

TEST_CASE("the planner's defaults never take the hierarchical path where this model predicts it slower inside PCIe hosts") {
  // Every PCIe row of the table (2-64 hosts, 25-400 Gb/s cards) predicts the hierarchical path slower
  // than NCCL's ring, at 64 MiB and 1 GiB; the planner, uncalibrated, must then pass through.
  int pcie_rows = 0;
  for (const HierarchyPrediction& r : hierarchy_table()) {
    if (r.c.intra != Fabric::pcie) continue;
    ++pcie_rows;
    CAPTURE(r.c.hosts);
    CAPTURE(r.c.nic_gbit);
    CHECK(r.plain_us_64m / r.hier_us_64m < 1.0);
    CHECK(r.plain_us_1g / r.hier_us_1g < 1.0);
    sched::Topology t;
    t.hosts = r.c.hosts;
    t.ranks_per_host = t.max_ranks_per_host = r.c.gpus_per_host;
    t.intra = Fabric::pcie;
    sched::CallShape call;
    call.collective = Collective::all_reduce;
    call.dtype = DataType::bf16;
    call.count = 32u << 20;  // 64 MiB
    call.nranks = r.c.hosts * r.c.gpus_per_host;
    CHECK(!sched::hierarchy_guard_reason(Config{}, t).empty());
    // 32 and 64 hosts x 8 exceed the ranks one fused reduce takes: they pass through for that first.
    const sched::Plan p = sched::plan_on(Config{}, call, Fabric::net, t, /*hierarchy_ready=*/true);
    CHECK(p.path == Path::passthrough);
    CHECK((p.reason == sched::PassReason::hierarchy_guard || p.reason == sched::PassReason::too_many_ranks));
  }
  CHECK(pcie_rows == 4 * 6);
}
