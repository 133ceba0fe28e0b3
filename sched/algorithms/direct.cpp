// The FP8 algorithms over a direct transport (sched/transport/direct_windows.hpp). The arithmetic is that of
// their NCCL twins (one_shot.cpp, two_shot.cpp, reduce_scatter.cpp, all_gather.cpp: the same chunks,
// the same rank order, the same stochastic-rounding offsets), so every rank ends with the same bytes
// either way; what differs is who moves them, which the call's protocol says (DirectProtocol, chosen
// by the planner: sched/plan/recipe.hpp). The flag handshakes of each phase are the protocol of
// sched/transport/direct_windows.hpp, on the lane that reads or writes: a stage reclaims its buffer set
// before its first write (the produce lane) and releases it after its last read (the transfer lane).
//
// Window of one buffer set:
//   one-shot, all-gather   [my quantized stage]                               read by every rank
//   two-shot               [inbox: one shard slot per writer][my reduced shard] the inbox read by me,
//                                                                               the reduced shard by all
//   reduce-scatter         [inbox: one block slot per writer]                  read by me
//   all-to-all             [inbox: one chunk slot per writer]                  read by me
//
// kernels: a quantize stores straight into the window its readers read (its own for one-shot and the
// all-gather, the owner's inbox for two-shot and the reduce-scatter), and a fused dequantize-reduce
// loads every rank's window in rank order: over NVLink or PCIe P2P for peer memory, over PCIe from
// host memory. Kernels that touch a window keep to the recipe's window_ctas thread blocks.
//
// copy_engine (host memory): every byte over the link is a copy engine's, and every codec kernel reads
// and writes device memory only, at the codec's own width:
//   - own data on the device: what only this rank reads of its own (its own shard or block, its own
//     reduced shard, its own input) stays in the stage's device buffer set instead of crossing the
//     host link twice, and what its peers read of it is copied into its window before the publish;
//   - copy-in: what this rank reads of its peers is first copied from their windows into the device
//     set, and the set is released as soon as the copies are done, before the reduce, so the peers may
//     refill their windows while this rank computes. The copy-in slots of a stage are no slot its
//     produce lane writes (that lane's own chunk and copy-out slots lie elsewhere in the set:
//     device_slots), so the stage's copy-in is issued before the transfer lane waits for the stage's
//     produce (the executor's produce gate, sched/exec/pipeline.hpp): the ranks of one host share the
//     copy engines in the order their copies arrive, and a transfer lane that waited for its own
//     copy-out first would leave the peers' published data unread meanwhile;
//   - copy-out: what this rank writes for one peer alone (the reduce-scatter's block, two-shot's shard
//     for its owner) is quantized into the device set's copy-out slots and copied into that peer's
//     inbox. The one-shot all-reduce and the all-gather write nothing for one peer alone (their own
//     chunk already goes by a copy).
// The bytes are those of the kernels protocol, so are the results. Each part is a choice of this rank
// alone (its peers read the same windows either way): a stage whose slots do not fit the device set
// goes through the windows for that part. Measured against the kernels protocol over host memory:
// never slower and up to 1.3x faster with the copies alone, and with the copy lanes and paced sends of
// the executor 1.03-1.66x more at 2 ranks (docs/PERF.md, "Host-link limit").
//
// Device set of one stage, with copy-in (slot j holds rank j's data; this rank's own is slot r):
//   one-shot, all-gather, reduce-scatter   [slot 0 .. slot n-1]                    chunk (block) each
//   two-shot                               [inbox slots 0..n-1][reduced slots 0..n-1]  one shard each
// and with own data only: the own chunk (block), or two-shot's [own shard][own reduced shard].
// Copy-out slots (slot j: this rank's block or shard for rank j) follow those (device_slots).
#include <array>
#include <utility>

#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"
#include "sched/transport/direct_windows.hpp"
#include "sched/plan/stages.hpp"

