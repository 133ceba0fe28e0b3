// The FP8 algorithms as stage programs (sched/exec/pipeline.hpp): each says what one stage quantizes on
// the produce lane and what it exchanges, reduces, gathers and decodes on the transfer lane. They
// issue only StageOps (codec launches and Transport operations), so the same programs run on GPUs
// over NCCL and on the CPU over the simulated transport of the CPU tier.
// docs/DESIGN.md ("Algorithms") describes them.
#pragma once

#include <cstddef>

#include "common/config.hpp"
#include "sched/exec/pipeline.hpp"
#include "sched/plan/stages.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

// One FP8 collective as its program sees it.
struct Fp8Args {
  const void* src = nullptr;
  void* dst = nullptr;        // may alias src (in place)
  size_t count = 0;           // elements as the call names them (AR count, RS recvcount, AG sendcount)
  float post = 1.0f;          // 1 for sum, 1/n for avg: applied once, in fp32, before requantizing
  float* residual = nullptr;  // error feedback, `count` floats (one- and two-shot all-reduce only)
  GatherMethod gather = GatherMethod::allgather;
  // Over a direct transport: how its programs move the bytes (sched/algorithms/direct.cpp), and with
  // the copy_engine protocol the bytes of the stage's device buffer set they keep data in.
  DirectProtocol protocol = DirectProtocol::automatic;
  size_t device_set_bytes = 0;
};

// A flat FP8 algorithm as the steps of a stage program over the arguments of one call: produce
// quantizes a stage on the produce lane; finish exchanges, reduces, gathers and decodes it on the
// transfer lane; gather, where the transfer part splits at a second handshake with the peers, is
// the rest of it (StageProgram::gather; null: none).
struct Fp8Algorithm {
  using Step = ncclResult_t (*)(StageOps& ops, const Fp8Args& a, const Stage& st);
  Step produce = nullptr;
  Step finish = nullptr;
  Step gather = nullptr;
};

// All-reduce by all-to-all decomposition: quantize N shards, send shard j to rank j, rank j reduces
// its N copies in rank order and requantizes, then every rank gathers and decodes the same bytes.
extern const Fp8Algorithm kTwoShotAllReduce;
// Two-shot's last step, the ring's too: each rank's reduced shard (in its slot of `shards`, laid out
// by `l`) gathered by every rank, and all of them decoded into the caller's output.
ncclResult_t gather_and_decode(StageOps& ops, const Fp8Args& a, const Stage& st, const ShardLayout& l, char* shards);
// All-reduce by one all-gather of the quantized inputs; every rank reduces all N in rank order.
extern const Fp8Algorithm kOneShotAllReduce;
// Ring all-reduce, requantizing at each of the N-1 hops (kept as the benchmark's comparison).
extern const Fp8Algorithm kRingAllReduce;
// Reduce-scatter: quantize the N blocks of the send buffer, all-to-all, reduce in rank order into
// the caller's dtype.
extern const Fp8Algorithm kReduceScatterFp8;
// All-gather: quantize, gather the chunks, decode every rank's chunk.
extern const Fp8Algorithm kAllGatherFp8;
// All-to-all (the application's ncclAlltoAll, equal splits): quantize the stage's part of every
// peer's chunk, each chunk its own blocks; one send/recv round; decode each received chunk into its
// place. The rank's own chunk is copied, never quantized. Fp8Args::count is the count per peer.
extern const Fp8Algorithm kAllToAllFp8;

// The same four collectives over a direct transport (sched/transport/direct_windows.hpp, direct.cpp):
// the codec kernels load and store the windows of the machine's ranks themselves. Same arithmetic,
// same bytes on every rank as their NCCL twins above. Two-shot's transfer part splits: finish
// reduces the shards and publishes the reduced one, gather decodes the reduced shards and releases.
extern const Fp8Algorithm kDirectOneShotAllReduce;
extern const Fp8Algorithm kDirectTwoShotAllReduce;
extern const Fp8Algorithm kDirectReduceScatter;
extern const Fp8Algorithm kDirectAllGather;
extern const Fp8Algorithm kDirectAllToAll;

// A flat FP8 algorithm run over the arguments of one call.
class Fp8Program final : public StageProgram {
 public:
  Fp8Program(const Fp8Algorithm& algorithm, const Fp8Args& a) : algorithm_(&algorithm), a_(a) {}
  ncclResult_t produce(StageOps& ops, const Stage& st) override { return algorithm_->produce(ops, a_, st); }
  ncclResult_t finish(StageOps& ops, const Stage& st) override { return algorithm_->finish(ops, a_, st); }
  bool has_gather() const override { return algorithm_->gather != nullptr; }
  ncclResult_t gather(StageOps& ops, const Stage& st) override {
    return algorithm_->gather ? algorithm_->gather(ops, a_, st) : ncclSuccess;
  }

 private:
  const Fp8Algorithm* algorithm_;
  Fp8Args a_;
};

}  // namespace fp8wire::sched

namespace fp8wire::sched {

// The hierarchical all-reduce (sched/plan/hierarchy.hpp): per stage, a reduce-scatter in the caller's
// precision inside the host (each local rank keeps a shard), the FP8 all-reduce of that shard among
// the rail (one-shot or two-shot, the flat programs over the rail), an all-gather inside the host.
// A stage whose length is not a multiple of the ranks per host goes through a zero-padded copy.
class HierarchicalAllReduce final : public StageProgram {
 public:
  HierarchicalAllReduce(const Fp8Args& a, CommState& s, Path inner) : a_(a), s_(&s), inner_(inner) {}
  ncclResult_t produce(StageOps& ops, const Stage& st) override;
  ncclResult_t finish(StageOps& ops, const Stage& st) override;

 private:
  Fp8Args a_;
  CommState* s_;
  Path inner_;
};

// The hierarchical reduce-scatter: the send buffer's blocks are reordered by (local rank, host), a
// reduce-scatter in the caller's precision inside the host leaves each local rank the blocks of its
// rail, and the FP8 reduce-scatter among the rail delivers each rank its own block.
class HierarchicalReduceScatter final : public StageProgram {
 public:
  HierarchicalReduceScatter(const Fp8Args& a, CommState& s) : a_(a), s_(&s) {}
  ncclResult_t produce(StageOps& ops, const Stage& st) override;
  ncclResult_t finish(StageOps& ops, const Stage& st) override;

 private:
  Fp8Args a_;
  CommState* s_;
};

}  // namespace fp8wire::sched

#include <variant>

#include "sched/plan/route.hpp"

namespace fp8wire::sched {

// The one place a route becomes a stage program: the program of `route` (an FP8 route) for
// `collective`, built in place, and only that one (nothing allocated per call).
class RouteProgram {
 public:
  RouteProgram(Collective collective, const Route& route, const Fp8Args& a, CommState& s);
  RouteProgram(const RouteProgram&) = delete;
  RouteProgram& operator=(const RouteProgram&) = delete;
  StageProgram& get() { return *program_; }

 private:
  std::variant<std::monostate, Fp8Program, HierarchicalAllReduce, HierarchicalReduceScatter> storage_;
  StageProgram* program_ = nullptr;
};

}  // namespace fp8wire::sched
