#include "bench/host/model_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

#include "sched/plan/cost_model.hpp"

namespace fp8wire::bench {

using nlohmann::json;

namespace {
std::string predicted_cell(const PredictedCrossover& p) {
  if (!p.wins) return "never";
  if (p.bytes == 0) return "all sizes";
  return format_bytes(p.bytes);
}

// The FP8 path the planner would pick at large sizes over this link: the planner's own chooser
// (sched::cheaper_all_reduce) fed this link's and codec's figures, with the all-gather step the curves
// of the report are drawn with.
Path planner_path(Collective c, int nranks, const Link& link, const Codec& codec, const WireParams& wire) {
  if (c != Collective::all_reduce) return only_fp8_path(c);
  CostModel model;
  model.op_latency_us = link.alpha_us;
  model.bus_bandwidth_gbps = link.bus_gbps;
  model.allreduce_latency_us = link.allreduce_us;
  model.allgather_latency_us = link.allgather_us;
  model.reduce_scatter_latency_us = link.reduce_scatter_us;
  model.alltoall_latency_us = link.alltoall_us;
  model.allreduce_bandwidth_gbps = link.allreduce_gbps;
  model.allgather_bandwidth_gbps = link.allgather_gbps;
  model.reduce_scatter_bandwidth_gbps = link.reduce_scatter_gbps;
  model.alltoall_bandwidth_gbps = link.alltoall_gbps;
  model.codec_gbps = codec.gbps;
  model.kernel_launch_us = codec.launch_us;
  quant::WireFormat format;
  format.block = wire.block;
  format.scale = wire.scale_bytes == 4 ? ScaleType::fp32 : wire.scale_bytes == 2 ? ScaleType::bf16 : ScaleType::e8m0;
  return sched::cheaper_all_reduce(model, format, GatherMethod::allgather, 1ull << 30, nranks);
}
// The link of the old model, for comparison: one latency for every operation and one bandwidth,
// both fitted from the collective's own plain-NCCL points.
std::optional<Link> single_latency_link(const SweepResult& s, Collective c, DType d) {
  const LinearFit fit = fit_baseline(s, c, d);
  if (!fit.ok) return std::nullopt;
  return Link{fmt::format("measured:{}", fabric_name(s.machine.fabric)), fit.alpha_us, 1e-3 / fit.us_per_byte,
              "fit of this sweep's baseline", true};
}

// Worst |predicted / measured - 1| over the sizes of (c, d) for the baseline and one curve (`path`
// with the gather transport its points ran with, SweepPoint::gather_transport).
double worst_time_error(const SweepResult& s, Collective c, DType d, Path path, const std::string& transport,
                        const Link& link, const Codec& codec) {
  WireParams wire = s.wire;
  wire.dtype = d;
  double worst = 0;
  for (const auto& p : s.points) {
    if (p.collective != c || p.dtype != d) continue;
    if (p.path != Path::passthrough && (p.path != path || p.gather_transport != transport)) continue;
    const auto gather = modeled_transport(p);
    if (!p.supported || !(p.time.median > 0) || !gather) continue;
    const double predicted =
        predict_us(c, p.path, s.machine.nranks, static_cast<double>(p.bytes), link, codec, wire, *gather);
    worst = std::max(worst, std::fabs(predicted / p.time.median - 1));
  }
  return worst;
}

std::string crossover_error(const PredictedCrossover& p, const Crossover& measured, uint64_t smallest_measured,
                            json& octaves_json) {
  octaves_json = nullptr;
  if (p.wins && measured.found) {
    // Error in octaves (log2 of predicted / measured) is what matters for a threshold on a log grid.
    // The grid cannot tell a crossover below its smallest size from one at it: a prediction below
    // counts as that size ("all sizes" would otherwise read as tens of octaves off).
    const double predicted = static_cast<double>(std::max<uint64_t>(p.bytes, smallest_measured));
    const double octaves = std::log2(predicted / static_cast<double>(measured.bytes));
    octaves_json = octaves;
    return fmt::format("{:+.2f} oct", octaves);
  }
  return p.wins != measured.found ? "disagree" : "agree";
}

// Octaves between a predicted crossover and the measured range where it can lie: from the last
// measured loss below the measured crossover (the sizes in between are ties, where noise cannot tell
// the paths apart) up to the crossover. 0 inside that range. nullopt when either side has none.
std::optional<double> octaves_outside_ties(const PredictedCrossover& p, const Crossover& measured,
                                           const std::vector<uint64_t>& sizes, uint64_t smallest) {
  if (!p.wins || !measured.found) return std::nullopt;
  uint64_t lower = 0;
  for (size_t i = 0; i < sizes.size() && i < measured.outcomes.size(); ++i)
    if (sizes[i] < measured.bytes && measured.outcomes[i] == Outcome::loss) lower = sizes[i];
  const double predicted = static_cast<double>(std::max<uint64_t>(p.bytes, smallest));
  if (predicted > static_cast<double>(measured.bytes)) return std::log2(predicted / static_cast<double>(measured.bytes));
  if (lower > 0 && predicted <= static_cast<double>(lower)) return std::log2(predicted / static_cast<double>(lower));
  return 0.0;
}

// The gather transport a measured curve's crossover is predicted with: the one its points ran with
// (a curve of "mixed" points, which no one shape describes, as all-gather).
GatherMethod crossover_transport(const CrossoverReport& x) {
  return x.gather_transport == "sendrecv" ? GatherMethod::sendrecv : GatherMethod::allgather;
}

// The planner's candidates for a collective: plain NCCL and its FP8 algorithms (ring is a comparison
// only: it quantizes at every hop).
std::vector<Path> planner_candidates(Collective c) {
  if (c == Collective::all_reduce) return {Path::passthrough, Path::two_shot, Path::one_shot};
  return {Path::passthrough, only_fp8_path(c)};
}
}  // namespace

ModelReport model_report(const std::vector<SweepResult>& sweeps, const ModelOptions& options) {
  ModelReport report;
  report.json = {{"tool", "fp8wire-bench model"}, {"checks", json::array()}, {"choices", json::array()},
                 {"predictions", json::array()}, {"links", json::array()}};
  std::string& out = report.text;

  // Codec: the override, else the first sweep that measured it, else the first calibration.
  Codec codec;
  for (const auto& s : sweeps) {
    const Calibration cal = calibrate(s);
    if (s.codec.gbps > 0 || codec.gbps <= 0) codec = cal.codec;
    if (s.codec.gbps > 0) break;
  }
  if (options.codec_gbps) {
    codec.gbps = *options.codec_gbps;
    codec.basis = "--codec-gbps";
  }
  if (options.launch_us) codec.launch_us = *options.launch_us;
  if (!(codec.gbps > 0)) {
    codec.gbps = 1000;
    codec.basis = "assumed 1000 GB/s";
  }
  if (!(codec.launch_us > 0)) codec.launch_us = 4;
  out += fmt::format("# codec: {:.0f} GB/s, {:.1f} us per launch ({})\n", codec.gbps, codec.launch_us, codec.basis);
  report.json["codec"] = {{"gbps", codec.gbps}, {"launch_us", codec.launch_us}, {"basis", codec.basis}};

  // 1. Check against every measured fabric: link fitted from that sweep's baseline, crossover
  //    predicted by the model vs the crossover measured.
  out += "\n# model check against measured fabrics (link calibrated from each sweep as in its profile:\n"
         "# generic figures from plain NCCL, a latency and bandwidth per NCCL operation)\n";
  out += "# error: octaves from the measured crossover; ties: octaves outside the measured range where the\n"
         "# crossover can lie (above the last loss, sizes in between are ties; 0 = inside); t.err: worst\n"
         "# |predicted/measured - 1| over the sizes of the baseline and the path. The '1-lat' columns are the\n"
         "# former model (one latency and bandwidth per fabric, fitted from the collective's baseline).\n";
  out += fmt::format("  {:<8} {:>5} {:<15} {:<5} {:<11} {:>18} | {:>10} {:>10} {:>6} {:>6} | {:>10} {:>10} {:>6} {:>6}\n",
                     "fabric", "ranks", "collective", "dtype", "path", "measured", "predicted", "error", "ties",
                     "t.err", "1-lat pred", "error", "ties", "t.err");
  std::vector<int> world_sizes = options.nranks;
  std::string choices;
  for (const auto& s : sweeps) {
    if (std::find(world_sizes.begin(), world_sizes.end(), s.machine.nranks) == world_sizes.end())
      world_sizes.push_back(s.machine.nranks);
    const auto crossovers = analyze_crossovers(s, options.crossover);
    // The link the sweep's profile gets (the planner's model), with the report's codec.
    const Calibration cal = calibrate(s);
    if (!cal.model.calibrated) continue;
    const Link& link = cal.link;
    for (const auto& x : crossovers) {
      const auto path = x.path;  // nullopt: "best"
      const auto single = single_latency_link(s, x.collective, x.dtype);
      if (!path || !single) continue;
      WireParams wire = s.wire;
      wire.dtype = x.dtype;
      const GatherMethod gather = crossover_transport(x);
      const PredictedCrossover p = predict_crossover(x.collective, *path, s.machine.nranks, link, codec, wire, gather);
      const PredictedCrossover p1 = predict_crossover(x.collective, *path, s.machine.nranks, *single, codec, wire, gather);
      std::string measured = x.crossover.found ? format_bytes(x.crossover.bytes) : "never";
      if (x.crossover.found && x.crossover.at_smallest) measured = "<=" + measured;
      // The sizes of the measured curve (both paths measured), as analyze_crossovers builds it.
      std::vector<uint64_t> sizes;
      for (const auto& pt : s.points) {
        if (pt.collective != x.collective || pt.dtype != x.dtype || pt.path != *path ||
            pt.gather_transport != x.gather_transport || !pt.supported || !(pt.time.median > 0))
          continue;
        for (const auto& b : s.points)
          if (b.collective == x.collective && b.dtype == x.dtype && b.path == Path::passthrough &&
              b.bytes == pt.bytes && b.supported && b.time.median > 0) {
            sizes.push_back(pt.bytes);
            break;
          }
      }
      std::sort(sizes.begin(), sizes.end());
      const uint64_t smallest = sizes.empty() ? 1 : sizes.front();
      const auto ties = octaves_outside_ties(p, x.crossover, sizes, smallest);
      const auto ties1 = octaves_outside_ties(p1, x.crossover, sizes, smallest);
      auto ties_cell = [](const std::optional<double>& o) { return o ? fmt::format("{:+.2f}", *o) : std::string("-"); };
      json err_json, err1_json;
      const std::string error = crossover_error(p, x.crossover, smallest, err_json);
      const std::string error1 = crossover_error(p1, x.crossover, smallest, err1_json);
      const double terr = worst_time_error(s, x.collective, x.dtype, *path, x.gather_transport, link, codec);
      const double terr1 = worst_time_error(s, x.collective, x.dtype, *path, x.gather_transport, *single, codec);
      out += fmt::format("  {:<8} {:>5} {:<15} {:<5} {:<11} {:>18} | {:>10} {:>10} {:>6} {:>5.0f}% | {:>10} {:>10} {:>6} {:>5.0f}%\n",
                         fabric_name(s.machine.fabric), s.machine.nranks, collective_name(x.collective),
                         to_string(x.dtype), x.candidate, measured, predicted_cell(p), error, ties_cell(ties),
                         100 * terr, predicted_cell(p1), error1, ties_cell(ties1), 100 * terr1);
      report.json["checks"].push_back({{"fabric", fabric_name(s.machine.fabric)}, {"nranks", s.machine.nranks},
                                       {"collective", collective_name(x.collective)}, {"dtype", to_string(x.dtype)},
                                       {"path", path_name(*path)}, {"gather_transport", x.gather_transport},
                                       {"predicted_wins", p.wins}, {"predicted_bytes", p.bytes},
                                       {"measured_found", x.crossover.found}, {"measured_bytes", x.crossover.bytes},
                                       {"error_octaves", err_json}, {"worst_time_error", terr},
                                       {"octaves_outside_ties", ties ? json(*ties) : json(nullptr)},
                                       {"single_latency", {{"predicted_wins", p1.wins}, {"predicted_bytes", p1.bytes},
                                                           {"error_octaves", err1_json}, {"worst_time_error", terr1},
                                                           {"octaves_outside_ties", ties1 ? json(*ties1) : json(nullptr)}}},
                                       {"link_alpha_us", link.alpha_us}, {"link_bus_gbps", link.bus_gbps},
                                       {"allreduce_latency_us", link.latency_us(NcclOp::all_reduce)},
                                       {"allgather_latency_us", link.latency_us(NcclOp::all_gather)},
                                       {"reduce_scatter_latency_us", link.latency_us(NcclOp::reduce_scatter)},
                                       {"alltoall_latency_us", link.latency_us(NcclOp::all_to_all)},
                                       {"allreduce_bandwidth_gbps", link.bandwidth_gbps(NcclOp::all_reduce)},
                                       {"allgather_bandwidth_gbps", link.bandwidth_gbps(NcclOp::all_gather)},
                                       {"reduce_scatter_bandwidth_gbps", link.bandwidth_gbps(NcclOp::reduce_scatter)},
                                       {"alltoall_bandwidth_gbps", link.bandwidth_gbps(NcclOp::all_to_all)}});
    }
    // The path the model picks at each measured size (the planner's choice with no threshold), and
    // what it costs against the fastest path measured there.
    for (const auto& [c, d] : [&] {
           std::vector<std::pair<Collective, DType>> pairs;
           for (const auto& x : crossovers)
             if (std::find(pairs.begin(), pairs.end(), std::make_pair(x.collective, x.dtype)) == pairs.end())
               pairs.emplace_back(x.collective, x.dtype);
           return pairs;
         }()) {
      const auto single = single_latency_link(s, c, d);
      WireParams wire = s.wire;
      wire.dtype = d;
      std::vector<uint64_t> sizes;
      for (const auto& p : s.points)
        if (p.collective == c && p.dtype == d && std::find(sizes.begin(), sizes.end(), p.bytes) == sizes.end())
          sizes.push_back(p.bytes);
      std::sort(sizes.begin(), sizes.end());
      for (uint64_t bytes : sizes) {
        const SweepPoint* best = nullptr;
        std::vector<const SweepPoint*> measured;
        for (Path path : planner_candidates(c))
          for (const auto& p : s.points)
            if (p.collective == c && p.dtype == d && p.path == path && p.bytes == bytes && p.supported &&
                p.time.median > 0) {
              measured.push_back(&p);
              if (!best || p.time.median < best->time.median) best = &p;
            }
        if (!best) continue;
        auto pick = [&](const Link& l) {
          const SweepPoint* chosen = nullptr;
          double chosen_us = 0;
          for (const SweepPoint* p : measured) {
            const auto gather = modeled_transport(*p);
            if (!gather) continue;
            const double us = predict_us(c, p->path, s.machine.nranks, static_cast<double>(bytes), l, codec, wire, *gather);
            if (!chosen || us < chosen_us) {
              chosen = p;
              chosen_us = us;
            }
          }
          return chosen;
        };
        const SweepPoint* per_op = pick(link);
        const SweepPoint* one = single ? pick(*single) : nullptr;
        auto cell = [&](const SweepPoint* p) {
          return p ? fmt::format("{:<12} {:>5.2f}x", path_label(*p), p->time.median / best->time.median)
                   : std::string("-");
        };
        choices += fmt::format("  {:<8} {:>5} {:<15} {:<5} {:>10} {:<12} | {:<19} | {:<19}\n",
                               fabric_name(s.machine.fabric), s.machine.nranks, collective_name(c), to_string(d),
                               format_bytes(bytes), path_label(*best), cell(per_op), cell(one));
        report.json["choices"].push_back(
            {{"fabric", fabric_name(s.machine.fabric)}, {"nranks", s.machine.nranks},
             {"collective", collective_name(c)}, {"dtype", to_string(d)}, {"bytes", bytes},
             {"measured_best", path_label(*best)},
             {"chosen", per_op ? path_label(*per_op) : ""},
             {"chosen_vs_best", per_op ? per_op->time.median / best->time.median : 0.0},
             {"single_latency_chosen", one ? path_label(*one) : ""},
             {"single_latency_vs_best", one ? one->time.median / best->time.median : 0.0}});
      }
    }
  }
  if (!choices.empty()) {
    out += "\n# model's choice at each measured size (no threshold), measured time relative to the fastest\n";
    out += fmt::format("  {:<8} {:>5} {:<15} {:<5} {:>10} {:<12} | {:<19} | {:<19}\n", "fabric", "ranks",
                       "collective", "dtype", "size", "fastest", "per-op model", "one latency");
    out += choices;
  }
  if (report.json["checks"].empty()) out += "  (no measured crossover to check: give sweep JSONs with baseline and FP8 points)\n";

  // 2. Predictions for fabrics not present, always labelled predicted.
  out += "\n# PREDICTED crossovers (alpha-beta model, assumed links below; not measured)\n";
  out += fmt::format("  {:<10} {:>5} {:<15} {:<5} {:<9} {:>12} {:>10}\n", "fabric", "ranks", "collective", "dtype",
                     "path", "crossover", "speedup@oo");
  WireParams wire = sweeps.empty() ? WireParams{} : sweeps.front().wire;
  wire.dtype = options.dtype;
  for (const auto& link : assumed_links()) {
    for (int n : world_sizes) {
      if (n < 2) continue;
      for (Collective c : kCollectives) {
        const Path path = planner_path(c, n, link, codec, wire);
        const PredictedCrossover p = predict_crossover(c, path, n, link, codec, wire);
        out += fmt::format("  {:<10} {:>5} {:<15} {:<5} {:<9} {:>12} {:>9.2f}x\n", link.name, n, collective_name(c),
                           to_string(options.dtype), path_name(path), predicted_cell(p), p.asymptotic_speedup);
        report.json["predictions"].push_back({{"fabric", link.name}, {"nranks", n}, {"collective", collective_name(c)},
                                              {"dtype", to_string(options.dtype)}, {"path", path_name(path)},
                                              {"wins", p.wins}, {"bytes", p.bytes},
                                              {"asymptotic_speedup", p.asymptotic_speedup}, {"predicted", true}});
      }
    }
  }
  out += "\n# assumed link parameters\n";
  for (const auto& link : assumed_links()) {
    out += fmt::format("  {:<10} alpha {:>5.1f} us  bus {:>6.1f} GB/s  {}\n", link.name, link.alpha_us, link.bus_gbps, link.basis);
    report.json["links"].push_back({{"name", link.name}, {"alpha_us", link.alpha_us}, {"bus_gbps", link.bus_gbps},
                                    {"basis", link.basis}});
  }
  return report;
}

}  // namespace fp8wire::bench
