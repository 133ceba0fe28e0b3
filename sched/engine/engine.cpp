// The engine's entry points: lifecycle, the collectives' wrappers and the application's groups. Each
// call's route is in submit.cpp, the running of an FP8 call in fp8_call.cpp, grouped calls in
// group_queue.cpp. Nothing throws out of Engine, since an exported function must not throw: an
// exception becomes an NCCL error code with a log line.
#include "sched/engine/engine.hpp"

#include <time.h>

#include <exception>

#include <fmt/format.h>

#include "common/log.hpp"
#include "common/status.hpp"
#include "sched/engine/engine_impl.hpp"
#include "sched/comm/comm_setup.hpp"
#include "sched/comm/exchange.hpp"
#include "sched/platform/platform.hpp"
#include "sched/transport/direct_windows.hpp"

namespace fp8wire::sched {

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

CallKind kind_of(const Call& c) {
  switch (c.collective) {
    case Collective::all_reduce: return CallKind::all_reduce;
    case Collective::reduce_scatter: return CallKind::reduce_scatter;
    case Collective::all_gather: return CallKind::all_gather;
    case Collective::all_to_all: return CallKind::all_to_all;
    case Collective::send_recv: return c.direction == PeerDirection::recv ? CallKind::recv : CallKind::send;
  }
  return CallKind::all_reduce;
}

uint64_t plain_wire_bytes(const Call& c, const CommIdentity* who) {
  const uint64_t bytes = c.count * dtype_size(dtype_of(c.dtype));
  if (c.collective == Collective::send_recv)  // a message: its bytes at the sending end, unless to itself
    return c.direction == PeerDirection::send && !(who && c.peer == who->rank) ? bytes : 0;
  if (!who || who->nranks <= 1) return who ? 0 : bytes;
  const uint64_t n = static_cast<uint64_t>(who->nranks);
  if (c.collective == Collective::all_reduce) return 2 * (n - 1) * bytes / n;
  return (n - 1) * bytes;  // reduce_scatter: recvcount per peer; all_gather: sendcount; all_to_all: count
}

namespace {
// Allocated at a thread's first group call and freed when the thread ends (threads of a job come and go).
thread_local std::unique_ptr<ThreadGroup> tl_group;

}  // namespace

ThreadGroup& thread_group() {
  if (!tl_group) tl_group = std::make_unique<ThreadGroup>();  // once per thread, outside any hot loop
  return *tl_group;
}

Engine::Impl::Impl(const Config& c, const Platform& p, LocalIdentity identity)
    : config(c), platform(&p), api(p.nccl), me(std::move(identity)),
      budgets(c), registry(p, budgets) {}

ncclResult_t Engine::Impl::set_up(const std::vector<CommRef>& comms) {
  std::vector<CommState*> ready;
  for (const CommRef& s : comms) {
    if (s->dead.load(std::memory_order_acquire) || s->setup != CommSetup::pending) continue;
    if (!query_comm(*s)) {
      s->setup = CommSetup::pass_through;
      s->pass_reason = "NCCL could not say its size, rank and device at creation";
      FP8WIRE_WARN("comm {}: {}; it passes through", s->id, s->pass_reason);
      continue;
    }
    if (s->nranks == 1) {
      s->setup = CommSetup::pass_through;
      s->pass_reason = "a single rank";
      continue;
    }
    ready.push_back(s.get());
  }
  agree_at_creation(ready, config, me);
  for (CommState* s : ready)
    if (s->setup == CommSetup::failed) return s->failed();
  return ncclSuccess;
}

Engine::Engine(const Config& config, const Platform& platform, LocalIdentity me)
    : impl_(new Impl(config, platform, std::move(me))) {}
Engine::~Engine() { impl_->registry.clear(); }
const Config& Engine::config() const { return impl_->config; }

ncclResult_t Engine::comm_created(ncclComm_t comm, CommCreation how) {
  return guarded("comm_created", [&]() -> ncclResult_t {
    if (!comm) return ncclSuccess;  // e.g. ncclCommSplit with NCCL_SPLIT_NOCOLOR
    CommRef s = impl_->registry.add(comm);
    if (how.nonblocking || how.single_process) {
      // Non-blocking: a blocking exchange would break its contract, and its calls could return
      // ncclInProgress mid-algorithm. One process for every rank: one thread issues all ranks' calls
      // in one group, and an FP8 stage run for one rank at a time would wait for the others.
      s->setup = CommSetup::pass_through;
      s->single_process = how.single_process;
      s->pass_reason = how.nonblocking ? "non-blocking communicator" : "one process drives every rank";
      query_comm(*s);
      FP8WIRE_INFO("comm {}: {}: every call passes through", s->id, s->pass_reason);
      return ncclSuccess;
    }
    ThreadGroup& tg = thread_group();
    if (tg.group.inside()) {
      tg.setups.push_back(std::move(s));  // ready only at the group's end
      return ncclSuccess;
    }
    return impl_->set_up({s});
  });
}

bool Engine::comm_single_process(ncclComm_t comm) const {
  const CommRef s = impl_->registry.find(comm);
  return s && s->single_process;
}

ncclResult_t Engine::comm_destroyed(ncclComm_t comm, bool* deferred) {
  // The registry's reference goes now; the resources with it, or with the last call still holding
  // one (whose end then cannot reach this destroy's result).
  if (deferred) *deferred = false;
  return guarded("comm_destroyed", [&] {
    CommRef state = impl_->registry.detach(comm);
    if (!state) return ncclSuccess;
    if (defer_release(*state)) {
      if (deferred) *deferred = true;
      state->aborting.store(true, std::memory_order_release);  // its set-up failed: nothing to finish
    }
    if (state.use_count() > 1) return ncclSuccess;
    return release_resources(*state);
  });
}

ncclResult_t Engine::comm_abort(ncclComm_t comm) {
  // Detached first: once the real abort has freed the communicator, a new one may be created at the
  // same address and must not find this one's state.
  CommRef state;
  bool deferred = false;
  guarded("comm_abort", [&] {
    state = impl_->registry.detach(comm);
    if (state) state->aborting.store(true, std::memory_order_release);
    // A direct transport's lanes may wait on a peer that will never signal (NCCL's own kernels are
    // released by its abort; ours by this rank's host stores into its own flags).
    if (state && state->direct) state->direct->release_waits();
    // A host call of its set-up still inside NCCL uses it: that call's thread aborts it when NCCL returns.
    deferred = state && defer_release(*state);
  });
  const ncclResult_t result =
      deferred ? ncclSuccess : impl_->api->CommAbort ? impl_->api->CommAbort(comm) : ncclInternalError;
  guarded("comm_abort", [&] { state.reset(); });
  return result;
}

bool Engine::comm_peer_lost(ncclComm_t comm) const {
  bool lost = false;
  guarded("comm_peer_lost", [&] {
    const CommRef s = impl_->registry.find(comm);
    if (!s || !s->direct) return;
    // A peer that has gone is an error only for an operation that waits on it: a job whose ranks
    // finish, destroy or shut down at different times ends cleanly.
    const int peer = s->direct->waits_on_gone_peer();
    lost = peer >= 0;
    if (lost && !s->reported_lost_peer.exchange(true, std::memory_order_relaxed))
      FP8WIRE_WARN("comm {}: rank {} waits on rank {} of its direct transport, which has gone: ncclRemoteError",
                   s->id, s->rank, peer);
  });
  return lost;
}

ncclResult_t Engine::comm_async_error(ncclComm_t comm) const {
  ncclResult_t error = ncclSuccess;
  guarded("comm_async_error", [&] {
    const CommRef s = impl_->registry.find(comm);
    if (!s) return;
    if (error = s->failed(); error != ncclSuccess) return;  // its set-up, or an FP8 call, failed
    if (comm_peer_lost(comm)) {
      error = ncclRemoteError;
      return;
    }
    // The hierarchical path's own communicators: NCCL reports their errors on them, which the
    // application never holds.
    const Hierarchy& h = s->hierarchy;
    const NcclApi& api = *impl_->api;
    if (!h.ready || !api.CommGetAsyncError) return;
    for (ncclComm_t sub : {h.host, h.rail}) {
      ncclResult_t e = ncclSuccess;
      if (!sub || api.CommGetAsyncError(sub, &e) != ncclSuccess || nccl_ok(e)) continue;
      if (!s->reported_sub_error.exchange(true, std::memory_order_relaxed))
        FP8WIRE_ERROR("comm {}: the hierarchical path's {} sub-communicator reports NCCL error {}: reported as this "
                      "communicator's asynchronous error", s->id, sub == h.host ? "host" : "rail", static_cast<int>(e));
      error = e;
      return;
    }
  });
  return error;
}

std::string Engine::debug_state() const {
  std::string out;
  guarded("debug_state", [&] {
    std::vector<CallRecord> records(Accounting::kCapacity);
    records.resize(Accounting::instance().snapshot(records.data(), records.size(), 0));
    for (const CommRef& s : impl_->registry.all()) {
      static constexpr const char* kSetup[] = {"pending", "pass-through", "agreed", "set-up failed"};
      out += fmt::format("comm {} rank {} of {}, device {}: {}{}, error {}{}", s->id, s->rank, s->nranks, s->device,
                         kSetup[static_cast<int>(s->setup)], s->fp8_allowed() ? " with FP8" : "",
                         static_cast<int>(s->failed()), s->aborting.load() ? ", aborting" : "");
      const CudaApi& cuda = impl_->platform->cuda;
      const cudaStream_t lanes[] = {s->res.produce, s->res.transfer, s->res.send, s->res.fetch};
      static constexpr const char* kLanes[] = {"produce", "transfer", "send", "fetch"};
      for (int i = 0; i < 4; ++i)
        if (lanes[i])
          out += fmt::format(", {} {}", kLanes[i], cuda.StreamQuery(lanes[i]) == cudaErrorNotReady ? "busy" : "idle");
      if (s->direct) out += "; " + s->direct->describe();
      for (auto r = records.rbegin(); r != records.rend(); ++r)
        if (r->comm_id == s->id) {
          out += fmt::format("; last call seq {} {} {} over {}, {} elements", r->seq, to_string(r->kind),
                             to_string(r->path), to_string(r->transport), r->count);
          break;
        }
      out += "\n";
    }
  });
  return out;
}

ncclResult_t Engine::all_reduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                                cudaStream_t st) {
  return guarded("collective", [&] { return impl_->submit({Collective::all_reduce, s, r, n, t, op, c, st}, std::nullopt); });
}
ncclResult_t Engine::reduce_scatter(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                    ncclComm_t c, cudaStream_t st) {
  return guarded("collective", [&] { return impl_->submit({Collective::reduce_scatter, s, r, n, t, op, c, st}, std::nullopt); });
}
ncclResult_t Engine::all_gather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  return guarded("collective", [&] { return impl_->submit({Collective::all_gather, s, r, n, t, ncclSum, c, st}, std::nullopt); });
}
ncclResult_t Engine::all_to_all(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  return guarded("collective", [&] { return impl_->submit({Collective::all_to_all, s, r, n, t, ncclSum, c, st}, std::nullopt); });
}

