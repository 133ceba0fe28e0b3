// Host-side planning of FP8 collectives: eligibility, thresholds, the cost model, shard / stage
// arithmetic, scratch sizing, coalescing batches and fabric classification. Plain C++ with no CUDA
// calls, so CI tests every rule on a machine without a GPU (DESIGN.md "Rules the scheduler keeps").
//
// Every function here is a pure function of its arguments. The engine feeds it only inputs that are
// identical on all ranks of a communicator (collective, dtype, op, element count, world size, the
// agreed fabric and the configuration, whose fingerprint is checked at agreement), so all ranks take
// identical decisions: one rank passing through while another runs FP8 would hang the job.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/config.hpp"
#include "quant/quant.hpp"  // kMaxReduceInputs only (no CUDA calls here)
#include "quant/wire_format.hpp"
#include "sched/accounting.hpp"

namespace fp8wire::sched {

// Why a call passes through untouched (none: it is an FP8 candidate).
enum class PassReason : uint8_t {
  none,
  disabled,             // enable = false
  collective_disabled,  // collectives.<name> = false
  dtype,                // not fp32 / fp16 / bf16
  op,                   // not sum / avg (max, min, prod, premulsum and custom ops)
  single_rank,          // 1-rank communicator: nothing to communicate
  empty,                // zero elements
  nonblocking,          // non-blocking communicator: ncclInProgress semantics are not supported
  too_many_ranks,       // more ranks than one fused reduce takes (quant::kMaxReduceInputs)
  below_threshold,      // caller buffer smaller than thresholds.<collective>.<fabric>
  cost_model,           // the calibrated cost model says plain NCCL is faster
  single_process,       // every rank in this process (ncclCommInitAll): one thread drives them all
};
const char* to_string(PassReason);

// What the planner sees of one call. `count` is the element count the application passed
// (all_reduce: count; reduce_scatter: recvcount; all_gather: sendcount).
struct CallShape {
  Collective collective = Collective::all_reduce;
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  size_t count = 0;
  int nranks = 1;
  bool nonblocking = false;
  // All ranks of the communicator live in this process and one thread issues their calls in one
  // group (ncclCommInitAll). fp8wire runs one communicator's blocking agreement and FP8 stages at a
  // time, which would wait forever on ranks that thread has not issued yet.
  bool single_process = false;
};

// Element type of an NCCL dtype, when fp8wire has an FP8 path for it.
bool elem_type_of(ncclDataType_t dtype, quant::ElemType* out);
size_t nccl_type_size(ncclDataType_t dtype);  // 0 for an unknown dtype

// Bytes of the caller's full buffer, the quantity thresholds are compared with. For reduce_scatter
// it is the send buffer (nranks * recvcount elements), for all_gather the receive buffer (nranks *
// sendcount), as nccl-tests reports sizes.
uint64_t threshold_bytes(const CallShape& call);

// Rules that need no fabric (the cheap checks, done before any per-communicator state is touched).
PassReason static_eligibility(const Config& config, const CallShape& call);

// True when the call is below the threshold of every fabric it could be planned for (the override's
// alone when set): it passes through before the communicator's one-time agreement is needed, so
// small calls never pay for it.
bool below_every_threshold(const Config& config, const CallShape& call);

// Predicted microseconds of one collective under a path (CostModel of the fabric).
CostModel effective_cost_model(const Config& config, Fabric fabric);
CostModel default_cost_model(Fabric fabric);
// Sum of the fixed costs of the NCCL operations one stage of `path` issues (all-reduce; a2a +
// all-gather; all-gather; n-1 hops + all-gather; ...), each its own latency (CostModel::latency_us).
// `gather`: how the path's gather step moves the quantized slots (GatherTransport); with sendrecv
// that step is costed as an all_to_all operation (same bus bytes), else as an all_gather.
double fixed_latency_us(const CostModel& model, Collective collective, Path path, int nranks,
                        GatherTransport gather = GatherTransport::allgather);
double predicted_us(const CostModel& model, Collective collective, Path path, uint64_t caller_bytes,
                    int nranks, const quant::WireFormat& format,
                    GatherTransport gather = GatherTransport::allgather);

// The transport of that step for one call: Config::gather_transport when set, else the cheaper of
// the two by the cost model of `fabric` (all-gather on a tie, which the built-in figures always are).
// A function of the config and the call's shape only, so every rank picks the same.
GatherTransport gather_transport_for(const Config& config, Collective collective, Path path,
                                     uint64_t caller_bytes, int nranks, Fabric fabric);

struct Plan {
  Path path = Path::passthrough;
  PassReason reason = PassReason::none;
  // FP8 paths with a gather step. The engine derives it again with gather_transport_for() from the
  // size it actually sends (a coalesced batch's total), the same function on every rank.
  GatherTransport gather = GatherTransport::allgather;
};
// Full plan of one call on a communicator of a known fabric. Above the threshold the algorithm is
// Config::algorithm, or, when automatic, the cheapest of one-shot and two-shot by the cost model; a
// calibrated cost model (CostModel::calibrated) may also prefer pass-through. reduce_scatter and
// all_gather have a single FP8 algorithm each, reported as Path::two_shot (the a2a + reduce of
// reduce_scatter) and Path::one_shot (quantize + all-gather) respectively.
Plan plan_call(const Config& config, const CallShape& call, Fabric fabric);

// --- shard arithmetic -------------------------------------------------------------------------
// The all-to-all decomposition cuts `count` elements into one shard per rank. Shards are a whole
// number of blocks long (so a block never straddles two ranks); the last ones may be short or empty.
struct ShardLayout {
  size_t count = 0;
  int nranks = 1;
  size_t shard_elems = 0;   // elements per full shard, a multiple of the block size, >= one block
  size_t seg_stride = 0;    // bytes per shard slot in a segmented wire buffer
  size_t begin(int j) const;
  size_t length(int j) const;                                   // 0 for empty trailing shards
  size_t bytes(int j, const quant::WireFormat& f) const;        // chunk bytes of shard j
  size_t total_bytes() const { return seg_stride * static_cast<size_t>(nranks); }
  quant::Segmented segmented() const { return {shard_elems, seg_stride}; }
};
ShardLayout shard_layout(size_t count, int nranks, const quant::WireFormat& format);

// Scratch bytes one pipeline stage of `stage_elems` elements needs (one buffer set).
size_t stage_scratch_bytes(Collective collective, Path path, size_t stage_elems, int nranks,
                           const quant::WireFormat& format);

// The per-communicator scratch pool: [coalescing staging | buffer set 0 | buffer set 1]. Two sets
// let the quantize of stage i+1 overlap the transfer of stage i.
struct ScratchLayout {
  size_t total_bytes = 0;
  size_t staging_bytes = 0;  // caller-dtype staging for coalesced calls (0: coalescing off)
  size_t set_bytes = 0;      // bytes of one buffer set
  size_t set_offset(int i) const { return staging_bytes + static_cast<size_t>(i) * set_bytes; }
};
ScratchLayout scratch_layout(const Config& config);

// Pipelining. One stage of a call needs `stage_scratch_bytes`; a call that fits both buffer sets
// runs as one stage (nothing overlaps it). Otherwise every stage fits one set, and the stage count is
// the one the cost model of `fabric` predicts fastest between the fewest that fit and
// caller bytes / pipeline.chunk_bytes: each stage adds its NCCL operations' fixed latency and hides
// part of the quantize. Stages are a multiple of `stage_unit_elems(...)` but the last. 0 when even one
// unit does not fit (the call then falls back to pass-through, identically on every rank).
size_t stage_unit_elems(Collective collective, Path path, int nranks, const quant::WireFormat& format);
size_t nccl_ops_per_stage(Collective collective, Path path, int nranks);
size_t stage_elems(const Config& config, const ScratchLayout& scratch, Collective collective,
                   Path path, size_t count, size_t elem_bytes, int nranks,
                   const quant::WireFormat& format, Fabric fabric);
inline size_t stage_count(size_t count, size_t stage) { return stage ? (count + stage - 1) / stage : 0; }

// --- coalescing --------------------------------------------------------------------------------
// One FP8 candidate the application issued inside its group.
struct PendingShape {
  const void* comm = nullptr;
  const void* stream = nullptr;  // calls on different streams are never packed together
  bool fp8 = true;               // false: a pass-through call queued for ordering only
  Collective collective = Collective::all_reduce;
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  uint64_t bytes = 0;
};
// Length of the batch that starts at items[0]: consecutive FP8 all-reduces of the same communicator,
// stream, dtype and op, packed while the total stays within coalesce_max_bytes (and the staging area) and
// the number of calls within coalesce_max_calls. Always >= 1 for a non-empty list; 1 when coalescing
// is off, the call is not an all-reduce, or the first call alone exceeds the cap.
size_t coalesce_batch_length(const Config& config, size_t staging_bytes,
                             std::span<const PendingShape> items);

// --- group nesting -----------------------------------------------------------------------------
// The application's ncclGroupStart/End depth on one thread. FP8 calls issued at depth > 0 are queued
// and run after the outermost GroupEnd.
class GroupState {
 public:
  void start() { ++depth_; }
  // Returns true when this end closes the outermost group (the moment queued calls run).
  // An unbalanced end (depth already 0) returns false and is reported by `unbalanced()`.
  bool end();
  int depth() const { return depth_; }
  bool inside() const { return depth_ > 0; }
  bool unbalanced() const { return unbalanced_; }

