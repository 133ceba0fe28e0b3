// The planner, calibrated through fp8wire-bench's own calibration from sweeps recorded on the
// emulated multi-host testbed (data/, copied from docs/results/2026-11-29/), must pick at every
// measured size a path whose measured time is within noise of the fastest measured path there
// (pass-through included). That testbed is where one latency per fabric failed: an all-reduce costs a
// fixed ~27 ms at 4 ranks but an all-gather ~11 ms, so the former model chose pass-through (1.51x
// slower) at 4 MiB where one-shot wins.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include <fmt/format.h>

#include "bench/host/profile.hpp"
#include "bench/host/results.hpp"
#include "common/config.hpp"
#include "sched/plan.hpp"

using namespace fp8wire;
using namespace fp8wire::bench;

namespace {
SweepResult load_sweep(const std::string& name) {
  const std::string path = std::string(BENCH_TEST_DATA_DIR) + "/" + name;
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  std::string error;
  auto sweep = sweep_from_json(nlohmann::json::parse(in), error);
  REQUIRE_MESSAGE(sweep.has_value(), path << ": " << error);
  return *sweep;
}

// The sweep's profile exactly as `fp8wire-bench sweep --profile` writes it, loaded by the shim's
// configuration parser.
Config profile_config(const SweepResult& sweep) {
  const auto reports = analyze_crossovers(sweep, CrossoverOptions{});
  const std::string toml = render_profile_toml({profile_from_sweep(sweep, reports, calibrate(sweep))});
  const ConfigResult loaded = parse_config_toml(toml, "calibrated profile");
  for (const auto& e : loaded.errors) MESSAGE(e.message());
  REQUIRE(loaded.ok());
  Config config = loaded.config;
  // The sweep ran FP8 on every collective it measured (all_gather is off by default).
  config.collective_enable.fill(true);
  return config;
}

const SweepPoint* find(const SweepResult& s, Collective c, Path p, uint64_t bytes) {
  for (const auto& pt : s.points)
    if (pt.collective == c && pt.dtype == DType::bf16 && pt.path == p && pt.bytes == bytes && pt.supported &&
        pt.time.median > 0)
      return &pt;
  return nullptr;
}

struct Verdict {
  int points = 0;
  int off = 0;                 // choices slower than the fastest by more than the tolerance
  double worst_ratio = 1.0;    // chosen / fastest, worst over the points
};

// Every measured size of collective c: the planner's choice against the fastest measured candidate.
// Tolerance: 5 %, or the measured noise of either point when larger (Summary::rel_noise).
Verdict check_choices(const SweepResult& s, const Config& config, Collective c, const char* label) {
  Verdict v;
  std::vector<uint64_t> sizes;
  for (const auto& pt : s.points)
    if (pt.collective == c && std::find(sizes.begin(), sizes.end(), pt.bytes) == sizes.end()) sizes.push_back(pt.bytes);
  std::sort(sizes.begin(), sizes.end());
  const int n = s.machine.nranks;
  for (uint64_t bytes : sizes) {
    const SweepPoint* best = nullptr;
    for (Path p : {Path::passthrough, Path::two_shot, Path::one_shot}) {
      const SweepPoint* pt = find(s, c, p, bytes);
      if (pt && (!best || pt->time.median < best->time.median)) best = pt;
    }
    REQUIRE(best != nullptr);
    sched::CallShape call;
    call.collective = c;
    call.dtype = ncclBfloat16;
    call.op = ncclSum;
    call.nranks = n;
    // bytes is the full buffer (nccl-tests size); count is what the application passes.
    call.count = c == Collective::all_reduce ? bytes / 2 : bytes / 2 / static_cast<uint64_t>(n);
    const sched::Plan plan = sched::plan_call(config, call, Fabric::net);
    const SweepPoint* chosen = find(s, c, plan.path, bytes);
    REQUIRE_MESSAGE(chosen != nullptr, "planner chose an unmeasured path " << std::string(path_name(plan.path)));
    const double ratio = chosen->time.median / best->time.median;
    const double tolerance = std::max({0.05, chosen->time.rel_noise(), best->time.rel_noise()});
    const bool ok = ratio <= 1.0 + tolerance;
    MESSAGE(fmt::format("{} {} ranks {} {}: chose {} ({}) {:.2f}x of fastest {} (tolerance {:.0f} %){}", label, n,
                        collective_name(c), format_bytes(bytes), path_name(plan.path), sched::to_string(plan.reason),
                        ratio, path_name(best->path), 100 * tolerance, ok ? "" : "  <-- OFF"));
    ++v.points;
    v.off += ok ? 0 : 1;
    v.worst_ratio = std::max(v.worst_ratio, ratio);
  }
  return v;
}

Config without_thresholds(Config c) {
  for (auto& per : c.thresholds) per.fill(0);
  return c;
}
}  // namespace

