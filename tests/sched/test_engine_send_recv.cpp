// The application's own point-to-point messages (ncclSend / ncclRecv) over the simulated machine
// (tests/sched/sim/sim.hpp), through the engine unchanged:
//   - an uneven all-to-all as PyTorch issues it (one group: a send and a receive per peer, the rank's
//     own chunk to itself, zero-length chunks, counts not a multiple of the block), each rank walking
//     its peers in another order: every message from another rank bit for bit its reference (quantized
//     as one message, decoded), the own chunk exact; 2 to 5 ranks, every float dtype; other dtypes exact;
//   - a ring whose ranks issue their receive and their send in opposite orders, in a group, then one
//     message at a time outside any group (pipeline stages), then in one group with an FP8 all-reduce;
//   - the switch off (the default), messages below the threshold and a non-blocking communicator:
//     exact, at both ends alike; under graph capture the same route as outside it;
//   - the records: one per message at each end, FP8 or not, the wire bytes at the sender;
//   - telemetry and the audit at the sending end (its figures and the true error of the message's
//     round trip through the wire format, as the reference gives them), never a switch of the guard,
//     and the communicator's own counts (audit, guard) left alike on ranks that sent nothing;
//   - every wire buffer released once its stream has passed it (no race, nothing touched after its
//     free, nothing left allocated), also when a launch fails: the call's error, the peer released by
//     the application's abort.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/log.hpp"
#include "quant/fp8_math.hpp"
#include "quant/reference.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/comm/telemetry_monitor.hpp"
#include "sched/engine/engine.hpp"
#include "sched/engine/engine_probe.hpp"
#include "sched/platform/nccl_types.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;

