// Jobs spanning hosts over the simulated machine (sched/plan/hierarchy.hpp):
//   - the guard: which route each shape takes (flat, hierarchical, pass-through), as a table;
//   - the hierarchical all-reduce and reduce-scatter, for 2..8 hosts x 1..8 ranks per host, every
//     dtype, sum/avg, odd counts, one stage and many: bit for bit the reference (the simulator's
//     reduce-scatter in the caller's dtype inside each host, then the FP8 algorithm among the
//     rails), identical on every rank, within the bound of the fp64 sum (one or two quantizations
//     of the host sums, plus the dtype's rounding of them);
//   - the host map forced by configuration (hierarchy.ranks_per_host) on ranks NCCL sees as hosts
//     of their own; uneven hosts pass through.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/log.hpp"
#include "quant/reference.hpp"
#include "sched/algorithms/algorithms.hpp"
#include "sched/plan/hierarchy.hpp"
#include "sched/plan/stages.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::sched;
using namespace fp8wire::simtest;

namespace {

Topology topo(int hosts, int per_host, bool uneven = false) {
  Topology t;
  t.hosts = hosts;
  t.ranks_per_host = uneven ? 0 : per_host;
  t.max_ranks_per_host = per_host;
  t.intra = Fabric::nvlink;
  return t;
}

CallShape ar(uint64_t bytes, int nranks) {
  CallShape c;
  c.collective = Collective::all_reduce;
  c.dtype = DataType::bf16;
  c.count = bytes / 2;
  c.nranks = nranks;
  return c;
}

// Host partial sums as the simulator's reduce-scatter makes them: fp32 sum over the host's ranks in
// local-rank order, rounded to the dtype.
Bytes host_sum(const std::vector<Bytes>& inputs, const Spec& s, const std::vector<int>& members, size_t first,
               size_t count) {
  const quant::ElemType t = elem_type(s.dtype);
  Bytes out(count * quant::elem_size(t));
  for (size_t e = 0; e < count; ++e) {
    float acc = quant::ref::load_elem(inputs[static_cast<size_t>(members[0])].data(), t, first + e);
    for (size_t j = 1; j < members.size(); ++j)
      acc += quant::ref::load_elem(inputs[static_cast<size_t>(members[j])].data(), t, first + e);
    quant::ref::store_elem(out.data(), t, e, acc);
  }
  return out;
}

// The reference of the hierarchical all-reduce on ranks laid out host after host (rank = h * L + l).
Bytes expected_hierarchical_ar(const Spec& s, const std::vector<Bytes>& inputs, int H, int L, Path inner,
                               const quant::WireFormat& f, size_t stage) {
  const size_t es = dtype_size(s.dtype);
  const int n = H * L;
  const float post = s.op == ReduceOp::avg ? 1.0f / static_cast<float>(n) : 1.0f;
  Bytes out(s.count * es);
  for (size_t off = 0; off < s.count; off += stage) {
    const size_t len = std::min(stage, s.count - off);
    const size_t q = (len + static_cast<size_t>(L) - 1) / static_cast<size_t>(L);
    for (int l = 0; l < L; ++l) {
      // Each host's partial of shard l (zero beyond the stage), the FP8 all-reduce over the hosts.
      std::vector<Bytes> partials;
      for (int h = 0; h < H; ++h) {
        std::vector<int> members;
        for (int k = 0; k < L; ++k) members.push_back(h * L + k);
        Bytes p(q * es, 0);
        const size_t first = off + static_cast<size_t>(l) * q;
        const size_t valid = first < off + len ? std::min(q, off + len - first) : 0;
        if (valid) {
          const Bytes part = host_sum(inputs, s, members, first, valid);
          std::copy(part.begin(), part.end(), p.begin());
        }
        partials.push_back(p);
      }
      Spec shard = s;
      shard.count = q;
      shard.path = inner;
      const Bytes r = expected_output(shard, partials, 0, f, q, post);
      const size_t first = off + static_cast<size_t>(l) * q;
      for (size_t e = 0; e < q && first + e < off + len; ++e)
        std::copy(r.begin() + static_cast<long>(e * es), r.begin() + static_cast<long>((e + 1) * es),
                  out.begin() + static_cast<long>((first + e) * es));
    }
  }
  return out;
}

// The reference of the hierarchical reduce-scatter (one stage): rank (h, l) gets its block, the FP8
// reduce-scatter over the hosts of the host partials of the blocks of rail l.
Bytes expected_hierarchical_rs(const Spec& s, const std::vector<Bytes>& inputs, int H, int L, int rank,
                               const quant::WireFormat& f) {
  const int n = H * L;
  const int l = rank % L, h = rank / L;
  const float post = s.op == ReduceOp::avg ? 1.0f / static_cast<float>(n) : 1.0f;
  std::vector<Bytes> rail_inputs;
  for (int hh = 0; hh < H; ++hh) {
    std::vector<int> members;
    for (int k = 0; k < L; ++k) members.push_back(hh * L + k);
    Bytes blocks;
    for (int dest = 0; dest < H; ++dest) {  // block of rank (dest, l), summed over host hh
      const Bytes p = host_sum(inputs, s, members, static_cast<size_t>(dest * L + l) * s.count, s.count);
      blocks.insert(blocks.end(), p.begin(), p.end());
    }
    rail_inputs.push_back(blocks);
  }
  Spec rs = s;
  rs.path = Path::two_shot;
  return expected_output(rs, rail_inputs, h, f, s.count, post);
}

}  // namespace

