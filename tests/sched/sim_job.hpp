// Helpers of the simulated CPU tier: inputs, the reference algorithms every FP8 path must reproduce
// bit for bit, the error bound against the fp64 sum, and one rank's run of one collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "quant/wire_format.hpp"
#include "sched/engine.hpp"
#include "sched/types.hpp"
#include "tests/sched/sim/sim.hpp"

namespace fp8wire::simtest {

using Bytes = std::vector<char>;

// One collective as a test asks for it.
struct Spec {
  Collective collective = Collective::all_reduce;
  Path path = Path::two_shot;  // forced path (FP8), or passthrough
  DataType dtype = DataType::bf16;
  ReduceOp op = ReduceOp::sum;
  size_t count = 0;            // AR: count; RS: recvcount; AG: sendcount
  uint64_t seed = 1;
};

quant::ElemType elem_type(DataType t);
size_t in_elems(const Spec& s, int nranks);
size_t out_elems(const Spec& s, int nranks);
// Rank r's input: varied magnitudes per block (so scales differ), signs mixed, a zero block now and
// then, stored in the spec's dtype.
Bytes make_input(const Spec& s, int rank, int nranks);

// What rank `rank` must hold after the FP8 collective, computed directly with the reference codec
// (no engine): one-shot, two-shot and ring all-reduce, reduce-scatter, all-gather. The ring depends
// on the stage cut, given as `stage_elems` (the others do not: every cut is block aligned).
Bytes expected_output(const Spec& s, const std::vector<Bytes>& inputs, int rank, const quant::WireFormat& f,
                      size_t stage_elems);
// Largest |output - fp64 sum| allowed per element (sched/README.md "Accuracy"), and the check.
std::string check_bound(const Spec& s, const std::vector<Bytes>& inputs, const Bytes& out, int rank,
                        const quant::WireFormat& f);

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

}  // namespace fp8wire::simtest
