// Statistics of repeated timings: median and spread, robust to the odd slow repeat.
#pragma once

#include <cstddef>
#include <vector>

namespace fp8wire::bench {

struct Summary {
  size_t n = 0;
  double median = 0, p25 = 0, p75 = 0, min = 0, max = 0, mean = 0;
  double mad = 0;  // median absolute deviation from the median
  // Robust relative noise: 1.4826 * MAD / median (the standard deviation for normal data, but a
  // single outlier among the repeats barely moves it).
  double rel_noise() const { return median > 0 ? 1.4826 * mad / median : 0.0; }
  // Half the interquartile range relative to the median, the "spread %" column of the table.
  double rel_spread() const { return median > 0 ? 0.5 * (p75 - p25) / median : 0.0; }
};

// Percentiles by linear interpolation between order statistics. Empty input gives a zero Summary.
Summary summarize(std::vector<double> values);

// Per repeat, the slowest rank: a collective is done only when every rank is done (nccl-tests
// reduces its timings with max too). times[rank][repeat]; ranks with fewer repeats are ignored
// beyond their length.
std::vector<double> max_over_ranks(const std::vector<std::vector<double>>& times);

}  // namespace fp8wire::bench
