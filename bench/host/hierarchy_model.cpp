#include "bench/host/hierarchy_model.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "quant/wire_format.hpp"
#include "sched/plan/cost_model.hpp"
#include "sched/plan/hierarchy.hpp"

namespace fp8wire::bench {

namespace {

// Assumed figures (printed with the table): a network operation's fixed cost, 90 % of a card's line
// rate; inside a host the bus bandwidths NCCL reached on two H200s (docs/PERF.md: 298 GB/s over
// NVLink, 28.6 GB/s through host memory, "pcie"), 10 / 25 us per operation; the codec at 2400 GB/s
// (the H200's measured quantize/dequantize of bf16).
constexpr double kNetLatencyUs = 20.0;

CostModel net_model(double nic_gbit) {
  CostModel m = sched::default_cost_model(Fabric::net);
  m.op_latency_us = kNetLatencyUs;
  m.bus_bandwidth_gbps = nic_gbit / 8.0 * 0.9;
  m.codec_gbps = 2400;
  return m;
}

CostModel intra_model(Fabric f) {
  CostModel m = sched::default_cost_model(f);
  m.op_latency_us = f == Fabric::nvlink ? 10.0 : 25.0;
  m.bus_bandwidth_gbps = f == Fabric::nvlink ? 298.0 : 28.6;
  m.codec_gbps = 2400;
  return m;
}

double plain_us(const HierarchyCase& c, double bytes) {
  const CostModel net = net_model(c.nic_gbit);
  const CostModel intra = intra_model(c.intra);
  const double n = static_cast<double>(c.hosts) * c.gpus_per_host, l = c.gpus_per_host;
  // NCCL's ring: every GPU sends 2(n-1)/n of the buffer, one hop in l crossing the network on its
  // card, the others inside the host. The slower of the two sets the pace.
  const double over_net = 2 * (n - 1) / n * bytes / l / (net.bus_bandwidth_gbps * 1e3);
  const double inside = 2 * (n - 1) / n * bytes * (l - 1) / l / (intra.bus_bandwidth_gbps * 1e3);
  return net.op_latency_us + std::max(over_net, inside);
}

double flat_us(const HierarchyCase& c, double bytes) {
  const quant::WireFormat f;
  const CostModel net = net_model(c.nic_gbit);
  const CostModel intra = intra_model(c.intra);
  const double n = static_cast<double>(c.hosts) * c.gpus_per_host, l = c.gpus_per_host;
  const sched::CardBytes b = sched::card_bytes(static_cast<uint64_t>(bytes), c.hosts, c.gpus_per_host, Path::two_shot, f);
  const double w = b.flat_two_shot / (2 * (n - l) / n);  // the whole quantized buffer
  const double inside = 2 * (l - 1) / n * w / (intra.bus_bandwidth_gbps * 1e3);
  return 2 * net.op_latency_us + std::max(b.flat_two_shot / (net.bus_bandwidth_gbps * 1e3), inside) +
         3 * bytes / (net.codec_gbps * 1e3);
}

double hier_us(const HierarchyCase& c, double bytes) {
  const quant::WireFormat f;
  const CostModel net = net_model(c.nic_gbit);
  const CostModel intra = intra_model(c.intra);
  const double one = sched::hierarchical_us(intra, net, Collective::all_reduce, static_cast<uint64_t>(bytes), c.hosts,
                                            c.gpus_per_host, Path::one_shot, f);
  const double two = sched::hierarchical_us(intra, net, Collective::all_reduce, static_cast<uint64_t>(bytes), c.hosts,
                                            c.gpus_per_host, Path::two_shot, f);
  return std::min(one, two);
}

}  // namespace

HierarchyPrediction predict_hierarchy(const HierarchyCase& c) {
  HierarchyPrediction p;
  p.c = c;
  const double m64 = 64.0 * (1 << 20), g1 = 1024.0 * (1 << 20);
  p.plain_us_64m = plain_us(c, m64);
  p.flat_us_64m = flat_us(c, m64);
  p.hier_us_64m = hier_us(c, m64);
  p.plain_us_1g = plain_us(c, g1);
  p.hier_us_1g = hier_us(c, g1);
  const quant::WireFormat f;
  const sched::CardBytes one = sched::card_bytes(1 << 20, c.hosts, c.gpus_per_host, Path::one_shot, f);
  const sched::CardBytes two = sched::card_bytes(1 << 20, c.hosts, c.gpus_per_host, Path::two_shot, f);
  p.card_bytes_ratio = one.plain / std::min(one.hierarchical, two.hierarchical);
  // Sizes 64 KiB .. 4 GiB in x2 steps: the smallest from which the hierarchical path wins throughout.
  p.crossover_bytes = 0;
  for (double s = 4.0 * (1ull << 30); s >= 64.0 * 1024; s /= 2) {
    if (hier_us(c, s) < plain_us(c, s)) p.crossover_bytes = s;
    else break;
  }
  return p;
}

std::vector<HierarchyPrediction> hierarchy_table() {
  std::vector<HierarchyPrediction> rows;
  for (Fabric intra : {Fabric::nvlink, Fabric::pcie})
    for (double nic : {25.0, 100.0, 200.0, 400.0})
      for (int hosts : {2, 4, 8, 16, 32, 64}) rows.push_back(predict_hierarchy({hosts, 8, nic, intra}));
  return rows;
}

std::string render_hierarchy_table(const std::vector<HierarchyPrediction>& rows) {
  auto size = [](double b) {
    if (b <= 0) return std::string("never");
    if (b >= (1ull << 30)) return fmt::format("{:.0f} GiB", b / (1ull << 30));
    if (b >= (1 << 20)) return fmt::format("{:.0f} MiB", b / (1 << 20));
    return fmt::format("{:.0f} KiB", b / 1024);
  };
  std::string out =
      "# PREDICTIONS (alpha-beta model, not measured): bf16 all-reduce on hosts x 8 GPUs, one network card per GPU\n"
      "# (rails), 20 us per network operation, 90 % of line rate; inside a host NCCL's bus bandwidth measured on\n"
      "# 2x H200 (298 GB/s NVLink, 28.6 GB/s through host memory as 'pcie'); codec 2400 GB/s. The hierarchical\n"
      "# path is priced as its three phases one after the other (its pipeline overlaps them on large buffers:\n"
      "# conservative). bytes/card: NCCL ring bytes per card over the hierarchical path's (better of one-/two-shot).\n"
      "# Speedup = ring time / path time. Crossover: smallest size (x2 steps, 64 KiB..4 GiB) from which the\n"
      "# hierarchical path beats the ring at every larger size.\n";
  out += fmt::format("{:<7} {:>6} {:>6} {:>12} {:>14} {:>14} {:>14} {:>12}\n", "inside", "Gb/s", "hosts",
                     "bytes/card", "flat 64MiB", "hier 64MiB", "hier 1GiB", "crossover");
  for (const auto& r : rows)
    out += fmt::format("{:<7} {:>6.0f} {:>6} {:>11.1f}x {:>13.2f}x {:>13.2f}x {:>13.2f}x {:>12}\n", to_string(r.c.intra),
                       r.c.nic_gbit, r.c.hosts, r.card_bytes_ratio, r.plain_us_64m / r.flat_us_64m,
                       r.plain_us_64m / r.hier_us_64m, r.plain_us_1g / r.hier_us_1g, size(r.crossover_bytes));
  return out;
}

}  // namespace fp8wire::bench
