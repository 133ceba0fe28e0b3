// CPU reference codec: the format's definition, checked against hand-computed values, exhaustive
// conversions and statistical properties. Runs in CI (no GPU).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant/fp8_math.hpp"
#include "quant/reference.hpp"
#include "tests/quant/sample_data.hpp"

#if __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>   // NVIDIA's host emulation of the sm_89+ cvt instructions: a second opinion
#define FP8WIRE_HAVE_CUDA_FP8 1
#endif

using namespace fp8wire;
using namespace fp8wire::quant;
namespace m = fp8wire::quant::math;

namespace {

WireFormat make_format(Fp8Format f, ScaleType s, uint32_t block = 128, Rounding r = Rounding::nearest,
                       uint64_t seed = 1) {
  return WireFormat{f, s, block, r, seed};
}

std::vector<uint8_t> encode(const std::vector<float>& x, const WireFormat& f, uint64_t sr_offset = 0) {
  std::vector<uint8_t> wire(chunk_bytes(x.size(), f), 0xAB);
  REQUIRE(ref::quantize(x.data(), ElemType::f32, x.size(), wire.data(), Segmented::single(x.size(), f), f,
                        sr_offset) == nullptr);
  return wire;
}

std::vector<float> decode(const std::vector<uint8_t>& wire, size_t count, const WireFormat& f) {
  std::vector<float> y(count);
  REQUIRE(ref::dequantize(wire.data(), Segmented::single(count, f), count, y.data(), ElemType::f32, f) == nullptr);
  return y;
}

std::vector<float> round_trip(const std::vector<float>& x, const WireFormat& f) {
  return decode(encode(x, f), x.size(), f);
}

uint32_t bits(float v) { return m::f32_bits(v); }

const Fp8Format kFormats[] = {Fp8Format::e4m3, Fp8Format::e5m2};
const ScaleType kScales[] = {ScaleType::fp32, ScaleType::bf16, ScaleType::e8m0};

int mant_bits(Fp8Format f) { return f == Fp8Format::e4m3 ? 3 : 2; }
int min_exp(Fp8Format f) { return f == Fp8Format::e4m3 ? -6 : -14; }

// Names for CAPTURE (the enums' to_string lives in fp8wire_common, which this test does not link).
const char* name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }
const char* name(ScaleType s) { return s == ScaleType::fp32 ? "fp32" : s == ScaleType::bf16 ? "bf16" : "e8m0"; }

using testdata::Distribution;
using testdata::sample;

}  // namespace

TEST_CASE("wire sizes: 132 bytes per 128 elements by default, -48.4 % against bf16") {
  const WireFormat f{};
  CHECK(information_bytes(128, f) == 132);
  const double vs_bf16 = 100.0 * (double(information_bytes(1 << 20, f)) / double(2 << 20) - 1.0);
  CHECK(vs_bf16 == doctest::Approx(-48.4375));
  CHECK(chunk_bytes(130, f) == 144 + 16);
  CHECK(information_bytes(128, make_format(Fp8Format::e4m3, ScaleType::e8m0)) == 129);
}

TEST_CASE("format validation names the bad key") {
  WireFormat f{};
  f.block = 100;
  REQUIRE(validate(f) != nullptr);
  CHECK(std::string(validate(f)).find("block_size") != std::string::npos);
  f.block = 8192;
  CHECK(validate(f) != nullptr);
  f.block = 4096;
  CHECK(validate(f) == nullptr);
  CHECK(validate(1000, Segmented{100, 256}, WireFormat{}) != nullptr);   // not a multiple of the block
  CHECK(validate(1000, Segmented{256, 100}, WireFormat{}) != nullptr);   // stride too small
  CHECK(validate(1000, Segmented{256, chunk_bytes(256, WireFormat{})}, WireFormat{}) == nullptr);
  std::vector<float> x(10);
  std::vector<uint8_t> w(64);
  f.block = 48;
  CHECK(ref::quantize(x.data(), ElemType::f32, 10, w.data(), Segmented::single(10, f), f) != nullptr);
}

