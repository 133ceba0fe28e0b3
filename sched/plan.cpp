#include "sched/plan.hpp"

#include <algorithm>
#include <cmath>

namespace fp8wire::sched {

const char* to_string(PassReason r) {
  switch (r) {
    case PassReason::none: return "none";
    case PassReason::disabled: return "disabled";
    case PassReason::collective_disabled: return "collective_disabled";
    case PassReason::dtype: return "dtype";
    case PassReason::op: return "op";
    case PassReason::single_rank: return "single_rank";
    case PassReason::empty: return "empty";
    case PassReason::nonblocking: return "nonblocking";
    case PassReason::too_many_ranks: return "too_many_ranks";
    case PassReason::below_threshold: return "below_threshold";
    case PassReason::cost_model: return "cost_model";
    case PassReason::single_process: return "single_process";
  }
  return "?";
}

bool elem_type_of(ncclDataType_t dtype, quant::ElemType* out) {
  switch (dtype) {
    case ncclFloat32: *out = quant::ElemType::f32; return true;
    case ncclFloat16: *out = quant::ElemType::f16; return true;
    case ncclBfloat16: *out = quant::ElemType::bf16; return true;
    default: return false;
  }
}

size_t nccl_type_size(ncclDataType_t dtype) {
  switch (dtype) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 1;  // the FP8 NCCL types and anything newer: one byte or unknown
  }
}

uint64_t threshold_bytes(const CallShape& call) {
  const uint64_t bytes = static_cast<uint64_t>(call.count) * nccl_type_size(call.dtype);
  return call.collective == Collective::all_reduce ? bytes : bytes * static_cast<uint64_t>(call.nranks);
}

PassReason static_eligibility(const Config& config, const CallShape& call) {
  if (!config.enable) return PassReason::disabled;
  if (!config.collective_enable[static_cast<int>(call.collective)]) return PassReason::collective_disabled;
  quant::ElemType type;
  if (!elem_type_of(call.dtype, &type)) return PassReason::dtype;
  // all_gather has no reduction, so its op is meaningless; sum and avg are the only linear
  // reductions an FP8 sum reproduces (max/min/prod and premulsum/custom ops are not).
  if (call.collective != Collective::all_gather && call.op != ncclSum && call.op != ncclAvg)
    return PassReason::op;
  if (call.nranks <= 1) return PassReason::single_rank;
  if (call.count == 0) return PassReason::empty;
  if (call.nonblocking) return PassReason::nonblocking;
  if (call.single_process) return PassReason::single_process;
  if (call.nranks > quant::kMaxReduceInputs) return PassReason::too_many_ranks;
  return PassReason::none;
}

bool below_every_threshold(const Config& config, const CallShape& call) {
  const auto& per_fabric = config.thresholds[static_cast<int>(call.collective)];
  const uint64_t bytes = threshold_bytes(call);
  if (config.fabric_override) return bytes < per_fabric[static_cast<int>(*config.fabric_override)];
  for (uint64_t t : per_fabric)
    if (bytes >= t) return false;
  return true;
}

CostModel default_cost_model(Fabric fabric) {
  // Rough figures for an H100/H200-class node; fp8wire-bench replaces them (cost_model.<fabric>.*).
  // No per-operation latencies: on real fabrics the kinds of operation cost about the same fixed
  // time, so every one costs op_latency_us until a profile says otherwise.
  auto model = [](double latency_us, double bus_gbps) {
    return CostModel{.op_latency_us = latency_us, .bus_bandwidth_gbps = bus_gbps, .codec_gbps = 1000.0,
                     .kernel_launch_us = 4.0};
  };
  switch (fabric) {
    case Fabric::nvlink: return model(15.0, 150.0);
    case Fabric::pcie: return model(25.0, 12.0);
    case Fabric::net: return model(50.0, 5.0);
  }
  return model(50.0, 5.0);
}

