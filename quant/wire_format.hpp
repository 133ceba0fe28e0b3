// The FP8 wire format (docs/DESIGN.md "Wire format"): host-side description and byte arithmetic, shared by
// the CPU reference codec, the GPU kernels, the scheduler and the benchmark. Plain C++, no CUDA.
//
// One *chunk* encodes `count` consecutive elements as one contiguous buffer, so one chunk is one send:
//   [ payload: count FP8 bytes, padded up to a multiple of 16 ][ scales: nblocks scales, padded to 16 ]
// where nblocks = ceil(count / block). Block b covers elements [b*block, min((b+1)*block, count)).
// scale = amax(block) / FP8_MAX (448 e4m3, 57344 e5m2), stored as fp32 / bf16 / e8m0 (power of two);
// an all-zero block has scale 0 and decodes to zeros; a block holding NaN or Inf decodes to NaN.
//
// A *segmented* buffer holds several chunks at a fixed stride: elements [i*seg_elems, (i+1)*seg_elems)
// form chunk i at byte offset i*seg_stride (the last segment may be short or empty). The all-to-all
// all-reduce uses one segment per rank.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/config.hpp"

namespace fp8wire::quant {

// Element types of caller buffers.
enum class ElemType : uint8_t { f32, f16, bf16 };
const char* to_string(ElemType);
inline constexpr size_t elem_size(ElemType t) { return t == ElemType::f32 ? 4 : 2; }

// Largest number of inputs one fused reduce takes (a world size; larger communicators pass through).
inline constexpr int kMaxReduceInputs = 128;

inline constexpr size_t kWireAlign = 16;
inline constexpr size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

struct WireFormat {
  Fp8Format fp8 = Fp8Format::e4m3;
  ScaleType scale = ScaleType::fp32;
  uint32_t block = 128;                 // power of two in [32, 4096]
  Rounding rounding = Rounding::nearest;
  uint64_t seed = 0;                    // stochastic rounding: bits = hash(seed, stream_offset + index)

  static WireFormat from(const Config& c) {
    return WireFormat{c.format, c.scale_type, c.block_size, c.rounding, c.seed};
  }
};

inline constexpr size_t scale_bytes(ScaleType s) { return s == ScaleType::fp32 ? 4 : s == ScaleType::bf16 ? 2 : 1; }
inline constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::e4m3 ? 448.0f : 57344.0f; }
inline constexpr size_t num_blocks(size_t count, uint32_t block) { return (count + block - 1) / block; }
inline constexpr size_t payload_bytes(size_t count) { return align_up(count, kWireAlign); }
inline constexpr size_t scales_bytes(size_t count, const WireFormat& f) {
  return align_up(num_blocks(count, f.block) * scale_bytes(f.scale), kWireAlign);
}
// Bytes of one chunk of `count` elements (what one send moves).
inline constexpr size_t chunk_bytes(size_t count, const WireFormat& f) {
  return payload_bytes(count) + scales_bytes(count, f);
}
// Unpadded information content, for "bytes on the wire vs bf16" reports: count + nblocks*scale.
inline constexpr size_t information_bytes(size_t count, const WireFormat& f) {
  return count + num_blocks(count, f.block) * scale_bytes(f.scale);
}

// Layout of a segmented buffer. seg_elems must be a multiple of the block size (so blocks never
// straddle segments); seg_stride >= chunk_bytes(seg_elems) and a multiple of kWireAlign.
struct Segmented {
  size_t seg_elems;
  size_t seg_stride;
  static Segmented single(size_t count, const WireFormat& f) { return {count ? count : 1, chunk_bytes(count, f)}; }
};
inline constexpr size_t segment_count(size_t count, const Segmented& s) {
  return (count + s.seg_elems - 1) / s.seg_elems;
}

// Validates a format: returns nullptr when usable, else a message naming what is wrong.
const char* validate(const WireFormat& f);
// Validates a segmented layout for `count` elements (seg_elems > 0; with more than one segment,
// seg_elems a multiple of the block and seg_stride >= chunk_bytes(seg_elems), a multiple of 16).
const char* validate(size_t count, const Segmented& layout, const WireFormat& f);

// Where segment `s` of a segmented buffer starts, and how many elements it holds.
inline constexpr size_t segment_elems(size_t count, const Segmented& l, size_t s) {
  const size_t begin = s * l.seg_elems;
  return begin >= count ? 0 : (count - begin < l.seg_elems ? count - begin : l.seg_elems);
}

}  // namespace fp8wire::quant