namespace {

ncclDataType_t nccl_of(DataType t) {
  switch (t) {
    case DataType::f32: return ncclFloat32;
    case DataType::f16: return ncclFloat16;
    case DataType::bf16: return ncclBfloat16;
    case DataType::int32: return ncclInt32;
    default: return ncclUint8;
  }
}

// What one rank's body sees: its engine, communicator, stream, and device memory it asks for (freed
// by the harness once everything is checked).
struct RankCtx {
  sched::Engine& eng;
  ncclComm_t comm;
  cudaStream_t stream;
  int rank, n;
  const Platform& p;
  std::vector<void*> buffers;
  void* alloc(size_t bytes) {
    void* b = nullptr;
    p.cuda.Malloc(&b, bytes ? bytes : 1);
    buffers.push_back(b);
    return b;
  }
};

struct WorldRun {
  std::vector<ncclResult_t> results;
  std::string problems;  // races, protocol errors, a deadlock, memory left: "" when none
};

// How a world differs from the plain one: a fault, every stream captured, how the communicator was made.
struct WorldOptions {
  sim::Fault fault;
  bool capturing = false;
  sched::CommCreation how;
};

// Runs `body` on every rank of a fresh machine of `n` ranks (one communicator over all). A rank whose
// body fails aborts the communicator once, as an application's watchdog does. `after(rank)` reads the
// results once the rank's stream is done.
WorldRun run_world(int n, const Config& config, const std::function<ncclResult_t(RankCtx&)>& body,
                   const std::function<void(RankCtx&)>& after = {}, const WorldOptions& options = {}) {
  sim::Options machine;
  machine.nranks = n;
  machine.capturing = options.capturing;
  sim::World world(machine);
  world.set_fault(options.fault);
  const Platform& p = world.platform();
  const std::vector<ncclComm_t> comms = world.create_comm();
  WorldRun out;
  out.results.assign(static_cast<size_t>(n), ncclSuccess);
  std::atomic<bool> aborted{false};
  std::vector<std::string> leaks(static_cast<size_t>(n));
  world.run_ranks([&](int r) {
    ncclComm_t comm = comms[static_cast<size_t>(r)];
    {
      sched::Engine eng(config, p);
      eng.comm_created(comm, options.how);
      cudaStream_t stream = nullptr;
      p.cuda.StreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      RankCtx ctx{eng, comm, stream, r, n, p, {}};
      const ncclResult_t res = body(ctx);
      out.results[static_cast<size_t>(r)] = res;
      if (res != ncclSuccess && !aborted.exchange(true)) world.abort_comm(comm);
      world.synchronize_rank();
      if (after && res == ncclSuccess) after(ctx);
      eng.comm_destroyed(comm);
      for (void* b : ctx.buffers) p.cuda.Free(b);
      p.cuda.StreamDestroy(stream);
    }
    if (const size_t live = world.live_bytes(r)) leaks[static_cast<size_t>(r)] = fmt::format("rank {}: {} bytes left; ", r, live);
  });
  out.problems = world_problems(world);
  for (const std::string& e : world.races()) out.problems += e + "; ";
  for (const std::string& l : leaks) out.problems += l;
  return out;
}

// Message bytes, varied per (sender, receiver) and per rank: magnitudes per block, mixed signs.
Bytes message(DataType t, size_t count, int from, int to) {
  Spec s{Collective::all_reduce, Path::passthrough, t, ReduceOp::sum, count, 1000u + static_cast<uint64_t>(from * 31 + to)};
  if (t == DataType::int32) {
    Bytes b(count * 4);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>((i * 131 + static_cast<size_t>(from * 7 + to)) % 251);
    return b;
  }
  return make_input(s, from, 1);
}

// What the receiver of an FP8 message holds: the message quantized as one message and decoded.
Bytes through_fp8(const Bytes& in, DataType t, size_t count, const Config& config) {
  const quant::WireFormat f = quant::WireFormat::from(config);
  const quant::ElemType type = elem_type(t);
  const quant::Segmented layout = quant::Segmented::single(count, f);
  std::vector<char> wire(quant::chunk_bytes(count, f) + 16);
  Bytes out(in.size());
  REQUIRE(quant::ref::quantize(in.data(), type, count, wire.data(), layout, f, 0, nullptr) == nullptr);
  REQUIRE(quant::ref::dequantize(wire.data(), layout, count, out.data(), type, f, nullptr) == nullptr);
  return out;
}

// Element i of a float buffer of dtype `t`, widened.
double read_elem(const Bytes& b, DataType t, size_t i) {
  uint16_t h;
  float f;
  switch (t) {
    case DataType::bf16: std::memcpy(&h, b.data() + 2 * i, 2); return quant::math::bf16_to_f32(h);
    case DataType::f16: std::memcpy(&h, b.data() + 2 * i, 2); return quant::math::f16_to_f32(h);
    default: std::memcpy(&f, b.data() + 4 * i, 4); return f;
  }
}

// The uneven split of an all-to-all: elements rank `from` sends rank `to` (zero for some pairs).
size_t split(int from, int to, int n, size_t base) {
  static constexpr size_t kShapes[] = {1000, 0, 4097, 129, 1, 2500, 128, 33};
  return (base + kShapes[static_cast<size_t>(from * n + to + from) % 8]) % 5000;
}

// Records of kind send or recv made since `seq` on rank `rank`, by path.
// plain_sent / plain_received: what NCCL's own send and receive would move (CallRecord::plain_wire_bytes).
struct MessageRecords {
  size_t fp8 = 0, plain = 0, wire_sent = 0, plain_sent = 0, plain_received = 0;
};
MessageRecords message_records(uint64_t seq, int rank) {
  std::vector<CallRecord> records(8192);
  const size_t got = Accounting::instance().snapshot(records.data(), records.size(), seq);
  MessageRecords m;
  for (size_t i = 0; i < got; ++i) {
    const CallRecord& r = records[i];
    if ((r.kind != CallKind::send && r.kind != CallKind::recv) || r.rank != rank) continue;
    if (is_fp8(r.path)) ++m.fp8;
    else ++m.plain;
    if (r.kind == CallKind::send) {
      m.wire_sent += r.wire_bytes;
      m.plain_sent += r.plain_wire_bytes;
    } else {
      m.plain_received += r.plain_wire_bytes;
    }
  }
  return m;
}

Config p2p_config(bool on = true) {
  Config c = sim_config();
  c.collective_enable[static_cast<int>(Collective::send_recv)] = on;
  return c;
}

// An uneven all-to-all of `t` as PyTorch issues it; "" when every rank got its reference.
std::string uneven_all_to_all(int n, DataType t, size_t base, const Config& config, bool expect_fp8,
                              const WorldOptions& options = {}) {
  std::vector<std::vector<Bytes>> got(static_cast<size_t>(n));
  const uint64_t seq = Accounting::instance().last_seq();
  const WorldRun w = run_world(
      n, config,
      [&](RankCtx& c) -> ncclResult_t {
        const size_t es = dtype_size(t);
        std::vector<void*> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
        for (int j = 0; j < n; ++j) {
          const Bytes m = message(t, split(c.rank, j, n, base), c.rank, j);
          in[static_cast<size_t>(j)] = c.alloc(m.size());
          if (!m.empty()) std::memcpy(in[static_cast<size_t>(j)], m.data(), m.size());
          out[static_cast<size_t>(j)] = c.alloc(split(j, c.rank, n, base) * es);
        }
        ncclResult_t first = c.eng.group_start();
        // Each rank walks its peers in its own order: even ranks upwards from themselves, odd ones
        // downwards, receive and send swapped.
        for (int k = 0; k < n; ++k) {
          const int j = c.rank % 2 ? (c.rank - k + n) % n : (c.rank + k) % n;
          const size_t sc = split(c.rank, j, n, base), rc = split(j, c.rank, n, base);
          auto send = [&] { return sc ? c.eng.send(in[static_cast<size_t>(j)], sc, nccl_of(t), j, c.comm, c.stream) : ncclSuccess; };
          auto recv = [&] { return rc ? c.eng.recv(out[static_cast<size_t>(j)], rc, nccl_of(t), j, c.comm, c.stream) : ncclSuccess; };
          const ncclResult_t a = c.rank % 2 ? recv() : send();
          const ncclResult_t b = c.rank % 2 ? send() : recv();
          if (first == ncclSuccess) first = a != ncclSuccess ? a : b;
        }
        const ncclResult_t end = c.eng.group_end();
        return first != ncclSuccess ? first : end;
      },
      [&](RankCtx& c) {
        const size_t es = dtype_size(t);
        // The receive buffers are the ones allocated second of each pair.
        for (int j = 0; j < n; ++j) {
          const char* o = static_cast<const char*>(c.buffers[static_cast<size_t>(2 * j + 1)]);
          got[static_cast<size_t>(c.rank)].emplace_back(o, o + split(j, c.rank, n, base) * es);
        }
      },
      options);
  const std::string what = fmt::format("uneven all-to-all n={} dtype={} base={}", n, static_cast<int>(t), base);
  if (!w.problems.empty()) return what + ": " + w.problems;
  size_t fp8_messages = 0;
  for (int r = 0; r < n; ++r) {
    if (w.results[static_cast<size_t>(r)] != ncclSuccess)
      return fmt::format("{}: rank {} returned {}", what, r, static_cast<int>(w.results[static_cast<size_t>(r)]));
    for (int j = 0; j < n; ++j) {
      const size_t count = split(j, r, n, base);
      const Bytes sent = message(t, count, j, r);
      const bool fp8 = expect_fp8 && j != r && count > 0 && t != DataType::int32;
      fp8_messages += fp8 ? 2 : 0;  // a record at each end
      const Bytes want = fp8 ? through_fp8(sent, t, count, config) : sent;
      if (got[static_cast<size_t>(r)][static_cast<size_t>(j)] != want)
        return fmt::format("{}: rank {}'s message from rank {} ({} elements) is not {}", what, r, j, count,
                           fp8 ? "its FP8 reference" : "exactly what was sent");
    }
  }
  size_t fp8_records = 0;
  for (int r = 0; r < n; ++r) fp8_records += message_records(seq, r).fp8;
  if (fp8_records != fp8_messages)
    return fmt::format("{}: {} FP8 message records, {} expected", what, fp8_records, fp8_messages);
  return "";
}

}  // namespace

