// The planner's one route per call (sched/plan/route.hpp): pinned against the decisions the engine
// took before the route existed, spread over submit (the path) and the FP8 call (gather step,
// carrier, stage size, the scratch fallback). `reference` below is that code, kept verbatim in
// substance; every case of a table of configurations, communicators, shapes and forced paths must
// route the same. A few named cases then check each reason the route gives.
#include <doctest/doctest.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "sched/plan/cost_model.hpp"
#include "sched/plan/hierarchy.hpp"
#include "sched/plan/route.hpp"

using namespace fp8wire;
using namespace fp8wire::sched;

namespace {

struct Outcome {
  Path path = Path::passthrough;
  Carrier carrier = Carrier::nccl;
  GatherMethod gather = GatherMethod::automatic;
  size_t stage = 0;
  Path inner = Path::passthrough;  // hierarchical only
  bool operator==(const Outcome&) const = default;
};

std::string show(const Outcome& o) {
  return std::string(to_string(o.path)) + " over " + to_string(o.carrier) + " gather " + to_string(o.gather) +
         " stage " + std::to_string(o.stage) + " inner " + to_string(o.inner);
}

// The decisions as submit.cpp (decide and its rules) and fp8_call.cpp (run_fp8) took them.
Outcome reference(const Config& config, const CommFacts& f, const CallShape& shape, std::optional<Path> forced) {
  const Outcome pass{};
  Outcome fallback;
  fallback.path = Path::fallback;
  if (forced && !is_fp8(*forced)) return pass;
  Config forced_rules = config;
  forced_rules.enable = true;
  forced_rules.collective_enable.fill(true);
  const Config& rules = forced ? forced_rules : config;
  CallShape unknown = shape;
  unknown.nranks = quant::kMaxReduceInputs;
  if (static_eligibility(rules, unknown) != PassReason::none) return pass;
  if (!forced && below_every_threshold(config, unknown)) return pass;
  if (!f.agreed) return pass;
  if (static_eligibility(rules, shape) != PassReason::none || (!forced && below_every_threshold(config, shape)))
    return pass;
  const Path path = forced ? *forced : plan_on(config, shape, f.fabric, f.topology, f.hierarchy_ready).path;
  if (!is_fp8(path)) {
    Outcome o;
    o.path = path;
    return o;
  }
  if (path == Path::hierarchical && (!f.hierarchy_ready || shape.collective == Collective::all_gather ||
                                     shape.collective == Collective::all_to_all))
    return fallback;
  if (!f.fp8_ok) return fallback;

  const quant::WireFormat format = quant::WireFormat::from(config);
  quant::ElemType type = quant::ElemType::f32;
  elem_type_of(shape.dtype, &type);
  const size_t es = quant::elem_size(type);
  const GatherMethod gather =
      has_gather_step(shape.collective, path)
          ? gather_method_for(config, shape.collective, path, threshold_bytes(shape), shape.nranks, f.fabric)
          : GatherMethod::automatic;
  Outcome o;
  o.path = path;
  o.gather = gather;
  Carrier transport = f.direct != Carrier::nccl
                                ? carrier_for(config, shape.collective, path, threshold_bytes(shape), shape.nranks,
                                                f.fabric, f.direct)
                                : Carrier::nccl;
  size_t direct_stage = 0;
  if (transport != Carrier::nccl) {
    direct_stage = direct_stage_elems(effective_cost_model(config, f.fabric), f.direct_set_bytes, shape.collective,
                                      path, shape.count, es, shape.nranks, format);
    if (direct_stage == 0) transport = Carrier::nccl;
  }
  o.carrier = transport;
  if (transport != Carrier::nccl) o.gather = GatherMethod::automatic;
  const Path inner = path == Path::hierarchical ? inner_path(config, shape, f.topology) : path;
  o.stage = transport != Carrier::nccl ? direct_stage
            : path == Path::hierarchical
                ? hierarchical_stage_elems(f.scratch, shape.collective, shape.count, es, f.hosts, f.ranks_per_host,
                                           inner, format)
                : stage_elems(config, f.scratch, shape.collective, path, shape.count, es, shape.nranks, format,
                              f.fabric);
  if (o.stage == 0) return fallback;
  if (path == Path::hierarchical) o.inner = inner;
  return o;
}

// The same through the route: the check before the registry's lookup, then route_call.
Outcome routed(const Config& config, const CommFacts& f, const CallShape& shape, std::optional<Path> forced) {
  CallShape unknown = shape;
  unknown.nranks = quant::kMaxReduceInputs;
  if (pass_before_lookup(config, unknown, forced) != PassReason::none) return {};
  const Route r = route_call(config, f, shape, forced);
  Outcome o;
  o.path = r.path;
  o.carrier = r.carrier;
  o.gather = r.gather;
  o.stage = is_fp8(r.path) ? r.stage_elems : 0;
  if (r.path == Path::hierarchical) o.inner = r.inner;
  return o;
}

struct Comm {
  const char* name;
  CommFacts facts;
  int nranks;
};

CommFacts flat(const Config& c, int n, Fabric fabric, bool ok = true,
               Carrier direct = Carrier::nccl, size_t set_bytes = 0) {
  CommFacts f;
  f.agreed = true;
  f.fp8_ok = ok;
  f.fabric = fabric;
  f.topology.hosts = 1;
  f.topology.ranks_per_host = n;
  f.topology.max_ranks_per_host = n;
  f.topology.intra = fabric;
  f.direct = direct;
  f.direct_set_bytes = set_bytes;
  f.scratch = scratch_layout(c);
  return f;
}

CommFacts spanning(const Config& c, int hosts, int per_host, bool ready, bool uneven = false) {
  CommFacts f = flat(c, hosts * per_host, Fabric::net);
  f.topology.hosts = hosts;
  f.topology.ranks_per_host = uneven ? 0 : per_host;
  f.topology.max_ranks_per_host = per_host;
  f.topology.intra = Fabric::nvlink;
  f.hierarchy_ready = ready;
  f.hosts = ready ? hosts : 0;
  f.ranks_per_host = ready ? per_host : 0;
  return f;
}

std::vector<std::pair<const char*, Config>> configs() {
  std::vector<std::pair<const char*, Config>> out;
  Config c;
  out.push_back({"default", c});
  for (Algorithm a : {Algorithm::one_shot, Algorithm::two_shot, Algorithm::ring}) {
    Config x = c;
    x.algorithm = a;
    out.push_back({"algorithm", x});
  }
  for (GatherMethod g : {GatherMethod::allgather, GatherMethod::sendrecv}) {
    Config x = c;
    x.gather_transport = g;
    out.push_back({"gather_transport", x});
  }
  Config all = c;
  all.collective_enable.fill(true);
  for (auto& per : all.thresholds) per.fill(0);
  out.push_back({"every collective, no threshold", all});
  Config off = c;
  off.enable = false;
  out.push_back({"disabled", off});
  Config pcie = all;
  pcie.fabric_override = Fabric::pcie;
  pcie.thresholds[0][static_cast<int>(Fabric::pcie)] = 8 << 20;
  // Above this threshold for the widest world (the check before the lookup), below it for 8 ranks.
  pcie.thresholds[1][static_cast<int>(Fabric::pcie)] = 24 << 20;
  out.push_back({"fabric override", pcie});
  Config tiny = all;
  tiny.scratch_max_bytes = 96 << 10;
  out.push_back({"tiny scratch", tiny});
  Config pipelined = all;
  pipelined.scratch_max_bytes = 8 << 20;
  pipelined.pipeline_chunk_bytes = 1 << 20;
  out.push_back({"pipelined", pipelined});
  Config direct_forced = all;
  direct_forced.direct_transport = DirectMode::peer_memory;
  for (CostModel& m : direct_forced.cost_model) m.direct_stage_bytes = 1 << 20;
  out.push_back({"direct forced", direct_forced});
  Config direct_host = all;
  direct_host.direct_transport = DirectMode::host_memory;
  out.push_back({"direct host forced", direct_host});
  Config measured = all;  // direct figures: auto may take the direct transport
  for (CostModel& m : measured.cost_model) {
    m.direct_latency_us = 5;
    m.direct_bandwidth_gbps = 200;
  }
  out.push_back({"direct measured", measured});
  Config calibrated = all;  // a calibrated network model of 2 x 4: the flat guard may let FP8 through
  calibrated.cost_model[static_cast<int>(Fabric::net)] = default_cost_model(Fabric::net);
  calibrated.cost_model[static_cast<int>(Fabric::net)].calibrated = true;
  calibrated.cost_model[static_cast<int>(Fabric::net)].hosts = 2;
  calibrated.cost_model[static_cast<int>(Fabric::net)].ranks_per_host = 4;
  out.push_back({"calibrated net 2x4", calibrated});
  Config no_hier = all;
  no_hier.hierarchy_enable = false;
  out.push_back({"hierarchy off", no_hier});
  return out;
}

}  // namespace

