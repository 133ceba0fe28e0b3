// The CPU reference codec: it *defines* the FP8 wire format bit for bit (quant/fp8_math.hpp holds the
// arithmetic, quant/README.md the prose). The GPU kernels (quant/quant.hpp) must produce identical
// bytes. Plain C++, no CUDA, so CI tests it on machines without a GPU. Host memory only; the
// functions mirror the launchers one for one and take the same arguments.
//
// Errors: every function returns nullptr on success, else a message naming the bad argument.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/telemetry.hpp"
#include "quant/wire_format.hpp"

namespace fp8wire::quant::ref {

// Telemetry (quant/telemetry.hpp), as the kernels do it when `telemetry` is given: a quantize adds
// its figures to record->input, a requantizing reduce to record->requant, exactly as defined (fp64);
// with the guard on, each writes its vote as the flag of the chunks it writes, and every decode and
// reduce ORs the flags it reads into the record.

// Element i of the call uses stochastic-rounding bits hash(fmt.seed, sr_offset + i).
const char* quantize(const void* in, ElemType in_type, size_t count, void* wire, Segmented layout,
                     const WireFormat& fmt, uint64_t sr_offset = 0, const TelemetryOptions* telemetry = nullptr);

const char* dequantize(const void* wire, Segmented layout, size_t count, void* out, ElemType out_type,
                       const WireFormat& fmt, const TelemetryOptions* telemetry = nullptr);

struct ReduceOutput {
  void* plain = nullptr;
  ElemType plain_type = ElemType::f32;
  void* wire = nullptr;   // one chunk (Segmented::single)
};

// sum over inputs[0..k) (each one chunk of `count` elements) in order, in fp32; the optional plain
// addend (caller dtype) sits at position plain_position in [0, k]; then * post_scale unless it is 1.
const char* dequantize_reduce(const void* const* inputs, int k, const void* plain, ElemType plain_type,
                              int plain_position, size_t count, float post_scale, ReduceOutput out,
                              const WireFormat& fmt, uint64_t sr_offset = 0,
                              const TelemetryOptions* telemetry = nullptr);

// x = in + residual (fp32), quantize x, residual = x - dequant(quant(x)); a non-finite block resets
// its residual to 0 (the step will be skipped by the loss scaler; the residual must not stay NaN).
const char* quantize_with_residual(const void* in, ElemType in_type, size_t count, float* residual,
                                   void* wire, Segmented layout, const WireFormat& fmt,
                                   uint64_t sr_offset = 0, const TelemetryOptions* telemetry = nullptr);

// The figures of quantizing x[0..n) as one chunk would add (for tests: per block, as defined).
ErrorStats measure(const float* x, size_t n, const WireFormat& fmt);
// Whether the chunk of n elements at `chunk` carries the guard flag.
bool guard_flag(const void* chunk, size_t n, const WireFormat& fmt);

// Element helpers (exposed for tests): caller-dtype load/store through fp32, canonical NaN on store.
float load_elem(const void* p, ElemType t, size_t i);
void store_elem(void* p, ElemType t, size_t i, float v);

}  // namespace fp8wire::quant::ref
