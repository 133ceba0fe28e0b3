// The planner's recipe per call (sched/plan/recipe.hpp): pinned against the decisions the engine took
// before the recipe existed, spread over engine/fp8_call.cpp (the guard's choice, the audit, error
// feedback, the direct options it passed to the stage operations) and exec/pipeline.cpp (copy lanes,
// the produce gate, paced sends), with the configuration's defaults of then for the switches the
// protocols replaced (own data on the device, copy-in, copy-out, early copy-in, paced sends and copy
// lanes all on). `reference` below is that code, kept in substance; every case of a table of
// configurations, communicators, routes, calls and guard states must give the same recipe. Named
// cases then check the protocol override and the guard's sequence through a trip.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "sched/plan/recipe.hpp"

using namespace fp8wire;
using namespace fp8wire::sched;

namespace {

// What the engine decided, field by field.
struct Decisions {
  bool active = false;
  uint64_t scope = 0;
  bool full_precision = false, measured = false, guarded = false, tripped = false, resumed = false;
  uint64_t calls_after = 0, full_until = 0, resume_at = 0, decide_at = 0, audit_calls_after = 0;
  bool audited = false, feedback = false;
  float post = 1.0f;
  DirectProtocol protocol = DirectProtocol::automatic;
  LaneHandover handover = LaneHandover::before_finish;
  bool paced = false;
  uint32_t ctas = 0;
  size_t device_set_bytes = 0;
  bool operator==(const Decisions&) const = default;
};

std::string show(const Decisions& d) {
  return fmt::format("active {} scope {} full {} measured {} guarded {} tripped {} resumed {} calls {} full_until {} "
                     "resume_at {} decide_at {} audit {}/{} feedback {} post {} protocol {} handover {} paced {} "
                     "ctas {} device set {}",
                     d.active, d.scope, d.full_precision, d.measured, d.guarded, d.tripped, d.resumed, d.calls_after,
                     d.full_until, d.resume_at, d.decide_at, d.audited, d.audit_calls_after, d.feedback, d.post,
                     to_string(d.protocol), to_string(d.handover), d.paced, d.ctas, d.device_set_bytes);
}

// The engine's decisions as fp8_call.cpp, the telemetry monitor's begin and pipeline.cpp took them.
Decisions reference(const Config& config, const CommFacts& f, const CallShape& call, const Route& route,
                    const CallContext& ctx) {
  Decisions d;
  const GuardSettings g = GuardSettings::from(config);
  bool plain = !is_fp8(route.path);
  if (g.sample_every != 0 || config.audit_every != 0) {  // telemetry_begin
    d.active = true;
    d.scope = ctx.batch > 1 ? 0 : ctx.feedback_key;
    ScopeState scope = ctx.scope;
    const uint64_t this_call = scope.calls;
    if (!ctx.capturing && this_call >= scope.decide_at && scope.has_decision) {
      scope.has_decision = false;
      d.tripped = apply_decision(scope, scope.decision, g.retry_after);
    }
    const bool eligible = guard_eligible(call, route, quant::WireFormat::from(config));
    const CallChoice choice = choose(scope, g, eligible, ctx.capturing);
    d.full_precision = choice.full_precision;
    d.decide_at = this_call + g.decide_after;
    if (!choice.full_precision) {
      d.resumed = scope.resume_at != 0 && this_call == scope.resume_at;
      d.measured = choice.measure;
      d.guarded = choice.guard;
    }
    d.calls_after = scope.calls;
    d.full_until = scope.full_until;
    d.resume_at = scope.resume_at;
    d.audit_calls_after = ctx.audit_calls;
    plain = plain || choice.full_precision;
    if (!plain && ctx.batch == 1 && !ctx.capturing && !ctx.grouped && config.audit_every > 0) {  // audit_due
      d.audited = ctx.audit_calls % config.audit_every == 0;
      d.audit_calls_after = ctx.audit_calls + 1;
    }
  }
  if (plain) return d;
  d.post = call.op == ReduceOp::avg ? 1.0f / static_cast<float>(call.nranks) : 1.0f;
  d.feedback = config.error_feedback && call.collective == Collective::all_reduce && ctx.batch == 1 &&
               (route.path == Path::one_shot || route.path == Path::two_shot);
  if (route.carrier == Carrier::nccl) return d;
  // The direct options of then, at their defaults: own data on the device (host memory), copy-in,
  // copy-out and early copy-in with it, paced sends (host memory), copy lanes.
  const bool host = route.carrier == Carrier::host_memory;
  d.protocol = host ? DirectProtocol::copy_engine : DirectProtocol::kernels;
  d.ctas = config.direct_ctas;
  if (host) d.device_set_bytes = f.scratch.set_bytes_for(f.direct_sets);
  const bool early_copy_in = host;
  const bool has_gather = call.collective == Collective::all_reduce && route.path == Path::two_shot;
  d.paced = host && !has_gather;
  d.handover = !ctx.capturing ? LaneHandover::copy_lanes
               : early_copy_in ? LaneHandover::produce_gate
                               : LaneHandover::before_finish;
  return d;
}

Decisions of(const Recipe& r) {
  const Watch& w = r.watch;
  Decisions d;
  if (w.active)
    d = {.active = true, .scope = w.scope, .full_precision = w.full_precision, .measured = w.measured,
         .guarded = w.guarded, .tripped = w.tripped, .resumed = w.resumed, .calls_after = w.scope_after.calls,
         .full_until = w.scope_after.full_until, .resume_at = w.scope_after.resume_at, .decide_at = w.decide_at,
         .audit_calls_after = w.audit_calls_after, .audited = w.audited};
  if (r.plain()) return d;
  d.post = r.post;
  d.feedback = r.feedback;
  d.protocol = r.direct.protocol;
  d.handover = r.direct.handover;
  d.paced = r.direct.paced_sends;
  d.ctas = r.direct.protocol == DirectProtocol::automatic ? 0 : r.direct.window_ctas;
  d.device_set_bytes = r.direct.device_set_bytes;
  return d;
}

std::vector<Config> configs() {
  std::vector<Config> out;
  Config base;
  out.push_back(base);
  Config off = base;
  off.telemetry_sample_every = 0;
  out.push_back(off);
  Config guard = base;
  guard.guard_enable = true;
  guard.telemetry_sample_every = 4;
  guard.guard_retry_after = 3;
  guard.guard_decide_after = 2;
  out.push_back(guard);
  Config forever = guard;
  forever.guard_retry_after = 0;
  out.push_back(forever);
  Config audit = base;
  audit.audit_every = 3;
  audit.telemetry_sample_every = 0;
  out.push_back(audit);
  Config feedback = guard;
  feedback.error_feedback = true;
  feedback.audit_every = 2;
  feedback.scale_type = ScaleType::e8m0;
  out.push_back(feedback);
  Config ctas = base;
  ctas.direct_ctas = 7;
  ctas.direct_sets = 4;
  out.push_back(ctas);
  return out;
}

std::vector<ScopeState> scopes() {
  std::vector<ScopeState> out;
  out.push_back({});                          // the scope's first call
  ScopeState sampled;
  sampled.calls = 8;                          // a measured call with sample_every 4 or 16
  out.push_back(sampled);
  ScopeState deciding;                        // a guarded call's decision read, not due yet
  deciding.calls = 5;
  deciding.decide_at = 6;
  deciding.has_decision = true;
  deciding.decision = true;
  out.push_back(deciding);
  ScopeState due = deciding;                  // and due now: it trips
  due.calls = 6;
  out.push_back(due);
  ScopeState calm = due;                      // due, no vote
  calm.decision = false;
  out.push_back(calm);
  ScopeState full;                            // in a spell of full precision
  full.calls = 7;
  full.full_until = 9;
  full.resume_at = 9;
  out.push_back(full);
  ScopeState resume = full;                   // its first call back in FP8
  resume.calls = 9;
  out.push_back(resume);
  ScopeState pending;                         // a guarded call in flight: no second vote
  pending.calls = 12;
  pending.pending = 5;
  pending.decide_at = 14;
  out.push_back(pending);
  return out;
}

// An agreed FP8 communicator's facts, and an FP8 route on `path` over NCCL.
CommFacts fp8_facts() {
  CommFacts f;
  f.agreed = f.fp8_ok = true;
  return f;
}
Route fp8_route(Path path) {
  Route route;
  route.path = route.algorithm = path;
  return route;
}

}  // namespace

