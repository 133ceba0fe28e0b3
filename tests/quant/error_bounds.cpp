// Prints a markdown table of the codec's error, per format x scale type x rounding, on normal and
// heavy-tailed data (Student-t, 3 degrees of freedom; signed lognormal, sigma 2), for the docs.
//   rel rms      = sqrt(sum (x - y)^2 / sum x^2)
//   max |err|/amax = the largest element error relative to its block's amax
//   max rel (normal range) = max |x - y| / |x| over elements that quantize into the FP8 normal range
// Usage: error_bounds [count] [block]   (defaults 1048576, 128)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "quant/reference.hpp"
#include "tests/quant/sample_data.hpp"

using namespace fp8wire;
using namespace fp8wire::quant;

namespace {


const char* scale_name(ScaleType s) { return s == ScaleType::fp32 ? "fp32" : s == ScaleType::bf16 ? "bf16" : "e8m0"; }

}  // namespace

int main(int argc, char** argv) {
  const size_t count = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (1u << 20);
  const uint32_t block = argc > 2 ? uint32_t(std::strtoul(argv[2], nullptr, 10)) : 128;
  std::printf("| data | format | scale | rounding | bytes/elem | rel rms | max abs err / block amax | max rel (normal range) |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  using testdata::Distribution;
  for (Distribution dist : {Distribution::normal, Distribution::student_t3, Distribution::signed_lognormal}) {
    const char* kind = testdata::label(dist);
    const auto x = testdata::sample(dist, count, 2024);
    for (Fp8Format fmt : {Fp8Format::e4m3, Fp8Format::e5m2})
      for (ScaleType st : {ScaleType::fp32, ScaleType::bf16, ScaleType::e8m0})
        for (Rounding r : {Rounding::nearest, Rounding::stochastic}) {
          const WireFormat f{fmt, st, block, r, 7};
          if (const char* e = validate(f)) {
            std::fprintf(stderr, "error_bounds: %s\n", e);
            return 2;
          }
          std::vector<uint8_t> wire(chunk_bytes(count, f));
          std::vector<float> y(count);
          ref::quantize(x.data(), ElemType::f32, count, wire.data(), Segmented::single(count, f), f);
          ref::dequantize(wire.data(), Segmented::single(count, f), count, y.data(), ElemType::f32, f);
          double se = 0, sx = 0, max_blk = 0, max_rel = 0;
          const double fp8_min_normal = fmt == Fp8Format::e4m3 ? std::ldexp(1.0, -6) : std::ldexp(1.0, -14);
          for (size_t b0 = 0; b0 < count; b0 += block) {
            const size_t b1 = std::min(count, b0 + block);
            double amax = 0;
            for (size_t i = b0; i < b1; ++i) amax = std::max(amax, double(std::fabs(x[i])));
            for (size_t i = b0; i < b1; ++i) {
              const double err = std::fabs(double(x[i]) - double(y[i]));
              se += err * err;
              sx += double(x[i]) * x[i];
              if (amax > 0) max_blk = std::max(max_blk, err / amax);
              if (amax > 0 && std::fabs(x[i]) / amax * fp8_max(fmt) >= fp8_min_normal * 2)
                max_rel = std::max(max_rel, err / std::fabs(x[i]));
            }
          }
          std::printf("| %s | %s | %s | %s | %.4f | %.3e | %.3e | %.3e |\n", kind, fmt == Fp8Format::e4m3 ? "e4m3" : "e5m2",
                      scale_name(st), r == Rounding::nearest ? "nearest" : "stochastic",
                      double(information_bytes(count, f)) / double(count), std::sqrt(se / sx), max_blk, max_rel);
        }
  }
  return 0;
}
