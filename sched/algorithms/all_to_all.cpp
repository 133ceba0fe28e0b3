// FP8 all-to-all (the application's ncclAlltoAll, equal splits): chunk j of the send buffer goes to
// rank j, chunk i of the receive buffer comes from rank i. A stage is the same element range of every
// chunk. The produce lane quantizes the stage's part of each peer's chunk into that peer's send slot,
// every chunk its own blocks (a block never straddles two chunks, so a receiver decodes exactly the
// blocks its sender encoded); the transfer lane copies the rank's own chunk exactly (it never leaves
// the GPU, so it is never quantized), exchanges the slots with every peer in one send/recv round and
// dequantizes each received slot into its place. A receiver sizes each slot from its own count, dtype
// and the agreed format, as NCCL's contract makes the peers' counts equal: no sizes are exchanged.
// Scratch per stage: the slots sent, then the slots received (sched/plan/stages.cpp).
#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"

namespace fp8wire::sched {

namespace {

// Calls fn(first, last) for the runs of peers [first, last) the stage's codec launches cover: in the
// call's single stage with whole-block chunks the peers before this rank and those after it, each
// run one segmented launch (its chunks are contiguous in the caller's buffer, its slots at the slot
// stride); else every peer alone (a stage's parts of two chunks are a chunk apart).
template <typename Fn>
ncclResult_t for_peer_runs(const StageOps& ops, const Stage& st, size_t count, Fn&& fn) {
  const int n = ops.nranks(), r = ops.rank();
  if (st.only && count % ops.format().block == 0) {
    if (r > 0) FP8WIRE_TRY(fn(0, r));
    if (r + 1 < n) FP8WIRE_TRY(fn(r + 1, n));
    return ncclSuccess;
  }
  for (int j = 0; j < n; ++j)
    if (j != r) FP8WIRE_TRY(fn(j, j + 1));
  return ncclSuccess;
}

// The program's two halves, over the arguments of one call.
ncclResult_t produce(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  const size_t es = ops.elem_size();
  const auto* src = static_cast<const char*>(a.src);
  // Guarded (one stage of whole blocks: sched/plan/guard.hpp): one launch over every chunk, the
  // rank's own too (its slot is never sent), so its last thread block casts the rank's vote over the
  // whole call onto every peer's slot.
  if (ops.guarded())
    return ops.quantize(src, a.count * static_cast<size_t>(ops.nranks()), st.set, quant::Segmented{st.length, cb}, 0);
  return for_peer_runs(ops, st, a.count, [&](int first, int last) {
    const size_t at = static_cast<size_t>(first) * a.count + st.offset;
    return ops.quantize(src + at * es, st.length * static_cast<size_t>(last - first),
                        st.set + static_cast<size_t>(first) * cb, quant::Segmented{st.length, cb}, at);
  });
}

ncclResult_t finish(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const int n = ops.nranks(), r = ops.rank();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  const size_t es = ops.elem_size();
  const auto* src = static_cast<const char*>(a.src);
  auto* dst = static_cast<char*>(a.dst);
  char* sent = st.set;
  char* received = st.set + static_cast<size_t>(n) * cb;
  const size_t own = static_cast<size_t>(r) * a.count + st.offset;
  if (src != dst) FP8WIRE_TRY(ops.copy(dst + own * es, src + own * es, st.length * es));
  const PeerRound round(r, n, sent, cb, received, cb);
  FP8WIRE_TRY(ops.exchange(round.sends(), round.recvs()));
  return for_peer_runs(ops, st, a.count, [&](int first, int last) {
    const size_t at = static_cast<size_t>(first) * a.count + st.offset;
    return ops.dequantize(received + static_cast<size_t>(first) * cb, quant::Segmented{st.length, cb},
                          st.length * static_cast<size_t>(last - first), dst + at * es);
  });
}

}  // namespace

const Fp8Algorithm kAllToAllFp8{produce, finish};

}  // namespace fp8wire::sched
