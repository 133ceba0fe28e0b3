#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "bench/host/check.hpp"

using namespace fp8wire;
using namespace fp8wire::bench;

TEST_CASE("bf16 and fp16 host conversions round to nearest even") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);                           // tie -> even
  CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -12)) == 0x3f81);   // above tie
  CHECK(float_to_half(1.0f) == 0x3c00);
  CHECK(float_to_half(-2.5f) == 0xc100);
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(70000.0f) == 0x7c00);
  CHECK(float_to_half(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);  // tie to even (zero)
  CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie -> even
  CHECK(std::isnan(half_to_float(float_to_half(NAN))));
  for (uint32_t h = 0; h < 0x7c00; ++h) CHECK(float_to_half(half_to_float(static_cast<uint16_t>(h))) == h);
}

TEST_CASE("inputs are exact in every dtype and sums over ranks stay exact") {
  for (uint64_t i = 0; i < 5000; ++i) {
    const float v = input_value(3, 1, i);
    CHECK(std::fabs(v) <= 32.0f);
    CHECK(bf16_to_float(float_to_bf16(v)) == v);
    CHECK(half_to_float(float_to_half(v)) == v);
  }
  // Different ranks and buffers see different data.
  int differ = 0;
  for (uint64_t i = 0; i < 100; ++i) differ += input_value(0, 0, i) != input_value(1, 0, i);
  CHECK(differ > 50);
}

namespace {
// The expected all-reduce output of `nranks` in `dtype`, as plain NCCL must produce it.
std::vector<uint16_t> expected_bf16_all_reduce(int nranks, int buffer, uint64_t count) {
  std::vector<uint16_t> out(count);
  for (uint64_t i = 0; i < count; ++i) {
    float s = 0;
    for (int r = nranks - 1; r >= 0; --r) s += input_value(r, buffer, i);  // any order is exact
    out[i] = float_to_bf16(s);
  }
  return out;
}
}  // namespace

TEST_CASE("baseline check: exact output passes, one flipped element fails") {
  CheckSpec spec;
  spec.nranks = 4;
  spec.buffer = 2;
  spec.count = 4096;
  auto out = expected_bf16_all_reduce(4, 2, spec.count);
  LocalCheck c = check_output(spec, out.data());
  CHECK(c.mismatches == 0);
  CHECK(c.max_err_ratio == 0);
  CHECK(error_bound(spec) == 0);
  out[1234] ^= 1;  // one ulp off
  c = check_output(spec, out.data());
  CHECK(c.mismatches == 1);
  out[99] = 0xffff;  // NaN
  c = check_output(spec, out.data());
  CHECK(c.nonfinite == 1);
}

TEST_CASE("FP8 check: errors within the stated bound pass, beyond fail; hash tells outputs apart") {
  CheckSpec spec;
  spec.path = Path::two_shot;
  spec.nranks = 2;
  spec.count = 2048;
  const double bound = error_bound(spec);
  CHECK(bound == doctest::Approx(2 * 0.0625 + 1.0 / 128));
  auto out = expected_bf16_all_reduce(2, 0, spec.count);
  // Perturb every element by 5 % of its value: |err| <= 0.05 |x| <= 0.05 R, within the bound.
  std::vector<uint16_t> perturbed(out.size());
  for (size_t i = 0; i < out.size(); ++i) perturbed[i] = float_to_bf16(bf16_to_float(out[i]) * 1.05f);
  LocalCheck c = check_output(spec, perturbed.data());
  CHECK(c.mismatches == 0);
  CHECK(c.max_err_ratio > 0);
  CHECK(c.max_err_ratio <= bound);
  CHECK(c.hash != check_output(spec, out.data()).hash);
  // Zeroing the output is far beyond the bound wherever the sum is non-zero.
  std::vector<uint16_t> zeros(out.size(), 0);
  CHECK(check_output(spec, zeros.data()).mismatches > 100);
}

