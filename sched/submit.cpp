// Each call's route: pass through at once (cheap rules first, before any per-communicator state is
// touched), queue it in the application's group, or run it as FP8 now. Every input of the decision
// is identical on all ranks of the communicator (sched/plan.hpp), so all ranks route alike.
#include "common/log.hpp"
#include "sched/engine_impl.hpp"
#include "sched/hierarchy.hpp"
#include "sched/plan.hpp"

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
  return shape;
}

Path Engine::Impl::decide(const Call& c, const CommState& s, std::optional<Path> forced) const {
  const Path path = forced ? *forced
                           : plan_on(config, shape_of(c, &s), s.agreement.fabric, s.agreement.topology,
                                     s.hierarchy.ready).path;
  if (!is_fp8(path)) return path;
  if (path == Path::hierarchical && (!s.hierarchy.ready || c.collective == Collective::all_gather))
    return Path::fallback;  // forced where the communicator has no hierarchy
  return s.fp8_allowed() ? path : Path::fallback;  // eligible, but the agreement ruled FP8 out
}

namespace {
// What this rank sends in NCCL's ring algorithms (nccl-tests' bus-bandwidth factors). Without the
// communicator's size (calls rejected before the registry lookup) the caller's bytes stand in.
uint64_t plain_wire_bytes(const Call& c, const CommIdentity* s) {
  const uint64_t bytes = c.count * dtype_size(dtype_of(c.dtype));
  if (!s || s->nranks <= 1) return s ? 0 : bytes;
  const uint64_t n = static_cast<uint64_t>(s->nranks);
  if (c.collective == Collective::all_reduce) return 2 * (n - 1) * bytes / n;
  return (n - 1) * bytes;  // reduce_scatter: recvcount per peer; all_gather: sendcount per peer
}
}  // namespace

ncclResult_t Engine::Impl::issue_plain(const Call& c) {
  switch (c.collective) {
    case Collective::all_reduce: return api->AllReduce(c.send, c.recv, c.count, c.dtype, c.op, c.comm, c.stream);
    case Collective::reduce_scatter:
      return api->ReduceScatter(c.send, c.recv, c.count, c.dtype, c.op, c.comm, c.stream);
    case Collective::all_gather: return api->AllGather(c.send, c.recv, c.count, c.dtype, c.comm, c.stream);
  }
  return ncclInvalidArgument;
}

ncclResult_t Engine::Impl::run_plain(const Call& c, const CommIdentity* s, Path path, uint64_t seq, uint64_t issue) {
  CallRecord r;
  r.seq = seq;
  r.comm_id = s ? s->id : 0;
  r.kind = kind_of(c.collective);
  r.path = path;
  r.dtype = c.dtype;
  r.op = c.op;
  r.nranks = s ? s->nranks : 0;
  r.rank = s ? s->rank : 0;
  r.count = c.count;
  r.app_bytes = c.count * dtype_size(dtype_of(c.dtype));
  r.issue_ns = issue;
  CallHookScope hooks(r);
  const ncclResult_t res = issue_plain(c);
  r.wire_bytes = plain_wire_bytes(c, s);
  hooks.end();
  Accounting::instance().record(r);
  return res;
}

ncclResult_t Engine::Impl::submit(const Call& c, std::optional<Path> forced) {
  const uint64_t seq = Accounting::instance().next_seq();
  const uint64_t issue = now_ns();
  // The feedback key belongs to this call whatever its route: never to a later one.
  const uint64_t feedback_key = c.collective == Collective::all_reduce ? take_thread_feedback_key() : 0;
  if (forced && !is_fp8(*forced)) {
    CommIdentity who;
    return run_plain(c, registry.identity(c.comm, &who) ? &who : nullptr, Path::passthrough, seq, issue);
  }
  // Cheap rules first: most ineligible calls never touch the communicator registry. A forced path
  // ignores the enable switches (the benchmark measures FP8 all_gather although it is off by
  // default) but not the rules FP8 cannot serve (dtype, op, world size).
  const Config& rules = forced ? forced_rules : config;
  if (static_eligibility(rules, shape_of(c, nullptr)) != PassReason::none)
    return run_plain(c, static_cast<const CommIdentity*>(nullptr), Path::passthrough, seq, issue);
  if (!forced && below_every_threshold(config, shape_of(c, nullptr))) {
    CommIdentity who;  // a lookup only: the record names the world size
    return run_plain(c, registry.identity(c.comm, &who) ? &who : nullptr, Path::passthrough, seq, issue);
  }

  const CommRef s = registry.find(c.comm);
  if (!s || s->setup != CommSetup::agreed) {
    // Created before fp8wire was loaded, still pending (created in the open group), or never FP8.
    if (!s) FP8WIRE_WARN_ONCE("a collective on a communicator fp8wire did not see created: it passes through");
    return run_plain(c, s.get(), Path::passthrough, seq, issue);
  }
  if (static_eligibility(rules, shape_of(c, s.get())) != PassReason::none ||
      (!forced && below_every_threshold(config, shape_of(c, s.get()))))
    return run_plain(c, s.get(), Path::passthrough, seq, issue);
  const Path path = decide(c, *s, forced);
  if (!is_fp8(path)) return run_plain(c, s.get(), path, seq, issue);
  if (const ncclResult_t failed = s->failed(); failed != ncclSuccess) {
    FP8WIRE_WARN_ONCE("an FP8 collective on a communicator whose earlier FP8 collective failed returns that "
                      "error (NCCL {}): the communicator must be aborted or destroyed", static_cast<int>(failed));
    return failed;
  }
  ThreadGroup& tg = thread_group();
  if (tg.group.inside()) return queue(tg, c, s, path, seq, issue, feedback_key);
  return run_fp8(s, c, path, seq, issue, feedback_key);
}

}  // namespace fp8wire::sched