TEST_CASE("element conversions: exhaustive round trips of f16, bf16 and both FP8 formats") {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = m::f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      CHECK(m::f32_to_f16(f) == m::kCanonicalNan16);
    } else {
      REQUIRE(m::f32_to_f16(f) == h);
    }
    const float b = m::bf16_to_f32(uint16_t(h));
    REQUIRE(m::f32_to_bf16(b) == (std::isnan(b) ? m::kCanonicalNan16 : h));
  }
  for (uint32_t c = 0; c < 256; ++c) {
    const float e4 = m::fp8_to_f32_sw<Fp8Format::e4m3>(uint8_t(c));
    if (!std::isnan(e4)) REQUIRE(m::f32_to_fp8_rne_sw<Fp8Format::e4m3>(e4) == c);
    const float e5 = m::fp8_to_f32_sw<Fp8Format::e5m2>(uint8_t(c));
    if (std::isfinite(e5)) REQUIRE(m::f32_to_fp8_rne_sw<Fp8Format::e5m2>(e5) == c);
  }
  CHECK(m::fp8_to_f32_sw<Fp8Format::e4m3>(0x7E) == 448.0f);
  CHECK(m::fp8_to_f32_sw<Fp8Format::e5m2>(0x7B) == 57344.0f);
  CHECK(m::fp8_to_f32_sw<Fp8Format::e4m3>(0x01) == std::ldexp(1.0f, -9));
  CHECK(m::fp8_to_f32_sw<Fp8Format::e5m2>(0x01) == std::ldexp(1.0f, -16));
}

// The GPU software path's branch-free conversion must equal the reference on every rounding boundary:
// for each sign, exponent and rounding position p, mantissas (top << p) | low with low at and around
// 0, the half-way point and the all-ones pattern; plus random bit patterns (NaN/Inf included).
template <Fp8Format F>
void check_branchless_conversion() {
  std::vector<uint32_t> bits;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t e = 0; e < 256; ++e)
      for (uint32_t p = 1; p <= 23; ++p)
        for (uint32_t top = 0; top < 16; ++top) {
          const uint32_t half = 1u << (p - 1);
          for (uint32_t low : {0u, 1u, half - 1, half, half + 1, (1u << p) - 1}) {
            const uint32_t mant = ((top << p) | low) & 0x7FFFFFu;
            bits.push_back(sign | (e << 23) | mant);
          }
        }
  std::mt19937 rng(2024);
  for (int i = 0; i < 2000000; ++i) bits.push_back(rng());
  for (uint32_t b : bits) {
    const float v = m::bits_f32(b);
    if (m::f32_to_fp8_rne_branchless<F>(v) != m::f32_to_fp8_rne_sw<F>(v)) {
      INFO("input bits 0x" << std::hex << b);
      REQUIRE(m::f32_to_fp8_rne_branchless<F>(v) == m::f32_to_fp8_rne_sw<F>(v));
    }
  }
}

TEST_CASE("branch-free software conversion (GPU software path) equals the reference on every boundary") {
  check_branchless_conversion<Fp8Format::e4m3>();
  check_branchless_conversion<Fp8Format::e5m2>();
}

TEST_CASE("f32 -> f16 rounding agrees with the compiler's _Float16 on random and edge values") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  std::vector<uint32_t> cases = {0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x33000000u, 0x33000001u,
                                 0x33C00000u, 0x38800000u, 0x387FFFFFu, 0x80000000u, 0x7F800000u};
  for (int i = 0; i < 200000; ++i) cases.push_back(any(rng));
  for (uint32_t u : cases) {
    const float f = m::bits_f32(u);
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    REQUIRE_MESSAGE(m::f32_to_f16(f) == hb, "input bits " << u);
  }
}

