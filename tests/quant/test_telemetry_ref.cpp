// The telemetry of the CPU reference codec (quant/telemetry.hpp): the figures as defined, the guard's
// vote, and the guard flag on the wire (written by quantize and requantize, read by every decode and
// reduce, invisible to the decoded values). Runs in CI (no GPU).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "quant/reference.hpp"
#include "quant/telemetry.hpp"
#include "tests/quant/sample_data.hpp"

using namespace fp8wire;
using namespace fp8wire::quant;

namespace {

WireFormat format(Fp8Format f = Fp8Format::e4m3, ScaleType s = ScaleType::fp32, Rounding r = Rounding::nearest) {
  return WireFormat{f, s, 128, r, 7};
}

struct Encoded {
  std::vector<uint8_t> wire;
  CallTelemetry rec;
};

Encoded encode(const std::vector<float>& x, const WireFormat& f, const TelemetryOptions* base = nullptr) {
  Encoded e;
  e.wire.assign(chunk_bytes(x.size(), f), 0xAB);
  TelemetryOptions t = base ? *base : TelemetryOptions{};
  t.record = &e.rec;
  REQUIRE(ref::quantize(x.data(), ElemType::f32, x.size(), e.wire.data(), Segmented::single(x.size(), f), f, 0, &t) ==
          nullptr);
  return e;
}

std::vector<float> decode(const std::vector<uint8_t>& wire, size_t n, const WireFormat& f) {
  std::vector<float> y(n);
  REQUIRE(ref::dequantize(wire.data(), Segmented::single(n, f), n, y.data(), ElemType::f32, f) == nullptr);
  return y;
}

}  // namespace

TEST_CASE("telemetry: the sums are the definition, sum (x - dequant(quant(x)))^2 and sum x^2, in fp64") {
  for (auto d : {testdata::Distribution::normal, testdata::Distribution::student_t3,
                 testdata::Distribution::signed_lognormal}) {
    for (Rounding r : {Rounding::nearest, Rounding::stochastic}) {
      const WireFormat f = format(Fp8Format::e4m3, ScaleType::fp32, r);
      const std::vector<float> x = testdata::sample(d, 5000, 3);
      const Encoded e = encode(x, f);
      const std::vector<float> y = decode(e.wire, x.size(), f);
      double err = 0, in = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        err += (double(x[i]) - double(y[i])) * (double(x[i]) - double(y[i]));
        in += double(x[i]) * double(x[i]);
      }
      CHECK(e.rec.input.sq_error == err);
      CHECK(e.rec.input.sq_input == in);
      CHECK(e.rec.input.elements == x.size());
      CHECK(e.rec.input.nonfinite == 0);
      CHECK(e.rec.input.saturated == 0);   // an amax scale never clips
      CHECK(e.rec.requant.elements == 0);  // a quantize writes only its own part
    }
  }
}

TEST_CASE("telemetry: Gaussian e4m3 measures the codec's known 2.6 % and no default bound trips on ordinary data") {
  const std::vector<float> x = testdata::sample(testdata::Distribution::normal, 1 << 16, 5);
  const ErrorStats s = ref::measure(x.data(), x.size(), format());
  const double rel = std::sqrt(s.sq_error / s.sq_input);
  CHECK(rel > 0.024);
  CHECK(rel < 0.028);
  // Every format, scale and rounding on the three distributions of the error table (quant/README.md,
  // worst 9.4 %): the default bounds stay quiet.
  for (auto d : {testdata::Distribution::normal, testdata::Distribution::student_t3,
                 testdata::Distribution::signed_lognormal})
    for (Fp8Format fp : {Fp8Format::e4m3, Fp8Format::e5m2})
      for (ScaleType st : {ScaleType::fp32, ScaleType::bf16, ScaleType::e8m0})
        for (Rounding r : {Rounding::nearest, Rounding::stochastic}) {
          const std::vector<float> v = testdata::sample(d, 1 << 14, 9);
          const ErrorStats m = ref::measure(v.data(), v.size(), format(fp, st, r));
          CAPTURE(testdata::label(d));
          CAPTURE(static_cast<int>(fp));
          CAPTURE(static_cast<int>(st));
          CHECK(guard_vote(m, GuardBounds{}) == 0);
        }
}

