// Compiled with -ffp-contract=off (quant/CMakeLists.txt): every fp32 operation rounds once, exactly
// as the device side's __fmul_rn/__fadd_rn/__fdiv_rn do.
#include "quant/reference.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "quant/fp8_math.hpp"

namespace fp8wire::quant::ref {
namespace {

using math::BlockScale;

float amax_input(const float* x, size_t n, uint32_t* amax_bits) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t a = math::f32_bits(x[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  *amax_bits = m;
  return math::bits_f32(m);
}

template <Fp8Format F>
BlockScale scale_for(uint32_t amax_bits, ScaleType st) { return math::make_scale<F>(amax_bits, st); }

template <Fp8Format F>
uint8_t encode(float x, const BlockScale& bs, const WireFormat& fmt, uint64_t index) {
  if (bs.kind != 0) return 0;
  const float v = math::mul_rn(x, bs.encode);
  if (fmt.rounding == Rounding::stochastic) return math::f32_to_fp8_sr<F>(v, math::sr_bits(fmt.seed, index));
  return math::f32_to_fp8_rne_sw<F>(v);
}

template <Fp8Format F>
float decode(uint8_t q, float s) { return math::mul_rn(math::fp8_to_f32_sw<F>(q), s); }

void store_scale(uint8_t* scales, ScaleType st, size_t b, uint32_t stored) {
  const size_t sz = scale_bytes(st);
  if (sz == 4) std::memcpy(scales + 4 * b, &stored, 4);
  else if (sz == 2) { const uint16_t v = uint16_t(stored); std::memcpy(scales + 2 * b, &v, 2); }
  else scales[b] = uint8_t(stored);
}
uint32_t load_scale(const uint8_t* scales, ScaleType st, size_t b) {
  const size_t sz = scale_bytes(st);
  if (sz == 4) { uint32_t v; std::memcpy(&v, scales + 4 * b, 4); return v; }
  if (sz == 2) { uint16_t v; std::memcpy(&v, scales + 2 * b, 2); return v; }
  return scales[b];
}

// One element's part of the telemetry (quant/telemetry.hpp), exactly as defined, in fp64.
template <Fp8Format F>
void measure_elem(float x, const BlockScale& bs, float y, ErrorStats* st) {
  ++st->elements;
  const uint32_t xb = math::f32_bits(x) & 0x7FFFFFFFu;
  if (bs.kind == 2) {
    if (xb >= 0x7F800000u) ++st->nonfinite;
    return;
  }
  const double e = double(x) - double(y);
  st->sq_error += e * e;
  st->sq_input += double(x) * double(x);
  if (xb != 0 && y == 0.0f) ++st->flushed;
  if (bs.kind == 0 && std::fabs(math::mul_rn(x, bs.encode)) > kSaturationLimit<F>) ++st->saturated;
}

// Encodes one chunk of n fp32 values (x) into `chunk`; optionally returns the decoded values and
// adds the telemetry figures to `stats`. `first_index` is the stochastic-rounding index of x[0].
template <Fp8Format F>
void encode_chunk(const float* x, size_t n, uint8_t* chunk, const WireFormat& fmt, uint64_t first_index,
                  float* decoded, uint8_t* nonfinite, ErrorStats* stats = nullptr) {
  uint8_t* payload = chunk;
  uint8_t* scales = chunk + payload_bytes(n);
  const size_t nb = num_blocks(n, fmt.block);
  for (size_t b = 0; b < nb; ++b) {
    const size_t lo = b * fmt.block;
    const size_t hi = lo + fmt.block < n ? lo + fmt.block : n;
    uint32_t amax_bits;
    amax_input(x + lo, hi - lo, &amax_bits);
    const BlockScale bs = scale_for<F>(amax_bits, fmt.scale);
    store_scale(scales, fmt.scale, b, bs.stored);
    for (size_t i = lo; i < hi; ++i) {
      payload[i] = encode<F>(x[i], bs, fmt, first_index + i);
      if (decoded) decoded[i] = decode<F>(payload[i], bs.decode);
      if (nonfinite) nonfinite[i] = bs.kind == 2;
      if (stats) measure_elem<F>(x[i], bs, decode<F>(payload[i], bs.decode), stats);
    }
  }
  // Padding is part of the format: zero bytes, so a chunk's bytes are fully determined.
  std::memset(payload + n, 0, payload_bytes(n) - n);
  const size_t used = nb * scale_bytes(fmt.scale);
  std::memset(scales + used, 0, scales_bytes(n, fmt) - used);
}

template <Fp8Format F>
void decode_chunk(const uint8_t* chunk, size_t n, float* out, const WireFormat& fmt) {
  const uint8_t* payload = chunk;
  const uint8_t* scales = chunk + payload_bytes(n);
  for (size_t i = 0; i < n; ++i) {
    const float s = math::decode_scale(load_scale(scales, fmt.scale, i / fmt.block), fmt.scale);
    out[i] = decode<F>(payload[i], s);
  }
}

// The guard flag: the sign bit of a chunk's first scale (quant/telemetry.hpp).
void set_guard_flag(uint8_t* chunk, size_t n, const WireFormat& fmt) {
  if (n == 0) return;
  uint8_t* scales = chunk + payload_bytes(n);
  store_scale(scales, fmt.scale, 0, load_scale(scales, fmt.scale, 0) | guard_flag_mask(fmt.scale));
}

bool guard_flag_of(const uint8_t* chunk, size_t n, const WireFormat& fmt) {
  return n > 0 && (load_scale(chunk + payload_bytes(n), fmt.scale, 0) & guard_flag_mask(fmt.scale)) != 0;
}

bool guard_on(const TelemetryOptions* t, const WireFormat& fmt) {
  return t && t->record && t->guard && guard_flag_supported(fmt.scale);
}

// After a quantize or requantize: this rank's vote from the figures so far (plus the flags relayed),
// written as the flag of each non-empty chunk it wrote.
void cast_vote(const TelemetryOptions* t, const ErrorStats& stats, uint32_t relayed, uint8_t* wire, size_t count,
               const Segmented& layout, const WireFormat& fmt) {
  if (!guard_on(t, fmt)) return;
  const uint32_t vote = guard_vote(stats, t->bounds);
  t->record->vote |= vote;
  if (!vote && !relayed) return;
  for (size_t s = 0; s < segment_count(count, layout); ++s)
    set_guard_flag(wire + s * layout.seg_stride, segment_elems(count, layout, s), fmt);
}

template <class Fn>
void for_each_fp8(Fp8Format f, Fn&& fn) {
  if (f == Fp8Format::e4m3) fn(std::integral_constant<Fp8Format, Fp8Format::e4m3>{});
  else fn(std::integral_constant<Fp8Format, Fp8Format::e5m2>{});
}

std::vector<float> load_all(const void* in, ElemType t, size_t count) {
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = load_elem(in, t, i);
  return x;
}

const char* check_common(size_t count, const Segmented& layout, const WireFormat& fmt) {
  return validate(count, layout, fmt);
}

// Quantizes x (count elements) into the segmented `wire`, element i with stochastic-rounding index
// sr_offset + i; where `decoded` is given, also each value as the wire decodes it and whether it was
// not finite. With a telemetry record: the input's figures, then this rank's vote.
void encode_all(const std::vector<float>& x, size_t count, void* wire, const Segmented& layout, const WireFormat& fmt,
                uint64_t sr_offset, const TelemetryOptions* telemetry, float* decoded = nullptr,
                uint8_t* nonfinite = nullptr) {
  ErrorStats* stats = telemetry && telemetry->record ? &telemetry->record->input : nullptr;
  for_each_fp8(fmt.fp8, [&](auto f) {
    for (size_t s = 0; s < segment_count(count, layout); ++s) {
      const size_t n = segment_elems(count, layout, s);
      const size_t begin = s * layout.seg_elems;
      encode_chunk<decltype(f)::value>(x.data() + begin, n, static_cast<uint8_t*>(wire) + s * layout.seg_stride,
                                       fmt, sr_offset + begin, decoded ? decoded + begin : nullptr,
                                       nonfinite ? nonfinite + begin : nullptr, stats);
    }
  });
  if (stats) cast_vote(telemetry, *stats, 0, static_cast<uint8_t*>(wire), count, layout, fmt);
}

}  // namespace

float load_elem(const void* p, ElemType t, size_t i) {
  switch (t) {
    case ElemType::f32: { float v; std::memcpy(&v, static_cast<const char*>(p) + 4 * i, 4); return v; }
    case ElemType::bf16: { uint16_t v; std::memcpy(&v, static_cast<const char*>(p) + 2 * i, 2); return math::bf16_to_f32(v); }
    case ElemType::f16: { uint16_t v; std::memcpy(&v, static_cast<const char*>(p) + 2 * i, 2); return math::f16_to_f32(v); }
  }
  return 0.0f;
}

void store_elem(void* p, ElemType t, size_t i, float v) {
  char* c = static_cast<char*>(p);
  switch (t) {
    case ElemType::f32: {
      const uint32_t u = math::is_nan_bits(math::f32_bits(v)) ? math::kCanonicalNanF32 : math::f32_bits(v);
      std::memcpy(c + 4 * i, &u, 4);
      return;
    }
    case ElemType::bf16: { const uint16_t u = math::f32_to_bf16(v); std::memcpy(c + 2 * i, &u, 2); return; }
    case ElemType::f16: { const uint16_t u = math::f32_to_f16(v); std::memcpy(c + 2 * i, &u, 2); return; }
  }
}

const char* quantize(const void* in, ElemType in_type, size_t count, void* wire, Segmented layout,
                     const WireFormat& fmt, uint64_t sr_offset, const TelemetryOptions* telemetry) {
  if (const char* e = check_common(count, layout, fmt)) return e;
  if (count == 0) return nullptr;
  if (!in || !wire) return "quantize: null buffer";
  encode_all(load_all(in, in_type, count), count, wire, layout, fmt, sr_offset, telemetry);
  return nullptr;
}

ErrorStats measure(const float* x, size_t n, const WireFormat& fmt) {
  ErrorStats st;
  if (n == 0 || validate(fmt)) return st;
  std::vector<uint8_t> chunk(chunk_bytes(n, fmt));
  for_each_fp8(fmt.fp8, [&](auto f) { encode_chunk<decltype(f)::value>(x, n, chunk.data(), fmt, 0, nullptr, nullptr, &st); });
  return st;
}

bool guard_flag(const void* chunk, size_t n, const WireFormat& fmt) {
  return guard_flag_supported(fmt.scale) && guard_flag_of(static_cast<const uint8_t*>(chunk), n, fmt);
}

const char* dequantize(const void* wire, Segmented layout, size_t count, void* out, ElemType out_type,
                       const WireFormat& fmt, const TelemetryOptions* telemetry) {
  if (const char* e = check_common(count, layout, fmt)) return e;
  if (count == 0) return nullptr;
  if (!out || !wire) return "dequantize: null buffer";
  if (guard_on(telemetry, fmt))
    for (size_t s = 0; s < segment_count(count, layout); ++s)
      if (guard_flag_of(static_cast<const uint8_t*>(wire) + s * layout.seg_stride, segment_elems(count, layout, s), fmt))
        telemetry->record->decision |= 1u;
  std::vector<float> y(count);
  for_each_fp8(fmt.fp8, [&](auto f) {
    for (size_t s = 0; s < segment_count(count, layout); ++s) {
      const size_t n = segment_elems(count, layout, s);
      decode_chunk<decltype(f)::value>(static_cast<const uint8_t*>(wire) + s * layout.seg_stride, n,
                                       y.data() + s * layout.seg_elems, fmt);
    }
  });
  for (size_t i = 0; i < count; ++i) store_elem(out, out_type, i, y[i]);
  return nullptr;
}

const char* dequantize_reduce(const void* const* inputs, int k, const void* plain, ElemType plain_type,
                              int plain_position, size_t count, float post_scale, ReduceOutput out,
                              const WireFormat& fmt, uint64_t sr_offset, const TelemetryOptions* telemetry) {
  if (const char* e = validate(fmt)) return e;
  if (k < 0 || k > 4096) return "dequantize_reduce: k out of range";
  if (k == 0 && !plain) return "dequantize_reduce: no inputs (k == 0 and no plain addend)";
  if (plain && (plain_position < 0 || plain_position > k)) return "dequantize_reduce: plain_position must be in [0, k]";
  if ((out.plain == nullptr) == (out.wire == nullptr)) return "dequantize_reduce: give exactly one of out.plain and out.wire";
  if (count == 0) return nullptr;
  uint32_t flags = 0;
  if (guard_on(telemetry, fmt))
    for (int j = 0; j < k; ++j) flags |= guard_flag_of(static_cast<const uint8_t*>(inputs[j]), count, fmt) ? 1u : 0u;
  std::vector<float> acc(count), term(count);
  bool first = true;
  auto add = [&](const std::vector<float>& t) {
    if (first) { acc = t; first = false; return; }
    for (size_t i = 0; i < count; ++i) acc[i] = math::add_rn(acc[i], t[i]);
  };
  for (int j = 0; j <= k; ++j) {
    if (plain && j == plain_position) add(load_all(plain, plain_type, count));
    if (j == k) break;
    for_each_fp8(fmt.fp8, [&](auto f) {
      decode_chunk<decltype(f)::value>(static_cast<const uint8_t*>(inputs[j]), count, term.data(), fmt);
    });
    add(term);
  }
  if (post_scale != 1.0f)
    for (size_t i = 0; i < count; ++i) acc[i] = math::mul_rn(acc[i], post_scale);
  if (out.plain) {
    for (size_t i = 0; i < count; ++i) store_elem(out.plain, out.plain_type, i, acc[i]);
    if (flags) telemetry->record->decision |= flags;
    return nullptr;
  }
  ErrorStats* stats = telemetry && telemetry->record ? &telemetry->record->requant : nullptr;
  for_each_fp8(fmt.fp8, [&](auto f) {
    encode_chunk<decltype(f)::value>(acc.data(), count, static_cast<uint8_t*>(out.wire), fmt, sr_offset,
                                     nullptr, nullptr, stats);
  });
  if (stats) {
    if (flags) telemetry->record->relay |= flags;
    cast_vote(telemetry, *stats, flags, static_cast<uint8_t*>(out.wire), count, Segmented::single(count, fmt), fmt);
  }
  return nullptr;
}

const char* quantize_with_residual(const void* in, ElemType in_type, size_t count, float* residual,
                                   void* wire, Segmented layout, const WireFormat& fmt, uint64_t sr_offset,
                                   const TelemetryOptions* telemetry) {
  if (const char* e = check_common(count, layout, fmt)) return e;
  if (count == 0) return nullptr;
  if (!in || !wire || !residual) return "quantize_with_residual: null buffer";
  std::vector<float> x = load_all(in, in_type, count);
  for (size_t i = 0; i < count; ++i) x[i] = math::add_rn(x[i], residual[i]);
  std::vector<float> y(count);
  std::vector<uint8_t> nonfinite(count);
  encode_all(x, count, wire, layout, fmt, sr_offset, telemetry, y.data(), nonfinite.data());
  for (size_t i = 0; i < count; ++i) residual[i] = nonfinite[i] ? 0.0f : math::sub_rn(x[i], y[i]);
  return nullptr;
}

}  // namespace fp8wire::quant::ref
