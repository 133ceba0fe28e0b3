// The FP8 all-to-all (the application's ncclAlltoAll, equal splits) over the simulated machine
// (tests/sched/sim/sim.hpp), through the engine unchanged:
//   - bit for bit the reference (each peer's chunk quantized as blocks of its own, decoded with the
//     reference codec), every rank's own chunk exactly its input, within the bound of one
//     quantization; 2 to 8 ranks, every float dtype, counts not a multiple of the block and of one
//     element, one stage and many (calls larger than the scratch), in place and not, every wire
//     format option;
//   - what passes through does so exactly (NCCL's own all-to-all): other dtypes, the empty call, the
//     collective left off (the default);
//   - inside an application group with the other collectives, FP8 and pass-through;
//   - telemetry measures it, the guard never switches it.
// Faults at every site of an FP8 all-to-all are in sched_engine_faults.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/log.hpp"
#include "sched/comm/telemetry_monitor.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/engine/engine.hpp"
#include "sched/platform/nccl_types.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;

namespace {

// What NCCL's own all-to-all leaves on `rank`: chunk j of the output is chunk `rank` of rank j's input.
Bytes exact_all_to_all(const std::vector<Bytes>& inputs, int rank, size_t count, size_t es) {
  const size_t chunk = count * es;
  Bytes out(inputs.size() * chunk);
  for (size_t j = 0; j < inputs.size(); ++j)
    std::memcpy(out.data() + j * chunk, inputs[j].data() + static_cast<size_t>(rank) * chunk, chunk);
  return out;
}

// How many all-to-all calls made since `seq` took `path` (over every rank: a call that passes
// through before its communicator is looked up, for its dtype or a switch, names no rank).
size_t a2a_calls_since(uint64_t seq, Path path) {
  std::vector<CallRecord> records(4096);
  const size_t got = Accounting::instance().snapshot(records.data(), records.size(), seq);
  size_t n = 0;
  for (size_t i = 0; i < got; ++i) n += records[i].kind == CallKind::all_to_all && records[i].path == path;
  return n;
}

// Inputs of any dtype as bytes (make_input writes the float ones).
std::vector<Bytes> raw_inputs(const Spec& s, int n) {
  std::vector<Bytes> v;
  for (int r = 0; r < n; ++r) {
    Bytes b(in_elems(s, n) * dtype_size(s.dtype));
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>((i * 131 + static_cast<size_t>(r) * 17 + s.seed) % 251);
    v.push_back(b);
  }
  return v;
}

Spec a2a(DataType t, size_t count, uint64_t seed) {
  return Spec{Collective::all_to_all, Path::one_shot, t, ReduceOp::sum, count, seed};
}

// Runs `s` and checks it: clean, the reference bit for bit, in bound, and every rank's own chunk of
// its result its input's, byte for byte ("" when so).
std::string run_and_check(const Run& cfg, const Spec& s, const std::vector<Bytes>& inputs) {
  const Outcome o = run(cfg, s, inputs);
  if (std::string e = check_clean(cfg, s, inputs, o); !e.empty()) return e;
  const size_t chunk = s.count * dtype_size(s.dtype);
  const int n = static_cast<int>(inputs.size());
  for (size_t r = 0; r < inputs.size(); ++r)
    if (std::memcmp(o.first[r].out.data() + r * chunk, inputs[r].data() + r * chunk, chunk) != 0)
      return fmt::format("{}: rank {}: its own chunk is not its input", describe(s, n, cfg.config), r);
  return "";
}

}  // namespace

