#include "sched/plan/guard.hpp"

namespace fp8wire::sched {

GuardSettings GuardSettings::from(const Config& c) {
  GuardSettings g;
  g.sample_every = c.telemetry_sample_every;
  g.enable = c.guard_enable;
  g.retry_after = c.guard_retry_after;
  g.decide_after = c.guard_decide_after > 0 ? c.guard_decide_after : 1;
  g.bounds.max_rel_error = c.guard_max_rel_error;
  g.bounds.max_saturated = c.guard_max_saturated;
  g.bounds.max_flushed = c.guard_max_flushed;
  g.bounds.max_nonfinite = c.guard_max_nonfinite;
  return g;
}

bool guard_eligible(const CallShape& call, const Route& route, const quant::WireFormat& format) {
  if (!quant::guard_flag_supported(format.scale)) return false;
  switch (call.collective) {
    case Collective::all_gather: return true;
    case Collective::all_reduce: return route.path == Path::one_shot || route.path == Path::two_shot;
    case Collective::all_to_all:  // over NCCL's transports: its one launch casts the vote onto every slot
      return route.carrier == Carrier::nccl && call.count > 0 && call.count % format.block == 0 &&
             stage_count(call.count, route.stage_elems) == 1;
    default: return false;
  }
}

CallChoice choose(ScopeState& scope, const GuardSettings& g, bool eligible, bool capturing) {
  const uint64_t n = scope.calls++;
  CallChoice c;
  if (n < scope.full_until) {
    c.full_precision = true;
    return c;
  }
  c.measure = !capturing && g.sample_every > 0 && (n % g.sample_every == 0 || n == scope.resume_at);
  c.guard = c.measure && g.enable && eligible && !scope.deciding();
  return c;
}

bool apply_decision(ScopeState& scope, bool decided, uint32_t retry_after) {
  if (!decided) return false;
  scope.full_until = retry_after == 0 ? UINT64_MAX : scope.calls + retry_after;
  scope.resume_at = scope.full_until;
  return true;
}

}  // namespace fp8wire::sched
