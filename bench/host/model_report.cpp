#include "bench/host/model_report.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace fp8wire::bench {

using nlohmann::json;

namespace {
std::string predicted_cell(const PredictedCrossover& p) {
  if (!p.wins) return "never";
  if (p.bytes == 0) return "all sizes";
  return format_bytes(p.bytes);
}

// The FP8 path the planner would pick at large sizes: the one with the lower per-byte cost.
Path planner_path(Collective c, int nranks, const Link& link, const Codec& codec, const WireParams& wire) {
  if (c == Collective::reduce_scatter) return Path::two_shot;
  if (c == Collective::all_gather) return Path::one_shot;
  const double big = 1ull << 30;
  return predict_us(c, Path::one_shot, nranks, big, link, codec, wire) <
                 predict_us(c, Path::two_shot, nranks, big, link, codec, wire)
             ? Path::one_shot
             : Path::two_shot;
}
}  // namespace

ModelReport model_report(const std::vector<SweepResult>& sweeps, const ModelOptions& options) {
  ModelReport report;
  report.json = {{"tool", "fp8wire-bench model"}, {"checks", json::array()}, {"predictions", json::array()},
                 {"links", json::array()}};
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
  out += "\n# model check against measured fabrics (link alpha/beta fitted from each sweep's plain NCCL)\n";
  out += fmt::format("  {:<8} {:>5} {:<15} {:<5} {:<9} {:>12} {:>18} {:>10}\n", "fabric", "ranks", "collective",
                     "dtype", "path", "predicted", "measured", "error");
  std::vector<int> world_sizes = options.nranks;
  for (const auto& s : sweeps) {
    if (std::find(world_sizes.begin(), world_sizes.end(), s.machine.nranks) == world_sizes.end())
      world_sizes.push_back(s.machine.nranks);
    const auto crossovers = analyze_crossovers(s, options.crossover);
    for (const auto& x : crossovers) {
      if (x.candidate == "best") continue;
      const auto path = parse_path(x.candidate);
      const LinearFit fit = fit_baseline(s, x.collective, x.dtype);
      if (!path || !fit.ok) continue;
      Link link{fmt::format("measured:{}", fabric_name(s.machine.fabric)), fit.alpha_us, 1e-3 / fit.us_per_byte,
                "fit of this sweep's baseline", true};
      WireParams wire = s.wire;
      wire.dtype = x.dtype;
      const PredictedCrossover p = predict_crossover(x.collective, *path, s.machine.nranks, link, codec, wire);
      std::string measured = x.crossover.found ? format_bytes(x.crossover.bytes) : "never";
      if (x.crossover.found && x.crossover.at_smallest) measured = "<=" + measured;
      std::string error = "-";
      json err_json = nullptr;
      if (p.wins && x.crossover.found) {
        // Error in octaves (log2 of predicted / measured) is what matters for a threshold on a log grid.
        const double predicted = std::max<double>(p.bytes, 1);
        const double octaves = std::log2(predicted / static_cast<double>(x.crossover.bytes));
        error = fmt::format("{:+.2f} oct", octaves);
        err_json = octaves;
      } else if (p.wins != x.crossover.found) {
        error = "disagree";
      } else {
        error = "agree";
      }
      out += fmt::format("  {:<8} {:>5} {:<15} {:<5} {:<9} {:>12} {:>18} {:>10}\n", fabric_name(s.machine.fabric),
                         s.machine.nranks, collective_name(x.collective), to_string(x.dtype), x.candidate,
                         predicted_cell(p), measured, error);
      report.json["checks"].push_back({{"fabric", fabric_name(s.machine.fabric)}, {"nranks", s.machine.nranks},
                                       {"collective", collective_name(x.collective)}, {"dtype", to_string(x.dtype)},
                                       {"path", x.candidate}, {"predicted_wins", p.wins}, {"predicted_bytes", p.bytes},
                                       {"measured_found", x.crossover.found}, {"measured_bytes", x.crossover.bytes},
                                       {"error_octaves", err_json}, {"link_alpha_us", link.alpha_us},
                                       {"link_bus_gbps", link.bus_gbps}});
    }
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
      for (Collective c : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather}) {
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
