#include "sched/transport/direct_windows.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "common/log.hpp"
#include "common/status.hpp"

namespace fp8wire::sched {

void init_flags(DirectFlags& f) {
  for (auto& set : f.ready)
    for (auto& phase : set)
      for (uint32_t& w : phase) __atomic_store_n(&w, 0u, __ATOMIC_RELAXED);
  for (auto& set : f.free)
    for (uint32_t& w : set) __atomic_store_n(&w, 1u, __ATOMIC_RELAXED);
  __atomic_store_n(&f.closed, 0u, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

DirectWindows::DirectWindows(const Platform& platform, Carrier kind, int rank, int nranks, int sets,
                             std::vector<DirectPeer> peers)
    : platform_(&platform), kind_(kind), rank_(rank), nranks_(nranks),
      sets_(std::clamp(sets, 2, kDirectMaxSets)), peers_(std::move(peers)) {
  set_bytes_ = direct_set_bytes_of(peers_[static_cast<size_t>(rank_)].data.bytes, sets_);
}

DirectWindows::~DirectWindows() {
  // Before the flag page goes (and with it the lock the peers ask about): a peer that still looks
  // at it sees an orderly close, not a death.
  mark_closed();
  const DirectMemoryApi& m = platform_->direct;
  for (int r = 0; r < nranks_; ++r) {
    DirectPeer& p = peers_[static_cast<size_t>(r)];
    if (r == rank_) {
      if (!m.destroy) continue;
      if (keep_own_window_ && kind_ == Carrier::peer_memory)
        FP8WIRE_WARN("direct transport, rank {}: its window stays allocated until the process ends (a peer may "
                     "still read it)", rank_);
      else
        m.destroy(p.data);
      m.destroy(p.flags);
    } else {
      if (m.close) m.close(p.data), m.close(p.flags);
    }
  }
}

char* DirectWindows::window(int r, int set) const {
  return peers_[static_cast<size_t>(r)].data.device + static_cast<size_t>(set) * set_bytes_;
}

bool DirectWindows::in_a_window(const void* p) const {
  const auto* c = static_cast<const char*>(p);
  for (int r = 0; r < nranks_; ++r)
    if (c >= window(r, 0) && c < window(r, 0) + static_cast<size_t>(sets_) * set_bytes_) return true;
  return false;
}

ncclResult_t DirectWindows::op(cudaError_t err, const char* what) const {
  if (err == cudaSuccess) return ncclSuccess;
  FP8WIRE_ERROR("direct transport ({}), rank {}: {} failed: {}", to_string(kind_), rank_, what,
                platform_->cuda.GetErrorString(err));
  return ncclUnhandledCudaError;
}

ncclResult_t DirectWindows::take(cudaStream_t lane, uint32_t* flag, const char* waiting, const char* resetting) const {
  const CudaApi& c = platform_->cuda;
  if (const ncclResult_t r = op(c.StreamWaitValue32(lane, flag, 1), waiting); r != ncclSuccess) return r;
  return op(c.StreamWriteValue32(lane, flag, 0), resetting);
}

ncclResult_t DirectWindows::reclaim(cudaStream_t lane, int set) const {
  DirectFlags* mine = flags_device(rank_);
  for (int j = 0; j < nranks_; ++j) {
    if (j == rank_) continue;
    FP8WIRE_TRY(take(lane, &mine->free[set][j], "waiting for a peer to release a buffer set", "resetting a release flag"));
  }
  return ncclSuccess;
}

ncclResult_t DirectWindows::publish(cudaStream_t lane, int set, int phase) const {
  for (int j = 0; j < nranks_; ++j)
    if (j != rank_)
      FP8WIRE_TRY(op(platform_->cuda.StreamWriteValue32(lane, &flags_device(j)->ready[set][phase][rank_], 1),
                     "signalling written data to a peer"));
  return ncclSuccess;
}

ncclResult_t DirectWindows::acquire(cudaStream_t lane, int set, int phase) const {
  for (int j = 0; j < nranks_; ++j)
    if (j != rank_)
      FP8WIRE_TRY(take(lane, &flags_device(rank_)->ready[set][phase][j], "waiting for a peer's data",
                       "resetting a ready flag"));
  return ncclSuccess;
}

ncclResult_t DirectWindows::release(cudaStream_t lane, int set) const {
  const CudaApi& c = platform_->cuda;
  for (int j = 0; j < nranks_; ++j) {
    if (j == rank_) continue;
    if (const ncclResult_t r = op(c.StreamWriteValue32(lane, &flags_device(j)->free[set][rank_], 1),
                                  "releasing a peer's buffer set");
        r != ncclSuccess)
      return r;
  }
  return ncclSuccess;
}

void DirectWindows::release_waits() const {
  DirectFlags* f = flags_host();
  if (!f) return;
  for (int s = 0; s < kDirectMaxSets; ++s)
    for (int j = 0; j < nranks_; ++j) {
      for (int p = 0; p < kDirectPhases; ++p) __atomic_store_n(&f->ready[s][p][j], 1u, __ATOMIC_RELAXED);
      __atomic_store_n(&f->free[s][j], 1u, __ATOMIC_RELAXED);
    }
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

void DirectWindows::mark_closed() const {
  if (DirectFlags* f = flags_host()) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  // after every flag this rank's host stored
    __atomic_store_n(&f->closed, 1u, __ATOMIC_RELEASE);
  }
}

bool DirectWindows::peer_gone(int j) const {
  if (j == rank_ || j < 0 || j >= nranks_) return false;
  const DirectFlags* f = flags_host(j);
  if (f && __atomic_load_n(&f->closed, __ATOMIC_ACQUIRE) == 1u) return true;
  const DirectMemoryApi& m = platform_->direct;
  return m.owner_gone && m.owner_gone(peers_[static_cast<size_t>(j)].flags);
}

bool DirectWindows::holds_a_set(int j) const {
  const DirectFlags* f = flags_host();
  if (!f) return false;
  for (int s = 0; s < kDirectMaxSets; ++s)
    if (__atomic_load_n(&f->free[s][j], __ATOMIC_ACQUIRE) != 1u) return true;
  return false;
}

int DirectWindows::waits_on_gone_peer() const {
  for (int j = 0; j < nranks_; ++j)
    if (j != rank_ && holds_a_set(j) && peer_gone(j)) {
      // The flag may have been set between the two loads (the peer released, then closed): a second
      // look after "gone" is final, since a gone peer writes nothing more.
      if (holds_a_set(j)) return j;
    }
  return -1;
}

bool DirectWindows::wait_peers_done(const std::atomic<bool>& give_up) const {
  const DirectFlags* f = flags_host();
  if (!f) return true;
  auto pause = std::chrono::microseconds(1);
  // A peer that never runs its side (the application destroyed the communicator out of step) must
  // not hold this rank forever: past this, the window is kept instead (keep_own_window).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    bool done = true;
    for (int j = 0; j < nranks_ && done; ++j) {
      if (j == rank_ || !holds_a_set(j)) continue;
      // A peer that closed in order has drained its lanes: it reads nothing of this rank's any more.
      // One that ended without releasing may have been reading when it went: keep the window.
      if (const DirectFlags* p = flags_host(j); p && __atomic_load_n(&p->closed, __ATOMIC_ACQUIRE) == 1u) continue;
      if (peer_gone(j)) {
        FP8WIRE_WARN("direct transport, rank {}: rank {} ended while it still held a buffer set of this rank's", rank_, j);
        return false;
      }
      done = false;
    }
    if (done) return true;
    if (give_up.load(std::memory_order_acquire)) return false;
    if (std::chrono::steady_clock::now() > deadline) {
      FP8WIRE_WARN("direct transport, rank {}: a peer has not finished reading this rank's window after 30 s", rank_);
      return false;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
  }
}

int DirectWindows::drain(const cudaStream_t* lanes, int count, const std::atomic<bool>& aborting) const {
  const CudaApi& c = platform_->cuda;
  auto pause = std::chrono::microseconds(1);
  int released_on = -1;
  bool released = false;
  for (;;) {
    bool idle = true;
    for (int i = 0; i < count; ++i)
      if (lanes[i] && c.StreamQuery(lanes[i]) == cudaErrorNotReady) idle = false;
    if (idle) return released_on;
    const bool abort = aborting.load(std::memory_order_acquire);
    const int gone = abort ? -1 : waits_on_gone_peer();
    if (abort || gone >= 0) {
      if (!released) {
        if (abort)
          FP8WIRE_WARN("direct transport, rank {}: releasing this rank's waits (abort)", rank_);
        else
          FP8WIRE_ERROR("direct transport, rank {}: an FP8 call waits on rank {}, which has gone: its waits are "
                        "released so that the lanes can end, and its result is not valid", rank_, gone);
        released_on = gone;
      }
      released = true;
      release_waits();
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
  }
}

std::string DirectWindows::describe() const {
  std::string out = fmt::format("direct {} rank {} of {}, {} sets:", to_string(kind_), rank_, nranks_, sets_);
  const DirectFlags* f = flags_host();
  if (!f) return out + " no flag page";
  auto load = [](const uint32_t& w) { return __atomic_load_n(&w, __ATOMIC_ACQUIRE); };
  // Only what differs from the initial state (ready 0, free 1, handed 0, drained 1): a flag the lanes
  // wait on, or a signal not yet taken.
  std::string odd;
  for (int s = 0; s < sets_; ++s)
    for (int j = 0; j < nranks_; ++j) {
      if (j == rank_) continue;
      for (int p = 0; p < kDirectPhases; ++p)
        if (load(f->ready[s][p][j]) != 0) odd += fmt::format(" ready[{}][{}][{}]={}", s, p, j, load(f->ready[s][p][j]));
      if (load(f->free[s][j]) != 1) odd += fmt::format(" free[{}][{}]={}", s, j, load(f->free[s][j]));
    }
  out += odd.empty() ? " flags initial (no stage in flight)" : " flags" + odd;
  for (int j = 0; j < nranks_; ++j) {
    if (j == rank_) continue;
    const DirectFlags* p = flags_host(j);
    const bool closed = p && load(p->closed) == 1;
    out += fmt::format("; rank {} {}", j, closed ? "closed" : peer_gone(j) ? "gone" : "holds its page");
  }
  return out;
}

}  // namespace fp8wire::sched