TEST_CASE("route: one planner call takes every decision the engine took before, case for case") {
  const std::vector<std::optional<Path>> forced = {std::nullopt,  Path::passthrough, Path::two_shot,
                                                   Path::one_shot, Path::ring,       Path::hierarchical};
  const size_t counts[] = {0, 1, 1000, 100000, 1 << 20, 6 << 20, 40 << 20};
  struct Kind {
    DataType dtype;
    ReduceOp op;
  };
  const Kind kinds[] = {{DataType::bf16, ReduceOp::sum}, {DataType::f32, ReduceOp::avg},
                        {DataType::f16, ReduceOp::sum},  {DataType::int32, ReduceOp::sum},
                        {DataType::bf16, ReduceOp::max}};
  size_t cases = 0, mismatches = 0;
  std::array<size_t, kPathCount> by_path{};
  std::array<size_t, 3> by_carrier{};
  size_t pipelined = 0;
  for (const auto& [config_name, config] : configs()) {
    std::vector<Comm> comms;
    {
      CommFacts never = flat(config, 4, Fabric::nvlink);
      never.agreed = false;
      comms.push_back({"not agreed", never, 4});
    }
    comms.push_back({"1 rank", flat(config, 1, Fabric::nvlink), 1});
    comms.push_back({"2 x nvlink", flat(config, 2, Fabric::nvlink), 2});
    comms.push_back({"8 x pcie", flat(config, 8, Fabric::pcie), 8});
    comms.push_back({"4 x net", flat(config, 4, Fabric::net), 4});
    comms.push_back({"4 x nvlink, FP8 ruled out", flat(config, 4, Fabric::nvlink, false), 4});
    comms.push_back({"4 x nvlink, peer memory", flat(config, 4, Fabric::nvlink, true, Carrier::peer_memory, 32 << 20),
                     4});
    comms.push_back({"8 x pcie, host memory", flat(config, 8, Fabric::pcie, true, Carrier::host_memory, 32 << 20), 8});
    comms.push_back({"4 x nvlink, small window",
                     flat(config, 4, Fabric::nvlink, true, Carrier::peer_memory, 24 << 10), 4});
    comms.push_back({"2 x 4 hosts, split", spanning(config, 2, 4, true), 8});
    comms.push_back({"2 x 4 hosts, not split", spanning(config, 2, 4, false), 8});
    comms.push_back({"2 hosts, uneven", spanning(config, 2, 4, false, true), 8});
    comms.push_back({"17 ranks", flat(config, 17, Fabric::net), 17});
    for (const Comm& comm : comms)
      for (Collective coll : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather,
                              Collective::all_to_all})
        for (const Kind& k : kinds)
          for (size_t count : counts)
            for (const auto& f : forced) {
              CallShape s;
              s.collective = coll;
              s.dtype = k.dtype;
              s.op = k.op;
              s.count = count;
              s.nranks = comm.nranks;
              const Outcome want = reference(config, comm.facts, s, f);
              const Outcome got = routed(config, comm.facts, s, f);
              ++cases;
              ++by_path[static_cast<size_t>(got.path)];
              ++by_carrier[static_cast<size_t>(got.carrier)];
              if (is_fp8(got.path) && got.stage < count) ++pipelined;
              if (!(want == got)) {
                if (++mismatches <= 10)
                  FAIL_CHECK(std::string(std::string(config_name) + " / " + comm.name + " / " + to_string(coll) + " x" +
                             std::to_string(count) + " forced " + (f ? to_string(*f) : "no") + ": was " +
                             show(want) + ", now " + show(got)));
              }
            }
  }
  CHECK(mismatches == 0);
  MESSAGE(cases << " cases");
  // The table reaches every outcome, so agreeing on it means something.
  for (Path p : {Path::passthrough, Path::two_shot, Path::one_shot, Path::ring, Path::fallback, Path::hierarchical})
    CHECK_MESSAGE(by_path[static_cast<size_t>(p)] > 0, to_string(p));
  for (Carrier t : {Carrier::nccl, Carrier::peer_memory, Carrier::host_memory})
    CHECK_MESSAGE(by_carrier[static_cast<size_t>(t)] > 0, to_string(t));
  CHECK(pipelined > 0);
}

