#include "bench/host/stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace fp8wire::bench {

namespace {
double percentile_sorted(const std::vector<double>& v, double q) {
  if (v.empty()) return 0.0;
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return v[lo] + (v[hi] - v[lo]) * frac;
}
}  // namespace

Summary summarize(std::vector<double> values) {
  Summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.n = values.size();
  s.min = values.front();
  s.max = values.back();
  s.median = percentile_sorted(values, 0.5);
  s.p25 = percentile_sorted(values, 0.25);
  s.p75 = percentile_sorted(values, 0.75);
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(s.n);
  std::vector<double> dev(values.size());
  for (size_t i = 0; i < values.size(); ++i) dev[i] = std::fabs(values[i] - s.median);
  std::sort(dev.begin(), dev.end());
  s.mad = percentile_sorted(dev, 0.5);
  return s;
}

std::vector<double> max_over_ranks(const std::vector<std::vector<double>>& times) {
  size_t repeats = 0;
  for (const auto& r : times) repeats = std::max(repeats, r.size());
  std::vector<double> out(repeats, 0.0);
  for (const auto& r : times)
    for (size_t i = 0; i < r.size(); ++i) out[i] = std::max(out[i], r[i]);
  return out;
}

}  // namespace fp8wire::bench
