// One-shot FP8 all-reduce: one gather of the quantized inputs, then every rank reduces all N copies in
// rank order. One quantization and one NCCL operation; each rank receives N-1 buffers, so it moves no
// more bytes than two-shot for N <= 3 and wins wherever a per-operation latency dominates.
#include <array>

#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"

namespace fp8wire::sched {
namespace {

ncclResult_t produce(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  const char* src = static_cast<const char*>(a.src) + st.offset * ops.elem_size();
  return ops.quantize(src, st.length, st.set + static_cast<size_t>(ops.rank()) * cb,
                      quant::Segmented::single(st.length, ops.format()), st.offset,
                      a.residual ? a.residual + st.offset : nullptr);
}

ncclResult_t finish(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const int n = ops.nranks();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  FP8WIRE_TRY(ops.gather(st.set, cb, a.gather));
  std::array<const void*, quant::kMaxReduceInputs> inputs;
  for (int j = 0; j < n; ++j) inputs[j] = st.set + static_cast<size_t>(j) * cb;
  quant::ReduceOutput out;
  out.plain = static_cast<char*>(a.dst) + st.offset * ops.elem_size();
  out.plain_type = ops.type();
  return ops.reduce(inputs.data(), n, st.length, a.post, out, st.offset);
}

}  // namespace

const Fp8Algorithm kOneShotAllReduce{produce, finish};

}  // namespace fp8wire::sched
