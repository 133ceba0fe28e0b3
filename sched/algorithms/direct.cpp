// The FP8 algorithms over a direct transport (sched/transport/direct_windows.hpp). The arithmetic is that of
// their NCCL twins (one_shot.cpp, two_shot.cpp, reduce_scatter.cpp, all_gather.cpp: the same chunks,
// the same rank order, the same stochastic-rounding offsets), so every rank ends with the same bytes
// either way; what differs is who moves them. A quantize stores straight into the window its readers
// read (its own for one-shot and the all-gather, the owner's inbox for two-shot and the
// reduce-scatter, or with direct.outbox its own for those too), and a fused dequantize-reduce loads
// every rank's window in rank order: over NVLink or PCIe P2P for peer memory, over PCIe from host
// memory. The flag handshakes of each phase are the
// protocol of sched/transport/direct_windows.hpp, on the lane that reads or writes: a stage reclaims its buffer set
// before its first write (the produce lane) and releases it after its last read (the transfer lane).
//
// Window of one buffer set:
//   one-shot, all-gather   [my quantized stage]                               read by every rank
//   two-shot               [inbox: one shard slot per writer][my reduced shard] the inbox read by me,
//                                                                               the reduced shard by all
//   reduce-scatter         [inbox: one block slot per writer]                  read by me
// and with direct.outbox (below) two-shot's inbox and the reduce-scatter's become an outbox: one
// slot per reader, each read by its reader.
//
// Own data on the device (direct.own_on_device, host memory only; Fp8Args::own_device_bytes): what
// only this rank reads of its own (its own shard or block, its own reduced shard, its own input)
// stays in the stage's device buffer set instead of crossing the host link twice, and what its peers
// read of it is copied into its window by a copy engine (no SM, the pinned-copy rate) before the
// publish. The bytes are the same either way, so are the results. A stage whose own data does not fit
// the device set goes through the window, as without the option (a choice of this rank alone: its
// peers read the same window either way).
//
// Copy-in (direct.copy_in, with own data on the device; Fp8Args::copy_in): what this rank reads of
// its peers is first copied from their windows into the device set by a copy engine, and the kernels
// read device memory only, so every byte over the link is DMA. The set is released as soon as the
// copies are done, before the reduce, so the peers may refill their windows while this rank computes.
// Again the same bytes and results, and a choice of this rank alone (it falls back to reading the
// windows where the stage's slots do not fit the device set). On by default with copy-out (below):
// together they were never slower and up to 1.3x faster (docs/PERF.md "Host-link limit").
// The copy-in slots of a stage are no slot its produce lane writes (that lane's own chunk and
// copy-out slots lie elsewhere in the set: device_slots), so with direct.early_copy_in a stage's
// copy-in (StageOps::fetch) is issued before the transfer lane waits for the stage's produce: the
// ranks of one host share the copy engines in the order their copies arrive, so this rank's own
// copy-out may wait behind its peers', and a transfer lane that waited for it first would leave
// their published data unread meanwhile.
//
// Copy-out (direct.copy_out, with own data on the device; Fp8Args::copy_out): what this rank writes for
// one peer alone (the reduce-scatter's block, two-shot's shard for its owner) is quantized into the
// device set's copy-out slots and copied into that peer's inbox (with an outbox: all of them into this
// rank's outbox, in one copy) by a copy engine, instead of the quantize storing it there over the link;
// with copy-in too, every byte over the link is a copy engine's, and every kernel reads and writes
// device memory only (at the codec's width, not direct.ctas). The one-shot all-reduce and the all-gather
// write nothing for one peer alone (their own chunk already goes by a copy). Again the same bytes, a
// choice of this rank alone, and a stage whose slots do not fit the set falls back to the quantize's
// stores.
//
// Lanes apart (direct.lanes_apart, with own data on the device; Fp8Args::own_per_lane): the finish
// quantizes this rank's own data once more, on the transfer lane, into the first half of the device
// set, and reads that instead of what the produce lane put in the second half. The same input, length
// and offset give the same bytes, so the result is unchanged; and the transfer lane then reads nothing
// its own produce lane writes (what it reads of any window, its own reduce-scatter inbox included,
// the peers wrote, under their flags), so the executor places no hand-over between the lanes but the
// release's (sched/exec/pipeline.cpp): fp8wire-direct-probe measured the two hand-overs together
// keeping the link's directions apart. One-shot, the reduce-scatter and the all-gather only:
// two-shot's transfer lane writes its reduced shard into its window, which only the reclaim guards
// (on the produce lane, or with copy lanes the send lane). The cost is a second quantize of the
// rank's own chunk per stage.
// With copy-in and copy-out too, the copy-in slots, the transfer lane's own chunk among them, lie in
// the first half and the copy-out slots in the second after the produce lane's own chunk
// (device_slots), so neither lane touches what the other does, whatever each stage's layout.
//
// Per-peer flags (direct.per_peer_flags; StageOps::per_peer_flags): where a rank writes something for
// one peer alone (the reduce-scatter's blocks, two-shot's shards) it signals that peer right after
// that write, its own part last, and where it copies in it takes each peer's part right after that
// peer's signal, instead of one publish to all after every write and one acquire of all before any
// copy. Each flag is set and waited for as the whole steps do, so a rank may do either while its
// peers do the other. Measured level with the whole steps on the emulated testbed (docs/PERF.md
// "Host-link limit"), off by default. With an outbox a writer's one copy holds every peer's part, so it
// signals all at once after it; its readers still take each writer's part right after its signal.
//
// Outbox (direct.outbox; Fp8Args::outbox): the reduce-scatter's blocks and two-shot's shards wait in
// their writer's own window instead of their reader's inbox, slot k of writer w holding its part for
// reader (w + 1 + k) mod n: the parts for its peers fill slots 0 .. n-2 side by side, so with
// copy-out (whose device slots follow the same order) one copy sends them all, and its own part, where
// it goes through the window, takes slot n-1. Each reader takes its part from every writer's window,
// as one-shot's readers do: the same bytes each way and the same results, with fewer and larger
// copies from the GPU and more and smaller ones to it (on the emulated testbed copies of 1 MiB from
// the GPU keep less of the link than those to it: docs/PERF.md "Host-link limit"). Unlike the
// options above, a layout every rank must share, so it is part of the configuration's fingerprint.
//
// Device set of one stage, with copy-in (slot j holds rank j's data; this rank's own is slot r):
//   one-shot, all-gather, reduce-scatter   [slot 0 .. slot n-1]                    chunk (block) each
//   two-shot                               [inbox slots 0..n-1][reduced slots 0..n-1]  one shard each
// and with own data only: the own chunk (block), or two-shot's [own shard][own reduced shard].
// Copy-out slots (slot j: this rank's block or shard for rank j; with an outbox, slot k: its part for
// outbox slot k's reader) follow those (device_slots).
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

