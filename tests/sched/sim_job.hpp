// Helpers of the simulated CPU tier: inputs, the reference algorithms every FP8 path must reproduce
// bit for bit, the error bound against the fp64 sum, and one rank's run of one collective.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "quant/wire_format.hpp"
#include "sched/engine/engine.hpp"
#include "sched/engine/engine_probe.hpp"
#include "sched/plan/types.hpp"
#include "tests/sched/sim/sim.hpp"

namespace fp8wire::simtest {

// The sanitizer tier (scripts/sanitize.sh: ASan and UBSan, the simulated machine at -O1,
// FP8WIRE_SANITIZE) runs it about 8x slower. There the largest matrices leave out their largest rank
// counts, which take the same code paths as the smaller ones; the regular tier runs them whole.
#ifdef FP8WIRE_SANITIZER_TIER
inline constexpr bool kSanitizerTier = true;
#else
inline constexpr bool kSanitizerTier = false;
#endif

using Bytes = std::vector<char>;

// One collective as a test asks for it.
struct Spec {
  Collective collective = Collective::all_reduce;
  Path path = Path::two_shot;  // forced path (FP8), or passthrough
  DataType dtype = DataType::bf16;
  ReduceOp op = ReduceOp::sum;
  size_t count = 0;            // AR: count; RS: recvcount; AG: sendcount; A2A: count per peer
  uint64_t seed = 1;
};

// A collective and the FP8 path a test forces for it.
struct Variant {
  Collective collective;
  Path path;
};

quant::ElemType elem_type(DataType t);
size_t in_elems(const Spec& s, int nranks);
size_t out_elems(const Spec& s, int nranks);
// Rank r's input: varied magnitudes per block (so scales differ), signs mixed, a zero block now and
// then, stored in the spec's dtype.
Bytes make_input(const Spec& s, int rank, int nranks);

// What rank `rank` must hold after the FP8 collective, computed directly with the reference codec
// (no engine): one-shot, two-shot and ring all-reduce, reduce-scatter, all-gather, all-to-all (its own
// chunk exact). The ring depends
// on the stage cut, given as `stage_elems` (the others do not: every cut is block aligned).
// `post`: the factor applied once (0: 1, or 1/ranks for avg, the ranks being inputs.size()).
Bytes expected_output(const Spec& s, const std::vector<Bytes>& inputs, int rank, const quant::WireFormat& f,
                      size_t stage_elems, float post = 0);
// What the simulated NCCL's own all-reduce (sum or avg) of `s` gives: the inputs summed in fp32 in rank
// order, an average divided once, rounded once into the dtype (a call that passed through).
Bytes plain_all_reduce(const Spec& s, const std::vector<Bytes>& inputs);
// Largest |output - fp64 sum| allowed per element (sched/README.md "Accuracy"), and the check.
std::string check_bound(const Spec& s, const std::vector<Bytes>& inputs, const Bytes& out, int rank,
                        const quant::WireFormat& f);

// One rank's call of `s` on the engine (the forced entry, as the benchmark's, or the planner's route).
ncclResult_t issue(sched::Engine& eng, const Spec& s, bool forced, const void* in, void* out, ncclComm_t comm,
                   cudaStream_t stream);

// Everything one rank saw of one run.
struct RankResult {
  ncclResult_t result = ncclSuccess;   // what the collective returned
  ncclResult_t async = ncclSuccess;    // the communicator's asynchronous error after synchronising
  Bytes out;
  sched::CommInfo info;
};

// A config small enough for the simulator: scratch `scratch` bytes, thresholds 0 (every float sum
// is a candidate), all collectives on.
Config sim_config(size_t scratch = 512 << 10);

// One choice of the wire format's options (format, scale_type, rounding, block_size).
struct FormatOption {
  Fp8Format fp8;
  ScaleType scale;
  Rounding rounding;
  uint32_t block;
  void set_on(Config& c) const {
    c.format = fp8;
    c.scale_type = scale;
    c.rounding = rounding;
    c.block_size = block;
  }
};
// The configuration's default first, then others that take every option's every value.
inline constexpr FormatOption kFormatOptions[] = {{Fp8Format::e4m3, ScaleType::fp32, Rounding::nearest, 128},
                                                  {Fp8Format::e5m2, ScaleType::fp32, Rounding::nearest, 128},
                                                  {Fp8Format::e4m3, ScaleType::bf16, Rounding::nearest, 128},
                                                  {Fp8Format::e4m3, ScaleType::e8m0, Rounding::nearest, 64},
                                                  {Fp8Format::e4m3, ScaleType::fp32, Rounding::stochastic, 32},
                                                  {Fp8Format::e5m2, ScaleType::e8m0, Rounding::stochastic, 256}};

// How one run goes: the engine's config, the machine, a fault, a second call, an application group.
struct Run {
  Config config = sim_config();
  sim::Options machine;
  sim::Fault fault;
  bool forced = true;        // the forced entry (bench) instead of the planner's route
  bool second_call = false;  // issue the call(s) again right after the first, unsynchronised
  int group = 0;             // > 0: that many calls (slices of one buffer) inside one application group
  uint64_t feedback_key = 0; // set before each call (error feedback)
  // When a rank's call fails, every rank aborts the communicator through the engine once all have
  // issued their calls, as PyTorch's watchdog does on each rank (with a direct transport the peers'
  // lanes wait on flags that only their own abort releases).
  bool abort_all = false;
  // NCCL's in-place calls (one call, or grouped all-reduces): all-reduce and all-to-all send == recv;
  // reduce-scatter recv == send + rank * recvcount; all-gather send == recv + rank * sendcount.
  bool in_place = false;
};

// Calls at every fault site a rank has made, snapshotted after the agreement and after its calls.
using SiteCounts = std::array<int, sim::kSiteCount>;

struct Outcome {
  std::vector<RankResult> first, second;  // per rank
  std::vector<SiteCounts> after_setup, after_calls;
  std::vector<std::string> races, protocol, leaks;
  bool deadlocked = false;
  size_t live_windows = 0;                  // direct-transport windows left after every rank is gone
  std::vector<Carrier> transports;    // per rank: what carried its first call's last record
};

// Runs `spec` (spec.count elements per call; `group` calls when grouped) on every rank of a fresh
// simulated machine; a rank whose call fails has its communicator aborted, as an application's
// watchdog does. `inputs` hold every call's input, call after call.
Outcome run(const Run& cfg, const Spec& spec, const std::vector<Bytes>& inputs);
std::vector<Bytes> inputs_for(const Spec& s, int nranks, int calls = 1);
size_t stage_for(const Config& c, const Spec& s, int nranks);
std::string describe(const Spec& s, int nranks, const Config& c);
// A clean run: success everywhere, bitwise the reference algorithm, identical on every rank where
// the collective gives every rank the same result, within the bound; "" when so.
std::string check_clean(const Run& cfg, const Spec& spec, const std::vector<Bytes>& inputs, const Outcome& o);
std::string first_failures(const std::vector<std::string>& failures);
// What a job left wrong on the simulated machine, each followed by "; ": a deadlock, the protocol
// errors, direct-transport windows still live after every rank is gone; "" when none.
std::string world_problems(const sim::World& world);

}  // namespace fp8wire::simtest