TEST_CASE("route: each pass-through and fallback says why") {
  Config c;
  for (auto& per : c.thresholds) per.fill(0);
  const CommFacts four = flat(c, 4, Fabric::nvlink);
  CallShape s;
  s.dtype = DataType::bf16;
  s.count = 1 << 20;
  s.nranks = 4;

  CHECK(pass_before_lookup(c, s, Path::passthrough) == PassReason::forced);
  CHECK(route_call(c, four, s, Path::passthrough).reason == PassReason::forced);
  CommFacts never = four;
  never.agreed = false;
  CHECK(route_call(c, never, s, std::nullopt).reason == PassReason::not_agreed);
  CommFacts ruled_out = four;
  ruled_out.fp8_ok = false;
  const Route out = route_call(c, ruled_out, s, std::nullopt);
  CHECK(out.path == Path::fallback);
  CHECK(out.reason == PassReason::agreement);
  const Route no_hier = route_call(c, four, s, Path::hierarchical);
  CHECK(no_hier.path == Path::fallback);
  CHECK(no_hier.reason == PassReason::no_hierarchy);

  // A forced call ignores the switches, not the shape's rules.
  Config off = c;
  off.enable = false;
  CHECK(pass_before_lookup(off, s, Path::two_shot) == PassReason::none);
  CHECK(pass_before_lookup(off, s, std::nullopt) == PassReason::disabled);
  CallShape ints = s;
  ints.dtype = DataType::int32;
  CHECK(pass_before_lookup(off, ints, Path::two_shot) == PassReason::dtype);

  // No stage fits: fallback, but the planned algorithm stays (a group queues by it).
  Config tiny = c;
  tiny.scratch_max_bytes = 1 << 10;
  const Route none_fits = route_call(tiny, flat(tiny, 4, Fabric::nvlink), s, Path::two_shot);
  CHECK(none_fits.path == Path::fallback);
  CHECK(none_fits.reason == PassReason::scratch);
  CHECK(none_fits.algorithm == Path::two_shot);
  CHECK(none_fits.gather == GatherMethod::automatic);

  // A direct transport carries it: no NCCL gather step; one stage unit beyond its window: NCCL's.
  Config direct = c;
  direct.direct_transport = DirectMode::peer_memory;
  const Route d = route_call(direct, flat(direct, 4, Fabric::nvlink, true, Carrier::peer_memory, 32 << 20), s,
                             Path::two_shot);
  CHECK(d.path == Path::two_shot);
  CHECK(d.carrier == Carrier::peer_memory);
  CHECK(d.gather == GatherMethod::automatic);
  CHECK(d.stage_elems > 0);
  const Route small = route_call(direct, flat(direct, 4, Fabric::nvlink, true, Carrier::peer_memory, 256),
                                 s, Path::two_shot);
  CHECK(small.carrier == Carrier::nccl);
  CHECK(small.gather != GatherMethod::automatic);
  // The ring is never carried directly.
  CHECK(route_call(direct, flat(direct, 4, Fabric::nvlink, true, Carrier::peer_memory, 32 << 20), s,
                   Path::ring).carrier == Carrier::nccl);
}