TEST_CASE("the guard: the route of each shape") {
  Config c;  // defaults: net threshold 256 KiB, hierarchy on, nothing calibrated
  const uint64_t big = 64ull << 20;
  struct Row {
    const char* shape;
    Topology t;
    bool ready;
    Path want;
    PassReason reason;
  };
  const Row rows[] = {
      {"1 host x 8 (NVLink)", topo(1, 8), false, Path::two_shot, PassReason::none},
      {"4 hosts x 1 (one rank per host)", topo(4, 1), false, Path::two_shot, PassReason::none},
      {"2 hosts x 8", topo(2, 8), true, Path::hierarchical, PassReason::none},
      {"8 hosts x 8", topo(8, 8), true, Path::hierarchical, PassReason::none},
      {"2 hosts x 8, sub-communicators missing", topo(2, 8), false, Path::passthrough, PassReason::flat_guard},
      {"2 hosts, uneven (8 + 4)", topo(2, 8, true), false, Path::passthrough, PassReason::flat_guard},
  };
  std::string table = "\n  shape                                    64 MiB bf16 all-reduce\n";
  for (const Row& r : rows) {
    const int n = r.t.hosts * r.t.max_ranks_per_host;
    const Fabric flat = r.t.hosts > 1 ? Fabric::net : Fabric::nvlink;
    Config cfg = c;
    if (r.t.hosts == 1) cfg.thresholds[0][0] = 0;  // show the flat path one host would take
    const Plan p = plan_on(cfg, ar(big, n), flat, r.t, r.ready);
    INFO(std::string(r.shape));
    CHECK(p.path == r.want);
    CHECK(p.reason == r.reason);
    table += fmt::format("  {:<40} {} {}\n", r.shape, to_string(p.path),
                         p.reason == PassReason::none ? "" : to_string(p.reason));
  }
  // Small calls stay below the threshold; hierarchy off: the guard keeps flat FP8 away.
  CHECK(plan_on(c, ar(100 << 10, 16), Fabric::net, topo(2, 8), true).reason == PassReason::below_threshold);
  Config off = c;
  off.hierarchy_enable = false;
  CHECK(plan_on(off, ar(big, 16), Fabric::net, topo(2, 8), true).reason == PassReason::flat_guard);
  // A calibrated profile of this very shape may allow the flat path (when it predicts a win)...
  Config prof = c;
  prof.hierarchy_enable = false;
  prof.cost_model[2].calibrated = true;
  prof.cost_model[2].hosts = 2;
  prof.cost_model[2].ranks_per_host = 8;
  prof.cost_model[2].bus_bandwidth_gbps = 1;  // a slow plain NCCL: FP8's fewer bytes win
  CHECK(is_fp8(plan_on(prof, ar(big, 16), Fabric::net, topo(2, 8), true).path));
  table += "  2 hosts x 8, hierarchy off, profile of 2 x 8: flat allowed by the profile\n";
  // ...but a profile of another shape does not.
  prof.cost_model[2].hosts = 4;
  CHECK(plan_on(prof, ar(big, 16), Fabric::net, topo(2, 8), true).reason == PassReason::flat_guard);
  table += "  2 hosts x 8, hierarchy off, profile of 4 x 8: flat_guard\n";
  // All-gather has no hierarchical path: guarded.
  CallShape ag = ar(big, 16);
  ag.collective = Collective::all_gather;
  Config ag_on = c;
  ag_on.collective_enable = {true, true, true};
  CHECK(plan_on(ag_on, ag, Fabric::net, topo(2, 8), true).reason == PassReason::flat_guard);
  MESSAGE(table);
}

