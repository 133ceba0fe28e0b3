// The CPU tier of the execution core: the engine, unchanged, over a simulated machine of N ranks
// (tests/sched/sim/sim.hpp: simulated CUDA streams and events, NCCL and the reference codec).
//   - every FP8 algorithm, bit for bit against the reference algorithm, identical on every rank and
//     within the stated bound of the fp64 sum, for world sizes 2..16, every dtype, sum/avg, odd
//     counts, one stage and many, both gather transports, every wire format option;
//   - fault injection: each transport operation, codec launch and CUDA call of a collective fails in
//     turn on one rank; every rank then sees an error or holds the right result, no access races
//     (no scratch reused while a failed call may still read it, the caller's stream joined on every
//     exit), nothing hangs, the next call fails cleanly, nothing leaks;
//   - the agreement at communicator creation, groups, coalescing, error feedback and the lifecycle.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/log.hpp"
#include "quant/reference.hpp"
#include "sched/accounting.hpp"
#include "sched/engine.hpp"
#include "sched/nccl_types.hpp"
#include "sched/stages.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;

namespace {

// How one run of a collective goes: the engine's config, the machine, a fault, a second call.
struct Run {
  Config config = sim_config();
  sim::Options machine;
  sim::Fault fault;
  bool forced = true;        // the forced entry (bench) instead of the planner's route
  bool second_call = false;  // issue the same call again right after the first, unsynchronised
  uint64_t feedback_key = 0;
};

struct Outcome {
  std::vector<RankResult> first, second;
  std::vector<std::string> races, protocol, leaks;
  bool deadlocked = false;
};

ncclResult_t issue(sched::Engine& eng, const Spec& s, bool forced, const void* in, void* out, ncclComm_t comm,
                   cudaStream_t stream) {
  const ncclDataType_t t = nccl_dtype(s.dtype);
  const auto op = static_cast<ncclRedOp_t>(static_cast<int>(s.op));
  switch (s.collective) {
    case Collective::all_reduce:
      return forced ? eng.all_reduce_forced(s.path, in, out, s.count, t, op, comm, stream)
                    : eng.all_reduce(in, out, s.count, t, op, comm, stream);
    case Collective::reduce_scatter:
      return forced ? eng.reduce_scatter_forced(s.path, in, out, s.count, t, op, comm, stream)
                    : eng.reduce_scatter(in, out, s.count, t, op, comm, stream);
    case Collective::all_gather:
      return forced ? eng.all_gather_forced(s.path, in, out, s.count, t, comm, stream)
                    : eng.all_gather(in, out, s.count, t, comm, stream);
  }
  return ncclInvalidArgument;
}

// Runs `spec` once (or twice) on every rank of a fresh simulated machine.
Outcome run(const Run& cfg, const Spec& spec, const std::vector<Bytes>& inputs) {
  sim::Options machine = cfg.machine;
  machine.nranks = static_cast<int>(inputs.size());
  sim::World world(machine);
  world.set_fault(cfg.fault);
  const Platform& p = world.platform();
  const std::vector<ncclComm_t> comms = world.create_comm();
  const int n = machine.nranks;
  Outcome o;
  o.first.resize(static_cast<size_t>(n));
  o.second.resize(static_cast<size_t>(n));
  std::atomic<bool> aborted{false};
  auto watchdog = [&](ncclComm_t c) {  // the application aborts a communicator whose call failed
    if (!aborted.exchange(true)) world.abort_comm(c);
  };
  world.run_ranks([&](int r) {
    const size_t es = dtype_size(spec.dtype);
    const size_t in_bytes = in_elems(spec, n) * es, out_bytes = out_elems(spec, n) * es;
    ncclComm_t comm = comms[static_cast<size_t>(r)];
    {
      sched::Engine eng(cfg.config, p);
      eng.comm_created(comm);
      cudaStream_t stream = nullptr;
      p.cuda.StreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      void *in = nullptr, *out1 = nullptr, *out2 = nullptr;
      p.cuda.Malloc(&in, in_bytes);
      p.cuda.Malloc(&out1, out_bytes);
      p.cuda.Malloc(&out2, out_bytes);
      std::memcpy(in, inputs[static_cast<size_t>(r)].data(), in_bytes);
      RankResult& a = o.first[static_cast<size_t>(r)];
      RankResult& b = o.second[static_cast<size_t>(r)];
      if (cfg.feedback_key) sched::Engine::set_feedback_key(cfg.feedback_key);
      a.result = issue(eng, spec, cfg.forced, in, out1, comm, stream);
      if (a.result != ncclSuccess) watchdog(comm);
      // The application goes on with its stream: reads the result, overwrites the input.
      world.app_access(stream, out1, out_bytes, false);
      world.app_access(stream, in, in_bytes, true);
      if (cfg.second_call) {
        std::memcpy(in, inputs[static_cast<size_t>(r)].data(), 0);  // same bytes: never overwritten for real
        b.result = issue(eng, spec, cfg.forced, in, out2, comm, stream);
        if (b.result != ncclSuccess) watchdog(comm);
        world.app_access(stream, out2, out_bytes, false);
      }
      world.synchronize_rank();
      p.nccl->CommGetAsyncError(comm, &a.async);
      b.async = a.async;
      a.out.assign(static_cast<char*>(out1), static_cast<char*>(out1) + out_bytes);
      b.out.assign(static_cast<char*>(out2), static_cast<char*>(out2) + out_bytes);
      a.info = eng.comm_info(comm);
      eng.comm_destroyed(comm);
      p.cuda.Free(in);
      p.cuda.Free(out1);
      p.cuda.Free(out2);
      p.cuda.StreamDestroy(stream);
    }
    if (const size_t live = world.live_bytes(r))
      o.leaks.push_back(fmt::format("rank {}: {} bytes of simulated device memory left", r, live));
  });
  o.races = world.races();
  o.protocol = world.protocol_errors();
  o.deadlocked = world.deadlocked();
  return o;
}

std::vector<Bytes> inputs_for(const Spec& s, int n) {
  std::vector<Bytes> v;
  for (int r = 0; r < n; ++r) v.push_back(make_input(s, r, n));
  return v;
}

size_t stage_for(const Config& c, const Spec& s, int n) {
  const quant::WireFormat f = quant::WireFormat::from(c);
  const Fabric fabric = c.fabric_override.value_or(Fabric::net);
  return sched::stage_elems(c, sched::scratch_layout(c), s.collective, s.path, s.count, dtype_size(s.dtype), n, f, fabric);
}

std::string describe(const Spec& s, int n, const Config& c) {
  return fmt::format("{} {} {} {} n={} count={} scratch={} gather={} fmt={}/{}/{}/b{}", to_string(s.collective),
                     to_string(s.path), static_cast<int>(s.dtype), s.op == ReduceOp::avg ? "avg" : "sum", n, s.count,
                     c.scratch_max_bytes, to_string(c.gather_transport), to_string(c.format), to_string(c.scale_type),
                     to_string(c.rounding), c.block_size);
}

// Checks a clean run: success everywhere, bitwise the reference algorithm, identical on every rank
// where the collective gives every rank the same result, within the bound of the fp64 sum.
std::string check_clean(const Run& cfg, const Spec& spec, const std::vector<Bytes>& inputs, const Outcome& o) {
  const int n = static_cast<int>(inputs.size());
  const std::string what = describe(spec, n, cfg.config);
  if (!o.races.empty()) return what + ": race: " + o.races.front();
  if (!o.protocol.empty()) return what + ": " + o.protocol.front();
  if (o.deadlocked) return what + ": deadlock";
  if (!o.leaks.empty()) return what + ": " + o.leaks.front();
  const quant::WireFormat f = quant::WireFormat::from(cfg.config);
  const size_t stage = stage_for(cfg.config, spec, n);
  for (int r = 0; r < n; ++r) {
    const RankResult& a = o.first[static_cast<size_t>(r)];
    if (a.result != ncclSuccess || a.async != ncclSuccess)
      return fmt::format("{}: rank {} returned {} (async {})", what, r, static_cast<int>(a.result), static_cast<int>(a.async));
    if (!a.info.fp8_ok) return fmt::format("{}: rank {}: FP8 off: {}", what, r, a.info.reason);
    const Bytes expected = expected_output(spec, inputs, r, f, stage);
    if (a.out != expected) {
      size_t i = 0;
      const size_t es = dtype_size(spec.dtype);
      while (i + es <= a.out.size() && std::memcmp(a.out.data() + i, expected.data() + i, es) == 0) i += es;
      return fmt::format("{}: rank {} differs from the reference algorithm at element {}", what, r, i / es);
    }
    if (spec.collective != Collective::reduce_scatter && a.out != o.first[0].out)
      return fmt::format("{}: rank {} differs from rank 0", what, r);
    if (std::string e = check_bound(spec, inputs, a.out, r, f); !e.empty())
      return fmt::format("{}: rank {}: {}", what, r, e);
  }
  return "";
}

std::string first_failures(const std::vector<std::string>& failures) {
  std::string text = std::to_string(failures.size()) + " failure(s)";
  for (size_t i = 0; i < failures.size() && i < 8; ++i) text += "\n  " + failures[i];
  return text;
}

struct Variant {
  Collective collective;
  Path path;
};
const Variant kVariants[] = {{Collective::all_reduce, Path::two_shot}, {Collective::all_reduce, Path::one_shot},
                             {Collective::all_reduce, Path::ring},     {Collective::reduce_scatter, Path::two_shot},
                             {Collective::all_gather, Path::one_shot}};

}  // namespace