TEST_CASE("the FP8 all-to-all: the reference bit for bit, its own chunk exact, in bound, pipelined or not") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, pipelined = 0, in_place = 0;
  const std::vector<int> worlds = kSanitizerTier ? std::vector<int>{2, 3, 5} : std::vector<int>{2, 3, 4, 5, 8};
  for (int n : worlds) {
    for (DataType t : {DataType::f32, DataType::f16, DataType::bf16}) {
      for (size_t count : {size_t{1}, size_t{127}, size_t{256}, size_t{3 * 128 + 5}, size_t{4099}, size_t{8192}, size_t{12000}}) {
        for (size_t scratch : {size_t{512} << 10, size_t{40} << 10, size_t{12} << 10}) {
          Run cfg;
          cfg.config = sim_config(scratch);
          cfg.in_place = (count + scratch / 1024) % 3 == 0;
          const Spec spec = a2a(t, count, 7u + count);
          const size_t stage = stage_for(cfg.config, spec, n);
          REQUIRE(stage > 0);  // one block per peer always fits these scratch sizes
          pipelined += stage < count;
          in_place += cfg.in_place;
          ++runs;
          if (std::string e = run_and_check(cfg, spec, inputs_for(spec, n)); !e.empty()) failures.push_back(e);
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(pipelined > runs / 5);
  CHECK(in_place > runs / 5);
  MESSAGE(runs << " runs (" << pipelined << " pipelined, " << in_place << " in place): bit-exact, own chunks exact, in bound");
}

TEST_CASE("the FP8 all-to-all with every wire format option") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0;
  for (const FormatOption& fm : std::span(kFormatOptions).subspan(1))  // the default's: the cases above
    for (int n : {3, 4})
      for (size_t scratch : {size_t{512} << 10, size_t{16} << 10})
        for (size_t count : {size_t{1000}, size_t{2048}}) {
          Run cfg;
          cfg.config = sim_config(scratch);
          fm.set_on(cfg.config);
          const Spec spec = a2a(DataType::bf16, count, 5);
          ++runs;
          if (std::string e = run_and_check(cfg, spec, inputs_for(spec, n)); !e.empty()) failures.push_back(e);
        }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  MESSAGE(runs << " runs over 5 more wire formats");
}

TEST_CASE("what passes through is NCCL's own all-to-all, exactly: other dtypes, the collective off (the default)") {
  log_set_level(LogLevel::error);
  struct Case {
    const char* what;
    DataType dtype;
    bool enabled;
    bool forced;
  };
  const Case cases[] = {{"int32, planned", DataType::int32, true, false},
                        {"uint8, planned", DataType::uint8, true, false},
                        {"f64, planned", DataType::f64, true, false},
                        {"int8, forced FP8", DataType::int8, true, true},
                        {"bf16, collectives.all_to_all off", DataType::bf16, false, false},
                        {"f32, collectives.all_to_all off", DataType::f32, false, false}};
  for (const Case& c : cases) {
    for (int n : {2, 4}) {
      CAPTURE(c.what);
      CAPTURE(n);
      Run cfg;
      cfg.forced = c.forced;
      cfg.config = sim_config();
      if (!c.enabled) cfg.config.collective_enable[static_cast<int>(Collective::all_to_all)] = false;  // the default
      const Spec spec = a2a(c.dtype, 1001, 3);
      const auto inputs = raw_inputs(spec, n);
      const uint64_t before = Accounting::instance().last_seq();
      const Outcome o = run(cfg, spec, inputs);
      CHECK(o.races.empty());
      CHECK(o.protocol.empty());
      for (int r = 0; r < n; ++r) {
        CHECK(o.first[static_cast<size_t>(r)].result == ncclSuccess);
        CHECK(o.first[static_cast<size_t>(r)].out == exact_all_to_all(inputs, r, spec.count, dtype_size(c.dtype)));
      }
      CHECK(a2a_calls_since(before, Path::passthrough) == static_cast<size_t>(n));
      CHECK(a2a_calls_since(before, Path::one_shot) == 0);
    }
  }
  CHECK_FALSE(Config{}.collective_enable[static_cast<int>(Collective::all_to_all)]);
}

TEST_CASE("the empty all-to-all and one of a single element pass through or run, never touching a byte too many") {
  log_set_level(LogLevel::error);
  sim::World world(sim::Options{.nranks = 3});
  const auto comms = world.create_comm();
  const uint64_t before = Accounting::instance().last_seq();
  world.run_ranks([&](int r) {
    const Platform& p = world.platform();
    sched::Engine eng(sim_config(), p);
    ncclComm_t comm = comms[static_cast<size_t>(r)];
    eng.comm_created(comm);
    cudaStream_t s = nullptr;
    p.cuda.StreamCreateWithFlags(&s, cudaStreamNonBlocking);
    CHECK(eng.all_to_all(nullptr, nullptr, 0, ncclBfloat16, comm, s) == ncclSuccess);
    world.synchronize_rank();
    eng.comm_destroyed(comm);
    p.cuda.StreamDestroy(s);
  });
  CHECK(world.races().empty());
  CHECK(world.protocol_errors().empty());
  CHECK(a2a_calls_since(before, Path::passthrough) == 3);
}

TEST_CASE("all-to-alls in an application group with the other collectives: each the reference, FP8 and pass-through alike") {
  log_set_level(LogLevel::error);
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    Config config = sim_config(16 << 10);  // the FP8 calls pipelined
    config.algorithm = Algorithm::two_shot;
    const quant::WireFormat f = quant::WireFormat::from(config);
    const Spec ar{Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, 3000, 11};
    const Spec first = a2a(DataType::bf16, 1500, 12), second = a2a(DataType::f32, 700, 13);
    const Spec ints = a2a(DataType::int32, 77, 14);
    const Spec ag{Collective::all_gather, Path::one_shot, DataType::bf16, ReduceOp::sum, 900, 15};
    const std::vector<Spec> specs = {ar, first, ints, ag, second};
    std::vector<std::vector<Bytes>> inputs;
    for (const Spec& s : specs) {
      inputs.push_back(s.dtype == DataType::int32 ? raw_inputs(s, n) : inputs_for(s, n));
    }
    sim::World world(sim::Options{.nranks = n});
    const auto comms = world.create_comm();
    std::vector<std::vector<Bytes>> outs(specs.size(), std::vector<Bytes>(static_cast<size_t>(n)));
    std::vector<ncclResult_t> results(static_cast<size_t>(n), ncclInternalError);
    const uint64_t before = Accounting::instance().last_seq();
    world.run_ranks([&](int r) {
      const Platform& p = world.platform();
      const size_t ri = static_cast<size_t>(r);
      sched::Engine eng(config, p);
      ncclComm_t comm = comms[ri];
      eng.comm_created(comm);
      cudaStream_t s = nullptr;
      p.cuda.StreamCreateWithFlags(&s, cudaStreamNonBlocking);
      std::vector<void*> in(specs.size()), out(specs.size());
      for (size_t k = 0; k < specs.size(); ++k) {
        p.cuda.Malloc(&in[k], inputs[k][ri].size());
        p.cuda.Malloc(&out[k], out_elems(specs[k], n) * dtype_size(specs[k].dtype));
        std::memcpy(in[k], inputs[k][ri].data(), inputs[k][ri].size());
      }
      ncclResult_t res = eng.group_start();
      for (size_t k = 0; k < specs.size() && res == ncclSuccess; ++k)
        res = issue(eng, specs[k], false, in[k], out[k], comm, s);
      if (res == ncclSuccess) res = eng.group_end();
      results[ri] = res;
      world.synchronize_rank();
      for (size_t k = 0; k < specs.size(); ++k) {
        const auto* o = static_cast<const char*>(out[k]);
        outs[k][ri].assign(o, o + out_elems(specs[k], n) * dtype_size(specs[k].dtype));
        p.cuda.Free(in[k]);
        p.cuda.Free(out[k]);
      }
      eng.comm_destroyed(comm);
      p.cuda.StreamDestroy(s);
    });
    CHECK(world.races().empty());
    CHECK(world.protocol_errors().empty());
    CHECK_FALSE(world.deadlocked());
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(results[static_cast<size_t>(r)] == ncclSuccess);
      for (size_t k = 0; k < specs.size(); ++k) {
        CAPTURE(k);
        const Spec& s = specs[k];
        const Bytes want = s.dtype == DataType::int32 ? exact_all_to_all(inputs[k], r, s.count, 4)
                                                      : expected_output(s, inputs[k], r, f, 0);
        CHECK(outs[k][static_cast<size_t>(r)] == want);
      }
    }
    // The float ones went FP8 (one exchange), the int32 one through NCCL's own.
    CHECK(a2a_calls_since(before, Path::one_shot) == 2 * static_cast<size_t>(n));
    CHECK(a2a_calls_since(before, Path::passthrough) == static_cast<size_t>(n));
  }
}