TEST_CASE("saturation and round-to-nearest-even ties") {
  using E4 = m::Fp8Traits<Fp8Format::e4m3>;
  CHECK(m::f32_to_fp8_rne_sw<Fp8Format::e4m3>(500.0f) == E4::kMaxCode);
  CHECK(m::f32_to_fp8_rne_sw<Fp8Format::e4m3>(-1e30f) == (0x80 | E4::kMaxCode));
  CHECK(m::f32_to_fp8_rne_sw<Fp8Format::e4m3>(463.99f) == E4::kMaxCode);
  CHECK(m::f32_to_fp8_rne_sw<Fp8Format::e5m2>(70000.0f) == 0x7B);
  // e4m3: 1.0625 lies halfway between 1.0 (even) and 1.125 -> 1.0; 1.1875 between 1.125 and 1.25 (even) -> 1.25.
  CHECK(m::fp8_to_f32_sw<Fp8Format::e4m3>(m::f32_to_fp8_rne_sw<Fp8Format::e4m3>(1.0625f)) == 1.0f);
  CHECK(m::fp8_to_f32_sw<Fp8Format::e4m3>(m::f32_to_fp8_rne_sw<Fp8Format::e4m3>(1.1875f)) == 1.25f);
  CHECK(m::fp8_to_f32_sw<Fp8Format::e4m3>(m::f32_to_fp8_rne_sw<Fp8Format::e4m3>(1.0626f)) == 1.125f);
  // Subnormal ties: half the quantum -> 0, 1.5 quanta -> 2 quanta; sign kept on zero.
  CHECK(m::f32_to_fp8_rne_sw<Fp8Format::e4m3>(std::ldexp(1.0f, -10)) == 0x00);
  CHECK(m::f32_to_fp8_rne_sw<Fp8Format::e4m3>(std::ldexp(3.0f, -10)) == 0x02);
  CHECK(m::f32_to_fp8_rne_sw<Fp8Format::e4m3>(-std::ldexp(1.0f, -11)) == 0x80);
  CHECK(m::f32_to_fp8_rne_sw<Fp8Format::e4m3>(std::ldexp(15.0f, -10)) == 0x08);   // 7.5 quanta: tie to even 8 = min normal
  // e5m2: 1.125 between 1.0 (even) and 1.25 -> 1.0; 1.375 between 1.25 and 1.5 (even) -> 1.5.
  CHECK(m::fp8_to_f32_sw<Fp8Format::e5m2>(m::f32_to_fp8_rne_sw<Fp8Format::e5m2>(1.125f)) == 1.0f);
  CHECK(m::fp8_to_f32_sw<Fp8Format::e5m2>(m::f32_to_fp8_rne_sw<Fp8Format::e5m2>(1.375f)) == 1.5f);
  // Through the codec: with an fp32 scale the block's largest element maps to the largest code
  // (x * (1/s) may land a hair above 448 and saturates); bf16 and e8m0 scales round up, so it never does.
  std::vector<float> x(128, 1.0f);
  x[5] = -1234.5f;
  CHECK(encode(x, make_format(Fp8Format::e4m3, ScaleType::fp32))[5] == (0x80 | E4::kMaxCode));
  for (ScaleType st : {ScaleType::bf16, ScaleType::e8m0}) {
    const auto y = round_trip(x, make_format(Fp8Format::e4m3, st));
    CHECK(std::fabs(y[5] + 1234.5f) <= 1234.5f / 16);
  }
}

TEST_CASE("exactly representable values round-trip unchanged, every format and scale type") {
  for (Fp8Format fmt : kFormats)
    for (ScaleType st : kScales) {
      CAPTURE(name(fmt));
      CAPTURE(name(st));
      const WireFormat f = make_format(fmt, st);
      // amax = FP8_MAX makes the scale exactly 1 in all three scale types.
      std::vector<float> x;
      for (uint32_t c = 0; c < 256 && x.size() < 128; ++c) {
        const float v = fmt == Fp8Format::e4m3 ? m::fp8_to_f32_sw<Fp8Format::e4m3>(uint8_t(c))
                                               : m::fp8_to_f32_sw<Fp8Format::e5m2>(uint8_t(c));
        if (std::isfinite(v)) x.push_back(v);
      }
      x.resize(128, 0.0f);
      x[127] = fp8_max(fmt);
      const auto y = round_trip(x, f);
      for (size_t i = 0; i < x.size(); ++i) REQUIRE(bits(y[i]) == bits(x[i]));
    }
}

