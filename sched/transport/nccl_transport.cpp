#include "common/log.hpp"
#include "common/status.hpp"
#include "sched/transport/transport.hpp"

namespace fp8wire::sched {

ncclResult_t NcclTransport::exchange(std::span<const PeerSend> sends, std::span<const PeerRecv> recvs,
                                     cudaStream_t stream) {
  FP8WIRE_NCCL_CHECK(api_->GroupStart());
  ncclResult_t first = ncclSuccess;
  auto note = [&first](ncclResult_t r) {
    if (nccl_ok(first) && !nccl_ok(r)) first = r;
  };
  for (const PeerSend& s : sends)
    if (s.bytes) note(api_->Send(s.data, s.bytes, ncclUint8, s.peer, comm_, stream));
  for (const PeerRecv& r : recvs)
    if (r.bytes) note(api_->Recv(r.data, r.bytes, ncclUint8, r.peer, comm_, stream));
  const ncclResult_t end = api_->GroupEnd();
  if (!nccl_ok(first)) {
    FP8WIRE_ERROR("NCCL error {} posting a send/recv round ({} sends, {} receives)", static_cast<int>(first),
                  sends.size(), recvs.size());
    return first;
  }
  FP8WIRE_NCCL_CHECK(end);
  return ncclSuccess;
}

ncclResult_t NcclTransport::gather(char* base, size_t slot_bytes, GatherMethod how, cudaStream_t stream) {
  if (how != GatherMethod::sendrecv) {
    FP8WIRE_NCCL_CHECK(api_->AllGather(base + static_cast<size_t>(rank_) * slot_bytes, base, slot_bytes,
                                       ncclUint8, comm_, stream));
    return ncclSuccess;
  }
  const PeerRound round(rank_, nranks_, base + static_cast<size_t>(rank_) * slot_bytes, 0, base, slot_bytes);
  return exchange(round.sends(), round.recvs(), stream);
}

ncclResult_t NcclTransport::reduce_scatter_plain(const void* send, void* recv, size_t recvcount, ncclDataType_t dtype,
                                                cudaStream_t stream) {
  FP8WIRE_NCCL_CHECK(api_->ReduceScatter(send, recv, recvcount, dtype, ncclSum, comm_, stream));
  return ncclSuccess;
}

ncclResult_t NcclTransport::all_gather_plain(const void* send, void* recv, size_t sendcount, ncclDataType_t dtype,
                                            cudaStream_t stream) {
  FP8WIRE_NCCL_CHECK(api_->AllGather(send, recv, sendcount, dtype, comm_, stream));
  return ncclSuccess;
}

}  // namespace fp8wire::sched
