#include "sched/plan/recipe.hpp"

#include "quant/telemetry.hpp"

namespace fp8wire::sched {

const char* to_string(LaneHandover h) {
  switch (h) {
    case LaneHandover::before_finish: return "before_finish";
    case LaneHandover::produce_gate: return "produce_gate";
    case LaneHandover::copy_lanes: return "copy_lanes";
  }
  return "unknown";
}

DirectProtocol direct_protocol_for(const Config& config, Carrier kind) {
  if (kind == Carrier::peer_memory) return DirectProtocol::kernels;
  return config.direct_protocol == DirectProtocol::automatic ? DirectProtocol::copy_engine : config.direct_protocol;
}

namespace {

DirectRecipe direct_recipe(const Config& config, const CommFacts& comm, const CallShape& call, const Route& route,
                           bool capturing) {
  DirectRecipe d;
  if (route.carrier == Carrier::nccl || !is_fp8(route.path)) return d;
  d.protocol = direct_protocol_for(config, route.carrier);
  d.window_ctas = config.direct_ctas;
  const bool copies = d.protocol == DirectProtocol::copy_engine;
  d.handover = !capturing ? LaneHandover::copy_lanes : copies ? LaneHandover::produce_gate : LaneHandover::before_finish;
  if (!copies) return d;
  // The device scratch cut into the windows' buffer sets, one per stage as over the windows.
  d.device_set_bytes = comm.scratch.set_bytes_for(comm.direct_sets);
  d.paced_sends = !(call.collective == Collective::all_reduce && route.path == Path::two_shot);
  return d;
}

// The guard's and the audit's part (sched/plan/guard.hpp): the scope's pending decision read where it
// is due (never under capture: another rank may not have the record yet; both apply it at the scope's
// first call outside capture), then the scope's choice for this call.
Watch watch_for(const Config& config, const CallShape& call, const Route& route, const quant::WireFormat& format,
                const CallContext& context) {
  Watch w;
  w.guard = GuardSettings::from(config);
  w.active = w.guard.sample_every > 0 || config.audit_every > 0;
  if (!w.active) return w;
  w.scope = guard_scope(context.batch, context.feedback_key);
  ScopeState scope = context.scope;
  const uint64_t index = scope.calls;
  if (!context.capturing && index >= scope.decide_at && scope.has_decision) {
    w.decision_read = true;
    scope.has_decision = false;
    w.tripped = apply_decision(scope, scope.decision, w.guard.retry_after);
  }
  const bool eligible = guard_eligible(call, route, format);
  const CallChoice choice = choose(scope, w.guard, eligible, context.capturing);
  w.full_precision = choice.full_precision;
  w.measured = choice.measure;
  w.guarded = choice.guard;
  w.resumed = !choice.full_precision && scope.resume_at != 0 && index == scope.resume_at;
  w.decide_at = index + w.guard.decide_after;
  w.scope_after = scope;
  // Every audit.every-th call of the communicator that is neither coalesced, grouped nor captured (a
  // count every rank keeps alike): its read-back waits for the call to have joined the caller.
  const bool auditable = config.audit_every > 0 && is_fp8(route.path) && !w.full_precision && context.batch == 1 &&
                         !context.capturing && !context.grouped;
  w.audit_calls_after = context.audit_calls + (auditable ? 1 : 0);
  w.audited = auditable && context.audit_calls % config.audit_every == 0;
  return w;
}

// A message's watch, at its sending end only: every telemetry.sample_every-th message of the pair is
// measured, every audit.every-th audited. The receiver's result is the decode of the wire, bit for
// bit, so the sender's own decode of it beside the caller's data is the message's true error, with
// no second message. Both are rank-local (no peer reads them), so neither moves a count the
// communicator's ranks keep alike. Never guarded: both ends would have to switch at the same message,
// and the receiver holds the sender's vote only once the application's group around the message has
// ended, which may be after the message that was to read it (sched/README.md, "Point-to-point").
Watch message_watch(const Config& config, const CallContext& context) {
  Watch w;
  w.guard = GuardSettings::from(config);
  w.scoped = false;
  if (context.peer.direction != PeerDirection::send || context.capturing) return w;
  const uint64_t n = context.peer.pair_seq;
  w.measured = w.guard.sample_every > 0 && n % w.guard.sample_every == 0;
  w.audited = config.audit_every > 0 && n % config.audit_every == 0;
  w.active = w.measured || w.audited;
  return w;
}

}  // namespace

Recipe recipe_for(const Config& config, const CommFacts& comm, const CallShape& call, const Route& route,
                  const CallContext& context) {
  Recipe r;
  r.route = route;
  r.format = quant::WireFormat::from(config);
  r.convert_path = config.convert_path;
  if (call.collective == Collective::send_recv) {
    // A message: its wire format, its pair, and what its sending end measures.
    r.peer = context.peer;
    r.watch = message_watch(config, context);
    return r;
  }
  r.watch = watch_for(config, call, route, r.format, context);
  if (r.watch.full_precision) return r;
  r.direct = direct_recipe(config, comm, call, route, context.capturing);
  r.post = call.op == ReduceOp::avg ? 1.0f / static_cast<float>(call.nranks) : 1.0f;
  r.feedback = config.error_feedback && call.collective == Collective::all_reduce && context.batch == 1 &&
               (route.path == Path::one_shot || route.path == Path::two_shot);
  return r;
}

}  // namespace fp8wire::sched