TEST_CASE("an uneven all-to-all of FP8 messages: each its reference bit for bit, the own chunk exact, any peer order") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  size_t runs = 0;
  const std::vector<int> worlds = kSanitizerTier ? std::vector<int>{2, 3} : std::vector<int>{2, 3, 4, 5};
  for (int n : worlds)
    for (DataType t : {DataType::f32, DataType::f16, DataType::bf16, DataType::int32})
      for (size_t base : {size_t{0}, size_t{777}}) {
        ++runs;
        if (std::string e = uneven_all_to_all(n, t, base, p2p_config(), true); !e.empty()) failures.push_back(e);
      }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
  MESSAGE(runs << " uneven all-to-alls");
}

TEST_CASE("FP8 messages with every wire format option") {
  log_set_level(LogLevel::error);
  std::vector<std::string> failures;
  for (const FormatOption& fm : std::span(kFormatOptions).subspan(1)) {
    Config c = p2p_config();
    fm.set_on(c);
    if (std::string e = uneven_all_to_all(3, DataType::bf16, 11, c, true); !e.empty()) failures.push_back(e);
  }
  CHECK_MESSAGE(failures.empty(), first_failures(failures));
}

TEST_CASE("messages pass through exactly at both ends: the switch off (the default), below the threshold") {
  log_set_level(LogLevel::error);
  CHECK(!Config{}.collective_enable[static_cast<int>(Collective::send_recv)]);
  CHECK(uneven_all_to_all(3, DataType::bf16, 0, p2p_config(false), false) == "");
  Config high = p2p_config();
  for (uint64_t& t : high.thresholds[static_cast<int>(Collective::send_recv)]) t = 1 << 20;  // every message below
  CHECK(uneven_all_to_all(3, DataType::f32, 0, high, false) == "");
  // A non-blocking communicator never has an agreement: its messages pass through, at both ends.
  WorldOptions nonblocking;
  nonblocking.how.nonblocking = true;
  CHECK(uneven_all_to_all(3, DataType::bf16, 0, p2p_config(), false, nonblocking) == "");
}

