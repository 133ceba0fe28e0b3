#include "bench/host/results.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "common/input_limits.hpp"
#include "sched/plan/cost_model.hpp"

namespace fp8wire::bench {

using nlohmann::json;

namespace {

using Key = std::tuple<int, int, uint64_t>;  // collective, dtype, bytes
Key key_of(const SweepPoint& p) {
  return {static_cast<int>(p.collective), static_cast<int>(p.dtype), p.bytes};
}
bool usable(const SweepPoint& p) { return p.supported && p.time.n > 0 && p.time.median > 0; }

// The point of one curve at one size: a path and the gather transport its points ran with
// (SweepPoint::gather_transport; "" for the paths without a gather step).
// A curve's key besides its path: the gather transport, and the direct transport when one carried it.
std::string curve_key(const SweepPoint& p) {
  return p.transport.empty() ? p.gather_transport : p.gather_transport + "@" + p.transport;
}

const SweepPoint* find_point(const SweepResult& r, Collective c, DType d, Path path, const std::string& curve,
                             uint64_t bytes) {
  for (const auto& p : r.points)
    if (p.collective == c && p.dtype == d && p.path == path && curve_key(p) == curve && p.bytes == bytes)
      return &p;
  return nullptr;
}
// Plain NCCL is timed once per size, whatever the gather transports.
const SweepPoint* find_baseline(const SweepResult& r, Collective c, DType d, uint64_t bytes) {
  for (const auto& p : r.points)
    if (p.collective == c && p.dtype == d && p.path == Path::passthrough && p.bytes == bytes) return &p;
  return nullptr;
}

// Curve keys in the order tables list a path's curves: NCCL's gather transports, then the direct ones.
constexpr const char* kTransportOrder[] = {"", "allgather", "sendrecv", "mixed", "@peer_memory", "@host_memory"};

std::vector<std::pair<Collective, DType>> measured_pairs(const SweepResult& r) {
  std::vector<std::pair<Collective, DType>> out;
  for (const auto& p : r.points) {
    const auto pair = std::make_pair(p.collective, p.dtype);
    if (std::find(out.begin(), out.end(), pair) == out.end()) out.push_back(pair);
  }
  return out;
}

std::vector<uint64_t> sizes_of(const SweepResult& r, Collective c, DType d) {
  std::set<uint64_t> s;
  for (const auto& p : r.points)
    if (p.collective == c && p.dtype == d) s.insert(p.bytes);
  return {s.begin(), s.end()};
}

// The candidate curve for one size: one curve (path and transport), or "best" (path nullopt): the
// fastest of the planner's FP8 choices over every gather transport measured.
const SweepPoint* candidate_point(const SweepResult& r, Collective c, DType d, std::optional<Path> path,
                                  const std::string& transport, uint64_t bytes) {
  if (path) {
    const SweepPoint* p = find_point(r, c, d, *path, transport, bytes);
    return p && usable(*p) ? p : nullptr;
  }
  // Ring is a comparison only (it quantizes at every hop): the planner chooses between two_shot
  // and one_shot, each over either gather transport.
  const SweepPoint* best = nullptr;
  for (const auto& p : r.points)
    if (p.collective == c && p.dtype == d && p.bytes == bytes && (p.path == Path::two_shot || p.path == Path::one_shot) &&
        usable(p) && (!best || p.time.median < best->time.median))
      best = &p;
  return best;
}

}  // namespace

std::optional<GatherMethod> modeled_transport(const SweepPoint& p) {
  if (p.gather_transport == "mixed" || !p.transport.empty()) return std::nullopt;
  return p.gather_transport == "sendrecv" ? GatherMethod::sendrecv : GatherMethod::allgather;
}

std::string path_label(const SweepPoint& p) {
  std::string label = path_name(p.path);
  if (p.gather_transport == "sendrecv") label += "/sr";
  if (p.gather_transport == "mixed") label += "/mix";
  if (!p.transport.empty()) label += "/direct";
  return label;
}

void compute_speedups(SweepResult& result) {
  std::map<Key, double> base;
  for (const auto& p : result.points)
    if (p.path == Path::passthrough && usable(p)) base[key_of(p)] = p.time.median;
  for (auto& p : result.points) {
    const auto it = base.find(key_of(p));
    p.speedup = (it != base.end() && usable(p)) ? it->second / p.time.median : 0.0;
  }
}

void compute_link_limits(SweepResult& result) {
  for (auto& p : result.points) {
    p.link_limit_us = p.link_limit_pct = 0;
    if (p.transport != "host_memory" || !usable(p)) continue;
    WireParams wire = result.wire;
    wire.dtype = p.dtype;
    p.link_limit_us = link_limit(p.collective, result.machine.nranks, p.bytes, wire, result.pinned).us;
    p.link_limit_pct = percent_of_limit(p.link_limit_us, p.time.median);
  }
}

std::string link_limit_basis(const SweepResult& result, Collective c, DType dtype) {
  for (const auto& p : result.points)
    if (p.collective == c && p.dtype == dtype && p.link_limit_us > 0) {
      WireParams wire = result.wire;
      wire.dtype = dtype;
      return link_limit(c, result.machine.nranks, p.bytes, wire, result.pinned).basis;
    }
  return "";
}

std::vector<CrossoverReport> analyze_crossovers(const SweepResult& result, const CrossoverOptions& options) {
  std::vector<CrossoverReport> out;
  for (const auto& [c, d] : measured_pairs(result)) {
    // Every curve measured: a path with each gather transport its points ran with, then "best".
    struct Candidate {
      std::string name;
      std::optional<Path> path;
      std::string transport;
    };
    std::vector<Candidate> candidates;
    for (Path path : {Path::two_shot, Path::one_shot, Path::ring, Path::hierarchical})
      for (const char* transport : kTransportOrder)
        for (const auto& p : result.points)
          if (p.collective == c && p.dtype == d && p.path == path && curve_key(p) == transport && usable(p)) {
            candidates.push_back({path_label(p), path, transport});
            break;
          }
    if (candidates.empty()) continue;
    candidates.push_back({"best", std::nullopt, ""});
    for (const auto& cand : candidates) {
      std::vector<CurvePoint> curve;
      for (uint64_t bytes : sizes_of(result, c, d)) {
        const SweepPoint* base = find_baseline(result, c, d, bytes);
        const SweepPoint* fp8 = candidate_point(result, c, d, cand.path, cand.transport, bytes);
        if (!base || !usable(*base) || !fp8) continue;
        curve.push_back({bytes, base->time.median, base->time.rel_noise(), fp8->time.median,
                         fp8->time.rel_noise()});
      }
      if (curve.empty()) continue;
      out.push_back({c, d, cand.name, find_crossover(curve, options), cand.path, cand.transport});
    }
    // Where the direct transport starts to pay against fp8wire over NCCL's transports: per size the
    // fastest FP8 point of each (a sweep with --transport both).
    std::vector<CurvePoint> direct_curve;
    for (uint64_t bytes : sizes_of(result, c, d)) {
      const SweepPoint* over_nccl = nullptr;
      const SweepPoint* direct = nullptr;
      for (const auto& p : result.points) {
        if (p.collective != c || p.dtype != d || p.bytes != bytes || p.path == Path::passthrough || !usable(p)) continue;
        if (p.path != Path::two_shot && p.path != Path::one_shot) continue;
        const SweepPoint*& slot = p.transport.empty() ? over_nccl : direct;
        if (!slot || p.time.median < slot->time.median) slot = &p;
      }
      if (over_nccl && direct)
        direct_curve.push_back({bytes, over_nccl->time.median, over_nccl->time.rel_noise(), direct->time.median,
                                direct->time.rel_noise()});
    }
    if (!direct_curve.empty())
      out.push_back({c, d, kDirectOverNccl, find_crossover(direct_curve, options), std::nullopt, ""});
  }
  return out;
}

LinearFit fit_baseline(const SweepResult& result, Collective c, std::optional<DType> dtype) {
  std::vector<double> x, t;
  for (const auto& p : result.points) {
    if (p.collective != c || p.path != Path::passthrough || !usable(p)) continue;
    if (dtype && p.dtype != *dtype) continue;
    x.push_back(static_cast<double>(p.bytes) * busbw_factor(c, result.machine.nranks));
    t.push_back(p.time.median);
  }
  return fit_linear_relative(x, t);
}

namespace {
double& latency_field(Link& link, NcclOp op) {
  switch (op) {
    case NcclOp::all_reduce: return link.allreduce_us;
    case NcclOp::all_gather: return link.allgather_us;
    case NcclOp::reduce_scatter: return link.reduce_scatter_us;
    case NcclOp::all_to_all: break;
  }
  return link.alltoall_us;
}
double& bandwidth_field(Link& link, NcclOp op) {
  switch (op) {
    case NcclOp::all_reduce: return link.allreduce_gbps;
    case NcclOp::all_gather: return link.allgather_gbps;
    case NcclOp::reduce_scatter: return link.reduce_scatter_gbps;
    case NcclOp::all_to_all: break;
  }
  return link.alltoall_gbps;
}
const char* op_name(NcclOp op) {
  switch (op) {
    case NcclOp::all_reduce: return "all_reduce";
    case NcclOp::all_gather: return "all_gather";
    case NcclOp::reduce_scatter: return "reduce_scatter";
    case NcclOp::all_to_all: break;
  }
  return "all_to_all";
}

// Latency and bandwidth of operation `op` from every usable point of path (c, path) that issues it
// with the gather transport the point ran with: what the calibrated link already explains (the
// path's other operations, codec, launches) is taken out and the rest fitted as count * alpha + op
// bus bytes / B, relative to the measured time. Returns false when the sweep has no such points.
struct FitSource {
  Collective collective;
  Path path;
  const char* transport = nullptr;  // only the points whose gather step ran over it (null: any)
};

bool fit_operation(const SweepResult& result, Calibration& cal, std::initializer_list<FitSource> sources,
                   NcclOp op, const char* source, std::vector<std::string>& basis) {
  // The path with `op` free: no fixed cost, no time per byte (the smallest positive latency, since 0
  // would mean "use alpha_us").
  Link without = cal.link;
  latency_field(without, op) = std::numeric_limits<double>::min();
  bandwidth_field(without, op) = std::numeric_limits<double>::max();
  // Per point, divided by the number of `op` operations it issues (ring's n-1 hops share the a2a
  // figure; over send/recv two-shot issues two a2a), so points of either transport fit one latency
  // per operation; t is divided alike, which keeps each point's weight relative to its own time.
  // The points of every source are pooled: one latency and one bandwidth per operation must explain
  // all the paths that issue it (a2a: one-shot over send/recv issues one, two-shot over send/recv
  // two; fitted from one path alone, a figure can be right there and far off in the other).
  std::vector<double> x, y, t;
  for (const auto& p : result.points) {
    bool wanted = false;
    for (const auto& src : sources)
      wanted = wanted || (p.collective == src.collective && p.path == src.path &&
                          (!src.transport || p.gather_transport == src.transport));
    if (!wanted || !usable(p)) continue;
    const Collective c = p.collective;
    const Path path = p.path;
    const bool fp8 = path != Path::passthrough && path != Path::fallback;
    const auto gather = modeled_transport(p);
    if (!gather) continue;
    const auto shape = path_shape(c, path, result.machine.nranks, *gather);
    if (!shape || !(shape->ops.of(op) > 0)) continue;
    const double count = shape->ops.of(op);
    WireParams wire = result.wire;
    wire.dtype = p.dtype;
    const double s = static_cast<double>(p.bytes);
    const double known = predict_us(c, path, result.machine.nranks, s, without, cal.codec, wire, *gather);
    if (std::isnan(known)) return false;
    x.push_back(shape->op_bus.of(op) * s * (fp8 ? wire.ratio() : 1.0) / count);
    y.push_back((p.time.median - known) / count);
    t.push_back(p.time.median / count);
  }
  if (x.empty()) return false;
  const LinearFit fit = fit_linear_relative_to(x, y, t);
  double& latency = latency_field(cal.link, op);
  double& bandwidth = bandwidth_field(cal.link, op);
  double alpha = fit.alpha_us;
  if (fit.ok && fit.us_per_byte > 0) {
    bandwidth = 1e-3 / fit.us_per_byte;
  } else {
    // One size, or a time that does not grow with the bytes: the latency alone, the bytes at the
    // link's generic bandwidth (the same relative weights).
    bandwidth = 0;
    double sw = 0, swr = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double w = 1.0 / (t[i] * t[i]);
      sw += w;
      swr += w * (y[i] - x[i] / (cal.link.bus_gbps * 1e3));
    }
    alpha = swr / sw;
  }
  // A derived latency that comes out <= 0 (the other terms already explain the whole time) is kept
  // at 1 us: 0 would mean "not measured" and fall back to op_latency_us.
  latency = std::max(alpha, 1.0);
  basis.push_back(bandwidth > 0 ? fmt::format("{} {:.0f} us + {:.3g} GB/s ({})", op_name(op), latency, bandwidth, source)
                                : fmt::format("{} {:.0f} us ({})", op_name(op), latency, source));
  return true;
}
}  // namespace

