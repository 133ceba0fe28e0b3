// What a stage program asks of the wire: one round of point-to-point transfers, and the gather step
// that gives every rank every rank's slot. Algorithms issue only these and codec launches, so the
// same program runs over NCCL (NcclTransport, below), over memory peers load and store directly, and
// over the simulated transport of the CPU tier.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <cstddef>
#include <span>

#include "common/config.hpp"
#include "quant/wire_format.hpp"
#include "sched/platform/nccl_api.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

struct PeerSend {
  const void* data = nullptr;
  size_t bytes = 0;
  int peer = 0;
};
struct PeerRecv {
  void* data = nullptr;
  size_t bytes = 0;
  int peer = 0;
};

// The lists of one round with every other rank (peer j, j != rank): `bytes` from
// `send + j * send_stride` to peer j (a stride of 0 sends the same bytes to every peer), and `bytes`
// from peer j into slot j of `recv` (`recv + j * bytes`).
class PeerRound {
 public:
  PeerRound(int rank, int nranks, const char* send, size_t send_stride, char* recv, size_t bytes) {
    for (int j = 0; j < nranks; ++j) {
      if (j == rank) continue;
      sends_[count_] = {send + static_cast<size_t>(j) * send_stride, bytes, j};
      recvs_[count_] = {recv + static_cast<size_t>(j) * bytes, bytes, j};
      ++count_;
    }
  }
  std::span<const PeerSend> sends() const { return {sends_.data(), count_}; }
  std::span<const PeerRecv> recvs() const { return {recvs_.data(), count_}; }

 private:
  std::array<PeerSend, quant::kMaxReduceInputs> sends_;
  std::array<PeerRecv, quant::kMaxReduceInputs> recvs_;
  size_t count_ = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual Carrier kind() const = 0;
  // One round of point-to-point transfers on `stream`, all posted together so that none waits for
  // another. Zero-byte entries are skipped.
  virtual ncclResult_t exchange(std::span<const PeerSend> sends, std::span<const PeerRecv> recvs,
                                cudaStream_t stream) = 0;
  // The gather step: rank r's slot (base + r * slot_bytes) into slot r of every rank's buffer.
  virtual ncclResult_t gather(char* base, size_t slot_bytes, GatherMethod how, cudaStream_t stream) = 0;
  // Collectives in the caller's precision (the hierarchical path's steps inside a host): a sum.
  virtual ncclResult_t reduce_scatter_plain(const void* send, void* recv, size_t recvcount, ncclDataType_t dtype,
                                            cudaStream_t stream) = 0;
  virtual ncclResult_t all_gather_plain(const void* send, void* recv, size_t sendcount, ncclDataType_t dtype,
                                        cudaStream_t stream) = 0;
};

// NCCL's own transports, through the real-NCCL table (never through fp8wire's exported symbols).
class NcclTransport final : public Transport {
 public:
  NcclTransport(const NcclApi& api, ncclComm_t comm, int rank, int nranks)
      : api_(&api), comm_(comm), rank_(rank), nranks_(nranks) {}
  Carrier kind() const override { return Carrier::nccl; }
  // Grouped ncclSend/ncclRecv. The group is always closed, also when a Send or Recv fails: the
  // application's thread must not be left inside an open NCCL group (its later calls would be
  // swallowed into it).
  ncclResult_t exchange(std::span<const PeerSend> sends, std::span<const PeerRecv> recvs,
                        cudaStream_t stream) override;
  // ncclAllGather in place, or the same slots by grouped send/recv to every peer (one step deep
  // instead of a ring of n-1, and NCCL's point-to-point channels).
  ncclResult_t gather(char* base, size_t slot_bytes, GatherMethod how, cudaStream_t stream) override;
  ncclResult_t reduce_scatter_plain(const void* send, void* recv, size_t recvcount, ncclDataType_t dtype,
                                    cudaStream_t stream) override;
  ncclResult_t all_gather_plain(const void* send, void* recv, size_t sendcount, ncclDataType_t dtype,
                                cudaStream_t stream) override;
  ncclComm_t comm() const { return comm_; }

 private:
  const NcclApi* api_;
  ncclComm_t comm_;
  int rank_;
  int nranks_;
};

}  // namespace fp8wire::sched
