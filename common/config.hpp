// The whole configuration of fp8wire, in one struct, so every key is parsed,
// checked and logged in one place.
//
// Sources, highest precedence first: FP8WIRE_* environment variables, the TOML file named by
// FP8WIRE_CONFIG, built-in defaults. Every field has one TOML key (dotted path) and one environment
// variable, derived mechanically: FP8WIRE_ + the key upper-cased with '.' -> '_'
// (thresholds.all_reduce.pcie -> FP8WIRE_THRESHOLDS_ALL_REDUCE_PCIE). Sizes accept plain bytes or
// a binary suffix ("767KiB", "64MiB", "1GiB"; also K/M/G meaning the same). Booleans accept
// true/false/1/0/on/off/yes/no. An unknown key or a bad value is an error naming the key, the value
// and what was expected; load_config() then returns that error and the library runs in pass-through.
//
// The TOML profile that fp8wire-bench writes uses the same keys (thresholds.* and cost_model.*), so
// a profile is simply a config file (or a part of one).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp8wire {

enum class Fp8Format : uint8_t { e4m3, e5m2 };
enum class ScaleType : uint8_t { fp32, bf16, e8m0 };
enum class Rounding : uint8_t { nearest, stochastic };
// Which FP8 conversion instructions the kernels use: native (sm_89+ cvt instructions), software
// (bit manipulation, any GPU) or automatic (native where the GPU has it).
enum class ConvertPath : uint8_t { automatic, native, software };
// FP8 all-reduce algorithm. automatic: the planner's cost model chooses.
enum class Algorithm : uint8_t { automatic, two_shot, one_shot, ring };
// How an FP8 path moves the quantized slots every rank needs from every other (one-shot's exchange,
// the gather step of two-shot / ring, the FP8 all-gather): ncclAllGather, or grouped ncclSend/ncclRecv
// of the slot to every peer (one step deep, and NCCL's point-to-point channels). automatic: the
// planner's cost model chooses (all_gather vs all_to_all figures; all-gather on a tie).
enum class GatherMethod : uint8_t { automatic, allgather, sendrecv };
// The direct transports (sched/transport/direct_windows.hpp): FP8 slots in memory every rank of one machine
// loads and stores directly. off: never; automatic: where the communicator's ranks share a machine,
// peer GPU memory unless NCCL_P2P_DISABLE=1 (then host memory), per call where the cost model says it
// is cheaper than NCCL's transports; peer_memory / host_memory: that one, for every FP8 call it can carry.
enum class DirectMode : uint8_t { off, automatic, peer_memory, host_memory };
// How a direct transport's programs move a call's bytes (sched/algorithms/direct.cpp), a named whole
// the planner picks per call (sched/plan/recipe.hpp), as NCCL offers LL, LL128 and Simple:
//   kernels      the codec kernels load and store the windows themselves (peer memory's protocol);
//   copy_engine  every byte over the link is a copy engine's: a rank's own data stays on its GPU, the
//                peers' data is copied in, what one peer alone reads is copied out, the copies run on
//                lanes of their own and the ranks' sends take turns stage by stage (host memory's);
//                over peer memory the kernels protocol runs, whatever this says.
// automatic: each kind of window its own. In a recipe of a call over NCCL's transports: automatic.
enum class DirectProtocol : uint8_t { automatic, kernels, copy_engine };
// Fabric class of a communicator, decided once per communicator by the agreement at its creation
// (docs/DESIGN.md, "The agreement at communicator creation").
enum class Fabric : uint8_t { nvlink = 0, pcie = 1, net = 2 };
inline constexpr int kFabricCount = 3;
// Collectives that have an FP8 path. all_to_all: the application's ncclAlltoAll (equal splits);
// send_recv: the application's own ncclSend / ncclRecv, each message on its own (the uneven all-to-all
// of expert parallelism, the activations and gradients of pipeline parallelism).
enum class Collective : uint8_t { all_reduce = 0, reduce_scatter = 1, all_gather = 2, all_to_all = 3, send_recv = 4 };
inline constexpr int kCollectiveCount = 5;

