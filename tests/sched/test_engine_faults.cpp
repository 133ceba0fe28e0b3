// Fault injection over the simulated machine: every transport operation, codec launch and CUDA
// call one FP8 collective makes fails in turn, on the first rank and on the last, at every position
// of a pipelined call. Then, on every rank:
//   - the rank where it failed returns an error, and so does its next FP8 call on the communicator
//     (it is out of step with its peers until the application aborts it);
//   - every other rank returns an error, or sees the communicator's asynchronous error after the
//     application aborted it, or holds exactly the result of the run without a fault: never a
//     result that is silently wrong;
//   - no access races: no scratch reused while a failed call's stages may still read it, and the
//     caller's stream joined on every exit path (but where the failing call is the join itself);
//   - nothing hangs, nothing leaks once the communicator is destroyed.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <array>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/log.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;

namespace {

struct Scenario {
  const char* name;
  Spec spec;
  Run run;
};

std::vector<Scenario> scenarios() {
  std::vector<Scenario> v;
  // A scenario whose call runs in three or more stages (the counts below over 8 KiB of scratch); the
  // run returned is valid until the next scenario is added.
  auto pipelined = [&v](const char* name, const Spec& spec) -> Run& {
    v.push_back({name, spec, {}});
    v.back().run.config.scratch_max_bytes = 8 << 10;
    v.back().run.config.coalesce_max_bytes = 64 << 10;
    return v.back().run;
  };
  pipelined("two-shot all-reduce, 3 ranks, pipelined", {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::avg, 7000, 3});
  pipelined("one-shot all-reduce, send/recv gather, pipelined", {Collective::all_reduce, Path::one_shot, DataType::f32, ReduceOp::sum, 5000, 4})
      .config.gather_transport = GatherMethod::sendrecv;
  pipelined("ring all-reduce", {Collective::all_reduce, Path::ring, DataType::f16, ReduceOp::sum, 9000, 5});
  pipelined("reduce-scatter, pipelined", {Collective::reduce_scatter, Path::two_shot, DataType::bf16, ReduceOp::sum, 2000, 6});
  pipelined("all-gather, pipelined", {Collective::all_gather, Path::one_shot, DataType::bf16, ReduceOp::sum, 5000, 7});
  pipelined("all-to-all, pipelined", {Collective::all_to_all, Path::one_shot, DataType::bf16, ReduceOp::sum, 2000, 10});
  {
    Scenario s{"three grouped all-reduces, coalesced", {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, 1500, 8}, {}};
    s.run.config.algorithm = Algorithm::two_shot;
    s.run.forced = false;
    s.run.group = 3;
    v.push_back(s);
  }
  Run& feedback = pipelined("two-shot with error feedback", {Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, 4000, 9});
  feedback.config.error_feedback = true;
  // Every cudaMalloc failure here is the residual's (best effort, judged below); the telemetry's
  // records, whose failure fails the call, have their faults in sched_engine_guard.
  feedback.config.telemetry_sample_every = 0;
  feedback.feedback_key = 77;
  return v;
}

bool join_site(sim::Site s) { return s == sim::Site::event_record || s == sim::Site::stream_wait; }

// Why a faulty run breaks the contract ("" when it does not).
std::string judge(const Scenario& sc, const Outcome& clean, const Outcome& o, const sim::Fault& f, int n) {
  const std::string where =
      fmt::format("{}: {} #{} failing on rank {}", sc.name, sim::to_string(f.site), f.index, f.rank);
  if (o.deadlocked) return where + ": deadlock: " + (o.protocol.empty() ? "" : o.protocol.back());
  if (!o.protocol.empty()) return where + ": " + o.protocol.front();
  if (!o.leaks.empty()) return where + ": " + o.leaks.front();
  for (const std::string& race : o.races) {
    // A failed join cannot order the caller's stream after the lanes: the application's own
    // accesses may then race on that rank (it got the error and must not use the buffers).
    const bool own_join = join_site(f.site) && race.find(fmt::format("rank {}:", f.rank)) == 0 &&
                          race.find("application") != std::string::npos;
    if (!own_join) return where + ": race: " + race;
  }
  const RankResult& faulty = o.first[static_cast<size_t>(f.rank)];
  // Error feedback is best effort: a residual that cannot be allocated leaves the call without
  // feedback, not failed (it changes what is quantized, never the communication).
  const bool optional = sc.run.config.error_feedback && f.site == sim::Site::malloc;
  if (optional) {
    for (int r = 0; r < n; ++r)
      if (o.first[static_cast<size_t>(r)].result != ncclSuccess ||
          o.first[static_cast<size_t>(r)].out != clean.first[static_cast<size_t>(r)].out)
        return fmt::format("{}: rank {}: a missing residual must leave the call as it is without feedback", where, r);
    return "";
  }
  if (faulty.result == ncclSuccess) return where + ": the failing rank returned success";
  if (o.second[static_cast<size_t>(f.rank)].result == ncclSuccess)
    return where + ": the next FP8 call on the failed communicator returned success";
  for (int r = 0; r < n; ++r) {
    for (int call = 0; call < 2; ++call) {
      const RankResult& got = call == 0 ? o.first[static_cast<size_t>(r)] : o.second[static_cast<size_t>(r)];
      const RankResult& want = clean.first[static_cast<size_t>(r)];
      if (got.result != ncclSuccess || got.async != ncclSuccess) continue;  // an error the rank sees
      if (got.out != want.out)
        return fmt::format("{}: rank {} call {} returned success with a wrong result", where, r, call + 1);
    }
  }
  return "";
}

}  // namespace