namespace fp8wire::sched {

namespace {
constexpr int kInputs = 0;   // phase: the quantized inputs (or shards, or blocks)
constexpr int kReduced = 1;  // phase: two-shot's reduced shards

// Where this rank's device buffer set holds a stage's data (null: through the windows).
struct DeviceSlots {
  char* own = nullptr;     // the produce lane's own data (device_slots says where)
  char* staged = nullptr;  // slot 0 of the copy-in slots, `stride` bytes apart (null: no copy-in)
  char* out = nullptr;     // slot 0 of the copy-out slots, `stride` bytes apart (null: no copy-out)
  size_t stride = 0;
  char* slot(int j) const { return staged + static_cast<size_t>(j) * stride; }
  char* out_slot(int j) const { return out + static_cast<size_t>(j) * stride; }
};

// The device slots of a stage whose per-rank unit is `unit` bytes, `units` of them per rank
// (two-shot: its shard and its reduced shard), laid out as above (the copy_engine protocol only):
// the copy-in slots where they fit the device set, else the own data alone, and the copy-out slots
// after them where those fit too.
DeviceSlots device_slots(const Fp8Args& a, const Stage& st, int rank, int nranks, size_t unit, int units) {
  DeviceSlots d;
  if (a.protocol != DirectProtocol::copy_engine || !a.device_set_bytes || !st.set) return d;
  const size_t n = static_cast<size_t>(nranks);
  d.stride = unit;
  if (units * n * unit <= a.device_set_bytes) {
    d.staged = st.set;
    d.own = d.slot(rank);
  } else if (units * unit <= a.device_set_bytes) {
    d.own = st.set;
  } else {
    return d;
  }
  char* from = st.set + (d.staged ? units * n : units) * unit;
  if (from + n * unit <= st.set + a.device_set_bytes) d.out = from;
  return d;
}

// Quantizes `len` elements from element `first` of the input into `to` (with error feedback, the input
// plus its residual).
ncclResult_t quantize_part(StageOps& ops, const Fp8Args& a, size_t first, size_t len, char* to) {
  const char* in = static_cast<const char*>(a.src) + first * ops.elem_size();
  float* residual = a.residual ? a.residual + first : nullptr;
  return ops.quantize(in, len, to, quant::Segmented::single(len, ops.format()), first, residual);
}

// Quantizes `len` elements from element `first` of the input for rank j, `bytes` of wire whose place
// is `window` (rank j's inbox slot for this rank): this rank's own into the device set where it is
// kept there; a peer's straight into `window` or, with copy-out slots, into slot j of those and then
// by a copy engine.
ncclResult_t quantize_for(StageOps& ops, const Fp8Args& a, const DeviceSlots& dev, int j, size_t first, size_t len,
                          char* window, size_t bytes) {
  const bool own = j == ops.rank() && dev.own;
  char* to = own ? dev.own : dev.out ? dev.out_slot(j) : window;
  FP8WIRE_TRY(quantize_part(ops, a, first, len, to));
  return own || to == window ? ncclSuccess : ops.copy(window, to, bytes, cudaMemcpyDefault);
}

// Copies slots [0, n) but `skip` from a window laid out like `to` (slot j at `from + j * stride`,
// `bytes` used of each) into device slots: one copy per run of contiguous slots. What the peers wrote
// only, into copy-in slots: a fetch, which may run before the stage's own produce (StageOps::fetch).
ncclResult_t copy_slots_but(StageOps& ops, char* to, const char* from, size_t stride, size_t bytes, int n, int skip) {
  for (auto [first, last] : {std::pair{0, skip}, std::pair{skip + 1, n}}) {
    if (first >= last) continue;
    const size_t offset = static_cast<size_t>(first) * stride;
    FP8WIRE_TRY(ops.fetch(to + offset, from + offset, static_cast<size_t>(last - first - 1) * stride + bytes));
  }
  return ncclSuccess;
}

// A stage's copy-in of phase `phase`: once every peer has published it, each peer j's `bytes_of(j)`
// bytes at `from(j)` (none when 0) into device slot j + `at`, one copy per peer (their parts lie apart).
template <class From, class BytesOf>
ncclResult_t copy_in(StageOps& ops, int set, int phase, const DeviceSlots& dev, size_t at, From from, BytesOf bytes_of) {
  FP8WIRE_TRY(ops.acquire(set, phase));
  for (int j = 0; j < ops.nranks(); ++j)
    if (j != ops.rank() && bytes_of(j)) FP8WIRE_TRY(ops.fetch(dev.slot(j) + at, from(j), bytes_of(j)));
  return ncclSuccess;
}

// A stage's reads of the peers' data of phase `phase`: copied in (where the device set holds it; the
// set is then released at once) or waited for in the windows. The release after the reads, where the
// reads are of the windows, is the caller's (end_reads).
template <class CopyIn>
ncclResult_t begin_reads(StageOps& ops, int set, int phase, const DeviceSlots& dev, CopyIn copy) {
  if (!dev.staged) return ops.acquire(set, phase);
  FP8WIRE_TRY(copy());
  return ops.release(set);
}
ncclResult_t end_reads(StageOps& ops, int set, const DeviceSlots& dev) {
  return dev.staged ? ncclSuccess : ops.release(set);
}

// One-shot and the all-gather: this rank's quantized stage into its own window, which every rank reads
// (with own data on the device, quantized there and copied into the window by a copy engine).
ncclResult_t produce_own_chunk(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  char* window = ops.direct()->window(ops.rank(), st.set_index);
  char* own = device_slots(a, st, ops.rank(), ops.nranks(), cb, 1).own;
  FP8WIRE_TRY(ops.reclaim(st.set_index));
  FP8WIRE_TRY(quantize_part(ops, a, st.offset, st.length, own ? own : window));
  if (own) FP8WIRE_TRY(ops.copy(window, own, cb, cudaMemcpyDefault));
  ops.add_wire_bytes(cb * static_cast<uint64_t>(ops.nranks() - 1));
  return ops.publish(st.set_index, kInputs);
}

// One-shot and the all-gather read every rank's chunk of the stage: its window, or its copy-in slot,
// this rank's own where it kept it on the device.
struct ChunkReads {
  DeviceSlots dev;
  std::array<const void*, quant::kMaxReduceInputs> from{};
};
ncclResult_t read_every_chunk(StageOps& ops, const Fp8Args& a, const Stage& st, ChunkReads* r) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), me = ops.rank();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  r->dev = device_slots(a, st, me, n, cb, 1);
  for (int j = 0; j < n; ++j) r->from[j] = r->dev.staged ? r->dev.slot(j) : d.window(j, st.set_index);
  if (r->dev.own) r->from[me] = r->dev.own;
  return begin_reads(ops, st.set_index, kInputs, r->dev, [&] {
    return copy_in(
        ops, st.set_index, kInputs, r->dev, 0, [&](int j) { return d.window(j, st.set_index); },
        [&](int) { return cb; });
  });
}

