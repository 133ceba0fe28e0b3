#include "bench/host/check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace fp8wire::bench {

namespace {
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline int exponent_of(int buffer, uint64_t index) {
  return static_cast<int>(splitmix64((index >> 8) * 0x100000001B3ull + static_cast<uint64_t>(buffer)) % 12) - 6;
}
inline float value_with_exponent(int rank, int buffer, uint64_t index, int e) {
  const uint64_t h = splitmix64(index ^ (static_cast<uint64_t>(rank) << 48) ^ (static_cast<uint64_t>(buffer) << 40));
  const int k = static_cast<int>(h % 17) - 8;
  return std::ldexp(static_cast<float>(k), e - 3);
}
}  // namespace

float input_value(int rank, int buffer, uint64_t index) {
  return value_with_exponent(rank, buffer, index, exponent_of(buffer, index));
}

uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;                  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;                 // rounds to >= 65520: Inf
  if (abs < 0x33000000u) return sign;                            // below half the smallest subnormal
  int exp = static_cast<int>(abs >> 23) - 127;
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  // Shift so the result has 10 fraction bits; subnormals (exp < -14) shift further.
  const int shift = exp < -14 ? 13 + (-14 - exp) : 13;
  const uint32_t half_mant = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  uint32_t result = exp < -14 ? half_mant : ((static_cast<uint32_t>(exp + 15) << 10) | (half_mant & 0x3ffu));
  if (rem > halfway || (rem == halfway && (result & 1u))) ++result;  // carry may bump the exponent: correct
  return static_cast<uint16_t>(sign | result);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp + 112) << 23) | (mant << 13));
  std::memcpy(&f, &bits, 4);
  return f;
}

void fill_input(DType dtype, int rank, int buffer, uint64_t first, uint64_t n, void* out) {
  switch (dtype) {
    case DType::f32: {
      auto* p = static_cast<float*>(out);
      for (uint64_t i = 0; i < n; ++i) p[i] = input_value(rank, buffer, first + i);
      break;
    }
    case DType::bf16: {
      auto* p = static_cast<uint16_t*>(out);
      for (uint64_t i = 0; i < n; ++i) p[i] = float_to_bf16(input_value(rank, buffer, first + i));
      break;
    }
    case DType::f16: {
      auto* p = static_cast<uint16_t*>(out);
      for (uint64_t i = 0; i < n; ++i) p[i] = float_to_half(input_value(rank, buffer, first + i));
      break;
    }
  }
}