TEST_CASE("every FP8 algorithm over the simulated transport: the reference bit for bit, alike on every rank, in bound") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0, pipelined = 0;
  for (int n : {2, 3, 4, 5, 7, 8, 16}) {
    for (const Variant& v : kVariants) {
      for (DataType t : {DataType::f32, DataType::f16, DataType::bf16}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
          if (v.collective == Collective::all_gather && op == ReduceOp::avg) continue;
          for (size_t count : {size_t{1}, size_t{127}, size_t(3 * n * 128 + 5), size_t{4099}}) {
            for (size_t scratch : {size_t{512} << 10, size_t{40} << 10, size_t{12} << 10}) {
              if (n == 16 && count == 1) continue;
              Run cfg;
              cfg.config = sim_config(scratch);
              Spec spec{v.collective, v.path, t, op, count, 11u + count};
              const size_t stage = stage_for(cfg.config, spec, n);
              if (stage == 0) continue;  // does not fit even one stage: falls back (tested below)
              if (stage < count) ++pipelined;
              const auto inputs = inputs_for(spec, n);
              const Outcome o = run(cfg, spec, inputs);
              ++runs;
              if (std::string e = check_clean(cfg, spec, inputs, o); !e.empty()) failures.push_back(e);
            }
          }
        }
      }
    }
  }
  INFO(runs << " runs, " << pipelined << " pipelined");
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  CHECK(pipelined > 200);
  MESSAGE(runs << " runs (" << pipelined << " pipelined) bit-exact, identical across ranks, in bound");
}

