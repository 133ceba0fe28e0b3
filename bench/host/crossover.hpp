// Crossover detection: the smallest measured size from which fp8wire wins at every larger size.
//
// Each size is classified by comparing medians with a tolerance that grows with the measured noise:
//   win  : candidate faster than baseline by more than the tolerance,
//   loss : candidate slower than baseline by more than the tolerance,
//   tie  : within the tolerance (noise cannot tell them apart).
// The crossover is the smallest size that is a win with no loss at any larger size. A tie above it
// does not break the run (it is noise, not evidence of a loss); a tie is never the crossover itself,
// so a profile never switches on FP8 where it was not seen to pay. A non-monotone curve (a loss
// between two wins) pushes the crossover above the loss.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp8wire::bench {

struct CurvePoint {
  uint64_t bytes = 0;
  double base_us = 0;      // baseline median
  double base_noise = 0;   // baseline relative noise (Summary::rel_noise)
  double cand_us = 0;      // candidate median
  double cand_noise = 0;
};

enum class Outcome { win, tie, loss };
const char* to_string(Outcome);

struct CrossoverOptions {
  double min_margin = 0.02;    // a difference below 2 % is a tie whatever the noise says
  double noise_sigmas = 2.0;   // tolerance = max(min_margin, noise_sigmas * combined relative noise)
};

struct Crossover {
  bool found = false;          // false: fp8wire does not win at the top of the measured range
  bool at_smallest = false;    // found at the smallest size measured: the true crossover may be lower
  uint64_t bytes = 0;          // the crossover size (a measured size); 0 when not found
  uint64_t interp_bytes = 0;   // log-log interpolation of where the speedup crosses 1 below `bytes`
  double speedup = 0;          // baseline / candidate at the crossover
  double min_speedup_above = 0;// smallest speedup at and above the crossover (the margin kept)
  double tolerance = 0;        // the tolerance used at the crossover point
  std::vector<Outcome> outcomes;  // per input point
};

// Points must be sorted by size (ascending); unsorted input is sorted by the function.
Crossover find_crossover(std::vector<CurvePoint> points, const CrossoverOptions& options = {});

// Tolerance used for one point (exposed for tests and the report).
double point_tolerance(const CurvePoint& p, const CrossoverOptions& options);
Outcome classify(const CurvePoint& p, const CrossoverOptions& options);

}  // namespace fp8wire::bench
