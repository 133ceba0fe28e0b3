// The planner's vocabulary: element types and reductions as NCCL numbers them, the path a call
// takes, and the shape of one call. Plain C++ with no CUDA or NCCL header, so everything that only
// decides (sched/plan, cost_model, stages, coalesce, agreement) builds and is tested anywhere. The
// engine converts NCCL's enums with a static_cast; sched/platform/nccl_types.hpp checks the numbering.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/config.hpp"
#include "quant/wire_format.hpp"

namespace fp8wire {

// ncclDataType_t, value for value (nccl.h): the numbering is NCCL's ABI.
enum class DataType : int {
  int8 = 0, uint8 = 1, int32 = 2, uint32 = 3, int64 = 4, uint64 = 5,
  f16 = 6, f32 = 7, f64 = 8, bf16 = 9, f8e4m3 = 10, f8e5m2 = 11,
};
// ncclRedOp_t's predefined operations, value for value; anything else is a custom operation.
enum class ReduceOp : int { sum = 0, prod = 1, max = 2, min = 3, avg = 4 };

// Bytes per element; 1 for the FP8 NCCL types and anything newer or unknown.
inline constexpr size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::int8: case DataType::uint8: return 1;
    case DataType::f16: case DataType::bf16: return 2;
    case DataType::int32: case DataType::uint32: case DataType::f32: return 4;
    case DataType::int64: case DataType::uint64: case DataType::f64: return 8;
    default: return 1;
  }
}
// The codec's element type of a dtype, when fp8wire has an FP8 path for it (fp32, fp16, bf16).
inline constexpr bool elem_type_of(DataType t, quant::ElemType* out) {
  switch (t) {
    case DataType::f32: *out = quant::ElemType::f32; return true;
    case DataType::f16: *out = quant::ElemType::f16; return true;
    case DataType::bf16: *out = quant::ElemType::bf16; return true;
    default: return false;
  }
}

// What happened to one call. The FP8 values name the algorithm; what carried its data is recorded
// apart (Carrier).
enum class Path : uint8_t {
  passthrough = 0,  // not eligible: the real NCCL call, untouched
  two_shot = 1,     // FP8 all-to-all + all-gather (the default FP8 algorithm)
  one_shot = 2,     // FP8 all-gather of quantized inputs, every rank reduces; for the all-gather and
                    // the all-to-all, their one exchange of quantized chunks
  ring = 3,         // FP8 ring (comparison only)
  fallback = 4,     // eligible, but the FP8 path could not run; passed through (reason logged once)
  hierarchical = 5, // full precision inside each host, FP8 between hosts
};
inline constexpr int kPathCount = 6;
// Slots per path in totals (calls, errors): room for paths added later without changing the C API's layout.
inline constexpr int kMaxPaths = 16;
static_assert(kPathCount <= kMaxPaths);
// Inline, so the profiler companion and the benchmark name paths the same way without linking sched.
inline const char* to_string(Path p) {
  switch (p) {
    case Path::passthrough: return "passthrough";
    case Path::two_shot: return "two_shot";
    case Path::one_shot: return "one_shot";
    case Path::ring: return "ring";
    case Path::fallback: return "fallback";
    case Path::hierarchical: return "hierarchical";
  }
  return "unknown";
}
inline bool is_fp8(Path p) { return p != Path::passthrough && p != Path::fallback; }
// The FP8 algorithm of a collective that has only one, as records and tables name it: the
// reduce-scatter's two_shot (an all-to-all of quantized chunks, then the reduce), the all-gather's and
// the all-to-all's one_shot (one exchange); passthrough for the all-reduce, which has several.
inline Path only_fp8_path(Collective c) {
  switch (c) {
    case Collective::reduce_scatter: return Path::two_shot;
    case Collective::all_gather:
    case Collective::all_to_all:
    case Collective::send_recv: return Path::one_shot;
    case Collective::all_reduce: break;
  }
  return Path::passthrough;
}

// Whether an FP8 path ends by gathering every rank's quantized slot (one-shot's exchange, two-shot's
// and ring's final all-gather, the FP8 all-gather), the step Config::gather_transport chooses the
// NCCL calls of. The FP8 reduce-scatter ends with its local reduce, the FP8 all-to-all with its one
// send/recv round (every rank a different chunk to every peer: nothing to gather); plain NCCL has none.
inline bool has_gather_step(Collective collective, Path path) {
  if (!is_fp8(path)) return false;
  return collective != Collective::reduce_scatter && collective != Collective::all_to_all &&
         collective != Collective::send_recv;
}

// What carried an FP8 call's data: NCCL's transports (send/recv, all-gather), or a direct transport's
// windows, memory every rank of a host loads and stores (peer GPU memory, or host memory shared by a
// host's ranks). The names are those of the direct.transport setting and of the records.
enum class Carrier : uint8_t { nccl = 0, peer_memory = 1, host_memory = 2 };
inline const char* to_string(Carrier t) {
  switch (t) {
    case Carrier::nccl: return "nccl";
    case Carrier::peer_memory: return "peer_memory";
    case Carrier::host_memory: return "host_memory";
  }
  return "unknown";
}

namespace sched {
// What the planner sees of one call. `count` is the element count the application passed
// (all_reduce: count; reduce_scatter: recvcount; all_gather: sendcount; all_to_all: count per peer;
// send_recv: the message's count, the same at both ends by NCCL's contract).
struct CallShape {
  Collective collective = Collective::all_reduce;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  size_t count = 0;
  int nranks = 1;
  bool to_self = false;  // send_recv: the peer is the rank itself (both ends of the message are this rank)
};
}  // namespace sched

}  // namespace fp8wire
