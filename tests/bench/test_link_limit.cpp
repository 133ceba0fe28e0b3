#include <doctest/doctest.h>

#include "bench/host/link_limit.hpp"
#include "bench/host/results.hpp"

using namespace fp8wire;
using namespace fp8wire::bench;

namespace {
const WireParams kBf16{DType::bf16, 128, 4};  // 0.515625 wire bytes per caller byte
constexpr uint64_t kMiB = 1ull << 20;
constexpr double w64 = 33.0 * kMiB;           // wire bytes of 64 MiB of bf16

LinkBytes bytes_of(Collective c, Path p, int n, uint64_t bytes, bool fewest) {
  const auto b = host_link_bytes(c, p, n, bytes, kBf16, fewest);
  REQUIRE(b.has_value());
  return *b;
}
}  // namespace

TEST_CASE("link_limit: host-link bytes per rank, as the direct programs move them and the fewest") {
  // All-reduce one-shot: its chunk out, every rank's chunk in (its own included today).
  auto b = bytes_of(Collective::all_reduce, Path::one_shot, 2, 64 * kMiB, false);
  CHECK(b.d2h == doctest::Approx(w64));
  CHECK(b.h2d == doctest::Approx(2 * w64));
  b = bytes_of(Collective::all_reduce, Path::one_shot, 4, 64 * kMiB, true);
  CHECK(b.d2h == doctest::Approx(w64));
  CHECK(b.h2d == doctest::Approx(3 * w64));
  // Two-shot: every shard and its reduced shard out; its inbox and every reduced shard in.
  b = bytes_of(Collective::all_reduce, Path::two_shot, 4, 64 * kMiB, false);
  CHECK(b.d2h == doctest::Approx(1.25 * w64));
  CHECK(b.h2d == doctest::Approx(2 * w64));
  b = bytes_of(Collective::all_reduce, Path::two_shot, 4, 64 * kMiB, true);
  CHECK(b.d2h == doctest::Approx(w64));
  CHECK(b.h2d == doctest::Approx(1.5 * w64));
  // Reduce-scatter of a 64 MiB input on 4 ranks: every block out and in; fewest: the peers' only.
  b = bytes_of(Collective::reduce_scatter, Path::two_shot, 4, 64 * kMiB, false);
  CHECK(b.d2h == doctest::Approx(w64));
  CHECK(b.h2d == doctest::Approx(w64));
  b = bytes_of(Collective::reduce_scatter, Path::two_shot, 4, 64 * kMiB, true);
  CHECK(b.d2h == doctest::Approx(0.75 * w64));
  CHECK(b.h2d == doctest::Approx(0.75 * w64));
  // All-gather of a 64 MiB output on 4 ranks: its 16 MiB part out, every part in.
  b = bytes_of(Collective::all_gather, Path::one_shot, 4, 64 * kMiB, false);
  CHECK(b.d2h == doctest::Approx(w64 / 4));
  CHECK(b.h2d == doctest::Approx(w64));
  b = bytes_of(Collective::all_gather, Path::one_shot, 4, 64 * kMiB, true);
  CHECK(b.h2d == doctest::Approx(0.75 * w64));
  // All-to-all of a 64 MiB send buffer on 4 ranks: the three peers' chunks out and theirs in, the own
  // chunk copied on the GPU by either program.
  for (bool fewest : {false, true}) {
    b = bytes_of(Collective::all_to_all, Path::one_shot, 4, 64 * kMiB, fewest);
    CHECK(b.d2h == doctest::Approx(0.75 * w64));
    CHECK(b.h2d == doctest::Approx(0.75 * w64));
  }
  CHECK_FALSE(host_link_bytes(Collective::send_recv, Path::one_shot, 2, kMiB, kBf16, true));
  // Paths the direct transport does not run, and a single rank, have none.
  CHECK_FALSE(host_link_bytes(Collective::all_reduce, Path::passthrough, 2, kMiB, kBf16, true));
  CHECK_FALSE(host_link_bytes(Collective::all_reduce, Path::ring, 4, kMiB, kBf16, true));
  CHECK_FALSE(host_link_bytes(Collective::all_reduce, Path::two_shot, 1, kMiB, kBf16, true));
}

TEST_CASE("link_limit: the emulated 2- and 4-rank all-reduce of 64 MiB at 54.5 / 49.5 GB/s") {
  PinnedRates rates{54.5, 49.5, 2, 64 * kMiB};
  // 2 ranks share the link: 2 x 33 MiB each way; H2D is the slower direction.
  LinkLimit l = link_limit(Collective::all_reduce, 2, 64 * kMiB, kBf16, rates);
  CHECK(l.path == Path::two_shot);  // at 2 ranks one-shot moves as much; two-shot is named
  CHECK(l.us == doctest::Approx(2 * w64 / 49.5e3));
  CHECK(l.us == doctest::Approx(1398.0).epsilon(0.001));
  CHECK(l.basis.find("all-reduce two_shot") != std::string::npos);
  CHECK(l.basis.find("2 ranks per link") != std::string::npos);
  // 3.94 ms measured: about a third of the limit.
  CHECK(percent_of_limit(l.us, 3940.0) == doctest::Approx(35.5).epsilon(0.01));
  // 4 ranks: two-shot's 1.5 w in beats one-shot's 3 w.
  rates.ranks_per_link = 4;
  l = link_limit(Collective::all_reduce, 4, 64 * kMiB, kBf16, rates);
  CHECK(l.path == Path::two_shot);
  CHECK(l.us == doctest::Approx(4 * 1.5 * w64 / 49.5e3));
  // One GPU per link: the rank's own bytes only.
  rates.ranks_per_link = 1;
  CHECK(link_limit(Collective::all_reduce, 4, 64 * kMiB, kBf16, rates).us == doctest::Approx(1.5 * w64 / 49.5e3));
  // D2H the slower direction: the reduce-scatter moves as much each way.
  rates = {40.0, 49.5, 2, 0};
  l = link_limit(Collective::reduce_scatter, 2, 64 * kMiB, kBf16, rates);
  CHECK(l.us == doctest::Approx(2 * 0.5 * w64 / 40e3));
  // Rates not measured: no limit, no percent.
  CHECK(link_limit(Collective::all_reduce, 2, 64 * kMiB, kBf16, PinnedRates{}).us == 0);
  CHECK(percent_of_limit(0, 100) == 0);
  CHECK(percent_of_limit(100, 0) == 0);
  CHECK(percent_of_limit(100, 200) == doctest::Approx(50));
}