TEST_CASE("calibration fits one latency per NCCL operation from the recorded sweeps") {
  const SweepResult ar4 = load_sweep("allreduce_4ranks.json");
  const CostModel m4 = calibrate(ar4).model;
  REQUIRE(m4.calibrated);
  // 4 ranks: an all-reduce's fixed cost is well above an all-gather's (the one-shot points).
  CHECK(m4.allreduce_latency_us > 0);
  CHECK(m4.allgather_latency_us > 0);
  CHECK(m4.alltoall_latency_us > 0);
  CHECK(m4.allgather_latency_us < m4.allreduce_latency_us);
  CHECK(m4.reduce_scatter_latency_us == 0);  // not measured: falls back to op_latency_us
  CHECK(m4.latency_us(NcclOp::reduce_scatter) == m4.op_latency_us);

  const CostModel m2 = calibrate(load_sweep("rs_ag_2ranks.json")).model;
  CHECK(m2.reduce_scatter_latency_us > 0);
  CHECK(m2.allgather_latency_us > 0);
  CHECK(m2.alltoall_latency_us > 0);  // from the FP8 reduce-scatter (one grouped send/recv)
  CHECK(m2.allreduce_latency_us == 0);

  // The profile carries them, and the shim's parser reads them back.
  const Config c = profile_config(ar4);
  const CostModel& loaded = c.cost_model[static_cast<int>(Fabric::net)];
  CHECK(loaded.calibrated);
  CHECK(loaded.allgather_latency_us == doctest::Approx(m4.allgather_latency_us).epsilon(1e-3));
  CHECK(loaded.allgather_bandwidth_gbps == doctest::Approx(m4.allgather_bandwidth_gbps).epsilon(1e-3));
  CHECK(loaded.alltoall_latency_us == doctest::Approx(m4.alltoall_latency_us).epsilon(1e-3));
}

TEST_CASE("calibrated planner picks within noise of the fastest measured path at every measured size") {
  struct Case {
    const char* file;
    Collective collective;
  };
  const Case cases[] = {{"allreduce_4ranks.json", Collective::all_reduce},
                        {"allreduce_2ranks.json", Collective::all_reduce},
                        {"rs_ag_2ranks.json", Collective::reduce_scatter},
                        {"rs_ag_2ranks.json", Collective::all_gather}};
  for (const auto& k : cases) {
    CAPTURE(k.file);
    const SweepResult s = load_sweep(k.file);
    // The profile as written: measured thresholds plus the per-operation cost model.
    const Verdict profile = check_choices(s, profile_config(s), k.collective, "profile");
    CHECK(profile.points >= 4);
    CHECK(profile.off == 0);
  }
}

TEST_CASE("the calibrated cost model alone (no thresholds) chooses the right all-reduce algorithm") {
  // The decision the single latency got wrong: at 4 ranks one-shot (one all-gather) beats both
  // two-shot (a2a + all-gather) and plain NCCL at 4 MiB, and loses 0.60-0.86x at 16-256 MiB.
  for (const char* file : {"allreduce_4ranks.json", "allreduce_2ranks.json"}) {
    CAPTURE(file);
    const SweepResult s = load_sweep(file);
    const Verdict v = check_choices(s, without_thresholds(profile_config(s)), Collective::all_reduce, "model only");
    CHECK(v.off == 0);
  }
  // The former model (the same profile without its per-operation figures) gets 4 ranks wrong.
  {
    const SweepResult s = load_sweep("allreduce_4ranks.json");
    Config former = without_thresholds(profile_config(s));
    CostModel& m = former.cost_model[static_cast<int>(Fabric::net)];
    m.allreduce_latency_us = m.allgather_latency_us = m.reduce_scatter_latency_us = m.alltoall_latency_us = 0;
    m.allreduce_bandwidth_gbps = m.allgather_bandwidth_gbps = m.reduce_scatter_bandwidth_gbps = 0;
    m.alltoall_bandwidth_gbps = 0;
    const Verdict v = check_choices(s, former, Collective::all_reduce, "former model");
    CHECK(v.off >= 1);
    CHECK(v.worst_ratio > 1.4);  // 4 MiB: not one-shot, ~1.5x slower
  }
  // Reduce-scatter too; all-gather is the one exception: on this testbed plain all-gather at 4 MiB
  // is faster than at 64 KiB (3.7 vs 4.5 ms), which no latency + bytes / bandwidth line reproduces,
  // so the model alone picks FP8 there (1.09x); the measured threshold (64 MiB) keeps it plain.
  const SweepResult rs = load_sweep("rs_ag_2ranks.json");
  CHECK(check_choices(rs, without_thresholds(profile_config(rs)), Collective::reduce_scatter, "model only").off == 0);
}

TEST_CASE("uncalibrated defaults keep their decisions where the measurements proved them right") {
  // Built-in "net" figures (one latency for every operation): two-shot at 4 ranks from 16 MiB up,
  // one-shot at 2 ranks, as before the per-operation model.
  const Config defaults;
  const SweepResult ar4 = load_sweep("allreduce_4ranks.json");
  for (uint64_t bytes : {16ull << 20, 64ull << 20, 256ull << 20}) {
    sched::CallShape call;
    call.dtype = ncclBfloat16;
    call.nranks = 4;
    call.count = bytes / 2;
    CHECK(sched::plan_call(defaults, call, Fabric::net).path == Path::two_shot);
    const SweepPoint* two = find(ar4, Collective::all_reduce, Path::two_shot, bytes);
    const SweepPoint* one = find(ar4, Collective::all_reduce, Path::one_shot, bytes);
    REQUIRE((two && one));
    CHECK(two->time.median < one->time.median);
  }
  for (uint64_t bytes : {1ull << 20, 4ull << 20, 64ull << 20, 256ull << 20}) {
    sched::CallShape call;
    call.dtype = ncclBfloat16;
    call.nranks = 2;
    call.count = bytes / 2;
    CHECK(sched::plan_call(defaults, call, Fabric::net).path == Path::one_shot);
  }
}