float load_element(DType dtype, const void* data, uint64_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::f16: return half_to_float(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

int quantizations(Collective c, Path p, int nranks) {
  if (p == Path::passthrough || p == Path::fallback) return 0;
  switch (c) {
    // Hierarchical: at most two quantizations (two-shot between hosts), of host sums.
    case Collective::all_reduce:
      return p == Path::two_shot || p == Path::hierarchical ? 2 : p == Path::one_shot ? 1 : nranks;
    case Collective::reduce_scatter: return p == Path::ring ? std::max(nranks - 1, 1) : 1;
    case Collective::all_gather: return 1;
    case Collective::all_to_all: return 1;  // the rank's own chunk none (exact)
    case Collective::send_recv: return 1;
  }
  return 1;
}

double error_bound(const CheckSpec& spec) {
  const int q = quantizations(spec.collective, spec.path, spec.nranks);
  if (q == 0) return (spec.dtype == DType::bf16 && spec.nranks > 32) ? std::ldexp(1.0, -7) : 0.0;
  const double half_ulp = spec.fp8 == Fp8Format::e4m3 ? std::ldexp(1.0, -4) : std::ldexp(1.0, -3);
  const double scale_slack = spec.scale == ScaleType::e8m0 ? 2.0 : 1.0;
  return q * half_ulp * scale_slack + std::ldexp(1.0, -7);
}

uint64_t fnv1a(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

LocalCheck check_output(const CheckSpec& spec, const void* output) {
  LocalCheck result;
  const uint64_t n = spec.nranks;
  // All-gather and all-to-all: n chunks of count, chunk j from rank j. A message: one chunk, from the
  // previous rank (the sweep's round sends to the next one).
  const bool chunks = spec.collective == Collective::all_gather || spec.collective == Collective::all_to_all;
  const bool message = spec.collective == Collective::send_recv;
  const int message_source = static_cast<int>((static_cast<uint64_t>(spec.rank) + n - 1) % std::max<uint64_t>(n, 1));
  const uint64_t out_elems = chunks ? spec.count * n : spec.count;
  result.hash = fnv1a(output, out_elems * dtype_size(spec.dtype));
  const double bound = error_bound(spec);
  const uint64_t block = std::max<uint32_t>(spec.block, 1);

  // Global input index of output element j, and which ranks contributed to it.
  auto input_index = [&](uint64_t j) -> uint64_t {
    switch (spec.collective) {
      case Collective::all_reduce: return j;
      case Collective::reduce_scatter: return static_cast<uint64_t>(spec.rank) * spec.count + j;
      case Collective::all_gather: return j % spec.count;
      case Collective::all_to_all: return static_cast<uint64_t>(spec.rank) * spec.count + j % spec.count;
      case Collective::send_recv: return j;
    }
    return j;
  };
  // Reference magnitude of the block holding input index i of the contributing rank(s).
  auto block_amax = [&](int source_rank, uint64_t blk, uint64_t input_elems) -> double {
    const uint64_t lo = blk * block;
    const uint64_t hi = std::min(lo + block, input_elems);
    double a = 0;
    for (uint64_t i = lo; i < hi; ++i) a = std::max(a, static_cast<double>(std::fabs(input_value(source_rank, spec.buffer, i))));
    return a;
  };
  const uint64_t input_elems = spec.collective == Collective::reduce_scatter || spec.collective == Collective::all_to_all
                                   ? spec.count * n
                                   : spec.count;
  // Per-block sums of amax, memoised: every block is read once per contributing rank.
  const uint64_t nblocks = (input_elems + block - 1) / block;
  const size_t sources = chunks || message ? static_cast<size_t>(spec.nranks) : 1;
  std::vector<double> block_ref(nblocks * sources, -1.0);
  auto block_sum = [&](int source_rank, uint64_t b) -> double {
    double& slot = block_ref[(source_rank < 0 ? 0 : static_cast<size_t>(source_rank)) * nblocks + b];
    if (slot < 0) {
      if (source_rank >= 0) {
        slot = block_amax(source_rank, b, input_elems);
      } else {
        slot = 0;
        for (int rr = 0; rr < spec.nranks; ++rr) slot += block_amax(rr, b, input_elems);
      }
    }
    return slot;
  };
  auto reference = [&](int source_rank, uint64_t i) -> double {
    const uint64_t blk = i / block;
    double r = 0;
    for (uint64_t b = blk == 0 ? 0 : blk - 1; b <= std::min(blk + 1, nblocks - 1); ++b) r = std::max(r, block_sum(source_rank, b));
    return r;
  };

  for (uint64_t j = 0; j < out_elems; ++j) {
    const uint64_t i = input_index(j);
    double expected;
    int source = -1;
    if (chunks || message) {
      source = message ? message_source : static_cast<int>(j / spec.count);
      expected = input_value(source, spec.buffer, i);
    } else {
      const int e = exponent_of(spec.buffer, i);
      float sum = 0;  // exact: see the header
      for (int r = 0; r < spec.nranks; ++r) sum += value_with_exponent(r, spec.buffer, i, e);
      expected = sum;
    }
    const float got = load_element(spec.dtype, output, j);
    if (!std::isfinite(got)) {
      ++result.nonfinite;
      continue;
    }
    // The rank's own chunk of an all-to-all never leaves the GPU: exact, whatever the path.
    if (spec.collective == Collective::all_to_all && source == spec.rank) {
      result.mismatches += got != expected;
      continue;
    }
    const double err = std::fabs(static_cast<double>(got) - expected);
    if (err == 0) continue;
    const double r = reference(source, i);
    const double ratio = r > 0 ? err / r : INFINITY;
    result.max_err_ratio = std::max(result.max_err_ratio, ratio);
    if (ratio > bound) ++result.mismatches;
  }
  return result;
}

}  // namespace fp8wire::bench
