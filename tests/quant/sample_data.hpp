// Test data for the codec: normal, and two heavy-tailed distributions with a few large values per
// block (Student-t with 3 degrees of freedom; signed lognormal, sigma 2). Shared by the reference
// tests and the error-bound table so both speak of the same data.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace fp8wire::quant::testdata {

enum class Distribution { normal, student_t3, signed_lognormal };

inline const char* label(Distribution d) {
  switch (d) {
    case Distribution::normal: return "normal";
    case Distribution::student_t3: return "student-t(3)";
    case Distribution::signed_lognormal: return "lognormal(0,2)";
  }
  return "?";
}

inline std::vector<float> sample(Distribution kind, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  if (kind == Distribution::normal) {
    std::normal_distribution<float> d;
    for (float& v : x) v = d(rng);
  } else if (kind == Distribution::student_t3) {
    std::student_t_distribution<float> d(3);
    for (float& v : x) v = d(rng);
  } else {
    std::lognormal_distribution<float> d(0, 2);
    std::bernoulli_distribution s;
    for (float& v : x) v = s(rng) ? d(rng) : -d(rng);
  }
  return x;
}

}  // namespace fp8wire::quant::testdata