const char* to_string(Fp8Format);
const char* to_string(ScaleType);
const char* to_string(Rounding);
const char* to_string(ConvertPath);
const char* to_string(Algorithm);
const char* to_string(GatherMethod);  // "auto" | "allgather" | "sendrecv"
const char* to_string(DirectMode);       // "off" | "auto" | "peer_memory" | "host_memory"
const char* to_string(DirectProtocol);   // "auto" | "kernels" | "copy_engine"
const char* to_string(Fabric);
const char* to_string(Collective);

// Alpha-beta cost model of one fabric, calibrated by fp8wire-bench (written to cost_model.<fabric>.*).
// Times in microseconds, bandwidths in GB/s (1e9 bytes/s).
// Fixed cost and bandwidth per kind of NCCL operation: on some fabrics they differ by far (an
// emulated multi-host testbed: ~27 ms per all-reduce at 4 ranks, ~11 ms + a lower bandwidth per
// all-gather). 0 = not measured: that operation costs op_latency_us / bus_bandwidth_gbps. They are
// the figures at the world size the profile was measured with (not scaled by rank count:
// docs/DESIGN.md "Cost model").
enum class NcclOp : uint8_t { all_reduce, all_gather, reduce_scatter, all_to_all };
struct CostModel {
  double op_latency_us = 0;     // fixed cost of one NCCL operation without its own figure below
  double bus_bandwidth_gbps = 0; // NCCL bus bandwidth on this fabric
  double codec_gbps = 0;        // quantize/dequantize throughput (bytes of caller dtype per second)
  double kernel_launch_us = 0;  // per codec kernel launch
  double allreduce_latency_us = 0;      // one ncclAllReduce            (0: op_latency_us)
  double allgather_latency_us = 0;      // one ncclAllGather            (0: op_latency_us)
  double reduce_scatter_latency_us = 0; // one ncclReduceScatter        (0: op_latency_us)
  double alltoall_latency_us = 0;       // one grouped send/recv round (0: op_latency_us)
  // Bus bandwidth per kind of operation, GB/s (0: bus_bandwidth_gbps).
  double allreduce_bandwidth_gbps = 0;
  double allgather_bandwidth_gbps = 0;
  double reduce_scatter_bandwidth_gbps = 0;
  double alltoall_bandwidth_gbps = 0;
  // The direct transport on this fabric (peer GPU memory over NVLink or PCIe P2P, or shared host
  // memory): fixed cost of one barrier among the ranks, and the bytes per second one rank's codec
  // kernels move over its link. 0 = not measured: the planner then takes the direct transport only
  // where the configuration forces it (direct.transport).
  double direct_latency_us = 0;
  double direct_bandwidth_gbps = 0;
  // How the direct transport cuts a call into pipeline stages on this fabric (sched/plan/stages.hpp,
  // direct_stage_elems): stages of direct_stage_bytes of caller data, a larger call in at most
  // direct_max_stages larger ones (0: no bound) as far as a buffer set holds them. Where ranks share a
  // GPU and so its host link (ranks emulated on one GPU), at most direct_shared_max_stages stages of
  // at most direct_shared_stage_bytes: their copies take turns on the one link and their stages
  // interleave there, so each stage's hand-overs cost more than its overlap gains. 0: the built-in
  // figures (default_cost_model); giving them does not mark the model calibrated.
  uint64_t direct_stage_bytes = 0;
  uint64_t direct_max_stages = 0;
  uint64_t direct_shared_max_stages = 0;
  uint64_t direct_shared_stage_bytes = 0;
  bool calibrated = false;      // false: the built-in defaults below are used
  // The job shape the figures were measured on (0 = not recorded): hosts and ranks per host. A flat
  // FP8 path on a communicator that spans hosts with several ranks each is only taken when a
  // calibrated profile of that very shape says it wins (sched/plan/hierarchy.hpp).
  double hosts = 0;
  double ranks_per_host = 0;
  // Fixed cost of one `op`: its own figure when measured, else op_latency_us.
  double latency_us(NcclOp op) const {
    const double own = op == NcclOp::all_reduce       ? allreduce_latency_us
                       : op == NcclOp::all_gather     ? allgather_latency_us
                       : op == NcclOp::reduce_scatter ? reduce_scatter_latency_us
                                                      : alltoall_latency_us;
    return own > 0 ? own : op_latency_us;
  }
  double bandwidth_gbps(NcclOp op) const {
    const double own = op == NcclOp::all_reduce       ? allreduce_bandwidth_gbps
                       : op == NcclOp::all_gather     ? allgather_bandwidth_gbps
                       : op == NcclOp::reduce_scatter ? reduce_scatter_bandwidth_gbps
                                                      : alltoall_bandwidth_gbps;
    return own > 0 ? own : bus_bandwidth_gbps;
  }
};