ncclResult_t Engine::send(const void* s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  return guarded("send", [&] {
    return impl_->submit({Collective::send_recv, s, nullptr, n, t, ncclSum, c, st, PeerDirection::send, peer}, std::nullopt);
  });
}
ncclResult_t Engine::recv(void* r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  return guarded("recv", [&] {
    return impl_->submit({Collective::send_recv, nullptr, r, n, t, ncclSum, c, st, PeerDirection::recv, peer}, std::nullopt);
  });
}

ncclResult_t Engine::group_start() {
  return guarded("group_start", [&] {
    thread_group().group.start();
    return impl_->api->GroupStart();
  });
}

ncclResult_t Engine::group_end() {
  return guarded("group_end", [&] {
    ThreadGroup& tg = thread_group();
    const bool outermost = tg.group.end();
    const ncclResult_t res = impl_->api->GroupEnd();
    if (!outermost) return res;
    // NCCL has issued the group's sends and receives now (or none, where its end failed).
    const ncclResult_t messages = impl_->finish_messages(tg, res);
    // Communicators created in the group exist now: agree on them before running its FP8 calls. A
    // set-up that failed is the group's error (after its other calls ran: the peers run them too).
    ncclResult_t setup = ncclSuccess;
    if (!tg.setups.empty()) {
      std::vector<CommRef> setups;
      setups.swap(tg.setups);
      if (nccl_ok(res)) setup = impl_->set_up(setups);
    }
    if (nccl_ok(res) && nccl_ok(setup) && !nccl_ok(messages)) setup = messages;
    if (tg.npending == 0) return nccl_ok(res) ? setup : res;
    if (!nccl_ok(res)) {
      // The application's own group failed: its communicators are out of step with their peers
      // already. Its queued FP8 calls are not started; their communicators fail from now on.
      FP8WIRE_ERROR("ncclGroupEnd failed (NCCL {}): the group's {} queued FP8 call(s) are not run",
                    static_cast<int>(res), tg.npending);
      for (size_t i = 0; i < tg.npending; ++i) {
        tg.pending[i].state->fail(res);
        tg.pending[i].state.reset();
      }
      tg.npending = 0;
      return res;
    }
    const ncclResult_t flushed = impl_->flush(tg);
    return nccl_ok(flushed) ? setup : flushed;
  });
}

ncclResult_t Engine::group_simulate_end(ncclSimInfo_t* sim_info) {
  return guarded("group_simulate_end", [&] {
    ThreadGroup& tg = thread_group();
    // Left open, the engine's depth would stay above NCCL's: every later FP8 candidate of this
    // thread would be queued until some later GroupEnd, which would also run the simulated calls.
    if (tg.group.end()) {
      impl_->finish_messages(tg, ncclInvalidUsage);  // their sends and receives never run
      for (size_t i = 0; i < tg.npending; ++i) tg.pending[i].state.reset();
      tg.npending = 0;
      tg.setups.clear();  // nothing was created: they stay pass-through
    }
    return impl_->api->GroupSimulateEnd ? impl_->api->GroupSimulateEnd(sim_info) : ncclSystemError;
  });
}

void Engine::set_feedback_key(uint64_t key) { set_thread_feedback_key(key); }

}  // namespace fp8wire::sched