CostModel effective_cost_model(const Config& config, Fabric fabric) {
  CostModel model = default_cost_model(fabric);
  const CostModel& given = config.cost_model[static_cast<int>(fabric)];
  // Fields given in the profile win one by one, so a partial profile still works.
  auto take = [](double& field, double value) {
    if (value > 0) field = value;
  };
  take(model.op_latency_us, given.op_latency_us);
  take(model.bus_bandwidth_gbps, given.bus_bandwidth_gbps);
  take(model.codec_gbps, given.codec_gbps);
  take(model.kernel_launch_us, given.kernel_launch_us);
  take(model.allreduce_latency_us, given.allreduce_latency_us);
  take(model.allgather_latency_us, given.allgather_latency_us);
  take(model.reduce_scatter_latency_us, given.reduce_scatter_latency_us);
  take(model.alltoall_latency_us, given.alltoall_latency_us);
  take(model.allreduce_bandwidth_gbps, given.allreduce_bandwidth_gbps);
  take(model.allgather_bandwidth_gbps, given.allgather_bandwidth_gbps);
  take(model.reduce_scatter_bandwidth_gbps, given.reduce_scatter_bandwidth_gbps);
  take(model.alltoall_bandwidth_gbps, given.alltoall_bandwidth_gbps);
  model.calibrated = given.calibrated;
  return model;
}

namespace {
NcclOp gather_op(GatherTransport gather) {
  return gather == GatherTransport::sendrecv ? NcclOp::all_to_all : NcclOp::all_gather;
}
}  // namespace

GatherTransport gather_transport_for(const Config& config, Collective collective, Path path,
                                     uint64_t caller_bytes, int nranks, Fabric fabric) {
  if (!has_gather_step(collective, path)) return GatherTransport::allgather;
  if (config.gather_transport != GatherTransport::automatic) return config.gather_transport;
  const CostModel model = effective_cost_model(config, fabric);
  const quant::WireFormat format = quant::WireFormat::from(config);
  const double ag = predicted_us(model, collective, path, caller_bytes, nranks, format, GatherTransport::allgather);
  const double sr = predicted_us(model, collective, path, caller_bytes, nranks, format, GatherTransport::sendrecv);
  return sr < ag ? GatherTransport::sendrecv : GatherTransport::allgather;
}

double fixed_latency_us(const CostModel& m, Collective collective, Path path, int nranks, GatherTransport gather) {
  const double ar = m.latency_us(NcclOp::all_reduce), ag = m.latency_us(gather_op(gather));
  const double rs = m.latency_us(NcclOp::reduce_scatter), a2a = m.latency_us(NcclOp::all_to_all);
  const bool plain = path == Path::passthrough || path == Path::fallback;
  switch (collective) {
    case Collective::all_reduce:
      switch (path) {
        case Path::passthrough:
        case Path::fallback: return ar;
        case Path::two_shot: return a2a + ag;                               // a2a, then all-gather
        case Path::one_shot: return ag;                                     // all-gather of inputs
        case Path::ring: return static_cast<double>(std::max(nranks - 1, 0)) * a2a + ag;  // hops
      }
      break;
    case Collective::reduce_scatter: return plain ? rs : a2a;  // FP8: a2a + local reduce
    case Collective::all_gather: return ag;                   // FP8: all-gather of FP8 chunks
  }
  return m.op_latency_us;
}

