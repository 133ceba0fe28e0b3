#include <doctest/doctest.h>

#include <utility>

#include "bench/host/crossover.hpp"

using namespace fp8wire::bench;

namespace {
// Baseline: 10 us + 1 us/KiB; candidate: 40 us + 0.5 us/KiB -> the lines cross at 60 KiB.
// Sizes 4 KiB .. 4 MiB (index 4 = 64 KiB, 6 = 256 KiB, 7 = 512 KiB).
std::vector<CurvePoint> clean_curve() {
  std::vector<CurvePoint> pts;
  for (uint64_t kib = 4; kib <= 4096; kib *= 2) pts.push_back({kib << 10, 10 + 1.0 * kib, 0.0, 40 + 0.5 * kib, 0.0});
  return pts;
}
}  // namespace

TEST_CASE("clean curves: the first size after the lines cross") {
  const Crossover x = find_crossover(clean_curve());
  REQUIRE(x.found);
  CHECK(x.bytes == (64u << 10));
  CHECK_FALSE(x.at_smallest);
  // 74 vs 72 us: a 2.7 % gain, a win beyond the 2 % margin.
  CHECK(x.speedup == doctest::Approx(74.0 / 72.0));
  CHECK(x.min_speedup_above == doctest::Approx(74.0 / 72.0));
  CHECK(x.interp_bytes > (32u << 10));
  CHECK(x.interp_bytes < (64u << 10));
}

TEST_CASE("no win anywhere, or a loss at the largest size: no crossover") {
  auto pts = clean_curve();
  for (auto& p : pts) p.cand_us = p.base_us * 1.5;
  CHECK_FALSE(find_crossover(pts).found);
  pts = clean_curve();
  pts.back().cand_us = pts.back().base_us * 1.2;
  CHECK_FALSE(find_crossover(pts).found);
  CHECK_FALSE(find_crossover({}).found);
}

TEST_CASE("wins everywhere: crossover at the smallest size, flagged") {
  auto pts = clean_curve();
  for (auto& p : pts) p.cand_us = p.base_us * 0.5;
  const Crossover x = find_crossover(pts);
  REQUIRE(x.found);
  CHECK(x.at_smallest);
  CHECK(x.bytes == (4u << 10));
  CHECK(x.speedup == doctest::Approx(2.0));
}

TEST_CASE("ties are neither the crossover nor a break") {
  auto pts = clean_curve();
  pts[4].cand_us = pts[4].base_us * 0.99;  // 64 KiB only 1 % faster: a tie, crossover moves up
  CHECK(find_crossover(pts).bytes == (128u << 10));
  pts = clean_curve();
  pts[7].cand_us = pts[7].base_us * 1.01;  // a tie among wins above the crossover keeps it
  CHECK(find_crossover(pts).bytes == (64u << 10));
  for (auto& p : pts) p.cand_us = p.base_us;  // all ties: nothing was seen to pay
  CHECK_FALSE(find_crossover(pts).found);
}

TEST_CASE("non-monotone: a real loss above wins pushes the crossover above it") {
  auto pts = clean_curve();
  pts[6].cand_us = pts[6].base_us * 1.3;  // 256 KiB loses clearly
  const Crossover x = find_crossover(pts);
  REQUIRE(x.found);
  CHECK(x.bytes == (512u << 10));
  CHECK(x.outcomes[6] == Outcome::loss);
}

TEST_CASE("noise widens the tie band: a noisy 8 % loss is a tie, a quiet one is a loss") {
  auto pts = clean_curve();
  pts[6].cand_us = pts[6].base_us * 1.08;
  pts[6].base_noise = pts[6].cand_noise = 0.1;
  CHECK(classify(pts[6], {}) == Outcome::tie);
  CHECK(find_crossover(pts).bytes == (64u << 10));
  pts[6].base_noise = pts[6].cand_noise = 0.001;
  CHECK(classify(pts[6], {}) == Outcome::loss);
  CHECK(find_crossover(pts).bytes == (512u << 10));
}

TEST_CASE("unsorted input is sorted first") {
  auto pts = clean_curve();
  std::swap(pts[0], pts[9]);
  std::swap(pts[3], pts[5]);
  CHECK(find_crossover(pts).bytes == (64u << 10));
}
