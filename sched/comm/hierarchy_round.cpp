// The hierarchical path's round of the agreement (rounds.hpp). NCCL's split has no deadline and no way
// to be stopped from outside: it runs on a thread of its own while the set-up's thread waits for it
// with the set-up's deadline and its abort. A split given up on stays with that thread, which aborts
// what it made, and the parent too where its abort or destroy was asked meanwhile, once NCCL returns
// (a peer that resumes or ends; never under NCCL's feet).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "common/log.hpp"
#include "common/status.hpp"
#include "sched/comm/exchange.hpp"
#include "sched/comm/rounds.hpp"
#include "sched/platform/platform.hpp"

namespace fp8wire::sched {

// The two splits of one communicator, between the set-up's thread and the split's.
struct SplitJob {
  const NcclApi* api = nullptr;
  ncclComm_t parent = nullptr;
  int host_color = 0, host_key = 0, rail_color = 0, rail_key = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;          // NCCL's splits returned
  bool ok = false;
  ncclComm_t host = nullptr, rail = nullptr;
  bool abandoned = false;     // the set-up gave up: what the splits make is the split thread's to abort
  bool abort_parent = false;  // the parent's abort or destroy was asked meanwhile: the split thread's too
};

namespace {

std::atomic<int> g_splits_in_flight{0};

void run_split(const std::shared_ptr<SplitJob>& job, const CudaApi* cuda, int device) {
  if (device >= 0) cuda->SetDevice(device);
  const NcclApi& api = *job->api;
  ncclComm_t host = nullptr, rail = nullptr;
  const bool split = api.CommSplit(job->parent, job->host_color, job->host_key, &host, nullptr) == ncclSuccess &&
                     api.CommSplit(job->parent, job->rail_color, job->rail_key, &rail, nullptr) == ncclSuccess;
  {
    std::lock_guard lock(job->mu);
    job->done = true;
    job->ok = split && host && rail;
    job->host = host;
    job->rail = rail;
    if (job->abandoned) {
      for (ncclComm_t c : {host, rail})
        if (c && api.CommAbort) api.CommAbort(c);
      if (job->abort_parent && api.CommAbort) api.CommAbort(job->parent);
    }
  }
  job->cv.notify_all();
  --g_splits_in_flight;
}

}  // namespace

bool defer_parent_release(CommState& s) {
  if (!s.split) return false;
  std::lock_guard lock(s.split->mu);
  if (s.split->done) return false;
  s.split->abort_parent = true;
  return true;
}

int splits_in_flight() { return g_splits_in_flight.load(); }

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
    auto job = std::make_shared<SplitJob>();
    job->api = &api;
    job->parent = s.comm;
    job->host_color = h.host_index, job->host_key = h.local_rank;
    job->rail_color = h.local_rank, job->rail_key = h.host_index;
    ++g_splits_in_flight;
    try {
      std::thread(run_split, job, &s.platform->cuda, s.device).detach();
    } catch (...) {
      --g_splits_in_flight;
      throw;
    }
    std::unique_lock lock(job->mu);
    ncclResult_t given_up = ncclSuccess;
    while (!job->done && nccl_ok(given_up)) {
      if (s.aborting.load(std::memory_order_acquire)) given_up = ncclInvalidUsage;
      else if (s.setup_deadline && std::chrono::steady_clock::now() > *s.setup_deadline) given_up = ncclRemoteError;
      else job->cv.wait_for(lock, std::chrono::milliseconds(1));
    }
    if (!job->done) {
      job->abandoned = true;
      s.split = job;  // the parent's abort or destroy now waits for it (defer_parent_release)
      FP8WIRE_ERROR("comm {}: NCCL's split of the hierarchy round {}: the communicator's creation fails", s.id,
                    given_up == ncclRemoteError ? "did not return within the set-up's deadline (setup_timeout_s): a "
                                                  "peer was killed or stopped"
                                                : "was given up for an abort");
      return given_up;
    }
    h.host = job->host;
    h.rail = job->rail;
    ok = job->ok;
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