TEST_CASE("telemetry and the audit measure the all-to-all under its own collective; the guard never switches a partial-block one") {
  log_set_level(LogLevel::error);
  Run cfg;
  cfg.config = sim_config();
  cfg.config.telemetry_sample_every = 1;
  cfg.config.audit_every = 1;  // every call also runs NCCL's own all-to-all on a copy, and the two are compared
  cfg.config.guard_enable = true;
  cfg.config.guard_max_rel_error = 0;  // every measured call would vote, were it guarded
  cfg.second_call = true;
  const Spec spec = a2a(DataType::bf16, 2000, 21);
  const auto inputs = inputs_for(spec, 3);
  sched::reset_error_totals();
  const Outcome o = run(cfg, spec, inputs);
  CHECK(check_clean(cfg, spec, inputs, o).empty());
  for (size_t r = 0; r < 3; ++r) CHECK(o.second[r].out == o.first[r].out);  // FP8 both times: not switched
  const sched::ErrorTotals t = sched::error_totals();
  const size_t a2a_slot = static_cast<size_t>(Collective::all_to_all), one = static_cast<size_t>(Path::one_shot);
  CHECK(t.measured_calls[a2a_slot][one] == 6);  // two calls on each of 3 ranks
  CHECK(t.input[a2a_slot][one].elements == 6u * 2 * 2000);  // every chunk sent: (n - 1) x count per call
  CHECK(t.input[a2a_slot][one].sq_error > 0);
  CHECK(t.guard_trips[a2a_slot] == 0);
  CHECK(t.guard_full_calls[a2a_slot] == 0);
  // The true error of the FP8 result against the exact one, over both calls of every rank: one
  // quantization of the chunks from the peers (e4m3: a few percent), none of the own chunk.
  CHECK(t.audited_calls[a2a_slot][one] == 6);
  CHECK(t.audit_nonfinite[a2a_slot][one] == 0);
  const double rel = std::sqrt(t.audit_sq_error[a2a_slot][one] / t.audit_sq_exact[a2a_slot][one]);
  CHECK(rel > 0);
  CHECK(rel < 0.05);
}
