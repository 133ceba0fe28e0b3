// CPU tier of the exposure profiler: interval arithmetic, classification, the step partition,
// per-collective attribution, the collector's bounded memory, report round trips and merging, and
// Kineto trace parsing on small traces built here.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "profiler/classify.hpp"
#include "profiler/event_ring.hpp"
#include "profiler/exposure.hpp"
#include "profiler/intervals.hpp"
#include "profiler/kineto.hpp"
#include "profiler/report.hpp"

using namespace fp8wire::prof;
using nlohmann::json;

namespace {
constexpr int64_t kMs = 1'000'000;

// Brute-force measure on a 1-ns grid: the reference the set operations must agree with.
std::vector<bool> rasterize(const std::vector<Interval>& parts, int64_t horizon) {
  std::vector<bool> on(static_cast<size_t>(horizon), false);
  for (const Interval& i : parts)
    for (int64_t t = std::max<int64_t>(i.begin, 0); t < std::min(i.end, horizon); ++t) on[static_cast<size_t>(t)] = true;
  return on;
}
int64_t count(const std::vector<bool>& v) { return std::count(v.begin(), v.end(), true); }

Activity kernel(int64_t begin_ms, int64_t end_ms, ActivityClass cls, uint32_t name = kNoName, uint64_t seq = 0) {
  return Activity{{begin_ms * kMs, end_ms * kMs}, cls, name, kNoName, seq};
}
}  // namespace

TEST_CASE("interval set: union merges overlapping and touching parts, drops empty ones") {
  const std::vector<Interval> in = {{5, 7}, {1, 3}, {2, 4}, {7, 9}, {12, 12}, {10, 11}, {20, 15}};
  const IntervalSet s = IntervalSet::from(std::span<const Interval>(in));
  CHECK(s.intervals() == std::vector<Interval>{{1, 4}, {5, 9}, {10, 11}});
  CHECK(s.measure() == 3 + 4 + 1);
}

TEST_CASE("interval set: minus, intersect, unite, clip, covered length agree with a brute-force raster") {
  std::mt19937 rng(1234);
  constexpr int64_t horizon = 400;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<Interval> a, b;
    std::uniform_int_distribution<int64_t> pos(0, horizon - 1), len(0, 40);
    for (int i = 0, n = static_cast<int>(rng() % 12); i < n; ++i) { const int64_t p = pos(rng); a.push_back({p, p + len(rng)}); }
    for (int i = 0, n = static_cast<int>(rng() % 12); i < n; ++i) { const int64_t p = pos(rng); b.push_back({p, p + len(rng)}); }
    const IntervalSet sa = IntervalSet::from(std::span<const Interval>(a));
    const IntervalSet sb = IntervalSet::from(std::span<const Interval>(b));
    const auto ra = rasterize(a, horizon + 50), rb = rasterize(b, horizon + 50);
    std::vector<bool> minus(ra.size()), inter(ra.size()), uni(ra.size());
    for (size_t t = 0; t < ra.size(); ++t) {
      minus[t] = ra[t] && !rb[t];
      inter[t] = ra[t] && rb[t];
      uni[t] = ra[t] || rb[t];
    }
    REQUIRE(sa.minus(sb).measure() == count(minus));
    REQUIRE(sa.intersect(sb).measure() == count(inter));
    REQUIRE(sa.unite(sb).measure() == count(uni));
    // Results come out normalized: equal to rebuilding them from scratch.
    REQUIRE(sa.minus(sb) == IntervalSet::from(std::span<const Interval>(sa.minus(sb).intervals())));
    REQUIRE(sa.intersect(sb) == IntervalSet::from(std::span<const Interval>(sa.intersect(sb).intervals())));
    const int64_t wb = pos(rng);
    const Interval w{wb, wb + 60};
    std::vector<bool> clipped(ra.size());
    for (size_t t = 0; t < ra.size(); ++t) clipped[t] = ra[t] && int64_t(t) >= w.begin && int64_t(t) < w.end;
    REQUIRE(sa.clip(w).measure() == count(clipped));
    REQUIRE(sa.covered_length(w) == count(clipped));
    REQUIRE(sa.uncovered_length(w) == w.length() - count(clipped));
  }
}

