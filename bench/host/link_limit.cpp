#include "bench/host/link_limit.hpp"

#include <algorithm>
#include <cstddef>

#include <fmt/format.h>

namespace fp8wire::bench {

std::optional<LinkBytes> host_link_bytes(Collective c, Path path, int nranks, uint64_t bytes, const WireParams& wire,
                                         bool fewest) {
  if (nranks < 2 || (path != Path::one_shot && path != Path::two_shot)) return std::nullopt;
  const double n = nranks;
  const double s = static_cast<double>(bytes);
  switch (c) {
    case Collective::all_reduce: {
      const double w = wire.ratio() * s;
      if (path == Path::one_shot)  // quantize into its own window; reduce every rank's window
        return fewest ? LinkBytes{w, (n - 1) * w} : LinkBytes{w, n * w};
      // Two-shot: shard j into rank j's inbox, the reduced shard into its own window; the reduce
      // reads its inbox, the decode every rank's reduced shard.
      return fewest ? LinkBytes{w, 2 * (n - 1) / n * w} : LinkBytes{w + w / n, 2 * w};
    }
    case Collective::reduce_scatter: {
      const double w = wire.ratio() * s;  // the whole input: one block per rank
      return fewest ? LinkBytes{(n - 1) / n * w, (n - 1) / n * w} : LinkBytes{w, w};
    }
    case Collective::all_gather: {
      const double w = wire.ratio() * s / n;  // this rank's part of the output
      return fewest ? LinkBytes{w, (n - 1) * w} : LinkBytes{w, n * w};
    }
    case Collective::all_to_all: {
      // Chunk j into rank j's inbox, every peer's chunk read from this rank's; the own chunk is
      // copied on the GPU, in either program.
      const double w = wire.ratio() * s;
      return LinkBytes{(n - 1) / n * w, (n - 1) / n * w};
    }
    case Collective::send_recv: break;  // no direct program: NCCL's transports carry it
  }
  return std::nullopt;
}

LinkLimit link_limit(Collective c, int nranks, uint64_t bytes, const WireParams& wire, const PinnedRates& rates) {
  LinkLimit best;
  if (!rates.measured()) return best;
  const double k = rates.ranks_per_link;
  // The others have one algorithm each (sched/plan/types.hpp only_fp8_path).
  const std::vector<Path> paths = c == Collective::all_reduce ? std::vector<Path>{Path::two_shot, Path::one_shot}
                                                              : std::vector<Path>{only_fp8_path(c)};
  for (Path p : paths) {
    const auto b = host_link_bytes(c, p, nranks, bytes, wire, true);
    if (!b) continue;
    const double us = std::max(k * b->d2h / (rates.d2h_gbps * 1e3), k * b->h2d / (rates.h2d_gbps * 1e3));
    if (best.us == 0 || us < best.us) {
      best.us = us;
      best.path = p;
      best.bytes = *b;
    }
  }
  if (best.us > 0) {
    // In units of w (the wire bytes of one rank's input; all-gather: of its part), so one basis
    // holds for every size.
    const auto unit = host_link_bytes(c, best.path, nranks, bytes, wire, false);
    const double w = c == Collective::all_gather ? unit->d2h : wire.ratio() * static_cast<double>(bytes);
    best.basis = fmt::format("{} with its own data kept on the GPU: D2H {:.3g} w + H2D {:.3g} w per rank "
                             "(w = wire bytes of its {}), {} rank{} per link at pinned D2H {:.1f} / H2D {:.1f} GB/s",
                             c == Collective::all_reduce ? fmt::format("all-reduce {}", path_name(best.path))
                                                         : std::string(collective_name(c)),
                             best.bytes.d2h / w, best.bytes.h2d / w, c == Collective::all_gather ? "part" : "input",
                             rates.ranks_per_link, rates.ranks_per_link == 1 ? "" : "s", rates.d2h_gbps,
                             rates.h2d_gbps);
  }
  return best;
}

double percent_of_limit(double limit_us, double measured_us) {
  if (!(limit_us > 0) || !(measured_us > 0)) return 0;
  return 100.0 * limit_us / measured_us;
}

double best_round_gbps(const double* slowest_rank_us, int rounds, int stride, double link_bytes) {
  double best = 0;
  for (int r = 0; r < rounds; ++r)
    if (const double us = slowest_rank_us[static_cast<ptrdiff_t>(r) * stride]; us > 0)
      best = std::max(best, link_bytes / (us * 1e3));
  return best;
}

}  // namespace fp8wire::bench