// The reduce-scatter and two-shot: this rank's part for rank j (`write_for(j)`), every rank's in rank
// order, then one signal to all.
template <class WriteFor>
ncclResult_t write_for_each(StageOps& ops, int set, WriteFor write_for) {
  for (int j = 0; j < ops.nranks(); ++j) FP8WIRE_TRY(write_for(j));
  return ops.publish(set, kInputs);
}

// --- one-shot ---------------------------------------------------------------------------------------
ncclResult_t one_shot_finish(StageOps& ops, const Fp8Args& a, const Stage& st) {
  ChunkReads r;
  FP8WIRE_TRY(read_every_chunk(ops, a, st, &r));
  quant::ReduceOutput out;
  out.plain = static_cast<char*>(a.dst) + st.offset * ops.elem_size();
  out.plain_type = ops.type();
  FP8WIRE_TRY(ops.reduce(r.from.data(), ops.nranks(), st.length, a.post, out, st.offset));
  return end_reads(ops, st.set_index, r.dev);
}

// --- two-shot ---------------------------------------------------------------------------------------
ncclResult_t two_shot_produce(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const quant::WireFormat& f = ops.format();
  const ShardLayout l = shard_layout(st.length, n, f);
  const DeviceSlots dev = device_slots(a, st, r, n, l.seg_stride, 2);
  FP8WIRE_TRY(ops.reclaim(st.set_index));
  // Shard j into owner j's inbox, slot r: straight (the transfer is this kernel's stores) or by copy-out.
  return write_for_each(ops, st.set_index, [&](int j) -> ncclResult_t {
    const size_t len = l.length(j);
    if (!len) return ncclSuccess;
    if (j != r) ops.add_wire_bytes(l.bytes(j, f));
    return quantize_for(ops, a, dev, j, st.offset + l.begin(j), len, d.window(j, st.set_index) + r * l.seg_stride,
                        l.bytes(j, f));
  });
}

