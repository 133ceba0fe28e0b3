// The hierarchical path's round of the agreement (rounds.hpp). NCCL's split has no deadline and no way
// to be stopped from outside: it runs as a host call of its own (exchange.hpp, call_with_deadline).
#include <memory>

#include "common/log.hpp"
#include "common/status.hpp"
#include "sched/comm/exchange.hpp"
#include "sched/comm/rounds.hpp"
#include "sched/platform/platform.hpp"

namespace fp8wire::sched {

ncclResult_t split_hierarchy(CommState& s, const Agreement& a) {
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
  // NCCL's split waits for every rank without a deadline: first make sure, with one, that every rank
  // is here and goes on to it.
  bool everyone = false;
  if (const ncclResult_t r = all_agree(s, api.CommSplit != nullptr, &everyone, "the hierarchy round's start");
      r != ncclSuccess)
    return r;
  bool ok = false;
  if (everyone) {
    // What the splits make, where a split given up on can still put it (and its thread abort it).
    struct Made {
      ncclComm_t host = nullptr, rail = nullptr;
    };
    auto made = std::make_shared<Made>();
    CommState* const one[] = {&s};
    const ncclResult_t split = call_with_deadline(
        one, "NCCL's split of the hierarchy round",
        [api = &api, cuda = &s.platform->cuda, device = s.device, parent = s.comm, made, host = h.host_index,
         local = h.local_rank] {
          if (device >= 0) cuda->SetDevice(device);
          ncclResult_t r = api->CommSplit(parent, host, local, &made->host, nullptr);
          if (r == ncclSuccess) r = api->CommSplit(parent, local, host, &made->rail, nullptr);
          return r;
        },
        [api = &api, made] {
          for (ncclComm_t c : {made->host, made->rail})
            if (c && api->CommAbort) api->CommAbort(c);
        });
    if (s.host_call) return split;  // given up on: what it makes is its thread's
    h.host = made->host;
    h.rail = made->rail;
    ok = split == ncclSuccess && h.host && h.rail;
  }
  bool all_split = false;
  const ncclResult_t confirmed = all_agree(s, ok, &all_split, "the hierarchy round's confirmation");
  if (nccl_ok(confirmed) && all_split) {
    h.ready = true;
    h.host_transport = NcclTransport(api, h.host, h.local_rank, h.ranks_per_host);
    h.rail_transport = NcclTransport(api, h.rail, h.host_index, h.hosts);
    FP8WIRE_INFO("comm {}: hierarchical path ready: host {} of {}, local rank {} of {}", s.id, h.host_index, h.hosts,
                 h.local_rank, h.ranks_per_host);
    return ncclSuccess;
  }
  if (nccl_ok(confirmed))
    FP8WIRE_WARN("comm {}: the host/rail sub-communicators could not be made on every rank; no hierarchical path", s.id);
  // After a failed confirmation a peer may still be in its split or its collectives: abort, not destroy.
  for (ncclComm_t* c : {&h.host, &h.rail})
    if (*c) {
      if (nccl_ok(confirmed) ? api.CommDestroy != nullptr : api.CommAbort != nullptr)
        (nccl_ok(confirmed) ? api.CommDestroy : api.CommAbort)(*c);
      *c = nullptr;
    }
  return confirmed;
}

}  // namespace fp8wire::sched
