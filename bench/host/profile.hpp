// The TOML threshold profile: thresholds.<collective>.<fabric> and cost_model.<fabric>.*, the same
// keys as common/config.hpp, so the shim loads it as its config file (FP8WIRE_CONFIG=<profile>).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/host/results.hpp"

namespace fp8wire::bench {

// A threshold that switches FP8 off for good: FP8 never won in the measured range. The largest
// TOML integer, so every parser reads it as a plain size.
inline constexpr uint64_t kNeverThreshold = 9223372036854775807ull;

struct ThresholdEntry {
  uint64_t bytes = kNeverThreshold;
  std::string comment;  // measured speedup, margin, candidate path, or why "never"
};

// One measured winner (routes.<collective>.<fabric>) and what it was measured at, for its comment.
struct RouteEntry {
  MeasuredRoute route;
  std::string comment;
};

struct FabricProfile {
  Fabric fabric = Fabric::net;
  std::array<std::optional<ThresholdEntry>, kCollectiveCount> thresholds;
  // Per collective: at each size measured, the fastest of plain NCCL and every FP8 variant timed over
  // NCCL's transports (path and gather step; the ring, a path kept for comparison, never), one entry
  // where the winner changes. Empty where fewer than two variants were timed.
  std::array<std::vector<RouteEntry>, kCollectiveCount> routes;
  std::optional<CostModel> cost_model;
  // The gather transport every FP8 point of the sweep used ("allgather" or "sendrecv"); empty when
  // the sweep measured both (or none): then the shim's automatic choice prices both from cost_model.
  std::string gather_transport;
  std::string source;   // "measured on <host>, 2 ranks, ..." for the header comment
};

// Profile of one sweep: per collective measured, the "best" crossover of the preferred dtype (bf16
// when measured, else the first one); never-winning collectives get kNeverThreshold.
FabricProfile profile_from_sweep(const SweepResult& result, const std::vector<CrossoverReport>& reports,
                                 const Calibration& calibration);

// Whether a measured route may name the variant `p` timed: over NCCL's transports, one gather step,
// not the ring (it requantizes at every hop, so the planner never takes it on its own).
bool route_may_take(const SweepPoint& p, int nranks);

// The measured winners of one collective and dtype of a sweep (FabricProfile::routes).
std::vector<RouteEntry> measured_routes(const SweepResult& result, Collective collective, DType dtype);

// Renders several fabrics into one document. Fabrics appearing twice: the later entry wins, but
// their measured routes are merged by rank count (a later sweep of the same rank count wins), so
// sweeps at 2, 4 and 8 ranks make one profile.
// `gather_transport` is one key for all fabrics: written when every fabric of the document measured
// the same single transport, so the shim keeps to what was measured.
std::string render_profile_toml(const std::vector<FabricProfile>& fabrics);

}  // namespace fp8wire::bench
