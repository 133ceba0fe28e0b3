// Alpha-beta cost model of plain NCCL and of fp8wire's FP8 paths, used to calibrate the threshold
// profile from a sweep and to predict crossovers on fabrics this machine does not have.
//
//   baseline(S) = alpha_op + bus_bytes(S) / B
//   fp8(S)      = sum over its ops of alpha_op + r * bus_bytes'(S) / B + codec_bytes(S) / C + launches * L
// S is the full-buffer size nccl-tests reports; bus_bytes is S times the busbw factor (what one rank
// moves); r = wire bytes per caller byte (132/256 for bf16 with 128-element blocks and fp32 scales);
// alpha_op = fixed cost of one NCCL operation of that kind (all-reduce, all-gather, reduce-scatter,
// grouped send/recv "a2a"; Link::latency_us, alpha when not measured), B = bus bandwidth, C = codec throughput in caller bytes
// per second, L = kernel launch cost. Per path (docs/DESIGN.md, "Algorithms"):
//   all_reduce two_shot: 2 ops (a2a, all-gather), bus 2(n-1)/n S r,
//                        codec: quantize S + dequantize-reduce S + dequantize S, 3 launches
//   all_reduce one_shot: 1 op (all-gather of quantized inputs), bus (n-1) S r,
//                        codec: quantize S + reduce n*S, 2 launches
//   all_reduce ring    : n ops (n-1 a2a hops, all-gather), bus 2(n-1)/n S r, codec S + 2(n-1)/n S, 2(n-1)+1 launches
//   reduce_scatter     : 1 op (a2a), bus (n-1)/n S r, codec quantize S + reduce S, 2 launches
//   all_gather         : 1 op (all-gather), bus (n-1)/n S r, codec quantize S/n + dequantize S, 2 launches
// (reduce_scatter and all_gather have one FP8 algorithm each; sched/ runs it as two_shot and
// one_shot respectively, and both names map to it here.)
// Gather transport (config.hpp gather_transport): the gather step of a path (one-shot's all-gather
// of the quantized inputs, two-shot's and ring's final all-gather, the FP8 all-gather) is an
// all-gather by default; with sendrecv it is grouped ncclSend/ncclRecv of the slot to every peer,
// the same bus bytes costed as one more a2a operation and one all-gather fewer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/host/units.hpp"

namespace fp8wire::bench {

struct LinearFit {
  bool ok = false;
  double alpha_us = 0;        // intercept
  double us_per_byte = 0;     // slope
  double max_rel_residual = 0;// worst |fit - measured| / measured over the points
};
// Least squares of t = alpha + slope * x weighted by 1/t^2 (relative error), so microsecond-scale
// small sizes count as much as second-scale large ones. Both coefficients are clamped to >= 0: a
// negative latency or bandwidth means the fit is meaningless and ok becomes false.
LinearFit fit_linear_relative(const std::vector<double>& x, const std::vector<double>& t_us);
// The same for y = alpha + slope * x where y is part of a measured time t (the rest known): weights
// and residuals are relative to t, so a part is fitted as precisely as the whole time it belongs to.
LinearFit fit_linear_relative_to(const std::vector<double>& x, const std::vector<double>& y,
                                 const std::vector<double>& t_us);

struct Link {
  std::string name;      // "pcie_gen4", "measured:net", ...
  double alpha_us = 0;   // fixed cost of one NCCL operation without its own figure below
  double bus_gbps = 0;   // bus bandwidth, GB/s
  std::string basis;     // where the numbers come from
  bool measured = false; // true: fitted from a sweep on this machine; false: assumed (predicted)
  // Per kind of operation (cost_model.<fabric>.*_latency_us / *_bandwidth_gbps): fixed cost
  // (0 = alpha_us) and bus bandwidth (0 = bus_gbps).
  double allreduce_us = 0, allgather_us = 0, reduce_scatter_us = 0, alltoall_us = 0;
  double allreduce_gbps = 0, allgather_gbps = 0, reduce_scatter_gbps = 0, alltoall_gbps = 0;
  double latency_us(NcclOp op) const;
  double bandwidth_gbps(NcclOp op) const;
};
// Link parameters assumed for fabrics not present (documented in the returned `basis` strings).
const std::vector<Link>& assumed_links();

struct Codec {
  double gbps = 0;        // caller-dtype bytes per second, GB/s
  double launch_us = 0;   // per kernel launch
  std::string basis;
};

struct WireParams {
  DType dtype = DType::bf16;
  uint32_t block = 128;
  size_t scale_bytes = 4;
  // Wire bytes per caller byte: (1 + scale_bytes / block) / element size.
  double ratio() const;
};

// A quantity per kind of NCCL operation.
struct OpCounts {
  double all_reduce = 0, all_gather = 0, reduce_scatter = 0, all_to_all = 0;
  double total() const { return all_reduce + all_gather + reduce_scatter + all_to_all; }
  double of(NcclOp op) const;
};
inline constexpr NcclOp kNcclOps[] = {NcclOp::all_reduce, NcclOp::all_gather, NcclOp::reduce_scatter,
                                      NcclOp::all_to_all};
struct PathShape {
  OpCounts ops;                // NCCL operations, by kind (each costs its own fixed latency)
  OpCounts op_bus;             // bus bytes per byte of S each kind moves (at its own bandwidth)
  double bus_bytes_per_s = 0;  // bus bytes per byte of S (before the wire ratio): op_bus.total()
  double codec_bytes_per_s = 0;// caller bytes through codec kernels per byte of S
  double launches = 0;
};
// Shape of the baseline (Path::passthrough) or an FP8 path whose gather step (has_gather_step)
// goes over `gather`. Returns nullopt for a path the collective does not have (ring for all_gather),
// and for GatherMethod::automatic on a path with a gather step: that is the planner's choice per
// call, not one shape.
std::optional<PathShape> path_shape(Collective c, Path p, int nranks,
                                    GatherMethod gather = GatherMethod::allgather);

// Sum of the fixed latencies of the path's NCCL operations on `link`.
double fixed_latency_us(const PathShape& shape, const Link& link);

// NaN where path_shape has no shape.
double predict_us(Collective c, Path p, int nranks, double bytes, const Link& link, const Codec& codec,
                  const WireParams& wire, GatherMethod gather = GatherMethod::allgather);

struct PredictedCrossover {
  bool wins = false;         // false: the FP8 path never wins (its per-byte cost is not lower)
  uint64_t bytes = 0;        // smallest size at which it wins (0 = wins at every size)
  double asymptotic_speedup = 0;  // baseline / fp8 as S -> infinity
};
// Both costs are linear in S, so the crossover is where the lines cross (closed form).
PredictedCrossover predict_crossover(Collective c, Path p, int nranks, const Link& link,
                                     const Codec& codec, const WireParams& wire,
                                     GatherMethod gather = GatherMethod::allgather);

}  // namespace fp8wire::bench