// Where one stage of two-shot keeps what its finish and its gather share.
struct TwoShotPlaces {
  ShardLayout l;
  size_t reduced_at;  // in a window, and in the copy-in slots
  char* mine;         // this rank's window (its inbox, then its reduced shard)
  DeviceSlots dev;
  char* own_reduced;  // this rank's own reduced shard on the device (null: in its window)
};
TwoShotPlaces two_shot_places(const StageOps& ops, const Fp8Args& a, const Stage& st) {
  const int n = ops.nranks(), r = ops.rank();
  TwoShotPlaces p{shard_layout(st.length, n, ops.format()), 0, ops.direct()->window(r, st.set_index), {}, nullptr};
  p.reduced_at = static_cast<size_t>(n) * p.l.seg_stride;
  p.dev = device_slots(a, st, r, n, p.l.seg_stride, 2);
  // After its own shard, or in its reduced slot.
  p.own_reduced = !p.dev.own ? nullptr : p.dev.staged ? p.dev.slot(r) + p.reduced_at : p.dev.own + p.l.seg_stride;
  return p;
}

ncclResult_t two_shot_finish(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const int n = ops.nranks(), r = ops.rank();
  const quant::WireFormat& f = ops.format();
  const TwoShotPlaces p = two_shot_places(ops, a, st);
  const ShardLayout& l = p.l;
  // Writer j's shard for this rank, in this rank's inbox.
  auto shard_of = [&](int j) -> const char* { return p.mine + j * l.seg_stride; };
  if (p.dev.staged && l.length(r)) {
    FP8WIRE_TRY(ops.acquire(st.set_index, kInputs));
    FP8WIRE_TRY(copy_slots_but(ops, p.dev.staged, p.mine, l.seg_stride, l.bytes(r, f), n, r));
  } else {
    FP8WIRE_TRY(ops.acquire(st.set_index, kInputs));
  }
  if (l.length(r)) {
    std::array<const void*, quant::kMaxReduceInputs> inputs;
    for (int j = 0; j < n; ++j) inputs[j] = p.dev.staged ? p.dev.slot(j) : shard_of(j);
    if (p.dev.own && !p.dev.staged) inputs[r] = p.dev.own;
    quant::ReduceOutput out;
    out.wire = p.own_reduced ? p.own_reduced : p.mine + p.reduced_at;
    FP8WIRE_TRY(ops.reduce(inputs.data(), n, l.length(r), a.post, out, st.offset + l.begin(r)));
    if (p.own_reduced) FP8WIRE_TRY(ops.copy(p.mine + p.reduced_at, p.own_reduced, l.bytes(r, f), cudaMemcpyDefault));
    ops.add_wire_bytes(l.bytes(r, f) * static_cast<uint64_t>(n - 1));
  }
  return ops.publish(st.set_index, kReduced);
}

ncclResult_t two_shot_gather(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const quant::WireFormat& f = ops.format();
  const TwoShotPlaces p = two_shot_places(ops, a, st);
  const ShardLayout& l = p.l;
  // Every rank, the owner included, decodes the same reduced bytes: identical results.
  auto reduced_of = [&](int j) -> const char* {
    if (j == r && p.own_reduced) return p.own_reduced;
    return p.dev.staged ? p.dev.slot(j) + p.reduced_at : d.window(j, st.set_index) + p.reduced_at;
  };
  FP8WIRE_TRY(begin_reads(ops, st.set_index, kReduced, p.dev, [&] {
    return copy_in(
        ops, st.set_index, kReduced, p.dev, p.reduced_at,
        [&](int j) { return d.window(j, st.set_index) + p.reduced_at; },
        [&](int j) { return l.length(j) ? l.bytes(j, f) : 0; });
  }));
  char* dst = static_cast<char*>(a.dst);
  for (int j = 0; j < n; ++j) {
    const size_t len = l.length(j);
    if (!len) continue;
    FP8WIRE_TRY(ops.dequantize(reduced_of(j), quant::Segmented::single(len, f), len,
                               dst + (st.offset + l.begin(j)) * ops.elem_size()));
  }
  return end_reads(ops, st.set_index, p.dev);
}

// --- reduce-scatter ---------------------------------------------------------------------------------
// The reduce-scatter and the all-to-all: block j, the j-th `count` elements of the input (the stage's
// part of it), quantized on its own for rank j into that rank's inbox, slot r. The all-to-all's own
// chunk never leaves the GPU (`skip_own`): its finish copies it exactly.
ncclResult_t produce_blocks(StageOps& ops, const Fp8Args& a, const Stage& st, bool skip_own) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  const DeviceSlots dev = device_slots(a, st, r, n, cb, 1);
  FP8WIRE_TRY(ops.reclaim(st.set_index));
  return write_for_each(ops, st.set_index, [&](int j) -> ncclResult_t {
    if (j == r && skip_own) return ncclSuccess;
    if (j != r) ops.add_wire_bytes(cb);
    return quantize_for(ops, a, dev, j, static_cast<size_t>(j) * a.count + st.offset, st.length,
                        d.window(j, st.set_index) + r * cb, cb);
  });
}

