#include "sched/plan/plan.hpp"

#include "sched/plan/cost_model.hpp"

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
    case PassReason::own_rank: return "own_rank";
    case PassReason::too_many_ranks: return "too_many_ranks";
    case PassReason::below_threshold: return "below_threshold";
    case PassReason::cost_model: return "cost_model";
    case PassReason::measured: return "measured";
    case PassReason::flat_guard: return "flat_guard";
    case PassReason::hierarchy_guard: return "hierarchy_guard";
    case PassReason::forced: return "forced";
    case PassReason::not_agreed: return "not_agreed";
    case PassReason::no_hierarchy: return "no_hierarchy";
    case PassReason::agreement: return "agreement";
    case PassReason::scratch: return "scratch";
  }
  return "?";
}

uint64_t threshold_bytes(const CallShape& call) {
  const uint64_t bytes = static_cast<uint64_t>(call.count) * dtype_size(call.dtype);
  const bool one_buffer = call.collective == Collective::all_reduce || call.collective == Collective::send_recv;
  return one_buffer ? bytes : bytes * static_cast<uint64_t>(call.nranks);
}

PassReason static_eligibility(const Config& config, const CallShape& call) {
  if (!config.enable) return PassReason::disabled;
  if (!config.collective_enable[static_cast<int>(call.collective)]) return PassReason::collective_disabled;
  return shape_eligibility(call);
}

PassReason shape_eligibility(const CallShape& call) {
  quant::ElemType type;
  if (!elem_type_of(call.dtype, &type)) return PassReason::dtype;
  // all_gather and all_to_all have no reduction, so their op is meaningless; sum and avg are the
  // only linear reductions an FP8 sum reproduces (max/min/prod and premulsum/custom ops are not).
  const bool reduces = call.collective == Collective::all_reduce || call.collective == Collective::reduce_scatter;
  if (reduces && call.op != ReduceOp::sum && call.op != ReduceOp::avg) return PassReason::op;
  if (call.nranks <= 1) return PassReason::single_rank;
  if (call.count == 0) return PassReason::empty;
  if (call.collective == Collective::send_recv) return call.to_self ? PassReason::own_rank : PassReason::none;
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

Plan plan_call(const Config& config, const CallShape& call, Fabric fabric) {
  const PassReason reason = static_eligibility(config, call);
  if (reason != PassReason::none) return {Path::passthrough, reason};
  const uint64_t bytes = threshold_bytes(call);
  if (bytes < config.thresholds[static_cast<int>(call.collective)][static_cast<int>(fabric)])
    return {Path::passthrough, PassReason::below_threshold};

  // A sweep of this fabric at this rank count timed every variant: its winner, not a prediction.
  if (config.algorithm == Algorithm::automatic)
    if (const MeasuredRoute* m = measured_route(config, call.collective, fabric, call.nranks, bytes)) {
      if (!m->fp8) return {Path::passthrough, PassReason::measured};
      const Path fp8 = measured_path(*m, call.collective);
      return {fp8, PassReason::none, gather_method_for(config, call.collective, fp8, bytes, call.nranks, fabric)};
    }
  const quant::WireFormat format = quant::WireFormat::from(config);
  const CostModel model = effective_cost_model(config, fabric);
  Path fp8 = only_fp8_path(call.collective);
  if (call.collective == Collective::all_reduce) {
    switch (config.algorithm) {
      case Algorithm::two_shot: fp8 = Path::two_shot; break;
      case Algorithm::one_shot: fp8 = Path::one_shot; break;
      case Algorithm::ring: fp8 = Path::ring; break;
      case Algorithm::automatic:
        fp8 = cheaper_all_reduce(model, format, config.gather_transport, bytes, call.nranks);
        break;
    }
  }
  const GatherMethod gather = gather_method_for(config, call.collective, fp8, bytes, call.nranks, fabric);
  // Only a calibrated model may overrule the threshold: the built-in figures are too rough to
  // second-guess a threshold the user chose.
  if (model.calibrated && config.algorithm == Algorithm::automatic) {
    const double plain = predicted_us(model, call.collective, Path::passthrough, bytes, call.nranks, format);
    const double best = predicted_us(model, call.collective, fp8, bytes, call.nranks, format, gather);
    if (plain < best) return {Path::passthrough, PassReason::cost_model};
  }
  return {fp8, PassReason::none, gather};
}

}  // namespace fp8wire::sched