TEST_CASE("zero blocks, partial blocks and padding bytes") {
  for (ScaleType st : kScales) {
    const WireFormat f = make_format(Fp8Format::e4m3, st);
    std::vector<float> x(130, 0.0f);
    x[128] = 3.0f;
    x[129] = -1.5f;
    const auto wire = encode(x, f);
    REQUIRE(wire.size() == chunk_bytes(130, f));
    for (size_t i = 0; i < 128; ++i) CHECK(wire[i] == 0);
    for (size_t i = 130; i < payload_bytes(130); ++i) CHECK(wire[i] == 0);           // payload padding
    const uint8_t* scales = wire.data() + payload_bytes(130);
    for (size_t i = 0; i < scale_bytes(st); ++i) CHECK(scales[i] == 0);               // zero block: scale 0
    for (size_t i = 2 * scale_bytes(st); i < scales_bytes(130, f); ++i) CHECK(scales[i] == 0);  // scale padding
    const auto y = decode(wire, 130, f);
    for (size_t i = 0; i < 128; ++i) CHECK(y[i] == 0.0f);
    // 3.0 is the block's amax: it round-trips to within the scale's own rounding.
    CHECK(y[128] == doctest::Approx(3.0f).epsilon(1.0 / 128));
    CHECK(y[129] == doctest::Approx(-1.5f).epsilon(1.0 / 16));
  }
  // A block too small to scale (amax/448 < FLT_MIN) is a zero block too.
  std::vector<float> tiny(32, 1e-40f);
  const WireFormat f = make_format(Fp8Format::e4m3, ScaleType::fp32, 32);
  for (float v : round_trip(tiny, f)) CHECK(v == 0.0f);
  // Any count works, including 1.
  CHECK(round_trip({2.5f}, f)[0] == 2.5f);
}

TEST_CASE("a block holding NaN or Inf decodes to NaN; other blocks are unaffected") {
  for (Fp8Format fmt : kFormats)
    for (ScaleType st : kScales) {
      const WireFormat f = make_format(fmt, st, 32);
      std::vector<float> x(96, 1.0f);
      x[40] = NAN;
      x[70] = -INFINITY;
      const auto wire = encode(x, f);
      const uint8_t* scales = wire.data() + payload_bytes(96);
      uint32_t stored = 0;
      std::memcpy(&stored, scales + scale_bytes(st), scale_bytes(st));
      CHECK(stored == (st == ScaleType::fp32 ? m::kCanonicalNanF32 : st == ScaleType::bf16 ? m::kCanonicalNan16 : m::kE8m0Nan));
      for (size_t i = 32; i < 96; ++i) CHECK(wire[i] == 0);
      std::vector<uint16_t> ybf(96);
      REQUIRE(ref::dequantize(wire.data(), Segmented::single(96, f), 96, ybf.data(), ElemType::bf16, f) == nullptr);
      const auto y = decode(wire, 96, f);
      for (size_t i = 0; i < 32; ++i) CHECK(y[i] == doctest::Approx(1.0f).epsilon(1.0 / 128));
      for (size_t i = 32; i < 96; ++i) {
        CHECK(bits(y[i]) == m::kCanonicalNanF32);
        CHECK(ybf[i] == m::kCanonicalNan16);
      }
    }
}

TEST_CASE("scale types: fp32 exact quotient, bf16 rounded, e8m0 the next power of two") {
  std::vector<float> x(128, 0.25f);
  x[3] = 1000.0f;
  const float s32 = 1000.0f / 448.0f;
  {
    const WireFormat f = make_format(Fp8Format::e4m3, ScaleType::fp32);
    const auto w = encode(x, f);
    float s;
    std::memcpy(&s, w.data() + 128, 4);
    CHECK(s == s32);
  }
  {
    const WireFormat f = make_format(Fp8Format::e4m3, ScaleType::bf16);
    const auto w = encode(x, f);
    uint16_t s;
    std::memcpy(&s, w.data() + 128, 2);
    CHECK(m::bf16_to_f32(s) >= s32);                                // rounded up ...
    CHECK(m::bf16_to_f32(uint16_t(s - 1)) < s32);                   // ... to the next bf16
  }
  {
    const WireFormat f = make_format(Fp8Format::e4m3, ScaleType::e8m0);
    const auto w = encode(x, f);
    CHECK(w[128] == 127 + 2);   // 2.23 -> 4 = 2^2
    const auto y = decode(w, 128, f);
    CHECK(y[3] == 1024.0f);     // 1000/4 = 250 rounds to 256 in e4m3
  }
}

