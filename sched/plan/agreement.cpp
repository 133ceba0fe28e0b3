#include "sched/plan/agreement.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "sched/plan/stages.hpp"

namespace fp8wire::sched {

void set_problem(RankFacts& facts, const char* text) {
  std::memset(facts.problem, 0, sizeof(facts.problem));
  if (text) std::strncpy(facts.problem, text, sizeof(facts.problem) - 1);
}

uint64_t fnv1a(const void* data, size_t size, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t config_fingerprint(const Config& c) {
  uint64_t h = fnv1a(nullptr, 0);
  auto mix = [&h](const auto& v) { h = fnv1a(&v, sizeof(v), h); };
  // Everything that changes a decision or the bytes on the wire; logging and profiler settings may
  // legitimately differ between ranks.
  mix(c.enable);
  for (bool b : c.collective_enable) mix(b);
  mix(c.format); mix(c.block_size); mix(c.scale_type); mix(c.rounding); mix(c.seed);
  mix(c.algorithm);
  mix(c.gather_transport);   // ranks gathering by different NCCL calls would hang
  mix(c.fabric_override.has_value());
  if (c.fabric_override) mix(*c.fabric_override);
  for (const auto& per : c.thresholds)
    for (uint64_t t : per) mix(t);
  for (const CostModel& m : c.cost_model) {
    mix(m.op_latency_us); mix(m.bus_bandwidth_gbps); mix(m.codec_gbps); mix(m.kernel_launch_us);
    mix(m.allreduce_latency_us); mix(m.allgather_latency_us); mix(m.reduce_scatter_latency_us);
    mix(m.alltoall_latency_us); mix(m.allreduce_bandwidth_gbps); mix(m.allgather_bandwidth_gbps);
    mix(m.reduce_scatter_bandwidth_gbps); mix(m.alltoall_bandwidth_gbps);
    mix(m.calibrated);
  }
  // The measured routes decide a call's algorithm and gather step as the thresholds decide FP8.
  for (const auto& per_collective : c.routes)
    for (const auto& routes : per_collective) {
      mix(routes.size());
      for (const MeasuredRoute& r : routes) {
        mix(r.ranks); mix(r.from_bytes); mix(r.fp8); mix(r.algorithm); mix(r.gather);
      }
    }
  mix(c.coalesce_enable); mix(c.coalesce_max_bytes); mix(c.coalesce_max_calls);
  // (scratch.max_bytes and scratch.process_max_bytes are not: each rank offers its scratch, and the
  // communicator keeps the least offer, agree.)
  mix(c.pipeline_chunk_bytes);
  mix(c.error_feedback);
  // Which calls carry the guard's flags and which run in full precision (sched/plan/guard.hpp). The bounds
  // may differ: each rank votes by its own, and the votes travel in the flags.
  mix(c.telemetry_sample_every); mix(c.guard_enable); mix(c.guard_retry_after); mix(c.guard_decide_after);
  mix(c.audit_every);  // an audited call adds an NCCL call on every rank
  mix(c.hierarchy_enable); mix(c.hierarchy_ranks_per_host);
  // Ranks that would carry a call by different transports would wait in different places.
  // (direct.protocol is not among them: either protocol leaves the same bytes in the same windows under
  // the same flags, so it is a choice of each rank alone, sched/algorithms/direct.cpp.)
  mix(c.direct_transport); mix(c.direct_assume_one_host); mix(c.direct_window_bytes); mix(c.direct_sets);
  for (const CostModel& m : c.cost_model) {
    mix(m.direct_latency_us); mix(m.direct_bandwidth_gbps);
    mix(m.direct_stage_bytes); mix(m.direct_max_stages); mix(m.direct_shared_max_stages);  // how calls are cut
    mix(m.direct_shared_stage_bytes);
  }
  for (const CostModel& m : c.cost_model) { mix(m.hosts); mix(m.ranks_per_host); }   // changes what is quantized only, but keeps ranks' numerics alike
  return h;
}

int HostMap::ranks_per_host() const {
  if (host_size.empty()) return 0;
  for (int s : host_size)
    if (s != host_size[0]) return 0;
  return host_size[0];
}

HostMap host_map(std::span<const RankFacts> facts) {
  HostMap m;
  std::vector<uint64_t> seen;
  m.host_of.reserve(facts.size());
  m.local_rank.reserve(facts.size());
  for (const RankFacts& f : facts) {
    auto it = std::find(seen.begin(), seen.end(), f.host_hash);
    const int host = static_cast<int>(it - seen.begin());
    if (it == seen.end()) {
      seen.push_back(f.host_hash);
      m.host_size.push_back(0);
    }
    m.host_of.push_back(host);
    m.local_rank.push_back(m.host_size[static_cast<size_t>(host)]++);
  }
  m.hosts = static_cast<int>(seen.size());
  return m;
}

HostMap forced_host_map(int nranks, int ranks_per_host) {
  HostMap m;
  for (int r = 0; r < nranks; ++r) {
    const int host = r / ranks_per_host;
    if (host == m.hosts) {
      ++m.hosts;
      m.host_size.push_back(0);
    }
    m.host_of.push_back(host);
    m.local_rank.push_back(m.host_size[static_cast<size_t>(host)]++);
  }
  return m;
}

namespace {
std::string problem_of(const RankFacts& f) {
  const size_t n = strnlen(f.problem, sizeof(f.problem));
  return n ? std::string(f.problem, n) : std::string("not usable");
}
}  // namespace

Agreement agree(const Config& config, std::span<const RankFacts> facts) {
  Agreement a;
  if (facts.empty()) {
    a.reason = "no ranks";
    return a;
  }
  const HostMap real = host_map(facts);
  bool p2p_disabled = false, all_nvlink = true;
  for (const RankFacts& f : facts) {
    p2p_disabled |= f.p2p_disabled != 0;
    all_nvlink &= f.nvlink_local != 0;
  }
  if (config.fabric_override) a.fabric = *config.fabric_override;
  else if (real.hosts > 1) a.fabric = Fabric::net;
  else if (p2p_disabled || !all_nvlink) a.fabric = Fabric::pcie;
  else a.fabric = Fabric::nvlink;

  // The host map the planner sees: NCCL's hosts, or blocks of hierarchy.ranks_per_host (a test of the
  // hierarchical path on ranks that NCCL sees as separate hosts).
  const int n = static_cast<int>(facts.size());
  const int forced = static_cast<int>(config.hierarchy_ranks_per_host);
  a.topology.forced = forced > 0 && n % forced == 0;
  a.hosts = a.topology.forced ? forced_host_map(n, forced) : real;
  a.topology.hosts = a.hosts.hosts;
  a.topology.ranks_per_host = a.hosts.ranks_per_host();
  a.topology.max_ranks_per_host = 0;
  for (int size : a.hosts.host_size) a.topology.max_ranks_per_host = std::max(a.topology.max_ranks_per_host, size);
  // Inside a host: NVLink when every rank has it and P2P is on, else PCIe; ranks that NCCL itself
  // sees on different hosts (a forced map) talk over the network even inside a forced host.
  bool intra_net = false, intra_pcie = false;
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < r; ++q)
      if (a.hosts.host_of[static_cast<size_t>(r)] == a.hosts.host_of[static_cast<size_t>(q)]) {
        intra_net |= real.host_of[static_cast<size_t>(r)] != real.host_of[static_cast<size_t>(q)];
        intra_pcie |= facts[static_cast<size_t>(r)].p2p_disabled || !facts[static_cast<size_t>(r)].nvlink_local;
      }
  a.topology.intra = intra_net ? Fabric::net : intra_pcie ? Fabric::pcie : Fabric::nvlink;

  // Two ranks in one process (one thread driving several GPUs, e.g. nccl-tests -g N): that thread
  // issues every rank's calls in one group, and an FP8 stage run for one rank at a time would wait
  // for the others.
  for (size_t r = 1; r < facts.size(); ++r)
    for (size_t q = 0; q < r; ++q)
      if (facts[r].host_hash == facts[q].host_hash && facts[r].process == facts[q].process) {
        a.reason = "ranks " + std::to_string(q) + " and " + std::to_string(r) + " are driven by one process";
        return a;
      }
  // The first rank that rules FP8 out names the reason; every rank logs the same line.
  for (size_t r = 0; r < facts.size(); ++r) {
    const RankFacts& f = facts[r];
    if (!f.usable) a.reason = "rank " + std::to_string(r) + ": " + problem_of(f);
    else if (f.version != facts[0].version)
      a.reason = "rank " + std::to_string(r) + " runs another fp8wire version than rank 0";
    else if (f.config_fingerprint != facts[0].config_fingerprint)
      a.reason = "rank " + std::to_string(r) + " runs with another fp8wire configuration than rank 0";
    else if (!f.lanes_ok)
      a.reason = "rank " + std::to_string(r) + " could not create its streams and events";
    if (!a.reason.empty()) return a;
  }
  a.fp8_ok = true;
  uint32_t least = facts[0].scratch_units;
  for (const RankFacts& f : facts) least = std::min(least, f.scratch_units);
  a.scratch_bytes = static_cast<uint64_t>(least) * kScratchUnit;
  return a;
}

}  // namespace fp8wire::sched
