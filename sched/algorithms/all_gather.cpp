// FP8 all-gather: quantize, gather the chunks, decode every rank's chunk into its place. Lossy on
// weights, so off unless configured (collectives.all_gather).
#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"

namespace fp8wire::sched {
namespace {

ncclResult_t finish(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const int n = ops.nranks();
  const quant::WireFormat& f = ops.format();
  const size_t cb = quant::chunk_bytes(st.length, f);
  FP8WIRE_TRY(ops.gather(st.set, cb, a.gather));
  auto* dst = static_cast<char*>(a.dst);
  if (st.only && st.length % f.block == 0) {
    // Whole slots, block aligned: the gathered buffer is one segmented buffer.
    return ops.dequantize(st.set, quant::Segmented{st.length, cb}, st.length * static_cast<size_t>(n), dst);
  }
  for (int j = 0; j < n; ++j) {
    const size_t first = static_cast<size_t>(j) * a.count + st.offset;
    FP8WIRE_TRY(ops.dequantize(st.set + static_cast<size_t>(j) * cb, quant::Segmented::single(st.length, f),
                               st.length, dst + first * ops.elem_size()));
  }
  return ncclSuccess;
}

}  // namespace

// The produce is one-shot's: this rank's stage quantized into its own slot of the gather (an
// all-gather carries no residual).
const Fp8Algorithm kAllGatherFp8{kOneShotAllReduce.produce, finish};

}  // namespace fp8wire::sched
