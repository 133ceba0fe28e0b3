#include "sched/exec/stage_ops.hpp"

#include <array>
#include <utility>

#include "common/log.hpp"
#include "common/status.hpp"
#include "sched/transport/direct_windows.hpp"

namespace fp8wire::sched {

ncclResult_t StageOps::codec_result(cudaError_t err, const char* what) const {
  if (err == cudaSuccess) return ncclSuccess;
  FP8WIRE_ERROR("comm {}: {} launch failed: {}", state_->id, what, state_->platform->cuda.GetErrorString(err));
  return ncclUnhandledCudaError;
}

quant::LaunchOptions StageOps::launch_for(std::span<const void* const> touched, uint64_t sr_offset) const {
  quant::LaunchOptions o = launch_;
  o.sr_offset = sr_offset;
  if (direct_)
    for (const void* p : touched)
      if (p && direct_->in_a_window(p)) o.max_ctas = recipe_.window_ctas;
  return o;
}

ncclResult_t StageOps::quantize(const void* in, size_t count, void* wire, quant::Segmented layout,
                                uint64_t sr_offset, float* residual) {
  FP8WIRE_TRY(enter(half_ == Half::produce && writes_window(wire)));
  FP8WIRE_TRY(pass_send_gate(wire));
  const quant::LaunchOptions o = launch_for({in, wire}, sr_offset);
  if (residual)
    return codec_result(codec_->quantize_with_residual(in, type_, count, residual, wire, layout, format_, lane_, o),
                        "quantize (error feedback)");
  return codec_result(codec_->quantize(in, type_, count, wire, layout, format_, lane_, o), "quantize");
}

ncclResult_t StageOps::dequantize(const void* wire, quant::Segmented layout, size_t count, void* out) {
  FP8WIRE_TRY(enter(false));
  return codec_result(codec_->dequantize(wire, layout, count, out, type_, format_, lane_, launch_for({wire, out})),
                      "dequantize");
}

namespace {
// The operands of a dequantize-reduce: its k inputs, a plain addend, its output.
std::array<const void*, quant::kMaxReduceInputs + 2> reduce_operands(const void* const* inputs, int k,
                                                                    const void* plain, const quant::ReduceOutput& out) {
  std::array<const void*, quant::kMaxReduceInputs + 2> ops{};
  for (int i = 0; i < k && i < quant::kMaxReduceInputs; ++i) ops[static_cast<size_t>(i)] = inputs[i];
  ops[quant::kMaxReduceInputs] = plain;
  ops[quant::kMaxReduceInputs + 1] = out.plain ? out.plain : out.wire;
  return ops;
}
}  // namespace

ncclResult_t StageOps::reduce(const void* const* inputs, int k, size_t count, float post, quant::ReduceOutput out,
                              uint64_t sr_offset) {
  FP8WIRE_TRY(enter(false));
  const auto operands = reduce_operands(inputs, k, nullptr, out);
  return codec_result(
      codec_->dequantize_reduce(inputs, k, count, post, out, format_, lane_, launch_for(operands, sr_offset)),
      "dequantize-reduce");
}

ncclResult_t StageOps::reduce_with_plain(const void* const* inputs, int k, const void* plain, int plain_position,
                                         size_t count, float post, quant::ReduceOutput out, uint64_t sr_offset) {
  FP8WIRE_TRY(enter(false));
  const auto operands = reduce_operands(inputs, k, plain, out);
  return codec_result(codec_->dequantize_reduce_mixed(inputs, k, plain, type_, plain_position, count, post, out,
                                                      format_, lane_, launch_for(operands, sr_offset)),
                      "dequantize-reduce (with a plain addend)");
}

ncclResult_t StageOps::copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  FP8WIRE_TRY(enter(half_ == Half::produce && writes_window(dst)));
  FP8WIRE_TRY(pass_send_gate(dst));
  if (!bytes) return ncclSuccess;
  const cudaError_t err = state_->platform->cuda.MemcpyAsync(dst, src, bytes, kind, lane_);
  return codec_result(err, "staging copy");
}

ncclResult_t StageOps::zero(void* dst, size_t bytes) {
  FP8WIRE_TRY(enter(false));
  if (!bytes) return ncclSuccess;
  return codec_result(state_->platform->cuda.MemsetAsync(dst, 0, bytes, lane_), "zeroing");
}

ncclDataType_t StageOps::nccl_dtype() const {
  return type_ == quant::ElemType::f32 ? ncclFloat32 : type_ == quant::ElemType::f16 ? ncclFloat16 : ncclBfloat16;
}

ncclResult_t StageOps::reduce_scatter_plain(Transport& over, int nranks, const void* send, void* recv,
                                            size_t recvcount) {
  FP8WIRE_TRY(enter(false));
  const ncclResult_t res = over.reduce_scatter_plain(send, recv, recvcount, nccl_dtype(), lane_);
  if (res == ncclSuccess) wire_bytes_ += recvcount * elem_size() * static_cast<uint64_t>(nranks - 1);
  return res;
}

