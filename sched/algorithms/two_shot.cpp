// Two-shot FP8 all-reduce (docs/DESIGN.md, "Two-shot"). Scratch per stage:
// the quantized shards sent, and the receive area, whose own (never received) slot takes the reduced
// shard and which the in-place gather then fills (the reduce has consumed the received shards by
// then, on the same lane).
#include <array>

#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"
#include "sched/plan/stages.hpp"

namespace fp8wire::sched {
namespace {

ncclResult_t produce(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const ShardLayout l = shard_layout(st.length, ops.nranks(), ops.format());
  const char* src = static_cast<const char*>(a.src) + st.offset * ops.elem_size();
  return ops.quantize(src, st.length, st.set, l.segmented(), st.offset, a.residual ? a.residual + st.offset : nullptr);
}

ncclResult_t finish(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const int n = ops.nranks(), r = ops.rank();
  const quant::WireFormat& f = ops.format();
  const ShardLayout l = shard_layout(st.length, n, f);
  const size_t stride = l.seg_stride;
  char* sent = st.set;
  char* received = st.set + l.total_bytes();
  std::array<PeerSend, quant::kMaxReduceInputs> sends;
  std::array<PeerRecv, quant::kMaxReduceInputs> recvs;
  size_t ns = 0, nr = 0;
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    if (l.length(j)) sends[ns++] = {sent + j * stride, l.bytes(j, f), j};
    if (l.length(r)) recvs[nr++] = {received + j * stride, l.bytes(r, f), j};
  }
  FP8WIRE_TRY(ops.exchange({sends.data(), ns}, {recvs.data(), nr}));
  if (l.length(r)) {
    std::array<const void*, quant::kMaxReduceInputs> inputs;
    for (int j = 0; j < n; ++j) inputs[j] = (j == r ? sent : received) + j * stride;
    quant::ReduceOutput out;
    out.wire = received + r * stride;
    FP8WIRE_TRY(ops.reduce(inputs.data(), n, l.length(r), a.post, out, st.offset + l.begin(r)));
  }
  return gather_and_decode(ops, a, st, l, received);
}

}  // namespace

ncclResult_t gather_and_decode(StageOps& ops, const Fp8Args& a, const Stage& st, const ShardLayout& l, char* shards) {
  FP8WIRE_TRY(ops.gather(shards, l.seg_stride, a.gather));
  // Every rank, the owner included, decodes the same gathered bytes: identical results.
  char* dst = static_cast<char*>(a.dst) + st.offset * ops.elem_size();
  return ops.dequantize(shards, l.segmented(), st.length, dst);
}

const Fp8Algorithm kTwoShotAllReduce{produce, finish};

}  // namespace fp8wire::sched
