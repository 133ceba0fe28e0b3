#include "bench/host/crossover.hpp"

#include <algorithm>
#include <cmath>

namespace fp8wire::bench {

const char* to_string(Outcome o) {
  switch (o) {
    case Outcome::win: return "win";
    case Outcome::tie: return "tie";
    case Outcome::loss: return "loss";
  }
  return "?";
}

double point_tolerance(const CurvePoint& p, const CrossoverOptions& options) {
  const double combined = std::sqrt(p.base_noise * p.base_noise + p.cand_noise * p.cand_noise);
  return std::max(options.min_margin, options.noise_sigmas * combined);
}

Outcome classify(const CurvePoint& p, const CrossoverOptions& options) {
  if (!(p.base_us > 0) || !(p.cand_us > 0)) return Outcome::tie;  // no evidence either way
  const double tol = point_tolerance(p, options);
  // Relative to the baseline, so the tolerance means the same at 4 KiB and at 1 GiB.
  const double gain = (p.base_us - p.cand_us) / p.base_us;
  if (gain > tol) return Outcome::win;
  if (gain < -tol) return Outcome::loss;
  return Outcome::tie;
}

Crossover find_crossover(std::vector<CurvePoint> points, const CrossoverOptions& options) {
  std::stable_sort(points.begin(), points.end(),
                   [](const CurvePoint& a, const CurvePoint& b) { return a.bytes < b.bytes; });
  Crossover result;
  result.outcomes.reserve(points.size());
  for (const auto& p : points) result.outcomes.push_back(classify(p, options));

  // Walk down from the largest size while no loss has been seen; remember the last win.
  long crossover = -1;
  for (long i = static_cast<long>(points.size()) - 1; i >= 0; --i) {
    const Outcome o = result.outcomes[static_cast<size_t>(i)];
    if (o == Outcome::loss) break;
    if (o == Outcome::win) crossover = i;
  }
  if (crossover < 0) return result;

  const size_t c = static_cast<size_t>(crossover);
  result.found = true;
  result.at_smallest = (c == 0);
  result.bytes = points[c].bytes;
  result.speedup = points[c].base_us / points[c].cand_us;
  result.tolerance = point_tolerance(points[c], options);
  result.min_speedup_above = result.speedup;
  for (size_t i = c; i < points.size(); ++i)
    if (points[i].base_us > 0 && points[i].cand_us > 0)
      result.min_speedup_above = std::min(result.min_speedup_above, points[i].base_us / points[i].cand_us);

  // Where between the previous size and the crossover the speedup reaches 1 (linear in log size
  // and log speedup); the measured size is what the profile uses, this is for the report.
  result.interp_bytes = points[c].bytes;
  if (c > 0 && points[c - 1].base_us > 0 && points[c - 1].cand_us > 0) {
    const double s0 = std::log(points[c - 1].base_us / points[c - 1].cand_us);
    const double s1 = std::log(result.speedup);
    if (s0 < 0 && s1 > 0) {
      const double x0 = std::log(static_cast<double>(points[c - 1].bytes));
      const double x1 = std::log(static_cast<double>(points[c].bytes));
      const double x = x0 + (x1 - x0) * (-s0) / (s1 - s0);
      result.interp_bytes = static_cast<uint64_t>(std::llround(std::exp(x)));
    }
  }
  return result;
}

}  // namespace fp8wire::bench
