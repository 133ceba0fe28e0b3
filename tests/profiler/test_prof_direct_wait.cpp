// CPU tier: the exposure profiler over a direct transport's calls, whose lanes wait on their peers
// with stream memory operations that no kernel record shows. Synthetic records: a call's lanes (a
// call-begin mark, a quantize, a gap while the peers' flags are awaited, a reduce) with compute over
// part of the gap. Checks that the wait counts as exposed communication of that call, the split into
// waiting vs moving data, and that the per-collective figures add up to the per-step ones.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <span>

#include <nlohmann/json.hpp>

#include "profiler/classify.hpp"
#include "profiler/exposure.hpp"
#include "profiler/report.hpp"

using namespace fp8wire::prof;

namespace {
constexpr int64_t kUs = 1'000;
constexpr int64_t kMs = 1'000'000;

Activity at(int64_t begin_ns, int64_t end_ns, ActivityClass cls, uint64_t seq = 0, uint32_t name = kNoName) {
  return Activity{{begin_ns, end_ns}, cls, name, kNoName, seq};
}

struct Names {
  NameTable table;
  uint32_t mark = table.intern("_ZN7fp8wire5quant22call_begin_mark_kernelEv");
  uint32_t quantize = table.intern("void fp8wire::quant::quantize_kernel<bf16>");
  uint32_t reduce = table.intern("void fp8wire::quant::dequantize_reduce_kernel<bf16>");
  uint32_t nccl = table.intern("ncclDevKernel_AllReduce_Sum_bf16_RING_LL");
  CallInfo call(uint64_t seq, const char* transport) {
    CallInfo c;
    c.seq = seq;
    c.kind = table.intern("all_reduce");
    c.dtype = table.intern("bf16");
    c.path = table.intern("one_shot");
    c.transport = table.intern(transport);
    c.app_bytes = 64 << 20;
    return c;
  }
};

// Step `step`, 0..100 ms, of `acts` and the calls `calls`, named by `n`.
StepReport step_of(const Names& n, std::span<const Activity> acts, std::span<const CallInfo> calls = {},
                   StepTimeline* timeline = nullptr, int64_t step = 0) {
  StepInput in;
  in.window = {step, {0, 100 * kMs}};
  in.activities = acts;
  in.calls = calls;
  in.names = &n.table;
  return compute_step(in, timeline);
}

double sum_of(const StepReport& r, double CollectiveReport::*field) {
  double s = 0;
  for (const CollectiveReport& c : r.top) s += c.*field;
  return s;
}
}  // namespace

TEST_CASE("prof direct wait: a peer wait between the codec kernels is exposed communication of its call") {
  // One direct one-shot (seq 5) in a 100 ms step: mark 10 ms (2 us), quantize 12..15 on the produce
  // lane, the transfer lane waits for the peers' flags 15..40, reduce 40..45. Compute 20..30 hides
  // part of the wait. Exposed: 2 (10..12) + 3 data + 5 (15..20) + 10 (30..40) + 5 data = 25 ms.
  Names n;
  const std::vector<Activity> acts = {
      at(10 * kMs, 10 * kMs + 2 * kUs, ActivityClass::call_mark, 5, n.mark),
      at(12 * kMs, 15 * kMs, ActivityClass::communication, 5, n.quantize),
      at(20 * kMs, 30 * kMs, ActivityClass::compute),
      at(40 * kMs, 45 * kMs, ActivityClass::communication, 5, n.reduce)};
  const std::vector<CallInfo> calls = {n.call(5, "host_memory")};
  StepTimeline tl;
  const StepReport r = step_of(n, acts, calls, &tl, 3);
  CHECK(r.comm_ms == doctest::Approx(35));
  CHECK(r.exposed_comm_ms == doctest::Approx(25));
  CHECK(r.exposed_data_ms == doctest::Approx(8));
  CHECK(r.exposed_wait_ms == doctest::Approx(17));
  CHECK(r.compute_ms == doctest::Approx(10));
  CHECK(r.idle_ms == doctest::Approx(65));  // the wait is no longer idle (it was 82 ms)
  CHECK(r.overlap_pct == doctest::Approx(100.0 * 10 / 35));
  CHECK(r.comm_kernels == 2);
  REQUIRE(r.top.size() == 1);
  const CollectiveReport& c = r.top[0];
  CHECK(c.seq == 5);
  CHECK(c.kernels == 2);
  CHECK(c.kernel == "void fp8wire::quant::quantize_kernel<bf16>");  // the first kernel, not the mark
  CHECK(c.transport == "host_memory");
  CHECK(c.begin_ns == 10 * kMs);
  CHECK(c.duration_ms == doctest::Approx(35));
  CHECK(c.exposed_ms == doctest::Approx(25));
  CHECK(c.exposed_data_ms == doctest::Approx(8));
  CHECK(c.exposed_wait_ms == doctest::Approx(17));
  CHECK(tl.exposed_wait.measure() == 17 * kMs);
  CHECK(tl.exposed_comm.measure() == 25 * kMs);
}