void fit_operation_latencies(const SweepResult& result, Calibration& cal) {
  std::vector<std::string> basis;
  auto fit = [&](Collective c, Path path, NcclOp op, const char* source) {
    return fit_operation(result, cal, {{c, path}}, op, source, basis);
  };
  // Plain NCCL: each collective's own baseline.
  fit(Collective::all_reduce, Path::passthrough, NcclOp::all_reduce, "plain all_reduce");
  fit(Collective::reduce_scatter, Path::passthrough, NcclOp::reduce_scatter, "plain reduce_scatter");
  // NCCL's own all-to-all is one grouped send/recv round: where the sweep timed it, the a2a figures
  // come from it first, and the FP8 points below do not overrule it.
  // The FP8 points count towards the operation their gather step really was (fit_operation skips
  // the points that do not issue `op`): all-gather from those that ran it over all-gather, a2a from
  // those that ran it over send/recv.
  // All-gather: plain, else one-shot all-reduce (one all-gather of the quantized inputs plus codec
  // kernels), else FP8 all-gather.
  fit(Collective::all_gather, Path::passthrough, NcclOp::all_gather, "plain all_gather") ||
      fit(Collective::all_reduce, Path::one_shot, NcclOp::all_gather, "FP8 one_shot all_reduce") ||
      fit(Collective::all_gather, Path::one_shot, NcclOp::all_gather, "FP8 all_gather");
  // Grouped send/recv: FP8 reduce-scatter is exactly one, and so is one-shot all-reduce over
  // send/recv; two-shot all-reduce is one plus its gather step (an all-gather, whose figures are
  // known by now or the generic ones; over send/recv a second a2a); last FP8 all-gather over send/recv.
  // The all-reduce paths over send/recv issue nothing but a2a (one-shot one, two-shot two): their
  // points are pooled into one fit, so the figure explains both (fitted from one-shot alone it
  // was right there and half of two-shot's real cost on the emulated 4-rank testbed).
  fit(Collective::all_to_all, Path::passthrough, NcclOp::all_to_all, "plain all_to_all") ||
      fit(Collective::reduce_scatter, Path::two_shot, NcclOp::all_to_all, "FP8 reduce_scatter") ||
      fit_operation(result, cal,
                    {{Collective::all_reduce, Path::one_shot, "sendrecv"},
                     {Collective::all_reduce, Path::two_shot, "sendrecv"}},
                    NcclOp::all_to_all, "FP8 all_reduce over send/recv, one-shot and two-shot pooled", basis) ||
      fit(Collective::all_reduce, Path::two_shot, NcclOp::all_to_all, "FP8 two_shot all_reduce minus its gather step") ||
      fit(Collective::all_gather, Path::one_shot, NcclOp::all_to_all, "FP8 all_gather over send/recv") ||
      fit(Collective::all_to_all, Path::one_shot, NcclOp::all_to_all, "FP8 all_to_all");
  if (basis.empty()) return;
  std::string joined;
  for (const auto& b : basis) joined += (joined.empty() ? "" : ", ") + b;
  cal.link.basis += fmt::format("; per operation on {} ranks: {}", result.machine.nranks, joined);
}