// One measured winner among the variants fp8wire-bench sweep timed (routes.<collective>.<fabric>): on
// that fabric, at `ranks` ranks, from `from_bytes` (the threshold's bytes of a call) up to the next
// entry's size, the fastest was NCCL's own call (fp8 false) or the FP8 path `algorithm` (the
// all-reduce's; automatic for a collective with one FP8 path) gathering by `gather` (automatic:
// the path has no gather step, or it was not measured apart). Text form, one per measured size where
// the winner changes: "4 ranks from 16MiB: two_shot/allgather", "4 ranks from 1MiB: nccl",
// "8 ranks from 64MiB: fp8" (parse_measured_route / to_string).
struct MeasuredRoute {
  uint32_t ranks = 0;
  uint64_t from_bytes = 0;
  bool fp8 = false;
  Algorithm algorithm = Algorithm::automatic;
  GatherMethod gather = GatherMethod::automatic;
  bool operator==(const MeasuredRoute& o) const {
    return ranks == o.ranks && from_bytes == o.from_bytes && fp8 == o.fp8 && algorithm == o.algorithm && gather == o.gather;
  }
};
// Parses one entry for `collective` (its FP8 algorithms and whether it has a gather step decide
// what the entry may name); nullopt when the text is not such an entry.
std::optional<MeasuredRoute> parse_measured_route(std::string_view text, Collective collective);
std::string to_string(const MeasuredRoute& route);

struct Config {
  // --- master switches ------------------------------------------------------------------------
  bool enable = true;                       // enable          FP8WIRE_ENABLE
  // Per-collective FP8 switches.           // collectives.all_reduce / .reduce_scatter / .all_gather / .all_to_all / .send_recv
  // The all-gather is lossy on weights, and the all-to-all and the point-to-point messages carry
  // activations (expert-parallel dispatch and combine, pipeline stages), not only gradients: they go
  // FP8 only where the configuration says so.
  std::array<bool, kCollectiveCount> collective_enable = {true, true, false, false, false};

  // --- wire format ----------------------------------------------------------------------------
  Fp8Format format = Fp8Format::e4m3;       // format          "e4m3" | "e5m2"
  uint32_t block_size = 128;                // block_size      power of two in [32, 4096]
  ScaleType scale_type = ScaleType::fp32;   // scale_type      "fp32" | "bf16" | "e8m0"
  Rounding rounding = Rounding::nearest;    // rounding        "nearest" | "stochastic"
  uint64_t seed = 0x5eed;                   // seed            stochastic rounding seed
  ConvertPath convert_path = ConvertPath::automatic; // convert_path "auto" | "native" | "software"

