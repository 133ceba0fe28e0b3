#include "sched/plan/cost_model.hpp"

#include <algorithm>

namespace fp8wire::sched {

CostModel default_cost_model(Fabric fabric) {
  // Rough figures for an H100/H200-class node; fp8wire-bench replaces them (cost_model.<fabric>.*).
  // No per-operation latencies: on real fabrics the kinds of operation cost about the same fixed
  // time, so every one costs op_latency_us until a profile says otherwise.
  // The direct pipeline's shape, measured over host memory on one H200 (docs/PERF.md, "Host-link
  // limit"): 8 MiB stages; at 256 MiB 32 MiB stages (8 of them) instead of 8 MiB reached
  // 1.33x at 4 ranks and 1.04-1.09x at 2; where the ranks share one GPU's host link, 2 stages against 8
  // at 64 MiB 1.09-1.27x at 2 and 4 ranks, and 256 MiB in 32 MiB stages 1.04-1.10x faster than in 2.
  auto model = [](double latency_us, double bus_gbps) {
    CostModel m{.op_latency_us = latency_us, .bus_bandwidth_gbps = bus_gbps, .codec_gbps = 1000.0,
                .kernel_launch_us = 4.0};
    m.direct_stage_bytes = 8ull << 20;
    m.direct_max_stages = 8;
    m.direct_shared_max_stages = 2;
    m.direct_shared_stage_bytes = 32ull << 20;
    return m;
  };
  switch (fabric) {
    case Fabric::nvlink: return model(15.0, 150.0);  // the direct transport over NVLink: not measured yet
    case Fabric::pcie: {
      // The direct transport through host memory, measured on one H200 (PCIe Gen5 x16): codec kernels
      // store to and load from mapped host memory at 51-52 GB/s (95 / 93 % of cudaMemcpyAsync's), a
      // barrier round trip of stream memory operations between two processes 12.5 us (docs/PERF.md).
      CostModel m = model(25.0, 12.0);
      m.direct_latency_us = 15.0;
      m.direct_bandwidth_gbps = 45.0;
      return m;
    }
    case Fabric::net: return model(50.0, 5.0);  // ranks on different machines share no memory
  }
  return model(50.0, 5.0);
}

CostModel effective_cost_model(const Config& config, Fabric fabric) {
  CostModel model = default_cost_model(fabric);
  const CostModel& given = config.cost_model[static_cast<int>(fabric)];
  // Fields given in the profile win one by one, so a partial profile still works.
  auto take = [](auto& field, auto value) {
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
  take(model.direct_latency_us, given.direct_latency_us);
  take(model.direct_bandwidth_gbps, given.direct_bandwidth_gbps);
  take(model.direct_stage_bytes, given.direct_stage_bytes);
  take(model.direct_max_stages, given.direct_max_stages);
  take(model.direct_shared_max_stages, given.direct_shared_max_stages);
  take(model.direct_shared_stage_bytes, given.direct_shared_stage_bytes);
  model.hosts = given.hosts;
  model.ranks_per_host = given.ranks_per_host;
  model.calibrated = given.calibrated;
  return model;
}

namespace {
NcclOp gather_op(GatherMethod gather) {
  return gather == GatherMethod::sendrecv ? NcclOp::all_to_all : NcclOp::all_gather;
}
}  // namespace

GatherMethod cheaper_gather(const CostModel& model, const quant::WireFormat& format, GatherMethod configured,
                            Collective collective, Path path, uint64_t caller_bytes, int nranks) {
  if (!has_gather_step(collective, path)) return GatherMethod::allgather;
  if (configured != GatherMethod::automatic) return configured;
  const double ag = predicted_us(model, collective, path, caller_bytes, nranks, format, GatherMethod::allgather);
  const double sr = predicted_us(model, collective, path, caller_bytes, nranks, format, GatherMethod::sendrecv);
  return sr < ag ? GatherMethod::sendrecv : GatherMethod::allgather;
}

const MeasuredRoute* measured_route(const Config& config, Collective collective, Fabric fabric, int nranks,
                                    uint64_t bytes) {
  const MeasuredRoute* found = nullptr;
  // Sorted by (ranks, from_bytes) when the configuration was loaded.
  for (const MeasuredRoute& r : config.routes[static_cast<int>(collective)][static_cast<int>(fabric)]) {
    if (static_cast<int>(r.ranks) != nranks) continue;
    if (!found || r.from_bytes <= bytes) found = &r;
    if (r.from_bytes > bytes) break;
  }
  return found;
}

Path measured_path(const MeasuredRoute& route, Collective collective) {
  if (!route.fp8) return Path::passthrough;
  switch (route.algorithm) {
    case Algorithm::two_shot: return Path::two_shot;
    case Algorithm::one_shot: return Path::one_shot;
    case Algorithm::ring: return Path::ring;
    case Algorithm::automatic: break;
  }
  return only_fp8_path(collective);
}

GatherMethod gather_method_for(const Config& config, Collective collective, Path path,
                                     uint64_t caller_bytes, int nranks, Fabric fabric) {
  if (config.gather_transport == GatherMethod::automatic && has_gather_step(collective, path))
    if (const MeasuredRoute* m = measured_route(config, collective, fabric, nranks, caller_bytes);
        m && m->gather != GatherMethod::automatic && measured_path(*m, collective) == path)
      return m->gather;
  return cheaper_gather(effective_cost_model(config, fabric), quant::WireFormat::from(config), config.gather_transport,
                        collective, path, caller_bytes, nranks);
}

Path cheaper_all_reduce(const CostModel& model, const quant::WireFormat& format, GatherMethod configured,
                        uint64_t caller_bytes, int nranks) {
  // Each path with its own best gather step.
  auto cost = [&](Path p) {
    const GatherMethod g = cheaper_gather(model, format, configured, Collective::all_reduce, p, caller_bytes, nranks);
    return predicted_us(model, Collective::all_reduce, p, caller_bytes, nranks, format, g);
  };
  return cost(Path::one_shot) <= cost(Path::two_shot) ? Path::one_shot : Path::two_shot;
}

double fixed_latency_us(const CostModel& m, Collective collective, Path path, int nranks, GatherMethod gather) {
  const double ar = m.latency_us(NcclOp::all_reduce), ag = m.latency_us(gather_op(gather));
  const double rs = m.latency_us(NcclOp::reduce_scatter), a2a = m.latency_us(NcclOp::all_to_all);
  switch (collective) {
    case Collective::all_reduce:
      switch (path) {
        case Path::passthrough:
        case Path::fallback: return ar;
        case Path::two_shot: return a2a + ag;                               // a2a, then all-gather
        case Path::one_shot: return ag;                                     // all-gather of inputs
        case Path::ring: return static_cast<double>(std::max(nranks - 1, 0)) * a2a + ag;  // hops
        case Path::hierarchical: return rs + a2a + ag + ag;  // never priced flat (hierarchy.cpp)
      }
      break;
    case Collective::reduce_scatter: return is_fp8(path) ? a2a : rs;  // FP8: a2a + local reduce
    case Collective::all_gather: return ag;                           // FP8: all-gather of FP8 chunks
    case Collective::all_to_all: return a2a;                          // plain or FP8: one send/recv round
    case Collective::send_recv: return a2a;                           // one message of such a round
  }
  return m.op_latency_us;
}

double predicted_us(const CostModel& m, Collective collective, Path path, uint64_t caller_bytes,
                    int nranks, const quant::WireFormat& format, GatherMethod gather) {
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
        case Path::hierarchical: break;  // priced per level by the hierarchy model, never here
      }
      break;
    case Collective::reduce_scatter:
      if (!is_fp8(path)) return op(NcclOp::reduce_scatter, part * s);
      return op(NcclOp::all_to_all, part * w) + 2.0 * s / codec + (n + 1) * launch;
    case Collective::all_gather:
      if (!is_fp8(path)) return op(NcclOp::all_gather, part * s);
      return op(g, part * w) + (s / n + s) / codec + 2 * launch;
    case Collective::all_to_all:
      // NCCL's own is one grouped send/recv round of every chunk but the rank's own. The FP8 one:
      // the same round of quantized chunks; the chunks sent quantized, those received dequantized,
      // the own chunk copied (counted at the codec's rate); two quantize and two dequantize launches
      // (the peers before this rank's chunk and after it) and the copy.
      if (!is_fp8(path)) return op(NcclOp::all_to_all, part * s);
      return op(NcclOp::all_to_all, part * w) + (2.0 * part + 1.0 / n) * s / codec + 5 * launch;
    case Collective::send_recv:
      // One message, priced as one chunk of such a round; the FP8 one is quantized by its sender
      // and decoded by its receiver, one launch each.
      if (!is_fp8(path)) return op(NcclOp::all_to_all, s);
      return op(NcclOp::all_to_all, w) + 2.0 * s / codec + 2 * launch;
  }
  return 1e30;  // a path this model cannot price is never the cheapest
}

