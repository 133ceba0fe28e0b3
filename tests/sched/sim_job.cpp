#include "tests/sched/sim_job.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>

#include "quant/reference.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/platform/nccl_types.hpp"
#include "sched/plan/stages.hpp"

namespace fp8wire::simtest {

namespace ref = quant::ref;

quant::ElemType elem_type(DataType t) {
  quant::ElemType e = quant::ElemType::f32;
  elem_type_of(t, &e);
  return e;
}

size_t in_elems(const Spec& s, int n) {
  const bool per_rank = s.collective == Collective::reduce_scatter || s.collective == Collective::all_to_all;
  return per_rank ? s.count * static_cast<size_t>(n) : s.count;
}
size_t out_elems(const Spec& s, int n) {
  const bool per_rank = s.collective == Collective::all_gather || s.collective == Collective::all_to_all;
  return per_rank ? s.count * static_cast<size_t>(n) : s.count;
}

Bytes make_input(const Spec& s, int rank, int nranks) {
  const quant::ElemType t = elem_type(s.dtype);
  const size_t n = in_elems(s, nranks);
  Bytes b(n * quant::elem_size(t));
  uint64_t state = s.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank) * 0xBF58476D1CE4E5B9ull + 1;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (size_t i = 0; i < n; ++i) {
    const size_t block = i / 64;
    // Magnitude per 64 elements from 2^-6 to 2^6; every 11th such run is zero.
    const double magnitude = std::ldexp(1.0, static_cast<int>((block * 7 + static_cast<size_t>(rank)) % 13) - 6);
    const double u = static_cast<double>(next() >> 11) / 9007199254740992.0;  // [0, 1)
    const double v = (block % 11 == 5) ? 0.0 : magnitude * (2.0 * u - 1.0);
    ref::store_elem(b.data(), t, i, static_cast<float>(v));
  }
  return b;
}

namespace {

Bytes quantize(const void* in, quant::ElemType t, size_t count, const quant::WireFormat& f, uint64_t sr) {
  Bytes w(quant::chunk_bytes(count, f));
  if (const char* e = ref::quantize(in, t, count, w.data(), quant::Segmented::single(count, f), f, sr))
    throw std::runtime_error(e);
  return w;
}

Bytes reduce_to_wire(const std::vector<const void*>& in, size_t count, float post, const quant::WireFormat& f,
                     uint64_t sr, const void* plain = nullptr, quant::ElemType plain_type = quant::ElemType::f32,
                     int plain_position = 0) {
  Bytes w(quant::chunk_bytes(count, f));
  ref::ReduceOutput o;
  o.wire = w.data();
  if (const char* e = ref::dequantize_reduce(in.data(), static_cast<int>(in.size()), plain, plain_type, plain_position,
                                             count, post, o, f, sr))
    throw std::runtime_error(e);
  return w;
}

void dequantize_into(const Bytes& wire, size_t count, void* out, quant::ElemType t, const quant::WireFormat& f) {
  if (const char* e = ref::dequantize(wire.data(), quant::Segmented::single(count, f), count, out, t, f))
    throw std::runtime_error(e);
}

float post_of(const Spec& s, int n) { return s.op == ReduceOp::avg ? 1.0f / static_cast<float>(n) : 1.0f; }

}  // namespace