Calibration calibrate(const SweepResult& result) {
  Calibration cal;
  cal.link.name = fmt::format("measured:{}", fabric_name(result.machine.fabric));
  cal.link.measured = true;
  std::optional<Collective> fitted;
  LinearFit fit;
  for (Collective c : kCollectives) {
    fit = fit_baseline(result, c);
    if (fit.ok) {
      fitted = c;
      break;
    }
  }
  if (fitted) {
    cal.link.alpha_us = fit.alpha_us;
    cal.link.bus_gbps = 1e-3 / fit.us_per_byte;
    cal.link.basis = fmt::format("fit of plain NCCL {} on {} ranks (worst residual {:.0f} %)",
                                 collective_name(*fitted), result.machine.nranks, 100 * fit.max_rel_residual);
  } else {
    cal.notes.push_back("no baseline fit (fewer than 2 sizes, or latency-only data): link not calibrated");
  }

  cal.codec = result.codec;
  if (cal.codec.gbps > 0) {
    if (cal.codec.basis.empty()) cal.codec.basis = "codec kernels timed on this GPU";
  } else if (fitted) {
    // Codec throughput from the two_shot slope: slope = ratio * bus/B + codec_passes / C.
    std::vector<double> x, t;
    const DType d = result.points.empty() ? DType::bf16 : result.points.front().dtype;
    for (const auto& p : result.points)
      if (p.collective == *fitted && p.dtype == d && p.path == Path::two_shot && p.transport.empty() && usable(p)) {
        x.push_back(static_cast<double>(p.bytes));
        t.push_back(p.time.median);
      }
    const LinearFit f = fit_linear_relative(x, t);
    const auto shape = path_shape(*fitted, Path::two_shot, result.machine.nranks);
    WireParams wire = result.wire;
    wire.dtype = d;
    if (f.ok && shape) {
      // fit.us_per_byte is the baseline's time per bus byte, i.e. 1 / bus bandwidth.
      const double wire_term = wire.ratio() * shape->bus_bytes_per_s * fit.us_per_byte;
      const double codec_slope = f.us_per_byte - wire_term;
      if (codec_slope > 0) {
        cal.codec.gbps = shape->codec_bytes_per_s / codec_slope * 1e-3;
        cal.codec.basis = "derived from the two_shot slope minus its wire term";
      }
    }
  }
  if (!(cal.codec.gbps > 0)) {
    cal.codec.gbps = 1000.0;
    cal.codec.basis = "assumed 1000 GB/s (not measured)";
    cal.notes.push_back("codec throughput not measured; assumed 1000 GB/s");
  }
  if (!(cal.codec.launch_us > 0)) cal.codec.launch_us = 4.0;

  if (fitted) fit_operation_latencies(result, cal);

  cal.model.op_latency_us = cal.link.alpha_us;
  cal.model.bus_bandwidth_gbps = cal.link.bus_gbps;
  cal.model.codec_gbps = cal.codec.gbps;
  cal.model.kernel_launch_us = cal.codec.launch_us;
  cal.model.allreduce_latency_us = cal.link.allreduce_us;
  cal.model.allgather_latency_us = cal.link.allgather_us;
  cal.model.reduce_scatter_latency_us = cal.link.reduce_scatter_us;
  cal.model.alltoall_latency_us = cal.link.alltoall_us;
  cal.model.allreduce_bandwidth_gbps = cal.link.allreduce_gbps;
  cal.model.allgather_bandwidth_gbps = cal.link.allgather_gbps;
  cal.model.reduce_scatter_bandwidth_gbps = cal.link.reduce_scatter_gbps;
  cal.model.alltoall_bandwidth_gbps = cal.link.alltoall_gbps;
  cal.model.calibrated = fitted.has_value();
  if (fit_direct_transport(result, cal)) cal.model.calibrated = true;
  return cal;
}

