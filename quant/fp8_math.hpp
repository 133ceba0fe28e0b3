// The arithmetic of the FP8 wire format, written once and compiled for both the host (the reference
// codec) and the device (the kernels), so the two agree bit for bit by construction. Every function
// here uses only correctly rounded IEEE operations (one rounding each, never contracted into an FMA:
// the device side calls __fmul_rn/__fadd_rn/__fdiv_rn, the host side is compiled with
// -ffp-contract=off) and integer bit manipulation. quant/README.md states the format in prose.
//
// Definitions (B = block size, M = FP8_MAX = 448 for e4m3 and 57344 for e5m2):
//   amax      = max |x| over the block, taken on the fp32 bit patterns (so NaN and Inf are seen).
//   non-finite block (any NaN/Inf): scale stored as NaN (fp32 0x7FFFFFFF, bf16 0x7FFF, e8m0 0xFF),
//               payload bytes 0; every element decodes to NaN.
//   s32       = amax / M                                   (one rounding)
//   stored s  = fp32: s32;  bf16: smallest bf16 >= s32;  e8m0: smallest 2^e >= s32.
//   zero block: stored s < FLT_MIN (amax < ~5.3e-36, all-zero blocks included): scale 0 (e8m0 byte 0),
//               payload 0; decodes to (+/-)0.
//   encode    q = fp8(x * (1 / s))   both the reciprocal and the product rounded once; fp8() is
//               round-to-nearest-even with saturation to +/-M (cvt .rn.satfinite), or stochastic.
//   decode    y = float(q) * s       (one rounding); NaN outputs are written as canonical NaN.
// Stochastic rounding adds 23 (normal range: 20 or 21) random low bits below the FP8 quantum and
// truncates: the result is the lower or upper neighbour with probabilities proportional to distance
// (unbiased); random bits come from a counter-based hash of (seed, element index).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/config.hpp"

#if defined(__CUDACC__)
#define FP8W_HD __host__ __device__ __forceinline__
#else
#define FP8W_HD inline
#endif

namespace fp8wire::quant::math {

inline constexpr uint32_t kCanonicalNanF32 = 0x7FFFFFFFu;
inline constexpr uint16_t kCanonicalNan16 = 0x7FFFu;   // bf16 and f16 alike
inline constexpr uint8_t kE8m0Nan = 0xFFu;
inline constexpr uint32_t kFltMinBits = 0x00800000u;   // FLT_MIN, smallest normal fp32

FP8W_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
FP8W_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Correctly rounded operations that are never fused.
FP8W_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FP8W_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FP8W_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
FP8W_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

FP8W_HD bool is_nan_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

// ---- caller element types <-> fp32 ----------------------------------------------------------------
FP8W_HD float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

// fp32 -> bf16, round to nearest even; NaN -> canonical NaN.
FP8W_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if (is_nan_bits(u)) return kCanonicalNan16;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// f16 -> fp32, exact (subnormals included).
FP8W_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return bits_f32(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
  // Subnormal: man * 2^-24, exact in fp32.
  return bits_f32(sign | f32_bits(mul_rn(float(man), 5.9604644775390625e-08f)));
}

// fp32 -> f16, round to nearest even with overflow to Inf (IEEE, like cvt.rn.f16.f32); NaN -> canonical.
FP8W_HD uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return kCanonicalNan16;
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);   // >= 65520 rounds to Inf
  if (a >= 0x38800000u) {                                   // normal f16 range (>= 2^-14)
    const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
    return uint16_t(sign | ((r >> 13) - (112u << 10)));
  }
  // Subnormal f16 (or zero): value / 2^-24 rounded to nearest even. a < 2^-14, so the scaled value
  // is < 1024 and exact in fp32; the rounding below is on its bits.
  const float scaled = mul_rn(bits_f32(a), 16777216.0f);   // * 2^24, exact
  const uint32_t sb = f32_bits(scaled);
  if (sb < 0x3F000000u) return sign;                        // < 0.5 -> 0 (0.5 itself ties to even 0)
  const uint32_t e = (sb >> 23) - 127u;                      // 2^e <= scaled, e in [-1, 9]
  const uint32_t man = (sb & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 23u - e;                            // 14..24
  uint32_t q = man >> shift;
  const uint32_t rem = man & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return uint16_t(sign | q);                                 // q == 1024 becomes the smallest normal
}

// ---- FP8 traits ------------------------------------------------------------------------------------
template <Fp8Format F>
struct Fp8Traits;
template <>
struct Fp8Traits<Fp8Format::e4m3> {
  static constexpr int kMantBits = 3;
  static constexpr int kBias = 7;
  static constexpr int kMinExp = -6;            // smallest normal exponent
  static constexpr uint32_t kMaxCode = 0x7E;    // 448
  static constexpr float kMax = 448.0f;
  static constexpr uint32_t kMaxBits = 0x43E00000u;   // 448.0f
};
template <>
struct Fp8Traits<Fp8Format::e5m2> {
  static constexpr int kMantBits = 2;
  static constexpr int kBias = 15;
  static constexpr int kMinExp = -14;
  static constexpr uint32_t kMaxCode = 0x7B;    // 57344
  static constexpr float kMax = 57344.0f;
  static constexpr uint32_t kMaxBits = 0x47600000u;   // 57344.0f
};

