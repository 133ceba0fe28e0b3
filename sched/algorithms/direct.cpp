// The FP8 algorithms over a direct transport (sched/transport/direct_windows.hpp). The arithmetic is that of
// their NCCL twins (one_shot.cpp, two_shot.cpp, reduce_scatter.cpp, all_gather.cpp: the same chunks,
// the same rank order, the same stochastic-rounding offsets), so every rank ends with the same bytes
// either way; what differs is who moves them. A quantize stores straight into the window its readers
// read (its own for one-shot and the all-gather, the owner's inbox for two-shot and the
// reduce-scatter), and a fused dequantize-reduce loads every rank's window in rank order: over NVLink
// or PCIe P2P for peer memory, over PCIe from host memory. The flag handshakes of each phase are the
// protocol of sched/transport/direct_windows.hpp, on the lane that reads or writes: a stage reclaims its buffer set
// before its first write (the produce lane) and releases it after its last read (the transfer lane).
//
// Window of one buffer set:
//   one-shot, all-gather   [my quantized stage]                               read by every rank
//   two-shot               [inbox: one shard slot per writer][my reduced shard] the inbox read by me,
//                                                                               the reduced shard by all
//   reduce-scatter         [inbox: one block slot per writer]                  read by me
//
// Own data on the device (direct.own_on_device, host memory only; Fp8Args::own_device_bytes): what
// only this rank reads of its own (its own shard or block, its own reduced shard, its own input)
// stays in the stage's device buffer set instead of crossing the host link twice, and what its peers
// read of it is copied into its window by a copy engine (no SM, the pinned-copy rate) before the
// publish. The bytes are the same either way, so are the results. A stage whose own data does not fit
// the device set goes through the window, as without the option (a choice of this rank alone: its
// peers read the same window either way).
#include <array>

#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"
#include "sched/transport/direct_windows.hpp"
#include "sched/plan/stages.hpp"