bool fit_direct_transport(const SweepResult& result, Calibration& cal) {
  std::vector<double> x, y, t;
  std::string kind;
  CostModel m = cal.model;
  m.codec_gbps = cal.codec.gbps > 0 ? cal.codec.gbps : 1000.0;
  m.kernel_launch_us = cal.codec.launch_us > 0 ? cal.codec.launch_us : 4.0;
  quant::WireFormat format;
  format.fp8 = result.fp8_format == "e5m2" ? Fp8Format::e5m2 : Fp8Format::e4m3;
  format.block = result.wire.block;
  format.scale = result.wire.scale_bytes == 4   ? ScaleType::fp32
                 : result.wire.scale_bytes == 2 ? ScaleType::bf16
                                                : ScaleType::e8m0;
  for (const auto& p : result.points) {
    if (p.transport.empty() || !usable(p)) continue;
    kind = p.transport;
    const Carrier tk = p.transport == "peer_memory" ? Carrier::peer_memory : Carrier::host_memory;
    const sched::DirectCost d =
        sched::direct_cost_parts(m, p.collective, p.path, p.bytes, result.machine.nranks, format, tk);
    x.push_back(d.link_bytes / d.barriers);
    y.push_back((p.time.median - d.other_us) / d.barriers);
    t.push_back(p.time.median / d.barriers);
  }
  if (x.empty()) return false;
  const LinearFit fit = fit_linear_relative_to(x, y, t);
  if (!fit.ok || !(fit.us_per_byte > 0)) {
    cal.notes.push_back("direct transport timed, but its times do not grow with the bytes: not calibrated");
    return false;
  }
  cal.model.direct_latency_us = std::max(fit.alpha_us, 1.0);
  cal.model.direct_bandwidth_gbps = 1e-3 / fit.us_per_byte;
  cal.link.basis += fmt::format("; direct transport ({}, {} points): {:.0f} us per barrier + {:.3g} GB/s per rank's link",
                                kind, x.size(), cal.model.direct_latency_us, cal.model.direct_bandwidth_gbps);
  return true;
}

