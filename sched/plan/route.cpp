#include "sched/plan/route.hpp"

#include "sched/plan/cost_model.hpp"
#include "sched/plan/hierarchy.hpp"

namespace fp8wire::sched {

PassReason pass_before_lookup(const Config& config, const CallShape& call, std::optional<Path> forced) {
  if (forced && !is_fp8(*forced)) return PassReason::forced;
  const PassReason r = forced ? shape_eligibility(call) : static_eligibility(config, call);
  if (r != PassReason::none) return r;
  if (!forced && below_every_threshold(config, call)) return PassReason::below_threshold;
  return PassReason::none;
}

namespace {
Route pass(Path path, PassReason reason) {
  Route r;
  r.path = path;
  r.reason = reason;
  return r;
}
}  // namespace

Route route_call(const Config& config, const CommFacts& comm, const CallShape& call, std::optional<Path> forced) {
  if (forced && !is_fp8(*forced)) return pass(Path::passthrough, PassReason::forced);
  // Created before the library, still pending, non-blocking, or driven by one process for all ranks.
  if (!comm.agreed) return pass(Path::passthrough, PassReason::not_agreed);
  Path path;
  if (forced) {
    if (const PassReason r = shape_eligibility(call); r != PassReason::none)
      return pass(Path::passthrough, r);
    path = *forced;
  } else {
    // The agreed fabric's threshold alone would let a hierarchical topology plan a call below the
    // fabric override's threshold (plan_on compares the network's): below every one, it passes.
    if (below_every_threshold(config, call)) return pass(Path::passthrough, PassReason::below_threshold);
    const Plan plan = plan_on(config, call, comm.fabric, comm.topology, comm.hierarchy_ready);
    if (!is_fp8(plan.path)) return pass(plan.path, plan.reason);
    path = plan.path;
  }
  // Forced where the communicator has none, or for a collective without a hierarchical program.
  const bool hierarchical_program = call.collective == Collective::all_reduce || call.collective == Collective::reduce_scatter;
  if (path == Path::hierarchical && (!comm.hierarchy_ready || !hierarchical_program))
    return pass(Path::fallback, PassReason::no_hierarchy);
  if (!comm.fp8_ok) return pass(Path::fallback, PassReason::agreement);
  // A message is quantized, sent and decoded whole on the caller's stream, its wire buffer its own
  // (sched/engine/point_to_point.cpp): no stage, no scratch of the communicator's, no window.
  if (call.collective == Collective::send_recv) {
    Route r;
    r.path = r.algorithm = path;
    r.stage_elems = call.count;
    return r;
  }
  return route_fp8(config, comm, call, path);
}

Route route_fp8(const Config& config, const CommFacts& comm, const CallShape& call, Path algorithm) {
  Route r;
  r.path = algorithm;
  r.algorithm = algorithm;
  const quant::WireFormat format = quant::WireFormat::from(config);
  quant::ElemType type = quant::ElemType::f32;
  elem_type_of(call.dtype, &type);
  const size_t es = quant::elem_size(type);
  const uint64_t bytes = threshold_bytes(call);
  if (has_gather_step(call.collective, algorithm))
    r.gather = gather_method_for(config, call.collective, algorithm, bytes, call.nranks, comm.fabric);
  // A direct transport where the communicator has one and the configuration or the cost model takes
  // it; a call whose stage unit does not fit one buffer set of its window goes over NCCL's.
  if (comm.direct != Carrier::nccl) {
    r.carrier = carrier_for(config, call.collective, algorithm, bytes, call.nranks, comm.fabric, comm.direct);
    if (r.carrier != Carrier::nccl) {
      r.stage_elems = direct_stage_elems(effective_cost_model(config, comm.fabric), comm.direct_set_bytes, call.collective, algorithm, call.count, es,
                                         call.nranks, format, comm.direct_ranks_per_gpu);
      if (r.stage_elems == 0) r.carrier = Carrier::nccl;
    }
  }
  if (algorithm == Path::hierarchical) r.inner = inner_path(config, call, comm.topology);
  if (r.carrier != Carrier::nccl) {
    r.gather = GatherMethod::automatic;  // the direct programs gather through the windows
    return r;
  }
  r.stage_elems = algorithm == Path::hierarchical
                      ? hierarchical_stage_elems(comm.scratch, call.collective, call.count, es, comm.hosts,
                                                 comm.ranks_per_host, r.inner, format)
                      : stage_elems(config, comm.scratch, call.collective, algorithm, call.count, es, call.nranks,
                                    format, comm.fabric);
  if (r.stage_elems == 0) {
    r.path = Path::fallback;
    r.reason = PassReason::scratch;
    r.gather = GatherMethod::automatic;
  }
  return r;
}

std::vector<Carrier> direct_carriers(const Config& config, Fabric fabric, std::span<const RankFacts> facts,
                                     int max_ranks) {
  if (config.direct_transport == DirectMode::off || facts.empty() || facts.size() > static_cast<size_t>(max_ranks))
    return {};
  if (config.direct_transport == DirectMode::automatic && effective_cost_model(config, fabric).direct_bandwidth_gbps <= 0)
    return {};
  if (!config.direct_assume_one_host)
    for (const RankFacts& f : facts)
      if (f.host_hash != facts[0].host_hash) return {};
  switch (config.direct_transport) {
    case DirectMode::off: return {};
    case DirectMode::peer_memory: return {Carrier::peer_memory};
    case DirectMode::host_memory: return {Carrier::host_memory};
    case DirectMode::automatic: break;
  }
  for (const RankFacts& f : facts)
    if (f.p2p_disabled) return {Carrier::host_memory};
  return {Carrier::peer_memory, Carrier::host_memory};
}

}  // namespace fp8wire::sched
