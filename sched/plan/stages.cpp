#include "sched/plan/stages.hpp"

#include <algorithm>
#include <cmath>

#include "sched/plan/cost_model.hpp"

namespace fp8wire::sched {

ShardLayout shard_layout(size_t count, int nranks, const quant::WireFormat& f) {
  ShardLayout l;
  l.count = count;
  l.nranks = nranks;
  const size_t per_rank = (count + nranks - 1) / nranks;
  l.shard_elems = std::max<size_t>(f.block, quant::align_up(per_rank, f.block));
  l.seg_stride = quant::chunk_bytes(l.shard_elems, f);
  return l;
}
size_t ShardLayout::begin(int j) const { return std::min(count, shard_elems * static_cast<size_t>(j)); }
size_t ShardLayout::length(int j) const {
  const size_t b = begin(j);
  return std::min(count, b + shard_elems) - b;
}
size_t ShardLayout::bytes(int j, const quant::WireFormat& f) const {
  const size_t len = length(j);
  return len ? quant::chunk_bytes(len, f) : 0;
}

size_t stage_scratch_bytes(Collective collective, Path path, size_t n, int nranks,
                           const quant::WireFormat& f) {
  const size_t ranks = static_cast<size_t>(nranks);
  switch (collective) {
    case Collective::all_reduce: {
      if (path == Path::one_shot) return ranks * quant::chunk_bytes(n, f);
      const ShardLayout l = shard_layout(n, nranks, f);
      if (path == Path::ring) return (ranks + 2) * l.seg_stride;  // send + recv slot + gathered
      // Two-shot: the quantized shards sent, and the shards received. The reduced shard goes into
      // the receive area's own (never received) slot and the all-gather fills the rest of it.
      return 2 * l.total_bytes();
    }
    case Collective::reduce_scatter: return 2 * ranks * quant::chunk_bytes(n, f);
    case Collective::all_gather: return ranks * quant::chunk_bytes(n, f);
    // One slot per peer sent and one received, each the stage's part of that peer's chunk padded to
    // whole blocks on its own (the own slots stay unused: that chunk is copied, never quantized).
    case Collective::all_to_all: return 2 * ranks * quant::chunk_bytes(n, f);
    case Collective::send_recv: return 0;  // a message's wire buffer is its own, not the communicator's
  }
  return 0;
}

ScratchLayout scratch_layout(const Config& config, uint64_t bytes) {
  constexpr size_t kAlign = kScratchUnit;
  ScratchLayout s;
  const size_t cap = bytes / kAlign * kAlign;
  s.staging_bytes = config.coalesce_enable
                        ? std::min<size_t>(config.coalesce_max_bytes, cap / 4) / kAlign * kAlign
                        : 0;
  s.set_bytes = (cap - s.staging_bytes) / 2 / kAlign * kAlign;
  s.total_bytes = s.staging_bytes + 2 * s.set_bytes;
  return s;
}

size_t stage_unit_elems(Collective collective, Path path, int nranks, const quant::WireFormat& f) {
  if (collective == Collective::all_reduce && (path == Path::two_shot || path == Path::ring))
    return static_cast<size_t>(nranks) * f.block;  // full shards on every rank but the last stage
  return f.block;
}

size_t nccl_ops_per_stage(Collective collective, Path path, int nranks) {
  if (collective != Collective::all_reduce) return 1;
  switch (path) {
    case Path::two_shot: return 2;                                      // a2a + all-gather
    case Path::ring: return static_cast<size_t>(std::max(nranks, 1));  // n-1 hops + all-gather
    default: return 1;                                                  // one-shot: all-gather
  }
}

size_t stage_elems(const Config& config, const ScratchLayout& scratch, Collective collective,
                   Path path, size_t count, size_t elem_bytes, int nranks,
                   const quant::WireFormat& f, Fabric fabric) {
  if (count == 0) return 0;
  const size_t unit = stage_unit_elems(collective, path, nranks, f);
  auto fits = [&](size_t n, size_t bytes) {
    return stage_scratch_bytes(collective, path, n, nranks, f) <= bytes;
  };
  // A single stage overlaps nothing, so it may use both buffer sets (they are contiguous).
  const bool whole_fits = fits(count, 2 * scratch.set_bytes);
  if (count <= unit) return whole_fits ? count : 0;
  // Largest stage (whole units) that fits one set: the bound of every stage of a pipelined call.
  size_t set_max = 0;
  if (fits(unit, scratch.set_bytes)) {
    size_t lo = 1, hi = (count + unit - 1) / unit;
    while (lo < hi) {
      const size_t mid = lo + (hi - lo + 1) / 2;
      if (fits(mid * unit, scratch.set_bytes)) lo = mid; else hi = mid - 1;
    }
    set_max = lo * unit;
  }
  if (!whole_fits && set_max == 0) return 0;
  const size_t k_set = set_max ? (count + set_max - 1) / set_max : 0;  // fewest pipelined stages

  // How many stages: each one pays the fixed latency of its NCCL operations; more stages hide more
  // of the quantize (stage i+1 is quantized while stage i moves: with k stages ~1/k of it stays
  // exposed). Minimising k*ops*latency + quantize/k gives k* = sqrt(quantize / (ops*latency)).
  // pipeline.chunk_bytes bounds how small a stage gets (never more stages than bytes / chunk).
  // On a latency-dominated fabric this keeps a 256 MiB call in as few stages as the scratch allows.
  const CostModel model = effective_cost_model(config, fabric);
  const double caller_bytes = static_cast<double>(count) * static_cast<double>(elem_bytes) *
                              (collective == Collective::all_reduce ? 1.0 : static_cast<double>(nranks));
  const double quantize_us = caller_bytes / (std::max(model.codec_gbps, 1e-3) * 1e3);
  // Fixed cost of one stage's NCCL operations (the a2a and all-gather of two-shot, ...).
  const GatherMethod gather = gather_method_for(config, collective, path, static_cast<uint64_t>(caller_bytes),
                                                     nranks, fabric);
  const double op_us = std::max(fixed_latency_us(model, collective, path, nranks, gather), 1e-3);
  auto predicted = [&](size_t k) { return static_cast<double>(k) * op_us + quantize_us / static_cast<double>(k); };
  const size_t chunk = std::max<uint64_t>(config.pipeline_chunk_bytes, 1);
  const size_t k_chunk = static_cast<size_t>((caller_bytes + static_cast<double>(chunk) - 1) / static_cast<double>(chunk));
  // The built-in "net" figures are the least certain (20 us over InfiniBand, milliseconds over TCP
  // sockets or emulated hosts), and a wrong guess costs whole NCCL operations for at most the
  // quantize time saved (~0.3 ms for 256 MiB): there only a calibrated model pipelines beyond the
  // scratch minimum.
  const bool model_trusted = model.calibrated || fabric != Fabric::net;
  size_t k_best = 0;
  if (set_max) {
    const size_t k_hi = model_trusted ? std::max(k_set, k_chunk) : k_set;
    const double ideal = std::sqrt(quantize_us / op_us);
    k_best = std::clamp<size_t>(static_cast<size_t>(std::llround(ideal)), k_set, k_hi);
  }
  if (whole_fits && (k_best == 0 || !model_trusted || predicted(1) <= predicted(k_best))) return count;
  const size_t per_stage = (count + k_best - 1) / k_best;
  return std::min(set_max, quant::align_up(per_stage, unit));
}

// --- the direct transports' windows ------------------------------------------------------------
size_t direct_set_bytes(Collective collective, Path path, size_t len, int nranks, const quant::WireFormat& f) {
  const size_t ranks = static_cast<size_t>(nranks);
  switch (collective) {
    case Collective::all_reduce:
      if (path == Path::two_shot) return (ranks + 1) * shard_layout(len, nranks, f).seg_stride;
      return quant::chunk_bytes(len, f);
    case Collective::reduce_scatter:
    case Collective::all_to_all: return ranks * quant::chunk_bytes(len, f);  // an inbox slot per writer
    case Collective::all_gather: return quant::chunk_bytes(len, f);
    case Collective::send_recv: return 0;  // no window: carrier_for never picks one
  }
  return 0;
}

size_t direct_stage_elems(const CostModel& model, size_t set_bytes, Collective collective, Path path, size_t count,
                          size_t elem_bytes, int nranks, const quant::WireFormat& f, int ranks_per_gpu) {
  if (count == 0) return 0;
  const size_t unit = stage_unit_elems(collective, path, nranks, f);
  auto fits = [&](size_t n) { return direct_set_bytes(collective, path, n, nranks, f) <= set_bytes; };
  // Caller bytes per element of `count`: the reduce-scatter's stage spans every rank's block.
  const size_t per_elem = std::max<size_t>(elem_bytes * (collective == Collective::all_reduce ? 1 : static_cast<size_t>(nranks)), 1);
  size_t want = std::max<size_t>(model.direct_stage_bytes / per_elem, 1);
  // A larger call in at most that many larger stages (as far as `fits` allows, below): the per-stage
  // costs (a flag round trip, a copy per peer) stay a fixed share of the call.
  const bool shared = ranks_per_gpu > 1;
  const uint64_t max_stages = shared ? model.direct_shared_max_stages : model.direct_max_stages;
  if (max_stages > 0) want = std::max(want, (count + max_stages - 1) / max_stages);
  // Where ranks share a GPU, none larger than direct_shared_stage_bytes (nor smaller than a stage of
  // direct_stage_bytes), so a large call gets more stages than the bound.
  if (shared && model.direct_shared_stage_bytes > 0) {
    const size_t cap = std::max(model.direct_shared_stage_bytes, model.direct_stage_bytes) / per_elem;
    want = std::min(want, std::max<size_t>(cap, 1));
  }
  if (count <= unit || (count <= want && fits(count))) return fits(count) ? count : 0;
  if (!fits(unit)) return 0;
  size_t lo = 1, hi = (std::min(count, std::max(want, unit)) + unit - 1) / unit;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid * unit)) lo = mid; else hi = mid - 1;
  }
  return std::min(count, lo * unit);
}