double predicted_us(const CostModel& m, Collective collective, Path path, uint64_t caller_bytes,
                    int nranks, const quant::WireFormat& format, GatherTransport gather) {
  const NcclOp g = gather_op(gather);  // the gather step's operation
  const double n = nranks;
  const double s = static_cast<double>(caller_bytes);
  // Wire bytes of the same data: one byte per element plus one scale per block. The element size is
  // unknown here, so bf16 (the common gradient type) is assumed: elements = bytes / 2.
  const double elems = s / 2.0;
  const double w = elems * (1.0 + static_cast<double>(quant::scale_bytes(format.scale)) / format.block);
  const double codec = m.codec_gbps * 1e3;  // bytes per microsecond
  const double launch = m.kernel_launch_us;
  // One NCCL operation of kind `op` moving `bus_bytes` (busbw convention): its fixed cost plus the
  // bytes at its bandwidth. The operations each path issues are those fixed_latency_us() counts.
  auto op = [&m](NcclOp kind, double bus_bytes) {
    return m.latency_us(kind) + bus_bytes / (m.bandwidth_gbps(kind) * 1e3);
  };
  const double part = (n - 1) / n;
  const bool plain = path == Path::passthrough || path == Path::fallback;
  switch (collective) {
    case Collective::all_reduce:
      switch (path) {
        case Path::passthrough:
        case Path::fallback: return op(NcclOp::all_reduce, 2.0 * part * s);
        case Path::two_shot:
          return op(NcclOp::all_to_all, part * w) + op(g, part * w) + 3.0 * s / codec + 3 * launch;
        case Path::one_shot: return op(g, (n - 1) * w) + (1.0 + n) * s / codec + 2 * launch;
        case Path::ring:
          // n-1 hops of one shard each (w/n): one a2a latency per hop, the bytes once.
          return (n - 2) * m.latency_us(NcclOp::all_to_all) + op(NcclOp::all_to_all, part * w) +
                 op(g, part * w) + (2.0 + part) * s / codec + (n + 1) * launch;
      }
      break;
    case Collective::reduce_scatter:
      if (plain) return op(NcclOp::reduce_scatter, part * s);
      return op(NcclOp::all_to_all, part * w) + 2.0 * s / codec + (n + 1) * launch;
    case Collective::all_gather:
      if (plain) return op(NcclOp::all_gather, part * s);
      return op(g, part * w) + (s / n + s) / codec + 2 * launch;
  }
  return m.op_latency_us;
}

Plan plan_call(const Config& config, const CallShape& call, Fabric fabric) {
  const PassReason reason = static_eligibility(config, call);
  if (reason != PassReason::none) return {Path::passthrough, reason};
  const uint64_t bytes = threshold_bytes(call);
  if (bytes < config.thresholds[static_cast<int>(call.collective)][static_cast<int>(fabric)])
    return {Path::passthrough, PassReason::below_threshold};

  const quant::WireFormat format = quant::WireFormat::from(config);
  const CostModel model = effective_cost_model(config, fabric);
  Path fp8 = Path::two_shot;
  if (call.collective == Collective::all_gather) {
    fp8 = Path::one_shot;
  } else if (call.collective == Collective::all_reduce) {
    switch (config.algorithm) {
      case Algorithm::two_shot: fp8 = Path::two_shot; break;
      case Algorithm::one_shot: fp8 = Path::one_shot; break;
      case Algorithm::ring: fp8 = Path::ring; break;
      case Algorithm::automatic: {
        // Each path with its own best gather transport.
        auto cost = [&](Path p) {
          const GatherTransport g = gather_transport_for(config, call.collective, p, bytes, call.nranks, fabric);
          return predicted_us(model, call.collective, p, bytes, call.nranks, format, g);
        };
        fp8 = cost(Path::one_shot) <= cost(Path::two_shot) ? Path::one_shot : Path::two_shot;
        break;
      }
    }
  }
  const GatherTransport gather = gather_transport_for(config, call.collective, fp8, bytes, call.nranks, fabric);
  // Only a calibrated model may overrule the threshold: the built-in figures are too rough to
  // second-guess a threshold the user chose.
  if (model.calibrated && config.algorithm == Algorithm::automatic) {
    const double plain = predicted_us(model, call.collective, Path::passthrough, bytes, call.nranks, format);
    const double best = predicted_us(model, call.collective, fp8, bytes, call.nranks, format, gather);
    if (plain < best) return {Path::passthrough, PassReason::cost_model};
  }
  return {fp8, PassReason::none, gather};
}

// --- shards ---------------------------------------------------------------------------------------
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
  }
  return 0;
}