// Software fp32 -> FP8, round to nearest even, saturating (matches cvt.rn.satfinite for finite input).
template <Fp8Format F>
FP8W_HD uint8_t f32_to_fp8_rne_sw(float v) {
  using T = Fp8Traits<F>;
  const uint32_t u = f32_bits(v);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a >= T::kMaxBits) return uint8_t(sign | T::kMaxCode);   // also catches Inf (never passed in)
  constexpr uint32_t kMinNormalBits = uint32_t(127 + T::kMinExp) << 23;
  if (a >= kMinNormalBits) {
    constexpr int kDrop = 23 - T::kMantBits;
    const uint32_t r = (a + ((1u << (kDrop - 1)) - 1u) + ((a >> kDrop) & 1u)) >> kDrop;
    return uint8_t(sign | (r - (uint32_t(127 - T::kBias) << T::kMantBits)));
  }
  // FP8 subnormal range: code = round_half_even(a / quantum), quantum = 2^(kMinExp - kMantBits); the
  // scaling is exact (a power of two) and t < 2^kMantBits, so one float->int conversion in
  // round-to-nearest-even mode does it (a result of 2^kMantBits is the smallest normal code).
  constexpr float kInvQuantum = float(1u << (T::kMantBits - T::kMinExp));
  const float t = mul_rn(bits_f32(a), kInvQuantum);
#if defined(__CUDA_ARCH__)
  const uint32_t q = __float2uint_rn(t);
#else
  const uint32_t q = static_cast<uint32_t>(std::nearbyint(t));   // default rounding mode: to nearest even
#endif
  return uint8_t(sign | q);
}

// The same function as f32_to_fp8_rne_sw (bit for bit; test_quant_ref checks it on every rounding
// boundary of every exponent), written without branches for the GPU's software path, where the
// branchy form costs more instructions than the arithmetic. Both ranges are computed and selected:
// the subnormal one by adding a magic 2^(kMinExp - kMantBits + 23), whose ulp is the FP8 subnormal
// quantum, so the one correctly rounded addition is the round-half-even of a / quantum and the low bits
// of the sum are the code (a < 2^kMinExp <= magic keeps the sum in magic's binade).
template <Fp8Format F>
FP8W_HD uint32_t f32_to_fp8_rne_branchless(float v) {
  using T = Fp8Traits<F>;
  const uint32_t u = f32_bits(v);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  constexpr int kDrop = 23 - T::kMantBits;
  constexpr uint32_t kMinNormalBits = uint32_t(127 + T::kMinExp) << 23;
  constexpr uint32_t kMagicBits = uint32_t(127 + T::kMinExp - T::kMantBits + 23) << 23;
  const uint32_t normal =
      ((a + ((1u << (kDrop - 1)) - 1u) + ((a >> kDrop) & 1u)) >> kDrop) - (uint32_t(127 - T::kBias) << T::kMantBits);
  const uint32_t subnormal = f32_bits(add_rn(bits_f32(a), bits_f32(kMagicBits))) - kMagicBits;
  uint32_t code = a >= kMinNormalBits ? normal : subnormal;
  code = a >= T::kMaxBits ? T::kMaxCode : code;
  return sign | code;
}

// Stochastic rounding to FP8 with saturation; `rnd` supplies (at least) 23 uniform random bits.
// Integer-only below the saturation test, so host and device agree whatever conversion path is used.
template <Fp8Format F>
FP8W_HD uint8_t f32_to_fp8_sr(float v, uint32_t rnd) {
  using T = Fp8Traits<F>;
  const uint32_t u = f32_bits(v);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a >= T::kMaxBits) return uint8_t(sign | T::kMaxCode);
  constexpr uint32_t kMinNormalBits = uint32_t(127 + T::kMinExp) << 23;
  if (a >= kMinNormalBits) {
    constexpr int kDrop = 23 - T::kMantBits;
    uint32_t r = (a + (rnd & ((1u << kDrop) - 1u))) >> kDrop;
    r -= uint32_t(127 - T::kBias) << T::kMantBits;
    if (r > T::kMaxCode) r = T::kMaxCode;
    return uint8_t(sign | r);
  }
  // Subnormal range: t = a / quantum in [0, 2^kMantBits) as fixed point with 23 fraction bits
  // (bits below that are truncated), plus 23 random bits, truncated.
  constexpr float kInvQuantum = float(1u << (T::kMantBits - T::kMinExp));
  const float t = mul_rn(bits_f32(a), kInvQuantum);
  const float tfix = mul_rn(t, 8388608.0f);                   // * 2^23, exact, < 2^26
#if defined(__CUDA_ARCH__)
  const uint32_t fixed = __float2uint_rz(tfix);
#else
  const uint32_t fixed = static_cast<uint32_t>(tfix);
