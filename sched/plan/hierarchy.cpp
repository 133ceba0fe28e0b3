#include "sched/plan/hierarchy.hpp"

#include <fmt/format.h>

#include "common/commands.hpp"
#include "sched/plan/cost_model.hpp"

namespace fp8wire::sched {

bool hierarchy_possible(const Config& config, const Topology& t) {
  return config.hierarchy_enable && t.hosts > 1 && t.ranks_per_host > 1;
}

std::string hierarchy_guard_reason(const Config& config, const Topology& t) {
  if (t.intra == Fabric::nvlink || t.forced || config.algorithm != Algorithm::automatic) return {};
  if (effective_cost_model(config, Fabric::net).calibrated) return {};
  return fmt::format("{} inside the hosts: the hierarchical path's full-precision steps there cost more than FP8 "
                     "saves between hosts ({} predicts it slower than NCCL at every card speed), so its calls pass "
                     "through; a calibrated network profile (cost_model.net) or a forced algorithm overrides this",
                     to_string(t.intra), tool_command("bench", "model --hierarchy"));
}

Path inner_path(const Config& config, const CallShape& call, const Topology& t) {
  if (config.algorithm == Algorithm::one_shot) return Path::one_shot;
  if (config.algorithm == Algorithm::two_shot || config.algorithm == Algorithm::ring) return Path::two_shot;
  const CostModel net = effective_cost_model(config, Fabric::net);
  const quant::WireFormat f = quant::WireFormat::from(config);
  const uint64_t shard = threshold_bytes(call) / static_cast<uint64_t>(t.ranks_per_host);
  const double one = predicted_us(net, Collective::all_reduce, Path::one_shot, shard, t.hosts, f);
  const double two = predicted_us(net, Collective::all_reduce, Path::two_shot, shard, t.hosts, f);
  return one <= two ? Path::one_shot : Path::two_shot;
}

double hierarchical_us(const CostModel& intra, const CostModel& net, Collective collective, uint64_t caller_bytes,
                       int hosts, int ranks_per_host, Path inner, const quant::WireFormat& f) {
  const double s = static_cast<double>(caller_bytes);
  const double l = ranks_per_host;
  const double intra_part = (l - 1) / l * s;
  auto op = [](const CostModel& m, NcclOp kind, double bus_bytes) {
    return m.latency_us(kind) + bus_bytes / (m.bandwidth_gbps(kind) * 1e3);
  };
  const uint64_t shard = static_cast<uint64_t>(s / l);
  if (collective == Collective::reduce_scatter)
    return op(intra, NcclOp::reduce_scatter, intra_part) +
           predicted_us(net, Collective::reduce_scatter, Path::two_shot, shard, hosts, f);
  return op(intra, NcclOp::reduce_scatter, intra_part) +
         predicted_us(net, Collective::all_reduce, inner, shard, hosts, f) +
         op(intra, NcclOp::all_gather, intra_part);
}

Plan plan_on(const Config& config, const CallShape& call, Fabric flat_fabric, const Topology& t,
             bool hierarchy_ready) {
  // One host, or one rank per host (nothing to reduce inside a host): the flat paths as they are.
  // The all-to-all everywhere: NCCL's own sends every chunk straight to its rank too (no ring to
  // compare with), so the flat FP8 one moves fewer bytes between hosts at any shape; a point-to-point
  // message likewise goes straight to its peer.
  if (t.hosts <= 1 || t.max_ranks_per_host <= 1 || call.collective == Collective::all_to_all ||
      call.collective == Collective::send_recv)
    return plan_call(config, call, flat_fabric);
  const PassReason reason = static_eligibility(config, call);
  if (reason != PassReason::none) return {Path::passthrough, reason};
  const uint64_t bytes = threshold_bytes(call);
  if (bytes < config.thresholds[static_cast<int>(call.collective)][static_cast<int>(Fabric::net)])
    return {Path::passthrough, PassReason::below_threshold};
  const CostModel net = effective_cost_model(config, Fabric::net);
  const quant::WireFormat f = quant::WireFormat::from(config);
  const bool hierarchical_shape = call.collective != Collective::all_gather && hierarchy_possible(config, t);
  if (hierarchical_shape && !hierarchy_guard_reason(config, t).empty())
    return {Path::passthrough, PassReason::hierarchy_guard};
  if (hierarchical_shape && hierarchy_ready) {
    // Only a calibrated model may send an above-threshold call back to plain NCCL.
    if (net.calibrated && config.algorithm == Algorithm::automatic) {
      const CostModel intra = effective_cost_model(config, t.intra);
      const double hier = hierarchical_us(intra, net, call.collective, bytes, t.hosts, t.ranks_per_host,
                                          inner_path(config, call, t), f);
      if (predicted_us(net, call.collective, Path::passthrough, bytes, call.nranks, f) < hier)
        return {Path::passthrough, PassReason::cost_model};
    }
    return {Path::hierarchical, PassReason::none};
  }
  // The guard: flat FP8 only where a calibrated profile of this very shape says it wins.
  const bool profiled_shape = net.calibrated && net.hosts == t.hosts && net.ranks_per_host == t.max_ranks_per_host &&
                              t.ranks_per_host > 0;
  if (profiled_shape) {
    Config calibrated = config;
    calibrated.algorithm = Algorithm::automatic;  // let the model compare against plain NCCL
    return plan_call(calibrated, call, Fabric::net);
  }
  return {Path::passthrough, PassReason::flat_guard};
}

CardBytes card_bytes(uint64_t caller_bytes, int hosts, int ranks_per_host, Path inner, const quant::WireFormat& f) {
  const double s = static_cast<double>(caller_bytes);
  const double n = static_cast<double>(hosts) * ranks_per_host, l = ranks_per_host, h = hosts;
  const double w = s / 2.0 * (1.0 + static_cast<double>(quant::scale_bytes(f.scale)) / f.block);  // bf16 elements
  CardBytes b;
  b.plain = 2.0 * (n - 1) / n * s / l;             // ring: every byte crosses the rails once per pass
  b.flat_two_shot = 2.0 * (n - l) / n * w;          // a2a + gather, the remote ranks' share
  b.hierarchical = inner == Path::one_shot ? (h - 1) * w / l : 2.0 * (h - 1) / h * w / l;
  return b;
}

}  // namespace fp8wire::sched