TEST_CASE("every fault point of a collective, on the first and the last rank") {
  log_set_level(LogLevel::off);
  const sim::Site sites[] = {sim::Site::codec,        sim::Site::send,        sim::Site::recv,
                             sim::Site::all_gather,   sim::Site::group_end,   sim::Site::event_record,
                             sim::Site::stream_wait,  sim::Site::memcpy_async, sim::Site::is_capturing,
                             sim::Site::malloc};
  std::vector<std::string> failures;
  size_t runs = 0;
  // Per site: runs, and how the other ranks' first calls ended (the table in the log).
  struct Tally {
    size_t runs = 0, returned_error = 0, async_error = 0, correct = 0;
  };
  std::array<Tally, sim::kSiteCount> tally{};
  for (const Scenario& sc : scenarios()) {
    const int n = 3;
    const auto inputs = inputs_for(sc.spec, n, std::max(sc.run.group, 1));
    const Outcome clean = run(sc.run, sc.spec, inputs);
    if (!sc.run.group) CHECK(stage_for(sc.run.config, sc.spec, n) < sc.spec.count);  // pipelined
    REQUIRE_MESSAGE(check_clean(sc.run, sc.spec, inputs, clean).empty(), check_clean(sc.run, sc.spec, inputs, clean));
    size_t points = 0;
    for (int rank : {0, n - 1}) {
      for (sim::Site site : sites) {
        const size_t i = static_cast<size_t>(site);
        const int from = clean.after_setup[static_cast<size_t>(rank)][i];
        const int to = clean.after_calls[static_cast<size_t>(rank)][i];
        for (int k = from; k < to; ++k) {
          Run faulty = sc.run;
          faulty.second_call = true;
          faulty.fault = sim::Fault{rank, site, k};
          const Outcome o = run(faulty, sc.spec, inputs);
          ++runs;
          ++points;
          Tally& t = tally[static_cast<size_t>(site)];
          ++t.runs;
          for (int r = 0; r < n; ++r) {
            if (r == rank) continue;
            const RankResult& a = o.first[static_cast<size_t>(r)];
            if (a.result != ncclSuccess) ++t.returned_error;
            else if (a.async != ncclSuccess) ++t.async_error;
            else ++t.correct;
          }
          if (std::string e = judge(sc, clean, o, faulty.fault, n); !e.empty()) failures.push_back(e);
        }
      }
    }
    MESSAGE(std::string(sc.name) << ": " << points << " fault points");
    CHECK(points > 10);
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  std::string table = fmt::format("{} faulty runs\n{:<14} {:>6} | other ranks' first call: {:>8} {:>12} {:>14}\n",
                                  runs, "site", "runs", "error", "async error", "right result");
  for (sim::Site site : sites) {
    const Tally& t = tally[static_cast<size_t>(site)];
    if (t.runs) table += fmt::format("{:<14} {:>6} | {:>33} {:>12} {:>14}\n", sim::to_string(site), t.runs,
                                     t.returned_error, t.async_error, t.correct);
  }
  MESSAGE(table);
}

TEST_CASE("a fault during the agreement turns FP8 off on every rank alike, or its collectives, never a hang") {
  log_set_level(LogLevel::off);
  const Spec spec{Collective::all_reduce, Path::two_shot, DataType::f32, ReduceOp::sum, 3000, 4};
  const auto inputs = inputs_for(spec, 3);
  struct Case {
    sim::Site site;
    int index;
    const char* what;
  };
  // malloc #0 is the scratch, #1 the exchange buffer when the scratch failed; stream_create #0 and
  // #1 the lanes. A rank without scratch offers none: the communicator keeps FP8 for messages, and
  // its collectives fall back on every rank.
  const Case cases[] = {{sim::Site::malloc, 0, "scratch allocation fails"},
                        {sim::Site::stream_create, 0, "a lane cannot be created"},
                        {sim::Site::stream_create, 1, "the second lane cannot be created"}};
  for (const Case& c : cases) {
    for (int rank : {0, 2}) {
      Run r;
      r.fault = sim::Fault{rank, c.site, c.index};
      const Outcome o = run(r, spec, inputs);
      INFO(c.what << " on rank " << rank);
      CHECK_FALSE(o.deadlocked);
      CHECK(o.races.empty());
      CHECK(o.protocol.empty());
      CHECK(o.leaks.empty());
      for (const RankResult& a : o.first) {
        if (c.site == sim::Site::malloc) {
          CHECK(a.info.fp8_ok);
          CHECK(a.info.scratch_bytes == 0);
        } else {
          CHECK_FALSE(a.info.fp8_ok);
          CHECK(a.info.reason.find(fmt::format("rank {}", rank)) != std::string::npos);
        }
        CHECK(a.result == ncclSuccess);  // forced FP8 falls back to plain NCCL: a correct sum
        CHECK(a.out == o.first[0].out);
      }
    }
  }
  // The scratch and the small exchange buffer both fail: the exchange runs in mapped host memory.
  Run both;
  both.fault = sim::Fault{1, sim::Site::malloc, 0, 2};
  const Outcome o = run(both, spec, inputs);
  CHECK_FALSE(o.deadlocked);
  for (const RankResult& a : o.first) {
    CHECK(a.info.scratch_bytes == 0);
    CHECK(a.result == ncclSuccess);
    CHECK(a.out == o.first[0].out);
  }
}
