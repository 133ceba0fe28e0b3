// The FP8 algorithms as stage programs (sched/pipeline.hpp): each says what one stage quantizes on
// the produce lane and what it exchanges, reduces, gathers and decodes on the transfer lane. They
// issue only StageOps (codec launches and Transport operations), so the same programs run on GPUs
// over NCCL and on the CPU over the simulated transport of the CPU tier. DESIGN.md describes them.
#pragma once

#include <cstddef>

#include "common/config.hpp"
#include "sched/pipeline.hpp"
#include "sched/types.hpp"

namespace fp8wire::sched {

// One FP8 collective as its program sees it.
struct Fp8Args {
  const void* src = nullptr;
  void* dst = nullptr;        // may alias src (in place)
  size_t count = 0;           // elements as the call names them (AR count, RS recvcount, AG sendcount)
  float post = 1.0f;          // 1 for sum, 1/n for avg: applied once, in fp32, before requantizing
  float* residual = nullptr;  // error feedback, `count` floats (one- and two-shot all-reduce only)
  GatherTransport gather = GatherTransport::allgather;
};

// All-reduce by all-to-all decomposition: quantize N shards, send shard j to rank j, rank j reduces
// its N copies in rank order and requantizes, then every rank gathers and decodes the same bytes.
class TwoShotAllReduce final : public StageProgram {
 public:
  explicit TwoShotAllReduce(const Fp8Args& a) : a_(a) {}
  ncclResult_t produce(StageOps& ops, const Stage& st) override;
  ncclResult_t finish(StageOps& ops, const Stage& st) override;

 private:
  Fp8Args a_;
};

// All-reduce by one all-gather of the quantized inputs; every rank reduces all N in rank order.
class OneShotAllReduce final : public StageProgram {
 public:
  explicit OneShotAllReduce(const Fp8Args& a) : a_(a) {}
  ncclResult_t produce(StageOps& ops, const Stage& st) override;
  ncclResult_t finish(StageOps& ops, const Stage& st) override;

 private:
  Fp8Args a_;
};

// Ring all-reduce, requantizing at each of the N-1 hops (kept as the benchmark's comparison).
class RingAllReduce final : public StageProgram {
 public:
  explicit RingAllReduce(const Fp8Args& a) : a_(a) {}
  ncclResult_t produce(StageOps& ops, const Stage& st) override;
  ncclResult_t finish(StageOps& ops, const Stage& st) override;

 private:
  Fp8Args a_;
};

// Reduce-scatter: quantize the N blocks of the send buffer, all-to-all, reduce in rank order into
// the caller's dtype.
class ReduceScatterFp8 final : public StageProgram {
 public:
  explicit ReduceScatterFp8(const Fp8Args& a) : a_(a) {}
  ncclResult_t produce(StageOps& ops, const Stage& st) override;
  ncclResult_t finish(StageOps& ops, const Stage& st) override;

 private:
  Fp8Args a_;
};

// All-gather: quantize, gather the chunks, decode every rank's chunk.
class AllGatherFp8 final : public StageProgram {
 public:
  explicit AllGatherFp8(const Fp8Args& a) : a_(a) {}
  ncclResult_t produce(StageOps& ops, const Stage& st) override;
  ncclResult_t finish(StageOps& ops, const Stage& st) override;

 private:
  Fp8Args a_;
};

}  // namespace fp8wire::sched
