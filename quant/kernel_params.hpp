// Internal: the parameter blocks the codec kernels receive by value (so a launch needs no device
// memory and is safe under CUDA graph capture), and the raw launch functions that select a kernel
// instance. The public launchers (quant/launch.cpp) validate arguments, log, and call these; the
// kernels themselves live in the .cu files, which stay free of fmt/logging headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "quant/quant.hpp"
#include "quant/telemetry.hpp"

namespace fp8wire::quant::detail {

// Where a segmented wire buffer lives and how it is cut (see wire_format.hpp).
struct WireTarget {
  uint8_t* wire;
  size_t count;
  size_t seg_elems;
  size_t seg_stride;
  uint32_t block_shift;   // log2(block)
  ScaleType scale;
};

struct QuantizeParams {
  const void* in;
  bool in_aligned;        // 16-byte aligned: vector loads
  float* residual;        // quantize_with_residual only (16-byte aligned), else null
  WireTarget target;
  bool stochastic;
  uint64_t seed;
  uint64_t sr_offset;
  uint32_t variant;       // LaunchOptions::kernel_variant
  CallTelemetry* rec;     // telemetry (LaunchOptions::telemetry): null = off
  bool guard;
  GuardBounds bounds;
};

struct DequantizeParams {
  const uint8_t* wire;
  size_t count;
  size_t seg_elems;
  size_t seg_stride;
  uint32_t block_shift;
  ScaleType scale;
  void* out;
  uint32_t out_align;     // largest of 16, 8, 4, 2 dividing the out address (>= the element size)
  uint32_t units;         // 16-byte output units per thread per tile: 0 = the raw launcher chooses
  CallTelemetry* rec;     // with `guard`: the flags read are ORed into rec->decision
  bool guard;
};

enum class OutKind : int { f32 = 0, f16 = 1, bf16 = 2, wire = 3 };

struct ReduceParams {
  const uint8_t* in[kMaxReduceInputs];   // fused: k wire chunks, 16-byte aligned
  const float* f32_in;                   // naive second stage: k fp32 arrays at stride `count`
  int k;
  size_t count;
  size_t scales_offset;                  // payload_bytes(count): where an input chunk's scales start
  uint32_t block_shift;
  ScaleType scale;
  float post_scale;
  const void* plain;                     // optional plain addend (caller dtype) at plain_position
  ElemType plain_type;
  int plain_position;
  bool plain_aligned;
  void* out_plain;
  bool out_aligned;
  WireTarget out_wire;                   // requantized output (one chunk)
  bool stochastic;
  uint64_t seed;
  uint64_t sr_offset;
  CallTelemetry* rec;                    // telemetry of a requantizing reduce; the guard's flags
  bool guard;
  GuardBounds bounds;
};

// Threads per CTA and elements per CTA tile, for grid sizing.
inline constexpr int kThreads = 256;
inline constexpr int kVec = 16;
inline constexpr int kTileElems = kThreads * kVec;

cudaError_t launch_quantize_kernel(const QuantizeParams& p, ElemType in_type, Fp8Format fp8, bool native,
                                   unsigned grid, cudaStream_t stream);
// Sizes its own grid: one wave (sms x resident CTAs of the instance) looping over tiles.
cudaError_t launch_dequantize_kernel(const DequantizeParams& p, ElemType out_type, Fp8Format fp8, bool native,
                                     int sms, unsigned max_ctas, cudaStream_t stream);
cudaError_t launch_reduce_kernel(const ReduceParams& p, OutKind out, Fp8Format fp8, bool native, bool f32_inputs,
                                 unsigned grid, cudaStream_t stream);

// Logs an unsupported dispatch value (defined in launch.cpp, so the .cu files need no fmt).
void report_unsupported(const char* what, int value);

}  // namespace fp8wire::quant::detail
