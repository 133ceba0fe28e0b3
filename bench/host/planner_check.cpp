#include "bench/host/planner_check.hpp"

#include <map>
#include <tuple>

#include <fmt/format.h>

#include "bench/host/profile.hpp"
#include "sched/plan/plan.hpp"

namespace fp8wire::bench {

namespace {
DataType data_type(DType d) {
  switch (d) {
    case DType::bf16: return DataType::bf16;
    case DType::f16: return DataType::f16;
    case DType::f32: return DataType::f32;
  }
  return DataType::f32;
}
}  // namespace

std::vector<PlannerPick> planner_picks(const SweepResult& result, const Config& config, Fabric fabric) {
  // The points of NCCL's transports, by (collective, dtype, size), in the sweep's order.
  std::map<std::tuple<int, int, uint64_t>, std::vector<const SweepPoint*>> by_call;
  for (const auto& p : result.points)
    if (p.transport.empty() && p.supported && !p.times_us.empty() && p.time.median > 0)
      by_call[{static_cast<int>(p.collective), static_cast<int>(p.dtype), p.bytes}].push_back(&p);
  std::vector<PlannerPick> out;
  for (const auto& [key, points] : by_call) {
    PlannerPick pick;
    pick.collective = points.front()->collective;
    pick.dtype = points.front()->dtype;
    pick.bytes = points.front()->bytes;
    sched::CallShape shape;
    shape.collective = pick.collective;
    shape.dtype = data_type(pick.dtype);
    shape.op = ReduceOp::sum;
    shape.count = call_counts(pick.collective, pick.bytes, pick.dtype, result.machine.nranks).count_arg;
    shape.nranks = result.machine.nranks;
    const sched::Plan plan = sched::plan_call(config, shape, fabric);
    SweepPoint planned;
    planned.path = is_fp8(plan.path) ? plan.path : Path::passthrough;
    if (has_gather_step(pick.collective, planned.path)) planned.gather_transport = to_string(plan.gather);
    pick.pick = path_label(planned);
    if (!is_fp8(plan.path)) pick.reason = sched::to_string(plan.reason);
    const SweepPoint* fastest = nullptr;
    for (const SweepPoint* p : points) {
      if (!fastest || p->time.median < fastest->time.median) fastest = p;
      if (path_label(*p) == pick.pick) pick.pick_us = p->time.median;
      if (route_may_take(*p, result.machine.nranks) && (pick.routable_us == 0 || p->time.median < pick.routable_us))
        pick.routable_us = p->time.median;
    }
    pick.fastest = path_label(*fastest);
    pick.fastest_us = fastest->time.median;
    out.push_back(pick);
  }
  return out;
}

std::string render_planner_picks(const std::vector<PlannerPick>& picks, const MachineInfo& machine) {
  std::string out = fmt::format(
      "# the planner's pick with the configuration loaded, against the fastest variant timed and the fastest a route "
      "may take, the ring left out ({} ranks, fabric {})\n",
      machine.nranks, fabric_name(machine.fabric));
  out += fmt::format("  {:<15} {:<5} {:>9}  {:<26} {:<13} {:>10} {:>13}\n", "collective", "dtype", "size",
                     "planner picks", "fastest", "pick/fast", "pick/routable");
  auto ratio = [](double pick_us, double of_us) {
    return pick_us > 0 && of_us > 0 ? fmt::format("{:.2f}x", pick_us / of_us) : std::string("not timed");
  };
  for (const auto& p : picks) {
    const std::string what = p.reason.empty() ? p.pick : fmt::format("{} ({})", p.pick, p.reason);
    out += fmt::format("  {:<15} {:<5} {:>9}  {:<26} {:<13} {:>10} {:>13}\n", collective_name(p.collective),
                       to_string(p.dtype), format_bytes(p.bytes), what, p.fastest, ratio(p.pick_us, p.fastest_us),
                       ratio(p.pick_us, p.routable_us));
  }
  return out;
}

}  // namespace fp8wire::bench