Bytes expected_output(const Spec& s, const std::vector<Bytes>& inputs, int rank, const quant::WireFormat& f,
                      size_t stage_elems, float post_factor) {
  const int n = static_cast<int>(inputs.size());
  const quant::ElemType t = elem_type(s.dtype);
  const size_t es = quant::elem_size(t);
  const size_t count = s.count;
  Bytes out(out_elems(s, n) * es);
  const float post = post_factor > 0 ? post_factor : post_of(s, n);
  switch (s.collective) {
    case Collective::all_gather:
      for (int j = 0; j < n; ++j)
        dequantize_into(quantize(inputs[static_cast<size_t>(j)].data(), t, count, f, 0), count,
                        out.data() + static_cast<size_t>(j) * count * es, t, f);
      return out;
    case Collective::all_to_all: {
      // Chunk j comes from rank j: the chunk rank j sends here (its chunk `rank`), quantized as a
      // chunk of its own at its place in rank j's send buffer, decoded; this rank's own chunk exact.
      const size_t first = static_cast<size_t>(rank) * count;
      for (int j = 0; j < n; ++j) {
        const char* chunk = inputs[static_cast<size_t>(j)].data() + first * es;
        char* into = out.data() + static_cast<size_t>(j) * count * es;
        if (j == rank) std::memcpy(into, chunk, count * es);
        else dequantize_into(quantize(chunk, t, count, f, first), count, into, t, f);
      }
      return out;
    }
    case Collective::reduce_scatter: {
      std::vector<Bytes> wires;
      std::vector<const void*> ptrs;
      const size_t first = static_cast<size_t>(rank) * count;
      for (int j = 0; j < n; ++j) wires.push_back(quantize(inputs[static_cast<size_t>(j)].data() + first * es, t, count, f, first));
      for (const Bytes& w : wires) ptrs.push_back(w.data());
      ref::ReduceOutput o;
      o.plain = out.data();
      o.plain_type = t;
      if (const char* e = ref::dequantize_reduce(ptrs.data(), n, nullptr, t, 0, count, post, o, f, first))
        throw std::runtime_error(e);
      return out;
    }
    case Collective::all_reduce: break;
  }
  if (s.path == Path::one_shot || s.path == Path::two_shot) {
    std::vector<Bytes> wires;
    std::vector<const void*> ptrs;
    for (int j = 0; j < n; ++j) wires.push_back(quantize(inputs[static_cast<size_t>(j)].data(), t, count, f, 0));
    for (const Bytes& w : wires) ptrs.push_back(w.data());
    if (s.path == Path::two_shot) {
      dequantize_into(reduce_to_wire(ptrs, count, post, f, 0), count, out.data(), t, f);
    } else {
      ref::ReduceOutput o;
      o.plain = out.data();
      o.plain_type = t;
      if (const char* e = ref::dequantize_reduce(ptrs.data(), n, nullptr, t, 0, count, post, o, f, 0))
        throw std::runtime_error(e);
    }
    return out;
  }
  // Ring: per stage, chunk c starts as rank c+1's quantized values and collects, hop by hop, the
  // exact values of ranks c+2, ..., c (requantized after each), the last hop applying `post`.
  for (size_t off = 0; off < count; off += stage_elems) {
    const size_t len = std::min(stage_elems, count - off);
    const sched::ShardLayout l = sched::shard_layout(len, n, f);
    for (int c = 0; c < n; ++c) {
      const size_t clen = l.length(c);
      if (!clen) continue;
      const size_t first = off + l.begin(c);
      const int start = (c + 1) % n;
      Bytes acc = quantize(inputs[static_cast<size_t>(start)].data() + first * es, t, clen, f, first);
      for (int hop = 1; hop < n; ++hop) {
        const int q = (start + hop) % n;
        const bool last = hop == n - 1;
        acc = reduce_to_wire({acc.data()}, clen, last ? post : 1.0f, f, first,
                             inputs[static_cast<size_t>(q)].data() + first * es, t, 1);
      }
      dequantize_into(acc, clen, out.data() + first * es, t, f);
    }
  }
  return out;
}

Bytes plain_all_reduce(const Spec& s, const std::vector<Bytes>& inputs) {
  const quant::ElemType t = elem_type(s.dtype);
  Bytes out(s.count * quant::elem_size(t));
  for (size_t i = 0; i < s.count; ++i) {
    float acc = ref::load_elem(inputs[0].data(), t, i);
    for (size_t j = 1; j < inputs.size(); ++j) acc += ref::load_elem(inputs[j].data(), t, i);
    if (s.op == ReduceOp::avg) acc /= static_cast<float>(inputs.size());
    ref::store_elem(out.data(), t, i, acc);
  }
  return out;
}

