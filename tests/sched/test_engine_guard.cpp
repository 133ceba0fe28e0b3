// The guard over the simulated machine (sched/plan/guard.hpp): a call whose data break the FP8 format on
// one rank switches its scope to full precision from the call that reads its votes (guard.decide_after
// calls later; 1 here but where a test says otherwise), on every rank at the same call,
// under every interleaving the machine's scheduler offers, over NCCL and over a direct transport;
// from then on the results equal the full-precision path bit for bit, until FP8 resumes after
// guard.retry_after calls. Faults at every site of a guarded call leave no rank waiting for ever and
// no two successful ranks apart. Telemetry totals and config keys are checked here too.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "quant/reference.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/engine/engine.hpp"
#include "sched/plan/guard.hpp"
#include "sched/comm/telemetry_monitor.hpp"
#include "tests/sched/sim/sim.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;

namespace {

// What breaks e4m3 on one rank (the test's synthetic gradients).
enum class Breakage { none, nan_block, inf, outlier, underflow };

const char* label(Breakage b) {
  switch (b) {
    case Breakage::none: return "none";
    case Breakage::nan_block: return "all-NaN block";
    case Breakage::inf: return "one Inf";
    case Breakage::outlier: return "outlier 1e5x in every block";
    case Breakage::underflow: return "values below e4m3's range after scaling";
  }
  return "?";
}

void break_input(Bytes& b, Breakage how) {
  float* x = reinterpret_cast<float*>(b.data());
  const size_t n = b.size() / sizeof(float);
  switch (how) {
    case Breakage::none: break;
    case Breakage::nan_block:
      for (size_t i = 128; i < std::min<size_t>(256, n); ++i) x[i] = std::numeric_limits<float>::quiet_NaN();
      break;
    case Breakage::inf: x[n / 2] = std::numeric_limits<float>::infinity(); break;
    case Breakage::outlier:
      for (size_t i = 0; i < n; i += 128) x[i] = 1e5f * 64.0f;  // the data reach 2^6
      break;
    case Breakage::underflow:
      for (size_t i = 0; i < n; ++i) x[i] *= 1e-40f;  // fp32 subnormals: the block scale is below FLT_MIN
      break;
  }
}

struct Sequence {
  Spec spec;                       // f32 data, so that the breakage is exact
  int calls = 8;
  int bad_call = 2;                // -1: none
  int bad_rank = 1;
  Breakage breakage = Breakage::nan_block;
  std::vector<uint64_t> keys;      // per call (0: none)
};

// Per call, per rank: the input.
std::vector<std::vector<Bytes>> inputs_of(const Sequence& q, int n) {
  std::vector<std::vector<Bytes>> in(static_cast<size_t>(q.calls));
  for (int i = 0; i < q.calls; ++i) {
    Spec s = q.spec;
    s.seed = q.spec.seed + static_cast<uint64_t>(i) * 17;
    for (int r = 0; r < n; ++r) in[static_cast<size_t>(i)].push_back(make_input(s, r, n));
    if (i == q.bad_call) break_input(in[static_cast<size_t>(i)][static_cast<size_t>(q.bad_rank)], q.breakage);
  }
  return in;
}

struct SeqOutcome {
  std::vector<std::vector<Bytes>> out;       // [rank][call]
  std::vector<std::vector<Path>> paths;      // [rank][call]
  std::vector<ncclResult_t> result;          // per rank: the first error of its calls
  std::vector<std::string> races, protocol, leaks;
  bool deadlocked = false;
  sched::ErrorTotals totals;                 // after every rank is done
  std::vector<std::vector<int>> after_setup; // [rank][site]: calls made by the communicator's set-up
};

// Every call of the sequence on every rank of a fresh machine, issued back to back on one stream
// (no synchronisation between calls), each with its own buffers; a rank whose call fails has the
// communicator aborted once every rank has issued its calls, as a watchdog does.
SeqOutcome run_sequence(const Config& config, sim::Options machine, const Sequence& q,
                        const std::vector<std::vector<Bytes>>& inputs, sim::Fault fault = {}) {
  const int n = machine.nranks;
  sim::World world(machine);
  world.set_fault(fault);
  const Platform& p = world.platform();
  const std::vector<ncclComm_t> comms = world.create_comm();
  SeqOutcome o;
  o.out.resize(static_cast<size_t>(n));
  o.paths.resize(static_cast<size_t>(n));
  o.result.assign(static_cast<size_t>(n), ncclSuccess);
  o.after_setup.assign(static_cast<size_t>(n), std::vector<int>(sim::kSiteCount, 0));
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::condition_variable cv;
  int issued = 0;
  const uint64_t seq_before = Accounting::instance().last_seq();
  world.run_ranks([&](int r) {
    const size_t in_bytes = in_elems(q.spec, n) * dtype_size(q.spec.dtype);
    const size_t out_bytes = out_elems(q.spec, n) * dtype_size(q.spec.dtype);
    ncclComm_t comm = comms[static_cast<size_t>(r)];
    {
      sched::Engine eng(config, p);
      eng.comm_created(comm);
      for (int site = 0; site < sim::kSiteCount; ++site)
        o.after_setup[static_cast<size_t>(r)][static_cast<size_t>(site)] = world.calls_at(r, static_cast<sim::Site>(site));
      cudaStream_t stream = nullptr;
      p.cuda.StreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      std::vector<void*> ins(static_cast<size_t>(q.calls)), outs(static_cast<size_t>(q.calls));
      ncclResult_t first = ncclSuccess;
      for (int i = 0; i < q.calls; ++i) {
        void*& in = ins[static_cast<size_t>(i)];
        void*& out = outs[static_cast<size_t>(i)];
        // The application's own allocations meet the malloc faults too: such a rank issues nothing.
        if (p.cuda.Malloc(&in, in_bytes) != cudaSuccess || p.cuda.Malloc(&out, out_bytes) != cudaSuccess) {
          first = ncclSystemError;
          continue;
        }
        std::memcpy(in, inputs[static_cast<size_t>(i)][static_cast<size_t>(r)].data(), in_bytes);
        std::memset(out, 0, out_bytes);
      }
      for (int i = 0; i < q.calls && first == ncclSuccess; ++i) {
        if (!q.keys.empty() && q.keys[static_cast<size_t>(i)]) sched::Engine::set_feedback_key(q.keys[static_cast<size_t>(i)]);
        first = issue(eng, q.spec, true, ins[static_cast<size_t>(i)], outs[static_cast<size_t>(i)], comm, stream);
      }
      o.result[static_cast<size_t>(r)] = first;
      // The watchdog: a failed call aborts the communicator at once, for every rank (a peer may be
      // waiting for this rank's part of a call, in NCCL or in the guard's read of a decision).
      if (first != ncclSuccess && !aborted.exchange(true)) world.abort_comm(comm);
      {
        std::unique_lock lock(mu);
        ++issued;
        cv.notify_all();
        cv.wait(lock, [&] { return issued >= n; });
      }
      // A rank that saw no error of its own still aborts if another did (the watchdog of each rank).
      {
        std::unique_lock lock(mu);
        ++issued;
        cv.notify_all();
        cv.wait(lock, [&] { return issued >= 2 * n; });
      }
      if (aborted.load()) eng.comm_abort(comm);
      world.synchronize_rank();
      for (int i = 0; i < q.calls; ++i) {
        const char* b = static_cast<const char*>(outs[static_cast<size_t>(i)]);
        o.out[static_cast<size_t>(r)].push_back(b ? Bytes(b, b + out_bytes) : Bytes());
      }
      if (!aborted.load()) eng.comm_destroyed(comm);
      for (int i = 0; i < q.calls; ++i) {
        if (ins[static_cast<size_t>(i)]) p.cuda.Free(ins[static_cast<size_t>(i)]);
        if (outs[static_cast<size_t>(i)]) p.cuda.Free(outs[static_cast<size_t>(i)]);
      }
      p.cuda.StreamDestroy(stream);
    }
    if (const size_t live = world.live_bytes(r))
      o.leaks.push_back(fmt::format("rank {}: {} bytes of simulated device memory left", r, live));
  });
  std::vector<CallRecord> records(4096);
  const size_t got = Accounting::instance().snapshot(records.data(), records.size(), seq_before);
  for (size_t i = 0; i < got; ++i)
    if (records[i].nranks == n) o.paths[static_cast<size_t>(records[i].rank)].push_back(records[i].path);
  o.races = world.races();
  o.protocol = world.protocol_errors();
  o.deadlocked = world.deadlocked();
  o.totals = sched::error_totals();
  return o;
}

Config guard_config(uint32_t sample_every = 1, uint32_t retry_after = 3, uint32_t decide_after = 1) {
  Config c = sim_config();
  c.telemetry_sample_every = sample_every;
  c.guard_enable = true;
  c.guard_retry_after = retry_after;
  c.guard_decide_after = decide_after;
  c.log_level = "error";
  return c;
}

// The path every rank must record for call i: FP8 until the call that reads the bad call's votes
// (decide_after calls after it), full precision (fallback) for retry_after calls from there, then FP8.
std::vector<Path> expected_paths(const Sequence& q, uint32_t retry_after, bool trips, uint32_t decide_after = 1) {
  std::vector<Path> p(static_cast<size_t>(q.calls), q.spec.path);
  if (!trips || q.bad_call < 0) return p;
  const int from = q.bad_call + static_cast<int>(decide_after);
  for (int i = from; i < q.calls && (retry_after == 0 || i < from + static_cast<int>(retry_after)); ++i)
    p[static_cast<size_t>(i)] = Path::fallback;
  return p;
}

// Checks one run: clean, the paths as expected on every rank, FP8 calls bit for bit the reference
// algorithm, full-precision calls bit for bit the plain NCCL run.
std::string check(const Config& c, const Sequence& q, const std::vector<std::vector<Bytes>>& inputs,
                  const SeqOutcome& o, const SeqOutcome& plain, const std::vector<Path>& want) {
  if (o.deadlocked) return "deadlock";
  if (!o.races.empty()) return "race: " + o.races[0];
  if (!o.protocol.empty()) return "protocol: " + o.protocol[0];
  if (!o.leaks.empty()) return o.leaks[0];
  const int n = static_cast<int>(o.out.size());
  const quant::WireFormat f = quant::WireFormat::from(c);
  // The path an FP8 call records (a forced all-gather records the one-shot it is): call 0's.
  std::vector<Path> expect = want;
  if (!o.paths[0].empty() && is_fp8(o.paths[0][0]))
    for (Path& p : expect)
      if (p == q.spec.path) p = o.paths[0][0];
  for (int r = 0; r < n; ++r) {
    if (o.result[static_cast<size_t>(r)] != ncclSuccess) return fmt::format("rank {} failed", r);
    if (o.paths[static_cast<size_t>(r)] != expect) {
      std::string got;
      for (Path p : o.paths[static_cast<size_t>(r)]) got += std::string(to_string(p)) + " ";
      return fmt::format("rank {}: paths {}", r, got);
    }
    for (int i = 0; i < q.calls; ++i) {
      const Bytes& out = o.out[static_cast<size_t>(r)][static_cast<size_t>(i)];
      if (expect[static_cast<size_t>(i)] == Path::fallback) {
        if (out != plain.out[static_cast<size_t>(r)][static_cast<size_t>(i)])
          return fmt::format("rank {} call {}: full precision differs from plain NCCL", r, i);
      } else {
        Spec s = q.spec;
        const Bytes ref = expected_output(s, inputs[static_cast<size_t>(i)], r, f, stage_for(c, s, n));
        if (out != ref) return fmt::format("rank {} call {}: FP8 differs from the reference algorithm", r, i);
      }
    }
  }
  return "";
}

Sequence sequence(Collective coll, Path path, size_t count, Breakage b, int bad_rank) {
  Sequence q;
  q.spec.collective = coll;
  q.spec.path = path;
  q.spec.dtype = DataType::f32;
  q.spec.count = count;
  q.breakage = b;
  q.bad_rank = bad_rank;
  return q;
}

SeqOutcome plain_run(const Config& c, sim::Options m, const Sequence& q, const std::vector<std::vector<Bytes>>& in) {
  Sequence p = q;
  p.spec.path = Path::passthrough;
  return run_sequence(c, m, p, in);
}


// A breakage sequence (the bad rank chosen by the breakage) under `seeds` schedules, `small_scratch`
// pipelining it in 64 KiB: each run's failure, if any, into `failures` (with `trips`, every rank must
// switch at the same call; without, none may switch).
void breakage_runs(Collective coll, Path path, int n, Breakage b, size_t count, bool small_scratch, bool trips,
                   int seeds, int* runs, std::vector<std::string>& failures) {
  const Sequence q = sequence(coll, path, count, b, (n - 1 + static_cast<int>(b)) % n);
  Config c = guard_config();
  if (small_scratch) {
    c.scratch_max_bytes = 64 << 10;
    c.coalesce_max_bytes = 16 << 10;
  }
  sim::Options m;
  m.nranks = n;
  const auto inputs = inputs_of(q, n);
  const SeqOutcome plain = plain_run(c, m, q, inputs);
  for (int seed = 1; seed <= seeds; ++seed) {
    m.schedule_seed = static_cast<uint64_t>(seed);
    const SeqOutcome o = run_sequence(c, m, q, inputs);
    ++*runs;
    if (const std::string e = check(c, q, inputs, o, plain, expected_paths(q, c.guard_retry_after, trips)); !e.empty())
      failures.push_back(fmt::format("{} {} n={} count={} {} seed {}: {}", to_string(coll), to_string(path), n, count,
                                     label(b), seed, e));
  }
}

}  // namespace

