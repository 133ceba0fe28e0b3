#include "bench/host/profile.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

namespace fp8wire::bench {

namespace {
bool usable_point(const SweepPoint& p) { return p.supported && !p.times_us.empty() && p.time.median > 0; }

// The variant a point timed, as a measured route names it; nullopt for what a route cannot name or
// must not take: a direct transport's point, a gather step that mixed both, the ring.
std::optional<MeasuredRoute> variant_of(const SweepPoint& p, int nranks) {
  if (!p.transport.empty() || p.gather_transport == "mixed" || p.path == Path::ring || p.path == Path::fallback ||
      p.path == Path::hierarchical)
    return std::nullopt;
  MeasuredRoute r;
  r.ranks = static_cast<uint32_t>(nranks);
  r.from_bytes = p.bytes;
  if (p.path == Path::passthrough) return r;
  r.fp8 = true;
  if (p.collective == Collective::all_reduce) r.algorithm = p.path == Path::one_shot ? Algorithm::one_shot : Algorithm::two_shot;
  else if (p.path != only_fp8_path(p.collective)) return std::nullopt;
  if (has_gather_step(p.collective, p.path)) {
    if (p.gather_transport == "sendrecv") r.gather = GatherMethod::sendrecv;
    else if (p.gather_transport == "allgather") r.gather = GatherMethod::allgather;
  }
  return r;
}

bool same_variant(const MeasuredRoute& a, const MeasuredRoute& b) {
  return a.fp8 == b.fp8 && a.algorithm == b.algorithm && a.gather == b.gather;
}
}  // namespace

bool route_may_take(const SweepPoint& p, int nranks) { return variant_of(p, nranks).has_value(); }

std::vector<RouteEntry> measured_routes(const SweepResult& result, Collective collective, DType dtype) {
  std::map<uint64_t, std::vector<const SweepPoint*>> by_size;
  std::set<std::string> variants;  // by their tables' labels: a route is worth writing from two on
  for (const auto& p : result.points)
    if (p.collective == collective && p.dtype == dtype && usable_point(p) && variant_of(p, result.machine.nranks)) {
      by_size[p.bytes].push_back(&p);
      variants.insert(path_label(p));
    }
  std::vector<RouteEntry> out;
  if (variants.size() < 2) return out;
  for (const auto& [bytes, points] : by_size) {
    const SweepPoint* best = nullptr;
    const SweepPoint* plain = nullptr;
    for (const SweepPoint* p : points) {
      if (!best || p->time.median < best->time.median) best = p;
      if (p->path == Path::passthrough) plain = p;
    }
    const MeasuredRoute winner = *variant_of(*best, result.machine.nranks);
    if (!out.empty() && same_variant(out.back().route, winner)) continue;
    const SweepPoint* second = nullptr;
    for (const SweepPoint* p : points)
      if (p != best && (!second || p->time.median < second->time.median)) second = p;
    std::string comment = fmt::format("{}: {} {:.1f} us", format_bytes(bytes), path_label(*best), best->time.median);
    if (plain && plain != best) comment += fmt::format(", {:.2f}x NCCL's", plain->time.median / best->time.median);
    if (second)
      comment += fmt::format("; next {} {:.1f}% slower", path_label(*second),
                             100.0 * (second->time.median / best->time.median - 1.0));
    out.push_back({winner, comment});
  }
  return out;
}

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
  // The routes of the same dtype as the thresholds: bf16 when measured, else the first one.
  std::optional<DType> route_dtype;
  for (const auto& p : result.points)
    if (!route_dtype || (p.dtype == DType::bf16 && *route_dtype != DType::bf16)) route_dtype = p.dtype;
  if (route_dtype)
    for (Collective c : kCollectives) profile.routes[static_cast<size_t>(c)] = measured_routes(result, c, *route_dtype);
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
      // Sweeps of several rank counts on one fabric, each with its routes: the smallest threshold,
      // the routes deciding per rank count above it.
      const size_t ci = static_cast<size_t>(c);
      const ThresholdEntry* e = &*f->thresholds[ci];
      if (!f->routes[ci].empty())
        for (const auto& other : fabrics)
          if (other.fabric == f->fabric && other.thresholds[ci] && !other.routes[ci].empty() &&
              other.thresholds[ci]->bytes < e->bytes)
            e = &*other.thresholds[ci];
      out += fmt::format("{} = {}  # {}\n", fabric_name(f->fabric), e->bytes, e->comment);
    }
  }
  // Measured routes of every profile given, merged by rank count: a later sweep of the same rank
  // count and fabric replaces an earlier one's entries.
  for (Collective c : kCollectives) {
    bool header = false;
    for (int fi = 0; fi < kFabricCount; ++fi) {
      std::vector<const RouteEntry*> merged;
      for (const auto& f : fabrics) {
        if (static_cast<int>(f.fabric) != fi) continue;
        const auto& mine = f.routes[static_cast<size_t>(c)];
        if (mine.empty()) continue;
        std::erase_if(merged, [&](const RouteEntry* e) { return e->route.ranks == mine.front().route.ranks; });
        for (const auto& e : mine) merged.push_back(&e);
      }
      if (merged.empty()) continue;
      std::stable_sort(merged.begin(), merged.end(), [](const RouteEntry* a, const RouteEntry* b) {
        return std::pair(a->route.ranks, a->route.from_bytes) < std::pair(b->route.ranks, b->route.from_bytes);
      });
      if (!header) {
        out += fmt::format(
            "\n# The fastest variant measured from each size up (per rank count), over NCCL's transports.\n"
            "[routes.{}]\n",
            collective_name(c));
        header = true;
      }
      out += fmt::format("{} = [\n", fabric_name(static_cast<Fabric>(fi)));
      for (const RouteEntry* e : merged) out += fmt::format("  \"{}\",  # {}\n", to_string(e->route), e->comment);
      out += "]\n";
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