TEST_CASE("stochastic rounding: reproducible, independent of how the buffer is cut, unbiased") {
  const WireFormat f = make_format(Fp8Format::e4m3, ScaleType::fp32, 128, Rounding::stochastic, 42);
  const auto x = sample(Distribution::normal, 4096, 3);
  const auto a = encode(x, f);
  CHECK(a == encode(x, f));
  WireFormat g = f;
  g.seed = 43;
  CHECK(a != encode(x, g));
  // Second half quantized alone with sr_offset = 2048 gives the same bytes as the whole call.
  std::vector<float> half(x.begin() + 2048, x.end());
  const auto b = encode(half, f, 2048);
  CHECK(std::memcmp(a.data() + 2048, b.data(), 2048) == 0);
  // Unbiased: a value between two grid points averages to itself over many indices.
  std::vector<float> c(1 << 16, 1.03f);
  for (size_t i = 0; i < c.size(); i += 128) c[i] = 448.0f;   // scale exactly 1
  const auto yc = round_trip(c, f);
  double sum = 0;
  size_t n = 0;
  bool on_grid = true;
  for (size_t i = 0; i < c.size(); ++i)
    if (i % 128) {
      on_grid &= yc[i] == 1.0f || yc[i] == 1.125f;
      sum += yc[i];
      ++n;
    }
  CHECK(on_grid);
  CHECK(sum / n == doctest::Approx(1.03).epsilon(0.002));
  // Subnormal range too: 1.3 quanta.
  const float q = std::ldexp(1.0f, -9);
  std::vector<float> d(1 << 16, 1.3f * q);
  for (size_t i = 0; i < d.size(); i += 128) d[i] = 448.0f;
  const auto yd = round_trip(d, f);
  sum = 0;
  for (size_t i = 0; i < d.size(); ++i)
    if (i % 128) sum += yd[i] / q;
  CHECK(sum / n == doctest::Approx(1.3).epsilon(0.005));
}

TEST_CASE("documented error bounds hold on normal and heavy-tailed data") {
  // Per element (s = the block's decode scale, m = mantissa bits, emin = smallest normal exponent):
  //   nearest:     |x - y| <= 2^-(m+1) |x| + s 2^(emin-m-1)   (+ 2^-22 |x| for the two fp32 roundings)
  //   stochastic:  |x - y| <  2^-m |x|     + s 2^(emin-m)
  for (Distribution kind : {Distribution::normal, Distribution::student_t3, Distribution::signed_lognormal})
    for (Fp8Format fmt : kFormats)
      for (ScaleType st : kScales)
        for (Rounding r : {Rounding::nearest, Rounding::stochastic}) {
          const char* data = testdata::label(kind);
          CAPTURE(data);
          CAPTURE(name(fmt));
          CAPTURE(name(st));
          const WireFormat f = make_format(fmt, st, 128, r, 9);
          const auto x = sample(kind, 1 << 14, 11);
          const auto wire = encode(x, f);
          const auto y = decode(wire, x.size(), f);
          const uint8_t* scales = wire.data() + payload_bytes(x.size());
          const int mb = mant_bits(fmt);
          const double rel = r == Rounding::nearest ? std::ldexp(1.0, -(mb + 1)) : std::ldexp(1.0, -mb);
          const double sub = r == Rounding::nearest ? std::ldexp(1.0, min_exp(fmt) - mb - 1) : std::ldexp(1.0, min_exp(fmt) - mb);
          bool within = true;
          for (size_t i = 0; i < x.size(); ++i) {
            uint32_t stored = 0;
            std::memcpy(&stored, scales + (i / 128) * scale_bytes(st), scale_bytes(st));
            const double s = m::decode_scale(stored, st);
            const double bound = (rel + std::ldexp(1.0, -22)) * std::fabs(x[i]) + sub * s;
            within &= std::fabs(double(x[i]) - double(y[i])) <= bound;
          }
          CHECK(within);
        }
}