TEST_CASE("telemetry: an outlier 1e5 times larger flushes the rest of its block, counted exactly") {
  // s = 1e5 / 448: 0.1 / s = 4.5e-4 is below half of e4m3's smallest subnormal (2^-9), so it decodes
  // to 0; 0.3 / s = 1.3e-3 rounds to 2^-9 (kept, with a large error).
  std::vector<float> x(256, 0.1f);
  x[5] = 1e5f;
  for (size_t i = 128; i < 256; ++i) x[i] = i % 2 ? 0.3f : -0.3f;
  x[200] = -1e5f;
  const Encoded e = encode(x, format());
  CHECK(e.rec.input.flushed == 127);
  // The norm error hardly moves (the outliers dominate the norm): the flushed fraction is what shows it.
  CHECK(std::sqrt(e.rec.input.sq_error / e.rec.input.sq_input) < 0.01);
  CHECK((guard_vote(e.rec.input, GuardBounds{}) & kGuardFlushed) != 0);
  CHECK((guard_vote(e.rec.input, GuardBounds{}) & kGuardRelError) == 0);
}

TEST_CASE("telemetry: non-finite inputs are counted and their blocks stay out of the sums") {
  std::vector<float> x(384, 1.0f);
  for (size_t i = 0; i < 128; ++i) x[i] = std::numeric_limits<float>::quiet_NaN();   // an all-NaN block
  x[200] = std::numeric_limits<float>::infinity();                                   // one Inf in the next
  const Encoded e = encode(x, format());
  CHECK(e.rec.input.nonfinite == 129);
  CHECK(e.rec.input.elements == 384);
  CHECK(e.rec.input.sq_input == 128.0);  // only the third block (exact: 1.0 is representable)
  CHECK(e.rec.input.sq_error == 0.0);
  CHECK(guard_vote(e.rec.input, GuardBounds{}) == kGuardNonfinite);
}

TEST_CASE("telemetry: a block below e4m3's range after scaling (scale under FLT_MIN) is flushed whole") {
  std::vector<float> x(128);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 ? 1e-38f : -2e-38f);
  const Encoded e = encode(x, format());
  CHECK(e.rec.input.flushed == 128);
  CHECK(e.rec.input.sq_error == e.rec.input.sq_input);
  CHECK(e.rec.input.sq_input > 0);   // fp64: 1e-76 does not underflow
  CHECK(guard_vote(e.rec.input, GuardBounds{}) == (kGuardRelError | kGuardFlushed));
}

TEST_CASE("guard vote: each bound, at and beyond its value") {
  ErrorStats s;
  s.elements = 1000;
  s.sq_input = 100;
  s.sq_error = 6.25;  // relative error exactly 0.25: not beyond
  GuardBounds b;
  CHECK(guard_vote(s, b) == 0);
  s.sq_error = 6.26;
  CHECK(guard_vote(s, b) == kGuardRelError);
  s.sq_error = 0;
  s.flushed = 10;  // 1 %: not beyond
  CHECK(guard_vote(s, b) == 0);
  s.flushed = 11;
  CHECK(guard_vote(s, b) == kGuardFlushed);
  s.flushed = 0;
  s.saturated = 2;
  CHECK(guard_vote(s, b) == kGuardSaturated);
  s.saturated = 0;
  s.nonfinite = 1;
  CHECK(guard_vote(s, b) == kGuardNonfinite);
  b.max_nonfinite = 1;  // a fraction of 1 never trips
  CHECK(guard_vote(s, b) == 0);
  CHECK(guard_vote(ErrorStats{}, GuardBounds{}) == 0);  // nothing measured, nothing voted
}

