#include "quant/wire_format.hpp"

namespace fp8wire::quant {

const char* to_string(ElemType t) {
  switch (t) {
    case ElemType::f32: return "f32";
    case ElemType::f16: return "f16";
    case ElemType::bf16: return "bf16";
  }
  return "unknown-elem-type";
}

const char* validate(const WireFormat& f) {
  if (f.fp8 != Fp8Format::e4m3 && f.fp8 != Fp8Format::e5m2) return "format: expected e4m3 or e5m2";
  if (f.scale != ScaleType::fp32 && f.scale != ScaleType::bf16 && f.scale != ScaleType::e8m0)
    return "scale_type: expected fp32, bf16 or e8m0";
  if (f.block < 32 || f.block > 4096 || (f.block & (f.block - 1)) != 0)
    return "block_size: expected a power of two in [32, 4096]";
  if (f.rounding != Rounding::nearest && f.rounding != Rounding::stochastic)
    return "rounding: expected nearest or stochastic";
  return nullptr;
}

}  // namespace fp8wire::quant

namespace fp8wire::quant {

const char* validate(size_t count, const Segmented& l, const WireFormat& f) {
  if (const char* e = validate(f)) return e;
  if (l.seg_elems == 0) return "layout: seg_elems must be > 0";
  if (segment_count(count, l) <= 1) return nullptr;
  if (l.seg_elems % f.block != 0) return "layout: seg_elems must be a multiple of the block size";
  if (l.seg_stride % kWireAlign != 0) return "layout: seg_stride must be a multiple of 16 bytes";
  if (l.seg_stride < chunk_bytes(l.seg_elems, f)) return "layout: seg_stride is smaller than chunk_bytes(seg_elems)";
  return nullptr;
}

}  // namespace fp8wire::quant
