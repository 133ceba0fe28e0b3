// Results of a sweep: per-size measurements, their analysis (crossovers, cost-model calibration),
// the JSON written for every run and read back by `fp8wire-bench model`, and the terminal tables.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/host/crossover.hpp"
#include "bench/host/link_limit.hpp"
#include "bench/host/model.hpp"
#include "bench/host/stats.hpp"
#include "bench/host/units.hpp"

namespace fp8wire::bench {

struct CheckResult {
  bool ran = false;
  bool pass = false;
  double max_err_ratio = 0;      // max |out - expected| / block reference magnitude (0 = exact)
  double bound = 0;              // the stated bound on max_err_ratio (0 = bit-exact required)
  uint64_t mismatches = 0;       // elements beyond the bound, summed over ranks
  uint64_t nonfinite = 0;        // NaN/Inf in the output, summed over ranks
  bool bitwise_required = false; // FP8 all-reduce: every rank must hold identical bytes
  bool bitwise_identical = true;
};

struct SweepPoint {
  Collective collective = Collective::all_reduce;
  DType dtype = DType::bf16;
  Path path = Path::passthrough;
  uint64_t bytes = 0;            // full-buffer size (nccl-tests "size")
  uint64_t count = 0;            // count argument of the NCCL call
  bool supported = true;         // false: the path refused this call (error says why)
  std::string error;
  std::vector<double> times_us;  // per repeat, the slowest rank
  Summary time;                  // over times_us
  double algbw_gbps = 0, busbw_gbps = 0;
  uint64_t wire_bytes = 0;       // bytes one rank sent per call
  std::string wire_source;       // "accounting" (recorded by sched/) or "nominal" (computed)
  // How the gather step moved the slots during the timed calls (sched/'s accounting): "allgather",
  // "sendrecv", "mixed" (both, e.g. the planner chose per call) or "" (plain NCCL, FP8
  // reduce-scatter: no gather step). Files written before it was recorded read as "allgather".
  std::string gather_transport;
  // "" when NCCL's transports carried the calls, else the direct transport that did ("peer_memory",
  // "host_memory"; sched/transport/direct_windows.hpp). A path over a direct transport is a curve of its own.
  std::string transport;
  double speedup = 0;            // passthrough median / this median at the same size (0 = n/a)
  // Points of the direct transport through host memory, with the sweep's pinned-copy rates: the
  // host-link limit of this collective and size (link_limit.hpp) and the percent of it reached.
  double link_limit_us = 0;
  double link_limit_pct = 0;
  CheckResult check;
};

struct MachineInfo {
  std::string hostname, gpu_name, created_utc;
  int compute_capability = 0;     // 90 for sm_90
  int driver_version = 0, runtime_version = 0, nccl_version = 0;
  int nranks = 0;
  bool emulated = false;          // several ranks on one GPU (NCCL_HOSTID per rank, sockets)
  std::string testbed;            // emulated: "mps" (side by side) or "time-sliced"; "" when unknown
  Fabric fabric = Fabric::net;    // label of the results
  bool p2p_disabled = false;      // NCCL_P2P_DISABLE=1 was set (--fabric pcie)
};

struct SweepResult {
  MachineInfo machine;
  nlohmann::json options = nlohmann::json::object();  // the command line, as given
  WireParams wire;                // format of the FP8 paths (dtype field unused here)
  std::string fp8_format = "e4m3";
  Codec codec;                    // measured codec throughput on this GPU (gbps 0 = not measured)
  // Gather transport of the FP8 paths: `requested` is --gather-transport ("auto" = the configuration
  // as loaded, "both" = each path with a gather step timed over allgather and over sendrecv), `config`
  // the value the ranks ran with ("auto": the planner chose per call; "both": one engine per
  // transport; each point records what was used). Empty in files written before the option existed.
  std::string gather_transport_requested, gather_transport_config;
  // Pinned cudaMemcpyAsync rates measured in the same run, every rank at once (sweeps with the direct
  // transport through host memory; not measured otherwise).
  PinnedRates pinned;
  std::vector<SweepPoint> points;
};

// The transport the model costs a point's gather step with: sendrecv for "sendrecv", allgather
// otherwise (paths without a gather step have no use for it); nullopt for "mixed", which no one shape
// describes, and for the points of a direct transport, which issue no NCCL operation.
std::optional<GatherMethod> modeled_transport(const SweepPoint& p);
// The point's path as tables show it: the path name, with "/sr" when its gather step went over
// send/recv, "/mix" when mixed, "/direct" over a direct transport. A path measured over two transports (`sweep --gather-transport
// both`) is two curves, told apart by this label ("one_shot" and "one_shot/sr").
std::string path_label(const SweepPoint& p);

// Fills speedup from the passthrough point of the same (collective, dtype, size).
void compute_speedups(SweepResult& result);
// Fills link_limit_us and link_limit_pct of every usable host-memory point from result.pinned (left
// 0 when the rates were not measured).
void compute_link_limits(SweepResult& result);
// The basis of the link limits of one collective, as tables and the JSON name it ("" when none).
std::string link_limit_basis(const SweepResult& result, Collective c, DType dtype);

struct CrossoverReport {
  Collective collective;
  DType dtype;
  // A measured curve, named by path_label ("two_shot", "one_shot/sr"), or "best" = per size the
  // fastest point of two_shot and one_shot over every gather transport measured.
  std::string candidate;
  Crossover crossover;
  std::optional<Path> path;      // the curve's path; nullopt for "best"
  std::string gather_transport;  // the curve's SweepPoint::gather_transport; "" for "best"
};
// One report per (collective, dtype, FP8 curve measured: path and gather transport) plus "best" per
// (collective, dtype), all against plain NCCL (the passthrough points: fp8wire hands the call to NCCL
// unchanged); and, where a sweep timed the FP8 paths over NCCL's transports and a direct one,
// kDirectOverNccl: per size the fastest direct point against the fastest FP8 point over NCCL's.
inline constexpr const char* kDirectOverNccl = "direct/fp8";
std::vector<CrossoverReport> analyze_crossovers(const SweepResult& result, const CrossoverOptions& options);

// Alpha/beta of the baseline of one collective (x = bus bytes), from the sweep's passthrough points.
LinearFit fit_baseline(const SweepResult& result, Collective c, std::optional<DType> dtype = std::nullopt);

// Cost model for the profile: op_latency_us and bus bandwidth fitted from the all-reduce baseline (or
// the first collective measured), per-operation latencies (fit_operation_latencies), codec from the measured kernels or, failing that, from the slope of
// the two_shot fit once the wire term is taken out. basis explains each number.
struct Calibration {
  CostModel model;
  Link link;
  Codec codec;
  std::vector<std::string> notes;
};
Calibration calibrate(const SweepResult& result);
// The per-operation latency and bus bandwidth of cal.link (all-reduce, all-gather, reduce-scatter,
// grouped send/recv), each a relative-error line fit of the points that use it once the rest of their
// path (codec, launches, the path's other operations) is taken out with `cal`'s figures (so it runs
// after the generic link and the codec are fitted). Each point is costed with the gather transport
// it ran with (modeled_transport; "mixed" points are left out), so it feeds the operation its gather
// step really was:
//   all_reduce     plain all-reduce
//   reduce_scatter plain reduce-scatter
//   all_gather     plain all-gather, else FP8 one-shot all-reduce over all-gather (one all-gather),
//                  else FP8 all-gather over all-gather
//   all_to_all     FP8 reduce-scatter (one a2a), else FP8 one-shot all-reduce over send/recv (one
//                  a2a), else FP8 two-shot all-reduce minus its gather step (an all-gather; over
//                  send/recv a second a2a), else FP8 all-gather over send/recv
// Operations the sweep did not exercise stay 0 (= the generic figures). calibrate() calls it and
// copies them into cal.model.
void fit_operation_latencies(const SweepResult& result, Calibration& cal);
// The direct transport's barrier latency and link bandwidth (CostModel::direct_*), one relative-error
// line fit over every point it carried: per barrier, the time less the codec and launches against the
// link bytes (sched/plan/cost_model.hpp direct_cost_parts). False when the sweep timed none.
bool fit_direct_transport(const SweepResult& result, Calibration& cal);

nlohmann::json to_json(const SweepResult& result, const std::vector<CrossoverReport>& crossovers,
                       const Calibration& calibration);
// Reads what to_json wrote (points and machine; analysis is recomputed). error names the bad field.
std::optional<SweepResult> sweep_from_json(const nlohmann::json& j, std::string& error);
// The same from a file that fp8wire-bench sweep --json wrote. The text is bounded before it is parsed
// (kMaxSweepJsonBytes, common/input_limits.hpp's nesting depth); errors name the file.
inline constexpr uint64_t kMaxSweepJsonBytes = 256u << 20;  // a full sweep is a few MiB
std::optional<SweepResult> read_sweep_file(const std::string& path, std::string& error);

// nccl-tests-like table of one (collective, dtype), every path, every size.
std::string render_table(const SweepResult& result, Collective c, DType dtype);
std::string render_crossovers(const SweepResult& result, const std::vector<CrossoverReport>& reports);
// Side by side: one row per (collective, dtype, candidate), one column per fabric.
std::string render_fabric_comparison(const std::vector<SweepResult>& results, const CrossoverOptions& options);
// One line per check that failed; empty when every check passed.
std::vector<std::string> failed_checks(const SweepResult& result);

}  // namespace fp8wire::bench
