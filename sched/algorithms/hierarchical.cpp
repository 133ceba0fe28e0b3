// The hierarchical path's stage programs (algorithms.hpp, sched/plan/hierarchy.hpp).
#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"
#include "sched/plan/stages.hpp"

namespace fp8wire::sched {

Fp8Args HierarchicalAllReduce::inner_args(const Stage& st, const Layout& l, size_t) const {
  Fp8Args in;
  in.src = st.set + l.shard_at;
  in.dst = st.set + l.shard_at;
  in.count = l.shard;
  in.post = a_.post;  // 1/N of the whole communicator for avg: the sums inside hosts are plain sums
  in.gather = a_.gather;
  return in;
}

ncclResult_t HierarchicalAllReduce::produce(StageOps& ops, const Stage& st) {
  const Hierarchy& h = s_->hierarchy;
  const size_t es = ops.elem_size();
  const Layout l = hierarchical_all_reduce_layout(st.length, es, h.hosts, h.ranks_per_host, inner_, ops.format());
  const size_t L = static_cast<size_t>(h.ranks_per_host);
  const char* src = static_cast<const char*>(a_.src) + st.offset * es;
  if (st.length % L) {  // zero-padded to L whole shards
    char* padded = st.set + l.padded_in;
    FP8WIRE_TRY(ops.copy(padded, src, st.length * es));
    FP8WIRE_TRY(ops.zero(padded + st.length * es, (L * l.shard - st.length) * es));
    src = padded;
  }
  FP8WIRE_TRY(
      ops.reduce_scatter_plain(s_->hierarchy.host_transport, h.ranks_per_host, src, st.set + l.shard_at, l.shard));
  Stage inner_stage{st.index, 0, l.shard, st.set + l.rail_at, true, true};
  StageOps rail = ops.over(s_->hierarchy.rail_transport, h.host_index, h.hosts);
  const Fp8Args in = inner_args(st, l, es);
  const ncclResult_t res = inner_ == Path::one_shot ? OneShotAllReduce(in).produce(rail, inner_stage)
                                                    : TwoShotAllReduce(in).produce(rail, inner_stage);
  ops.add_wire_bytes(rail.wire_bytes());
  return res;
}

ncclResult_t HierarchicalAllReduce::finish(StageOps& ops, const Stage& st) {
  const Hierarchy& h = s_->hierarchy;
  const size_t es = ops.elem_size();
  const Layout l = hierarchical_all_reduce_layout(st.length, es, h.hosts, h.ranks_per_host, inner_, ops.format());
  const size_t L = static_cast<size_t>(h.ranks_per_host);
  Stage inner_stage{st.index, 0, l.shard, st.set + l.rail_at, true, true};
  StageOps rail = ops.over(s_->hierarchy.rail_transport, h.host_index, h.hosts);
  const Fp8Args in = inner_args(st, l, es);
  const ncclResult_t res = inner_ == Path::one_shot ? OneShotAllReduce(in).finish(rail, inner_stage)
                                                    : TwoShotAllReduce(in).finish(rail, inner_stage);
  ops.add_wire_bytes(rail.wire_bytes());
  FP8WIRE_TRY(res);
  char* dst = static_cast<char*>(a_.dst) + st.offset * es;
  if (st.length % L == 0)
    return ops.all_gather_plain(s_->hierarchy.host_transport, h.ranks_per_host, st.set + l.shard_at, dst, l.shard);
  char* padded = st.set + l.padded_out;
  FP8WIRE_TRY(
      ops.all_gather_plain(s_->hierarchy.host_transport, h.ranks_per_host, st.set + l.shard_at, padded, l.shard));
  return ops.copy(dst, padded, st.length * es);
}

ncclResult_t HierarchicalReduceScatter::produce(StageOps& ops, const Stage& st) {
  const Hierarchy& h = s_->hierarchy;
  const size_t es = ops.elem_size();
  const size_t H = static_cast<size_t>(h.hosts), L = static_cast<size_t>(h.ranks_per_host);
  const Layout l = hierarchical_reduce_scatter_layout(st.length, es, h.hosts, h.ranks_per_host, ops.format());
  // Block (local rank l', host h') of this stage at position l' * H + h': the host's reduce-scatter
  // then leaves local rank l' the H blocks of its rail, in host order.
  const char* src = static_cast<const char*>(a_.src);
  char* permuted = st.set + l.permuted;
  for (size_t lr = 0; lr < L; ++lr)
    for (size_t hh = 0; hh < H; ++hh) {
      const size_t parent = static_cast<size_t>(h.rank_at[hh * L + lr]);
      FP8WIRE_TRY(ops.copy(permuted + (lr * H + hh) * st.length * es, src + (parent * a_.count + st.offset) * es,
                           st.length * es));
    }
  FP8WIRE_TRY(ops.reduce_scatter_plain(s_->hierarchy.host_transport, h.ranks_per_host, permuted, st.set + l.rail_in_at,
                                       H * st.length));
  Fp8Args in;
  in.src = st.set + l.rail_in_at;
  in.dst = static_cast<char*>(a_.dst) + st.offset * es;
  in.count = st.length;
  in.post = a_.post;
  Stage inner_stage{st.index, 0, st.length, st.set + l.rail_at, true, true};
  StageOps rail = ops.over(s_->hierarchy.rail_transport, h.host_index, h.hosts);
  const ncclResult_t res = ReduceScatterFp8(in).produce(rail, inner_stage);
  ops.add_wire_bytes(rail.wire_bytes());
  return res;
}

ncclResult_t HierarchicalReduceScatter::finish(StageOps& ops, const Stage& st) {
  const Hierarchy& h = s_->hierarchy;
  const size_t es = ops.elem_size();
  const Layout l = hierarchical_reduce_scatter_layout(st.length, es, h.hosts, h.ranks_per_host, ops.format());
  Fp8Args in;
  in.src = st.set + l.rail_in_at;
  in.dst = static_cast<char*>(a_.dst) + st.offset * es;
  in.count = st.length;
  in.post = a_.post;
  Stage inner_stage{st.index, 0, st.length, st.set + l.rail_at, true, true};
  StageOps rail = ops.over(s_->hierarchy.rail_transport, h.host_index, h.hosts);
  const ncclResult_t res = ReduceScatterFp8(in).finish(rail, inner_stage);
  ops.add_wire_bytes(rail.wire_bytes());
  return res;
}

}  // namespace fp8wire::sched