TEST_CASE("segmented layout: each segment is an independent chunk at its stride") {
  const WireFormat f = make_format(Fp8Format::e4m3, ScaleType::fp32, 128);
  const auto x = sample(Distribution::normal, 1000, 5);
  const Segmented layout{256, chunk_bytes(256, f) + 32};
  std::vector<uint8_t> wire(layout.seg_stride * 4, 0xCD);
  REQUIRE(ref::quantize(x.data(), ElemType::f32, x.size(), wire.data(), layout, f) == nullptr);
  for (size_t s = 0; s < 4; ++s) {
    const size_t n = segment_elems(1000, layout, s);
    CHECK(n == (s < 3 ? 256u : 232u));
    std::vector<float> part(x.begin() + s * 256, x.begin() + s * 256 + n);
    const auto single = encode(part, f, s * 256);
    CHECK(std::memcmp(wire.data() + s * layout.seg_stride, single.data(), single.size()) == 0);
    for (size_t i = chunk_bytes(n, f); i < layout.seg_stride; ++i) CHECK(wire[s * layout.seg_stride + i] == 0xCD);
  }
  std::vector<float> y(1000);
  REQUIRE(ref::dequantize(wire.data(), layout, 1000, y.data(), ElemType::f32, f) == nullptr);
  const auto y_single = round_trip(x, f);
  CHECK(std::memcmp(y.data(), y_single.data(), 4000) == 0);   // blocks align, so values agree
}

TEST_CASE("reduce: fp32 sum in input order vs fp64; requantized output equals quantize(sum)") {
  for (ScaleType st : kScales) {
    CAPTURE(name(st));
    const WireFormat f = make_format(Fp8Format::e4m3, st, 128);
    const size_t n = 777;
    const int k = 8;
    std::vector<std::vector<uint8_t>> chunks;
    std::vector<const void*> ptrs;
    std::vector<std::vector<float>> decoded;
    for (int j = 0; j < k; ++j) {
      chunks.push_back(encode(sample(Distribution::student_t3, n, 100 + j), f));
      decoded.push_back(decode(chunks.back(), n, f));
    }
    for (auto& c : chunks) ptrs.push_back(c.data());
    std::vector<float> out(n);
    REQUIRE(ref::dequantize_reduce(ptrs.data(), k, nullptr, ElemType::f32, 0, n, 0.125f,
                                   ref::ReduceOutput{out.data(), ElemType::f32, nullptr}, f) == nullptr);
    bool within = true, ordered = true;
    for (size_t i = 0; i < n; ++i) {
      double exact = 0, mag = 0;
      for (int j = 0; j < k; ++j) { exact += decoded[j][i]; mag += std::fabs(decoded[j][i]); }
      within &= std::fabs(out[i] - exact * 0.125) <= k * std::ldexp(1.0, -24) * mag * 0.125 + 1e-30;
      float seq = decoded[0][i];
      for (int j = 1; j < k; ++j) seq += decoded[j][i];
      ordered &= bits(out[i]) == bits(seq * 0.125f);   // the order is part of the definition
    }
    CHECK(within);
    CHECK(ordered);
    std::vector<uint8_t> wire(chunk_bytes(n, f));
    REQUIRE(ref::dequantize_reduce(ptrs.data(), k, nullptr, ElemType::f32, 0, n, 0.125f,
                                   ref::ReduceOutput{nullptr, ElemType::f32, wire.data()}, f) == nullptr);
    CHECK(wire == encode(out, f));
    // Mixed: a plain addend at position 3.
    const auto plain = sample(Distribution::normal, n, 9);
    std::vector<float> mixed(n);
    REQUIRE(ref::dequantize_reduce(ptrs.data(), k, plain.data(), ElemType::f32, 3, n, 1.0f,
                                   ref::ReduceOutput{mixed.data(), ElemType::f32, nullptr}, f) == nullptr);
    bool mixed_ok = true;
    for (size_t i = 0; i < n; ++i) {
      float seq = decoded[0][i];
      for (int j = 1; j < k; ++j) {
        if (j == 3) seq += plain[i];
        seq += decoded[j][i];
      }
      mixed_ok &= bits(mixed[i]) == bits(seq);
    }
    CHECK(mixed_ok);
  }
  std::vector<float> out(4);
  CHECK(ref::dequantize_reduce(nullptr, 0, nullptr, ElemType::f32, 0, 4, 1.0f,
                               ref::ReduceOutput{out.data(), ElemType::f32, nullptr}, WireFormat{}) != nullptr);
}