TEST_CASE("route: a sweep's measured winners decide the algorithm and gather step at their rank count") {
  Config c;
  for (auto& per : c.thresholds) per.fill(1 << 20);
  const int ar = static_cast<int>(Collective::all_reduce), rs = static_cast<int>(Collective::reduce_scatter);
  const int net = static_cast<int>(Fabric::net);
  c.routes[ar][net] = {{4, 16ull << 20, true, Algorithm::two_shot, GatherMethod::allgather},
                       {4, 64ull << 20, true, Algorithm::two_shot, GatherMethod::sendrecv},
                       {4, 256ull << 20, false},
                       {8, 4ull << 20, true, Algorithm::one_shot, GatherMethod::automatic}};
  c.routes[rs][net] = {{4, 8ull << 20, false}};
  CallShape s;
  s.dtype = DataType::bf16;
  s.nranks = 4;
  auto route = [&](const Config& cfg, size_t bytes, int nranks = 4, Collective collective = Collective::all_reduce,
                   Fabric fabric = Fabric::net) {
    CallShape call = s;
    call.collective = collective;
    call.nranks = nranks;
    call.count = collective == Collective::reduce_scatter ? bytes / 2 / static_cast<size_t>(nranks) : bytes / 2;
    return route_call(cfg, flat(cfg, nranks, fabric), call, std::nullopt);
  };
  // Below the smallest measured size (the threshold still rules first): the smallest entry.
  CHECK(route(c, 512 << 10).reason == PassReason::below_threshold);
  Route r = route(c, 2 << 20);
  CHECK(r.path == Path::two_shot);
  CHECK(r.gather == GatherMethod::allgather);
  r = route(c, 63 << 20);
  CHECK(r.gather == GatherMethod::allgather);
  r = route(c, 64 << 20);
  CHECK(r.path == Path::two_shot);
  CHECK(r.gather == GatherMethod::sendrecv);
  r = route(c, 512 << 20);
  CHECK(r.path == Path::passthrough);
  CHECK(r.reason == PassReason::measured);
  // At 8 ranks its own entries; the one-shot measured without a gather step apart: the model's.
  r = route(c, 16 << 20, 8);
  CHECK(r.path == Path::one_shot);
  CHECK(r.gather == gather_method_for(c, Collective::all_reduce, Path::one_shot, 16 << 20, 8, Fabric::net));
  // A rank count, a fabric or a collective the sweep did not measure: the cost model, as before.
  Config unmeasured = c;
  for (auto& per : unmeasured.routes) for (auto& routes : per) routes.clear();
  for (auto [nranks, fabric] : {std::pair{2, Fabric::net}, {4, Fabric::pcie}}) {
    CAPTURE(nranks);
    const Route with = route(c, 64 << 20, nranks, Collective::all_reduce, fabric);
    const Route without = route(unmeasured, 64 << 20, nranks, Collective::all_reduce, fabric);
    CHECK(with.path == without.path);
    CHECK(with.gather == without.gather);
  }
  CHECK(route(c, 64 << 20, 4, Collective::reduce_scatter).reason == PassReason::measured);
  CHECK(route(c, 4 << 20, 4, Collective::reduce_scatter).path == Path::passthrough);  // the smallest entry
  CHECK(route(c, 64 << 20, 8, Collective::reduce_scatter).path == Path::two_shot);
  // A forced algorithm, or a forced gather step, wins over what was measured.
  Config forced = c;
  forced.algorithm = Algorithm::one_shot;
  CHECK(route(forced, 64 << 20).path == Path::one_shot);
  CHECK(route(forced, 512 << 20).path == Path::one_shot);
  Config pinned = c;
  pinned.gather_transport = GatherMethod::allgather;
  CHECK(route(pinned, 64 << 20).gather == GatherMethod::allgather);
  // The routes are part of the configuration every rank must share.
  CHECK(config_fingerprint(c) != config_fingerprint(unmeasured));
}