ncclResult_t reduce_scatter_produce(StageOps& ops, const Fp8Args& a, const Stage& st) {
  return produce_blocks(ops, a, st, false);
}

ncclResult_t reduce_scatter_finish(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  char* mine = d.window(r, st.set_index);
  const DeviceSlots dev = device_slots(a, st, r, n, cb, 1);
  // Writer j's block for this rank, in this rank's inbox.
  std::array<const void*, quant::kMaxReduceInputs> inputs;
  for (int j = 0; j < n; ++j) inputs[j] = dev.staged ? dev.slot(j) : mine + j * cb;
  if (dev.own) inputs[r] = dev.own;
  FP8WIRE_TRY(begin_reads(ops, st.set_index, kInputs, dev, [&]() -> ncclResult_t {
    FP8WIRE_TRY(ops.acquire(st.set_index, kInputs));
    return copy_slots_but(ops, dev.staged, mine, cb, cb, n, r);
  }));
  quant::ReduceOutput out;
  out.plain = static_cast<char*>(a.dst) + st.offset * ops.elem_size();
  out.plain_type = ops.type();
  FP8WIRE_TRY(ops.reduce(inputs.data(), n, st.length, a.post, out, static_cast<size_t>(r) * a.count + st.offset));
  return end_reads(ops, st.set_index, dev);
}

// --- all-to-all -------------------------------------------------------------------------------------
// The reduce-scatter's pattern with a decode in place of the reduce, the same bytes as its NCCL twin
// (all_to_all.cpp): each peer's chunk through the inboxes, the own one copied on the GPU.
ncclResult_t all_to_all_produce(StageOps& ops, const Fp8Args& a, const Stage& st) {
  return produce_blocks(ops, a, st, true);
}

ncclResult_t all_to_all_finish(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const quant::WireFormat& f = ops.format();
  const size_t cb = quant::chunk_bytes(st.length, f);
  const size_t es = ops.elem_size();
  char* mine = d.window(r, st.set_index);
  const DeviceSlots dev = device_slots(a, st, r, n, cb, 1);
  const auto* src = static_cast<const char*>(a.src);
  auto* dst = static_cast<char*>(a.dst);
  const size_t own = static_cast<size_t>(r) * a.count + st.offset;
  if (src != dst) FP8WIRE_TRY(ops.copy(dst + own * es, src + own * es, st.length * es));
  FP8WIRE_TRY(begin_reads(ops, st.set_index, kInputs, dev, [&]() -> ncclResult_t {
    FP8WIRE_TRY(ops.acquire(st.set_index, kInputs));
    return copy_slots_but(ops, dev.staged, mine, cb, cb, n, r);
  }));
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    const char* from = dev.staged ? dev.slot(j) : mine + j * cb;
    FP8WIRE_TRY(ops.dequantize(from, quant::Segmented::single(st.length, f), st.length,
                               dst + (static_cast<size_t>(j) * a.count + st.offset) * es));
  }
  return end_reads(ops, st.set_index, dev);
}

// --- all-gather -------------------------------------------------------------------------------------
ncclResult_t all_gather_finish(StageOps& ops, const Fp8Args& a, const Stage& st) {
  const quant::WireFormat& f = ops.format();
  ChunkReads r;
  FP8WIRE_TRY(read_every_chunk(ops, a, st, &r));
  auto* dst = static_cast<char*>(a.dst);
  for (int j = 0; j < ops.nranks(); ++j) {
    const size_t first = static_cast<size_t>(j) * a.count + st.offset;
    FP8WIRE_TRY(ops.dequantize(r.from[j], quant::Segmented::single(st.length, f), st.length, dst + first * ops.elem_size()));
  }
  return end_reads(ops, st.set_index, r.dev);
}

}  // namespace

const Fp8Algorithm kDirectOneShotAllReduce{produce_own_chunk, one_shot_finish};
const Fp8Algorithm kDirectTwoShotAllReduce{two_shot_produce, two_shot_finish, two_shot_gather};
const Fp8Algorithm kDirectReduceScatter{reduce_scatter_produce, reduce_scatter_finish};
const Fp8Algorithm kDirectAllGather{produce_own_chunk, all_gather_finish};
const Fp8Algorithm kDirectAllToAll{all_to_all_produce, all_to_all_finish};

}  // namespace fp8wire::sched