TEST_CASE("quantize_with_residual: the residual carries what the wire lost; NaN blocks reset it") {
  const WireFormat f = make_format(Fp8Format::e4m3, ScaleType::fp32, 32);
  auto x = sample(Distribution::normal, 64, 21);
  x[40] = NAN;
  std::vector<float> residual(64, 0.001f);
  const std::vector<float> before = residual;
  std::vector<uint8_t> wire(chunk_bytes(64, f));
  REQUIRE(ref::quantize_with_residual(x.data(), ElemType::f32, 64, residual.data(), wire.data(),
                                      Segmented::single(64, f), f) == nullptr);
  const auto y = decode(wire, 64, f);
  for (size_t i = 0; i < 32; ++i) {
    const float sum = x[i] + before[i];
    CHECK(bits(residual[i]) == bits(sum - y[i]));
    CHECK(std::fabs(residual[i]) <= std::fabs(sum) * 0.0625f + 1e-6f);
  }
  for (size_t i = 32; i < 64; ++i) CHECK(residual[i] == 0.0f);
  // The wire bytes are those of quantize(x + residual).
  std::vector<float> sum(64);
  for (size_t i = 0; i < 64; ++i) sum[i] = x[i] + before[i];
  CHECK(wire == encode(sum, f));
}

TEST_CASE("caller dtypes: bf16 and f16 inputs and outputs") {
  const WireFormat f{};
  const auto x = sample(Distribution::normal, 300, 2);
  std::vector<uint16_t> xb(300), xh(300);
  std::vector<float> xf(300), xhf(300);
  for (size_t i = 0; i < 300; ++i) {
    xb[i] = m::f32_to_bf16(x[i]);
    xf[i] = m::bf16_to_f32(xb[i]);
    xh[i] = m::f32_to_f16(x[i]);
    xhf[i] = m::f16_to_f32(xh[i]);
  }
  std::vector<uint8_t> wb(chunk_bytes(300, f)), wh(chunk_bytes(300, f));
  REQUIRE(ref::quantize(xb.data(), ElemType::bf16, 300, wb.data(), Segmented::single(300, f), f) == nullptr);
  REQUIRE(ref::quantize(xh.data(), ElemType::f16, 300, wh.data(), Segmented::single(300, f), f) == nullptr);
  CHECK(wb == encode(xf, f));
  CHECK(wh == encode(xhf, f));
  std::vector<uint16_t> yb(300);
  REQUIRE(ref::dequantize(wb.data(), Segmented::single(300, f), 300, yb.data(), ElemType::bf16, f) == nullptr);
  const auto yf = decode(wb, 300, f);
  for (size_t i = 0; i < 300; ++i) CHECK(yb[i] == m::f32_to_bf16(yf[i]));
}

#if FP8WIRE_HAVE_CUDA_FP8
TEST_CASE("software conversion agrees with cuda_fp8.h (the cvt.rn.satfinite semantics) on 4M inputs") {
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> any;
  long enc4 = 0, enc5 = 0, dec = 0;
  for (long i = 0; i < 4000000; ++i) {
    const uint32_t u = i < 1000000 ? uint32_t(i) * 4294u : any(rng);   // a sweep of all magnitudes, then random
    if ((u & 0x7FFFFFFFu) >= 0x7F800000u) continue;                    // the codec never converts NaN/Inf
    const float f = m::bits_f32(u);
    enc4 += __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3) != m::f32_to_fp8_rne_sw<Fp8Format::e4m3>(f);
    enc5 += __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2) != m::f32_to_fp8_rne_sw<Fp8Format::e5m2>(f);
  }
  for (int c = 0; c < 256; ++c) {
    const float n4 = __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), __NV_E4M3)));
    const float n5 = __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), __NV_E5M2)));
    const float m4 = m::fp8_to_f32_sw<Fp8Format::e4m3>(uint8_t(c));
    const float m5 = m::fp8_to_f32_sw<Fp8Format::e5m2>(uint8_t(c));
    dec += !((std::isnan(n4) && std::isnan(m4)) || bits(n4) == bits(m4));
    dec += !((std::isnan(n5) && std::isnan(m5)) || bits(n5) == bits(m5));
  }
  CHECK(enc4 == 0);
  CHECK(enc5 == 0);
  CHECK(dec == 0);
}
#endif