TEST_CASE("prof direct wait: without a mark the call's span starts at its first kernel, and a mark alone is no call") {
  Names n;
  const std::vector<Activity> acts = {
      at(12 * kMs, 15 * kMs, ActivityClass::communication, 5, n.quantize),
      at(40 * kMs, 45 * kMs, ActivityClass::communication, 5, n.reduce),
      at(60 * kMs, 61 * kMs, ActivityClass::call_mark, 0, n.mark)};  // no call: ignored
  const StepReport r = step_of(n, acts);
  // Before, this step said 8 ms exposed while its collective said 33: the step counted kernels
  // only, the collective its whole span. Both now count the span.
  CHECK(r.exposed_comm_ms == doctest::Approx(33));
  CHECK(r.exposed_wait_ms == doctest::Approx(25));
  CHECK(r.calls == 1);
  REQUIRE(r.top.size() == 1);
  CHECK(r.top[0].exposed_ms == doctest::Approx(r.exposed_comm_ms));
}

TEST_CASE("prof direct wait: overlapping collectives share the exposed time, data first, earliest first") {
  // Call 1 (direct) spans 0..50 ms: mark 0, quantize 0..5, waits, reduce 45..50. Call 2 (another
  // communicator) spans 10..30 with a quantize 20..25 while call 1 waits. An NCCL kernel without a
  // call runs 40..48. No compute: the step's exposed time is the union 0..50.
  Names n;
  const std::vector<Activity> acts = {
      at(0, 2 * kUs, ActivityClass::call_mark, 1, n.mark),
      at(0, 5 * kMs, ActivityClass::communication, 1, n.quantize),
      at(45 * kMs, 50 * kMs, ActivityClass::communication, 1, n.reduce),
      at(10 * kMs, 10 * kMs + 2 * kUs, ActivityClass::call_mark, 2, n.mark),
      at(20 * kMs, 25 * kMs, ActivityClass::communication, 2, n.quantize),
      at(28 * kMs, 30 * kMs, ActivityClass::communication, 2, n.reduce),
      at(40 * kMs, 48 * kMs, ActivityClass::communication, 0, n.nccl)};
  const StepReport r = step_of(n, acts);
  CHECK(r.exposed_comm_ms == doctest::Approx(50));
  CHECK(r.exposed_data_ms == doctest::Approx(5 + 5 + 2 + 10));  // the union of kernels: 0..5, 20..25, 28..30, 40..50
  REQUIRE(r.top.size() == 3);
  auto by_seq = [&](uint64_t seq, const std::string& name) -> const CollectiveReport& {
    for (const CollectiveReport& c : r.top)
      if (c.seq == seq && (seq != 0 || c.name == name)) return c;
    FAIL("no such collective");
    return r.top[0];
  };
  // Call 1 owns its span's wait (it started first) and its kernels' time where no earlier one runs.
  const CollectiveReport& one = by_seq(1, "");
  CHECK(one.exposed_data_ms == doctest::Approx(5 + 5));        // 0..5, 45..50 (started before the NCCL kernel)
  CHECK(one.exposed_wait_ms == doctest::Approx(50 - 22));  // its span less every kernel's time
  const CollectiveReport& two = by_seq(2, "");
  CHECK(two.exposed_data_ms == doctest::Approx(5 + 2));  // its kernels run while call 1 only waits
  CHECK(two.exposed_wait_ms == doctest::Approx(0));      // inside call 1's span
  const CollectiveReport& nccl = by_seq(0, "AllReduce");
  CHECK(nccl.exposed_data_ms == doctest::Approx(5));     // 40..45; 45..48 goes to call 1's reduce
  CHECK(sum_of(r, &CollectiveReport::exposed_ms) == doctest::Approx(r.exposed_comm_ms));
}

