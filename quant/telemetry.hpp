// What one FP8 call measures about its own quantization, and the guard's vote, shared by the CPU
// reference (reference.hpp), the kernels (quant.hpp, through LaunchOptions::telemetry) and the
// scheduler (sched/comm/telemetry_monitor.hpp). Plain C++: the structs live in device memory and are copied to
// the host as bytes, the vote is compiled for host and device alike (quant/README.md, "Telemetry").
#pragma once

#include <cstdint>

#include "common/config.hpp"
#include "quant/fp8_math.hpp"

namespace fp8wire::quant {

// Sums over the elements one call quantized (several launches accumulate into one). Elements of a
// non-finite block (it decodes to NaN whatever its other values) enter only `elements` and, when
// themselves NaN or Inf, `nonfinite`.
struct ErrorStats {
  double sq_error = 0;            // sum (x - dequant(quant(x)))^2
  double sq_input = 0;            // sum x^2
  unsigned long long elements = 0;
  // |x / s| beyond the format's largest value by more than its rounding (M + half its step): with an
  // amax scale only a scale rounded down could cause it, which the format's scale rules never do;
  // counted so that nothing silently clips.
  unsigned long long saturated = 0;
  unsigned long long flushed = 0;    // finite x != 0 that decodes to 0 (below the block's range)
  unsigned long long nonfinite = 0;  // NaN or Inf inputs

  void add(const ErrorStats& o) {
    sq_error += o.sq_error;
    sq_input += o.sq_input;
    elements += o.elements;
    saturated += o.saturated;
    flushed += o.flushed;
    nonfinite += o.nonfinite;
  }
};

// The device record of one call. `input`: the quantization of the caller's data (produce lane);
// `requant`: the fused reduce's requantization (transfer lane). Both lanes write apart, so neither
// vote depends on the other lane's timing.
struct CallTelemetry {
  ErrorStats input;
  ErrorStats requant;
  uint32_t input_done = 0;    // CTAs of the current quantize launch that have added their sums
  uint32_t requant_done = 0;  // the same for the reduce
  uint32_t vote = 0;          // this rank's own vote reasons (GuardReason bits), for the log
  uint32_t relay = 0;         // guard flags seen in the inputs of a requantizing reduce
  uint32_t decision = 0;      // guard flags seen by this rank's final decode/reduce: 1 = switch
  uint32_t pad = 0;
};

// Bounds of the guard, as fractions: the relative error sqrt(sq_error / sq_input), and the
// saturated, flushed and non-finite elements per element quantized. A value >= 1 never trips
// (except the relative error, which can exceed 1).
struct GuardBounds {
  double max_rel_error = 0.25;
  double max_saturated = 1e-3;
  double max_flushed = 1e-2;
  double max_nonfinite = 0;
};

enum GuardReason : uint32_t {
  kGuardRelError = 1u,
  kGuardSaturated = 2u,
  kGuardFlushed = 4u,
  kGuardNonfinite = 8u,
};

// Which bounds the figures cross (0: none). Same arithmetic on host and device.
FP8W_HD uint32_t guard_vote(const ErrorStats& s, const GuardBounds& b) {
  if (s.elements == 0) return 0;
  const double n = double(s.elements);
  uint32_t v = 0;
  if (s.sq_error > b.max_rel_error * b.max_rel_error * s.sq_input) v |= kGuardRelError;
  if (double(s.saturated) > b.max_saturated * n) v |= kGuardSaturated;
  if (double(s.flushed) > b.max_flushed * n) v |= kGuardFlushed;
  if (double(s.nonfinite) > b.max_nonfinite * n) v |= kGuardNonfinite;
  return v;
}

// What the codec measures for one launch (LaunchOptions::telemetry). Off when `record` is null.
struct TelemetryOptions {
  CallTelemetry* record = nullptr;  // device memory (host memory for the CPU reference)
  // The guard: a quantize or requantize writes this rank's vote as the flag of each chunk it writes
  // (the sign bit of the chunk's first scale, which decoders ignore), and every decode and reduce ORs
  // the flags it reads into the record. Needs an fp32 or bf16 scale (e8m0 has no spare bit).
  bool guard = false;
  GuardBounds bounds;
};

// The guard flag: the sign bit of a chunk's first scale (scales are never negative).
inline constexpr bool guard_flag_supported(ScaleType st) { return st != ScaleType::e8m0; }
FP8W_HD uint32_t guard_flag_mask(ScaleType st) { return st == ScaleType::fp32 ? 0x80000000u : st == ScaleType::bf16 ? 0x8000u : 0u; }

// |x / s| beyond this was clipped by more than nearest rounding would move it: M + half the step at M.
template <Fp8Format F>
inline constexpr float kSaturationLimit = F == Fp8Format::e4m3 ? 464.0f : 61440.0f;

}  // namespace fp8wire::quant