// --- JSON -------------------------------------------------------------------------------------

namespace {
json summary_json(const Summary& s) {
  return {{"n", s.n}, {"median", s.median}, {"p25", s.p25}, {"p75", s.p75}, {"min", s.min},
          {"max", s.max}, {"mean", s.mean}, {"mad", s.mad}};
}
json crossover_json(const CrossoverReport& r) {
  const auto& x = r.crossover;
  json outcomes = json::array();
  for (auto o : x.outcomes) outcomes.push_back(to_string(o));
  return {{"collective", collective_name(r.collective)}, {"dtype", to_string(r.dtype)},
          {"candidate", r.candidate}, {"found", x.found}, {"at_smallest", x.at_smallest},
          {"bytes", x.bytes}, {"interp_bytes", x.interp_bytes}, {"speedup", x.speedup},
          {"min_speedup_above", x.min_speedup_above}, {"tolerance", x.tolerance},
          {"outcomes", outcomes}};
}
}  // namespace

json to_json(const SweepResult& r, const std::vector<CrossoverReport>& crossovers, const Calibration& cal) {
  json j;
  j["tool"] = "fp8wire-bench sweep";
  j["schema"] = 1;
  const auto& m = r.machine;
  j["machine"] = {{"hostname", m.hostname}, {"gpu", m.gpu_name}, {"compute_capability", m.compute_capability},
                  {"driver_version", m.driver_version}, {"cuda_runtime_version", m.runtime_version},
                  {"nccl_version", m.nccl_version}, {"nranks", m.nranks}, {"emulated", m.emulated}, {"testbed", m.testbed},
                  {"fabric", fabric_name(m.fabric)}, {"p2p_disabled", m.p2p_disabled},
                  {"created_utc", m.created_utc}};
  j["options"] = r.options;
  j["wire"] = {{"format", r.fp8_format}, {"block", r.wire.block}, {"scale_bytes", r.wire.scale_bytes}};
  j["codec"] = {{"gbps", r.codec.gbps}, {"launch_us", r.codec.launch_us}, {"basis", r.codec.basis}};
  j["gather_transport"] = {{"requested", r.gather_transport_requested}, {"config", r.gather_transport_config}};
  json points = json::array();
  for (const auto& p : r.points) {
    json c = {{"ran", p.check.ran}, {"pass", p.check.pass}, {"max_err_ratio", p.check.max_err_ratio},
              {"bound", p.check.bound}, {"mismatches", p.check.mismatches},
              {"nonfinite", p.check.nonfinite}, {"bitwise_required", p.check.bitwise_required},
              {"bitwise_identical", p.check.bitwise_identical}};
    points.push_back({{"collective", collective_name(p.collective)}, {"dtype", to_string(p.dtype)},
                      {"path", path_name(p.path)}, {"bytes", p.bytes}, {"count", p.count},
                      {"supported", p.supported}, {"error", p.error}, {"times_us", p.times_us},
                      {"time_us", summary_json(p.time)}, {"algbw_gbps", p.algbw_gbps},
                      {"busbw_gbps", p.busbw_gbps}, {"wire_bytes", p.wire_bytes},
                      {"wire_source", p.wire_source}, {"gather_transport", p.gather_transport},
                      {"transport", p.transport},
                      {"speedup", p.speedup}, {"link_limit_us", p.link_limit_us},
                      {"link_limit_pct", p.link_limit_pct}, {"check", c}});
  }
  j["points"] = points;
  if (r.pinned.measured()) {
    json bases = json::object();
    for (const auto& [c, d] : measured_pairs(r))
      if (std::string b = link_limit_basis(r, c, d); !b.empty())
        bases[fmt::format("{} {}", collective_name(c), to_string(d))] = b;
    json in_copies = json::array();
    for (const DuplexInCopies& d : r.pinned.duplex_small)
      if (d.copy_bytes)
        in_copies.push_back({{"copy_bytes", d.copy_bytes}, {"d2h_gbps", d.d2h_gbps}, {"h2d_gbps", d.h2d_gbps}});
    j["pinned_copy"] = {{"d2h_gbps", r.pinned.d2h_gbps}, {"h2d_gbps", r.pinned.h2d_gbps},
                        {"duplex_d2h_gbps", r.pinned.duplex_d2h_gbps}, {"duplex_h2d_gbps", r.pinned.duplex_h2d_gbps},
                        {"duplex_in_copies", in_copies},
                        {"ranks_per_link", r.pinned.ranks_per_link}, {"bytes_per_rank", r.pinned.bytes},
                        {"link_limit_basis", bases}};
  }
  json xs = json::array();
  for (const auto& x : crossovers) xs.push_back(crossover_json(x));
  j["crossovers"] = xs;
  j["cost_model"] = {{"fabric", fabric_name(m.fabric)}, {"op_latency_us", cal.model.op_latency_us},
                     {"bus_bandwidth_gbps", cal.model.bus_bandwidth_gbps},
                     {"codec_gbps", cal.model.codec_gbps}, {"kernel_launch_us", cal.model.kernel_launch_us},
                     {"allreduce_latency_us", cal.model.allreduce_latency_us},
                     {"allgather_latency_us", cal.model.allgather_latency_us},
                     {"reduce_scatter_latency_us", cal.model.reduce_scatter_latency_us},
                     {"alltoall_latency_us", cal.model.alltoall_latency_us},
                     {"allreduce_bandwidth_gbps", cal.model.allreduce_bandwidth_gbps},
                     {"allgather_bandwidth_gbps", cal.model.allgather_bandwidth_gbps},
                     {"reduce_scatter_bandwidth_gbps", cal.model.reduce_scatter_bandwidth_gbps},
                     {"alltoall_bandwidth_gbps", cal.model.alltoall_bandwidth_gbps},
                     {"calibrated", cal.model.calibrated}, {"link_basis", cal.link.basis},
                     {"codec_basis", cal.codec.basis}, {"notes", cal.notes}};
  return j;
}