TEST_CASE("route: the direct kinds a communicator tries at its creation, from what every rank gathered") {
  auto ranks = [](int n, bool p2p_off_on_one = false, bool two_hosts = false) {
    std::vector<RankFacts> facts(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      facts[static_cast<size_t>(r)].host_hash = two_hosts && r >= n / 2 ? 2 : 1;
      facts[static_cast<size_t>(r)].p2p_disabled = p2p_off_on_one && r == n - 1;
    }
    return facts;
  };
  using Kinds = std::vector<Carrier>;
  Config c;  // direct.transport auto
  // auto: only where the fabric's model has direct figures (pcie's built-in ones; nvlink and net none).
  CHECK(direct_carriers(c, Fabric::pcie, ranks(4), 16) == Kinds{Carrier::peer_memory, Carrier::host_memory});
  CHECK(direct_carriers(c, Fabric::nvlink, ranks(4), 16).empty());
  CHECK(direct_carriers(c, Fabric::net, ranks(4), 16).empty());
  // One rank with P2P disabled: host memory only.
  CHECK(direct_carriers(c, Fabric::pcie, ranks(4, true), 16) == Kinds{Carrier::host_memory});
  // Ranks on two hosts share no memory, unless the configuration says they are one machine's.
  CHECK(direct_carriers(c, Fabric::pcie, ranks(4, false, true), 16).empty());
  Config one_host = c;
  one_host.direct_assume_one_host = true;
  CHECK(direct_carriers(one_host, Fabric::pcie, ranks(4, false, true), 16).size() == 2);
  // More ranks than one fused reduce takes: none.
  CHECK(direct_carriers(c, Fabric::pcie, ranks(17), 16).empty());
  // A kind named by the configuration is tried alone, on any fabric; off tries none.
  Config host = c;
  host.direct_transport = DirectMode::host_memory;
  CHECK(direct_carriers(host, Fabric::net, ranks(2), 16) == Kinds{Carrier::host_memory});
  Config peer = c;
  peer.direct_transport = DirectMode::peer_memory;
  CHECK(direct_carriers(peer, Fabric::nvlink, ranks(2, true), 16) == Kinds{Carrier::peer_memory});
  Config off = c;
  off.direct_transport = DirectMode::off;
  CHECK(direct_carriers(off, Fabric::pcie, ranks(2), 16).empty());
}