TEST_CASE("guard: every breakage of e4m3 switches every rank at the same call, under every interleaving") {
  std::vector<std::string> failures;
  int runs = 0;
  const struct {
    Collective c;
    Path p;
  } variants[] = {{Collective::all_reduce, Path::two_shot},
                  {Collective::all_reduce, Path::one_shot},
                  {Collective::all_gather, Path::two_shot}};
  for (int n : {2, 3, 4})
    for (const auto& v : variants)
      for (Breakage b : {Breakage::nan_block, Breakage::inf, Breakage::outlier, Breakage::underflow})
        for (size_t count : {size_t(1000), size_t(6000)})  // 6000 x 4 B x n: pipelined in 64 KiB scratch
          breakage_runs(v.c, v.p, n, b, count, count > 1000, true, 3, &runs, failures);
  MESSAGE(runs << " runs");
  CAPTURE(failures.size());
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
}

TEST_CASE("guard: an all-to-all of one stage of whole blocks switches every rank at the same call; pipelined or ragged ones are measured only") {
  std::vector<std::string> failures;
  int runs = 0;
  for (int n : {2, 3, 4})
    for (Breakage b : {Breakage::nan_block, Breakage::inf, Breakage::outlier, Breakage::underflow})
      // 1024: one stage of whole blocks (guarded); 1000: partial blocks; 16384 in 64 KiB of scratch:
      // pipelined (both measured only, never switched). The breakage lands in the bad rank's own
      // chunk for some (rank 0's, for the all-NaN block): that chunk never leaves it, and its vote
      // still reaches every peer.
      for (size_t count : {size_t(1024), size_t(1000), size_t(16384)})
        breakage_runs(Collective::all_to_all, Path::one_shot, n, b, count, count > 1024, count == 1024, 2, &runs,
                      failures);
  MESSAGE(runs << " runs");
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
}