DirectCost direct_cost_parts(const CostModel& m, Collective collective, Path path, uint64_t caller_bytes, int nranks,
                             const quant::WireFormat& format, Carrier kind) {
  const double n = nranks;
  const double s = static_cast<double>(caller_bytes);
  const double elems = s / 2.0;  // bf16 assumed, as predicted_us
  const double w = elems * (1.0 + static_cast<double>(quant::scale_bytes(format.scale)) / format.block);
  const double part = (n - 1) / n;
  const bool host = kind == Carrier::host_memory;
  const double codec = m.codec_gbps * 1e3;
  DirectCost d;
  double launches = 2, codec_us = 0;
  switch (collective) {
    case Collective::all_reduce:
      if (path == Path::two_shot) {
        d.link_bytes = host ? 2.0 * w : part * w;  // shards out, reduced shards in
        d.barriers = 2;
        codec_us = 3.0 * s / codec;
        launches = 2 * n + 1;
      } else {
        d.link_bytes = host ? n * w : (n - 1) * w;  // every rank's slot read
        codec_us = (1.0 + n) * s / codec;
      }
      break;
    case Collective::reduce_scatter:
      d.link_bytes = host ? w : part * w;
      codec_us = 2.0 * s / codec;
      launches = n + 1;
      break;
    case Collective::all_to_all:  // the reduce-scatter's traffic; each peer's chunk decoded, the own copied
      d.link_bytes = host ? w : part * w;
      codec_us = (2.0 * part + 1.0 / n) * s / codec;
      launches = 2 * n;
      break;
    case Collective::all_gather:
      d.link_bytes = host ? w : part * w;
      codec_us = (s / n + s) / codec;
      launches = n + 1;
      break;
    case Collective::send_recv: break;  // no direct program (predicted_direct_us: never the cheaper)
  }
  d.other_us = codec_us + launches * m.kernel_launch_us;
  return d;
}

