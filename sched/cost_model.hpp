// The alpha-beta cost model: predicted microseconds of one collective under a path, from per-fabric
// figures (CostModel: built-in defaults, or a profile fp8wire-bench calibrated). Each path costs the
// sum of the NCCL operations it issues, each its own fixed latency plus its bus bytes at its own
// bandwidth, plus codec bytes / codec_gbps and kernel launches (sched/README.md "Cost model").
// Pure: a function of its arguments only, so every rank predicts alike.
#pragma once

#include <cstdint>

#include "common/config.hpp"
#include "quant/wire_format.hpp"
#include "sched/types.hpp"

namespace fp8wire::sched {

CostModel default_cost_model(Fabric fabric);
// The defaults of `fabric` with every field the configuration gives (> 0) taken over it.
CostModel effective_cost_model(const Config& config, Fabric fabric);

// Sum of the fixed costs of the NCCL operations one stage of `path` issues (all-reduce; a2a +
// all-gather; all-gather; n-1 hops + all-gather; ...), each its own latency (CostModel::latency_us).
// `gather`: how the path's gather step moves the quantized slots; with sendrecv that step is costed
// as an all_to_all operation (same bus bytes), else as an all_gather.
double fixed_latency_us(const CostModel& model, Collective collective, Path path, int nranks,
                        GatherTransport gather = GatherTransport::allgather);
double predicted_us(const CostModel& model, Collective collective, Path path, uint64_t caller_bytes,
                    int nranks, const quant::WireFormat& format,
                    GatherTransport gather = GatherTransport::allgather);

// The transport of the gather step for one call: Config::gather_transport when set, else the
// cheaper of the two by the cost model of `fabric` (all-gather on a tie, which the built-in figures
// always are). A function of the config and the call's shape only, so every rank picks the same.
GatherTransport gather_transport_for(const Config& config, Collective collective, Path path,
                                     uint64_t caller_bytes, int nranks, Fabric fabric);

}  // namespace fp8wire::sched
