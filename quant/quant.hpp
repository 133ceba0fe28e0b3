// Host launchers of the FP8 codec kernels, declared apart from them: plain functions taking device
// pointers, counts, the wire format and a stream. They never allocate, never synchronise, and are
// safe to call while the stream is captured into a CUDA graph (all arguments travel as kernel
// parameters).
// An unsupported combination returns cudaErrorInvalidValue and logs what was unsupported.
//
// Every kernel matches the CPU reference codec (quant/reference.hpp) bit for bit.
// Wire buffers (and the residual) must be 16-byte aligned (cudaMalloc'd scratch always is); caller
// buffers need only be aligned to their element size (a launcher rejects less); 16-byte aligned ones
// get the widest vector loads and stores.
// quant/README.md defines the format and the arithmetic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "quant/telemetry.hpp"
#include "quant/wire_format.hpp"

namespace fp8wire::quant {

struct LaunchOptions {
  ConvertPath path = ConvertPath::automatic;
  // Stochastic rounding: element i of this call uses random bits hash(seed, sr_offset + i), so the
  // result does not depend on how a buffer is cut into calls or chunks.
  uint64_t sr_offset = 0;
  // Work given to one CTA, for tuning and the kernel benchmark (0 = the launcher's choice, which is what
  // every production caller uses). quantize and the reduce: tiles of 4096 elements a CTA loops over
  // (1 = one CTA per tile); dequantize: 16-byte output units per thread per tile (1, 2 or 4).
  uint32_t work_per_cta = 0;
  // At most this many CTAs (0 = no cap): kernels that load or store a peer's memory directly (the
  // direct transports) leave the rest of the GPU to the job's compute. The kernels loop over tiles,
  // so any grid covers the whole buffer.
  uint32_t max_ctas = 0;
  // Tuning only (the kernel benchmark compares kernel versions in one run): 0 = the production
  // kernels; 1 = quantize with plain (cached) loads instead of streaming ones; 2 = quantize at 8
  // resident CTAs per SM (32 registers) instead of 6; 3 = quantize without the full-tile fast path
  // (every tile through the general per-group code, as before the fast path existed).
  uint32_t kernel_variant = 0;
  // The call's own error figures and the guard's flags (quant/telemetry.hpp): quantize adds to
  // record->input, a requantizing reduce to record->requant; the record must be 8-byte aligned
  // device memory, and zeroed before the call's first launch.
  TelemetryOptions telemetry;
};

// in[0..count) (caller dtype) -> segmented wire buffer.
cudaError_t quantize(const void* in, ElemType in_type, size_t count, void* wire, Segmented layout,
                     const WireFormat& fmt, cudaStream_t stream, LaunchOptions opt = {});

// Segmented wire buffer -> out[0..count) (caller dtype).
cudaError_t dequantize(const void* wire, Segmented layout, size_t count, void* out, ElemType out_type,
                       const WireFormat& fmt, cudaStream_t stream, LaunchOptions opt = {});

// Fused dequantize-reduce: k chunks of `count` elements each (inputs[i] points at a chunk), summed in
// fp32 in the order inputs[0], inputs[1], ..., inputs[k-1], multiplied by post_scale (1, or 1/N for
// ncclAvg) once, then written either in the caller's dtype (out_plain != nullptr) or requantized as
// one chunk (out_wire != nullptr). Exactly one of the two outputs is given. One pass over memory.
// `inputs` is a host array; the pointers are copied into the kernel's parameters.
struct ReduceOutput {
  void* plain = nullptr;
  ElemType plain_type = ElemType::f32;
  void* wire = nullptr;
};
cudaError_t dequantize_reduce(const void* const* inputs, int k, size_t count, float post_scale,
                              ReduceOutput out, const WireFormat& fmt, cudaStream_t stream,
                              LaunchOptions opt = {});

// Same, but one of the addends is a plain (unquantized) caller-dtype buffer added at position
// `plain_position` in the order (used by the ring comparison algorithm and by one-shot variants that
// keep the local contribution exact). Pass plain == nullptr to ignore.
cudaError_t dequantize_reduce_mixed(const void* const* inputs, int k, const void* plain,
                                    ElemType plain_type, int plain_position, size_t count,
                                    float post_scale, ReduceOutput out, const WireFormat& fmt,
                                    cudaStream_t stream, LaunchOptions opt = {});

// Baseline for the benchmark only: dequantize each chunk to a full-size fp32 buffer in memory
// (scratch_f32 holds k*count floats), then reduce. Same arithmetic order, same result.
cudaError_t dequantize_then_reduce_naive(const void* const* inputs, int k, size_t count,
                                         float post_scale, float* scratch_f32, ReduceOutput out,
                                         const WireFormat& fmt, cudaStream_t stream,
                                         LaunchOptions opt = {});

// Error feedback: residual[i] += x[i] - dequant(quant(x))[i] is computed by quantize_with_residual,
// which first adds the stored residual to the input (x = in + residual), quantizes x, and stores the
// new residual x - dequant(quant(x)) in fp32. `residual` holds count floats.
cudaError_t quantize_with_residual(const void* in, ElemType in_type, size_t count, float* residual,
                                   void* wire, Segmented layout, const WireFormat& fmt,
                                   cudaStream_t stream, LaunchOptions opt = {});

// The exposure profiler's call-begin mark: an empty kernel on `stream` (quant/call_mark.cu).
cudaError_t mark_call_begin(cudaStream_t stream);

// Whether this device has native FP8 conversion instructions (sm_89+).
bool device_has_native_fp8(int device);

}  // namespace fp8wire::quant