ScratchLayout scratch_layout(const Config& config) {
  constexpr size_t kAlign = 256;
  ScratchLayout s;
  const size_t cap = config.scratch_max_bytes / kAlign * kAlign;
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
  const GatherTransport gather = gather_transport_for(config, collective, path, static_cast<uint64_t>(caller_bytes),
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

// --- coalescing -------------------------------------------------------------------------------------
size_t coalesce_batch_length(const Config& config, size_t staging_bytes,
                             std::span<const PendingShape> items) {
  if (items.empty()) return 0;
  const PendingShape& first = items[0];
  if (!config.coalesce_enable || !first.fp8 || first.collective != Collective::all_reduce) return 1;
  const uint64_t cap = std::min<uint64_t>(config.coalesce_max_bytes, staging_bytes);
  if (first.bytes > cap) return 1;
  uint64_t total = first.bytes;
  size_t n = 1;
  while (n < items.size() && n < config.coalesce_max_calls) {
    const PendingShape& next = items[n];
    if (!next.fp8 || next.comm != first.comm || next.stream != first.stream || next.collective != first.collective || next.dtype != first.dtype ||
        next.op != first.op || total + next.bytes > cap)
      break;
    total += next.bytes;
    ++n;
  }
  return n;
}

bool GroupState::end() {
  if (depth_ == 0) {
    unbalanced_ = true;
    return false;
  }
  return --depth_ == 0;
}

// --- fabric ---------------------------------------------------------------------------------------
uint64_t fnv1a(const void* data, size_t size, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t config_fingerprint(const Config& c) {
  uint64_t h = fnv1a(nullptr, 0);
  auto mix = [&h](const auto& v) { h = fnv1a(&v, sizeof(v), h); };
  // Everything that changes a decision or the bytes on the wire; logging and profiler settings may
  // legitimately differ between ranks.
  mix(c.enable);
  for (bool b : c.collective_enable) mix(b);
  mix(c.format); mix(c.block_size); mix(c.scale_type); mix(c.rounding); mix(c.seed);
  mix(c.algorithm);
  mix(c.gather_transport);   // ranks gathering by different NCCL calls would hang
  mix(c.fabric_override.has_value());
  if (c.fabric_override) mix(*c.fabric_override);
  for (const auto& per : c.thresholds)
    for (uint64_t t : per) mix(t);
  for (const CostModel& m : c.cost_model) {
    mix(m.op_latency_us); mix(m.bus_bandwidth_gbps); mix(m.codec_gbps); mix(m.kernel_launch_us);
    mix(m.allreduce_latency_us); mix(m.allgather_latency_us); mix(m.reduce_scatter_latency_us);
    mix(m.alltoall_latency_us); mix(m.allreduce_bandwidth_gbps); mix(m.allgather_bandwidth_gbps);
    mix(m.reduce_scatter_bandwidth_gbps); mix(m.alltoall_bandwidth_gbps);
    mix(m.calibrated);
  }
  mix(c.coalesce_enable); mix(c.coalesce_max_bytes); mix(c.coalesce_max_calls);
  mix(c.scratch_max_bytes); mix(c.pipeline_chunk_bytes);
  return h;
}

Agreement agree(const Config& config, std::span<const RankFacts> facts) {
  Agreement a;
  if (facts.empty()) {
    a.reason = "no ranks";
    return a;
  }
  bool multi_host = false, p2p_disabled = false, all_nvlink = true, scratch = true, same_config = true;
  for (const RankFacts& f : facts) {
    multi_host |= f.host_hash != facts[0].host_hash;
    p2p_disabled |= f.p2p_disabled != 0;
    all_nvlink &= f.nvlink_local != 0;
    scratch &= f.scratch_ok != 0;
    same_config &= f.config_fingerprint == facts[0].config_fingerprint;
  }
  if (config.fabric_override) a.fabric = *config.fabric_override;
  else if (multi_host) a.fabric = Fabric::net;
  else if (p2p_disabled || !all_nvlink) a.fabric = Fabric::pcie;
  else a.fabric = Fabric::nvlink;
  a.fp8_ok = scratch && same_config;
  a.reason = !same_config ? "ranks run with different fp8wire configurations"
             : !scratch   ? "scratch memory could not be allocated on every rank"
                          : "";
  return a;
}

}  // namespace fp8wire::sched
