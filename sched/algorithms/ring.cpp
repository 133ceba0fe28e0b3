// Ring FP8 all-reduce, the comparison the benchmark keeps: N-1 hops, each receiving the running sum
// of one chunk, adding the local (exact) values and requantizing, then the same gather and decode as
// two-shot. It quantizes N-1 times where two-shot quantizes twice.
#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"
#include "sched/plan/stages.hpp"

namespace fp8wire::sched {
namespace {

ncclResult_t produce(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const int n = ops.nranks(), r = ops.rank();
  const ShardLayout l = shard_layout(st.length, n, ops.format());
  // Rank r starts by sending its own copy of chunk r-1.
  const int c0 = (r - 1 + n) % n;
  if (!l.length(c0)) return ncclSuccess;
  const char* src = static_cast<const char*>(a.src) + (st.offset + l.begin(c0)) * ops.elem_size();
  return ops.quantize(src, l.length(c0), st.set, quant::Segmented::single(l.length(c0), ops.format()),
                      st.offset + l.begin(c0));
}

ncclResult_t finish(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const int n = ops.nranks(), r = ops.rank();
  const quant::WireFormat& f = ops.format();
  const ShardLayout l = shard_layout(st.length, n, f);
  const size_t stride = l.seg_stride;
  // Send slot, receive slot, then the gathered buffer.
  char* sent = st.set;
  char* received = st.set + stride;
  char* gathered = st.set + 2 * stride;
  const auto* src = static_cast<const char*>(a.src);
  for (int step = 0; step + 1 < n; ++step) {
    const int c_send = ((r - step - 1) % n + n) % n;
    const int c_recv = ((r - step - 2) % n + n) % n;
    const PeerSend send{sent, l.bytes(c_send, f), (r + 1) % n};
    const PeerRecv recv{received, l.bytes(c_recv, f), (r - 1 + n) % n};
    FP8WIRE_TRY(ops.exchange({&send, 1}, {&recv, 1}));
    if (!l.length(c_recv)) continue;
    const bool last = step + 2 == n;
    const void* acc = received;
    quant::ReduceOutput out;
    out.wire = last ? gathered + r * stride : sent;
    FP8WIRE_TRY(ops.reduce_with_plain(&acc, 1, src + (st.offset + l.begin(c_recv)) * ops.elem_size(), 1,
                                      l.length(c_recv), last ? a.post : 1.0f, out, st.offset + l.begin(c_recv)));
  }
  return gather_and_decode(ops, a, st, l, gathered);
}

}  // namespace

const Fp8Algorithm kRingAllReduce{produce, finish};

}  // namespace fp8wire::sched
