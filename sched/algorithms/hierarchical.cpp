// The hierarchical path's stage programs (algorithms.hpp, sched/plan/hierarchy.hpp).
#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"
#include "sched/plan/stages.hpp"

namespace fp8wire::sched {

namespace {

// One step of the rail's flat FP8 program over this stage's part of the rail: `length` elements as
// that program's one stage, in the buffer at `rail_set`; its wire bytes count in the call's.
ncclResult_t on_rail(StageOps& ops, Hierarchy& h, Fp8Algorithm::Step step, const Fp8Args& in, const Stage& st,
                     size_t length, char* rail_set) {
  const Stage inner_stage{st.index, 0, length, rail_set, true, true};
  StageOps rail = ops.over(h.rail_transport, h.host_index, h.hosts);
  const ncclResult_t res = step(rail, in, inner_stage);
  ops.add_wire_bytes(rail.wire_bytes());
  return res;
}

// The all-reduce's rail program: the stage's shard, all-reduced in place among the rail.
const Fp8Algorithm& rail_all_reduce(Path inner) { return inner == Path::one_shot ? kOneShotAllReduce : kTwoShotAllReduce; }
Fp8Args rail_all_reduce_args(const Fp8Args& a, const Stage& st, const HierAllReduceLayout& l) {
  Fp8Args in;
  in.src = st.set + l.shard_at;
  in.dst = st.set + l.shard_at;
  in.count = l.shard;
  in.post = a.post;  // 1/N of the whole communicator for avg: the sums inside hosts are plain sums
  in.gather = a.gather;
  return in;
}

// The reduce-scatter's rail program: the rail's blocks of the stage, reduced into this rank's block of
// the caller's output.
Fp8Args rail_reduce_scatter_args(const Fp8Args& a, const Stage& st, const HierReduceScatterLayout& l, size_t es) {
  Fp8Args in;
  in.src = st.set + l.rail_in_at;
  in.dst = static_cast<char*>(a.dst) + st.offset * es;
  in.count = st.length;
  in.post = a.post;
  return in;
}

}  // namespace

ncclResult_t HierarchicalAllReduce::produce(StageOps& ops, const Stage& st) {
  Hierarchy& h = s_->hierarchy;
  const size_t es = ops.elem_size();
  const HierAllReduceLayout l =
      hierarchical_all_reduce_layout(st.length, es, h.hosts, h.ranks_per_host, inner_, ops.format());
  const size_t L = static_cast<size_t>(h.ranks_per_host);
  const char* src = static_cast<const char*>(a_.src) + st.offset * es;
  if (st.length % L) {  // zero-padded to L whole shards
    char* padded = st.set + l.padded_in;
    FP8WIRE_TRY(ops.copy(padded, src, st.length * es));
    FP8WIRE_TRY(ops.zero(padded + st.length * es, (L * l.shard - st.length) * es));
    src = padded;
  }
  FP8WIRE_TRY(ops.reduce_scatter_plain(h.host_transport, h.ranks_per_host, src, st.set + l.shard_at, l.shard));
  return on_rail(ops, h, rail_all_reduce(inner_).produce, rail_all_reduce_args(a_, st, l), st, l.shard,
                 st.set + l.rail_at);
}

ncclResult_t HierarchicalAllReduce::finish(StageOps& ops, const Stage& st) {
  Hierarchy& h = s_->hierarchy;
  const size_t es = ops.elem_size();
  const HierAllReduceLayout l =
      hierarchical_all_reduce_layout(st.length, es, h.hosts, h.ranks_per_host, inner_, ops.format());
  FP8WIRE_TRY(on_rail(ops, h, rail_all_reduce(inner_).finish, rail_all_reduce_args(a_, st, l), st, l.shard,
                      st.set + l.rail_at));
  char* dst = static_cast<char*>(a_.dst) + st.offset * es;
  if (st.length % static_cast<size_t>(h.ranks_per_host) == 0)
    return ops.all_gather_plain(h.host_transport, h.ranks_per_host, st.set + l.shard_at, dst, l.shard);
  char* padded = st.set + l.padded_out;
  FP8WIRE_TRY(ops.all_gather_plain(h.host_transport, h.ranks_per_host, st.set + l.shard_at, padded, l.shard));
  return ops.copy(dst, padded, st.length * es);
}

ncclResult_t HierarchicalReduceScatter::produce(StageOps& ops, const Stage& st) {
  Hierarchy& h = s_->hierarchy;
  const size_t es = ops.elem_size();
  const size_t H = static_cast<size_t>(h.hosts), L = static_cast<size_t>(h.ranks_per_host);
  const HierReduceScatterLayout l = hierarchical_reduce_scatter_layout(st.length, es, h.hosts, h.ranks_per_host, ops.format());
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
  FP8WIRE_TRY(ops.reduce_scatter_plain(h.host_transport, h.ranks_per_host, permuted, st.set + l.rail_in_at,
                                       H * st.length));
  return on_rail(ops, h, kReduceScatterFp8.produce, rail_reduce_scatter_args(a_, st, l, es), st, st.length,
                 st.set + l.rail_at);
}

ncclResult_t HierarchicalReduceScatter::finish(StageOps& ops, const Stage& st) {
  Hierarchy& h = s_->hierarchy;
  const size_t es = ops.elem_size();
  const HierReduceScatterLayout l = hierarchical_reduce_scatter_layout(st.length, es, h.hosts, h.ranks_per_host, ops.format());
  return on_rail(ops, h, kReduceScatterFp8.finish, rail_reduce_scatter_args(a_, st, l, es), st, st.length,
                 st.set + l.rail_at);
}

}  // namespace fp8wire::sched