namespace fp8wire::sched {

namespace {
constexpr int kInputs = 0;   // phase: the quantized inputs (or shards, or blocks)
constexpr int kReduced = 1;  // phase: two-shot's reduced shards

// This rank's own data of the stage in its device buffer set: the set's start, or null when the
// option is off or `bytes` do not fit (then through the window).
char* own_on_device(const Fp8Args& a, const Stage& st, size_t bytes) {
  return a.own_device_bytes && st.set && bytes <= a.own_device_bytes ? st.set : nullptr;
}
}  // namespace

// --- one-shot ---------------------------------------------------------------------------------------
ncclResult_t DirectOneShotAllReduce::produce(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const char* src = static_cast<const char*>(a_.src) + st.offset * ops.elem_size();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  char* window = d.window(ops.rank(), st.set_index);
  char* own = own_on_device(a_, st, cb);
  FP8WIRE_TRY(ops.reclaim(st.set_index));
  FP8WIRE_TRY(ops.quantize(src, st.length, own ? own : window, quant::Segmented::single(st.length, ops.format()),
                           st.offset, a_.residual ? a_.residual + st.offset : nullptr));
  if (own) FP8WIRE_TRY(ops.copy(window, own, cb, cudaMemcpyDefault));
  ops.add_wire_bytes(cb * static_cast<uint64_t>(ops.nranks() - 1));
  return ops.publish(st.set_index, kInputs);
}

ncclResult_t DirectOneShotAllReduce::finish(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  FP8WIRE_TRY(ops.acquire(st.set_index, kInputs));
  std::array<const void*, quant::kMaxReduceInputs> inputs;
  for (int j = 0; j < ops.nranks(); ++j) inputs[j] = d.window(j, st.set_index);
  if (char* own = own_on_device(a_, st, quant::chunk_bytes(st.length, ops.format()))) inputs[ops.rank()] = own;
  quant::ReduceOutput out;
  out.plain = static_cast<char*>(a_.dst) + st.offset * ops.elem_size();
  out.plain_type = ops.type();
  FP8WIRE_TRY(ops.reduce(inputs.data(), ops.nranks(), st.length, a_.post, out, st.offset));
  return ops.release(st.set_index);
}

// --- two-shot ---------------------------------------------------------------------------------------
ncclResult_t DirectTwoShotAllReduce::produce(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const quant::WireFormat& f = ops.format();
  const ShardLayout l = shard_layout(st.length, n, f);
  const char* src = static_cast<const char*>(a_.src);
  // Device set: [own shard][own reduced shard].
  char* own = own_on_device(a_, st, 2 * l.seg_stride);
  FP8WIRE_TRY(ops.reclaim(st.set_index));
  // Shard j straight into owner j's inbox, slot r: the transfer is this kernel's stores.
  for (int j = 0; j < n; ++j) {
    const size_t len = l.length(j);
    if (!len) continue;
    const size_t first = st.offset + l.begin(j);
    char* to = own && j == r ? own : d.window(j, st.set_index) + r * l.seg_stride;
    FP8WIRE_TRY(ops.quantize(src + first * ops.elem_size(), len, to, quant::Segmented::single(len, f), first,
                             a_.residual ? a_.residual + first : nullptr));
    if (j != r) ops.add_wire_bytes(l.bytes(j, f));
  }
  return ops.publish(st.set_index, kInputs);
}

ncclResult_t DirectTwoShotAllReduce::finish(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const quant::WireFormat& f = ops.format();
  const ShardLayout l = shard_layout(st.length, n, f);
  char* mine = d.window(r, st.set_index);
  char* reduced = mine + static_cast<size_t>(n) * l.seg_stride;
  char* own = own_on_device(a_, st, 2 * l.seg_stride);
  char* own_reduced = own ? own + l.seg_stride : nullptr;
  FP8WIRE_TRY(ops.acquire(st.set_index, kInputs));
  if (l.length(r)) {
    std::array<const void*, quant::kMaxReduceInputs> inputs;
    for (int j = 0; j < n; ++j) inputs[j] = mine + j * l.seg_stride;
    if (own) inputs[r] = own;
    quant::ReduceOutput out;
    out.wire = own ? own_reduced : reduced;
    FP8WIRE_TRY(ops.reduce(inputs.data(), n, l.length(r), a_.post, out, st.offset + l.begin(r)));
    if (own) FP8WIRE_TRY(ops.copy(reduced, own_reduced, l.bytes(r, f), cudaMemcpyDefault));
    ops.add_wire_bytes(l.bytes(r, f) * static_cast<uint64_t>(n - 1));
  }
  FP8WIRE_TRY(ops.publish(st.set_index, kReduced));
  FP8WIRE_TRY(ops.acquire(st.set_index, kReduced));
  // Every rank, the owner included, decodes the same reduced bytes: identical results.
  char* dst = static_cast<char*>(a_.dst);
  for (int j = 0; j < n; ++j) {
    const size_t len = l.length(j);
    if (!len) continue;
    const char* from = own && j == r ? own_reduced : d.window(j, st.set_index) + static_cast<size_t>(n) * l.seg_stride;
    FP8WIRE_TRY(ops.dequantize(from, quant::Segmented::single(len, f), len,
                               dst + (st.offset + l.begin(j)) * ops.elem_size()));
  }
  return ops.release(st.set_index);
}

// --- reduce-scatter ---------------------------------------------------------------------------------
ncclResult_t DirectReduceScatter::produce(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  const auto* src = static_cast<const char*>(a_.src);
  char* own = own_on_device(a_, st, cb);
  FP8WIRE_TRY(ops.reclaim(st.set_index));
  for (int j = 0; j < n; ++j) {
    const size_t first = static_cast<size_t>(j) * a_.count + st.offset;
    char* to = own && j == r ? own : d.window(j, st.set_index) + r * cb;
    FP8WIRE_TRY(ops.quantize(src + first * ops.elem_size(), st.length, to,
                             quant::Segmented::single(st.length, ops.format()), first));
    if (j != r) ops.add_wire_bytes(cb);
  }
  return ops.publish(st.set_index, kInputs);
}

ncclResult_t DirectReduceScatter::finish(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const int n = ops.nranks(), r = ops.rank();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  char* mine = d.window(r, st.set_index);
  FP8WIRE_TRY(ops.acquire(st.set_index, kInputs));
  std::array<const void*, quant::kMaxReduceInputs> inputs;
  for (int j = 0; j < n; ++j) inputs[j] = mine + j * cb;
  if (char* own = own_on_device(a_, st, cb)) inputs[r] = own;
  quant::ReduceOutput out;
  out.plain = static_cast<char*>(a_.dst) + st.offset * ops.elem_size();
  out.plain_type = ops.type();
  FP8WIRE_TRY(ops.reduce(inputs.data(), n, st.length, a_.post, out, static_cast<size_t>(r) * a_.count + st.offset));
  return ops.release(st.set_index);
}

// --- all-gather -------------------------------------------------------------------------------------
ncclResult_t DirectAllGather::produce(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const char* src = static_cast<const char*>(a_.src) + st.offset * ops.elem_size();
  const size_t cb = quant::chunk_bytes(st.length, ops.format());
  char* window = d.window(ops.rank(), st.set_index);
  char* own = own_on_device(a_, st, cb);
  FP8WIRE_TRY(ops.reclaim(st.set_index));
  FP8WIRE_TRY(ops.quantize(src, st.length, own ? own : window, quant::Segmented::single(st.length, ops.format()),
                           st.offset));
  if (own) FP8WIRE_TRY(ops.copy(window, own, cb, cudaMemcpyDefault));
  ops.add_wire_bytes(cb * static_cast<uint64_t>(ops.nranks() - 1));
  return ops.publish(st.set_index, kInputs);
}

ncclResult_t DirectAllGather::finish(StageOps& ops, const Stage& st) {
  const DirectWindows& d = *ops.direct();
  const quant::WireFormat& f = ops.format();
  FP8WIRE_TRY(ops.acquire(st.set_index, kInputs));
  auto* dst = static_cast<char*>(a_.dst);
  char* own = own_on_device(a_, st, quant::chunk_bytes(st.length, f));
  for (int j = 0; j < ops.nranks(); ++j) {
    const size_t first = static_cast<size_t>(j) * a_.count + st.offset;
    const char* from = own && j == ops.rank() ? own : d.window(j, st.set_index);
    FP8WIRE_TRY(ops.dequantize(from, quant::Segmented::single(st.length, f), st.length, dst + first * ops.elem_size()));
  }
  return ops.release(st.set_index);
}

}  // namespace fp8wire::sched