  // --- planning -------------------------------------------------------------------------------
  Algorithm algorithm = Algorithm::automatic;  // algorithm  "auto" | "two_shot" | "one_shot" | "ring"
  std::optional<Fabric> fabric_override;       // fabric     "auto" | "nvlink" | "pcie" | "net"
  GatherMethod gather_transport = GatherMethod::automatic;  // gather_transport "auto" | "allgather" | "sendrecv"
  // Seconds fp8wire's own exchanges at a communicator's creation may take in all (the agreement and
  // its later rounds: sched/README.md, "The agreement"); past it the creation fails on every rank
  // still waiting, with ncclRemoteError. 0: no deadline. The exchanges take milliseconds (seconds
  // where NCCL connects its first all-gather over sockets among many ranks); 120 s is far above that
  // on a loaded machine, and ends a set-up whose peer was killed or stopped well before PyTorch's
  // 10-minute collective timeout would, as NCCL's and gloo's own bootstrap time-outs do.
  double setup_timeout_s = 120;             // setup_timeout_s
  // Smallest caller buffer (bytes) at which a collective goes FP8, per collective and fabric.
  // thresholds.<all_reduce|reduce_scatter|all_gather|all_to_all|send_recv>.<nvlink|pcie|net>
  // From the 2x H200 sweeps (docs/PERF.md, "2x H200"): over NVLink FP8 was 0.91-1.05x from 4 to
  // 256 MiB, so NVLink stays on pass-through below 256 MiB unless a measured profile says otherwise;
  // in pcie mode the all-reduce paid from 256 KiB (1 MiB kept as margin), reduce-scatter and the
  // all-gather over its default transport from ~1.1-2 MiB. The all-to-all (its whole send buffer) is
  // not measured yet: its FP8 program is the reduce-scatter's exchange round without the reduce, set
  // against NCCL's own send/recv round, so until a sweep says otherwise it takes the reduce-scatter's.
  // A point-to-point message (send_recv: the bytes of one message) is that round's one chunk: its
  // row is the all-to-all's until measured.
  std::array<std::array<uint64_t, kFabricCount>, kCollectiveCount> thresholds = {{
      // nvlink            pcie              net
      {{256ull << 20, 1ull << 20, 256ull << 10}},   // all_reduce
      {{256ull << 20, 2ull << 20, 256ull << 10}},   // reduce_scatter
      {{256ull << 20, 2ull << 20, 256ull << 10}},   // all_gather
      {{256ull << 20, 2ull << 20, 256ull << 10}},   // all_to_all
      {{256ull << 20, 2ull << 20, 256ull << 10}},   // send_recv
  }};
  // cost_model.<fabric>.{op_latency_us, bus_bandwidth_gbps, codec_gbps, kernel_launch_us,
  //   {allreduce,allgather,reduce_scatter,alltoall}_latency_us, ..._bandwidth_gbps}
  std::array<CostModel, kFabricCount> cost_model{};
  // routes.<collective>.<fabric>: the measured winners of fp8wire-bench sweep, per rank count, sorted
  // by (ranks, from_bytes). Where a call's rank count has entries and algorithm is auto, its route is
  // the entry at or below its size (the smallest entry below them all), not the cost model's guess:
  // the model cannot know a fabric's quirks (one operation kind far slower than another, a
  // point-to-point step that scales badly with ranks), a sweep of that fabric has timed them.
  std::array<std::array<std::vector<MeasuredRoute>, kFabricCount>, kCollectiveCount> routes{};

  // --- jobs spanning hosts ---------------------------------------------------------------------
  // Full precision inside each host, FP8 between hosts (sched/plan/hierarchy.hpp).
  bool hierarchy_enable = true;             // hierarchy.enable
  // Ranks per host, consecutive in rank order (0: the hosts NCCL sees, from NCCL_HOSTID or hostname).
  // For tests: ranks emulated on one GPU as 2 hosts x 2 ranks while NCCL joins all over sockets.
  uint32_t hierarchy_ranks_per_host = 0;    // hierarchy.ranks_per_host