TEST_CASE("reduce-scatter and all-gather checks index the right slices") {
  const int n = 3;
  const uint64_t recv = 512;
  CheckSpec spec;
  spec.collective = Collective::reduce_scatter;
  spec.dtype = DType::f32;
  spec.nranks = n;
  spec.rank = 2;
  spec.count = recv;
  std::vector<float> out(recv);
  for (uint64_t j = 0; j < recv; ++j)
    for (int r = 0; r < n; ++r) out[j] += input_value(r, 0, 2 * recv + j);
  CHECK(check_output(spec, out.data()).mismatches == 0);
  spec.rank = 1;  // the wrong slice for this output
  CHECK(check_output(spec, out.data()).mismatches > 0);

  spec.collective = Collective::all_gather;
  spec.dtype = DType::f16;
  spec.rank = 0;
  std::vector<uint16_t> gathered(recv * n);
  for (uint64_t j = 0; j < gathered.size(); ++j) gathered[j] = float_to_half(input_value(static_cast<int>(j / recv), 0, j % recv));
  CHECK(check_output(spec, gathered.data()).mismatches == 0);
}

TEST_CASE("all-to-all check: chunk j from rank j's slice for this rank, the own chunk exact") {
  const int n = 4, rank = 1;
  const uint64_t count = 300;  // per peer
  CheckSpec spec;
  spec.collective = Collective::all_to_all;
  spec.path = Path::one_shot;
  spec.dtype = DType::bf16;
  spec.nranks = n;
  spec.rank = rank;
  spec.count = count;
  std::vector<uint16_t> out(count * n);
  auto expected = [&](uint64_t j) { return input_value(static_cast<int>(j / count), 0, rank * count + j % count); };
  for (uint64_t j = 0; j < out.size(); ++j) out[j] = float_to_bf16(expected(j));
  CHECK(check_output(spec, out.data()).mismatches == 0);
  // Within one quantization of another rank's chunk: passes; the same in its own chunk: fails.
  std::vector<uint16_t> off = out;
  const uint64_t theirs = 2 * count + 7, mine = rank * count + 7;
  off[theirs] = float_to_bf16(expected(theirs) * 1.01f);
  CHECK(check_output(spec, off.data()).mismatches == 0);
  off[mine] = float_to_bf16(expected(mine) == 0 ? 1e-3f : expected(mine) * 1.01f);
  CHECK(check_output(spec, off.data()).mismatches == 1);
  // Another rank's slices: wrong.
  spec.rank = 2;
  CHECK(check_output(spec, out.data()).mismatches > 0);
  CHECK(quantizations(Collective::all_to_all, Path::one_shot, n) == 1);
  CHECK(quantizations(Collective::all_to_all, Path::passthrough, n) == 0);
}

TEST_CASE("message check: the previous rank's input, exact in plain NCCL, within one quantization in FP8") {
  const int n = 3;
  const uint64_t count = 1000;  // not a multiple of the block
  CheckSpec spec;
  spec.collective = Collective::send_recv;
  spec.dtype = DType::bf16;
  spec.nranks = n;
  spec.rank = 0;  // receives from rank 2
  spec.buffer = 1;
  spec.count = count;
  std::vector<uint16_t> out(count);
  for (uint64_t j = 0; j < count; ++j) out[j] = float_to_bf16(input_value(2, 1, j));
  CHECK(error_bound(spec) == 0);
  CHECK(check_output(spec, out.data()).mismatches == 0);
  out[17] ^= 1;  // plain NCCL: one ulp off is a mismatch
  CHECK(check_output(spec, out.data()).mismatches == 1);
  spec.path = Path::one_shot;
  CHECK(quantizations(Collective::send_recv, Path::one_shot, n) == 1);
  CHECK(check_output(spec, out.data()).mismatches == 0);  // FP8: within the bound
  // The sum over ranks (an all-reduce's answer) or the own input is not this message.
  spec.rank = 2;
  CHECK(check_output(spec, out.data()).mismatches > 0);
}

TEST_CASE("quantization counts per path") {
  CHECK(quantizations(Collective::all_reduce, Path::passthrough, 8) == 0);
  CHECK(quantizations(Collective::all_reduce, Path::two_shot, 8) == 2);
  CHECK(quantizations(Collective::all_reduce, Path::one_shot, 8) == 1);
  CHECK(quantizations(Collective::all_reduce, Path::ring, 8) == 8);
  CHECK(quantizations(Collective::reduce_scatter, Path::ring, 8) == 7);
  CHECK(quantizations(Collective::all_gather, Path::two_shot, 8) == 1);
  CheckSpec e5;
  e5.path = Path::one_shot;
  e5.fp8 = Fp8Format::e5m2;
  e5.scale = ScaleType::e8m0;
  CHECK(error_bound(e5) == doctest::Approx(0.125 * 2 + 1.0 / 128));
}
