// The hierarchical path's stage programs (algorithms.hpp, sched/hierarchy.hpp).
#include "common/status.hpp"
#include "sched/algorithms.hpp"
#include "sched/stages.hpp"

namespace fp8wire::sched {

namespace {
constexpr size_t kAlign = 256;
size_t up(size_t n) { return quant::align_up(n, kAlign); }
}  // namespace

HierarchicalAllReduce::Layout HierarchicalAllReduce::layout(size_t len, size_t es, int hosts, int ranks_per_host,
                                                            Path inner, const quant::WireFormat& f) {
  Layout l;
  const size_t L = static_cast<size_t>(ranks_per_host);
  l.shard = (len + L - 1) / L;
  const size_t padded = up(L * l.shard * es);
  l.padded_in = 0;
  l.shard_at = padded;
  l.rail_at = l.shard_at + up(l.shard * es);
  l.padded_out = l.rail_at + up(stage_scratch_bytes(Collective::all_reduce, inner, l.shard, hosts, f));
  l.total = l.padded_out + padded;
  return l;
}

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
  const Layout l = layout(st.length, es, h.hosts, h.ranks_per_host, inner_, ops.format());
  const size_t L = static_cast<size_t>(h.ranks_per_host);
  const char* src = static_cast<const char*>(a_.src) + st.offset * es;
  if (st.length % L) {  // zero-padded to L whole shards
    char* padded = st.set + l.padded_in;
    FP8WIRE_TRY(ops.copy(padded, src, st.length * es));
    FP8WIRE_TRY(ops.zero(padded + st.length * es, (L * l.shard - st.length) * es));
    src = padded;
  }
  FP8WIRE_TRY(ops.reduce_scatter_plain(s_->host_transport, h.ranks_per_host, src, st.set + l.shard_at, l.shard));
  Stage inner_stage{st.index, 0, l.shard, st.set + l.rail_at, true, true};
  StageOps rail = ops.over(s_->rail_transport, h.host_index, h.hosts);
  const Fp8Args in = inner_args(st, l, es);
  const ncclResult_t res = inner_ == Path::one_shot ? OneShotAllReduce(in).produce(rail, inner_stage)
                                                    : TwoShotAllReduce(in).produce(rail, inner_stage);
  ops.add_wire_bytes(rail.wire_bytes());
  return res;
}

ncclResult_t HierarchicalAllReduce::finish(StageOps& ops, const Stage& st) {
  const Hierarchy& h = s_->hierarchy;
  const size_t es = ops.elem_size();
  const Layout l = layout(st.length, es, h.hosts, h.ranks_per_host, inner_, ops.format());
  const size_t L = static_cast<size_t>(h.ranks_per_host);
  Stage inner_stage{st.index, 0, l.shard, st.set + l.rail_at, true, true};
  StageOps rail = ops.over(s_->rail_transport, h.host_index, h.hosts);
  const Fp8Args in = inner_args(st, l, es);
  const ncclResult_t res = inner_ == Path::one_shot ? OneShotAllReduce(in).finish(rail, inner_stage)
                                                    : TwoShotAllReduce(in).finish(rail, inner_stage);
  ops.add_wire_bytes(rail.wire_bytes());
  FP8WIRE_TRY(res);
  char* dst = static_cast<char*>(a_.dst) + st.offset * es;
  if (st.length % L == 0)
    return ops.all_gather_plain(s_->host_transport, h.ranks_per_host, st.set + l.shard_at, dst, l.shard);
  char* padded = st.set + l.padded_out;
  FP8WIRE_TRY(ops.all_gather_plain(s_->host_transport, h.ranks_per_host, st.set + l.shard_at, padded, l.shard));
  return ops.copy(dst, padded, st.length * es);
}

HierarchicalReduceScatter::Layout HierarchicalReduceScatter::layout(size_t len, size_t es, int hosts, int ranks_per_host,
                                                                    const quant::WireFormat& f) {
  Layout l;
  const size_t n = static_cast<size_t>(hosts) * static_cast<size_t>(ranks_per_host);
  l.permuted = 0;
  l.rail_in_at = up(n * len * es);
  l.rail_at = l.rail_in_at + up(static_cast<size_t>(hosts) * len * es);
  l.total = l.rail_at + up(stage_scratch_bytes(Collective::reduce_scatter, Path::two_shot, len, hosts, f));
  return l;
}

ncclResult_t HierarchicalReduceScatter::produce(StageOps& ops, const Stage& st) {
  const Hierarchy& h = s_->hierarchy;
  const size_t es = ops.elem_size();
  const size_t H = static_cast<size_t>(h.hosts), L = static_cast<size_t>(h.ranks_per_host);
  const Layout l = layout(st.length, es, h.hosts, h.ranks_per_host, ops.format());
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
  FP8WIRE_TRY(ops.reduce_scatter_plain(s_->host_transport, h.ranks_per_host, permuted, st.set + l.rail_in_at,
                                       H * st.length));
  Fp8Args in;
  in.src = st.set + l.rail_in_at;
  in.dst = static_cast<char*>(a_.dst) + st.offset * es;
  in.count = st.length;
  in.post = a_.post;
  Stage inner_stage{st.index, 0, st.length, st.set + l.rail_at, true, true};
  StageOps rail = ops.over(s_->rail_transport, h.host_index, h.hosts);
  const ncclResult_t res = ReduceScatterFp8(in).produce(rail, inner_stage);
  ops.add_wire_bytes(rail.wire_bytes());
  return res;
}

ncclResult_t HierarchicalReduceScatter::finish(StageOps& ops, const Stage& st) {
  const Hierarchy& h = s_->hierarchy;
  const size_t es = ops.elem_size();
  const Layout l = layout(st.length, es, h.hosts, h.ranks_per_host, ops.format());
  Fp8Args in;
  in.src = st.set + l.rail_in_at;
  in.dst = static_cast<char*>(a_.dst) + st.offset * es;
  in.count = st.length;
  in.post = a_.post;
  Stage inner_stage{st.index, 0, st.length, st.set + l.rail_at, true, true};
  StageOps rail = ops.over(s_->rail_transport, h.host_index, h.hosts);
  const ncclResult_t res = ReduceScatterFp8(in).finish(rail, inner_stage);
  ops.add_wire_bytes(rail.wire_bytes());
  return res;
}

size_t hierarchical_stage_elems(const ScratchLayout& scratch, Collective collective, size_t count, size_t es,
                                int hosts, int ranks_per_host, Path inner, const quant::WireFormat& f) {
  if (count == 0) return 0;
  auto need = [&](size_t len) {
    return collective == Collective::reduce_scatter
               ? HierarchicalReduceScatter::layout(len, es, hosts, ranks_per_host, f).total
               : HierarchicalAllReduce::layout(len, es, hosts, ranks_per_host, inner, f).total;
  };
  if (need(count) <= 2 * scratch.set_bytes) return count;
  const size_t unit = collective == Collective::reduce_scatter
                          ? f.block
                          : static_cast<size_t>(ranks_per_host) * static_cast<size_t>(hosts) * f.block;
  if (need(unit) > scratch.set_bytes) return 0;
  size_t lo = 1, hi = (count + unit - 1) / unit;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo + 1) / 2;
    if (need(mid * unit) <= scratch.set_bytes) lo = mid; else hi = mid - 1;
  }
  return lo * unit;
}

}  // namespace fp8wire::sched