TEST_CASE("classification: nccl anywhere (any case), fp8wire codec kernels, extra patterns") {
  const KernelClassifier c("cross_device_reduce|  |MyAllReduce");
  CHECK(c.classify_kernel("ncclKernel_AllReduce_RING_LL_Sum_float") == ActivityClass::communication);
  CHECK(c.classify_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == ActivityClass::communication);
  CHECK(c.classify_kernel("void NCCLdevice_thing<1>()") == ActivityClass::communication);
  CHECK(c.classify_kernel("void fp8wire::quant::(anonymous namespace)::quantize_kernel<__nv_bfloat16>(...)") ==
        ActivityClass::communication);
  CHECK(c.classify_kernel("_ZN7fp8wire5quant15quantize_kernelEv") == ActivityClass::communication);
  CHECK(c.classify_kernel("void vllm::cross_device_reduce_1stage<float, 2>") == ActivityClass::communication);
  CHECK(c.classify_kernel("myallreduce_kernel") == ActivityClass::communication);
  CHECK(c.classify_kernel("ampere_bf16_s16816gemm_bf16_128x128") == ActivityClass::compute);
  CHECK(c.classify_kernel("") == ActivityClass::compute);
  CHECK(c.patterns().size() == 4);  // nccl, fp8wire, cross_device_reduce, myallreduce
  CHECK(nccl_collective_of("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "ReduceScatter");
  CHECK(nccl_collective_of("ncclKernel_AllGather_RING_LL_Sum_int8_t") == "AllGather");
  CHECK(nccl_collective_of("gemm_kernel") == "");
}

TEST_CASE("step partition: compute, exposed comm, exposed memcpy and idle add up to the step") {
  // Window 0..100 ms. Compute 10..50; comm 40..70 (10 ms hidden, 20 exposed); memcpy 60..80
  // (comm covers 60..70, so 10 ms exposed); a comm kernel 95..110 straddles the window end.
  NameTable names;
  const uint32_t ar = names.intern("ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  const std::vector<Activity> acts = {
      kernel(10, 50, ActivityClass::compute), kernel(40, 70, ActivityClass::communication, ar),
      kernel(60, 80, ActivityClass::memory), kernel(95, 110, ActivityClass::communication, ar),
      kernel(-20, -10, ActivityClass::compute) /* outside */};
  StepInput in;
  in.window = {7, {0, 100 * kMs}};
  in.activities = acts;
  in.names = &names;
  StepTimeline tl;
  const StepReport r = compute_step(in, &tl);
  CHECK(r.step == 7);
  CHECK(r.step_ms == doctest::Approx(100));
  CHECK(r.compute_ms == doctest::Approx(40));
  CHECK(r.comm_ms == doctest::Approx(35));
  CHECK(r.exposed_comm_ms == doctest::Approx(25));
  CHECK(r.exposed_memcpy_ms == doctest::Approx(10));
  CHECK(r.idle_ms == doctest::Approx(25));
  CHECK(r.compute_ms + r.exposed_comm_ms + r.exposed_memcpy_ms + r.idle_ms == doctest::Approx(r.step_ms));
  CHECK(r.overlap_pct == doctest::Approx(100.0 * 10 / 35));
  CHECK(r.compute_kernels == 1);
  CHECK(r.comm_kernels == 2);
  CHECK(r.calls == 2);
  REQUIRE(r.top.size() == 2);
  CHECK(r.top[0].exposed_ms == doctest::Approx(20));
  CHECK(r.top[0].name == "AllReduce");
  CHECK(r.top[1].exposed_ms == doctest::Approx(5));  // clipped to the window
  CHECK(tl.exposed_comm.measure() == 25 * kMs);
}

TEST_CASE("step partition holds on random activity") {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<Activity> acts;
    for (int i = 0; i < 30; ++i) {
      const int64_t b = static_cast<int64_t>(rng() % 1000) * 1000;
      acts.push_back({{b, b + static_cast<int64_t>(rng() % 200) * 1000}, static_cast<ActivityClass>(rng() % 3)});
    }
    StepInput in;
    in.window = {0, {100'000, 900'000}};
    in.activities = acts;
    const StepReport r = compute_step(in);
    REQUIRE(r.compute_ms + r.exposed_comm_ms + r.exposed_memcpy_ms + r.idle_ms == doctest::Approx(r.step_ms));
    REQUIRE(r.idle_ms >= -1e-9);
    REQUIRE(r.overlap_pct >= 0);
    REQUIRE(r.overlap_pct <= 100.0 + 1e-9);
  }
}

TEST_CASE("per-collective attribution: shim calls group their kernels and carry size, dtype, path, range") {
  NameTable names;
  const uint32_t q = names.intern("void fp8wire::quant::quantize_kernel<bf16>");
  const uint32_t nccl = names.intern("ncclDevKernel_SendRecv");
  const uint32_t range = names.intern("backward/layer3");
  // Call 5: quantize 10..12, send/recv 12..30 under compute; call 6 (after compute): 60..75, exposed.
  std::vector<Activity> acts = {kernel(0, 50, ActivityClass::compute), kernel(10, 12, ActivityClass::communication, q, 5),
                                kernel(12, 30, ActivityClass::communication, nccl, 5),
                                kernel(60, 75, ActivityClass::communication, nccl, 6)};
  // Caller bytes, wire bytes, and what NCCL's ring would send at 4 ranks (2(N-1)/N of the buffer).
  std::vector<CallInfo> calls(2);
  calls[0] = {5, 9 * kMs, names.intern("all_reduce"), names.intern("bf16"), names.intern("two_shot"), range,
              4 << 20, 2 << 20, 6 << 20, 1};
  calls[1] = {6, 55 * kMs, names.intern("all_reduce"), names.intern("bf16"), names.intern("two_shot"), kNoName,
              64 << 20, 33 << 20, 96 << 20, 3};
  StepInput in;
  in.window = {1, {0, 100 * kMs}};
  in.activities = acts;
  in.calls = calls;
  in.names = &names;
  in.top_n = 1;
  const StepReport r = compute_step(in);
  CHECK(r.calls == 2);
  CHECK(r.app_bytes == (4u << 20) + (64u << 20));
  CHECK(r.wire_bytes == (2u << 20) + (33u << 20));
  CHECK(r.plain_wire_bytes == (6u << 20) + (96u << 20));
  REQUIRE(r.top.size() == 1);  // top_n
  const CollectiveReport& c = r.top[0];
  CHECK(c.seq == 6);
  CHECK(c.ordinal == 1);
  CHECK(c.exposed_ms == doctest::Approx(15));
  CHECK(c.name == "all_reduce");
  CHECK(c.dtype == "bf16");
  CHECK(c.path == "two_shot");
  CHECK(c.app_bytes == 64u << 20);
  CHECK(c.wire_bytes == 33u << 20);
  CHECK(c.plain_wire_bytes == 96u << 20);
  in.top_n = 10;
  const StepReport all = compute_step(in);
  REQUIRE(all.top.size() == 2);
  CHECK(all.top[1].seq == 5);
  CHECK(all.top[1].kernels == 2);
  CHECK(all.top[1].duration_ms == doctest::Approx(20));
  CHECK(all.top[1].exposed_ms == doctest::Approx(0));
  CHECK(all.top[1].range == "backward/layer3");
  CHECK(all.top[1].kernel == "void fp8wire::quant::quantize_kernel<bf16>");
}

TEST_CASE("collector: steps are reported once they have settled; memory stays bounded") {
  CollectorOptions opt;
  opt.max_activities = 64;
  opt.settle_ns = 5 * kMs;
  Collector col(opt);
  const uint32_t k = col.names().intern("ncclDevKernel_AllReduce");
  for (int64_t s = 0; s < 50; ++s) {
    const int64_t base = s * 100;
    col.step_begin(s, base * kMs);
    col.add_activity(kernel(base + 10, base + 60, ActivityClass::compute));
    col.add_activity(kernel(base + 50, base + 80, ActivityClass::communication, k));
    col.step_end(s, (base + 90) * kMs);
    CHECK(col.finalize((base + 94) * kMs, false).empty());  // ended 4 ms ago: not settled yet
    const auto done = col.finalize((base + 95) * kMs, false);
    REQUIRE(done.size() == 1);
    CHECK(done[0].report.step == s);
    for (const auto& f : done) {
      CHECK(f.report.exposed_comm_ms == doctest::Approx(20));
      CHECK(f.report.compute_ms == doctest::Approx(50));
      CHECK(f.report.idle_ms == doctest::Approx(20));
    }
    CHECK(col.kept_activities() <= 8);  // old records are dropped as steps are reported
  }
  CHECK(col.counters().steps_reported == 50);
  col.step_begin(50, 5000 * kMs);
  col.step_end(50, 5010 * kMs);
  col.step_begin(51, 5020 * kMs);  // open: an explicit flush reports closed steps only
  const auto rest = col.finalize_closed();
  REQUIRE(rest.size() == 1);
  CHECK(rest[0].report.step == 50);
  CHECK(col.counters().dropped_activities == 0);
  col.add_activity(kernel(100, 200, ActivityClass::compute));  // belongs to a reported step
  CHECK(col.counters().late_activities == 1);
}

// The main job's failure mode: CUPTI hands buffers over in batches, so the records of a step's
// kernels arrive after the step's host range has ended. They must count in their step.
TEST_CASE("collector: records delivered after the step's host end but before it settles are counted") {
  CollectorOptions opt;
  opt.settle_ns = 50 * kMs;
  Collector col(opt);
  const uint32_t nccl = col.names().intern("ncclDevKernel_AllReduce_Sum_bf16_RING_LL");
  col.step_begin(0, 0);
  col.step_end(0, 100 * kMs);
  col.step_begin(1, 100 * kMs);
  // Nothing delivered yet while the step settles.
  CHECK(col.finalize(120 * kMs, false).empty());
  // The buffer with step 0's records comes 30 ms after its end (and after step 1 began).
  col.add_activity(kernel(0, 60, ActivityClass::compute));
  col.add_activity(kernel(40, 90, ActivityClass::communication, nccl));
  col.add_activity(kernel(105, 140, ActivityClass::compute));  // step 1's
  CHECK(col.finalize(149 * kMs, false).empty());
  const auto done = col.finalize(150 * kMs, false);
  REQUIRE(done.size() == 1);
  CHECK(done[0].report.step == 0);
  CHECK(done[0].report.compute_ms == doctest::Approx(60));
  CHECK(done[0].report.comm_ms == doctest::Approx(50));
  CHECK(done[0].report.exposed_comm_ms == doctest::Approx(30));
  CHECK(done[0].report.idle_ms == doctest::Approx(10));
  CHECK(col.counters().late_activities == 0);
  // A record of step 0 that only comes after step 0 was reported is counted as late, not lost silently
  // and not added to step 1.
  col.add_activity(kernel(10, 20, ActivityClass::compute));
  CHECK(col.counters().late_activities == 1);
  col.step_end(1, 200 * kMs);
  const auto last = col.finalize(0, true);
  REQUIRE(last.size() == 1);
  CHECK(last[0].report.step == 1);
  CHECK(last[0].report.compute_ms == doctest::Approx(35));
}

// CUPTI writes a launch's external-correlation record in the launching thread's buffer and the
// kernel record elsewhere: either may be delivered first. The range is joined when the step is
// reported.
TEST_CASE("collector: NVTX range and shim call are joined to kernels by correlation id, in any order") {
  CollectorOptions opt;
  opt.settle_ns = 10 * kMs;
  Collector col(opt);
  const uint32_t nccl = col.names().intern("ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  const uint64_t merged_hash = 0x1234567;
  const uint64_t layer_hash = 0x7654321;
  col.step_begin(0, 0);
  // Kernel first (correlation 7), its launch's external record later.
  Activity merged = kernel(50, 90, ActivityClass::communication, nccl);
  merged.correlation = 7;
  col.add_activity(merged);
  Activity hidden = kernel(10, 20, ActivityClass::communication, nccl);
  hidden.correlation = 5;
  col.add_external(5, 0, layer_hash);  // external record first
  col.add_activity(hidden);
  col.add_activity(kernel(0, 40, ActivityClass::compute));
  Activity shim_call = kernel(92, 95, ActivityClass::communication, nccl);
  shim_call.correlation = 9;
  col.add_activity(shim_call);
  col.step_end(0, 100 * kMs);
  col.add_external(7, 0, merged_hash);
  col.add_external(9, 42, 0);
  col.add_external(9, 0, layer_hash);
  CallInfo call;
  call.seq = 42;
  call.issue_ns = 91 * kMs;
  call.app_bytes = 1000;
  call.wire_bytes = 520;
  call.plain_wire_bytes = 1500;
  call.kind = col.names().intern("all_reduce");
  col.add_call(call);
  // Names are posted by the NVTX handlers before the launches, but drained with the same lag.
  col.name_range(merged_hash, "merged_allreduce");
  col.name_range(layer_hash, "backward/layer3");
  CHECK(col.range_name(merged_hash) == col.names().intern("merged_allreduce"));
  CHECK(col.range_name(99) == kNoName);
  const auto done = col.finalize(110 * kMs, false);
  REQUIRE(done.size() == 1);
  const StepReport& r = done[0].report;
  REQUIRE(r.top.size() == 3);
  CHECK(r.top[0].range == "merged_allreduce");
  CHECK(r.top[0].exposed_ms == doctest::Approx(40));
  CHECK(r.top[0].name == "AllReduce");
  CHECK(r.top[1].seq == 42);
  CHECK(r.top[1].name == "all_reduce");
  CHECK(r.top[1].range == "backward/layer3");
  CHECK(r.top[1].app_bytes == 1000);
  CHECK(r.top[2].range == "backward/layer3");
  CHECK(r.top[2].exposed_ms == doctest::Approx(0));
  CHECK(r.app_bytes == 1000);
  CHECK(r.wire_bytes == 520);
  CHECK(r.plain_wire_bytes == 1500);
}

TEST_CASE("collector: the correlation table stays bounded") {
  CollectorOptions opt;
  opt.max_externals = 64;
  Collector col(opt);
  for (uint32_t id = 1; id <= 1000; ++id) col.add_external(id, 0, 77);
  CHECK(col.kept_externals() <= 64);
  CHECK(col.counters().dropped_externals >= 1000 - 64);
  // The newest launches are still known.
  col.name_range(77, "forward");
  col.step_begin(0, 0);
  Activity a = kernel(1, 2, ActivityClass::communication);
  a.correlation = 1000;
  col.add_activity(a);
  col.step_end(0, 3 * kMs);
  const auto done = col.finalize(0, true);
  REQUIRE(done.size() == 1);
  REQUIRE(done[0].report.top.size() == 1);
  CHECK(done[0].report.top[0].range == "forward");
}

TEST_CASE("collector: a full store drops and counts") {
  Collector small(CollectorOptions{.max_activities = 4});
  for (int i = 0; i < 10; ++i) small.add_activity(kernel(i, i + 1, ActivityClass::compute));
  CHECK(small.kept_activities() == 4);
  CHECK(small.counters().dropped_activities == 6);
}

TEST_CASE("collector: nested and unmatched step marks are counted, not trusted") {
  Collector c(CollectorOptions{.max_activities = 16});
  c.step_end(3, 10);
  c.step_begin(1, 20);
  c.step_begin(2, 30);
  c.step_end(5, 40);
  c.step_end(1, 50);
  CHECK(c.counters().unmatched_step_ends == 2);
  CHECK(c.counters().nested_step_begins == 1);
  CHECK(!c.step_open());
}

TEST_CASE("collector: with no steps marked the whole run is one window at the end") {
  Collector c(CollectorOptions{.max_activities = 16});
  c.add_activity(kernel(0, 10, ActivityClass::compute));
  c.add_activity(kernel(5, 20, ActivityClass::communication));
  const auto all = c.finalize(0, true);
  REQUIRE(all.size() == 1);
  CHECK(all[0].report.step == -1);
  CHECK(all[0].report.step_ms == doctest::Approx(20));
  CHECK(all[0].report.exposed_comm_ms == doctest::Approx(10));
}

TEST_CASE("event ring: many producers, one consumer, nothing lost or duplicated below capacity") {
  EventRing<uint64_t> ring(1 << 13);
  std::vector<std::thread> producers;
  for (uint64_t p = 0; p < 4; ++p)
    producers.emplace_back([&ring, p] {
      for (uint64_t i = 0; i < 1000; ++i) ring.push(p * 1000000 + i);
    });
  for (auto& t : producers) t.join();
  std::vector<uint64_t> got;
  ring.drain([&](uint64_t v) { got.push_back(v); });
  CHECK(got.size() == 4000);
  std::sort(got.begin(), got.end());
  CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());
  EventRing<int> tiny(2);
  CHECK(tiny.push(1));
  CHECK(tiny.push(2));
  CHECK(!tiny.push(3));
  CHECK(tiny.dropped() == 1);
  tiny.drain([](int) {});
  CHECK(tiny.push(4));
}

TEST_CASE("reports: JSON round trip, merge (max and mean over ranks), table, reading JSON lines") {
  StepReport a;
  a.rank = 0;
  a.step = 3;
  a.step_ms = 100;
  a.exposed_comm_ms = 10;
  a.compute_ms = 80;
  a.app_bytes = 1000;
  a.wire_bytes = 520;
  a.plain_wire_bytes = 1500;  // an all-reduce at 4 ranks: 2(N-1)/N of the caller's bytes
  CollectiveReport c;
  c.seq = 42;
  c.name = "all_reduce";
  c.range = "merged_allreduce";
  c.exposed_ms = 9;
  c.wire_bytes = 520;
  c.plain_wire_bytes = 1500;
  a.top.push_back(c);
  StepReport b = a;
  b.rank = 1;
  b.step_ms = 110;
  b.exposed_comm_ms = 20;
  b.top[0].exposed_ms = 19;
  StepReport back;
  std::string why;
  REQUIRE(step_report_from_json(json::parse(to_json(a).dump()), back, why));
  CHECK(back.step == 3);
  CHECK(back.step_ms == 100);
  REQUIRE(back.top.size() == 1);
  CHECK(back.top[0].seq == 42);
  CHECK(back.top[0].range == "merged_allreduce");
  CHECK(back.top[0].rel_error == -1);  // not measured
  CHECK(back.wire_bytes == 520);
  CHECK(back.plain_wire_bytes == 1500);
  CHECK(back.top[0].plain_wire_bytes == 1500);
  // Reports written before plain_wire_bytes read as 0 (nothing known of plain NCCL's bytes).
  {
    json old = to_json(a);
    old.erase("plain_wire_bytes");
    old["top"][0].erase("plain_wire_bytes");
    StepReport again;
    REQUIRE(step_report_from_json(old, again, why));
    CHECK(again.plain_wire_bytes == 0);
    CHECK(again.top[0].plain_wire_bytes == 0);
  }
  // A measured call's error (telemetry) travels with it; reports written before the field read as -1.
  {
    StepReport measured = a;
    measured.top[0].rel_error = 0.0261;
    StepReport again;
    REQUIRE(step_report_from_json(json::parse(to_json(measured).dump()), again, why));
    CHECK(again.top[0].rel_error == 0.0261);
    json old = to_json(a);
    old["top"][0].erase("rel_error");
    REQUIRE(step_report_from_json(old, again, why));
    CHECK(again.top[0].rel_error == -1);
    const std::string table = format_table(merge_ranks({measured}));
    CHECK(table.find("err%") != std::string::npos);
    CHECK(table.find(" 2.61 ") != std::string::npos);
  }

  const MergedReport m = merge_ranks({a, b});
  CHECK(m.ranks == 2);
  REQUIRE(m.steps.size() == 1);
  CHECK(m.steps[0].step_ms.max == 110);
  CHECK(m.steps[0].step_ms.mean == 105);
  CHECK(m.steps[0].exposed_comm_ms.max == 20);
  CHECK(m.steps[0].exposed_comm_ms.mean == 15);
  CHECK(m.steps[0].app_bytes == 2000);
  CHECK(m.steps[0].wire_bytes == 1040);
  CHECK(m.steps[0].plain_wire_bytes == 3000);  // summed over ranks, as the caller's and the wire bytes
  CHECK(m.mean.plain_wire_bytes == 3000);
  REQUIRE(m.top.size() == 2);
  CHECK(m.top[0].rank == 1);
  const json merged = to_json(m);
  CHECK(merged["steps"][0]["plain_wire_bytes"] == 3000);
  CHECK(merged["mean"]["plain_wire_bytes"] == 3000);
  CHECK(merged["top"][0]["plain_wire_bytes"] == 1500);
  const std::string table = format_table(m);
  CHECK(table.find("merged_allreduce") != std::string::npos);
  CHECK(table.find("mean") != std::string::npos);
  // The step rows end with the caller's bytes, the wire bytes and plain NCCL's wire bytes.
  CHECK(table.find("nccl.wire") != std::string::npos);
  CHECK(table.find("2.0K      1.0K      2.9K\n") != std::string::npos);

  const std::string path = "test_prof_host_reports.jsonl";
  {
    std::ofstream out(path);
    out << to_json(a).dump() << "\n" << "not json\n" << json{{"type", "summary"}}.dump() << "\n" << to_json(b).dump() << "\n";
  }
  std::vector<std::string> errors, warnings;
  const auto read = read_step_reports({path, "does-not-exist.jsonl"}, errors, warnings);
  CHECK(read.size() == 2);
  CHECK(errors.size() == 2);
  CHECK(warnings.empty());
  std::remove(path.c_str());
}

TEST_CASE("JSON output never throws on names that are not UTF-8") {
  CollectiveReport c;
  c.range = std::string("bad\xff\xfe range");
  const std::string text = dump_json(to_json(c));
  CHECK(text.find("range") != std::string::npos);
  CHECK(!json::parse(text, nullptr, false).is_discarded());
}

TEST_CASE("trace writer: a valid Chrome trace JSON array with the exposed track") {
  const std::string path = "test_prof_host.trace.json";
  {
    TraceWriter w;
    std::string error;
    REQUIRE(w.open(path, 3, error));
    StepReport r;
    r.rank = 3;
    r.begin_ns = 0;
    r.end_ns = 10 * kMs;
    StepTimeline tl;
    tl.compute = IntervalSet::from(std::vector<Interval>{{0, 5 * kMs}});
    tl.comm = IntervalSet::from(std::vector<Interval>{{4 * kMs, 8 * kMs}});
    tl.exposed_comm = tl.comm.minus(tl.compute);
    w.write_step(r, tl);
    w.close();
  }
  std::ifstream in(path);
  const json j = json::parse(in);
  REQUIRE(j.is_array());
  int exposed = 0;
  for (const json& e : j)
    if (e.value("name", "") == "exposed") {
      ++exposed;
      CHECK(e["ts"].get<double>() == doctest::Approx(5000));
      CHECK(e["dur"].get<double>() == doctest::Approx(3000));
      CHECK(e["pid"] == 3);
    }
  CHECK(exposed == 1);
  std::remove(path.c_str());
}

TEST_CASE("step names: numbered, unnumbered, and names that merely start with the prefix") {
  const std::vector<std::string> prefixes = {"ProfilerStep#", "step"};
  int64_t step = 0;
  CHECK(match_step_name("ProfilerStep#12", prefixes, -1, step));
  CHECK(step == 12);
  CHECK(match_step_name("step", prefixes, -1, step));
  CHECK(step == -1);
  CHECK(match_step_name("step 7", prefixes, -1, step));
  CHECK(step == 7);
  CHECK(!match_step_name("stepper", prefixes, -1, step));
  CHECK(!match_step_name("forward", prefixes, -1, step));
}

namespace {
// A small Kineto trace: ProfilerStep#5 over 0..100 ms with compute 0..60, an NCCL all-reduce
// 50..90 launched inside "grad_bucket_0" (10 ms hidden, 30 exposed) and a memcpy 92..96;
// ProfilerStep#6 with the all-reduce merged after compute (160..195, all exposed).
json small_kineto_trace() {
  json ev = json::array();
  auto x = [&](const std::string& cat, const std::string& name, double ts_ms, double dur_ms,
               json args = json::object(), int tid = 7) {
    ev.push_back({{"ph", "X"}, {"cat", cat}, {"name", name}, {"pid", 100}, {"tid", tid}, {"ts", ts_ms * 1000},
                  {"dur", dur_ms * 1000}, {"args", args}});
  };
  x("user_annotation", "ProfilerStep#5", 0, 100);
  x("user_annotation", "grad_bucket_0", 45, 2);
  x("cuda_runtime", "cudaLaunchKernel", 45.5, 0.01, {{"correlation", 11}});
  x("kernel", "ampere_sgemm_128x64_nn", 0, 60, {{"correlation", 10}}, 0);
  x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 50, 40, {{"correlation", 11}}, 0);
  x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 92, 4, {{"correlation", 12}}, 0);
  x("user_annotation", "ProfilerStep#6", 100, 100);
  x("cpu_op", "ProfilerStep#6", 100, 100);  // recorded both ways: counted once
  x("user_annotation", "merged_allreduce", 160, 1);
  x("cuda_runtime", "cudaLaunchKernel", 160.5, 0.01, {{"correlation", 21}});
  x("kernel", "ampere_sgemm_128x64_nn", 100, 60, {{"correlation", 20}}, 0);
  x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 160, 35, {{"correlation", 21}}, 0);
  ev.push_back({{"ph", "i"}, {"name", "instant"}, {"ts", 1}});
  return json{{"schemaVersion", 1}, {"distributedInfo", {{"rank", 2}, {"world_size", 4}}}, {"traceEvents", ev}};
}
}  // namespace