TEST_CASE("under graph capture the messages take the same route: FP8, their reference bit for bit") {
  log_set_level(LogLevel::error);
  WorldOptions captured;
  captured.capturing = true;
  for (int n : {2, 4}) CHECK(uneven_all_to_all(n, DataType::bf16, 5, p2p_config(), true, captured) == "");
}

TEST_CASE("a ring: receive and send issued in opposite orders, in a group, outside any group, beside an FP8 all-reduce") {
  log_set_level(LogLevel::error);
  const Config config = p2p_config();
  for (int n : {2, 3, 4}) {
    for (int mode = 0; mode < 3; ++mode) {  // 0: one group; 1: no group (pipeline stages); 2: a group with an all-reduce
      CAPTURE(n);
      CAPTURE(mode);
      const size_t count = 3000 + static_cast<size_t>(n) * 7;
      std::vector<Bytes> got(static_cast<size_t>(n)), reduced(static_cast<size_t>(n));
      const Spec ar{Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, 4096, 3};
      const std::vector<Bytes> ar_in = inputs_for(ar, n);
      const uint64_t seq = Accounting::instance().last_seq();
      const WorldRun w = run_world(
          n, config,
          [&](RankCtx& c) -> ncclResult_t {
            const int next = (c.rank + 1) % n, prev = (c.rank + n - 1) % n;
            const Bytes m = message(DataType::bf16, count, c.rank, next);
            void* in = c.alloc(m.size());
            void* out = c.alloc(m.size());
            std::memcpy(in, m.data(), m.size());
            void* ar_buf = c.alloc(ar_in[0].size());
            std::memcpy(ar_buf, ar_in[static_cast<size_t>(c.rank)].data(), ar_in[0].size());
            auto send = [&] { return c.eng.send(in, count, ncclBfloat16, next, c.comm, c.stream); };
            auto recv = [&] { return c.eng.recv(out, count, ncclBfloat16, prev, c.comm, c.stream); };
            ncclResult_t res = ncclSuccess;
            auto note = [&res](ncclResult_t r) {
              if (res == ncclSuccess) res = r;
            };
            if (mode == 1) {
              // One message at a time, as a pipeline's stages: rank 0 sends first, every other rank
              // receives first, so the ring unwinds.
              if (c.rank == 0) {
                note(send());
                note(recv());
              } else {
                note(recv());
                note(send());
              }
              return res;
            }
            note(c.eng.group_start());
            if (mode == 2) note(c.eng.all_reduce(ar_buf, ar_buf, 4096, ncclBfloat16, ncclSum, c.comm, c.stream));
            if (c.rank % 2) {
              note(recv());
              note(send());
            } else {
              note(send());
              note(recv());
            }
            note(c.eng.group_end());
            return res;
          },
          [&](RankCtx& c) {
            const char* o = static_cast<const char*>(c.buffers[1]);
            got[static_cast<size_t>(c.rank)].assign(o, o + count * 2);
            const char* a = static_cast<const char*>(c.buffers[2]);
            reduced[static_cast<size_t>(c.rank)].assign(a, a + ar_in[0].size());
          });
      REQUIRE_MESSAGE(w.problems.empty(), w.problems);
      for (int r = 0; r < n; ++r) {
        CHECK(w.results[static_cast<size_t>(r)] == ncclSuccess);
        const int prev = (r + n - 1) % n;
        CHECK(got[static_cast<size_t>(r)] ==
              through_fp8(message(DataType::bf16, count, prev, r), DataType::bf16, count, config));
        if (mode == 2) CHECK(reduced[static_cast<size_t>(r)] == reduced[0]);  // ranks agree bitwise
        const MessageRecords m = message_records(seq, r);
        CHECK(m.fp8 == 2);
        CHECK(m.wire_sent == quant::chunk_bytes(count, quant::WireFormat::from(config)));
        CHECK(m.plain_sent == count * 2);  // the bf16 message at its sending end
        CHECK(m.plain_received == 0);
      }
    }
  }
}

