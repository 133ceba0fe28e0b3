#include "bench/host/model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace fp8wire::bench {

LinearFit fit_linear_relative(const std::vector<double>& x, const std::vector<double>& t_us) {
  return fit_linear_relative_to(x, t_us, t_us);
}

LinearFit fit_linear_relative_to(const std::vector<double>& x, const std::vector<double>& y,
                                 const std::vector<double>& t_us) {
  LinearFit fit;
  const size_t n = std::min({x.size(), y.size(), t_us.size()});
  if (n < 2) return fit;
  // Normal equations of sum w (y - a - b x)^2 with w = 1 / t^2.
  double sw = 0, swx = 0, swxx = 0, swt = 0, swxt = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!(t_us[i] > 0)) continue;
    const double w = 1.0 / (t_us[i] * t_us[i]);
    sw += w;
    swx += w * x[i];
    swxx += w * x[i] * x[i];
    swt += w * y[i];
    swxt += w * x[i] * y[i];
  }
  const double det = sw * swxx - swx * swx;
  if (!(std::fabs(det) > 0)) return fit;
  double b = (sw * swxt - swx * swt) / det;
  double a = (swt - b * swx) / sw;
  fit.ok = b > 0;
  // Latency-only or bandwidth-only data can yield a slightly negative coefficient; refit the other
  // one alone instead of reporting a negative latency.
  if (a < 0) {
    a = 0;
    b = swxt / swxx;
  }
  if (b < 0) {
    b = 0;
    a = swt / sw;
  }
  fit.alpha_us = a;
  fit.us_per_byte = b;
  for (size_t i = 0; i < n; ++i) {
    if (!(t_us[i] > 0)) continue;
    fit.max_rel_residual = std::max(fit.max_rel_residual, std::fabs(a + b * x[i] - y[i]) / t_us[i]);
  }
  return fit;
}

const std::vector<Link>& assumed_links() {
  // Bus bandwidths are what NCCL's busbw reaches at large sizes, not the raw link rate; latencies
  // are the fixed cost of one NCCL collective among 8 ranks of that fabric. Both are assumptions
  // (round numbers from public nccl-tests results of each class), labelled "predicted" wherever used.
  static const std::vector<Link> links = {
      {"pcie_gen4", 12.0, 20.0, "PCIe Gen4 x16: 32 GB/s raw per direction, ~20 GB/s NCCL busbw through host bridges, 12 us/op", false},
      {"pcie_gen5", 10.0, 40.0, "PCIe Gen5 x16: 64 GB/s raw per direction, ~40 GB/s NCCL busbw, 10 us/op", false},
      {"nvlink3", 8.0, 230.0, "NVLink3 (A100 SXM, 600 GB/s bidirectional): ~230 GB/s all-reduce busbw, 8 us/op", false},
      {"nvlink4", 8.0, 360.0, "NVLink4 (H100/H200 SXM, 900 GB/s bidirectional, NVLS off): ~360 GB/s busbw, 8 us/op", false},
      {"net_100g", 25.0, 11.0, "100 Gb/s RoCE/IB, one NIC per GPU: 12.5 GB/s line rate, ~11 GB/s busbw, 25 us/op", false},
      {"net_400g", 20.0, 45.0, "400 Gb/s IB NDR, one NIC per GPU: 50 GB/s line rate, ~45 GB/s busbw, 20 us/op", false},
  };
  return links;
}

double WireParams::ratio() const {
  return (1.0 + static_cast<double>(scale_bytes) / static_cast<double>(block)) /
         static_cast<double>(dtype_size(dtype));
}

double Link::latency_us(NcclOp op) const {
  const double own = OpCounts{allreduce_us, allgather_us, reduce_scatter_us, alltoall_us}.of(op);
  return own > 0 ? own : alpha_us;
}

double Link::bandwidth_gbps(NcclOp op) const {
  const double own = OpCounts{allreduce_gbps, allgather_gbps, reduce_scatter_gbps, alltoall_gbps}.of(op);
  return own > 0 ? own : bus_gbps;
}

double OpCounts::of(NcclOp op) const {
  return op == NcclOp::all_reduce       ? all_reduce
         : op == NcclOp::all_gather     ? all_gather
         : op == NcclOp::reduce_scatter ? reduce_scatter
                                        : all_to_all;
}

double fixed_latency_us(const PathShape& shape, const Link& link) {
  double us = 0;
  for (NcclOp op : kNcclOps) us += shape.ops.of(op) * link.latency_us(op);
  return us;
}

