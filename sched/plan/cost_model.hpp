// The alpha-beta cost model: predicted microseconds of one collective under a path, from per-fabric
// figures (CostModel: built-in defaults, or a profile fp8wire-bench calibrated). Each path costs the
// sum of the NCCL operations it issues, each its own fixed latency plus its bus bytes at its own
// bandwidth, plus codec bytes / codec_gbps and kernel launches (docs/DESIGN.md "Cost model").
// Pure: a function of its arguments only, so every rank predicts alike.
#pragma once

#include <cstdint>

#include "common/config.hpp"
#include "quant/wire_format.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

CostModel default_cost_model(Fabric fabric);
// The defaults of `fabric` with every field the configuration gives (> 0) taken over it.
CostModel effective_cost_model(const Config& config, Fabric fabric);

// Sum of the fixed costs of the NCCL operations one stage of `path` issues (all-reduce; a2a +
// all-gather; all-gather; n-1 hops + all-gather; ...), each its own latency (CostModel::latency_us).
// `gather`: how the path's gather step moves the quantized slots; with sendrecv that step is costed
// as an all_to_all operation (same bus bytes), else as an all_gather.
double fixed_latency_us(const CostModel& model, Collective collective, Path path, int nranks,
                        GatherMethod gather = GatherMethod::allgather);
double predicted_us(const CostModel& model, Collective collective, Path path, uint64_t caller_bytes,
                    int nranks, const quant::WireFormat& format,
                    GatherMethod gather = GatherMethod::allgather);

// Predicted microseconds of one FP8 call over a direct transport of `kind`: each stage's barriers at
// direct_latency_us, the bytes this rank's kernels move over its link (the busier direction; peer
// memory: what crosses to other GPUs; host memory: everything, its own slots included) at
// direct_bandwidth_gbps, and the same codec work as over NCCL. 1e30 when the fabric's direct figures
// are not measured (0).
double predicted_direct_us(const CostModel& model, Collective collective, Path path, uint64_t caller_bytes,
                           int nranks, const quant::WireFormat& format, Carrier kind);
// Its parts, for the benchmark's calibration: barriers per stage, the bytes one rank's kernels move
// over its link, and the codec and launch time (everything but the link).
struct DirectCost {
  double barriers = 1;
  double link_bytes = 0;
  double other_us = 0;
};
DirectCost direct_cost_parts(const CostModel& model, Collective collective, Path path, uint64_t caller_bytes,
                             int nranks, const quant::WireFormat& format, Carrier kind);
// The transport of one FP8 call, when the communicator has a direct transport of kind `available`
// (Carrier::nccl: none): a direct.transport the configuration names is taken for every path it
// carries (one-shot, two-shot, the reduce-scatter and the all-gather; not the ring, the
// hierarchical path or the all-to-all, which always go over NCCL's transports); with auto, the direct transport where the cost model of `fabric` predicts it
// cheaper than NCCL's. A function of the config and the call's shape only: every rank picks the same.
Carrier carrier_for(const Config& config, Collective collective, Path path, uint64_t caller_bytes,
                            int nranks, Fabric fabric, Carrier available);

// The measured winner among `collective`'s variants for a call of `bytes` (its threshold bytes) at
// `nranks` ranks on `fabric` (Config::routes): the entry of the largest size at or below `bytes`, the
// smallest one where `bytes` is below them all; nullptr where no sweep measured this rank count.
const MeasuredRoute* measured_route(const Config& config, Collective collective, Fabric fabric, int nranks,
                                    uint64_t bytes);
// The FP8 path a measured route names (its algorithm, or the collective's one FP8 path).
Path measured_path(const MeasuredRoute& route, Collective collective);

// The transport of the gather step for one call: Config::gather_transport when set, else the
// measured route's when it names this path and a gather step, else the cheaper of the two by the
// cost model of `fabric` (all-gather on a tie, which the built-in figures always are). A function of
// the config and the call's shape only, so every rank picks the same.
GatherMethod gather_method_for(const Config& config, Collective collective, Path path,
                                     uint64_t caller_bytes, int nranks, Fabric fabric);
// The same over a model and format at hand (`configured`: Config::gather_transport).
GatherMethod cheaper_gather(const CostModel& model, const quant::WireFormat& format, GatherMethod configured,
                            Collective collective, Path path, uint64_t caller_bytes, int nranks);

// The FP8 all-reduce algorithm.automatic takes: one-shot or two-shot, whichever `model` predicts
// cheaper for `caller_bytes` at `nranks` (one-shot on a tie), each with its own cheaper gather step.
// The one chooser: the planner (plan_call) and the benchmark's model report both call it.
Path cheaper_all_reduce(const CostModel& model, const quant::WireFormat& format, GatherMethod configured,
                        uint64_t caller_bytes, int nranks);

}  // namespace fp8wire::sched
