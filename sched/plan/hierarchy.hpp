// Jobs spanning hosts (docs/DESIGN.md "Hierarchy": "flat algorithms that would move more bytes than NCCL between
// hosts"). On a communicator whose ranks span several hosts with several ranks on some host:
//   - the guard: a flat FP8 path never runs there, unless a calibrated profile of that very shape
//     (hosts x ranks per host) predicts it beats plain NCCL. Per network card, for 2 hosts x 8 GPUs
//     and a bf16 buffer B, NCCL's ring sends ~2 x 15/16 x B/8 = 0.23 B; the flat FP8 two-shot sends
//     its shards to the 8 remote ranks twice, ~0.52 B: 2.2x more;
//   - the hierarchical path: reduce-scatter inside each host in the caller's precision, FP8
//     between hosts among the ranks holding the same shard (one rail per local rank: ~0.06 B per
//     card for 2 x 8, one-shot), all-gather inside each host. Only the step between hosts is
//     quantized. Hosts with different rank counts pass through.
// The all-to-all is planned flat at every shape: NCCL's own moves each chunk straight to its rank,
// so the FP8 one sends ~0.52x of its bytes between hosts, and there is no reduction to split.
// Pure: a function of the configuration, the call's shape and the agreed topology.
#pragma once

#include <cstdint>
#include <string>

#include "common/config.hpp"
#include "quant/wire_format.hpp"
#include "sched/plan/agreement.hpp"
#include "sched/plan/plan.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

// The route of one call on a communicator of topology `t` (flat_fabric: its agreed fabric class).
// `hierarchy_ready`: the sub-communicators exist on every rank (the agreement's second round).
Plan plan_on(const Config& config, const CallShape& call, Fabric flat_fabric, const Topology& t,
             bool hierarchy_ready);

// Why the defaults leave the hierarchical path to plain NCCL on topology `t`, or "" when they take
// it. Its steps inside each host run in full precision, so the fabric there weighs as much as the
// network: with PCIe (or anything slower than NVLink) inside, the project's own model
// (fp8wire-bench model --hierarchy) predicts it 0.82-0.99x of NCCL at every card speed and host
// count. Without a calibrated network profile (which then decides by its prediction) and with
// algorithm = auto, such calls pass through. A forced host map (hierarchy.ranks_per_host, for
// testing on one machine) and a forced algorithm keep the path.
std::string hierarchy_guard_reason(const Config& config, const Topology& t);

// Whether a topology could use the hierarchical path at all (several hosts, the same number of
// ranks on each, more than one).
bool hierarchy_possible(const Config& config, const Topology& t);

// The FP8 algorithm of the step between hosts: one-shot or two-shot among `hosts` ranks on a shard
// of caller_bytes / ranks_per_host, by the network's cost model (or Config::algorithm).
Path inner_path(const Config& config, const CallShape& call, const Topology& t);

// Predicted microseconds of the hierarchical path: the reduce-scatter and all-gather inside hosts
// (intra model) and the FP8 step between hosts (net model).
double hierarchical_us(const CostModel& intra, const CostModel& net, Collective collective, uint64_t caller_bytes,
                       int hosts, int ranks_per_host, Path inner, const quant::WireFormat& format);

// Bytes one network card sends for one all-reduce of `caller_bytes` (bf16) on hosts x ranks_per_host
// ranks, one card per GPU (rails): plain NCCL ring, flat FP8 two-shot, hierarchical FP8 (inner path).
struct CardBytes {
  double plain = 0, flat_two_shot = 0, hierarchical = 0;
};
CardBytes card_bytes(uint64_t caller_bytes, int hosts, int ranks_per_host, Path inner, const quant::WireFormat& f);

}  // namespace fp8wire::sched
