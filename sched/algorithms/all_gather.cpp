// FP8 all-gather: quantize, gather the chunks, decode every rank's chunk into its place. Lossy on
// weights, so off unless configured (collectives.all_gather).
#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"

namespace fp8wire::sched {

ncclResult_t AllGatherFp8::produce(StageOps& ops, const Stage& st) {
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  const char* src = static_cast<const char*>(a_.src) + st.offset * ops.elem_size();
  return ops.quantize(src, st.length, st.set + static_cast<size_t>(ops.rank()) * cb,
                      quant::Segmented::single(st.length, ops.format()), st.offset);
}

ncclResult_t AllGatherFp8::finish(StageOps& ops, const Stage& st) {
  const int n = ops.nranks();
  const quant::WireFormat& f = ops.format();
  const size_t cb = quant::chunk_bytes(st.length, f);
  FP8WIRE_TRY(ops.gather(st.set, cb, a_.gather));
  auto* dst = static_cast<char*>(a_.dst);
  if (st.only && st.length % f.block == 0) {
    // Whole slots, block aligned: the gathered buffer is one segmented buffer.
    return ops.dequantize(st.set, quant::Segmented{st.length, cb}, st.length * static_cast<size_t>(n), dst);
  }
  for (int j = 0; j < n; ++j) {
    const size_t first = static_cast<size_t>(j) * a_.count + st.offset;
    FP8WIRE_TRY(ops.dequantize(st.set + static_cast<size_t>(j) * cb, quant::Segmented::single(st.length, f),
                               st.length, dst + first * ops.elem_size()));
  }
  return ncclSuccess;
}

}  // namespace fp8wire::sched