#endif
  const uint32_t q = (fixed + (rnd & 0x7FFFFFu)) >> 23;       // may reach 2^kMantBits: smallest normal
  return uint8_t(sign | q);
}

// Software FP8 -> fp32 (exact), branch-free: the code's exponent and mantissa bits are placed at
// the top of an fp32 whose exponent is off by (127 - bias); one multiplication by 2^(127 - bias)
// (exact: a power of two, and the product is a normal number or zero) fixes it, FP8 subnormals
// included, since they land on fp32 subnormals. NaN codes (e4m3 0x7F/0xFF) give NaN, e5m2 Inf/NaN
// codes give Inf/NaN. Needs subnormals kept (no flush-to-zero), which is the nvcc and host default.
template <Fp8Format F>
FP8W_HD float fp8_to_f32_sw(uint8_t b) {
  using T = Fp8Traits<F>;
  constexpr int kShift = 23 - T::kMantBits;
  constexpr float kRebias = float(1ull << (127 - T::kBias - 64)) * 18446744073709551616.0f;   // 2^(127-bias)
  const uint32_t mag = b & 0x7Fu;
  const float v = mul_rn(bits_f32((uint32_t(b & 0x80u) << 24) | (mag << kShift)), kRebias);
  if constexpr (F == Fp8Format::e4m3) {
    return mag == 0x7Fu ? bits_f32(kCanonicalNanF32) : v;
  } else {
    if (mag >= 0x7Cu) return bits_f32((uint32_t(b & 0x80u) << 24) | (mag == 0x7Cu ? 0x7F800000u : kCanonicalNanF32));
    return v;
  }
}

// ---- scales ----------------------------------------------------------------------------------------
// A block's scale in the three forms the codec needs: what is stored, the decode multiplier and the
// encode multiplier. kind: 0 = normal, 1 = zero block, 2 = non-finite block.
struct BlockScale {
  uint32_t stored;   // fp32 bits, bf16 bits or e8m0 byte
  float decode;      // s
  float encode;      // 1/s (0 for zero and non-finite blocks: the payload is written as 0)
  int kind;
};

// amax_bits: max over the block of (fp32 bits & 0x7FFFFFFF); >= 0x7F800000 means NaN or Inf present.
template <Fp8Format F>
FP8W_HD BlockScale make_scale(uint32_t amax_bits, ScaleType st) {
  BlockScale r{};
  if (amax_bits >= 0x7F800000u) {
    r.stored = st == ScaleType::fp32 ? kCanonicalNanF32 : st == ScaleType::bf16 ? kCanonicalNan16 : kE8m0Nan;
    r.decode = bits_f32(kCanonicalNanF32);
    r.encode = 0.0f;
    r.kind = 2;
    return r;
  }
  const float s32 = div_rn(bits_f32(amax_bits), Fp8Traits<F>::kMax);
  float s = s32;
  uint32_t stored = f32_bits(s32);
  if (st == ScaleType::bf16) {
    // Rounded up, like e8m0: amax * (1/s) then stays <= M, so the block's largest element is not
    // clipped by a scale that rounded down.
    const uint32_t sb = f32_bits(s32);
    stored = (sb >> 16) + ((sb & 0xFFFFu) ? 1u : 0u);
    s = bf16_to_f32(uint16_t(stored));
  } else if (st == ScaleType::e8m0) {
    const uint32_t sb = f32_bits(s32);
    if (sb >= kFltMinBits) {
      const uint32_t byte = (sb >> 23) + ((sb & 0x7FFFFFu) ? 1u : 0u);   // biased exponent of 2^ceil(log2)
      stored = byte;
      s = bits_f32(byte << 23);
    }
  }
  if (f32_bits(s) < kFltMinBits) {   // zero block (or a scale too small to invert)
    r.stored = 0;
    r.decode = 0.0f;
    r.encode = 0.0f;
    r.kind = 1;
    return r;
  }
  r.stored = stored;
  r.decode = s;
  r.encode = st == ScaleType::e8m0 ? bits_f32((254u - (stored)) << 23) : div_rn(1.0f, s);
  r.kind = 0;
  return r;
}

// Stored scale -> decode multiplier. The sign bit of an fp32 or bf16 scale is the guard's flag
// (quant/telemetry.hpp; scales are never negative), so it is ignored here.
FP8W_HD float decode_scale(uint32_t stored, ScaleType st) {
  if (st == ScaleType::fp32) return bits_f32(stored & 0x7FFFFFFFu);
  if (st == ScaleType::bf16) return bf16_to_f32(uint16_t(stored & 0x7FFFu));
  if (stored == kE8m0Nan) return bits_f32(kCanonicalNanF32);
  if (stored == 0) return bits_f32(0x00400000u);   // 2^-127 (only zero blocks store it)
  return bits_f32(stored << 23);
}

// ---- stochastic rounding bits ------------------------------------------------------------------
// Counter-based: a SplitMix64 finaliser of (seed, index); no state, so any element of any call can be
// rounded independently and the result does not depend on launch geometry.
FP8W_HD uint32_t sr_bits(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return uint32_t(z >> 32);
}

}  // namespace fp8wire::quant::math
