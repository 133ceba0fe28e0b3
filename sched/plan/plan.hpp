// The per-call decision: pass through, or which FP8 algorithm. Plain C++ with no CUDA or NCCL
// header, so CI tests every rule on a machine without a GPU (docs/DESIGN.md "The planner").
//
// Every function here is a pure function of its arguments. The engine feeds it only inputs that are
// identical on all ranks of a communicator (collective, dtype, op, element count, world size, the
// agreed fabric and the configuration, whose fingerprint was checked at the agreement), so all ranks
// take identical decisions: one rank passing through while another runs FP8 would hang the job.
#pragma once

#include <cstdint>

#include "common/config.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

// Why a call passes through untouched (none: it is an FP8 candidate).
enum class PassReason : uint8_t {
  none,
  disabled,             // enable = false
  collective_disabled,  // collectives.<name> = false
  dtype,                // not fp32 / fp16 / bf16 (passes through exactly: NCCL moves the bytes)
  op,                   // not sum / avg (max, min, prod, premulsum and custom ops)
  single_rank,          // 1-rank communicator: nothing to communicate
  empty,                // zero elements
  own_rank,             // a message a rank sends to itself: it never leaves the GPU, so it stays exact
  too_many_ranks,       // more ranks than one fused reduce takes (quant::kMaxReduceInputs)
  below_threshold,      // caller buffer smaller than thresholds.<collective>.<fabric>
  cost_model,           // the calibrated cost model says plain NCCL is faster
  measured,             // a sweep of this fabric measured plain NCCL fastest at this size (routes.*)
  flat_guard,           // spans hosts with local peers: flat FP8 would move more bytes between hosts
  hierarchy_guard,      // the hierarchical path, with hosts whose inside is slower than NVLink (plan/hierarchy.hpp)
  forced,               // the benchmark forced the real call (Path::passthrough)
  not_agreed,           // the communicator never had an agreement (sched/plan/route.hpp)
  // Fallback: FP8 was planned but cannot run.
  no_hierarchy,         // hierarchical forced where the communicator has no sub-communicators
  agreement,            // the agreement ruled FP8 out on this communicator (its reason names the rank)
  scratch,              // scratch.max_bytes too small for one pipeline stage
};
const char* to_string(PassReason);

// The fabric of a communicator that has no agreement (yet): the configured one, else net (the class
// that assumes least).
inline Fabric fabric_without_agreement(const Config& config) { return config.fabric_override.value_or(Fabric::net); }

// Bytes of the caller's full buffer, the quantity thresholds are compared with. For reduce_scatter
// it is the send buffer (nranks * recvcount elements), for all_gather the receive buffer (nranks *
// sendcount), for all_to_all the send buffer (nranks * count), as nccl-tests reports sizes; for
// send_recv the one message.
uint64_t threshold_bytes(const CallShape& call);

// Rules that need no fabric (the cheap checks, done before any per-communicator state is touched).
PassReason static_eligibility(const Config& config, const CallShape& call);
// The same without the enable switches: the rules FP8 cannot serve (dtype, op, world size, empty),
// which bind a forced call too (the benchmark measures FP8 all_gather although it is off by default).
PassReason shape_eligibility(const CallShape& call);

// True when the call is below the threshold of every fabric it could be planned for (the override's
// alone when set): it passes through before the communicator registry is even consulted.
bool below_every_threshold(const Config& config, const CallShape& call);

struct Plan {
  Path path = Path::passthrough;
  PassReason reason = PassReason::none;
  // FP8 paths with a gather step. The engine derives it again with gather_method_for() from the
  // size it actually sends (a coalesced batch's total), the same function on every rank.
  GatherMethod gather = GatherMethod::allgather;
};
// Full plan of one call on a communicator of a known fabric. Above the threshold the algorithm is
// Config::algorithm, or, when automatic, the cheapest of one-shot and two-shot by the cost model; a
// calibrated cost model (CostModel::calibrated) may also prefer pass-through. reduce_scatter,
// all_gather and all_to_all have a single FP8 algorithm each, reported as Path::two_shot (the a2a +
// reduce of reduce_scatter), Path::one_shot (quantize + all-gather) and Path::one_shot (quantize, one
// send/recv round, dequantize: "one exchange") respectively.
Plan plan_call(const Config& config, const CallShape& call, Fabric fabric);

}  // namespace fp8wire::sched