std::optional<SweepResult> sweep_from_json(const json& j, std::string& error) {
  SweepResult r;
  try {
    const auto& m = j.at("machine");
    r.machine.hostname = m.value("hostname", "");
    r.machine.gpu_name = m.value("gpu", "");
    r.machine.compute_capability = m.value("compute_capability", 0);
    r.machine.driver_version = m.value("driver_version", 0);
    r.machine.runtime_version = m.value("cuda_runtime_version", 0);
    r.machine.nccl_version = m.value("nccl_version", 0);
    r.machine.nranks = m.at("nranks").get<int>();
    r.machine.emulated = m.value("emulated", false);
    r.machine.testbed = m.value("testbed", "");
    r.machine.p2p_disabled = m.value("p2p_disabled", false);
    r.machine.created_utc = m.value("created_utc", "");
    const std::string fabric = m.at("fabric").get<std::string>();
    const auto f = parse_fabric(fabric);
    if (!f) {
      error = fmt::format("machine.fabric '{}': expected nvlink, pcie or net", fabric);
      return std::nullopt;
    }
    r.machine.fabric = *f;
    r.options = j.value("options", json::object());
    if (j.contains("wire")) {
      r.fp8_format = j["wire"].value("format", "e4m3");
      r.wire.block = j["wire"].value("block", 128u);
      r.wire.scale_bytes = j["wire"].value("scale_bytes", size_t{4});
    }
    if (j.contains("codec")) {
      r.codec.gbps = j["codec"].value("gbps", 0.0);
      r.codec.launch_us = j["codec"].value("launch_us", 0.0);
      r.codec.basis = j["codec"].value("basis", "");
    }
    if (j.contains("gather_transport")) {
      const auto& g = j["gather_transport"];
      r.gather_transport_requested = g.value("requested", "");
      r.gather_transport_config = g.value("config", "");
      for (const auto& [field, value] : {std::pair{"requested", &r.gather_transport_requested},
                                         std::pair{"config", &r.gather_transport_config}})
        if (!value->empty() && !parse_gather_transport_option(*value)) {
          error = fmt::format("gather_transport.{} '{}': expected auto, allgather, sendrecv or both", field, *value);
          return std::nullopt;
        }
    }
    if (j.contains("pinned_copy")) {
      const auto& pc = j["pinned_copy"];
      r.pinned.d2h_gbps = pc.value("d2h_gbps", 0.0);
      r.pinned.h2d_gbps = pc.value("h2d_gbps", 0.0);
      r.pinned.duplex_d2h_gbps = pc.value("duplex_d2h_gbps", 0.0);
      r.pinned.duplex_h2d_gbps = pc.value("duplex_h2d_gbps", 0.0);
      if (pc.contains("duplex_in_copies") && pc["duplex_in_copies"].is_array()) {
        size_t k = 0;
        for (const auto& d : pc["duplex_in_copies"]) {
          if (k == std::size(r.pinned.duplex_small) || !d.is_object()) break;
          r.pinned.duplex_small[k++] = {d.value("copy_bytes", uint64_t{0}), d.value("d2h_gbps", 0.0),
                                        d.value("h2d_gbps", 0.0)};
        }
      }
      r.pinned.ranks_per_link = pc.value("ranks_per_link", 1);
      r.pinned.bytes = pc.value("bytes_per_rank", uint64_t{0});
    }
    size_t index = 0;
    for (const auto& pj : j.at("points")) {
      SweepPoint p;
      const std::string cs = pj.at("collective").get<std::string>();
      const std::string ds = pj.at("dtype").get<std::string>();
      const std::string ps = pj.at("path").get<std::string>();
      const auto c = parse_collective(cs);
      const auto d = parse_dtype(ds);
      const auto path = parse_path(ps);
      if (!c || !d || !path) {
        error = fmt::format("points[{}]: unknown collective '{}', dtype '{}' or path '{}'", index, cs, ds, ps);
        return std::nullopt;
      }
      p.collective = *c;
      p.dtype = *d;
      p.path = *path;
      p.bytes = pj.at("bytes").get<uint64_t>();
      p.count = pj.value("count", uint64_t{0});
      p.supported = pj.value("supported", true);
      p.error = pj.value("error", "");
      p.times_us = pj.value("times_us", std::vector<double>{});
      p.time = summarize(p.times_us);
      p.algbw_gbps = pj.value("algbw_gbps", 0.0);
      p.busbw_gbps = pj.value("busbw_gbps", 0.0);
      p.wire_bytes = pj.value("wire_bytes", uint64_t{0});
      p.wire_source = pj.value("wire_source", "");
      // Sweeps from before the transport was selectable always gathered with ncclAllGather.
      p.gather_transport = pj.value("gather_transport", has_gather_step(p.collective, p.path) ? "allgather" : "");
      p.transport = pj.value("transport", "");
      if (!p.transport.empty() && p.transport != "peer_memory" && p.transport != "host_memory") {
        error = fmt::format("points[{}].transport '{}': expected \"\", peer_memory or host_memory", index, p.transport);
        return std::nullopt;
      }
      if (p.gather_transport != "" && p.gather_transport != "allgather" && p.gather_transport != "sendrecv" &&
          p.gather_transport != "mixed") {
        error = fmt::format("points[{}].gather_transport '{}': expected allgather, sendrecv, mixed or \"\"", index,
                            p.gather_transport);
        return std::nullopt;
      }
      if (pj.contains("check")) {
        const auto& cj = pj["check"];
        p.check.ran = cj.value("ran", false);
        p.check.pass = cj.value("pass", false);
        p.check.max_err_ratio = cj.value("max_err_ratio", 0.0);
        p.check.bound = cj.value("bound", 0.0);
        p.check.mismatches = cj.value("mismatches", uint64_t{0});
        p.check.nonfinite = cj.value("nonfinite", uint64_t{0});
        p.check.bitwise_required = cj.value("bitwise_required", false);
        p.check.bitwise_identical = cj.value("bitwise_identical", true);
      }
      r.points.push_back(std::move(p));
      ++index;
    }
  } catch (const json::exception& e) {
    error = fmt::format("not a fp8wire-bench sweep JSON: {}", e.what());
    return std::nullopt;
  }
  compute_speedups(r);
  compute_link_limits(r);
  return r;
}

