// The host-link limit of the direct transport through host memory: the time a collective cannot beat
// when every byte it must move between a GPU and the shared host windows crosses that GPU's PCIe link
// at the pinned-copy rate (cudaMemcpyAsync through pinned memory, every rank copying at once).
//
// Bytes per rank and call, each direction (w = the wire bytes of the caller data one rank quantizes:
// all-reduce and reduce-scatter its whole input, all-gather its own part; n ranks):
//                        as sched/algorithms/direct.cpp moves them    fewest (own data kept on the GPU)
//   all-reduce one-shot  D2H w          H2D n w                      D2H w   H2D (n-1) w
//   all-reduce two-shot  D2H w + w/n    H2D 2 w                      D2H w   H2D 2 (n-1)/n w
//   reduce-scatter       D2H w          H2D w                        D2H (n-1)/n w   H2D (n-1)/n w
//   all-gather           D2H w          H2D n w                      D2H w   H2D (n-1) w
// "Fewest": what crosses between ranks must pass through host memory once each way; a rank's own
// shard, own input and own reduced shard could stay on its GPU. The limit of a collective is that of
// its algorithm with the smallest such time (two-shot for the all-reduce from 3 ranks; at 2 ranks
// one-shot and two-shot move the same, and two-shot is named).
// Time = max(D2H bytes / D2H rate, H2D bytes / H2D rate) x the ranks sharing one link (every rank on
// a testbed of ranks emulated on one GPU; 1 with one GPU per rank, each on its own link): PCIe is full
// duplex, so the two directions overlap at best, and ranks sharing a link share its rate.
#pragma once

#include <array>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>

#include "bench/host/units.hpp"
#include "bench/host/model.hpp"

namespace fp8wire::bench {

struct LinkBytes {
  double d2h = 0;  // GPU -> host windows, bytes per rank and call
  double h2d = 0;  // host windows -> GPU
};

// Bytes one rank moves over its host link for one call of `bytes` (the sweep's full-buffer size,
// units.hpp) on `path` (all-reduce: one_shot or two_shot; the others' own path). `fewest`: with the
// rank's own data kept on its GPU (the table above), else as the direct programs move them today.
// nullopt for a path the direct transport does not run (passthrough, ring, hierarchical).
std::optional<LinkBytes> host_link_bytes(Collective c, Path path, int nranks, uint64_t bytes, const WireParams& wire,
                                         bool fewest);

// Pinned-copy rates of one link, measured with every rank copying at once.
// Both directions at once in copies of `copy_bytes` each, every rank at once with nothing between its
// copies: what the link keeps when a call's traffic comes in copies of that size (a 16 MiB call's
// stages send copies of 1-4 MiB). Reported, not used in the limit.
struct DuplexInCopies {
  uint64_t copy_bytes = 0;
  double d2h_gbps = 0;
  double h2d_gbps = 0;
};
inline constexpr uint64_t kSmallCopyBytes[] = {4ull << 20, 1ull << 20};

struct PinnedRates {
  double d2h_gbps = 0;
  double h2d_gbps = 0;
  int ranks_per_link = 1;  // ranks whose traffic shares one link (all of them when emulated on one GPU)
  uint64_t bytes = 0;      // bytes each rank copied per direction
  // Both directions at once (PCIe is full duplex): what each keeps. Reported, not used in the limit.
  double duplex_d2h_gbps = 0;
  double duplex_h2d_gbps = 0;
  std::array<DuplexInCopies, std::size(kSmallCopyBytes)> duplex_small{};  // the same in copies of kSmallCopyBytes
  bool measured() const { return d2h_gbps > 0 && h2d_gbps > 0 && ranks_per_link > 0; }
};

// A pinned pass's rate from several rounds of it: `slowest_rank_us[r * stride]` is round r's time (the
// slowest rank's) for `link_bytes` over one link. The best round's rate, since a ceiling is what the link can
// give and a round caught by a slow moment of the host would lower the limit and lift every percent
// with it; rounds not timed (0 or less) are skipped; 0 when none was.
double best_round_gbps(const double* slowest_rank_us, int rounds, int stride, double link_bytes);

struct LinkLimit {
  double us = 0;           // the limit's time; 0 when it cannot be computed
  Path path = Path::two_shot;  // the algorithm whose bytes set it
  LinkBytes bytes;         // that algorithm's fewest bytes, per rank
  std::string basis;       // the algorithm, its bytes in units of w, the rates (the same for every size)
};

// The link limit of one collective and size, from the fewest bytes of any of its algorithms.
LinkLimit link_limit(Collective c, int nranks, uint64_t bytes, const WireParams& wire, const PinnedRates& rates);
// Percent of the link limit a measured time reaches (100 = at the limit); 0 when either is missing.
double percent_of_limit(double limit_us, double measured_us);

}  // namespace fp8wire::bench
