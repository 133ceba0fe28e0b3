#include "bench/host/profile.hpp"

#include <utility>

#include <fmt/format.h>

namespace fp8wire::bench {

FabricProfile profile_from_sweep(const SweepResult& result, const std::vector<CrossoverReport>& reports,
                                 const Calibration& calibration) {
  FabricProfile profile;
  profile.fabric = result.machine.fabric;
  profile.source = fmt::format("measured on {} ({}), {} ranks{}, NCCL {}, {}", result.machine.hostname,
                               result.machine.gpu_name, result.machine.nranks,
                               !result.machine.emulated ? ""
                               : result.machine.testbed.empty() ? " emulated on one GPU"
                                                                : " emulated on one GPU (" + result.machine.testbed + ")",
                               result.machine.nccl_version, result.machine.created_utc);
  for (Collective c : kCollectives) {
    // Thresholds are per collective, not per dtype: bf16 (the gradient dtype of mixed precision) when
    // it was measured, else whichever dtype came first.
    const CrossoverReport* chosen = nullptr;
    for (const auto& x : reports) {
      if (x.collective != c || x.candidate != "best") continue;
      if (!chosen || (x.dtype == DType::bf16 && chosen->dtype != DType::bf16)) chosen = &x;
    }
    if (!chosen) continue;
    ThresholdEntry entry;
    const auto& x = chosen->crossover;
    if (x.found) {
      entry.bytes = x.bytes;
      entry.comment = fmt::format("{}: {:.2f}x at {}, at least {:.2f}x above{}", to_string(chosen->dtype),
                                  x.speedup, format_bytes(x.bytes), x.min_speedup_above,
                                  x.at_smallest ? "; won at the smallest size measured, may pay lower" : "");
    } else {
      entry.comment = fmt::format("{}: FP8 never won in the measured range; off", to_string(chosen->dtype));
    }
    profile.thresholds[static_cast<size_t>(c)] = entry;
  }
  if (calibration.model.calibrated) profile.cost_model = calibration.model;
  // One transport measured for every FP8 gather step: the profile pins it (a cost model fitted from
  // one transport prices the other only through other paths' operations).
  std::string seen;
  bool single = true;
  for (const auto& p : result.points) {
    if (!has_gather_step(p.collective, p.path) || !p.supported) continue;
    if (p.gather_transport != "allgather" && p.gather_transport != "sendrecv") single = false;
    else if (seen.empty()) seen = p.gather_transport;
    else if (seen != p.gather_transport) single = false;
  }
  if (single) profile.gather_transport = seen;
  return profile;
}

std::string render_profile_toml(const std::vector<FabricProfile>& fabrics) {
  // Later entries of the same fabric replace earlier ones.
  std::array<const FabricProfile*, kFabricCount> by_fabric{};
  for (const auto& f : fabrics) by_fabric[static_cast<size_t>(f.fabric)] = &f;

  std::string out =
      "# fp8wire threshold profile, written by fp8wire-bench sweep.\n"
      "# Load it with FP8WIRE_CONFIG=<this file> (or include these tables in a config file).\n"
      "# thresholds.<collective>.<fabric>: smallest caller buffer (bytes) that goes FP8; the measured\n"
      "# crossover. 9223372036854775807 = FP8 never paid in the measured range.\n";
  for (const auto* f : by_fabric)
    if (f) out += fmt::format("# {}: {}\n", fabric_name(f->fabric), f->source);
  // Top-level key, so before the first table.
  std::string transport;
  bool agree = true, any = false;
  for (const auto* f : by_fabric) {
    if (!f) continue;
    if (!any) transport = f->gather_transport;
    else if (transport != f->gather_transport) agree = false;
    any = true;
  }
  if (any && agree && !transport.empty())
    out += fmt::format("\n# The sweep measured FP8 paths with this gather transport only.\ngather_transport = \"{}\"\n",
                       transport);

  for (Collective c : kCollectives) {
    bool header = false;
    for (const auto* f : by_fabric) {
      if (!f || !f->thresholds[static_cast<size_t>(c)]) continue;
      if (!header) {
        out += fmt::format("\n[thresholds.{}]\n", collective_name(c));
        header = true;
      }
      const auto& e = *f->thresholds[static_cast<size_t>(c)];
      out += fmt::format("{} = {}  # {}\n", fabric_name(f->fabric), e.bytes, e.comment);
    }
  }
  for (const auto* f : by_fabric) {
    if (!f || !f->cost_model) continue;
    const auto& m = *f->cost_model;
    out += fmt::format(
        "\n[cost_model.{}]\n"
        "op_latency_us = {:.3f}\n"
        "bus_bandwidth_gbps = {:.3f}\n"
        "codec_gbps = {:.3f}\n"
        "kernel_launch_us = {:.3f}\n",
        fabric_name(f->fabric), m.op_latency_us, m.bus_bandwidth_gbps, m.codec_gbps, m.kernel_launch_us);
    // Per-operation figures only where the sweep measured them (0 = the generic figure anyway).
    const std::pair<const char*, double> per_op[] = {{"allreduce_latency_us", m.allreduce_latency_us},
                                                     {"allgather_latency_us", m.allgather_latency_us},
                                                     {"reduce_scatter_latency_us", m.reduce_scatter_latency_us},
                                                     {"alltoall_latency_us", m.alltoall_latency_us},
                                                     {"allreduce_bandwidth_gbps", m.allreduce_bandwidth_gbps},
                                                     {"allgather_bandwidth_gbps", m.allgather_bandwidth_gbps},
                                                     {"reduce_scatter_bandwidth_gbps", m.reduce_scatter_bandwidth_gbps},
                                                     {"alltoall_bandwidth_gbps", m.alltoall_bandwidth_gbps},
                                                     {"direct_latency_us", m.direct_latency_us},
                                                     {"direct_bandwidth_gbps", m.direct_bandwidth_gbps}};
    for (const auto& [key, us] : per_op)
      if (us > 0) out += fmt::format("{} = {:.3f}\n", key, us);
    if (m.hosts > 0) out += fmt::format("hosts = {:.0f}\nranks_per_host = {:.0f}\n", m.hosts, m.ranks_per_host);
    out += fmt::format("calibrated = {}\n", m.calibrated ? "true" : "false");
  }
  return out;
}

}  // namespace fp8wire::bench