TEST_CASE("prof direct wait: per-collective figures add up to the step's on random lanes") {
  std::mt19937 rng(2026);
  constexpr int64_t kHorizon = 2000;  // ns grid, brute-forced
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<Activity> acts;
    const int calls = 1 + static_cast<int>(rng() % 5);
    std::vector<Interval> spans;
    for (int k = 1; k <= calls; ++k) {
      int64_t t = static_cast<int64_t>(rng() % kHorizon) - 200;
      const bool marked = rng() % 4;
      if (marked) acts.push_back(at(t, t + 1, ActivityClass::call_mark, k));
      int64_t start = marked ? t : std::numeric_limits<int64_t>::max();
      int64_t end = marked ? t + 1 : std::numeric_limits<int64_t>::min();
      for (int kernels = 1 + static_cast<int>(rng() % 4); kernels > 0; --kernels) {
        t += static_cast<int64_t>(rng() % 150);  // a wait (or nothing)
        const int64_t len = 1 + static_cast<int64_t>(rng() % 100);
        acts.push_back(at(t, t + len, ActivityClass::communication, k));
        start = std::min(start, t);
        end = std::max(end, t + len);
        t += rng() % 2 ? len : len / 2;  // the next kernel may overlap (the other lane)
      }
      spans.push_back({start, end});
    }
    for (int i = 0, extra = static_cast<int>(rng() % 4); i < extra; ++i) {
      const int64_t b = static_cast<int64_t>(rng() % kHorizon);
      acts.push_back(at(b, b + 1 + static_cast<int64_t>(rng() % 200), ActivityClass::communication));
    }
    for (int i = 0, extra = static_cast<int>(rng() % 8); i < extra; ++i) {
      const int64_t b = static_cast<int64_t>(rng() % kHorizon);
      acts.push_back(at(b, b + 1 + static_cast<int64_t>(rng() % 300),
                        rng() % 3 ? ActivityClass::compute : ActivityClass::memory));
    }
    std::shuffle(acts.begin(), acts.end(), rng);
    StepInput in;
    in.window = {0, {100, kHorizon - 100}};
    in.activities = acts;
    in.top_n = 1000;
    const StepReport r = compute_step(in);

    // Brute force on the nanosecond grid: M = kernels ∪ spans, C, K.
    int64_t m_ns = 0, exposed_ns = 0, wait_ns = 0;
    for (int64_t t = in.window.time.begin; t < in.window.time.end; ++t) {
      bool c = false, kern = false, span = false;
      for (const Activity& a : acts) {
        if (a.time.begin > t || a.time.end <= t) continue;
        c |= a.cls == ActivityClass::compute;
        kern |= a.cls == ActivityClass::communication;
      }
      for (const Interval& s : spans) span |= s.begin <= t && t < s.end;
      const bool m = kern || span;
      m_ns += m;
      exposed_ns += m && !c;
      wait_ns += m && !c && !kern;
    }
    REQUIRE(r.comm_ms == doctest::Approx(m_ns * 1e-6));
    REQUIRE(r.exposed_comm_ms == doctest::Approx(exposed_ns * 1e-6));
    REQUIRE(r.exposed_wait_ms == doctest::Approx(wait_ns * 1e-6));
    REQUIRE(r.exposed_data_ms + r.exposed_wait_ms == doctest::Approx(r.exposed_comm_ms));
    REQUIRE(r.compute_ms + r.exposed_comm_ms + r.exposed_memcpy_ms + r.idle_ms == doctest::Approx(r.step_ms));
    REQUIRE(r.top.size() == r.calls);
    REQUIRE(sum_of(r, &CollectiveReport::exposed_ms) == doctest::Approx(r.exposed_comm_ms));
    REQUIRE(sum_of(r, &CollectiveReport::exposed_data_ms) == doctest::Approx(r.exposed_data_ms));
    REQUIRE(sum_of(r, &CollectiveReport::exposed_wait_ms) == doctest::Approx(r.exposed_wait_ms));
    for (const CollectiveReport& c : r.top) {
      REQUIRE(c.exposed_ms <= c.duration_ms + 1e-9);
      REQUIRE(c.exposed_data_ms >= 0);
      REQUIRE(c.exposed_wait_ms >= 0);
    }
  }
}

