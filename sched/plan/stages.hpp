// Shard and pipeline-stage arithmetic of the FP8 algorithms, and the per-communicator scratch
// layout. Pure functions of the configuration, the size and the world size, so every rank cuts a
// call into the same stages and shards (a rank cutting differently would hang the job).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/config.hpp"
#include "quant/wire_format.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

// The all-to-all decomposition cuts `count` elements into one shard per rank. Shards are a whole
// number of blocks long (so a block never straddles two ranks); the last ones may be short or empty.
struct ShardLayout {
  size_t count = 0;
  int nranks = 1;
  size_t shard_elems = 0;   // elements per full shard, a multiple of the block size, >= one block
  size_t seg_stride = 0;    // bytes per shard slot in a segmented wire buffer
  size_t begin(int j) const;
  size_t length(int j) const;                                   // 0 for empty trailing shards
  size_t bytes(int j, const quant::WireFormat& f) const;        // chunk bytes of shard j
  size_t total_bytes() const { return seg_stride * static_cast<size_t>(nranks); }
  quant::Segmented segmented() const { return {shard_elems, seg_stride}; }
};
ShardLayout shard_layout(size_t count, int nranks, const quant::WireFormat& format);

// Scratch bytes one pipeline stage of `stage_elems` elements needs (one buffer set).
size_t stage_scratch_bytes(Collective collective, Path path, size_t stage_elems, int nranks,
                           const quant::WireFormat& format);

// The per-communicator scratch pool: [coalescing staging | buffer set 0 | buffer set 1]. Two sets
// let the quantize of stage i+1 overlap the transfer of stage i. A direct call with more buffer sets
// (direct.sets) cuts the same bytes into that many: set_bytes_for / set_offset(i, sets).
inline constexpr int kMaxBufferSets = 4;
// The scratch's alignment, and the unit its size travels in at the agreement (RankFacts::scratch_units).
inline constexpr uint64_t kScratchUnit = 256;
struct ScratchLayout {
  size_t total_bytes = 0;
  size_t staging_bytes = 0;  // caller-dtype staging for coalesced calls (0: coalescing off)
  size_t set_bytes = 0;      // bytes of one buffer set (of two)
  size_t set_bytes_for(int sets) const { return sets <= 2 ? set_bytes : 2 * set_bytes / static_cast<size_t>(sets) / 256 * 256; }
  size_t set_offset(int i, int sets = 2) const { return staging_bytes + static_cast<size_t>(i) * set_bytes_for(sets); }
};
// The layout of `bytes` of scratch (the agreed size: Agreement::scratch_bytes); without it, of
// scratch.max_bytes, what a communicator gets when every rank offers its whole cap.
ScratchLayout scratch_layout(const Config& config, uint64_t bytes);
inline ScratchLayout scratch_layout(const Config& config) { return scratch_layout(config, config.scratch_max_bytes); }

// Pipelining. One stage of a call needs `stage_scratch_bytes`; a call that fits both buffer sets
// runs as one stage (nothing overlaps it). Otherwise every stage fits one set, and the stage count is
// the one the cost model of `fabric` predicts fastest between the fewest that fit and
// caller bytes / pipeline.chunk_bytes: each stage adds its NCCL operations' fixed latency and hides
// part of the quantize. Stages are a multiple of `stage_unit_elems(...)` but the last. 0 when even one
// unit does not fit (the call then falls back to pass-through, identically on every rank).
size_t stage_unit_elems(Collective collective, Path path, int nranks, const quant::WireFormat& format);
size_t nccl_ops_per_stage(Collective collective, Path path, int nranks);
size_t stage_elems(const Config& config, const ScratchLayout& scratch, Collective collective,
                   Path path, size_t count, size_t elem_bytes, int nranks,
                   const quant::WireFormat& format, Fabric fabric);
inline size_t stage_count(size_t count, size_t stage) { return stage ? (count + stage - 1) / stage : 0; }

// The direct transports (sched/transport/direct_windows.hpp): bytes one buffer set of a window needs
// for a stage of `len` elements, and the stage size of a call by the direct pipeline's shape in the
// fabric's cost model (CostModel::direct_*stage*): one stage when the call fits a set and a stage of
// direct_stage_bytes (or a direct_max_stages-th of the call), else the largest whole number of units
// (stage_unit_elems) within that. 0 when not even one unit fits (the call then goes over NCCL's
// transports, on every rank alike). `ranks_per_gpu` above 1 (ranks sharing a GPU's host link) takes
// the shared bounds instead.
size_t direct_set_bytes(Collective collective, Path path, size_t len, int nranks, const quant::WireFormat& f);
size_t direct_stage_elems(const CostModel& model, size_t set_bytes, Collective collective, Path path, size_t count,
                          size_t elem_bytes, int nranks, const quant::WireFormat& f, int ranks_per_gpu = 1);

// The hierarchical path (sched/plan/hierarchy.hpp): scratch one stage of `len` elements needs, and
// where its parts sit in the buffer set (byte offsets).
struct HierAllReduceLayout {
  size_t shard = 0;  // elements per local rank (len / ranks per host, rounded up)
  size_t padded_in = 0, shard_at = 0, rail_at = 0, padded_out = 0, total = 0;
};
HierAllReduceLayout hierarchical_all_reduce_layout(size_t len, size_t elem_bytes, int hosts, int ranks_per_host,
                                                   Path inner, const quant::WireFormat& f);
struct HierReduceScatterLayout {
  size_t permuted = 0, rail_in_at = 0, rail_at = 0, total = 0;
};
HierReduceScatterLayout hierarchical_reduce_scatter_layout(size_t len, size_t elem_bytes, int hosts,
                                                           int ranks_per_host, const quant::WireFormat& f);
// Stage size of a hierarchical call: one stage when it fits both buffer sets, else the largest whole
// number of units (ranks x block elements for the all-reduce, a block for the reduce-scatter) that
// fits one. 0 when not even one unit fits (the call then passes through, on every rank alike).
size_t hierarchical_stage_elems(const ScratchLayout& scratch, Collective collective, size_t count, size_t elem_bytes,
                                int hosts, int ranks_per_host, Path inner, const quant::WireFormat& f);

}  // namespace fp8wire::sched