TEST_CASE("link_limit: a pinned pass's rate is its best round's, rounds not timed skipped") {
  // Three rounds of two passes side by side (stride 2): pass 0 then pass 1 per round, microseconds.
  // 1 GB over one link: 20000 us is 50 GB/s.
  const double us[] = {20000, 25000,   // round 0
                       23000, 0,       // round 1: pass 1 not timed
                       18000, 40000};  // round 2: pass 0 at its best
  CHECK(best_round_gbps(us, 3, 2, 1e9) == doctest::Approx(1e9 / 18000e3));
  CHECK(best_round_gbps(us + 1, 3, 2, 1e9) == doctest::Approx(40.0));  // 25000 us; the 0 skipped
  // A round caught by a slow moment does not lower the ceiling: 13 % slow in one round of three.
  const double one_slow[] = {1000, 1130, 1000};
  CHECK(best_round_gbps(one_slow, 3, 1, 1e6) == doctest::Approx(1.0));
  const double none[] = {0, -1};
  CHECK(best_round_gbps(none, 2, 1, 1e9) == 0);
}

TEST_CASE("link_limit: a sweep's host-memory points get their percent, in the table and the JSON") {
  SweepResult r;
  r.machine.nranks = 2;
  r.machine.fabric = Fabric::pcie;
  r.wire = kBf16;
  r.pinned = {54.5, 49.5, 2, 64 * kMiB, 50.0, 45.0, {{{4 * kMiB, 47.0, 46.0}, {1 * kMiB, 38.0, 36.5}}}};
  auto point = [](Path path, const char* transport, double us) {
    SweepPoint p;
    p.collective = Collective::all_reduce;
    p.path = path;
    p.bytes = 64 * kMiB;
    p.transport = transport;
    p.times_us = {us, us, us};
    p.time = summarize(p.times_us);
    return p;
  };
  r.points = {point(Path::passthrough, "", 27100), point(Path::one_shot, "", 13100),
              point(Path::one_shot, "host_memory", 3940), point(Path::two_shot, "host_memory", 2796)};
  compute_speedups(r);
  compute_link_limits(r);
  CHECK(r.points[0].link_limit_pct == 0);  // plain NCCL and the FP8 path over NCCL: no link limit
  CHECK(r.points[1].link_limit_pct == 0);
  CHECK(r.points[2].link_limit_pct == doctest::Approx(35.5).epsilon(0.01));
  CHECK(r.points[3].link_limit_pct == doctest::Approx(50.0).epsilon(0.01));
  const std::string table = render_table(r, Collective::all_reduce, DType::bf16);
  CHECK(table.find("% of link limit (host memory points): all-reduce two_shot") != std::string::npos);
  CHECK(table.find("35.5%") != std::string::npos);
  CHECK(table.find("50.0%") != std::string::npos);
  // The JSON keeps the rates and the basis; read back, the percents are recomputed alike.
  const auto j = to_json(r, {}, Calibration{});
  CHECK(j.at("pinned_copy").at("d2h_gbps").get<double>() == doctest::Approx(54.5));
  CHECK(j.at("pinned_copy").at("link_limit_basis").at("all_reduce bf16").get<std::string>().find("two_shot") !=
        std::string::npos);
  CHECK(j.at("points")[2].at("link_limit_pct").get<double>() == doctest::Approx(35.5).epsilon(0.01));
  std::string error;
  const auto back = sweep_from_json(j, error);
  REQUIRE_MESSAGE(back.has_value(), error);
  CHECK(back->pinned.ranks_per_link == 2);
  CHECK(back->pinned.duplex_h2d_gbps == doctest::Approx(45.0));
  // The link's rates in small copies (reported beside the limit, not used in it) come back in order.
  REQUIRE(j.at("pinned_copy").at("duplex_in_copies").size() == 2);
  CHECK(back->pinned.duplex_small[0].copy_bytes == 4 * kMiB);
  CHECK(back->pinned.duplex_small[1].copy_bytes == 1 * kMiB);
  CHECK(back->pinned.duplex_small[1].h2d_gbps == doctest::Approx(36.5));
  CHECK(back->points[3].link_limit_pct == doctest::Approx(r.points[3].link_limit_pct));
  // Without the rates (a sweep of NCCL's transports only): nothing.
  r.pinned = {};
  compute_link_limits(r);
  CHECK(r.points[2].link_limit_pct == 0);
  CHECK(render_table(r, Collective::all_reduce, DType::bf16).find("% of link limit") == std::string::npos);
  CHECK_FALSE(to_json(r, {}, Calibration{}).contains("pinned_copy"));
}