TEST_CASE("a failed launch: the sender's call fails, the communicator with it, and the abort releases the receiver") {
  log_set_level(LogLevel::off);
  const Config config = p2p_config();
  // Rank 0's first codec launch is its message's quantize.
  sim::Fault fault;
  fault.rank = 0;
  fault.site = sim::Site::codec;
  fault.index = 0;
  std::vector<ncclResult_t> async(2, ncclSuccess);
  const WorldRun w = run_world(
      2, config,
      [&](RankCtx& c) -> ncclResult_t {
        void* buf = c.alloc(4096 * 4);
        std::memset(buf, 0, 4096 * 4);
        const ncclResult_t first = c.rank == 0 ? c.eng.send(buf, 4096, ncclFloat32, 1, c.comm, c.stream)
                                               : c.eng.recv(buf, 4096, ncclFloat32, 0, c.comm, c.stream);
        if (first != ncclSuccess) return first;
        // A later message on the failed communicator returns the same error at once.
        return c.rank == 0 ? c.eng.send(buf, 4096, ncclFloat32, 1, c.comm, c.stream) : ncclSuccess;
      },
      {}, WorldOptions{fault});
  CHECK(w.problems.empty());
  CHECK(w.results[0] == ncclUnhandledCudaError);
  // Its receive was issued and the abort completed it without data, or the abort came first and the
  // receive returned the communicator's error.
  CHECK((w.results[1] == ncclSuccess || w.results[1] == ncclRemoteError));
}

TEST_CASE("telemetry and the audit watch each FP8 message at its sending end; the guard never switches one") {
  log_set_level(LogLevel::error);
  Config config = p2p_config();
  config.telemetry_sample_every = 1;
  config.audit_every = 1;  // every message's wire also decoded at its sender and compared with its data
  config.guard_enable = true;
  config.guard_max_rel_error = 0;  // every measured message would vote, were messages guarded
  const int n = 3;
  const DataType t = DataType::bf16;
  const size_t base = 0;
  sched::reset_error_totals();
  // Every message FP8, its reference bit for bit: measuring and auditing change nothing it carries.
  CHECK(uneven_all_to_all(n, t, base, config, true) == "");
  CHECK(uneven_all_to_all(n, t, base, config, true) == "");  // not switched the second time either
  const sched::ErrorTotals totals = sched::error_totals();
  const size_t slot = static_cast<size_t>(Collective::send_recv), one = static_cast<size_t>(Path::one_shot);
  // What the reference says: one measurement and one audit per FP8 message sent, the audit's error
  // that of the message's own round trip through the wire format.
  uint64_t messages = 0, elements = 0;
  double sq_error = 0, sq_exact = 0;
  for (int from = 0; from < n; ++from)
    for (int to = 0; to < n; ++to) {
      const size_t count = split(from, to, n, base);
      if (from == to || count == 0) continue;
      const Bytes sent = message(t, count, from, to);
      const Bytes got = through_fp8(sent, t, count, config);
      for (size_t i = 0; i < count; ++i) {
        const double x = read_elem(sent, t, i), y = read_elem(got, t, i);
        sq_error += (y - x) * (y - x);
        sq_exact += x * x;
      }
      ++messages;
      elements += count;
    }
  CHECK(totals.measured_calls[slot][one] == 2 * messages);
  CHECK(totals.input[slot][one].elements == 2 * elements);
  CHECK(totals.input[slot][one].sq_error > 0);
  CHECK(totals.requant[slot][one].elements == 0);
  CHECK(totals.audited_calls[slot][one] == 2 * messages);
  CHECK(totals.audit_nonfinite[slot][one] == 0);
  CHECK(totals.audit_sq_error[slot][one] == doctest::Approx(2 * sq_error).epsilon(1e-9));
  CHECK(totals.audit_sq_exact[slot][one] == doctest::Approx(2 * sq_exact).epsilon(1e-9));
  CHECK(totals.guard_trips[slot] == 0);
  CHECK(totals.guard_full_calls[slot] == 0);
}

