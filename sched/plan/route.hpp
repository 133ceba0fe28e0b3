// One call's whole route, decided by one pure function before anything runs: pass through (and
// why), or an FP8 algorithm with its carrier (NCCL's transports or a direct transport's windows),
// its gather step and its pipeline stage size; or fallback (the real call) where FP8 was planned but
// cannot run. The executor (sched/engine/fp8_call.cpp) runs what the route says and decides nothing.
//
// Every input is identical on all ranks of a communicator (the configuration, whose fingerprint the
// agreement checked; the call's shape; the facts agreed at the communicator's creation), so every
// rank takes the same route: one rank passing through while another runs FP8 would hang the job.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "common/config.hpp"
#include "sched/plan/agreement.hpp"
#include "sched/plan/plan.hpp"
#include "sched/plan/stages.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

// What the planner knows of one communicator: only what its agreement settled on every rank alike.
struct CommFacts {
  bool agreed = false;           // the agreement ran (else the communicator passes through for its life)
  bool fp8_ok = false;           // and allows FP8
  Fabric fabric = Fabric::net;   // the agreed fabric class
  Topology topology;
  bool hierarchy_ready = false;  // the hierarchical path's sub-communicators exist on every rank
  int hosts = 0;                 // of those sub-communicators
  int ranks_per_host = 0;
  Carrier direct = Carrier::nccl;  // the kind of its direct windows (nccl: it has none)
  size_t direct_set_bytes = 0;                 // one buffer set of those windows
  int direct_sets = 2;                         // buffer sets of those windows (direct.sets)
  int direct_ranks_per_gpu = 1;                // most ranks on one GPU (DirectWindows::ranks_per_gpu)
  ScratchLayout scratch;
};

struct Route {
  Path path = Path::passthrough;         // what runs: passthrough, fallback, or the FP8 algorithm
  PassReason reason = PassReason::none;  // passthrough and fallback: why
  // The FP8 algorithm planned (passthrough when none). Differs from `path` only when no pipeline
  // stage fits the scratch: the call then falls back, but an application group still queues it by
  // this algorithm (its batch is routed again on the batch's size).
  Path algorithm = Path::passthrough;
  Path inner = Path::passthrough;        // hierarchical: the FP8 algorithm between hosts
  Carrier carrier = Carrier::nccl;
  // How NCCL's transports run the path's gather step; automatic when the path has none, or when
  // the carrier is a direct transport (its programs gather through the windows).
  GatherMethod gather = GatherMethod::automatic;
  size_t stage_elems = 0;                // elements per pipeline stage (FP8 routes only)
};

// Before the communicator is even looked up: the rules that need no communicator, with the widest
// world FP8 serves standing in for its size (quant::kMaxReduceInputs). A reason other than `none`
// passes the call through at once, with host arithmetic only; `none`: route it on its communicator.
// A forced call is held to shape_eligibility only.
PassReason pass_before_lookup(const Config& config, const CallShape& call, std::optional<Path> forced);

// The route of one call on a communicator (the registry's lookup done). `forced`: the benchmark's
// path, in place of the planner's choice (Path::passthrough: the real call).
Route route_call(const Config& config, const CommFacts& comm, const CallShape& call, std::optional<Path> forced);

// The carrier, gather step and stage size of an FP8 `algorithm` already chosen, for `call`'s size:
// the second half of route_call, and the route of a coalesced batch (its total size, the first
// call's algorithm). Falls back (PassReason::scratch) when not even one stage fits the scratch.
Route route_fp8(const Config& config, const CommFacts& comm, const CallShape& call, Path algorithm);

// The kinds of direct window a communicator tries at its creation, in order (sched/comm/direct_round.cpp):
// none where direct.transport is off, some rank is on another machine (unless direct.assume_one_host),
// there are more ranks than one fused reduce takes, or, with auto, the agreed fabric's cost model has
// no direct figures (its windows would be memory held for nothing); else the configured kind, or with
// auto peer memory unless some rank has P2P disabled, then host memory. A function of what every rank
// gathered alike, so every rank tries the same kinds.
std::vector<Carrier> direct_carriers(const Config& config, Fabric fabric, std::span<const RankFacts> facts,
                                     int max_ranks);

}  // namespace fp8wire::sched
