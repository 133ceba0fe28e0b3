// Inputs and correctness checks of the sweep, on the host (plain C++, tested in CI).
//
// Input element i of rank r in rotation buffer b is (k / 8) * 2^e with k in [-8, 8] drawn from a hash
// of (r, b, i) and e in [-6, 5] drawn per group of 256 elements (the same for every rank). Any sum of
// such values over up to 32 ranks is exact in bf16, fp16 and fp32 whatever the order of additions,
// so plain NCCL must match the expected result bit for bit, and the FP8 paths see blocks of very
// different magnitudes (what per-block scales are for).
//
// FP8 results are checked against a stated bound relative to the block's reference magnitude
// R = sum over ranks of the block's amax (all-reduce, reduce-scatter) or the sender's block amax
// (all-gather, all-to-all, a message: the previous rank's), taking the largest R of the block and its two neighbours so a path that
// cuts blocks at other offsets is still judged fairly:
//     |out - expected| <= (q * u * s + 2^-7) * R
// where q = quantizations on the path (all-reduce two_shot 2, one_shot 1, ring n; reduce-scatter
// two_shot/one_shot 1, ring n-1; all-gather 1; all-to-all 1; a message 1), u = half an FP8 ulp relative to the
// value (2^-4 e4m3, 2^-3 e5m2), s = 2 for power-of-two (e8m0) scales, 1 otherwise, and 2^-7 covers
// the final rounding to the caller's dtype. An all-to-all rank's own chunk must be exact. Any NaN or
// Inf in an output is a failure (the inputs are finite).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bench/host/units.hpp"

namespace fp8wire::bench {

float input_value(int rank, int buffer, uint64_t index);

// Caller-dtype encodings (round to nearest even), host side.
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);

// Writes n elements starting at global input index `first` for (rank, buffer) into `out` (dtype bytes).
void fill_input(DType dtype, int rank, int buffer, uint64_t first, uint64_t n, void* out);
float load_element(DType dtype, const void* data, uint64_t i);

struct CheckSpec {
  Collective collective = Collective::all_reduce;
  Path path = Path::passthrough;
  DType dtype = DType::bf16;
  int nranks = 1;
  int rank = 0;
  int buffer = 0;
  uint64_t count = 0;           // count argument of the call (recvcount for RS, sendcount for AG, per peer for A2A,
                                // the message for send/recv: from rank - 1, as the sweep's round sends)
  uint32_t block = 128;
  Fp8Format fp8 = Fp8Format::e4m3;
  ScaleType scale = ScaleType::fp32;
};

// Quantizations on a path (see above); 0 for passthrough.
int quantizations(Collective c, Path p, int nranks);
// The stated bound on |error| / R; 0 (exact) for passthrough with up to 32 ranks.
double error_bound(const CheckSpec& spec);

struct LocalCheck {
  double max_err_ratio = 0;
  uint64_t mismatches = 0;  // elements beyond the bound
  uint64_t nonfinite = 0;
  uint64_t hash = 0;        // FNV-1a of the output bytes (bitwise identity across ranks)
};
// Checks one rank's output buffer (recv elements of the call) against the expected result.
LocalCheck check_output(const CheckSpec& spec, const void* output);

uint64_t fnv1a(const void* data, size_t bytes);

}  // namespace fp8wire::bench