TEST_CASE("route: the all-to-all goes over the windows where the communicator has them, else over NCCL's transports staged like the reduce-scatter; its hierarchical path forced falls back") {
  Config c;
  c.collective_enable.fill(true);
  for (auto& per : c.thresholds) per.fill(0);
  c.direct_transport = DirectMode::peer_memory;
  CallShape s;
  s.collective = Collective::all_to_all;
  s.dtype = DataType::bf16;
  s.count = 1 << 20;
  s.nranks = 4;
  const CommFacts windows = flat(c, 4, Fabric::nvlink, true, Carrier::peer_memory, 32 << 20);
  const Route w = route_call(c, windows, s, std::nullopt);
  CHECK(w.path == Path::one_shot);
  CHECK(w.carrier == Carrier::peer_memory);
  CHECK(w.stage_elems == direct_stage_elems(effective_cost_model(c, Fabric::nvlink), windows.direct_set_bytes,
                                            Collective::all_to_all, Path::one_shot, s.count, 2, 4,
                                            quant::WireFormat::from(c)));
  const CommFacts no_windows = flat(c, 4, Fabric::nvlink, true, Carrier::nccl, 0);
  const Route r = route_call(c, no_windows, s, std::nullopt);
  CHECK(r.path == Path::one_shot);
  CHECK(r.algorithm == Path::one_shot);
  CHECK(r.carrier == Carrier::nccl);
  CHECK(r.gather == GatherMethod::automatic);  // no gather step
  CHECK(r.stage_elems == stage_elems(c, no_windows.scratch, Collective::all_to_all, Path::one_shot, s.count, 2, 4,
                                     quant::WireFormat::from(c), Fabric::nvlink));
  const Route forced = route_call(c, spanning(c, 2, 2, true), s, Path::hierarchical);
  CHECK(forced.path == Path::fallback);
  CHECK(forced.reason == PassReason::no_hierarchy);
  // Other dtypes pass through before the registry's lookup, exactly (NCCL's own call).
  CallShape ints = s;
  ints.dtype = DataType::int32;
  CHECK(pass_before_lookup(c, ints, std::nullopt) == PassReason::dtype);
  Config off;
  CHECK(pass_before_lookup(off, s, std::nullopt) == PassReason::collective_disabled);
}