TEST_CASE("guard: the votes read guard.decide_after calls later: every rank switches at that call, under every interleaving") {
  // Every call measured; a guarded call's votes are read 3 calls later, and the calls between are
  // measured only (one decision in flight): calls 0, 3, 6, 9 carry votes. Call 3 breaks, so calls
  // 6..8 run in full precision and call 9 is FP8 again.
  std::vector<std::string> failures;
  int runs = 0;
  for (int n : {2, 3})
    for (Path path : {Path::two_shot, Path::one_shot})
      for (Breakage b : {Breakage::nan_block, Breakage::outlier}) {
        Sequence q = sequence(Collective::all_reduce, path, 1000, b, n - 1);
        q.calls = 10;
        q.bad_call = 3;
        const Config c = guard_config(1, 3, 3);
        sim::Options m;
        m.nranks = n;
        const auto inputs = inputs_of(q, n);
        const SeqOutcome plain = plain_run(c, m, q, inputs);
        for (uint64_t seed : {1ull, 2ull, 3ull, 4ull}) {
          m.schedule_seed = seed;
          const SeqOutcome o = run_sequence(c, m, q, inputs);
          ++runs;
          const std::string e = check(c, q, inputs, o, plain, expected_paths(q, 3, true, 3));
          if (!e.empty())
            failures.push_back(fmt::format("{} n={} {} seed {}: {}", to_string(path), n, label(b), seed, e));
        }
      }
  MESSAGE(runs << " runs");
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
}