TEST_CASE("prof direct wait: a call begun in one step and finished in the next counts in both, live and from a trace") {
  // Step 1 is 0..50 ms, step 2 50..100. The call's lanes enter it at 45 (mark) and wait for the peers
  // until its quantize at 60..62 and reduce 70..72.
  Names n;
  const std::vector<Activity> acts = {
      at(45 * kMs, 45 * kMs + 2 * kUs, ActivityClass::call_mark, 9, n.mark),
      at(60 * kMs, 62 * kMs, ActivityClass::communication, 9, n.quantize),
      at(70 * kMs, 72 * kMs, ActivityClass::communication, 9, n.reduce),
      at(0, 40 * kMs, ActivityClass::compute)};
  const std::vector<StepWindow> windows = {{1, {0, 50 * kMs}}, {2, {50 * kMs, 100 * kMs}}};
  const std::vector<StepReport> batch = compute_steps(windows, acts, {}, &n.table, 10, 0);
  REQUIRE(batch.size() == 2);
  CHECK(batch[0].exposed_comm_ms == doctest::Approx(5));
  CHECK(batch[0].exposed_wait_ms == doctest::Approx(5));
  CHECK(batch[1].exposed_comm_ms == doctest::Approx(22));
  CHECK(batch[1].exposed_data_ms == doctest::Approx(4));
  REQUIRE(batch[1].top.size() == 1);
  CHECK(batch[1].top[0].exposed_ms == doctest::Approx(22));

  // Live: the collector reports step 1 while the call's kernels are already in; the mark must stay
  // for step 2 even though it ended before step 2 began.
  CollectorOptions options;
  options.settle_ns = 10 * kMs;
  Collector col(options);
  col.step_begin(1, 0);
  col.step_end(1, 50 * kMs);
  col.step_begin(2, 50 * kMs);
  for (const Activity& a : acts) col.add_activity(a);
  const auto first = col.finalize(65 * kMs, false);
  REQUIRE(first.size() == 1);
  CHECK(first[0].report.exposed_comm_ms == doctest::Approx(5));
  col.step_end(2, 100 * kMs);
  const auto second = col.finalize(200 * kMs, false);
  REQUIRE(second.size() == 1);
  CHECK(second[0].report.exposed_comm_ms == doctest::Approx(22));
  CHECK(second[0].report.exposed_wait_ms == doctest::Approx(18));
  CHECK(col.kept_activities() == 0);
  CHECK(col.counters().call_marks == 1);
  CHECK(to_json(col.counters())["call_marks"] == 1);
}

TEST_CASE("prof direct wait: the call-begin mark is classified, and the split travels through JSON and the table") {
  const KernelClassifier k;
  CHECK(k.classify_kernel("_ZN7fp8wire5quant22call_begin_mark_kernelEv") == ActivityClass::call_mark);
  CHECK(k.classify_kernel("void fp8wire::quant::call_begin_mark_kernel()") == ActivityClass::call_mark);
  CHECK(k.classify_kernel("my_call_begin_mark") == ActivityClass::compute);  // not fp8wire's

  StepReport r;
  r.rank = 1;
  r.step = 4;
  r.step_ms = 156;
  r.exposed_comm_ms = 80;
  r.exposed_data_ms = 20;
  r.exposed_wait_ms = 60;
  CollectiveReport c;
  c.seq = 12;
  c.name = "all_reduce";
  c.path = "one_shot";
  c.transport = "host_memory";
  c.exposed_ms = 80;
  c.exposed_data_ms = 20;
  c.exposed_wait_ms = 60;
  r.top.push_back(c);
  StepReport back;
  std::string error;
  REQUIRE(step_report_from_json(nlohmann::json::parse(dump_json(to_json(r))), back, error));
  CHECK(back.exposed_data_ms == 20);
  CHECK(back.exposed_wait_ms == 60);
  REQUIRE(back.top.size() == 1);
  CHECK(back.top[0].transport == "host_memory");
  CHECK(back.top[0].exposed_wait_ms == 60);
  CHECK(back.top[0].exposed_data_ms == 20);
  const MergedReport m = merge_ranks({back});
  CHECK(m.mean.exposed_wait_ms.mean == doctest::Approx(60));
  CHECK(to_json(m)["mean"]["exposed_wait_ms"]["mean"].get<double>() == doctest::Approx(60));
  const std::string table = format_table(m);
  CHECK(table.find("expo.wait") != std::string::npos);
  CHECK(table.find("host_memory") != std::string::npos);
  nlohmann::json wrong = to_json(r);
  wrong["top"][0]["exposed_wait_ms"] = "a lot";
  CHECK_FALSE(step_report_from_json(wrong, back, error));
  CHECK(error == "\"top\"[0]: \"exposed_wait_ms\" is \"a lot\", expected a number");
}
