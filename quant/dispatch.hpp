// One dispatch from run-time codec parameters to kernel template instances (FlashInfer's
// DISPATCH_* style). Each macro binds a constexpr name and runs the body once; an unsupported value
// is reported (logged with what it was) and the enclosing function returns cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime_api.h>

#include "quant/kernel_params.hpp"

#define FP8WIRE_DISPATCH_CASE(ENUM_VALUE, NAME, ...) \
  case ENUM_VALUE: {                                 \
    constexpr auto NAME = ENUM_VALUE;                \
    __VA_ARGS__;                                     \
    break;                                           \
  }

#define FP8WIRE_DISPATCH_DEFAULT(what, value)                                   \
  default:                                                                      \
    ::fp8wire::quant::detail::report_unsupported(what, static_cast<int>(value)); \
    return cudaErrorInvalidValue;

#define FP8WIRE_DISPATCH_FP8(value, NAME, ...)                                  \
  switch (value) {                                                              \
    FP8WIRE_DISPATCH_CASE(::fp8wire::Fp8Format::e4m3, NAME, __VA_ARGS__)        \
    FP8WIRE_DISPATCH_CASE(::fp8wire::Fp8Format::e5m2, NAME, __VA_ARGS__)        \
    FP8WIRE_DISPATCH_DEFAULT("FP8 format", value)                               \
  }

#define FP8WIRE_DISPATCH_ELEM(value, NAME, ...)                                 \
  switch (value) {                                                              \
    FP8WIRE_DISPATCH_CASE(::fp8wire::quant::ElemType::f32, NAME, __VA_ARGS__)   \
    FP8WIRE_DISPATCH_CASE(::fp8wire::quant::ElemType::f16, NAME, __VA_ARGS__)   \
    FP8WIRE_DISPATCH_CASE(::fp8wire::quant::ElemType::bf16, NAME, __VA_ARGS__)  \
    FP8WIRE_DISPATCH_DEFAULT("element type", value)                             \
  }

#define FP8WIRE_DISPATCH_OUT(value, NAME, ...)                                          \
  switch (value) {                                                                      \
    FP8WIRE_DISPATCH_CASE(::fp8wire::quant::detail::OutKind::f32, NAME, __VA_ARGS__)    \
    FP8WIRE_DISPATCH_CASE(::fp8wire::quant::detail::OutKind::f16, NAME, __VA_ARGS__)    \
    FP8WIRE_DISPATCH_CASE(::fp8wire::quant::detail::OutKind::bf16, NAME, __VA_ARGS__)   \
    FP8WIRE_DISPATCH_CASE(::fp8wire::quant::detail::OutKind::wire, NAME, __VA_ARGS__)   \
    FP8WIRE_DISPATCH_DEFAULT("reduce output kind", value)                               \
  }

#define FP8WIRE_DISPATCH_BOOL(value, NAME, ...) \
  if (value) {                                  \
    constexpr bool NAME = true;                 \
    __VA_ARGS__;                                \
  } else {                                      \
    constexpr bool NAME = false;                \
    __VA_ARGS__;                                \
  }
