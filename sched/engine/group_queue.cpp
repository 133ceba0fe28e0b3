// FP8 calls the application issued inside its group: queued at issue (routed then, from agreed
// facts), run after its outermost real ncclGroupEnd, never later. Consecutive all-reduces of one
// communicator, stream, dtype and op are packed up to a byte and a call cap
// (sched/plan/coalesce.hpp). Every call of the batch forks from its caller's stream and all are
// joined only at the end, so calls on different communicators never wait for one another, whatever
// order each rank issued them in.
#include "common/log.hpp"
#include "sched/engine/engine_impl.hpp"

namespace fp8wire::sched {

ncclResult_t Engine::Impl::queue(ThreadGroup& tg, const Call& c, const CommRef& s, const Route& route, uint64_t seq,
                                 uint64_t issue, uint64_t feedback_key) {
  if (tg.npending == kMaxPending) {
    FP8WIRE_WARN_ONCE("more than {} FP8 calls in one group; the rest pass through", kMaxPending);
    return run_plain(c, s.get(), Path::fallback, seq, issue);
  }
  Pending& p = tg.pending[tg.npending++];
  p = Pending{c, s, route, seq, issue, feedback_key};
  return ncclSuccess;
}

ncclResult_t Engine::Impl::flush(ThreadGroup& tg) {
  const size_t count = tg.npending;
  tg.npending = 0;
  for (size_t i = 0; i < count; ++i) {
    const Pending& p = tg.pending[i];
    PendingShape& shape = tg.shapes[i];
    shape.comm = p.call.comm;
    shape.stream = p.call.stream;
    shape.fp8 = true;
    shape.collective = p.call.collective;
    shape.dtype = dtype_of(p.call.dtype);
    shape.op = redop_of(p.call.op);
    shape.bytes = p.call.count * dtype_size(shape.dtype);
  }
  ncclResult_t first_error = ncclSuccess;
  size_t not_issued = 0;
  {
    JoinList joins;
    for (size_t i = 0; i < count;) {
      Pending& p = tg.pending[i];
      size_t batch = 1;
      if (first_error != ncclSuccess) {
        // This rank stops at the first failure; its peers will issue this call and wait for it, so
        // the communicator is out of step: later FP8 calls on it fail too, until it is aborted.
        p.state->fail(first_error);
        ++not_issued;
      } else if (p.state->dead.load(std::memory_order_acquire)) {
        FP8WIRE_ERROR("comm {}: destroyed or aborted while its {} was queued in an open group; not run",
                      p.state->id, to_string(p.call.collective));
        first_error = ncclInvalidUsage;
      } else if (const ncclResult_t failed = p.state->failed(); failed != ncclSuccess) {
        first_error = failed;
      } else {
        batch = coalesce_batch_length(config, p.state->res.layout.staging_bytes,
                                      std::span<const PendingShape>(tg.shapes.data() + i, count - i));
        // One algorithm for the whole batch: the first call's, planned on its own size. The batch is
        // routed again on its total size (carrier, gather step, stages), a function of the same
        // rank-identical inputs, so all ranks pack and route alike.
        for (size_t k = 1; k < batch; ++k)
          if (tg.pending[i + k].route.algorithm != p.route.algorithm) {
            batch = k;
            break;
          }
        Route route = p.route;
        if (batch > 1) {
          CallShape total = shape_of(p.call, p.state.get());
          total.count = 0;
          for (size_t k = 0; k < batch; ++k) total.count += tg.pending[i + k].call.count;
          route = route_fp8(config, facts_of(*p.state), total, p.route.algorithm);
        }
        const ncclResult_t res = run_fp8(p.state, p.call, route, p.seq, p.issue_ns, p.feedback_key,
                                         &tg.pending[i], batch, &joins);
        if (res != ncclSuccess) first_error = res;
      }
      i += batch;
    }
    const ncclResult_t joined = joins.join_all();
    if (first_error == ncclSuccess) first_error = joined;
  }
  if (not_issued)
    FP8WIRE_ERROR("{} queued FP8 call(s) of the group not issued after the failure above (NCCL {})", not_issued,
                  static_cast<int>(first_error));
  for (size_t i = 0; i < count; ++i) tg.pending[i].state.reset();  // release communicators now
  return first_error;
}

}  // namespace fp8wire::sched
