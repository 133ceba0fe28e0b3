// NCCL's enums as the planner's (sched/plan/types.hpp): the same numbers, checked here once.
#pragma once

#include <nccl.h>

#include "sched/plan/types.hpp"

namespace fp8wire {

static_assert(static_cast<int>(DataType::int8) == ncclInt8 && static_cast<int>(DataType::uint8) == ncclUint8 &&
              static_cast<int>(DataType::int32) == ncclInt32 && static_cast<int>(DataType::uint32) == ncclUint32 &&
              static_cast<int>(DataType::int64) == ncclInt64 && static_cast<int>(DataType::uint64) == ncclUint64 &&
              static_cast<int>(DataType::f16) == ncclFloat16 && static_cast<int>(DataType::f32) == ncclFloat32 &&
              static_cast<int>(DataType::f64) == ncclFloat64 && static_cast<int>(DataType::bf16) == ncclBfloat16,
              "DataType mirrors ncclDataType_t");
static_assert(static_cast<int>(ReduceOp::sum) == ncclSum && static_cast<int>(ReduceOp::prod) == ncclProd &&
              static_cast<int>(ReduceOp::max) == ncclMax && static_cast<int>(ReduceOp::min) == ncclMin &&
              static_cast<int>(ReduceOp::avg) == ncclAvg,
              "ReduceOp mirrors ncclRedOp_t");

inline DataType dtype_of(ncclDataType_t t) { return static_cast<DataType>(static_cast<int>(t)); }
inline ReduceOp redop_of(ncclRedOp_t op) { return static_cast<ReduceOp>(static_cast<int>(op)); }
inline ncclDataType_t nccl_dtype(DataType t) { return static_cast<ncclDataType_t>(static_cast<int>(t)); }

}  // namespace fp8wire