  // --- direct transports (sched/transport/direct_windows.hpp) -------------------------------------------
  DirectMode direct_transport = DirectMode::automatic;  // direct.transport "off"|"auto"|"peer_memory"|"host_memory"
  // Treat all ranks of a communicator as ranks of this machine, whatever hosts NCCL sees (ranks
  // emulated on one GPU with NCCL_HOSTID, containers that set it): the direct transport is then set up
  // among them. Never on by default: ranks on different machines cannot map each other's memory.
  bool direct_assume_one_host = false;      // direct.assume_one_host
  uint64_t direct_window_bytes = 64ull << 20; // direct.window_bytes  per rank and communicator, direct.sets buffer sets
  uint32_t direct_ctas = 16;                // direct.ctas  thread blocks per codec kernel that touches a window
  // Buffer sets of a window (and of the device scratch a direct call uses), 2 to 4: stage i uses set
  // i % sets, so a rank may write up to `sets` stages ahead of its slowest peer's reads (2: one
  // stage's transfer beside the next one's quantize; more: room for the ranks to drift apart and
  // for the handshakes' latency, in smaller sets), and from 3 two-shot gathers each stage's reduced
  // shards one stage late (sched/exec/pipeline.hpp). 3: in two runs against 2, the all-reduce 1.06-1.13x
  // from 64 MiB at 2 and 4 ranks, the reduce-scatter and 16 MiB calls within +-8 %; 4 measured like 3
  // (docs/PERF.md, "Host-link limit").
  uint32_t direct_sets = 3;                 // direct.sets
  // The protocol of every direct call (auto: each kind of window its own; DirectProtocol above).
  DirectProtocol direct_protocol = DirectProtocol::automatic;  // direct.protocol "auto"|"kernels"|"copy_engine"

  // --- coalescing (only calls the application grouped itself) ---------------------------------
  bool coalesce_enable = true;              // coalesce.enable
  uint64_t coalesce_max_bytes = 64ull << 20; // coalesce.max_bytes
  uint32_t coalesce_max_calls = 64;          // coalesce.max_calls

  // --- memory ---------------------------------------------------------------------------------
  // Per communicator, taken at its creation where FP8 may run. 512 MiB lets a 256 MiB bf16 all-reduce
  // run as one stage (two wire copies of ~0.52 bytes per caller byte each); larger calls are pipelined.
  uint64_t scratch_max_bytes = 512ull << 20;   // scratch.max_bytes   per communicator
  // Per process, over all its communicators: each takes at most half of what is left
  // (sched/comm/budgets.hpp), so the first gets scratch.max_bytes and many cost no more than this.
  uint64_t scratch_process_max_bytes = 1ull << 30;  // scratch.process_max_bytes
  // Smallest pipeline stage (caller bytes): the planner uses as few stages as the scratch allows
  // and adds more, down to this size, only where a calibrated cost model predicts a gain.
  uint64_t pipeline_chunk_bytes = 32ull << 20; // pipeline.chunk_bytes

  // --- error feedback (off by default) --------------------------------------------------------
  bool error_feedback = false;              // error_feedback.enable
  uint64_t error_feedback_max_bytes = 1ull << 30; // error_feedback.max_bytes  residual memory cap

  // --- telemetry and the guard (sched/plan/guard.hpp, quant/telemetry.hpp) --------------------------
  // Every Nth FP8 call of a tensor (its feedback key) or communicator measures its own quantization
  // error in the codec kernels (0 = never). 16: the measuring kernels cost a fraction of the call
  // only on 1 call in 16, and the guard still reacts within 16 + guard.decide_after calls of a tensor.
  uint32_t telemetry_sample_every = 16;     // telemetry.sample_every
  // The guard: a measured call whose figures cross a bound on any rank switches its tensor (or
  // communicator) to full precision, on every rank alike, from the call `decide_after` calls later:
  // that call reads the votes, waiting for the measured call to complete if it has not (1: the next
  // call, which then always waits; 8: a bucket's all-reduce 8 calls later has long completed, so the
  // host never stalls in a training step).
  bool guard_enable = false;                // guard.enable
  uint32_t guard_retry_after = 100;         // guard.retry_after  calls in full precision, then FP8 again (0 = for good)
  uint32_t guard_decide_after = 8;          // guard.decide_after calls from a guarded call to the one that reads its votes
  // Bounds, per call and rank. Relative error sqrt(sum err^2 / sum x^2): e4m3 measures 2.6 % on
  // Gaussian data, every format/scale/rounding <= 9.4 % on normal, Student-t(3) and lognormal(0,2)
  // data (quant/README.md); 25 % is well clear of all of them.
  double guard_max_rel_error = 0.25;        // guard.max_rel_error
  double guard_max_saturated = 1e-3;        // guard.max_saturated  fraction of elements (0 by construction with amax scales)
  // Gaussian data flushes ~1e-5 of its elements; an outlier 1e5x larger in every block ~17 %.
  double guard_max_flushed = 1e-2;          // guard.max_flushed    fraction of elements
  double guard_max_nonfinite = 0;           // guard.max_nonfinite  fraction (0: any NaN/Inf trips)
  // Every Nth FP8 call of a communicator (not grouped, not captured) also runs in full precision
  // through the real NCCL on a copy of its input, and the FP8 result's true error is reported (0 = off).
  uint32_t audit_every = 0;                 // audit.every