TEST_CASE("kineto: the same figures per ProfilerStep, with the launching range attributed") {
  KinetoAnalysis a;
  std::string error;
  REQUIRE(analyze_kineto_text(small_kineto_trace().dump(), KernelClassifier(), KinetoOptions{}, a, error));
  CHECK(a.rank == 2);
  CHECK(a.kernels == 4);
  CHECK(a.comm_kernels == 2);
  CHECK(a.memory_ops == 1);
  REQUIRE(a.steps.size() == 2);
  const StepReport& s5 = a.steps[0];
  CHECK(s5.step == 5);
  CHECK(s5.rank == 2);
  CHECK(s5.compute_ms == doctest::Approx(60));
  CHECK(s5.exposed_comm_ms == doctest::Approx(30));
  CHECK(s5.exposed_memcpy_ms == doctest::Approx(4));
  CHECK(s5.idle_ms == doctest::Approx(6));
  CHECK(s5.overlap_pct == doctest::Approx(25));
  REQUIRE(s5.top.size() == 1);
  CHECK(s5.top[0].range == "grad_bucket_0");
  CHECK(s5.top[0].name == "AllReduce");
  const StepReport& s6 = a.steps[1];
  CHECK(s6.step == 6);
  CHECK(s6.exposed_comm_ms == doctest::Approx(35));
  CHECK(s6.overlap_pct == doctest::Approx(0));
  REQUIRE(s6.top.size() == 1);
  CHECK(s6.top[0].range == "merged_allreduce");
}

TEST_CASE("kineto: bad input gives a clear error") {
  KinetoAnalysis a;
  std::string error;
  CHECK(!analyze_kineto_text("{not json", KernelClassifier(), KinetoOptions{}, a, error));
  CHECK(error.starts_with("not valid JSON (byte 3)"));
  CHECK(!analyze_kineto_text(R"({"foo": 1})", KernelClassifier(), KinetoOptions{}, a, error));
  CHECK(error.find("traceEvents") != std::string::npos);
  CHECK(!analyze_kineto_text(R"([{"ph":"X","cat":"kernel","name":"k","ts":"soon","dur":1}])", KernelClassifier(),
                             KinetoOptions{}, a, error));
  CHECK(error.find("\"ts\"") != std::string::npos);
  CHECK(!analyze_kineto_file("no/such/trace.json", KernelClassifier(), KinetoOptions{}, a, error));
  CHECK(error.find("cannot open") != std::string::npos);
}
