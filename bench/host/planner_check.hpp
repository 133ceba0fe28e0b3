// The planner against a sweep: at each size of each collective and dtype measured, the variant the
// planner runs with a configuration (its measured routes, thresholds and cost model), the fastest
// variant the sweep timed over NCCL's transports, and how much slower the pick ran. Printed by
// `fp8wire-bench sweep` after its tables, so a sweep run under a calibrated profile
// (FP8WIRE_CONFIG=<profile>) checks that profile's choices against fresh timings of every variant.
#pragma once

#include <string>
#include <vector>

#include "bench/host/results.hpp"

namespace fp8wire::bench {

struct PlannerPick {
  Collective collective = Collective::all_reduce;
  DType dtype = DType::bf16;
  uint64_t bytes = 0;
  std::string pick;        // path_label of the planner's variant ("two_shot/sr", "passthrough")
  std::string fastest;     // path_label of the fastest variant measured
  double pick_us = 0;      // 0: the pick was not measured in this sweep
  double fastest_us = 0;
  double routable_us = 0;  // the fastest variant a measured route may take (route_may_take; 0: none timed)
  std::string reason;      // the planner's reason where it passes through ("below_threshold", "measured")
};

// Every (collective, dtype, size) of `result` over NCCL's transports; `fabric` as the communicator
// agreed it (result.machine.fabric).
std::vector<PlannerPick> planner_picks(const SweepResult& result, const Config& config, Fabric fabric);
// The table, with each pick's time over the fastest's (1.00x: the planner ran the fastest) and over
// the fastest a route may take (the ring left out).
// `machine`: the sweep's, for the heading (rank count and fabric).
std::string render_planner_picks(const std::vector<PlannerPick>& picks, const MachineInfo& machine);

}  // namespace fp8wire::bench