TEST_CASE("guard flag: written by a quantize that votes, read by decode and reduce, invisible in the values") {
  for (ScaleType st : {ScaleType::fp32, ScaleType::bf16}) {
    const WireFormat f = format(Fp8Format::e4m3, st);
    std::vector<float> x = testdata::sample(testdata::Distribution::normal, 300, 11);
    TelemetryOptions guard;
    guard.guard = true;
    const Encoded clean = encode(x, f, &guard);
    CHECK_FALSE(ref::guard_flag(clean.wire.data(), x.size(), f));
    CHECK(clean.rec.vote == 0);
    x[17] = std::numeric_limits<float>::infinity();
    const Encoded plain = encode(x, f);  // telemetry without the guard: no flag
    CHECK_FALSE(ref::guard_flag(plain.wire.data(), x.size(), f));
    const Encoded voted = encode(x, f, &guard);
    CHECK(ref::guard_flag(voted.wire.data(), x.size(), f));
    CHECK(voted.rec.vote == kGuardNonfinite);
    // Only the flag bit differs, and decoding ignores it.
    size_t differing = 0;
    for (size_t i = 0; i < plain.wire.size(); ++i) differing += plain.wire[i] != voted.wire[i];
    CHECK(differing == 1);
    const std::vector<float> a = decode(plain.wire, x.size(), f), b = decode(voted.wire, x.size(), f);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);

    // A decode with the guard on reports the flag as its decision; without the flag, none.
    TelemetryOptions reader;
    reader.guard = true;
    std::vector<float> y(x.size());
    auto decode_guarded = [&](const std::vector<uint8_t>& wire) {
      CallTelemetry rec;
      reader.record = &rec;
      REQUIRE(ref::dequantize(wire.data(), Segmented::single(x.size(), f), x.size(), y.data(), ElemType::f32, f,
                              &reader) == nullptr);
      return rec;
    };
    CHECK(decode_guarded(voted.wire).decision == 1);
    CHECK(decode_guarded(clean.wire).decision == 0);

    // A requantizing reduce relays a flag it reads into the chunk it writes; a reduce into the
    // caller's dtype decides from it.
    const void* inputs[2] = {clean.wire.data(), voted.wire.data()};
    auto reduce_guarded = [&](ref::ReduceOutput o) {
      CallTelemetry rec;
      reader.record = &rec;
      REQUIRE(ref::dequantize_reduce(inputs, 2, nullptr, ElemType::f32, 0, x.size(), 1.0f, o, f, 0, &reader) == nullptr);
      return rec;
    };
    std::vector<uint8_t> out(chunk_bytes(x.size(), f));
    ref::ReduceOutput ro;
    ro.wire = out.data();
    const CallTelemetry rec3 = reduce_guarded(ro);
    CHECK(rec3.relay == 1);
    CHECK(rec3.decision == 0);
    CHECK(rec3.requant.elements == x.size());
    CHECK(rec3.requant.nonfinite == 128);  // the Inf's block decoded to NaN, and the sum with it
    CHECK(ref::guard_flag(out.data(), x.size(), f));
    ref::ReduceOutput rp;
    rp.plain = y.data();
    const CallTelemetry rec4 = reduce_guarded(rp);
    CHECK(rec4.decision == 1);
    CHECK(rec4.requant.elements == 0);
  }
}

TEST_CASE("guard flag: e8m0 scales have no spare bit, so the guard never writes one there") {
  const WireFormat f = format(Fp8Format::e4m3, ScaleType::e8m0);
  std::vector<float> x(128, 1.0f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  TelemetryOptions guard;
  guard.guard = true;
  const Encoded voted = encode(x, f, &guard);
  const Encoded plain = encode(x, f);
  CHECK(voted.wire == plain.wire);
  CHECK(voted.rec.input.nonfinite == 1);  // the figures are still measured
}