std::string check_bound(const Spec& s, const std::vector<Bytes>& inputs, const Bytes& out, int rank,
                        const quant::WireFormat& f) {
  const int n = static_cast<int>(inputs.size());
  const quant::ElemType t = elem_type(s.dtype);
  // One quantization is off by at most half a step of the block's top binade: 2^-4 of the block's
  // amax for e4m3 (3 mantissa bits), 2^-3 for e5m2; a rounded (bf16, e8m0) scale and stochastic
  // rounding (a whole step) can each double it.
  double q = f.fp8 == Fp8Format::e4m3 ? 1.0 / 16 : 1.0 / 8;
  if (f.scale != ScaleType::fp32) q *= 2;
  if (f.rounding == Rounding::stochastic) q *= 2;  // a whole step, not half of one
  const double out_rounding = t == quant::ElemType::bf16 ? 1.0 / 256 : t == quant::ElemType::f16 ? 1.0 / 2048 : 1e-6;
  const double post = s.op == ReduceOp::avg ? 1.0 / n : 1.0;
  const size_t elems = out_elems(s, n);
  const uint32_t B = f.block;
  auto value = [&](int j, size_t k) { return double(ref::load_elem(inputs[static_cast<size_t>(j)].data(), t, k)); };
  if (s.collective == Collective::all_to_all) {
    // Chunk j of the output is rank j's chunk `rank`, quantized once in blocks of its own (this
    // rank's own chunk exact).
    const size_t first = static_cast<size_t>(rank) * s.count;
    for (size_t i = 0; i < elems; ++i) {
      const int j = static_cast<int>(i / s.count);
      const size_t k = i % s.count, block = k / B * B;
      double amax = 0;
      for (size_t e = block; e < std::min<size_t>(block + B, s.count); ++e) amax = std::max(amax, std::fabs(value(j, first + e)));
      const double want = value(j, first + k), got = ref::load_elem(out.data(), t, i);
      const double bound = j == rank ? 0 : q * amax + out_rounding * std::fabs(want) + 1e-30;
      if (!(std::fabs(got - want) <= bound * 1.0001))
        return fmt::format("element {} (from rank {}): {} vs {} (|err| {} > bound {})", i, j, got, want,
                           std::fabs(got - want), bound);
    }
    return "";
  }
  const size_t first = s.collective == Collective::reduce_scatter ? static_cast<size_t>(rank) * s.count : 0;
  // Per block of the call's count: each rank's amax, their sum, and the amax of the exact sum.
  const size_t nb = (s.count + B - 1) / B;
  std::vector<double> sum_amax(nb, 0.0), amax_sum(nb, 0.0), exact(s.count, 0.0);
  std::vector<std::vector<double>> amax(static_cast<size_t>(n), std::vector<double>(nb, 0.0));
  for (int j = 0; j < n; ++j)
    for (size_t k = 0; k < s.count; ++k) {
      const double v = value(j, first + k);
      amax[static_cast<size_t>(j)][k / B] = std::max(amax[static_cast<size_t>(j)][k / B], std::fabs(v));
      exact[k] += v;
    }
  for (size_t b = 0; b < nb; ++b)
    for (int j = 0; j < n; ++j) sum_amax[b] += amax[static_cast<size_t>(j)][b];
  for (size_t k = 0; k < s.count; ++k) amax_sum[k / B] = std::max(amax_sum[k / B], std::fabs(exact[k]));
  // Each input quantized once; the reduced block requantized once (two-shot) or at every hop (ring:
  // a partial sum is at most sum_amax).
  const int requant = s.collective != Collective::all_reduce || s.path == Path::one_shot ? 0
                      : s.path == Path::ring                                             ? n - 1
                                                                                         : 1;
  for (size_t i = 0; i < elems; ++i) {
    double want = 0, bound = 0;
    if (s.collective == Collective::all_gather) {
      const size_t j = i / s.count, k = i % s.count;
      want = value(static_cast<int>(j), k);
      bound = q * amax[j][k / B];
    } else {
      const size_t b = i / B;
      want = post * exact[i];
      bound = post * (q * sum_amax[b] + requant * q * (s.path == Path::ring ? sum_amax[b] : amax_sum[b]));
    }
    const double got = ref::load_elem(out.data(), t, i);
    bound += out_rounding * std::fabs(want) + 1e-30;
    if (!(std::fabs(got - want) <= bound * 1.0001))
      return fmt::format("element {}: {} vs fp64 {} (|err| {} > bound {})", i, got, want, std::fabs(got - want), bound);
  }
  return "";
}