// --- tables -----------------------------------------------------------------------------------

namespace {

std::string emulated_label(const MachineInfo& m) {
  if (!m.emulated) return "";
  if (m.testbed == "mps") return " (emulated, 1 GPU, side by side under MPS)";
  if (m.testbed == "time-sliced") return " (emulated, 1 GPU, time-sliced)";
  return " (emulated, 1 GPU)";
}

}  // namespace

std::string render_table(const SweepResult& r, Collective c, DType d) {
  std::string out = fmt::format(
      "# {} {}  ranks {}{}  fabric {}  fp8 {} block {}\n", collective_name(c), to_string(d),
      r.machine.nranks, emulated_label(r.machine), fabric_name(r.machine.fabric),
      r.fp8_format, r.wire.block);
  const std::string basis = link_limit_basis(r, c, d);
  if (!basis.empty()) out += fmt::format("# % of link limit (host memory points): {}\n", basis);
  // Path column: the path, "/sr" when its gather step went over send/recv ("/mix": both).
  out += fmt::format("# {:>10} {:>12} {:>12} {:>10} {:>7} {:>8} {:>8} {:>11} {:>7} {:>10} {:>6}  {}\n", "size",
                     "count", "path", "time(us)", "+-%", "algbw", "busbw", "wire(B)", "speedup",
                     "maxerr", "link%", "check");
  out += fmt::format("# {:>10} {:>12} {:>12} {:>10} {:>7} {:>8} {:>8} {:>11} {:>7} {:>10} {:>6}\n", "", "", "",
                     "median", "", "GB/s", "GB/s", "per rank", "", "", "limit");
  for (uint64_t bytes : sizes_of(r, c, d)) {
    // A path measured over both gather transports has a row for each.
    std::vector<const SweepPoint*> rows;
    for (Path path : {Path::passthrough, Path::two_shot, Path::one_shot, Path::ring})
      for (const char* transport : kTransportOrder)
        if (const SweepPoint* p = find_point(r, c, d, path, transport, bytes)) rows.push_back(p);
    for (const SweepPoint* p : rows) {
      if (!p->supported) {
        out += fmt::format("  {:>10} {:>12} {:>12}   unsupported: {}\n", format_bytes(bytes), p->count,
                           path_label(*p), p->error);
        continue;
      }
      std::string check = "-";
      if (p->check.ran) {
        check = p->check.pass ? "PASS" : "FAIL";
        if (p->check.bitwise_required) check += p->check.bitwise_identical ? " same" : " DIFF";
      }
      out += fmt::format("  {:>10} {:>12} {:>12} {:>10.1f} {:>7.1f} {:>8.2f} {:>8.2f} {:>11} {:>7} {:>10.2e} {:>6}  {}\n",
                         format_bytes(bytes), p->count, path_label(*p), p->time.median,
                         100 * p->time.rel_spread(), p->algbw_gbps, p->busbw_gbps, p->wire_bytes,
                         p->speedup > 0 ? fmt::format("{:.2f}x", p->speedup) : std::string("-"),
                         p->check.max_err_ratio,
                         p->link_limit_pct > 0 ? fmt::format("{:.1f}%", p->link_limit_pct) : std::string("-"), check);
    }
  }
  return out;
}

