// Alpha-beta cost model of plain NCCL and of fp8wire's FP8 paths, used to calibrate the threshold
// profile from a sweep and to predict crossovers on fabrics this machine does not have.
//
//   baseline(S) = alpha + bus_bytes(S) / B
//   fp8(S)      = ops * alpha + r * bus_bytes'(S) / B + codec_bytes(S) / C + launches * L
// S is the full-buffer size nccl-tests reports; bus_bytes is S times the busbw factor (what one rank
// moves); r = wire bytes per caller byte (132/256 for bf16 with 128-element blocks and fp32 scales);
// alpha = fixed cost of one NCCL operation, B = bus bandwidth, C = codec throughput in caller bytes
// per second, L = kernel launch cost. Per path (DESIGN.md):
//   all_reduce two_shot: 2 ops (grouped all-to-all, all-gather), bus 2(n-1)/n S r,
//                        codec: quantize S + dequantize-reduce S + dequantize S, 3 launches
//   all_reduce one_shot: 1 op (all-gather of quantized inputs), bus (n-1) S r,
//                        codec: quantize S + reduce n*S, 2 launches
//   all_reduce ring    : 2(n-1) ops, bus 2(n-1)/n S r, codec S + 2(n-1)/n S, 2(n-1)+1 launches
//   reduce_scatter     : 1 op, bus (n-1)/n S r, codec quantize S + reduce S, 2 launches
//   all_gather         : 1 op, bus (n-1)/n S r, codec quantize S/n + dequantize S, 2 launches
// (reduce_scatter and all_gather have one FP8 algorithm each; sched/ runs it as two_shot and
// one_shot respectively, and both names map to it here.)
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

struct Link {
  std::string name;      // "pcie_gen4", "measured:net", ...
  double alpha_us = 0;   // fixed cost of one NCCL operation
  double bus_gbps = 0;   // bus bandwidth, GB/s
  std::string basis;     // where the numbers come from
  bool measured = false; // true: fitted from a sweep on this machine; false: assumed (predicted)
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

struct PathShape {
  double ops = 0;              // NCCL operations
  double bus_bytes_per_s = 0;  // bus bytes per byte of S (before the wire ratio)
  double codec_bytes_per_s = 0;// caller bytes through codec kernels per byte of S
  double launches = 0;
};
// Shape of the baseline (Path::passthrough) or an FP8 path; returns nullopt for a path the
// collective does not have (ring for all_gather).
std::optional<PathShape> path_shape(Collective c, Path p, int nranks);

double predict_us(Collective c, Path p, int nranks, double bytes, const Link& link, const Codec& codec,
                  const WireParams& wire);

struct PredictedCrossover {
  bool wins = false;         // false: the FP8 path never wins (its per-byte cost is not lower)
  uint64_t bytes = 0;        // smallest size at which it wins (0 = wins at every size)
  double asymptotic_speedup = 0;  // baseline / fp8 as S -> infinity
};
// Both costs are linear in S, so the crossover is where the lines cross (closed form).
PredictedCrossover predict_crossover(Collective c, Path p, int nranks, const Link& link,
                                     const Codec& codec, const WireParams& wire);

}  // namespace fp8wire::bench
