// The direct transports: FP8 slots in memory every rank of one machine loads and stores directly,
// so the codec kernels themselves move the data (a quantize stores into the peer-visible window, a
// fused reduce loads the peers' windows) and nothing is copied by NCCL in a separate phase.
//   peer_memory  each rank's window is device memory of its GPU, opened by the peers through CUDA
//                IPC and reached over NVLink or PCIe P2P;
//   host_memory  each rank's window is pinned host memory shared by the machine's processes, mapped
//                into every GPU (when P2P is off or absent: NCCL_P2P_DISABLE, containers).
// Both are set up once per communicator at its creation (sched/comm/comm_setup.cpp); the algorithms over
// them are in sched/algorithms/direct.cpp.
//
// Synchronisation. Every rank's flags live in a small host window of its own (for both kinds), and
// are waited on and written by stream memory operations (cuStreamWaitValue32 / WriteValue32):
//   - a waiting stream holds no SM, so ranks sharing one GPU never wait for a kernel that cannot be
//     scheduled (no kernel spins on a flag), and the job's compute runs beside a wait;
//   - no host synchronisation per call, and the operations are captured into CUDA graphs like any
//     stream work;
//   - the host can store into its own flags: an abort releases every wait this rank's lanes are in.
// The protocol, per buffer set s (direct.sets of them, 2 to 4, taken by pipeline stages in turn, and
// calls reuse them), with flags owned by the rank that waits on them:
//   ready[s][p][j] in rank r's page = 1: rank j has written what r reads in phase p of set s (a phase
//                                         is one "writers write, readers read" step: one-shot has one,
//                                         two-shot two: the shards, then the reduced shards);
//   free[s][j]     in rank r's page = 1: rank j has finished every read of set s, in every window,
//                                         of the last stage that used it.
//   before a stage's first write into set s (of any window): reclaim s (wait free == 1 from every
//   peer, reset to 0); after each phase's writes: publish (ready = 1 at every peer); before its reads:
//   acquire (wait ready == 1 from every peer, reset to 0); after the stage's last read of set s:
//   release s (free = 1 at every peer).
// A whole set is reclaimed, not one region, because stages of other lengths and other collectives lay
// the set out differently: a write anywhere in it must follow every earlier read anywhere in it.
// Initially ready = 0 and free = 1. A flag is set again only after its waiter has reset it (the
// setter's next signal needs, through the other handshake, a signal the waiter sends after its reset,
// in stream order), so a flag never carries two signals (no ABA); and after each call every flag is
// back in its initial state, so a CUDA graph replays the same operations correctly.
//
// Liveness. A peer that has gone (destroyed or aborted its communicator, or whose process ended) is an
// error only for an operation of this rank that waits on it. Such a wait comes with this rank's
// reclaim of the stage's set, which clears free[s][j]: after it, or (a transfer lane's acquire at the
// produce gate, or the fetch lane's with copy lanes: sched/plan/recipe.hpp) beside it, the lane that reclaims
// (produce, or with copy lanes send) reaching that reclaim without waiting on the peer, whose release
// of the set's previous stage came with every signal it owed for that stage: before its reclaim it
// waits only on detected free flags, on this rank's own events, and on an acquire of an earlier
// stage (paced sends).
// The peer sets free[s][j] again only with the last step of its part of the stage, after every
// signal it owes this rank for it. So "free[s][j] == 0 for some set while peer j is gone" is, from
// the moment the reclaim has run, exactly "this rank waits, or will wait, on a signal that cannot
// come": no timer and no query of the lanes, and it holds for graph replays too. "Gone" is
// the peer's `closed` mark (stored when its transport is torn down, after its lanes drained) or the
// platform's answer that the peer no longer holds its flag page (DirectMemoryApi::owner_gone: a lock
// the kernel drops when the process ends, whatever its PID namespace, unlike a pid probe).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sched/platform/platform.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

inline constexpr int kDirectMaxSets = 4;   // buffer sets of a window, at most (direct.sets)
inline constexpr int kDirectPhases = 2;    // data handshakes per stage: two-shot has two (shards, reduced shards)
inline constexpr int kDirectMaxRanks = 16; // ranks of one machine (quant::kMaxReduceInputs)

// Bytes of one buffer set of a window of `window_bytes` cut into `sets`: sets start 256-byte aligned
// (the codec wants 16).
inline size_t direct_set_bytes_of(size_t window_bytes, int sets) {
  return window_bytes / static_cast<size_t>(sets) / 256 * 256;
}

// One rank's flags (its host window's contents).
struct DirectFlags {
  uint32_t ready[kDirectMaxSets][kDirectPhases][kDirectMaxRanks];
  uint32_t free[kDirectMaxSets][kDirectMaxRanks];
  // 1 once the owner tore its transport down in order (its lanes idle, every release written): it
  // will read no peer's window again. Written by the owner's host, read by the peers' hosts.
  uint32_t closed;
};
// The flags' initial state: nothing written yet, everything free.
void init_flags(DirectFlags& f);