  // --- logging --------------------------------------------------------------------------------
  std::string log_level = "warn";           // log.level   "off"|"error"|"warn"|"info"|"debug"|"trace"
  std::string log_file;                     // log.file    "" = stderr; %r = rank, %p = pid

  // --- real NCCL ------------------------------------------------------------------------------
  std::string nccl_library;                 // nccl.library  explicit path, tried after RTLD_NEXT/NOLOAD

  // --- profiler -------------------------------------------------------------------------------
  bool profiler_enable = false;             // profiler.enable
  std::vector<std::string> profiler_step_ranges = {"step", "ProfilerStep#"}; // profiler.step_ranges (prefixes)
  uint32_t profiler_report_every = 0;       // profiler.report_every  steps; 0 = only at exit
  std::string profiler_output;              // profiler.output  path prefix for JSON lines / trace
  uint32_t profiler_top = 10;               // profiler.top   collectives listed per report
  uint64_t profiler_buffer_bytes = 8ull << 20; // profiler.buffer_bytes CUPTI activity buffer size
  // profiler.device_buffers: CUPTI's device buffers (~3.2 MB, ~100k kernels and copies each) made
  // per context before the job runs (CUPTI's own default is 3). Past those CUPTI allocates on the
  // launching thread, which stalls it; and with CUDA 13.0's CUPTI and 3 buffers, a rank of a fast
  // run was seen to keep every buffer from some step on (profiler/README.md).
  uint32_t profiler_device_buffers = 12;
  // profiler.device_buffer_bytes: the size of each (CUPTI's default, 3,200,000 bytes, holds ~100k
  // records). Device and host memory of the profiler's CUPTI pool scale with count x size.
  uint64_t profiler_device_buffer_bytes = 3200000;
  // Extra case-insensitive kernel-name substrings that count as communication, '|'-separated
  // (besides "nccl" and "fp8wire"; profiler/classify.hpp).  profiler.comm_pattern
  std::string profiler_comm_pattern;
};

// One problem found while reading configuration.
struct ConfigError {
  std::string source;   // "env FP8WIRE_BLOCK_SIZE", "file /x/y.toml:12", ...
  std::string key;      // TOML key
  std::string value;    // offending value as written
  std::string expected; // what would have been accepted
  std::string message() const;
};

struct ConfigResult {
  Config config;                     // defaults where anything failed
  std::vector<ConfigError> errors;   // empty on success
  std::vector<std::string> sources;  // what was read, in order of precedence (for the log)
  bool ok() const { return errors.empty(); }
};

// Reads defaults, then the file named by FP8WIRE_CONFIG (if any), then FP8WIRE_* environment
// variables. Unknown FP8WIRE_* variables are errors too (except FP8WIRE_CONFIG itself).
ConfigResult load_config();
// The same with explicit inputs, for tests and fp8wire-config: env is a list of "NAME=value".
ConfigResult load_config(const std::string& toml_path, const std::vector<std::string>& env);
// Parses one TOML document on top of `base` (no environment).
ConfigResult parse_config_toml(const std::string& toml_text, const std::string& source_name,
                               const Config& base = Config{});
// The effective configuration as TOML, every key, for fp8wire-config and the log.
std::string to_toml(const Config& config);

// "64MiB" -> 67108864. Returns nullopt on anything else.
std::optional<uint64_t> parse_size(const std::string& text);
std::string format_size(uint64_t bytes);

}  // namespace fp8wire
