// The per-communicator agreement, its pure part: what each rank tells the others once, right after
// the communicator is created (RankFacts, exchanged by sched/comm/comm_setup.cpp), and the decision every
// rank derives from the same gathered bytes (agree): the fabric class, whether FP8 may run at all,
// and the host map. Every later per-call decision reads only these agreed facts and the call's
// shape, so ranks can never diverge and no call needs an exchange of its own.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/config.hpp"

namespace fp8wire::sched {

// What this process brings to every agreement.
struct LocalIdentity {
  uint32_t version = 0;  // library version (10000*major + 100*minor + patch)
  bool usable = true;    // configuration loaded and enabled, NCCL complete
  std::string problem;   // why not usable (shown in every rank's log)
};

// What one rank contributes to the agreement (exchanged as raw bytes with a real all-gather).
struct RankFacts {
  uint64_t host_hash = 0;          // NCCL_HOSTID, else hostname + boot id: NCCL's own notion of a host
  uint64_t config_fingerprint = 0; // config_fingerprint(): ranks with different configs never FP8
  uint32_t version = 0;            // library version: mixed versions never FP8
  uint32_t scratch_units = 0;      // scratch this rank holds for it, in kScratchUnit (256 bytes)
  uint32_t process = 0;            // process id: two ranks of one process make FP8 unsafe
  int16_t device = -1;             // CUDA device ordinal, for the log
  uint8_t usable : 1 = 0;          // configuration loaded and enabled, NCCL complete
  uint8_t lanes_ok : 1 = 0;        // the pipeline's streams and events created
  uint8_t p2p_disabled : 1 = 0;    // NCCL_P2P_DISABLE=1 on this rank
  uint8_t nvlink_local : 1 = 0;    // this GPU reaches every other visible local GPU over NVLink
  uint8_t reserved = 0;
  char problem[32] = {};           // why not usable, NUL-padded ("configuration: block_size", ...)
};
static_assert(sizeof(RankFacts) == 64, "RankFacts travels as raw bytes");
// Copies `text` into facts.problem, truncated, always NUL-terminated.
void set_problem(RankFacts& facts, const char* text);

// Which host each rank is on, from the gathered host hashes (or forced by configuration).
struct HostMap {
  int hosts = 0;
  std::vector<int> host_of;     // per rank: host index, in order of first appearance
  std::vector<int> local_rank;  // per rank: its index among its host's ranks, in rank order
  std::vector<int> host_size;   // per host: how many ranks it holds
  // Every host holds the same number of ranks (0 when the hosts are uneven).
  int ranks_per_host() const;
};
HostMap host_map(std::span<const RankFacts> facts);
// Consecutive blocks of `ranks_per_host` ranks, one host each (hierarchy.ranks_per_host).
HostMap forced_host_map(int nranks, int ranks_per_host);

// What the planner needs of the hosts a communicator spans (sched/plan/hierarchy.hpp).
struct Topology {
  int hosts = 1;               // hosts the ranks span
  int ranks_per_host = 1;      // when every host holds as many ranks; 0 when the hosts are uneven
  int max_ranks_per_host = 1;  // the most ranks one host holds
  Fabric intra = Fabric::nvlink;  // between the ranks of one host
  bool forced = false;         // hierarchy.ranks_per_host gave the map, not the hosts NCCL sees
};

struct Agreement {
  Fabric fabric = Fabric::net;
  bool fp8_ok = false;   // every rank is usable, has its lanes, and runs the same configuration
  // Scratch every rank holds for the communicator (the least offer): its layout, alike on every rank.
  // 0: its collectives pass through (PassReason::scratch); its messages need none.
  uint64_t scratch_bytes = 0;
  std::string reason;    // why not (naming the rank), for the log on every rank
  HostMap hosts;         // the map the planner uses (forced by hierarchy.ranks_per_host, or NCCL's hosts)
  Topology topology;
};
// The decision every rank computes from the same gathered facts: "net" when the ranks span more
// than one host (emulated ranks with distinct NCCL_HOSTID included), else "pcie" when any rank has
// P2P disabled or lacks NVLink to its local peers, else "nvlink". fabric_override wins.
Agreement agree(const Config& config, std::span<const RankFacts> facts);
uint64_t config_fingerprint(const Config& config);
uint64_t fnv1a(const void* data, size_t size, uint64_t seed = 1469598103934665603ull);

}  // namespace fp8wire::sched