TEST_CASE("messages between two ranks leave the communicator's audit and guard counts alike on every rank") {
  log_set_level(LogLevel::error);
  Config config = p2p_config();
  config.telemetry_sample_every = 1;
  config.audit_every = 2;  // all-reduces 0 and 2 audited: an extra NCCL all-reduce on every rank
  config.guard_enable = true;
  config.guard_decide_after = 1;
  const int n = 3;
  const Spec ar{Collective::all_reduce, Path::two_shot, DataType::bf16, ReduceOp::sum, 4096, 9};
  const std::vector<Bytes> ar_in = inputs_for(ar, n);
  std::vector<Bytes> reduced(static_cast<size_t>(n));
  const WorldRun w = run_world(
      n, config,
      [&](RankCtx& c) -> ncclResult_t {
        void* buf = c.alloc(ar_in[0].size());
        void* msg = c.alloc(5000 * 4);
        std::memset(msg, 0x3c, 5000 * 4);
        for (int k = 0; k < 4; ++k) {
          std::memcpy(buf, ar_in[static_cast<size_t>(c.rank)].data(), ar_in[0].size());
          // Rank 0 sends rank 1 one message before every other all-reduce: only those two see it.
          if (k % 2 == 0 && c.rank < 2) {
            const ncclResult_t m = c.rank == 0 ? c.eng.send(msg, 5000, ncclFloat32, 1, c.comm, c.stream)
                                               : c.eng.recv(msg, 5000, ncclFloat32, 0, c.comm, c.stream);
            if (m != ncclSuccess) return m;
          }
          if (const ncclResult_t r = c.eng.all_reduce(buf, buf, 4096, ncclBfloat16, ncclSum, c.comm, c.stream);
              r != ncclSuccess)
            return r;
        }
        return ncclSuccess;
      },
      [&](RankCtx& c) {
        const char* a = static_cast<const char*>(c.buffers[0]);
        reduced[static_cast<size_t>(c.rank)].assign(a, a + ar_in[0].size());
      });
  REQUIRE_MESSAGE(w.problems.empty(), w.problems);  // a count apart would leave an audit's NCCL call unmatched
  for (int r = 0; r < n; ++r) {
    CHECK(w.results[static_cast<size_t>(r)] == ncclSuccess);
    CHECK(reduced[static_cast<size_t>(r)] == reduced[0]);
  }
}