TEST_CASE("both gather transports and every wire format option") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0;
  struct Format {
    Fp8Format fp8;
    ScaleType scale;
    Rounding rounding;
    uint32_t block;
  };
  const Format formats[] = {{Fp8Format::e4m3, ScaleType::fp32, Rounding::nearest, 128},
                            {Fp8Format::e5m2, ScaleType::fp32, Rounding::nearest, 128},
                            {Fp8Format::e4m3, ScaleType::bf16, Rounding::nearest, 128},
                            {Fp8Format::e4m3, ScaleType::e8m0, Rounding::nearest, 64},
                            {Fp8Format::e4m3, ScaleType::fp32, Rounding::stochastic, 32},
                            {Fp8Format::e5m2, ScaleType::e8m0, Rounding::stochastic, 256}};
  for (GatherTransport g : {GatherTransport::allgather, GatherTransport::sendrecv}) {
    for (const Format& fm : formats) {
      for (int n : {3, 6}) {
        for (const Variant& v : kVariants) {
          for (size_t scratch : {size_t{512} << 10, size_t{24} << 10}) {
            Run cfg;
            cfg.config = sim_config(scratch);
            cfg.config.gather_transport = g;
            cfg.config.format = fm.fp8;
            cfg.config.scale_type = fm.scale;
            cfg.config.rounding = fm.rounding;
            cfg.config.block_size = fm.block;
            Spec spec{v.collective, v.path, DataType::bf16, ReduceOp::avg, 2500, 5};
            if (v.collective == Collective::all_gather) spec.op = ReduceOp::sum;
            if (stage_for(cfg.config, spec, n) == 0) continue;
            const auto inputs = inputs_for(spec, n);
            ++runs;
            if (std::string e = check_clean(cfg, spec, inputs, run(cfg, spec, inputs)); !e.empty()) failures.push_back(e);
          }
        }
      }
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  MESSAGE(runs << " runs over both gather transports and 6 wire formats");
}

TEST_CASE("a call whose one stage does not fit the scratch passes through on every rank alike") {
  log_set_level(LogLevel::error);
  Run cfg;
  cfg.config = sim_config(1 << 10);  // not even one block per rank fits a buffer set
  const Spec spec{Collective::all_reduce, Path::two_shot, DataType::f32, ReduceOp::sum, 10000, 3};
  REQUIRE(stage_for(cfg.config, spec, 4) == 0);
  const auto inputs = inputs_for(spec, 4);
  const Outcome o = run(cfg, spec, inputs);
  CHECK(o.races.empty());
  CHECK(o.protocol.empty());
  for (const RankResult& a : o.first) {
    CHECK(a.result == ncclSuccess);
    CHECK(a.out == o.first[0].out);
    // Plain NCCL's sum, not FP8: within fp32 rounding of the exact sum.
    for (size_t i = 0; i < spec.count; ++i) {
      double exact = 0;
      for (const Bytes& b : inputs) exact += quant::ref::load_elem(b.data(), quant::ElemType::f32, i);
      CHECK(std::fabs(quant::ref::load_elem(a.out.data(), quant::ElemType::f32, i) - exact) <= 1e-5 * (std::fabs(exact) + 1));
    }
  }
}
