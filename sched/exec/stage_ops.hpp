// The operations a stage program issues: codec launches (through the codec table) and wire
// operations (through a Transport), each on the lane the pipeline executor set for the current half
// of the stage. Every failure is logged here with what failed, so the programs read as the data
// flow and return the first error as it comes.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>

#include "quant/quant.hpp"
#include "sched/comm/comm_state.hpp"
#include "sched/plan/recipe.hpp"
#include "sched/platform/platform.hpp"
#include "sched/transport/transport.hpp"

namespace fp8wire::sched {
class DirectWindows;
}

namespace fp8wire::sched {

class StageOps {
 public:
  StageOps(CommState& s, quant::ElemType type, const quant::WireFormat& format, quant::LaunchOptions launch)
      : state_(&s), codec_(&s.platform->codec), transport_(&s.transport), rank_(s.rank), nranks_(s.nranks),
        type_(type), format_(format), launch_(launch) {}

  // The same operations over another group of ranks (a sub-communicator of the hierarchical path),
  // on the same lane; its bytes are added back with add_wire_bytes.
  StageOps over(Transport& transport, int rank, int nranks) const {
    StageOps sub = *this;
    sub.transport_ = &transport;
    sub.rank_ = rank;
    sub.nranks_ = nranks;
    sub.wire_bytes_ = 0;
    return sub;
  }
  void add_wire_bytes(uint64_t bytes) { wire_bytes_ += bytes; }

  // The call runs over a direct transport (sched/transport/direct_windows.hpp) by `recipe`: the direct
  // programs reach the windows through it, and every codec launch that loads or stores a window keeps
  // to the recipe's window_ctas thread blocks, while one on device memory alone runs at the codec's
  // own width, as over NCCL (it is on a lane's path between two transfers: capped, it held them apart).
  // The executor reads the recipe's hand-over and paced sends here.
  void use_direct(const DirectWindows* direct, const DirectRecipe& recipe) {
    direct_ = direct;
    recipe_ = recipe;
  }
  const DirectWindows* direct() const { return direct_; }
  // The call's quantizations carry the guard's votes (Watch::guarded).
  bool guarded() const { return launch_.telemetry.guard; }
  LaneHandover handover() const { return direct_ ? recipe_.handover : LaneHandover::before_finish; }
  bool paced_sends() const { return direct_ && recipe_.paced_sends; }
  // The stage's hand-over from the produce lane, placed as late as it may be: the current lane waits
  // for `produced` once, before the first operation of the stage that may touch what the produce lane
  // writes or reads (its own quantized data, the caller's buffers, the flags it owes the peers): every
  // operation but acquire() and fetch(), which move only what the peers wrote. So a stage's copy-in
  // runs while its own produce still waits for the copy engine (sched/exec/pipeline.hpp).
  void gate_produce(cudaEvent_t produced) { produce_gate_ = produced; }
  // Waits for the produce gate now if it is still closed (the executor, once the stage's finish is
  // issued: the rest of the stage follows its produce, as with the wait before the finish).
  ncclResult_t pass_produce_gate();
  // Paced sends (DirectRecipe::paced_sends), set by the executor around a stage's produce: the lane waits for
  // `acquired` once, before the stage's first write into a window (a copy or a quantize there) or its
  // publish. With `mark`, the next acquire() records `mark` on its lane (the transfer lane, or with
  // copy lanes the fetch lane) once its waits are issued: the stage's peers have published what it
  // reads (sched/exec/pipeline.hpp).
  void gate_send(cudaEvent_t acquired) { send_gate_ = acquired; }
  void mark_acquired(cudaEvent_t mark) { acquired_mark_ = mark; }

  // Every operation on `lane`.
  void set_lane(cudaStream_t lane) { set_lanes(lane, nullptr, Half::produce, nullptr); }
  // Copy lanes (LaneHandover::copy_lanes): a stage's half on a kernel lane and a copy lane. In the produce
  // half the copy lane takes what goes to the peers (reclaim, every write into a window, publish)
  // and waits, through `hop`, for the kernels issued before each of those (what it sends); the kernel
  // lane never waits for it. In the finish half the copy lane takes the copy-in (acquire, fetch) and
  // the kernel lane waits for it before its next operation (what it reads), never the other way; what
  // a finish writes into a window (two-shot's reduced shard) and publishes stays on the kernel lane,
  // after the kernel that computed it.
  // So neither copy lane holds a copy behind a kernel that waits for its previous copy. Without a
  // copy lane every operation runs on `kernel`.
  enum class Half { produce, finish };
  void set_lanes(cudaStream_t kernel, cudaStream_t copy, Half half, cudaEvent_t hop) {
    kernel_lane_ = lane_ = kernel;
    copy_lane_ = copy;
    half_ = half;
    hop_ = hop;
    hop_pending_ = false;
  }
  // Ends a half on copy lanes: the lane where all of it is done (the produce half's copy lane, the
  // finish half's kernel lane, each after a last wait on the other), then current; the kernel lane
  // without a copy lane.
  ncclResult_t end_half(cudaStream_t* all_done);
  cudaStream_t lane() const { return lane_; }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  ncclDataType_t nccl_dtype() const;
  const quant::WireFormat& format() const { return format_; }
  quant::ElemType type() const { return type_; }
  size_t elem_size() const { return quant::elem_size(type_); }
  // Bytes this rank has sent so far (accounting).
  uint64_t wire_bytes() const { return wire_bytes_; }

