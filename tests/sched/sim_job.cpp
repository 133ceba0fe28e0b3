#include "tests/sched/sim_job.hpp"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "quant/reference.hpp"
#include "sched/stages.hpp"

namespace fp8wire::simtest {

namespace ref = quant::ref;

quant::ElemType elem_type(DataType t) {
  quant::ElemType e = quant::ElemType::f32;
  elem_type_of(t, &e);
  return e;
}

size_t in_elems(const Spec& s, int n) {
  return s.collective == Collective::reduce_scatter ? s.count * static_cast<size_t>(n) : s.count;
}
size_t out_elems(const Spec& s, int n) {
  return s.collective == Collective::all_gather ? s.count * static_cast<size_t>(n) : s.count;
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
                      size_t stage_elems) {
  const int n = static_cast<int>(inputs.size());
  const quant::ElemType t = elem_type(s.dtype);
  const size_t es = quant::elem_size(t);
  const size_t count = s.count;
  Bytes out(out_elems(s, n) * es);
  const float post = post_of(s, n);
  switch (s.collective) {
    case Collective::all_gather:
      for (int j = 0; j < n; ++j)
        dequantize_into(quantize(inputs[static_cast<size_t>(j)].data(), t, count, f, 0), count,
                        out.data() + static_cast<size_t>(j) * count * es, t, f);
      return out;
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
  const size_t first = s.collective == Collective::reduce_scatter ? static_cast<size_t>(rank) * s.count : 0;
  auto value = [&](int j, size_t k) { return double(ref::load_elem(inputs[static_cast<size_t>(j)].data(), t, k)); };
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
  c.collective_enable = {true, true, true};
  for (auto& per : c.thresholds) per = {0, 0, 0};
  c.log_level = "warn";
  return c;
}

}  // namespace fp8wire::simtest