double predicted_direct_us(const CostModel& m, Collective collective, Path path, uint64_t caller_bytes, int nranks,
                           const quant::WireFormat& format, Carrier kind) {
  if (m.direct_bandwidth_gbps <= 0 || !is_fp8(path) || path == Path::ring || path == Path::hierarchical ||
      collective == Collective::send_recv)
    return 1e30;
  const DirectCost d = direct_cost_parts(m, collective, path, caller_bytes, nranks, format, kind);
  return d.barriers * m.direct_latency_us + d.link_bytes / (m.direct_bandwidth_gbps * 1e3) + d.other_us;
}

Carrier carrier_for(const Config& config, Collective collective, Path path, uint64_t caller_bytes,
                            int nranks, Fabric fabric, Carrier available) {
  // Point-to-point messages have no direct program: over NCCL's transports whatever direct.transport
  // says (sched/engine/point_to_point.cpp).
  if (available == Carrier::nccl || !is_fp8(path) || path == Path::ring || path == Path::hierarchical ||
      collective == Collective::send_recv)
    return Carrier::nccl;
  if (config.direct_transport == DirectMode::off) return Carrier::nccl;
  if (config.direct_transport != DirectMode::automatic) return available;  // set up as configured
  const CostModel model = effective_cost_model(config, fabric);
  const quant::WireFormat format = quant::WireFormat::from(config);
  const double direct = predicted_direct_us(model, collective, path, caller_bytes, nranks, format, available);
  const GatherMethod gather = gather_method_for(config, collective, path, caller_bytes, nranks, fabric);
  const double nccl = predicted_us(model, collective, path, caller_bytes, nranks, format, gather);
  return direct < nccl ? available : Carrier::nccl;
}

}  // namespace fp8wire::sched
