// The direct windows' round of the agreement (rounds.hpp): each rank creates a flag page and a data
// window, the ranks exchange the handles, open each other's windows and confirm on every rank; then
// the names are unlinked (nothing is left behind when a process dies).
#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
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
  uint32_t reserved = 0;  // explicit padding: the handles start 8-byte aligned
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

// One attempt at one kind: create this rank's windows, exchange handles, open every peer's, confirm
// on every rank. On any failure anywhere, everything made here is undone on every rank alike. `gpu`:
// this rank's HostFacts::gpu_hash.
bool try_direct(CommState& s, const Config& config, Carrier kind, uint64_t gpu) {
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
  bool ok = capable && m.create(WindowKind::host, sizeof(DirectFlags), tag, &own.flags, &offer.flags) == cudaSuccess;
  if (ok) {
    init_flags(*reinterpret_cast<DirectFlags*>(own.flags.host));
    ok = m.create(window_kind(kind), config.direct_window_bytes, tag, &own.data, &offer.data) == cudaSuccess;
  }
  s.platform->cuda.GetLastError();
  offer.ok = ok ? 1 : 0;
  offer.gpu = gpu;
  std::vector<char> all;
  const bool exchanged = gather_bytes(s, &offer, sizeof(offer), all) == ncclSuccess;
  std::vector<DirectOffer> offers(n);
  bool everyone = exchanged;
  if (exchanged)
    for (size_t r = 0; r < n; ++r) {
      std::memcpy(&offers[r], all.data() + r * sizeof(DirectOffer), sizeof(DirectOffer));
      everyone &= offers[r].ok == 1;
    }
  // Open every peer's windows (only if everyone could offer: the round's second exchange follows
  // either way, so every rank takes the same number of all-gathers).
  bool opened = everyone;
  for (size_t r = 0; r < n && opened; ++r) {
    if (static_cast<int>(r) == s.rank) continue;
    opened = m.open(offers[r].flags, &peers[r].flags) == cudaSuccess &&
             m.open(offers[r].data, &peers[r].data) == cudaSuccess && peers[r].data.bytes == own.data.bytes;
  }
  s.platform->cuda.GetLastError();
  if (all_agree(s, opened)) {
    if (m.unlink) m.unlink(own.flags), m.unlink(own.data);
    s.direct = std::make_unique<DirectWindows>(*s.platform, kind, s.rank, s.nranks,
                                               static_cast<int>(config.direct_sets), std::move(peers));
    s.direct->set_ranks_per_gpu(ranks_per_gpu(offers));
    FP8WIRE_INFO("comm {}: direct transport {} ready: {} ranks ({} at most on one GPU), {} per window, {} per "
                 "buffer set", s.id, to_string(kind), s.nranks, s.direct->ranks_per_gpu(),
                 format_size(config.direct_window_bytes), format_size(s.direct->set_bytes()));
    return true;
  }
  for (size_t r = 0; r < n; ++r) {
    DirectPeer& p = peers[r];
    const bool mine = static_cast<int>(r) == s.rank;
    for (Window* w : {&p.data, &p.flags})
      if (w->token) (mine ? m.destroy : m.close)(*w);
  }
  FP8WIRE_INFO("comm {}: direct transport {} not possible on every rank", s.id, to_string(kind));
  return false;
}

}  // namespace

void setup_direct(CommState& s, const Config& config, std::span<const RankFacts> facts, uint64_t gpu) {
  const std::vector<Carrier> kinds = direct_carriers(config, s.agreement.fabric, facts, kDirectMaxRanks);
  if (kinds.empty()) return;
  for (Carrier kind : kinds)
    if (try_direct(s, config, kind, gpu)) return;
  if (config.direct_transport != DirectMode::automatic)
    FP8WIRE_WARN("comm {}: direct.transport = {}, but not every rank could map every other's windows; FP8 goes "
                 "over NCCL's transports", s.id, to_string(config.direct_transport));
}

}  // namespace fp8wire::sched