std::optional<PathShape> path_shape(Collective c, Path p, int nranks, GatherMethod gather) {
  const bool sendrecv_gather = has_gather_step(c, p) && gather == GatherMethod::sendrecv;
  if (has_gather_step(c, p) && gather == GatherMethod::automatic) return std::nullopt;
  const double n = std::max(nranks, 1);
  const double part = (n - 1) / n;
  // count of each kind, and the bus bytes (per byte of S) each kind moves.
  auto shape = [sendrecv_gather](OpCounts ops, OpCounts bus, double codec, double launches) {
    // Each gather-step path issues exactly one all-gather, its gather step: over send/recv it is one
    // more a2a with the same bus bytes.
    if (sendrecv_gather) {
      ops.all_to_all += ops.all_gather;
      ops.all_gather = 0;
      bus.all_to_all += bus.all_gather;
      bus.all_gather = 0;
    }
    return PathShape{ops, bus, bus.total(), codec, launches};
  };
  auto ar = [](double v) { return OpCounts{v, 0, 0, 0}; };
  auto ag = [](double v) { return OpCounts{0, v, 0, 0}; };
  auto rs = [](double v) { return OpCounts{0, 0, v, 0}; };
  auto a2a = [](double v) { return OpCounts{0, 0, 0, v}; };
  auto a2a_ag = [](double a, double g) { return OpCounts{0, g, 0, a}; };
  if (p == Path::passthrough || p == Path::fallback) {
    switch (c) {
      case Collective::all_reduce: return shape(ar(1), ar(2 * part), 0, 0);
      case Collective::reduce_scatter: return shape(rs(1), rs(part), 0, 0);
      case Collective::all_gather: return shape(ag(1), ag(part), 0, 0);
      case Collective::all_to_all: return shape(a2a(1), a2a(part), 0, 0);  // one grouped send/recv round
      case Collective::send_recv: return shape(a2a(1), a2a(1), 0, 0);      // one message of such a round
    }
    return std::nullopt;
  }
  // The operations each path issues are those sched/plan/plan.cpp's fixed_latency_us counts.
  switch (c) {
    case Collective::all_reduce:
      if (p == Path::two_shot) return shape(a2a_ag(1, 1), a2a_ag(part, part), 3, 3);
      if (p == Path::one_shot) return shape(ag(1), ag(n - 1), 1 + n, 2);
      if (p == Path::ring) return shape(a2a_ag(n - 1, 1), a2a_ag(part, part), 1 + 2 * part, 2 * (n - 1) + 1);
      break;
    case Collective::reduce_scatter:
      if (p == Path::two_shot || p == Path::one_shot) return shape(a2a(1), a2a(part), 2, 2);
      if (p == Path::ring) return shape(a2a(n - 1), a2a(part), 1 + part, n);
      break;
    case Collective::all_gather:
      if (p == Path::two_shot || p == Path::one_shot) return shape(ag(1), ag(part), 1 / n + 1, 2);
      break;
    case Collective::all_to_all:  // the same round of quantized chunks; the own chunk copied
      if (p == Path::one_shot) return shape(a2a(1), a2a(part), 2 * part + 1 / n, 5);
      break;
    case Collective::send_recv:  // quantized by the sender, decoded by the receiver
      if (p == Path::one_shot) return shape(a2a(1), a2a(1), 2, 2);
      break;
  }
  return std::nullopt;
}

namespace {
// Cost as intercept (us) + slope (us per byte of S).
struct Line {
  double intercept_us;
  double slope_us_per_byte;
};
std::optional<Line> cost_line(Collective c, Path p, int nranks, const Link& link, const Codec& codec,
                              const WireParams& wire, GatherMethod gather) {
  const auto shape = path_shape(c, p, nranks, gather);
  if (!shape || !(link.bus_gbps > 0)) return std::nullopt;
  const bool fp8 = p != Path::passthrough && p != Path::fallback;
  Line line{fixed_latency_us(*shape, link), 0};
  for (NcclOp op : kNcclOps)
    if (shape->op_bus.of(op) > 0) {
      const double bytes_per_us = link.bandwidth_gbps(op) * 1e3;  // GB/s -> bytes/us
      if (!(bytes_per_us > 0)) return std::nullopt;
      line.slope_us_per_byte += shape->op_bus.of(op) / bytes_per_us;
    }
  if (fp8) {
    line.slope_us_per_byte *= wire.ratio();
    line.intercept_us += shape->launches * codec.launch_us;
    if (codec.gbps > 0) line.slope_us_per_byte += shape->codec_bytes_per_s / (codec.gbps * 1e3);
  }
  return line;
}
}  // namespace

double predict_us(Collective c, Path p, int nranks, double bytes, const Link& link, const Codec& codec,
                  const WireParams& wire, GatherMethod gather) {
  const auto line = cost_line(c, p, nranks, link, codec, wire, gather);
  if (!line) return std::numeric_limits<double>::quiet_NaN();
  return line->intercept_us + line->slope_us_per_byte * bytes;
}

PredictedCrossover predict_crossover(Collective c, Path p, int nranks, const Link& link,
                                     const Codec& codec, const WireParams& wire, GatherMethod gather) {
  PredictedCrossover out;
  const auto base = cost_line(c, Path::passthrough, nranks, link, codec, wire, GatherMethod::allgather);
  const auto fp8 = cost_line(c, p, nranks, link, codec, wire, gather);
  if (!base || !fp8) return out;
  if (fp8->slope_us_per_byte > 0)
    out.asymptotic_speedup = base->slope_us_per_byte / fp8->slope_us_per_byte;
  if (!(fp8->slope_us_per_byte < base->slope_us_per_byte)) return out;  // never cheaper per byte
  out.wins = true;
  const double gap = fp8->intercept_us - base->intercept_us;
  if (gap <= 0) return out;  // cheaper at every size
  // Smallest S with fp8(S) < base(S); strictly above the crossing, rounded up to a whole byte.
  const double s = gap / (base->slope_us_per_byte - fp8->slope_us_per_byte);
  out.bytes = static_cast<uint64_t>(std::floor(s)) + 1;
  return out;
}

}  // namespace fp8wire::bench