namespace {
std::string crossover_cell(const Crossover& x) {
  if (!x.found) return "never (in range)";
  return fmt::format("{}{} ({:.2f}x, min {:.2f}x above)", x.at_smallest ? "<=" : "", format_bytes(x.bytes),
                     x.speedup, x.min_speedup_above);
}
}  // namespace

std::string render_crossovers(const SweepResult& r, const std::vector<CrossoverReport>& reports) {
  std::string out = fmt::format("# crossovers, fabric {} ({} ranks): smallest size from which fp8wire wins at every larger size\n",
                                fabric_name(r.machine.fabric), r.machine.nranks);
  for (const auto& x : reports)
    out += fmt::format("  {:<15} {:<5} {:<12} {}{}\n", collective_name(x.collective), to_string(x.dtype),
                       x.candidate, crossover_cell(x.crossover),
                       x.candidate == kDirectOverNccl ? "  [the direct transport against fp8wire over NCCL's]" : "");
  return out;
}

std::string render_fabric_comparison(const std::vector<SweepResult>& results, const CrossoverOptions& options) {
  std::string out = "# crossover by fabric (measured)\n";
  out += fmt::format("  {:<15} {:<5} {:<12}", "collective", "dtype", "candidate");
  std::vector<std::vector<CrossoverReport>> all;
  for (const auto& r : results) {
    out += fmt::format(" {:<34}", fmt::format("{} ({} ranks)", fabric_name(r.machine.fabric), r.machine.nranks));
    all.push_back(analyze_crossovers(r, options));
  }
  out += "\n";
  std::vector<std::tuple<Collective, DType, std::string>> rows;
  for (const auto& reports : all)
    for (const auto& x : reports) {
      auto row = std::make_tuple(x.collective, x.dtype, x.candidate);
      if (std::find(rows.begin(), rows.end(), row) == rows.end()) rows.push_back(row);
    }
  for (const auto& [c, d, cand] : rows) {
    out += fmt::format("  {:<15} {:<5} {:<12}", collective_name(c), to_string(d), cand);
    for (const auto& reports : all) {
      std::string cell = "not measured";
      for (const auto& x : reports)
        if (x.collective == c && x.dtype == d && x.candidate == cand) cell = crossover_cell(x.crossover);
      out += fmt::format(" {:<34}", cell);
    }
    out += "\n";
  }
  return out;
}

std::vector<std::string> failed_checks(const SweepResult& r) {
  std::vector<std::string> out;
  for (const auto& p : r.points) {
    if (!p.check.ran || (p.check.pass && (!p.check.bitwise_required || p.check.bitwise_identical))) continue;
    out.push_back(fmt::format("{} {} {} {}: max_err_ratio {:.3g} (bound {:.3g}), {} beyond bound, {} non-finite{}",
                              collective_name(p.collective), to_string(p.dtype), path_label(p),
                              format_bytes(p.bytes), p.check.max_err_ratio, p.check.bound, p.check.mismatches,
                              p.check.nonfinite,
                              p.check.bitwise_required && !p.check.bitwise_identical ? ", ranks differ bitwise" : ""));
  }
  return out;
}

std::optional<SweepResult> read_sweep_file(const std::string& path, std::string& error) {
  std::string text;
  if (!read_file_bounded(path, kMaxSweepJsonBytes, "a sweep's JSON", text, error)) return std::nullopt;
  if (const std::string problem = json_check_text(text); !problem.empty()) {
    error = fmt::format("'{}': {}", path, problem);
    return std::nullopt;
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    error = fmt::format("'{}' is not valid JSON: {}", path, e.what());
    return std::nullopt;
  }
  auto r = sweep_from_json(j, error);
  if (!r) error = fmt::format("'{}': {}", path, error);
  return r;
}

}  // namespace fp8wire::bench
