// Each call's way in: pass through at once (cheap rules first, before any per-communicator state is
// touched), or take its route from the planner (sched/plan/route.hpp) and pass through, queue it in
// the application's group, or run it as FP8 now.
#include "common/log.hpp"
#include "sched/engine/engine_impl.hpp"
#include "sched/plan/route.hpp"
#include "sched/transport/direct_windows.hpp"

namespace fp8wire::sched {

CallShape Engine::Impl::shape_of(const Call& c, const CommState* s) const {
  CallShape shape;
  shape.collective = c.collective;
  shape.dtype = dtype_of(c.dtype);
  shape.op = redop_of(c.op);
  shape.count = c.count;
  // Before the communicator is known, the widest world FP8 serves bounds reduce_scatter / all_gather
  // sizes (their thresholds count the whole buffer, x world size).
  shape.nranks = s ? s->nranks : quant::kMaxReduceInputs;
  shape.to_self = s && c.collective == Collective::send_recv && c.peer == s->rank;
  return shape;
}

CommFacts Engine::Impl::facts_of(const CommState& s) {
  CommFacts f;
  if (s.setup != CommSetup::agreed) return f;  // nothing else of a pending communicator is settled
  f.agreed = true;
  f.fp8_ok = s.agreement.fp8_ok;
  f.fabric = s.agreement.fabric;
  f.topology = s.agreement.topology;
  f.hierarchy_ready = s.hierarchy.ready;
  f.hosts = s.hierarchy.hosts;
  f.ranks_per_host = s.hierarchy.ranks_per_host;
  if (s.direct) {
    f.direct = s.direct->kind();
    f.direct_set_bytes = s.direct->set_bytes();
    f.direct_sets = s.direct->sets();
    f.direct_ranks_per_gpu = s.direct->ranks_per_gpu();
  }
  f.scratch = s.res.layout;
  return f;
}

ncclResult_t Engine::Impl::issue_plain(const Call& c) {
  switch (c.collective) {
    case Collective::all_reduce: return api->AllReduce(c.send, c.recv, c.count, c.dtype, c.op, c.comm, c.stream);
    case Collective::reduce_scatter:
      return api->ReduceScatter(c.send, c.recv, c.count, c.dtype, c.op, c.comm, c.stream);
    case Collective::all_gather: return api->AllGather(c.send, c.recv, c.count, c.dtype, c.comm, c.stream);
    case Collective::all_to_all:
      if (!api->AlltoAll) {  // optional in the table: NCCL before 2.28 has none
        FP8WIRE_WARN_ONCE("ncclAlltoAll: the loaded NCCL has no ncclAlltoAll (NCCL 2.28 added it); "
                          "returning ncclSystemError");
        return ncclSystemError;
      }
      return api->AlltoAll(c.send, c.recv, c.count, c.dtype, c.comm, c.stream);
    case Collective::send_recv:
      return c.direction == PeerDirection::send ? api->Send(c.send, c.count, c.dtype, c.peer, c.comm, c.stream)
                                                : api->Recv(c.recv, c.count, c.dtype, c.peer, c.comm, c.stream);
  }
  return ncclInvalidArgument;
}

ncclResult_t Engine::Impl::run_plain(const Call& c, const CommIdentity* s, Path path, uint64_t seq, uint64_t issue) {
  CallRecord r;
  r.seq = seq;
  r.comm_id = s ? s->id : 0;
  r.kind = kind_of(c);
  r.path = path;
  r.dtype = c.dtype;
  r.op = c.op;
  r.nranks = s ? s->nranks : 0;
  r.rank = s ? s->rank : 0;
  r.count = c.count;
  r.app_bytes = c.count * dtype_size(dtype_of(c.dtype));
  r.plain_wire_bytes = plain_wire_bytes(c, s);
  r.wire_bytes = r.plain_wire_bytes;  // NCCL's own algorithm carries it
  r.issue_ns = issue;
  CallHookScope hooks(r);
  const ncclResult_t res = issue_plain(c);
  hooks.end();
  Accounting::instance().record(r);
  return res;
}

ncclResult_t Engine::Impl::submit(const Call& c, std::optional<Path> forced) {
  const uint64_t seq = Accounting::instance().next_seq();
  const uint64_t issue = now_ns();
  // The feedback key belongs to this call whatever its route: never to a later one.
  const uint64_t feedback_key = c.collective == Collective::all_reduce ? take_thread_feedback_key() : 0;
  // Cheap rules first: most ineligible calls never touch the communicator registry.
  switch (pass_before_lookup(config, shape_of(c, nullptr), forced)) {
    case PassReason::none: break;
    case PassReason::forced:
    case PassReason::below_threshold: {
      CommIdentity who;  // a lookup only: the record names the world size
      return run_plain(c, registry.identity(c.comm, &who) ? &who : nullptr, Path::passthrough, seq, issue);
    }
    default: return run_plain(c, static_cast<const CommIdentity*>(nullptr), Path::passthrough, seq, issue);
  }

  const CommRef s = registry.find(c.comm);
  if (!s) {
    FP8WIRE_WARN_ONCE("a collective on a communicator fp8wire did not see created: it passes through");
    return run_plain(c, s.get(), Path::passthrough, seq, issue);
  }
  // Its set-up failed (created in a group whose end returned the error): every rank may have
  // concluded differently, so no call of it runs, FP8 or not, until the application aborts it.
  if (s->setup == CommSetup::failed) return s->failed();
  const Route route = route_call(config, facts_of(*s), shape_of(c, s.get()), forced);
  // No FP8 algorithm planned: the real call. One planned whose stages do not fit the scratch still
  // goes to run_fp8 (which records the fallback), after the sticky-failure check like any FP8 call.
  if (!is_fp8(route.algorithm)) return run_plain(c, s.get(), route.path, seq, issue);
  if (c.collective == Collective::send_recv) return run_message(s, c, route, seq, issue);
  if (const ncclResult_t failed = s->failed(); failed != ncclSuccess) {
    FP8WIRE_WARN_ONCE("an FP8 collective on a communicator whose earlier FP8 collective failed returns that "
                      "error (NCCL {}): the communicator must be aborted or destroyed", static_cast<int>(failed));
    return failed;
  }
  ThreadGroup& tg = thread_group();
  if (tg.group.inside()) return queue(tg, c, s, route, seq, issue, feedback_key);
  return run_fp8(s, c, route, seq, issue, feedback_key);
}

}  // namespace fp8wire::sched
