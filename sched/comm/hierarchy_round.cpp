// The hierarchical path's round of the agreement (rounds.hpp).
#include "common/log.hpp"
#include "sched/comm/exchange.hpp"
#include "sched/comm/rounds.hpp"
#include "sched/platform/platform.hpp"

namespace fp8wire::sched {

void split_hierarchy(CommState& s, const Agreement& a) {
  const NcclApi& api = *s.platform->nccl;
  Hierarchy& h = s.hierarchy;
  h.hosts = a.topology.hosts;
  h.ranks_per_host = a.topology.ranks_per_host;
  h.host_index = a.hosts.host_of[static_cast<size_t>(s.rank)];
  h.local_rank = a.hosts.local_rank[static_cast<size_t>(s.rank)];
  h.rank_at.assign(static_cast<size_t>(s.nranks), 0);
  for (int r = 0; r < s.nranks; ++r)
    h.rank_at[static_cast<size_t>(a.hosts.host_of[static_cast<size_t>(r)] * h.ranks_per_host +
                                  a.hosts.local_rank[static_cast<size_t>(r)])] = r;
  const bool ok = api.CommSplit && api.CommSplit(s.comm, h.host_index, h.local_rank, &h.host, nullptr) == ncclSuccess &&
                  api.CommSplit(s.comm, h.local_rank, h.host_index, &h.rail, nullptr) == ncclSuccess && h.host &&
                  h.rail;
  if (all_agree(s, ok)) {
    h.ready = true;
    h.host_transport = NcclTransport(api, h.host, h.local_rank, h.ranks_per_host);
    h.rail_transport = NcclTransport(api, h.rail, h.host_index, h.hosts);
    FP8WIRE_INFO("comm {}: hierarchical path ready: host {} of {}, local rank {} of {}", s.id, h.host_index, h.hosts,
                 h.local_rank, h.ranks_per_host);
    return;
  }
  FP8WIRE_WARN("comm {}: the host/rail sub-communicators could not be made on every rank; no hierarchical path", s.id);
  for (ncclComm_t* c : {&h.host, &h.rail})
    if (*c) {
      if (api.CommDestroy) api.CommDestroy(*c);
      *c = nullptr;
    }
}

}  // namespace fp8wire::sched