TEST_CASE("guard: clean data never trips; the reduce-scatter and ring are measured but never guarded") {
  std::vector<std::string> failures;
  for (int n : {2, 4}) {
    for (const auto& [coll, path, b] :
         {std::tuple{Collective::all_reduce, Path::two_shot, Breakage::none},
          std::tuple{Collective::all_reduce, Path::one_shot, Breakage::none},
          std::tuple{Collective::reduce_scatter, Path::two_shot, Breakage::nan_block},
          std::tuple{Collective::all_reduce, Path::ring, Breakage::nan_block}}) {
      Sequence q = sequence(coll, path, 2048, b, 0);
      if (b == Breakage::none) q.bad_call = -1;
      const Config c = guard_config();
      sim::Options m;
      m.nranks = n;
      const auto inputs = inputs_of(q, n);
      const SeqOutcome o = run_sequence(c, m, q, inputs);
      const std::string e = check(c, q, inputs, o, o, expected_paths(q, c.guard_retry_after, false));
      if (!e.empty()) failures.push_back(fmt::format("{} {} n={}: {}", to_string(coll), to_string(path), n, e));
    }
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
}

TEST_CASE("guard: over a direct transport the flags travel in the windows, with the same switch") {
  std::vector<std::string> failures;
  for (DirectMode mode : {DirectMode::peer_memory, DirectMode::host_memory})
    for (int n : {2, 3})
      for (const auto& [coll, path] : {std::pair{Collective::all_reduce, Path::two_shot},
                                       std::pair{Collective::all_reduce, Path::one_shot},
                                       std::pair{Collective::all_gather, Path::two_shot}}) {
        const Sequence q = sequence(coll, path, 3000, Breakage::nan_block, n - 1);
        Config c = guard_config();
        c.direct_transport = mode;
        c.direct_assume_one_host = true;
        sim::Options m;
        m.nranks = n;
        m.hosts.assign(static_cast<size_t>(n), 7);
        const auto inputs = inputs_of(q, n);
        const SeqOutcome plain = plain_run(c, m, q, inputs);
        for (uint64_t seed : {1ull, 5ull}) {
          m.schedule_seed = seed;
          const SeqOutcome o = run_sequence(c, m, q, inputs);
          const std::string e = check(c, q, inputs, o, plain, expected_paths(q, c.guard_retry_after, true));
          if (!e.empty())
            failures.push_back(fmt::format("{} {} {} n={} seed {}: {}", to_string(mode), to_string(coll),
                                           to_string(path), n, seed, e));
        }
      }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
}

TEST_CASE("guard: only measured calls vote (telemetry.sample_every), and a tensor's key is its own scope") {
  const int n = 3;
  sim::Options m;
  m.nranks = n;
  SUBCASE("a breakage in an unmeasured call passes; in a measured one it trips") {
    const Config c = guard_config(4, 2);
    Sequence q = sequence(Collective::all_reduce, Path::two_shot, 1000, Breakage::inf, 2);
    q.calls = 10;
    q.bad_call = 2;  // calls 0, 4, 8 are measured
    auto inputs = inputs_of(q, n);
    SeqOutcome o = run_sequence(c, m, q, inputs);
    CHECK(check(c, q, inputs, o, o, expected_paths(q, 2, false)) == "");
    q.bad_call = 4;
    inputs = inputs_of(q, n);
    const SeqOutcome plain = plain_run(c, m, q, inputs);
    o = run_sequence(c, m, q, inputs);
    CHECK(check(c, q, inputs, o, plain, expected_paths(q, 2, true)) == "");
  }
  SUBCASE("two tensors alternate: only the broken one switches") {
    const Config c = guard_config(1, 0);  // retry_after 0: for good
    Sequence q = sequence(Collective::all_reduce, Path::one_shot, 1000, Breakage::nan_block, 0);
    q.calls = 8;
    q.bad_call = 3;  // key 20's second call
    q.keys = {10, 20, 10, 20, 10, 20, 10, 20};
    const auto inputs = inputs_of(q, n);
    const SeqOutcome plain = plain_run(c, m, q, inputs);
    const SeqOutcome o = run_sequence(c, m, q, inputs);
    std::vector<Path> want(8, Path::one_shot);
    want[5] = want[7] = Path::fallback;
    CHECK(check(c, q, inputs, o, plain, want) == "");
  }
  SUBCASE("the guard off: telemetry only, nothing switches") {
    Config c = guard_config();
    c.guard_enable = false;
    Sequence q = sequence(Collective::all_reduce, Path::two_shot, 1000, Breakage::nan_block, 1);
    const auto inputs = inputs_of(q, n);
    const SeqOutcome o = run_sequence(c, m, q, inputs);
    CHECK(check(c, q, inputs, o, o, expected_paths(q, 3, false)) == "");
  }
}

TEST_CASE("guard: faults at every site of a guarded sequence: no hang, no race; ranks apart never without a failure") {
  const int n = 3;
  Config c = guard_config(1, 2);
  c.audit_every = 2;  // the audit's copies and its extra NCCL call meet the faults too
  Sequence q = sequence(Collective::all_reduce, Path::two_shot, 1000, Breakage::nan_block, 1);
  q.calls = 5;
  const auto inputs = inputs_of(q, n);
  sim::Options m;
  m.nranks = n;
  std::vector<std::string> failures;
  int runs = 0, unaffected = 0;
  // Faults in the calls only: the agreement's own faults are sched_engine_faults_test's.
  const SeqOutcome clean = run_sequence(c, m, q, inputs);
  for (int s = 0; s < sim::kSiteCount; ++s)
    for (int index = 0; index < 16; ++index) {
      const sim::Site site = static_cast<sim::Site>(s);
      sim::Fault f;
      f.rank = 1;
      f.site = site;
      f.index = clean.after_setup[1][static_cast<size_t>(s)] + index;
      const SeqOutcome o = run_sequence(c, m, q, inputs, f);
      ++runs;
      const std::string what = fmt::format("{} #{}", sim::to_string(site), f.index);
      if (o.deadlocked) failures.push_back(what + ": deadlock");
      if (!o.races.empty()) failures.push_back(what + ": race " + o.races[0]);
      if (!o.protocol.empty()) failures.push_back(what + ": protocol " + o.protocol[0]);
      if (!o.leaks.empty()) failures.push_back(what + ": " + o.leaks[0]);
      // A fault that fails no call changes nothing: every rank makes the same choices. Once a call
      // has failed, the watchdog's abort ends the communicator: its later results (and decisions
      // read from aborted calls) are void on every rank, as NCCL's own after an abort.
      const bool any_failed = std::any_of(o.result.begin(), o.result.end(), [](ncclResult_t r) { return r != ncclSuccess; });
      if (!any_failed) {
        for (int r = 1; r < n; ++r)
          if (o.paths[static_cast<size_t>(r)] != o.paths[0]) failures.push_back(what + ": ranks apart without a failure");
        ++unaffected;
      }
    }
  MESSAGE(runs << " faulty runs, " << unaffected << " where no call failed");
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
}

TEST_CASE("telemetry: totals per collective and path, guard counts, and the figures of the reference") {
  const int n = 2;
  sim::Options m;
  m.nranks = n;
  sched::reset_error_totals();
  const sched::ErrorTotals before = sched::error_totals();
  const Config c = guard_config(1, 2);
  Sequence q = sequence(Collective::all_reduce, Path::two_shot, 1000, Breakage::nan_block, 1);
  q.calls = 6;  // 0..2 FP8 (2 bad), 3..4 full precision, 5 FP8 again
  const auto inputs = inputs_of(q, n);
  const uint64_t first_seq = Accounting::instance().last_seq() + 1;
  const SeqOutcome o = run_sequence(c, m, q, inputs);
  const uint64_t last_seq = Accounting::instance().last_seq();
  const int ar = static_cast<int>(Collective::all_reduce), ts = static_cast<int>(Path::two_shot);
  const sched::ErrorTotals& t = o.totals;
  CHECK(t.measured_calls[ar][ts] - before.measured_calls[ar][ts] == 4 * n);  // calls 0, 1, 2, 5 on each rank
  CHECK(t.guard_trips[ar] - before.guard_trips[ar] == n);
  CHECK(t.guard_full_calls[ar] - before.guard_full_calls[ar] == 2 * n);
  CHECK(t.guard_resumed[ar] - before.guard_resumed[ar] == n);
  // The input figures are the reference's, summed over the measured calls of both ranks.
  const quant::WireFormat f = quant::WireFormat::from(c);
  quant::ErrorStats want;
  for (int i : {0, 1, 2, 5})
    for (int r = 0; r < n; ++r) {
      const Bytes& b = inputs[static_cast<size_t>(i)][static_cast<size_t>(r)];
      want.add(quant::ref::measure(reinterpret_cast<const float*>(b.data()), b.size() / 4, f));
    }
  // Two-shot quantizes n shards of the call; block-aligned shards make the same blocks as one chunk.
  const quant::ErrorStats got = [&] {
    quant::ErrorStats s = t.input[ar][ts];
    const quant::ErrorStats& b = before.input[ar][ts];
    s.sq_error -= b.sq_error;
    s.sq_input -= b.sq_input;
    s.elements -= b.elements;
    s.saturated -= b.saturated;
    s.flushed -= b.flushed;
    s.nonfinite -= b.nonfinite;
    return s;
  }();
  CHECK(got.elements == want.elements);
  CHECK(got.nonfinite == want.nonfinite);
  CHECK(got.flushed == want.flushed);
  CHECK(got.saturated == want.saturated);
  CHECK(std::abs(got.sq_input - want.sq_input) <= 1e-12 * want.sq_input);  // but for the order of fp64 additions
  CHECK(std::abs(got.sq_error - want.sq_error) <= 1e-12 * want.sq_error);
  CHECK(got.nonfinite == 128);  // the all-NaN block
  CHECK(t.requant[ar][ts].elements > before.requant[ar][ts].elements);
  // Each measured call's own figures by sequence number (fp8wire_call_error, the profiler's column).
  sched::MeasuredCall mc;
  CHECK_FALSE(sched::measured_call(0, &mc));
  CHECK_FALSE(sched::measured_call(last_seq + 1000, &mc));
  int found = 0;
  for (uint64_t seq = first_seq; seq <= last_seq; ++seq)
    if (sched::measured_call(seq, &mc)) {
      ++found;
      CHECK(mc.seq == seq);
      CHECK(mc.input_rel_error > 0.001);   // e4m3 on Gaussian data: ~2.6 %
      CHECK(mc.input_rel_error < 0.1);
      CHECK(mc.requant_rel_error > 0);     // two-shot requantizes its reduced shard
    }
  CHECK(found == 4 * n);  // calls 0, 1, 2 and 5 were measured on each rank
}

TEST_CASE("guard: the choice of a scope's calls, as a pure function") {
  sched::GuardSettings g;
  g.sample_every = 4;
  g.enable = true;
  g.retry_after = 3;
  sched::ScopeState s;
  std::vector<int> measured;
  for (int i = 0; i < 9; ++i)
    if (sched::choose(s, g, true, false).measure) measured.push_back(i);
  CHECK(measured == std::vector<int>{0, 4, 8});
  CHECK_FALSE(sched::choose(s, g, true, true).measure);  // call 9 under capture: never measured
  // A decision after call 9: calls 10..12 in full precision, 13 measured again, then every 4th.
  CHECK(sched::apply_decision(s, true, g.retry_after));
  std::vector<bool> full, meas;
  for (int i = 10; i < 18; ++i) {
    const sched::CallChoice c = sched::choose(s, g, true, false);
    full.push_back(c.full_precision);
    meas.push_back(c.measure);
  }
  CHECK(full == std::vector<bool>{true, true, true, false, false, false, false, false});
  CHECK(meas == std::vector<bool>{false, false, false, true, false, false, true, false});
  CHECK_FALSE(sched::apply_decision(s, false, 3));
  // While a guarded call's votes are still to be read, a measured call carries none.
  sched::ScopeState busy;
  busy.pending = 5;
  const sched::CallChoice first = sched::choose(busy, g, true, false);
  CHECK((first.measure && !first.guard));
  busy.pending = -1;
  busy.has_decision = true;
  CHECK_FALSE(sched::choose(busy, g, true, false).guard);
  auto eligible = [](Collective c, Path p, ScaleType scale) {
    sched::Route route;
    route.path = route.algorithm = p;
    route.stage_elems = 4096;
    quant::WireFormat format;
    format.scale = scale;
    return sched::guard_eligible(sched::CallShape{c, DataType::bf16, ReduceOp::sum, 4096, 4}, route, format);
  };
  CHECK(eligible(Collective::all_reduce, Path::two_shot, ScaleType::fp32));
  CHECK(eligible(Collective::all_gather, Path::two_shot, ScaleType::bf16));
  CHECK(eligible(Collective::all_to_all, Path::one_shot, ScaleType::fp32));
  CHECK_FALSE(eligible(Collective::all_reduce, Path::two_shot, ScaleType::e8m0));
  CHECK_FALSE(eligible(Collective::reduce_scatter, Path::two_shot, ScaleType::fp32));
  CHECK_FALSE(eligible(Collective::all_reduce, Path::ring, ScaleType::fp32));
  CHECK_FALSE(eligible(Collective::all_reduce, Path::hierarchical, ScaleType::fp32));
}

TEST_CASE("audit: every Nth call also runs in full precision on a copy; the FP8 result's true error is reported") {
  std::vector<std::string> failures;
  for (const auto& [coll, path, direct] :
       {std::tuple{Collective::all_reduce, Path::two_shot, false}, std::tuple{Collective::all_reduce, Path::one_shot, false},
        std::tuple{Collective::reduce_scatter, Path::two_shot, false}, std::tuple{Collective::all_gather, Path::two_shot, false},
        std::tuple{Collective::all_reduce, Path::two_shot, true}}) {
    const int n = 3;
    Sequence q = sequence(coll, path, 1500, Breakage::none, 0);
    q.bad_call = -1;
    q.calls = 5;
    Config c = guard_config(1, 3);
    c.guard_enable = false;
    c.audit_every = 2;  // calls 0, 2, 4
    sim::Options m;
    m.nranks = n;
    if (direct) {
      c.direct_transport = DirectMode::peer_memory;
      c.direct_assume_one_host = true;
      m.hosts.assign(n, 7);
    }
    const auto inputs = inputs_of(q, n);
    const SeqOutcome plain = plain_run(c, m, q, inputs);
    // Earlier tests' faults aborted calls whose void results may hold any value: start from zero.
    sched::reset_error_totals();
    const sched::ErrorTotals before = sched::error_totals();
    const SeqOutcome o = run_sequence(c, m, q, inputs);
    const std::string what = fmt::format("{} {}{}", to_string(coll), to_string(path), direct ? " direct" : "");
    // The FP8 results are those of the reference algorithm, untouched by the audit beside them.
    const std::string e = check(c, q, inputs, o, plain, expected_paths(q, 3, false));
    if (!e.empty()) failures.push_back(what + ": " + e);
    const int ci = static_cast<int>(coll);
    const int pi = o.paths[0].empty() ? 0 : static_cast<int>(o.paths[0][0]);
    double want_err = 0, want_exact = 0;
    for (int i : {0, 2, 4})
      for (int r = 0; r < n; ++r) {
        const Bytes& y = o.out[static_cast<size_t>(r)][static_cast<size_t>(i)];
        const Bytes& x = plain.out[static_cast<size_t>(r)][static_cast<size_t>(i)];
        const float* yf = reinterpret_cast<const float*>(y.data());
        const float* xf = reinterpret_cast<const float*>(x.data());
        for (size_t k = 0; k < x.size() / 4; ++k) {
          want_err += (double(yf[k]) - xf[k]) * (double(yf[k]) - xf[k]);
          want_exact += double(xf[k]) * xf[k];
        }
      }
    const uint64_t calls = o.totals.audited_calls[ci][pi] - before.audited_calls[ci][pi];
    const double err = o.totals.audit_sq_error[ci][pi] - before.audit_sq_error[ci][pi];
    const double exact = o.totals.audit_sq_exact[ci][pi] - before.audit_sq_exact[ci][pi];
    if (calls != 3u * n) failures.push_back(fmt::format("{}: {} audited calls, expected {}", what, calls, 3 * n));
    if (std::abs(err - want_err) > 1e-12 * want_err || std::abs(exact - want_exact) > 1e-12 * want_exact)
      failures.push_back(fmt::format("{}: audit sums {} {} expected {} {}", what, err, exact, want_err, want_exact));
    if (!(want_err > 0)) failures.push_back(what + ": the FP8 results equal the exact ones: nothing measured");
    MESSAGE(what << ": audited relative error " << std::sqrt(err / exact));
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
}