TEST_CASE("recipe: the engine's decisions of every call, field by field, from the configuration, the facts, the call and the scope's state") {
  size_t cases = 0;
  std::vector<std::string> failures;
  for (const Config& config : configs()) {
    for (Carrier carrier : {Carrier::nccl, Carrier::peer_memory, Carrier::host_memory}) {
      CommFacts f;
      f.agreed = f.fp8_ok = true;
      f.scratch = scratch_layout(config);
      if (carrier != Carrier::nccl) {
        f.direct = carrier;
        f.direct_sets = static_cast<int>(config.direct_sets);
      }
      for (Collective collective : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather}) {
        for (Path path : {Path::two_shot, Path::one_shot, Path::ring, Path::hierarchical, Path::fallback}) {
          const bool direct = carrier != Carrier::nccl && is_fp8(path) && path != Path::ring && path != Path::hierarchical;
          if (carrier != Carrier::nccl && !direct) continue;  // only those paths go direct
          Route route;
          route.path = route.algorithm = path;
          route.carrier = direct ? carrier : Carrier::nccl;
          route.stage_elems = 4096;
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
            for (bool capturing : {false, true}) {
              for (bool grouped : {false, true}) {
                for (size_t batch : {size_t{1}, size_t{3}}) {
                  for (uint64_t key : {uint64_t{0}, uint64_t{42}}) {
                    for (const ScopeState& scope : scopes()) {
                      for (uint64_t audit_calls : {uint64_t{0}, uint64_t{4}}) {
                        CallShape call{collective, DataType::bf16, op, 1000, 4};
                        const CallContext ctx{.capturing = capturing, .grouped = grouped, .batch = batch,
                                              .feedback_key = key, .scope = scope, .audit_calls = audit_calls};
                        const Decisions want = reference(config, f, call, route, ctx);
                        const Decisions got = of(recipe_for(config, f, call, route, ctx));
                        ++cases;
                        if (!(got == want))
                          failures.push_back(fmt::format("{} {} over {} cap {} grouped {} batch {} key {} scope calls "
                                                         "{}:\n  want {}\n  got  {}",
                                                         to_string(collective), to_string(path), to_string(carrier),
                                                         capturing, grouped, batch, key, scope.calls, show(want),
                                                         show(got)));
                      }
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  MESSAGE(cases << " cases, " << failures.size() << " differ");
  CHECK_MESSAGE(failures.empty(), (failures.empty() ? std::string() : failures.front()));
  CHECK(cases > 10000);
}

TEST_CASE("recipe: the direct protocol is the window kind's unless direct.protocol overrides it over host memory") {
  Config c;
  CHECK(direct_protocol_for(c, Carrier::host_memory) == DirectProtocol::copy_engine);
  CHECK(direct_protocol_for(c, Carrier::peer_memory) == DirectProtocol::kernels);
  c.direct_protocol = DirectProtocol::kernels;
  CHECK(direct_protocol_for(c, Carrier::host_memory) == DirectProtocol::kernels);
  c.direct_protocol = DirectProtocol::copy_engine;
  CHECK(direct_protocol_for(c, Carrier::host_memory) == DirectProtocol::copy_engine);
  CHECK(direct_protocol_for(c, Carrier::peer_memory) == DirectProtocol::kernels);  // no copy engine between GPUs' memory here
  // The kernels protocol over host memory: no device set, no pacing; copy lanes outside capture, the
  // hand-over before the finish under it.
  c.direct_protocol = DirectProtocol::kernels;
  CommFacts f;
  f.agreed = f.fp8_ok = true;
  f.direct = Carrier::host_memory;
  f.scratch = scratch_layout(c);
  Route route;
  route.path = route.algorithm = Path::one_shot;
  route.carrier = Carrier::host_memory;
  CallShape call{Collective::all_reduce, DataType::bf16, ReduceOp::sum, 4096, 2};
  CallContext ctx;
  Recipe r = recipe_for(c, f, call, route, ctx);
  CHECK(r.direct.protocol == DirectProtocol::kernels);
  CHECK(r.direct.device_set_bytes == 0);
  CHECK_FALSE(r.direct.paced_sends);
  CHECK(r.direct.handover == LaneHandover::copy_lanes);
  ctx.capturing = true;
  r = recipe_for(c, f, call, route, ctx);
  CHECK(r.direct.handover == LaneHandover::before_finish);
  // The recipe carries the wire format and the conversion path the kernels use.
  c.block_size = 64;
  c.convert_path = ConvertPath::software;
  r = recipe_for(c, f, call, route, ctx);
  CHECK(r.format.block == 64);
  CHECK(r.convert_path == ConvertPath::software);
}

TEST_CASE("recipe: a scope through a guard trip, its full-precision spell and its return, call by call") {
  Config c;
  c.guard_enable = true;
  c.telemetry_sample_every = 4;
  c.guard_decide_after = 2;
  c.guard_retry_after = 3;
  const CommFacts f = fp8_facts();
  const Route route = fp8_route(Path::two_shot);
  CallShape call{Collective::all_reduce, DataType::bf16, ReduceOp::sum, 4096, 2};
  CallContext ctx;
  ctx.feedback_key = 9;
  // Call 0 is measured and guarded; its votes (set) are read at call 2, which then runs in full
  // precision with calls 3 and 4; call 5 is FP8 again, measured and guarded.
  std::vector<std::string> seen;
  for (int i = 0; i < 7; ++i) {
    if (i == 1) {  // the monitor folded call 0's record: a decision, due at call 2
      ctx.scope.has_decision = true;
      ctx.scope.decision = true;
      ctx.scope.decide_at = 2;
    }
    const Recipe r = recipe_for(c, f, call, route, ctx);
    CHECK(r.watch.scope == 9);
    seen.push_back(fmt::format("{}{}{}{}{}", r.watch.full_precision ? "F" : "-", r.watch.measured ? "M" : "-",
                               r.watch.guarded ? "G" : "-", r.watch.tripped ? "T" : "-", r.watch.resumed ? "R" : "-"));
    ctx.scope = r.watch.scope_after;
    if (r.watch.decision_read) ctx.scope.has_decision = false;
  }
  CHECK(seen == std::vector<std::string>{"-MG--", "-----", "F--T-", "F----", "F----", "-MG-R", "-----"});
}

TEST_CASE("recipe: the all-to-all is guarded in one stage of whole blocks only, never fed back, nothing applied before decoding") {
  Config c;
  c.guard_enable = true;
  c.error_feedback = true;
  c.telemetry_sample_every = 1;
  const CommFacts f = fp8_facts();
  Route route = fp8_route(Path::one_shot);
  route.stage_elems = 4096;
  CallShape call{Collective::all_to_all, DataType::bf16, ReduceOp::sum, 4096, 4};  // the engine passes sum
  CallContext ctx;
  ctx.feedback_key = 3;
  const Recipe r = recipe_for(c, f, call, route, ctx);
  CHECK(r.watch.measured);
  CHECK(r.watch.guarded);  // one launch over every chunk casts the whole vote onto each (sched/plan/guard.hpp)
  CHECK_FALSE(r.feedback);
  CHECK(r.post == 1.0f);
  CHECK(r.direct.protocol == DirectProtocol::automatic);
  // Measured only: pipelined (a stage's launches cover one peer each), a count of partial blocks
  // (likewise), a scale without a spare bit.
  Route pipelined = route;
  pipelined.stage_elems = 2048;
  CHECK_FALSE(recipe_for(c, f, call, pipelined, ctx).watch.guarded);
  CallShape ragged = call;
  ragged.count = 4000;
  route.stage_elems = 4000;
  CHECK_FALSE(recipe_for(c, f, ragged, route, ctx).watch.guarded);
  Config e8m0 = c;
  e8m0.scale_type = ScaleType::e8m0;
  route.stage_elems = 4096;
  CHECK(recipe_for(e8m0, f, call, route, ctx).watch.measured);
  CHECK_FALSE(recipe_for(e8m0, f, call, route, ctx).watch.guarded);
}

TEST_CASE("recipe: a message is watched at its sending end only, by the pair's own count, never guarded or scoped") {
  Config c;
  c.guard_enable = true;
  c.telemetry_sample_every = 2;
  c.audit_every = 3;
  const CommFacts f = fp8_facts();
  const Route route = fp8_route(Path::one_shot);
  const CallShape call{Collective::send_recv, DataType::bf16, ReduceOp::sum, 4096, 2};
  std::vector<std::string> sent, received;
  for (uint64_t k = 0; k < 6; ++k)
    for (PeerDirection end : {PeerDirection::send, PeerDirection::recv}) {
      CallContext ctx;
      ctx.peer = PeerCall{end, 1, k};
      ctx.audit_calls = 1;  // the communicator's own count: a message neither reads nor moves it
      const Recipe r = recipe_for(c, f, call, route, ctx);
      CHECK(r.peer.pair_seq == k);
      CHECK_FALSE(r.watch.scoped);
      CHECK_FALSE(r.watch.guarded);
      CHECK_FALSE(r.watch.full_precision);
      CHECK_FALSE(r.plain());
      (end == PeerDirection::send ? sent : received)
          .push_back(fmt::format("{}{}{}", r.watch.active ? "A" : "-", r.watch.measured ? "M" : "-",
                                 r.watch.audited ? "U" : "-"));
    }
  CHECK(sent == std::vector<std::string>{"AMU", "---", "AM-", "A-U", "AM-", "---"});
  CHECK(received == std::vector<std::string>(6, "---"));
  // Under capture nothing is measured or audited (the record could not be read back per replay).
  CallContext captured;
  captured.capturing = true;
  captured.peer = PeerCall{PeerDirection::send, 1, 0};
  CHECK_FALSE(recipe_for(c, f, call, route, captured).watch.active);
}