 private:
  int depth_ = 0;
  bool unbalanced_ = false;
};

// --- fabric ------------------------------------------------------------------------------------
// What one rank contributes to the per-communicator agreement (exchanged with a real all-gather).
struct RankFacts {
  uint64_t host_hash = 0;          // NCCL_HOSTID, else hostname + boot id
  uint64_t config_fingerprint = 0; // config_fingerprint(): ranks with different configs never FP8
  uint8_t p2p_disabled = 0;        // NCCL_P2P_DISABLE=1 on this rank
  uint8_t nvlink_local = 0;        // this GPU reaches every other visible local GPU over NVLink
  uint8_t scratch_ok = 0;          // scratch pool and streams allocated
  uint8_t reserved[5] = {};
};
static_assert(sizeof(RankFacts) == 24, "RankFacts travels as raw bytes");

struct Agreement {
  Fabric fabric = Fabric::net;
  bool fp8_ok = false;       // every rank has scratch and the same configuration
  const char* reason = "";   // why not, for the log
};
// The decision every rank computes from the same gathered facts: "net" when the ranks span more
// than one host (emulated ranks with distinct NCCL_HOSTID included), else "pcie" when any rank has
// P2P disabled or lacks NVLink to its local peers, else "nvlink". fabric_override wins.
Agreement agree(const Config& config, std::span<const RankFacts> facts);
uint64_t config_fingerprint(const Config& config);
uint64_t fnv1a(const void* data, size_t size, uint64_t seed = 1469598103934665603ull);

}  // namespace fp8wire::sched
