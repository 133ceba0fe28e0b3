// Predictions for jobs spanning hosts, which these machines cannot run: NCCL's ring, the flat FP8
// two-shot and the hierarchical FP8 path (sched/plan/hierarchy.hpp) for hosts x GPUs with one network
// card per GPU, NVLink or PCIe inside each host. Alpha-beta figures, labelled as predictions; the
// multi-GPU run checks them where it can.
#pragma once

#include <string>
#include <vector>

#include "common/config.hpp"

namespace fp8wire::bench {

struct HierarchyCase {
  int hosts = 2;
  int gpus_per_host = 8;
  double nic_gbit = 100;     // per card, Gb/s
  Fabric intra = Fabric::nvlink;
};

struct HierarchyPrediction {
  HierarchyCase c;
  double plain_us_64m = 0, flat_us_64m = 0, hier_us_64m = 0;   // a 64 MiB bf16 all-reduce
  double plain_us_1g = 0, hier_us_1g = 0;                       // 1 GiB
  double card_bytes_ratio = 0;   // plain / hierarchical bytes per card
  double crossover_bytes = 0;    // smallest size from which hierarchical wins at every larger (0: never)
};

HierarchyPrediction predict_hierarchy(const HierarchyCase& c);
// The table for 2-64 hosts x 8 GPUs, 25/100/200/400 Gb/s, NVLink and PCIe inside.
std::vector<HierarchyPrediction> hierarchy_table();
std::string render_hierarchy_table(const std::vector<HierarchyPrediction>& rows);

}  // namespace fp8wire::bench