  // --- codec: caller-dtype elements <-> wire chunks (quant/quant.hpp) ---------------------------
  // `sr_offset`: index of in[0] in the whole call (stochastic rounding must not depend on the
  // cut). With `residual` (count floats), error feedback: quantize in + residual, keep the new one.
  ncclResult_t quantize(const void* in, size_t count, void* wire, quant::Segmented layout, uint64_t sr_offset,
                        float* residual = nullptr);
  ncclResult_t dequantize(const void* wire, quant::Segmented layout, size_t count, void* out);
  // Sum of k wire chunks in order, in fp32, times `post` once, written as caller dtype or as one chunk.
  ncclResult_t reduce(const void* const* inputs, int k, size_t count, float post, quant::ReduceOutput out,
                      uint64_t sr_offset);
  // The same with a caller-dtype addend at position `plain_position` of the order.
  ncclResult_t reduce_with_plain(const void* const* inputs, int k, const void* plain, int plain_position,
                                 size_t count, float post, quant::ReduceOutput out, uint64_t sr_offset);
  // Device-to-device copy (the coalescing staging area), and zeroing (padding). cudaMemcpyDefault
  // for a copy into a host window (its mapped address), which CUDA resolves through unified addressing.
  ncclResult_t copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind = cudaMemcpyDeviceToDevice);
  // A copy of what the peers wrote, from a window into this rank's copy-in slots, which no produce
  // lane writes (sched/algorithms/direct.cpp, copy_engine): the one copy a produce gate lets through.
  ncclResult_t fetch(void* dst, const void* src, size_t bytes);
  ncclResult_t zero(void* dst, size_t bytes);
  // Sums in the caller's precision over `over`'s ranks (the hierarchical path inside a host).
  ncclResult_t reduce_scatter_plain(Transport& over, int nranks, const void* send, void* recv, size_t recvcount);
  ncclResult_t all_gather_plain(Transport& over, int nranks, const void* send, void* recv, size_t sendcount);

  // --- direct transport: the flag handshakes (transport/direct_windows.hpp), on the current lane -------------
  ncclResult_t reclaim(int set);
  ncclResult_t publish(int set, int phase);
  ncclResult_t acquire(int set, int phase);
  ncclResult_t release(int set);

  // --- wire --------------------------------------------------------------------------------------
  ncclResult_t exchange(std::span<const PeerSend> sends, std::span<const PeerRecv> recvs) {
    return exchange(*transport_, sends, recvs);
  }
  ncclResult_t exchange(Transport& over, std::span<const PeerSend> sends, std::span<const PeerRecv> recvs);
  ncclResult_t gather(char* base, size_t slot_bytes, GatherMethod how) {
    return gather(*transport_, nranks_, base, slot_bytes, how);
  }
  ncclResult_t gather(Transport& over, int nranks, char* base, size_t slot_bytes, GatherMethod how);

 private:
  // The launch options of a codec kernel that reads or writes `touched`, its first element
  // `sr_offset` of the call (use_direct: kept to the recipe's window_ctas where it touches a window).
  quant::LaunchOptions launch_for(std::initializer_list<const void*> touched, uint64_t sr_offset = 0) const {
    return launch_for(std::span<const void* const>(touched.begin(), touched.size()), sr_offset);
  }
  quant::LaunchOptions launch_for(std::span<const void* const> touched, uint64_t sr_offset = 0) const;
  ncclResult_t codec_result(cudaError_t err, const char* what) const;

  CommState* state_;
  const CodecApi* codec_;
  Transport* transport_;
  int rank_;
  int nranks_;
  quant::ElemType type_;
  quant::WireFormat format_;
  quant::LaunchOptions launch_;
  cudaStream_t lane_ = nullptr;
  uint64_t wire_bytes_ = 0;
  const DirectWindows* direct_ = nullptr;
  DirectRecipe recipe_;
  cudaEvent_t produce_gate_ = nullptr;
  cudaEvent_t send_gate_ = nullptr;
  cudaEvent_t acquired_mark_ = nullptr;
  ncclResult_t pass_send_gate(const void* written);  // when `written` is in a window (null: always)
  // Copy lanes: puts the next operation on its lane (the copy lane where `copy`), after the hop that
  // orders it (set_lanes). enter() then passes the produce gate there: every operation but acquire()
  // and fetch() enters so.
  ncclResult_t on_lane(bool copy);
  ncclResult_t enter(bool copy);
  bool writes_window(const void* p) const;  // `p` lies in a window of the direct transport
  cudaStream_t kernel_lane_ = nullptr;
  cudaStream_t copy_lane_ = nullptr;
  Half half_ = Half::produce;
  cudaEvent_t hop_ = nullptr;
  bool hop_pending_ = false;  // the lane the other waits for in this half ran an operation since it last did
  // Records the paced stage's mark on the current lane, if one is set (acquire).
  ncclResult_t record_acquired();
  // Waits for `gate` once, then clears it (the produce and send gates).
  ncclResult_t pass_gate(cudaEvent_t& gate, const char* what);
};

}  // namespace fp8wire::sched
