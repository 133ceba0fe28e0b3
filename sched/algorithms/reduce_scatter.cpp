// FP8 reduce-scatter (docs/DESIGN.md: steps 1-3 of the all-reduce): the send buffer's N blocks are
// quantized, block j goes to rank j, rank j reduces its N copies in rank order into the caller's
// dtype. Scratch per stage: the quantized blocks sent, and those received.
#include <array>

#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"

namespace fp8wire::sched {
namespace {

ncclResult_t produce(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const int n = ops.nranks();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  const auto* src = static_cast<const char*>(a.src);
  for (int j = 0; j < n; ++j) {
    const size_t first = static_cast<size_t>(j) * a.count + st.offset;
    FP8WIRE_TRY(ops.quantize(src + first * ops.elem_size(), st.length, st.set + static_cast<size_t>(j) * cb,
                             quant::Segmented::single(st.length, ops.format()), first));
  }
  return ncclSuccess;
}

ncclResult_t finish(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const int n = ops.nranks(), r = ops.rank();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  char* sent = st.set;
  char* received = st.set + static_cast<size_t>(n) * cb;
  const PeerRound round(r, n, sent, cb, received, cb);
  FP8WIRE_TRY(ops.exchange(round.sends(), round.recvs()));
  std::array<const void*, quant::kMaxReduceInputs> inputs;
  for (int j = 0; j < n; ++j) inputs[j] = (j == r ? sent : received) + j * cb;
  quant::ReduceOutput out;
  out.plain = static_cast<char*>(a.dst) + st.offset * ops.elem_size();
  out.plain_type = ops.type();
  return ops.reduce(inputs.data(), n, st.length, a.post, out, static_cast<size_t>(r) * a.count + st.offset);
}

}  // namespace

const Fp8Algorithm kReduceScatterFp8{produce, finish};

}  // namespace fp8wire::sched