Config sim_config(size_t scratch) {
  // (512 KiB by default: every count the tier uses fits one stage)
  Config c;
  c.scratch_max_bytes = scratch;
  c.coalesce_max_bytes = scratch / 4;
  c.collective_enable.fill(true);
  for (auto& per : c.thresholds) per = {0, 0, 0};
  c.log_level = "warn";
  return c;
}

}  // namespace fp8wire::simtest

namespace fp8wire::simtest {

ncclResult_t issue(sched::Engine& eng, const Spec& s, bool forced, const void* in, void* out, ncclComm_t comm,
                   cudaStream_t stream) {
  const ncclDataType_t t = nccl_dtype(s.dtype);
  const auto op = static_cast<ncclRedOp_t>(static_cast<int>(s.op));
  switch (s.collective) {
    case Collective::all_reduce:
      return forced ? sched::EngineProbe(eng).all_reduce_forced(s.path, in, out, s.count, t, op, comm, stream)
                    : eng.all_reduce(in, out, s.count, t, op, comm, stream);
    case Collective::reduce_scatter:
      return forced ? sched::EngineProbe(eng).reduce_scatter_forced(s.path, in, out, s.count, t, op, comm, stream)
                    : eng.reduce_scatter(in, out, s.count, t, op, comm, stream);
    case Collective::all_gather:
      return forced ? sched::EngineProbe(eng).all_gather_forced(s.path, in, out, s.count, t, comm, stream)
                    : eng.all_gather(in, out, s.count, t, comm, stream);
    case Collective::all_to_all:
      return forced ? sched::EngineProbe(eng).all_to_all_forced(s.path, in, out, s.count, t, comm, stream)
                    : eng.all_to_all(in, out, s.count, t, comm, stream);
  }
  return ncclInvalidArgument;
}

namespace {

SiteCounts counts(const sim::World& w, int rank) {
  SiteCounts c{};
  for (int i = 0; i < sim::kSiteCount; ++i) c[static_cast<size_t>(i)] = w.calls_at(rank, static_cast<sim::Site>(i));
  return c;
}

}  // namespace

Outcome run(const Run& cfg, const Spec& spec, const std::vector<Bytes>& inputs) {
  sim::Options machine = cfg.machine;
  machine.nranks = static_cast<int>(inputs.size());
  if (cfg.config.direct_transport != DirectMode::off) machine.window_ctas = cfg.config.direct_ctas;
  sim::World world(machine);
  world.set_fault(cfg.fault);
  const Platform& p = world.platform();
  const std::vector<ncclComm_t> comms = world.create_comm();
  const int n = machine.nranks;
  const int calls = std::max(cfg.group, 1);
  Outcome o;
  o.first.resize(static_cast<size_t>(n));
  o.second.resize(static_cast<size_t>(n));
  o.after_setup.resize(static_cast<size_t>(n));
  o.after_calls.resize(static_cast<size_t>(n));
  std::atomic<bool> aborted{false};
  auto watchdog = [&](ncclComm_t c) {
    if (!aborted.exchange(true)) world.abort_comm(c);
  };
  o.transports.assign(static_cast<size_t>(n), Carrier::nccl);
  // Every rank has made its calls (cfg.abort_all): then each knows whether one failed.
  std::mutex called_mu;
  std::condition_variable called_cv;
  int called = 0;
  world.run_ranks([&](int r) {
    const size_t es = dtype_size(spec.dtype);
    const size_t in_call = in_elems(spec, n) * es, out_call = out_elems(spec, n) * es;
    const size_t in_bytes = in_call * static_cast<size_t>(calls), out_bytes = out_call * static_cast<size_t>(calls);
    ncclComm_t comm = comms[static_cast<size_t>(r)];
    {
      sched::Engine eng(cfg.config, p);
      eng.comm_created(comm);
      cudaStream_t stream = nullptr;
      p.cuda.StreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      void *in = nullptr, *out1 = nullptr, *out2 = nullptr;
      p.cuda.Malloc(&in, in_bytes);
      // In place, the output buffer is the larger of the two (reduce-scatter: the input; all-gather:
      // the output) and this rank's output (reduce-scatter) or input (all-gather) lies at `mine`.
      const size_t buf_bytes = cfg.in_place ? std::max(in_bytes, out_bytes) : out_bytes;
      const size_t mine = !cfg.in_place                                     ? 0
                          : spec.collective == Collective::reduce_scatter ? static_cast<size_t>(r) * out_call
                          : spec.collective == Collective::all_gather     ? static_cast<size_t>(r) * in_call
                                                                          : 0;
      p.cuda.Malloc(&out1, buf_bytes);
      p.cuda.Malloc(&out2, buf_bytes);
      std::memcpy(in, inputs[static_cast<size_t>(r)].data(), in_bytes);
      if (cfg.in_place) {
        if (spec.collective != Collective::all_reduce && calls > 1)
          throw std::runtime_error("in place: grouped calls are all-reduces only");
        const size_t at = spec.collective == Collective::all_gather ? mine : 0;
        std::memcpy(static_cast<char*>(out1) + at, in, in_bytes);
        std::memcpy(static_cast<char*>(out2) + at, in, in_bytes);
      }
      o.after_setup[static_cast<size_t>(r)] = counts(world, r);  // the calls' own fault points follow
      // One round of the application's calls: first error wins.
      auto round = [&](void* out) {
        ncclResult_t first = ncclSuccess;
        auto note = [&first](ncclResult_t res) {
          if (first == ncclSuccess) first = res;
        };
        if (cfg.group) note(eng.group_start());
        for (int i = 0; i < calls; ++i) {
          if (cfg.feedback_key) sched::Engine::set_feedback_key(cfg.feedback_key + static_cast<uint64_t>(i));
          char* base = static_cast<char*>(out);
          char* dst = base + static_cast<size_t>(i) * out_call;
          const char* src = static_cast<char*>(in) + static_cast<size_t>(i) * in_call;
          if (cfg.in_place && (spec.collective == Collective::all_reduce || spec.collective == Collective::all_to_all))
            src = dst;
          if (cfg.in_place && spec.collective == Collective::reduce_scatter) src = base, dst = base + mine;
          if (cfg.in_place && spec.collective == Collective::all_gather) src = base + mine;
          note(issue(eng, spec, cfg.forced, src, dst, comm, stream));
        }
        if (cfg.group) note(eng.group_end());
        if (first != ncclSuccess) watchdog(comm);
        // The application goes on with its stream: reads the result, rewrites the input.
        world.app_access(stream, out, buf_bytes, false);
        world.app_access(stream, in, in_bytes, true);
        return first;
      };
      RankResult& a = o.first[static_cast<size_t>(r)];
      RankResult& b = o.second[static_cast<size_t>(r)];
      const uint64_t seq_before = Accounting::instance().last_seq();
      a.result = round(out1);
      o.after_calls[static_cast<size_t>(r)] = counts(world, r);
      {
        std::vector<CallRecord> records(256);
        const size_t got = Accounting::instance().snapshot(records.data(), records.size(), seq_before);
        for (size_t i = 0; i < got; ++i)
          if (records[i].rank == r && records[i].nranks == n) o.transports[static_cast<size_t>(r)] = records[i].transport;
      }
      if (cfg.second_call) b.result = round(out2);
      if (cfg.abort_all) {
        std::unique_lock lock(called_mu);
        ++called;
        called_cv.notify_all();
        called_cv.wait(lock, [&] { return called == n; });
      }
      if (cfg.abort_all && aborted.load()) eng.comm_abort(comm);
      world.synchronize_rank();
      p.nccl->CommGetAsyncError(comm, &a.async);
      b.async = a.async;
      const size_t out_at = spec.collective == Collective::reduce_scatter ? mine : 0;
      a.out.assign(static_cast<char*>(out1) + out_at, static_cast<char*>(out1) + out_at + out_bytes);
      b.out.assign(static_cast<char*>(out2) + out_at, static_cast<char*>(out2) + out_at + out_bytes);
      a.info = b.info = sched::EngineProbe(eng).comm_info(comm);
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
  o.live_windows = world.live_windows();
  return o;
}

std::vector<Bytes> inputs_for(const Spec& s, int n, int calls) {
  Spec all = s;
  all.count = s.count * static_cast<size_t>(calls);
  if ((s.collective == Collective::reduce_scatter || s.collective == Collective::all_to_all) && calls > 1)
    throw std::runtime_error("grouped reduce-scatter and all-to-all inputs are not one buffer");
  std::vector<Bytes> v;
  for (int r = 0; r < n; ++r) v.push_back(make_input(all, r, n));
  return v;
}

size_t stage_for(const Config& c, const Spec& s, int n) {
  const quant::WireFormat f = quant::WireFormat::from(c);
  const Fabric fabric = c.fabric_override.value_or(Fabric::net);
  return sched::stage_elems(c, sched::scratch_layout(c), s.collective, s.path, s.count, dtype_size(s.dtype), n, f, fabric);
}

std::string describe(const Spec& s, int n, const Config& c) {
  return fmt::format("{} {} {} {} n={} count={} scratch={} gather={} direct={}/{}/sets{}/{} fmt={}/{}/{}/b{}",
                     to_string(s.collective), to_string(s.path), static_cast<int>(s.dtype),
                     s.op == ReduceOp::avg ? "avg" : "sum", n, s.count, c.scratch_max_bytes,
                     to_string(c.gather_transport), to_string(c.direct_transport), c.direct_window_bytes,
                     c.direct_sets, to_string(c.direct_protocol), to_string(c.format), to_string(c.scale_type),
                     to_string(c.rounding), c.block_size);
}

std::string check_clean(const Run& cfg, const Spec& spec, const std::vector<Bytes>& inputs, const Outcome& o) {
  const int n = static_cast<int>(inputs.size());
  const std::string what = describe(spec, n, cfg.config);
  if (!o.races.empty()) return what + ": race: " + o.races.front();
  if (!o.protocol.empty()) return what + ": " + o.protocol.front();
  if (o.deadlocked) return what + ": deadlock";
  if (!o.leaks.empty()) return what + ": " + o.leaks.front();
  if (o.live_windows) return fmt::format("{}: {} direct-transport window(s) left", what, o.live_windows);
  const quant::WireFormat f = quant::WireFormat::from(cfg.config);
  // Grouped calls are checked as the one buffer they were packed into (cut-independent paths only).
  Spec whole = spec;
  whole.count = spec.count * static_cast<size_t>(std::max(cfg.group, 1));
  const size_t stage = stage_for(cfg.config, whole, n);
  for (int r = 0; r < n; ++r) {
    const RankResult& a = o.first[static_cast<size_t>(r)];
    if (a.result != ncclSuccess || a.async != ncclSuccess)
      return fmt::format("{}: rank {} returned {} (async {})", what, r, static_cast<int>(a.result), static_cast<int>(a.async));
    if (!a.info.fp8_ok) return fmt::format("{}: rank {}: FP8 off: {}", what, r, a.info.reason);
    const Bytes expected = expected_output(whole, inputs, r, f, stage);
    if (a.out != expected) {
      size_t i = 0;
      const size_t es = dtype_size(spec.dtype);
      while (i + es <= a.out.size() && std::memcmp(a.out.data() + i, expected.data() + i, es) == 0) i += es;
      return fmt::format("{}: rank {} differs from the reference algorithm at element {}", what, r, i / es);
    }
    // Every rank holds the same result but for the reduce-scatter and the all-to-all (each its own chunks).
    const bool alike = spec.collective != Collective::reduce_scatter && spec.collective != Collective::all_to_all;
    if (alike && a.out != o.first[0].out)
      return fmt::format("{}: rank {} differs from rank 0", what, r);
    if (std::string e = check_bound(whole, inputs, a.out, r, f); !e.empty())
      return fmt::format("{}: rank {}: {}", what, r, e);
  }
  return "";
}

std::string first_failures(const std::vector<std::string>& failures) {
  std::string text = std::to_string(failures.size()) + " failure(s)";
  for (size_t i = 0; i < failures.size() && i < 8; ++i) text += "\n  " + failures[i];
  return text;
}

std::string world_problems(const sim::World& world) {
  std::string out;
  if (world.deadlocked()) out += "deadlocked; ";
  for (const std::string& e : world.protocol_errors()) out += e + "; ";
  if (const size_t w = world.live_windows()) out += fmt::format("{} window(s) left; ", w);
  return out;
}

}  // namespace fp8wire::simtest