TEST_CASE("communicators share the process's scratch budget: each keeps the least its ranks offer; one left without "
          "scratch passes its collectives through and still carries its messages in FP8") {
  log_set_level(LogLevel::error);
  constexpr int kComms = 4;
  constexpr size_t kCount = 4096;  // bf16 elements: one stage in 256 KiB of scratch
  sim::World world(sim::Options{.nranks = 2});
  const Platform& p = world.platform();
  std::vector<std::vector<ncclComm_t>> comms;
  for (int i = 0; i < kComms; ++i) comms.push_back(world.create_comm());
  struct Seen {
    uint64_t scratch[kComms] = {};
    bool fp8_ok[kComms] = {};
    uint64_t held_after_setup = 0, held_after_destroy = 0;
    Bytes reduced[2], received;
    size_t live = 0;
  };
  Seen seen[2];
  Config configs[2];
  for (int r = 0; r < 2; ++r) {
    configs[r] = p2p_config();
    configs[r].coalesce_max_bytes = 64 << 10;
    // Rank 0 caps each communicator at 256 KiB and the process at 1 MiB: it offers 256 KiB three
    // times, then half of the 256 KiB left, a part too small to cut (ScratchBudget), so none. Rank 1
    // offers its 512 KiB cap each time.
    configs[r].scratch_max_bytes = r == 0 ? 256 << 10 : 512 << 10;
    configs[r].scratch_process_max_bytes = r == 0 ? 1 << 20 : 64 << 20;
  }
  const uint64_t seq = Accounting::instance().last_seq();
  world.run_ranks([&](int r) {
    Seen& mine = seen[r];
    {
      sched::Engine eng(configs[r], p);
      sched::EngineProbe probe(eng);
      for (int i = 0; i < kComms; ++i) {
        const ncclComm_t comm = comms[static_cast<size_t>(i)][static_cast<size_t>(r)];
        REQUIRE(eng.comm_created(comm) == ncclSuccess);
        const sched::CommInfo info = probe.comm_info(comm);
        mine.scratch[i] = info.scratch_bytes;
        mine.fp8_ok[i] = info.fp8_ok;
      }
      mine.held_after_setup = probe.scratch_held();
      cudaStream_t stream = nullptr;
      p.cuda.StreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      const size_t bytes = kCount * 2;
      Bytes ones(bytes);
      for (size_t k = 0; k < kCount; ++k) ones[2 * k] = static_cast<char>(0x80), ones[2 * k + 1] = 0x3F;  // bf16 1.0
      void* buf[2] = {};
      for (int j = 0; j < 2; ++j) {  // an all-reduce on the first communicator and on the last
        p.cuda.Malloc(&buf[j], bytes);
        std::memcpy(buf[j], ones.data(), bytes);
        const ncclComm_t comm = comms[j == 0 ? 0 : kComms - 1][static_cast<size_t>(r)];
        CHECK(eng.all_reduce(buf[j], buf[j], kCount, ncclBfloat16, ncclSum, comm, stream) == ncclSuccess);
      }
      const size_t count = 3000;
      const Bytes m = message(DataType::bf16, count, 0, 1);
      void* msg = nullptr;
      p.cuda.Malloc(&msg, m.size());
      const ncclComm_t last = comms[kComms - 1][static_cast<size_t>(r)];
      if (r == 0) {
        std::memcpy(msg, m.data(), m.size());
        CHECK(eng.send(msg, count, ncclBfloat16, 1, last, stream) == ncclSuccess);
      } else {
        CHECK(eng.recv(msg, count, ncclBfloat16, 0, last, stream) == ncclSuccess);
      }
      world.synchronize_rank();
      for (int j = 0; j < 2; ++j) mine.reduced[j].assign(static_cast<char*>(buf[j]), static_cast<char*>(buf[j]) + bytes);
      mine.received.assign(static_cast<char*>(msg), static_cast<char*>(msg) + m.size());
      for (auto& per : comms) eng.comm_destroyed(per[static_cast<size_t>(r)]);
      mine.held_after_destroy = probe.scratch_held();
      for (void* b : buf) p.cuda.Free(b);
      p.cuda.Free(msg);
      p.cuda.StreamDestroy(stream);
    }
    mine.live = world.live_bytes(r);
  });
  CHECK(world_problems(world).empty());
  CHECK(world.races().empty());
  Bytes twos(kCount * 2);
  for (size_t k = 0; k < kCount; ++k) twos[2 * k] = 0x00, twos[2 * k + 1] = 0x40;  // bf16 2.0: exact in FP8 too
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    for (int i = 0; i < kComms; ++i) {
      CHECK(seen[r].fp8_ok[i]);
      CHECK(seen[r].scratch[i] == (i < 3 ? 256u << 10 : 0u));
    }
    CHECK(seen[r].held_after_setup == 3 * (256u << 10));  // rank 1 gave back what it offered beyond
    CHECK(seen[r].held_after_destroy == 0);
    CHECK(seen[r].live == 0);
    CHECK(seen[r].reduced[0] == twos);
    CHECK(seen[r].reduced[1] == twos);
  }
  CHECK(seen[1].received == through_fp8(message(DataType::bf16, 3000, 0, 1), DataType::bf16, 3000, configs[0]));
  // Each rank's records: the all-reduce on the first communicator FP8, on the last a fallback; the
  // message FP8 at both ends.
  std::vector<CallRecord> records(8192);
  const size_t got = Accounting::instance().snapshot(records.data(), records.size(), seq);
  for (int r = 0; r < 2; ++r) {
    std::vector<Path> reduces;
    for (size_t i = 0; i < got; ++i)
      if (records[i].rank == r && records[i].kind == CallKind::all_reduce) reduces.push_back(records[i].path);
    REQUIRE(reduces.size() == 2);
    CHECK(is_fp8(reduces[0]));
    CHECK(reduces[1] == Path::fallback);
    CHECK(message_records(seq, r).fp8 == 1);
  }
}