// --- the hierarchical path ------------------------------------------------------------------------
namespace {
constexpr size_t kHierAlign = 256;
size_t up(size_t n) { return quant::align_up(n, kHierAlign); }
}  // namespace

HierAllReduceLayout hierarchical_all_reduce_layout(size_t len, size_t es, int hosts, int ranks_per_host, Path inner,
                                                   const quant::WireFormat& f) {
  HierAllReduceLayout l;
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

HierReduceScatterLayout hierarchical_reduce_scatter_layout(size_t len, size_t es, int hosts, int ranks_per_host,
                                                           const quant::WireFormat& f) {
  HierReduceScatterLayout l;
  const size_t n = static_cast<size_t>(hosts) * static_cast<size_t>(ranks_per_host);
  l.permuted = 0;
  l.rail_in_at = up(n * len * es);
  l.rail_at = l.rail_in_at + up(static_cast<size_t>(hosts) * len * es);
  l.total = l.rail_at + up(stage_scratch_bytes(Collective::reduce_scatter, Path::two_shot, len, hosts, f));
  return l;
}

size_t hierarchical_stage_elems(const ScratchLayout& scratch, Collective collective, size_t count, size_t es,
                                int hosts, int ranks_per_host, Path inner, const quant::WireFormat& f) {
  if (count == 0) return 0;
  auto need = [&](size_t len) {
    return collective == Collective::reduce_scatter
               ? hierarchical_reduce_scatter_layout(len, es, hosts, ranks_per_host, f).total
               : hierarchical_all_reduce_layout(len, es, hosts, ranks_per_host, inner, f).total;
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