// One rank's view of the communicator's windows.
struct DirectPeer {
  Window flags;   // the rank's flag page (a host window)
  Window data;    // the rank's data window: `sets` buffer sets
};

class DirectWindows {
 public:
  // `peers[r]` is rank r's windows as this process maps them (its own at `rank`, created here; the
  // others opened), each cut into `sets` buffer sets (2..kDirectMaxSets). Takes ownership: the
  // destructor closes the peers' and destroys its own.
  DirectWindows(const Platform& platform, Carrier kind, int rank, int nranks, int sets, std::vector<DirectPeer> peers);
  ~DirectWindows();
  DirectWindows(const DirectWindows&) = delete;
  DirectWindows& operator=(const DirectWindows&) = delete;

  Carrier kind() const { return kind_; }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int sets() const { return sets_; }
  size_t set_bytes() const { return set_bytes_; }
  // The most ranks of the communicator on one GPU (1 where each has its own or the GPUs are unknown):
  // above 1 they share that GPU's host link (ranks emulated on one GPU). The same on every rank.
  int ranks_per_gpu() const { return ranks_per_gpu_; }
  void set_ranks_per_gpu(int ranks) { ranks_per_gpu_ = ranks; }
  // Buffer set `set` of rank `r`'s data window, as this process's GPU work addresses it.
  char* window(int r, int set) const;
  // Whether `p` lies in any rank's data window (as this process addresses them).
  bool in_a_window(const void* p) const;

  // The protocol's four steps (above), as stream memory operations on `lane`.
  ncclResult_t reclaim(cudaStream_t lane, int set) const;
  ncclResult_t publish(cudaStream_t lane, int set, int phase) const;
  ncclResult_t acquire(cudaStream_t lane, int set, int phase) const;
  ncclResult_t release(cudaStream_t lane, int set) const;

  // Abort: host stores that satisfy every wait this rank's lanes are in or will reach.
  void release_waits() const;
  // Whether peer `j` has gone: closed its transport in order, or no longer holds its flag page.
  bool peer_gone(int j) const;
  // The peer an operation of this rank waits on, or will wait on, although it has gone (above,
  // "Liveness"); -1 when there is none. Cheap when all is well: one load per peer and set.
  int waits_on_gone_peer() const;
  // Waits (host) until every peer has released what this rank wrote (its free flags back to the
  // initial state) or closed in order, so that its windows can go; false when a peer that ended
  // without releasing may still have been reading, `give_up` says so first, or 30 s pass.
  bool wait_peers_done(const std::atomic<bool>& give_up) const;
  // Before the windows are freed: waits until `lanes` are idle. A lane stuck in a wait that can no
  // longer be satisfied (it waits on a gone peer, or `aborting`) is released by release_waits. The
  // peer it released a wait on (-1: none, or an abort's release): the call that waited then completes
  // on window data that peer never wrote, so its result is void and the caller must report an error.
  int drain(const cudaStream_t* lanes, int count, const std::atomic<bool>& aborting) const;
  // This rank's flags that are not in their initial state, and each peer's close mark and hold, as
  // one line for a stalled job's diagnosis (Engine::debug_state).
  std::string describe() const;
  // The orderly-close mark (DirectFlags::closed) in this rank's page; the destructor stores it too.
  void mark_closed() const;
  // When a peer may still read this rank's device window (it did not release it before an abort or
  // its death): the window is left allocated until the process ends rather than freed under a peer's
  // kernel (which would fault that peer's CUDA context). Host windows live on in the peers' mappings.
  void keep_own_window() { keep_own_window_ = true; }

 private:
  DirectFlags* flags_device(int r) const { return reinterpret_cast<DirectFlags*>(peers_[static_cast<size_t>(r)].flags.device); }
  DirectFlags* flags_host() const { return flags_host(rank_); }
  DirectFlags* flags_host(int r) const { return reinterpret_cast<DirectFlags*>(peers_[static_cast<size_t>(r)].flags.host); }
  // Whether peer j has not yet released some set of this rank's (a free flag of this rank's page at 0).
  bool holds_a_set(int j) const;
  ncclResult_t op(cudaError_t err, const char* what) const;
  // Every wait of the protocol: until `flag` is 1 on `lane`, then back to 0 (its waiter resets it).
  ncclResult_t take(cudaStream_t lane, uint32_t* flag, const char* waiting, const char* resetting) const;

  const Platform* platform_;
  Carrier kind_;
  int rank_;
  int nranks_;
  int sets_;
  size_t set_bytes_ = 0;
  int ranks_per_gpu_ = 1;
  bool keep_own_window_ = false;
  std::vector<DirectPeer> peers_;
};

// Which window kind carries a transport.
inline WindowKind window_kind(Carrier t) {
  return t == Carrier::peer_memory ? WindowKind::device : WindowKind::host;
}

}  // namespace fp8wire::sched