TEST_CASE("bytes per network card, 2 hosts x 8: the model behind the guard") {
  const quant::WireFormat f;
  const CardBytes b = card_bytes(1000000, 2, 8, Path::one_shot, f);
  CHECK(b.plain == doctest::Approx(0.234e6).epsilon(0.01));
  CHECK(b.flat_two_shot == doctest::Approx(0.516e6).epsilon(0.01));
  CHECK(b.hierarchical == doctest::Approx(0.0645e6).epsilon(0.01));
  MESSAGE(fmt::format("per card for a bf16 buffer B: NCCL ring {:.3f} B, flat FP8 two-shot {:.3f} B, hierarchical "
                      "{:.4f} B ({:.1f}x less than the ring)", b.plain / 1e6, b.flat_two_shot / 1e6,
                      b.hierarchical / 1e6, b.plain / b.hierarchical));
}

TEST_CASE("hierarchical all-reduce and reduce-scatter: 2..8 hosts x 1..8 ranks per host") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, hierarchical_runs = 0, pipelined = 0;
  const int shapes[][2] = {{2, 1}, {2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}, {2, 8}, {3, 3}, {8, 1}, {8, 2}, {4, 4}, {5, 3}};
  for (const auto& shape : shapes) {
    const int H = shape[0], L = shape[1], n = H * L;
    for (Collective coll : {Collective::all_reduce, Collective::reduce_scatter}) {
      for (DataType t : {DataType::f32, DataType::f16, DataType::bf16}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
          for (size_t count : {size_t{1}, size_t{1000}, size_t(3 * n * 128 + 7)}) {
            for (size_t scratch : {size_t{512} << 10, size_t{48} << 10}) {
              if (coll == Collective::reduce_scatter && scratch < (512u << 10)) continue;
              Run cfg;
              cfg.config = sim_config(scratch);
              cfg.forced = false;  // the planner's own route
              cfg.machine.nvlink = true;  // NVLink inside the hosts, where the defaults take the path
              cfg.machine.hosts.clear();
              for (int r = 0; r < n; ++r) cfg.machine.hosts.push_back(static_cast<uint64_t>(100 + r / L));
              const Spec spec{coll, Path::hierarchical, t, op, count, 17u + count};
              const auto inputs = inputs_for(spec, n);
              const Outcome o = run(cfg, spec, inputs);
              ++runs;
              const std::string what = fmt::format("{} {}x{} dtype {} {} count {} scratch {}", to_string(coll), H, L,
                                                   static_cast<int>(t), op == ReduceOp::avg ? "avg" : "sum", count, scratch);
              if (!o.races.empty()) { failures.push_back(what + ": race: " + o.races[0]); continue; }
              if (!o.protocol.empty()) { failures.push_back(what + ": " + o.protocol[0]); continue; }
              if (o.deadlocked || !o.leaks.empty()) { failures.push_back(what + ": deadlock or leak"); continue; }
              const quant::WireFormat f = quant::WireFormat::from(cfg.config);
              Topology tp = topo(H, L);
              CallShape shape_call;
              shape_call.collective = coll;
              shape_call.dtype = t;
              shape_call.count = count;
              shape_call.nranks = n;
              const Path inner = inner_path(cfg.config, shape_call, tp);
              const size_t stage = L > 1 ? hierarchical_stage_elems(scratch_layout(cfg.config), coll, count, dtype_size(t),
                                                                     H, L, inner, f)
                                         : count;
              if (L > 1 && stage == 0) continue;  // falls back: not what this case checks
              if (L > 1) ++hierarchical_runs;
              if (stage < count) ++pipelined;
              for (int r = 0; r < n; ++r) {
                const RankResult& a = o.first[static_cast<size_t>(r)];
                if (a.result != ncclSuccess) { failures.push_back(fmt::format("{}: rank {} failed", what, r)); break; }
                Bytes want;
                if (L == 1) {  // one rank per host: the flat path, which the other tests cover
                  const Spec flat{coll, coll == Collective::reduce_scatter ? Path::two_shot
                                                                           : plan_on(cfg.config, shape_call, Fabric::net, tp, false).path,
                                  t, op, count, spec.seed};
                  want = expected_output(flat, inputs, r, f, stage_for(cfg.config, flat, n));
                } else if (coll == Collective::all_reduce) {
                  want = expected_hierarchical_ar(spec, inputs, H, L, inner, f, stage);
                } else {
                  if (stage != count) continue;  // the reference below is one stage
                  want = expected_hierarchical_rs(spec, inputs, H, L, r, f);
                }
                if (a.out != want) { failures.push_back(fmt::format("{}: rank {} differs from the reference", what, r)); break; }
                if (coll == Collective::all_reduce && a.out != o.first[0].out) {
                  failures.push_back(fmt::format("{}: rank {} differs from rank 0", what, r));
                  break;
                }
              }
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(hierarchical_runs > 100);
  CHECK(pipelined > 10);
  MESSAGE(runs << " runs (" << hierarchical_runs << " hierarchical, " << pipelined << " pipelined) bit-exact and alike on every rank");
}

TEST_CASE("the error of the hierarchical path: one or two quantizations of the host sums") {
  log_set_level(LogLevel::error);
  for (Path inner : {Path::one_shot, Path::two_shot}) {
    const int H = 3, L = 2, n = 6;
    Run cfg;
    cfg.config = sim_config();
    cfg.config.algorithm = inner == Path::one_shot ? Algorithm::one_shot : Algorithm::two_shot;
    cfg.forced = false;
    for (int r = 0; r < n; ++r) cfg.machine.hosts.push_back(static_cast<uint64_t>(100 + r / L));
    const Spec spec{Collective::all_reduce, Path::hierarchical, DataType::f32, ReduceOp::sum, 8192, 5};
    const auto inputs = inputs_for(spec, n);
    const Outcome o = run(cfg, spec, inputs);
    REQUIRE(o.first[0].result == ncclSuccess);
    // The bound: q x (sum over hosts of the host sum's block amax) per quantization of the step
    // between hosts (1 one-shot, 2 two-shot), plus fp32 rounding.
    const quant::ElemType t = quant::ElemType::f32;
    double worst = 0;
    for (size_t b0 = 0; b0 < spec.count; b0 += 128) {
      double sum_amax = 0, amax_total = 0;
      std::vector<double> host_amax(H, 0);
      for (size_t e = b0; e < b0 + 128; ++e) {
        double total = 0;
        for (int h = 0; h < H; ++h) {
          double hs = 0;
          for (int l = 0; l < L; ++l) hs += quant::ref::load_elem(inputs[static_cast<size_t>(h * L + l)].data(), t, e);
          host_amax[static_cast<size_t>(h)] = std::max(host_amax[static_cast<size_t>(h)], std::fabs(hs));
          total += hs;
        }
        amax_total = std::max(amax_total, std::fabs(total));
      }
      for (double a : host_amax) sum_amax += a;
      const double bound = (sum_amax + (inner == Path::two_shot ? amax_total : 0)) / 16 + 1e-6;
      for (size_t e = b0; e < b0 + 128; ++e) {
        double exact = 0;
        for (int r = 0; r < n; ++r) exact += quant::ref::load_elem(inputs[static_cast<size_t>(r)].data(), t, e);
        worst = std::max(worst, std::fabs(quant::ref::load_elem(o.first[0].out.data(), t, e) - exact) / bound);
      }
    }
    CHECK(worst <= 1.0);
    MESSAGE(std::string(to_string(inner)) << " between hosts: worst error / bound " << worst);
  }
}

TEST_CASE("a host map forced by configuration, and uneven hosts") {
  log_set_level(LogLevel::error);
  const Spec spec{Collective::all_reduce, Path::hierarchical, DataType::bf16, ReduceOp::avg, 5000, 3};
  {
    // Every rank its own host to NCCL (emulated), 2 x 2 for fp8wire.
    Run cfg;
    cfg.config = sim_config();
    cfg.config.hierarchy_ranks_per_host = 2;
    cfg.forced = false;
    const auto inputs = inputs_for(spec, 4);
    const Outcome o = run(cfg, spec, inputs);
    CHECK(o.races.empty());
    CHECK(o.first[0].info.hosts == 2);
    const quant::WireFormat f = quant::WireFormat::from(cfg.config);
    CallShape c;
    c.collective = Collective::all_reduce;
    c.dtype = spec.dtype;
    c.count = spec.count;
    c.nranks = 4;
    const Path inner = inner_path(cfg.config, c, topo(2, 2));
    const Bytes want = expected_hierarchical_ar(spec, inputs, 2, 2, inner, f, spec.count);
    for (const RankResult& a : o.first) {
      CHECK(a.result == ncclSuccess);
      CHECK(a.out == want);
    }
  }
  {
    // 3 ranks on one host, 1 on another: no hierarchy, and the guard keeps flat FP8 out.
    Run cfg;
    cfg.config = sim_config();
    cfg.forced = false;
    cfg.machine.hosts = {1, 1, 1, 2};
    const auto inputs = inputs_for(spec, 4);
    const Outcome o = run(cfg, spec, inputs);
    // Plain NCCL's average on every rank: no FP8 error at all.
    const Bytes want = plain_all_reduce(spec, inputs);
    for (const RankResult& a : o.first) {
      CHECK(a.result == ncclSuccess);
      CHECK(a.out == want);
    }
  }
}
