// The codec launchers the execution core calls, as a table: the GPU kernels (quant/quant.hpp) in the
// library, the CPU reference codec run as simulated stream work in the CPU tier. Same signatures, so
// an algorithm cannot tell which one runs it.
#pragma once

#include "quant/quant.hpp"

namespace fp8wire {

struct CodecApi {
  decltype(&quant::quantize) quantize = nullptr;
  decltype(&quant::quantize_with_residual) quantize_with_residual = nullptr;
  decltype(&quant::dequantize) dequantize = nullptr;
  decltype(&quant::dequantize_reduce) dequantize_reduce = nullptr;
  decltype(&quant::dequantize_reduce_mixed) dequantize_reduce_mixed = nullptr;
  // Not a codec kernel: the profiler's call-begin mark (null: none on this platform).
  decltype(&quant::mark_call_begin) mark_call_begin = nullptr;
};

}  // namespace fp8wire