ncclResult_t StageOps::all_gather_plain(Transport& over, int nranks, const void* send, void* recv, size_t sendcount) {
  FP8WIRE_TRY(enter(false));
  const ncclResult_t res = over.all_gather_plain(send, recv, sendcount, nccl_dtype(), lane_);
  if (res == ncclSuccess) wire_bytes_ += sendcount * elem_size() * static_cast<uint64_t>(nranks - 1);
  return res;
}

ncclResult_t StageOps::exchange(Transport& over, std::span<const PeerSend> sends, std::span<const PeerRecv> recvs) {
  FP8WIRE_TRY(enter(false));
  const ncclResult_t res = over.exchange(sends, recvs, lane_);
  if (res == ncclSuccess)
    for (const PeerSend& s : sends) wire_bytes_ += s.bytes;
  return res;
}

ncclResult_t StageOps::gather(Transport& over, int nranks, char* base, size_t slot_bytes, GatherMethod how) {
  FP8WIRE_TRY(enter(false));
  const ncclResult_t res = over.gather(base, slot_bytes, how, lane_);
  if (res == ncclSuccess) wire_bytes_ += slot_bytes * static_cast<uint64_t>(nranks - 1);
  return res;
}

bool StageOps::writes_window(const void* p) const { return direct_ && direct_->in_a_window(p); }

ncclResult_t StageOps::on_lane(bool copy) {
  if (!copy_lane_) return ncclSuccess;
  // The lane the other one waits for in this half: the kernel lane in the produce half (the sends
  // follow its kernels), the copy lane in the finish half (the kernels follow its copy-in).
  const bool on_waited = copy == (half_ == Half::finish);
  if (!on_waited && hop_pending_) {
    const cudaStream_t from = copy ? kernel_lane_ : copy_lane_, to = copy ? copy_lane_ : kernel_lane_;
    const CudaApi& cuda = state_->platform->cuda;
    cudaError_t err = cuda.EventRecord(hop_, from);
    if (err == cudaSuccess) err = cuda.StreamWaitEvent(to, hop_, 0);
    FP8WIRE_TRY(codec_result(err, copy ? "handing a stage's sends to the send lane"
                                       : "handing a stage's copy-in to the transfer lane"));
  }
  hop_pending_ = on_waited;
  lane_ = copy ? copy_lane_ : kernel_lane_;
  return ncclSuccess;
}

ncclResult_t StageOps::enter(bool copy) {
  FP8WIRE_TRY(on_lane(copy));
  return pass_produce_gate();
}

ncclResult_t StageOps::end_half(cudaStream_t* all_done) {
  // The produce half ends on its copy lane (after its publish), the finish half on its kernel lane,
  // each waiting for the other lane's operations since they last met.
  if (copy_lane_) FP8WIRE_TRY(on_lane(half_ == Half::produce));
  *all_done = lane_;
  return ncclSuccess;
}

ncclResult_t StageOps::pass_gate(cudaEvent_t& gate, const char* what) {
  if (!gate) return ncclSuccess;
  return codec_result(state_->platform->cuda.StreamWaitEvent(lane_, std::exchange(gate, nullptr), 0), what);
}

ncclResult_t StageOps::pass_produce_gate() { return pass_gate(produce_gate_, "waiting for the stage's produce"); }

ncclResult_t StageOps::pass_send_gate(const void* written) {
  if (written && !writes_window(written)) return ncclSuccess;
  return pass_gate(send_gate_, "waiting for the peers' previous stage (paced sends)");
}

ncclResult_t StageOps::fetch(void* dst, const void* src, size_t bytes) {
  FP8WIRE_TRY(on_lane(half_ == Half::finish));
  if (!bytes) return ncclSuccess;
  return codec_result(state_->platform->cuda.MemcpyAsync(dst, src, bytes, cudaMemcpyDefault, lane_), "copy-in");
}

ncclResult_t StageOps::reclaim(int set) {
  FP8WIRE_TRY(enter(half_ == Half::produce));
  return direct_->reclaim(lane_, set);
}
ncclResult_t StageOps::publish(int set, int phase) {
  FP8WIRE_TRY(enter(half_ == Half::produce));
  FP8WIRE_TRY(pass_send_gate(nullptr));
  return direct_->publish(lane_, set, phase);
}
ncclResult_t StageOps::acquire(int set, int phase) {
  FP8WIRE_TRY(on_lane(half_ == Half::finish));
  FP8WIRE_TRY(direct_->acquire(lane_, set, phase));
  return record_acquired();
}
ncclResult_t StageOps::record_acquired() {
  if (!acquired_mark_) return ncclSuccess;
  const cudaEvent_t mark = std::exchange(acquired_mark_, nullptr);
  return codec_result(state_->platform->cuda.EventRecord(mark, lane_), "marking a stage's peers published");
}
ncclResult_t StageOps::release(int set) {
  FP8WIRE_TRY(enter(false));
  return direct_->release(lane_, set);
}

}  // namespace fp8wire::sched
