// The codec launchers the execution core calls, as a table (one line per launcher in
// codec_functions.def): the GPU kernels (quant/quant.hpp) in the library, the CPU reference codec run
// as simulated stream work in the CPU tier. Same signatures, so an algorithm cannot tell which one
// runs it.
#pragma once

#include "quant/quant.hpp"

namespace fp8wire {

struct CodecApi {
#define FP8WIRE_CODEC_FN(name) decltype(&quant::name) name = nullptr;
#include "sched/platform/codec_functions.def"
#undef FP8WIRE_CODEC_FN
};

}  // namespace fp8wire
