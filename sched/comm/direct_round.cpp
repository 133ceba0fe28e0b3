// The direct windows' round of the agreement (rounds.hpp): each rank creates a flag page and a data
// window, the ranks exchange the handles, open each other's windows and confirm on every rank; then
// the names are unlinked (nothing is left behind when a process dies). A rank that could not create
// its windows says so in its offer, and why, so that every rank goes on over NCCL alike and one of
// them tells the user what to change.
#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "common/status.hpp"
#include "sched/comm/exchange.hpp"
#include "sched/comm/rounds.hpp"
#include "sched/plan/route.hpp"
#include "sched/transport/direct_windows.hpp"

namespace fp8wire::sched {

namespace {

// What one rank offers: its flag page and data window, by handle, and which GPU it runs on.
struct DirectOffer {
  uint32_t ok = 0;
  // 1: this rank could not reserve a host window's memory (DirectMemoryApi::create: no room in the
  // shared-memory file system, /dev/shm). Also makes the handles start 8-byte aligned.
  uint32_t no_room = 0;
  WindowHandle flags;
  WindowHandle data;
  uint64_t gpu = 0;  // HostFacts::gpu_hash (0: unknown)
};
static_assert(sizeof(DirectOffer) == 8 + 2 * sizeof(WindowHandle) + 8, "DirectOffer travels as raw bytes: no padding");

// The most offers naming one GPU (1 when none is known twice): every rank computes it from the same
// offers, so every rank cuts a direct call alike (CostModel::direct_shared_max_stages).
int ranks_per_gpu(std::span<const DirectOffer> offers) {
  int most = 1;
  for (const DirectOffer& a : offers) {
    if (!a.gpu) continue;
    int same = 0;
    for (const DirectOffer& b : offers) same += b.gpu == a.gpu ? 1 : 0;
    most = std::max(most, same);
  }
  return most;
}

// The one warning a communicator's failed host windows are worth, from its rank 0 (every rank read the
// same offers) and once per process: a /dev/shm too small for the windows is a container's default
// (Docker gives 64 MiB) that the user can change. True when some rank found no room.
bool warn_no_room(const CommState& s, const Config& config, std::span<const DirectOffer> offers) {
  std::string ranks;
  for (size_t r = 0; r < offers.size(); ++r)
    if (offers[r].no_room) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (ranks.empty()) return false;
  if (s.rank != 0) {
    FP8WIRE_INFO("comm {}: rank(s) {} found no room for their host windows in /dev/shm", s.id, ranks);
    return true;
  }
  FP8WIRE_WARN_ONCE("comm {}: the direct transport over host memory needs {} of shared memory per rank "
                    "(direct.window_bytes) and rank(s) {} found no room for it in /dev/shm: FP8 goes over NCCL's "
                    "transports on every rank. Give the job more shared memory (docker run --shm-size=1g, or "
                    "--ipc=host to use the host's) or lower direct.window_bytes",
                    s.id, format_size(config.direct_window_bytes + sizeof(DirectFlags)), ranks);
  return true;
}

// Undoes what one attempt made: this rank's windows destroyed, the peers' closed. After an exchange
// given up on while it runs on the transfer lane (NCCL waiting there for a rank that was killed or
// stopped), unregistering host memory or freeing device memory would wait for it, forever: the own
// windows' names go at once (nothing stays in /dev/shm) and every window waits for the lanes
// (CommState::abandoned_windows, released once the real abort has stopped that exchange).
void undo(CommState& s, std::vector<DirectPeer>& peers) {
  const DirectMemoryApi& m = s.platform->direct;
  const bool lane_busy = s.exchange_in_flight && !host_call_running(s);
  for (size_t r = 0; r < peers.size(); ++r) {
    DirectPeer& p = peers[r];
    const bool mine = static_cast<int>(r) == s.rank;
    for (Window* w : {&p.data, &p.flags}) {
      if (!w->token) continue;
      if (!lane_busy) {
        (mine ? m.destroy : m.close)(*w);
        continue;
      }
      if (mine && m.unlink) m.unlink(*w);
      s.abandoned_windows.push_back({*w, mine});
      *w = Window{};
    }
  }
}

// One attempt at one kind: create this rank's windows, exchange handles, open every peer's, confirm
// on every rank. On a "no" anywhere, everything made here is undone on every rank alike; a failed
// exchange is returned (the set-up fails). `gpu`: this rank's HostFacts::gpu_hash. `*no_room`: some
// rank found no room for its host windows (and the user has been told).
ncclResult_t try_direct(CommState& s, const Config& config, Carrier kind, uint64_t gpu, bool* ready, bool* no_room) {
  *ready = false;
  const DirectMemoryApi& m = s.platform->direct;
  // A rank whose platform or driver has no windows or no stream memory operations still takes both
  // exchanges of the round (its peers are in them) and says no.
  const bool capable = m.available && m.available() && m.create && m.open && m.close && m.destroy && s.platform->cuda.StreamWaitValue32 &&
                       s.platform->cuda.StreamWriteValue32;
  const size_t n = static_cast<size_t>(s.nranks);
  std::vector<DirectPeer> peers(n);
  DirectPeer& own = peers[static_cast<size_t>(s.rank)];
  DirectOffer offer;
  const uint64_t tag = (s.id << 8) | static_cast<uint64_t>(s.rank);
  cudaError_t made = capable ? m.create(WindowKind::host, sizeof(DirectFlags), tag, &own.flags, &offer.flags)
                             : cudaErrorNotSupported;
  if (made == cudaSuccess) {
    init_flags(*reinterpret_cast<DirectFlags*>(own.flags.host));
    made = m.create(window_kind(kind), config.direct_window_bytes, tag, &own.data, &offer.data);
  }
  s.platform->cuda.GetLastError();
  offer.ok = made == cudaSuccess ? 1 : 0;
  offer.no_room = made == cudaErrorMemoryAllocation && kind == Carrier::host_memory ? 1 : 0;
  offer.gpu = gpu;
  std::vector<char> all;
  if (const ncclResult_t r = gather_bytes(s, &offer, sizeof(offer), all, "the direct transport's offers");
      r != ncclSuccess) {
    undo(s, peers);
    return r;
  }
  std::vector<DirectOffer> offers(n);
  bool everyone = true;
  for (size_t r = 0; r < n; ++r) {
    std::memcpy(&offers[r], all.data() + r * sizeof(DirectOffer), sizeof(DirectOffer));
    everyone &= offers[r].ok == 1;
  }
  *no_room = warn_no_room(s, config, offers) || *no_room;
  // Open every peer's windows (only if everyone could offer: the round's second exchange follows
  // either way, so every rank takes the same number of all-gathers).
  bool opened = everyone;
  for (size_t r = 0; r < n && opened; ++r) {
    if (static_cast<int>(r) == s.rank) continue;
    opened = m.open(offers[r].flags, &peers[r].flags) == cudaSuccess &&
             m.open(offers[r].data, &peers[r].data) == cudaSuccess && peers[r].data.bytes == own.data.bytes;
  }
  s.platform->cuda.GetLastError();
  bool all_opened = false;
  if (const ncclResult_t r = all_agree(s, opened, &all_opened, "the direct transport's confirmation"); r != ncclSuccess) {
    undo(s, peers);
    return r;
  }
  if (all_opened) {
    if (m.unlink) m.unlink(own.flags), m.unlink(own.data);
    s.direct = std::make_unique<DirectWindows>(*s.platform, kind, s.rank, s.nranks,
                                               static_cast<int>(config.direct_sets), std::move(peers));
    s.direct->set_ranks_per_gpu(ranks_per_gpu(offers));
    FP8WIRE_INFO("comm {}: direct transport {} ready: {} ranks ({} at most on one GPU), {} per window, {} per "
                 "buffer set", s.id, to_string(kind), s.nranks, s.direct->ranks_per_gpu(),
                 format_size(config.direct_window_bytes), format_size(s.direct->set_bytes()));
    *ready = true;
    return ncclSuccess;
  }
  undo(s, peers);
  FP8WIRE_INFO("comm {}: direct transport {} not possible on every rank", s.id, to_string(kind));
  return ncclSuccess;
}

}  // namespace

ncclResult_t setup_direct(CommState& s, const Config& config, std::span<const RankFacts> facts, uint64_t gpu) {
  const std::vector<Carrier> kinds = direct_carriers(config, s.agreement.fabric, facts, kDirectMaxRanks);
  if (kinds.empty()) return ncclSuccess;
  bool no_room = false;
  for (Carrier kind : kinds) {
    bool ready = false;
    if (const ncclResult_t r = try_direct(s, config, kind, gpu, &ready, &no_room); r != ncclSuccess) return r;
    if (ready) return ncclSuccess;
  }
  if (config.direct_transport != DirectMode::automatic && !no_room)  // else the user has been told why
    FP8WIRE_WARN("comm {}: direct.transport = {}, but not every rank could map every other's windows; FP8 goes "
                 "over NCCL's transports", s.id, to_string(config.direct_transport));
  return ncclSuccess;
}

}  // namespace fp8wire::sched