// Outbox (above): the slot of writer `writer`'s outbox that holds its part for `reader` (its own: n-1).
size_t outbox_slot(int writer, int reader, int n) { return static_cast<size_t>((reader - writer - 1 + n) % n); }

// Where this rank's device buffer set holds a stage's data (null: through the windows).
struct DeviceSlots {
  char* own = nullptr;     // the produce lane's own data (device_slots says where)
  char* staged = nullptr;  // slot 0 of the copy-in slots, `stride` bytes apart (null: no copy-in)
  char* out = nullptr;     // slot 0 of the copy-out slots, `stride` bytes apart (null: no copy-out)
  size_t stride = 0;
  char* slot(int j) const { return staged + static_cast<size_t>(j) * stride; }
  char* out_slot(int j) const { return out + static_cast<size_t>(j) * stride; }
};

// Lanes apart: the bytes of each half of the device set, one lane's each (device_slots).
size_t half_set(size_t own_device_bytes) { return own_device_bytes / 2 / 256 * 256; }

// The device slots of a stage whose per-rank unit is `unit` bytes, `units` of them per rank
// (two-shot: its shard and its reduced shard), laid out as above. With the lanes apart each lane
// keeps to one half of the set, whatever a stage's length and whether its copy-in slots fit (a short
// last stage's may where a full stage's did not): the produce lane to the second half (its own chunk
// at the start, then its copy-out slots), the transfer lane to the first (its own chunk, or the
// copy-in slots with its own as slot r). Otherwise the copy-out slots follow the own or copy-in slots.
DeviceSlots device_slots(const Fp8Args& a, const Stage& st, int rank, int nranks, size_t unit, int units) {
  DeviceSlots d;
  if (!a.own_device_bytes || !st.set) return d;
  const size_t n = static_cast<size_t>(nranks);
  const size_t room = a.own_per_lane ? half_set(a.own_device_bytes) : a.own_device_bytes;
  d.stride = unit;
  if (a.copy_in && units * n * unit <= room) {
    d.staged = st.set;
    d.own = a.own_per_lane ? st.set + room : d.slot(rank);
  } else if (units * unit <= room) {
    d.own = a.own_per_lane ? st.set + room : st.set;
  } else {
    return d;
  }
  if (a.copy_out) {
    char* from = a.own_per_lane ? d.own + unit : st.set + (d.staged ? units * n : units) * unit;
    char* end = st.set + (a.own_per_lane ? 2 * room : a.own_device_bytes);
    if (from + n * unit <= end) d.out = from;
  }
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

// Outbox (above): quantizes rank j's part (`quantize_to(j, to)`, `bytes_of(j)` bytes of wire; none when
// 0) for every peer into this rank's outbox `box` (slot k for reader(k), slots `stride` apart) or, with
// copy-out slots, into those in the same order and then into the outbox by one copy per run of slots;
// its own part where it keeps its own data (the device set, else the outbox's last slot); then one
// signal to all.
template <class QuantizeTo, class BytesOf>
ncclResult_t write_outbox(StageOps& ops, int set, const DeviceSlots& dev, char* box, size_t stride,
                          QuantizeTo quantize_to, BytesOf bytes_of) {
  const int n = ops.nranks(), r = ops.rank();
  auto reader = [&](int k) { return (r + 1 + k) % n; };
  for (int k = 0; k < n; ++k) {
    const int j = reader(k);
    if (!bytes_of(j)) continue;
    const size_t at = static_cast<size_t>(k) * stride;
    FP8WIRE_TRY(quantize_to(j, j == r ? (dev.own ? dev.own : box + at) : dev.out ? dev.out + at : box + at));
  }
  // A run ends at a slot its part does not fill (the copy moves no byte nobody wrote) or an empty one.
  for (int k = 0; dev.out && k + 1 < n;) {
    if (!bytes_of(reader(k))) {
      ++k;
      continue;
    }
    const int first = k;
    while (k + 2 < n && bytes_of(reader(k)) == stride && bytes_of(reader(k + 1))) ++k;
    const size_t at = static_cast<size_t>(first) * stride;
    FP8WIRE_TRY(ops.copy(box + at, dev.out + at, static_cast<size_t>(k - first) * stride + bytes_of(reader(k)),
                         cudaMemcpyDefault));
    ++k;
  }
  return ops.publish(set, kInputs);
}

// Lanes apart: quantizes this rank's own `st.length` elements from element `first` of the input into
// the transfer lane's half of the stage's device set (the first; device_slots), on the current
// (transfer) lane; *own = where.
ncclResult_t quantize_own_here(StageOps& ops, const Fp8Args& a, const Stage& st, const DeviceSlots& dev, int rank,
                               size_t first, char** own) {
  *own = dev.staged ? dev.slot(rank) : st.set;
  return ops.quantize(static_cast<const char*>(a.src) + first * ops.elem_size(), st.length, *own,
                      quant::Segmented::single(st.length, ops.format()), first);
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

// Per-peer flags (direct.per_peer_flags): the k-th peer (k = 0 .. n-2) this rank takes data from,
// the next ranks first, and the k-th it signals, the previous ranks first; so the first peer each rank
// waits on is the one that signals it first.
int peer_to_take(int rank, int n, int k) { return (rank + 1 + k) % n; }
int peer_to_signal(int rank, int n, int k) { return (rank - 1 - k + n) % n; }

// Peer j's part of a stage's copy-in: `bytes` at `from` (none when 0).
struct Part {
  const char* from;
  size_t bytes;
};

// Copies every peer j's part (`part_of(j)`) into device slot j + `at`: one fetch per peer, their
// parts lying apart.
template <class PartOf>
ncclResult_t fetch_parts(StageOps& ops, const DeviceSlots& dev, size_t at, PartOf part_of) {
  for (int j = 0; j < ops.nranks(); ++j)
    if (const Part p = j == ops.rank() ? Part{nullptr, 0} : part_of(j); p.bytes)
      FP8WIRE_TRY(ops.fetch(dev.slot(j) + at, p.from, p.bytes));
  return ncclSuccess;
}

// A stage's copy-in of phase `phase` into the device slots (slot j + `at` for peer j): with per-peer
// flags each peer's part (`part_of(j)`) right after that peer's signal, so the copy engine moves what
// one peer has written while another is still writing; otherwise after every peer's signal, by
// `all()` (which may move adjacent parts in one copy).
template <class PartOf, class All>
ncclResult_t copy_in(StageOps& ops, int set, int phase, const DeviceSlots& dev, size_t at, PartOf part_of, All all) {
  const int n = ops.nranks(), r = ops.rank();
  if (!ops.per_peer_flags()) {
    FP8WIRE_TRY(ops.acquire(set, phase));
    return all();
  }
  for (int k = 0; k + 1 < n; ++k) {
    const int j = peer_to_take(r, n, k);
    FP8WIRE_TRY(ops.acquire_from(set, phase, j, k + 2 == n));
    if (const Part p = part_of(j); p.bytes) FP8WIRE_TRY(ops.fetch(dev.slot(j) + at, p.from, p.bytes));
  }
  return ncclSuccess;
}
// The same where the peers' parts lie apart (every window but an inbox): one fetch per peer either way.
template <class PartOf>
ncclResult_t copy_in(StageOps& ops, int set, int phase, const DeviceSlots& dev, size_t at, PartOf part_of) {
  return copy_in(ops, set, phase, dev, at, part_of, [&] { return fetch_parts(ops, dev, at, part_of); });
}

// A stage's writes of phase `phase`, one part per rank (`write_for(j)`: what rank j reads; this rank's
// own included): with per-peer flags each peer's part then its signal, this rank's own part last;
// otherwise every part in rank order, then one signal to all.
template <class WriteFor>
ncclResult_t write_for_each(StageOps& ops, int set, int phase, WriteFor write_for) {
  const int n = ops.nranks(), r = ops.rank();
  if (!ops.per_peer_flags()) {
    for (int j = 0; j < n; ++j) FP8WIRE_TRY(write_for(j));
    return ops.publish(set, phase);
  }
  for (int k = 0; k + 1 < n; ++k) {
    const int j = peer_to_signal(r, n, k);
    FP8WIRE_TRY(write_for(j));
    FP8WIRE_TRY(ops.publish_to(set, phase, j));
  }
  return write_for(r);
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
}  // namespace

bool direct_lanes_apart_fits(Collective collective, Path path, size_t stage_elems, size_t own_device_bytes,
                             const quant::WireFormat& f) {
  const bool program = collective != Collective::all_reduce || path == Path::one_shot;
  return program && stage_elems > 0 && quant::chunk_bytes(stage_elems, f) <= half_set(own_device_bytes);
}

// --- one-shot ---------------------------------------------------------------------------------------
ncclResult_t DirectOneShotAllReduce::produce(StageOps& ops, const Stage& st) { return produce_own_chunk(ops, a_, st); }

ncclResult_t DirectOneShotAllReduce::finish(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  const DeviceSlots dev = device_slots(a_, st, r, n, cb, 1);
  std::array<const void*, quant::kMaxReduceInputs> inputs;
  for (int j = 0; j < n; ++j) inputs[j] = dev.staged ? dev.slot(j) : d.window(j, st.set_index);
  if (dev.own) inputs[r] = dev.own;
  if (a_.own_per_lane) {  // before the wait on the peers, which it then overlaps
    char* own = nullptr;
    FP8WIRE_TRY(quantize_own_here(ops, a_, st, dev, r, st.offset, &own));
    inputs[r] = own;
  }
  if (dev.staged) {
    FP8WIRE_TRY(
        copy_in(ops, st.set_index, kInputs, dev, 0, [&](int j) { return Part{d.window(j, st.set_index), cb}; }));
    FP8WIRE_TRY(ops.release(st.set_index));
  } else {
    FP8WIRE_TRY(ops.acquire(st.set_index, kInputs));
  }
  quant::ReduceOutput out;
  out.plain = static_cast<char*>(a_.dst) + st.offset * ops.elem_size();
  out.plain_type = ops.type();
  FP8WIRE_TRY(ops.reduce(inputs.data(), n, st.length, a_.post, out, st.offset));
  return dev.staged ? ncclSuccess : ops.release(st.set_index);
}

// --- two-shot ---------------------------------------------------------------------------------------
ncclResult_t DirectTwoShotAllReduce::produce(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const quant::WireFormat& f = ops.format();
  const ShardLayout l = shard_layout(st.length, n, f);
  const DeviceSlots dev = device_slots(a_, st, r, n, l.seg_stride, 2);
  FP8WIRE_TRY(ops.reclaim(st.set_index));
  if (a_.outbox) {
    for (int j = 0; j < n; ++j)
      if (j != r && l.length(j)) ops.add_wire_bytes(l.bytes(j, f));
    return write_outbox(
        ops, st.set_index, dev, d.window(r, st.set_index), l.seg_stride,
        [&](int j, char* to) { return quantize_part(ops, a_, st.offset + l.begin(j), l.length(j), to); },
        [&](int j) { return l.length(j) ? l.bytes(j, f) : 0; });
  }
  // Shard j into owner j's inbox, slot r: straight (the transfer is this kernel's stores) or by copy-out.
  return write_for_each(ops, st.set_index, kInputs, [&](int j) -> ncclResult_t {
    const size_t len = l.length(j);
    if (!len) return ncclSuccess;
    if (j != r) ops.add_wire_bytes(l.bytes(j, f));
    return quantize_for(ops, a_, dev, j, st.offset + l.begin(j), len, d.window(j, st.set_index) + r * l.seg_stride,
                        l.bytes(j, f));
  });
}

namespace {
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
}  // namespace

ncclResult_t DirectTwoShotAllReduce::finish(StageOps& ops, const Stage& st) {
  const int n = ops.nranks(), r = ops.rank();
  const quant::WireFormat& f = ops.format();
  const TwoShotPlaces p = two_shot_places(ops, a_, st);
  const ShardLayout& l = p.l;
  // Writer j's shard for this rank: in this rank's inbox, or in j's outbox.
  auto shard_of = [&](int j) -> const char* {
    if (a_.outbox) return ops.direct()->window(j, st.set_index) + outbox_slot(j, r, n) * l.seg_stride;
    return p.mine + j * l.seg_stride;
  };
  if (p.dev.staged && l.length(r)) {
    auto part = [&](int j) { return Part{shard_of(j), l.bytes(r, f)}; };
    if (a_.outbox) {
      FP8WIRE_TRY(copy_in(ops, st.set_index, kInputs, p.dev, 0, part));
    } else {
      FP8WIRE_TRY(copy_in(ops, st.set_index, kInputs, p.dev, 0, part, [&] {
        return copy_slots_but(ops, p.dev.staged, p.mine, l.seg_stride, l.bytes(r, f), n, r);
      }));
    }
  } else {
    FP8WIRE_TRY(ops.acquire(st.set_index, kInputs));
  }
  if (l.length(r)) {
    std::array<const void*, quant::kMaxReduceInputs> inputs;
    for (int j = 0; j < n; ++j) inputs[j] = p.dev.staged ? p.dev.slot(j) : shard_of(j);
    if (p.dev.own && !p.dev.staged) inputs[r] = p.dev.own;
    quant::ReduceOutput out;
    out.wire = p.own_reduced ? p.own_reduced : p.mine + p.reduced_at;
    FP8WIRE_TRY(ops.reduce(inputs.data(), n, l.length(r), a_.post, out, st.offset + l.begin(r)));
    if (p.own_reduced) FP8WIRE_TRY(ops.copy(p.mine + p.reduced_at, p.own_reduced, l.bytes(r, f), cudaMemcpyDefault));
    ops.add_wire_bytes(l.bytes(r, f) * static_cast<uint64_t>(n - 1));
  }
  return ops.publish(st.set_index, kReduced);
}

ncclResult_t DirectTwoShotAllReduce::gather(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const quant::WireFormat& f = ops.format();
  const TwoShotPlaces p = two_shot_places(ops, a_, st);
  const ShardLayout& l = p.l;
  // Every rank, the owner included, decodes the same reduced bytes: identical results.
  auto reduced_of = [&](int j) -> const char* {
    if (j == r && p.own_reduced) return p.own_reduced;
    return p.dev.staged ? p.dev.slot(j) + p.reduced_at : d.window(j, st.set_index) + p.reduced_at;
  };
  if (p.dev.staged) {
    auto bytes = [&](int j) { return l.length(j) ? l.bytes(j, f) : 0; };
    FP8WIRE_TRY(copy_in(ops, st.set_index, kReduced, p.dev, p.reduced_at,
                        [&](int j) { return Part{d.window(j, st.set_index) + p.reduced_at, bytes(j)}; }));
    FP8WIRE_TRY(ops.release(st.set_index));
  } else {
    FP8WIRE_TRY(ops.acquire(st.set_index, kReduced));
  }
  char* dst = static_cast<char*>(a_.dst);
  for (int j = 0; j < n; ++j) {
    const size_t len = l.length(j);
    if (!len) continue;
    FP8WIRE_TRY(ops.dequantize(reduced_of(j), quant::Segmented::single(len, f), len,
                               dst + (st.offset + l.begin(j)) * ops.elem_size()));
  }
  return p.dev.staged ? ncclSuccess : ops.release(st.set_index);
}

// --- reduce-scatter ---------------------------------------------------------------------------------
ncclResult_t DirectReduceScatter::produce(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  const DeviceSlots dev = device_slots(a_, st, r, n, cb, 1);
  FP8WIRE_TRY(ops.reclaim(st.set_index));
  // Block j: the j-th `count` elements of the input, for rank j.
  const auto first_of = [&](int j) { return static_cast<size_t>(j) * a_.count + st.offset; };
  if (a_.outbox) {
    ops.add_wire_bytes(cb * static_cast<uint64_t>(n - 1));
    return write_outbox(
        ops, st.set_index, dev, d.window(r, st.set_index), cb,
        [&](int j, char* to) { return quantize_part(ops, a_, first_of(j), st.length, to); }, [&](int) { return cb; });
  }
  return write_for_each(ops, st.set_index, kInputs, [&](int j) {
    if (j != r) ops.add_wire_bytes(cb);
    return quantize_for(ops, a_, dev, j, first_of(j), st.length, d.window(j, st.set_index) + r * cb, cb);
  });
}

ncclResult_t DirectReduceScatter::finish(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  char* mine = d.window(r, st.set_index);
  const DeviceSlots dev = device_slots(a_, st, r, n, cb, 1);
  // Writer j's block for this rank: in this rank's inbox, or in j's outbox.
  auto block_of = [&](int j) -> const char* {
    return a_.outbox ? d.window(j, st.set_index) + outbox_slot(j, r, n) * cb : mine + j * cb;
  };
  std::array<const void*, quant::kMaxReduceInputs> inputs;
  for (int j = 0; j < n; ++j) inputs[j] = dev.staged ? dev.slot(j) : block_of(j);
  if (dev.own) inputs[r] = dev.own;
  if (a_.own_per_lane) {
    char* own = nullptr;
    FP8WIRE_TRY(quantize_own_here(ops, a_, st, dev, r, static_cast<size_t>(r) * a_.count + st.offset, &own));
    inputs[r] = own;
  }
  if (dev.staged) {
    auto part = [&](int j) { return Part{block_of(j), cb}; };
    if (a_.outbox) {
      FP8WIRE_TRY(copy_in(ops, st.set_index, kInputs, dev, 0, part));
    } else {
      FP8WIRE_TRY(copy_in(ops, st.set_index, kInputs, dev, 0, part,
                          [&] { return copy_slots_but(ops, dev.staged, mine, cb, cb, n, r); }));
    }
    FP8WIRE_TRY(ops.release(st.set_index));
  } else {
    FP8WIRE_TRY(ops.acquire(st.set_index, kInputs));
  }
  quant::ReduceOutput out;
  out.plain = static_cast<char*>(a_.dst) + st.offset * ops.elem_size();
  out.plain_type = ops.type();
  FP8WIRE_TRY(ops.reduce(inputs.data(), n, st.length, a_.post, out, static_cast<size_t>(r) * a_.count + st.offset));
  return dev.staged ? ncclSuccess : ops.release(st.set_index);
}

// --- all-gather -------------------------------------------------------------------------------------
ncclResult_t DirectAllGather::produce(StageOps& ops, const Stage& st) { return produce_own_chunk(ops, a_, st); }

ncclResult_t DirectAllGather::finish(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const quant::WireFormat& f = ops.format();
  const int n = ops.nranks(), r = ops.rank();
  const size_t cb = quant::chunk_bytes(st.length, f);
  const DeviceSlots dev = device_slots(a_, st, r, n, cb, 1);
  char* own = dev.own;
  if (a_.own_per_lane) FP8WIRE_TRY(quantize_own_here(ops, a_, st, dev, r, st.offset, &own));
  auto from = [&](int j) -> const char* {
    if (own && j == r) return own;  // with copy-in, slot r; with the lanes apart, the transfer lane's
    return dev.staged ? dev.slot(j) : d.window(j, st.set_index);
  };
  if (dev.staged) {
    FP8WIRE_TRY(
        copy_in(ops, st.set_index, kInputs, dev, 0, [&](int j) { return Part{d.window(j, st.set_index), cb}; }));
    FP8WIRE_TRY(ops.release(st.set_index));
  } else {
    FP8WIRE_TRY(ops.acquire(st.set_index, kInputs));
  }
  auto* dst = static_cast<char*>(a_.dst);
  for (int j = 0; j < n; ++j) {
    const size_t first = static_cast<size_t>(j) * a_.count + st.offset;
    FP8WIRE_TRY(ops.dequantize(from(j), quant::Segmented::single(st.length, f), st.length, dst + first * ops.elem_size()));
  }
  return dev.staged ? ncclSuccess : ops.release(st.set_index);
}

}  // namespace fp8wire::sched
