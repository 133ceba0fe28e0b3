// Public host launchers of the codec (quant.hpp): argument checks with a clear message, conversion
// path resolution, grid sizing, then one raw launch (kernel_params.hpp). Nothing here allocates or
// synchronises; device attributes are read once per device and cached, so the launchers are safe to
// call while a stream is captured into a CUDA graph.
#include <algorithm>
#include <array>
#include <atomic>
#include <string>

#include "common/log.hpp"
#include "common/status.hpp"
#include "quant/kernel_params.hpp"
#include "quant/quant.hpp"

namespace fp8wire::quant {
namespace detail {

void report_unsupported(const char* what, int value) {
  FP8WIRE_ERROR("fp8wire quant: unsupported {} (value {}); no kernel instance for it", what, value);
}

namespace {

constexpr int kMaxDevices = 64;
// 0 = not read yet. Racing first readers store the same value.
std::array<std::atomic<int>, kMaxDevices> g_sm_count{};
std::array<std::atomic<int>, kMaxDevices> g_compute_capability{};

int cached_attribute(std::array<std::atomic<int>, kMaxDevices>& cache, int device, cudaDeviceAttr attr,
                     cudaDeviceAttr minor_attr, bool with_minor) {
  if (device < 0 || device >= kMaxDevices) return 0;
  int v = cache[device].load(std::memory_order_relaxed);
  if (v != 0) return v;
  int a = 0, b = 0;
  if (cudaDeviceGetAttribute(&a, attr, device) != cudaSuccess) return 0;
  if (with_minor && cudaDeviceGetAttribute(&b, minor_attr, device) != cudaSuccess) return 0;
  v = with_minor ? a * 10 + b : a;
  cache[device].store(v, std::memory_order_relaxed);
  return v;
}

bool is_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Largest of 16, 8, 4, 2, 1 that divides the address: caller buffers (PyTorch views, bucket offsets)
// are only guaranteed to be aligned to their element size.
uint32_t address_alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (uint32_t w : {16u, 8u, 4u, 2u})
    if ((a & (w - 1)) == 0) return w;
  return 1;
}

// A caller buffer must be aligned to its element size (a misaligned fp32/fp16 access faults on the GPU).
const char* check_elem_pointer(const void* p, ElemType t) {
  if (address_alignment(p) < elem_size(t))
    return t == ElemType::f32 ? "buffer address is not a multiple of 4 (the fp32 element size)"
                              : "buffer address is not a multiple of 2 (the element size)";
  return nullptr;
}

int sm_count() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) device = 0;
  return cached_attribute(g_sm_count, device, cudaDevAttrMultiProcessorCount, cudaDevAttrMultiProcessorCount, false);
}

uint32_t ilog2(uint32_t v) {
  uint32_t r = 0;
  while ((1u << r) < v) ++r;
  return r;
}

cudaError_t reject(const char* launcher, std::string_view what) {
  FP8WIRE_ERROR("fp8wire quant: {}: {}", launcher, what);
  return cudaErrorInvalidValue;
}

// native = use the sm_89+ conversion instructions. Asking for them on an older GPU is an error.
cudaError_t resolve_native(const char* launcher, ConvertPath path, bool* native) {
  int device = 0;
  FP8WIRE_CUDA_RETURN(cudaGetDevice(&device));
  const bool has = device_has_native_fp8(device);
  switch (path) {
    case ConvertPath::automatic: *native = has; return cudaSuccess;
    case ConvertPath::software: *native = false; return cudaSuccess;
    case ConvertPath::native:
      if (!has) return reject(launcher, fmt::format("convert_path=native needs sm_89 or newer (device {})", device));
      *native = true;
      return cudaSuccess;
  }
  return reject(launcher, fmt::format("unknown convert path {}", static_cast<int>(path)));
}

// Enough CTAs to fill the device a few times over (the kernels loop over tiles), never more than
// there are tiles.
unsigned grid_for(size_t count, uint32_t work_per_cta) {
  const size_t tiles = (count + kTileElems - 1) / kTileElems;
  if (work_per_cta > 0) {
    const size_t g = (tiles + work_per_cta - 1) / work_per_cta;
    return unsigned(std::min<size_t>(g ? g : 1, 0x7FFFFFFF));
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) device = 0;
  int sms = cached_attribute(g_sm_count, device, cudaDevAttrMultiProcessorCount, cudaDevAttrMultiProcessorCount, false);
  if (sms <= 0) sms = 132;
  const size_t cap = size_t(sms) * (2048 / kThreads) * 4;
  const size_t g = tiles < cap ? tiles : cap;
  return unsigned(g ? g : 1);
}

// The same, within LaunchOptions::max_ctas.
unsigned grid_for(size_t count, const LaunchOptions& opt) {
  const unsigned g = grid_for(count, opt.work_per_cta);
  return opt.max_ctas > 0 && g > opt.max_ctas ? opt.max_ctas : g;
}

const char* check_wire_pointer(const void* p) {
  if (!p) return "wire buffer is null";
  if (!is_aligned16(p)) return "wire buffer must be 16-byte aligned";
  return nullptr;
}

// The telemetry of a launch (quant/telemetry.hpp): the record must be 8-byte aligned (fp64 atomics);
// the guard needs a scale with a spare bit.
const char* telemetry_into(const LaunchOptions& opt, const WireFormat& wf, CallTelemetry** rec, bool* guard,
                           GuardBounds* bounds) {
  *rec = opt.telemetry.record;
  *guard = *rec && opt.telemetry.guard && guard_flag_supported(wf.scale);
  *bounds = opt.telemetry.bounds;
  if (*rec && (reinterpret_cast<uintptr_t>(*rec) & 7u) != 0) return "telemetry record must be 8-byte aligned";
  return nullptr;
}

bool valid_elem(ElemType t) { return t == ElemType::f32 || t == ElemType::f16 || t == ElemType::bf16; }

// Why a conversion between `count` elements of `type` at `plain` (its `side`: "input" or "output")
// and the segmented `wire` is refused; empty where it is not (an empty one checks no pointer).
std::string conversion_refusal(size_t count, Segmented layout, const WireFormat& wf, const void* plain, ElemType type,
                               const char* side, const void* wire) {
  if (const char* e = validate(count, layout, wf)) return e;
  if (!valid_elem(type)) return fmt::format("unsupported {} type {}", side, static_cast<int>(type));
  if (count == 0) return {};
  if (!plain) return fmt::format("{} buffer is null", side);
  if (const char* e = check_elem_pointer(plain, type)) return fmt::format("{}: {}", side, e);
  if (const char* e = check_wire_pointer(wire)) return e;
  return {};
}

cudaError_t quantize_impl(const char* name, const void* in, ElemType in_type, size_t count, float* residual,
                          void* wire, Segmented layout, const WireFormat& wf, cudaStream_t stream,
                          LaunchOptions opt) {
  if (const std::string e = conversion_refusal(count, layout, wf, in, in_type, "input", wire); !e.empty())
    return reject(name, e);
  if (count == 0) return cudaSuccess;
  if (residual && !is_aligned16(residual)) return reject(name, "residual must be 16-byte aligned");
  bool native = false;
  FP8WIRE_CUDA_RETURN(resolve_native(name, opt.path, &native));
  QuantizeParams p{};
  p.in = in;
  p.in_aligned = is_aligned16(in);
  p.residual = residual;
  p.target = WireTarget{static_cast<uint8_t*>(wire), count, layout.seg_elems, layout.seg_stride, ilog2(wf.block), wf.scale};
  p.stochastic = wf.rounding == Rounding::stochastic;
  p.seed = wf.seed;
  p.sr_offset = opt.sr_offset;
  p.variant = opt.kernel_variant;
  if (const char* e = telemetry_into(opt, wf, &p.rec, &p.guard, &p.bounds)) return reject(name, e);
  return launch_quantize_kernel(p, in_type, wf.fp8, native, grid_for(count, opt), stream);
}

OutKind out_kind(const ReduceOutput& out) {
  if (out.wire) return OutKind::wire;
  return out.plain_type == ElemType::f32 ? OutKind::f32 : out.plain_type == ElemType::f16 ? OutKind::f16 : OutKind::bf16;
}

// Checks and fills everything but the inputs.
cudaError_t prepare_reduce(const char* name, int k, bool has_plain, size_t count, float post_scale,
                           const ReduceOutput& out, const WireFormat& wf, const LaunchOptions& opt,
                           ReduceParams* p, bool* native) {
  if (const char* e = validate(wf)) return reject(name, e);
  if (k < 0 || k > kMaxReduceInputs) return reject(name, fmt::format("k = {} is outside [0, {}]", k, kMaxReduceInputs));
  if (k == 0 && !has_plain) return reject(name, "no inputs (k == 0 and no plain addend)");
  if ((out.plain == nullptr) == (out.wire == nullptr)) return reject(name, "give exactly one of out.plain and out.wire");
  if (out.wire && !is_aligned16(out.wire)) return reject(name, "out.wire must be 16-byte aligned");
  if (out.plain && !valid_elem(out.plain_type)) return reject(name, "out.plain_type must be f32, f16 or bf16");
  if (out.plain)
    if (const char* e = check_elem_pointer(out.plain, out.plain_type)) return reject(name, fmt::format("out.plain: {}", e));
  if (post_scale != post_scale) return reject(name, "post_scale is NaN");
  FP8WIRE_CUDA_RETURN(resolve_native(name, opt.path, native));
  p->k = k;
  p->count = count;
  p->scales_offset = payload_bytes(count);
  p->block_shift = ilog2(wf.block);
  p->scale = wf.scale;
  p->post_scale = post_scale;
  p->out_plain = out.plain;
  p->out_aligned = out.plain && is_aligned16(out.plain);
  p->out_wire = WireTarget{static_cast<uint8_t*>(out.wire), count, count ? count : 1, chunk_bytes(count, wf),
                           p->block_shift, wf.scale};
  p->stochastic = wf.rounding == Rounding::stochastic;
  p->seed = wf.seed;
  p->sr_offset = opt.sr_offset;
  if (const char* e = telemetry_into(opt, wf, &p->rec, &p->guard, &p->bounds)) return reject(name, e);
  return cudaSuccess;
}

cudaError_t reduce_impl(const char* name, const void* const* inputs, int k, const void* plain, ElemType plain_type,
                        int plain_position, size_t count, float post_scale, ReduceOutput out, const WireFormat& wf,
                        cudaStream_t stream, LaunchOptions opt) {
  ReduceParams p{};
  bool native = false;
  if (cudaError_t e = prepare_reduce(name, k, plain != nullptr, count, post_scale, out, wf, opt, &p, &native)) return e;
  if (count == 0) return cudaSuccess;
  if (k > 0 && !inputs) return reject(name, "inputs array is null");
  for (int j = 0; j < k; ++j) {
    if (const char* e = check_wire_pointer(inputs[j])) return reject(name, fmt::format("inputs[{}]: {}", j, e));
    p.in[j] = static_cast<const uint8_t*>(inputs[j]);
  }
  if (plain) {
    if (plain_position < 0 || plain_position > k)
      return reject(name, fmt::format("plain_position = {} is outside [0, k = {}]", plain_position, k));
    if (!valid_elem(plain_type)) return reject(name, "plain_type must be f32, f16 or bf16");
    if (const char* e = check_elem_pointer(plain, plain_type)) return reject(name, fmt::format("plain: {}", e));
    p.plain = plain;
    p.plain_type = plain_type;
    p.plain_position = plain_position;
    p.plain_aligned = is_aligned16(plain);
  }
  return launch_reduce_kernel(p, out_kind(out), wf.fp8, native, false, grid_for(count, opt), stream);
}

}  // namespace
}  // namespace detail

bool device_has_native_fp8(int device) {
  return detail::cached_attribute(detail::g_compute_capability, device, cudaDevAttrComputeCapabilityMajor,
                                  cudaDevAttrComputeCapabilityMinor, true) >= 89;
}

cudaError_t quantize(const void* in, ElemType in_type, size_t count, void* wire, Segmented layout,
                     const WireFormat& fmt, cudaStream_t stream, LaunchOptions opt) {
  return detail::quantize_impl("quantize", in, in_type, count, nullptr, wire, layout, fmt, stream, opt);
}

cudaError_t quantize_with_residual(const void* in, ElemType in_type, size_t count, float* residual,
                                   void* wire, Segmented layout, const WireFormat& fmt,
                                   cudaStream_t stream, LaunchOptions opt) {
  if (count != 0 && !residual) return detail::reject("quantize_with_residual", "residual buffer is null");
  return detail::quantize_impl("quantize_with_residual", in, in_type, count, residual, wire, layout, fmt, stream, opt);
}

cudaError_t dequantize(const void* wire, Segmented layout, size_t count, void* out, ElemType out_type,
                       const WireFormat& fmt, cudaStream_t stream, LaunchOptions opt) {
  using namespace detail;
  constexpr const char* kName = "dequantize";
  if (const std::string e = conversion_refusal(count, layout, fmt, out, out_type, "output", wire); !e.empty())
    return reject(kName, e);
  if (count == 0) return cudaSuccess;
  bool native = false;
  FP8WIRE_CUDA_RETURN(resolve_native(kName, opt.path, &native));
  DequantizeParams p{static_cast<const uint8_t*>(wire), count, layout.seg_elems, layout.seg_stride,
                     ilog2(fmt.block), fmt.scale, out, address_alignment(out), opt.work_per_cta, nullptr, false};
  GuardBounds unused;
  if (const char* e = telemetry_into(opt, fmt, &p.rec, &p.guard, &unused)) return reject(kName, e);
  return launch_dequantize_kernel(p, out_type, fmt.fp8, native, sm_count(), opt.max_ctas, stream);
}

cudaError_t dequantize_reduce(const void* const* inputs, int k, size_t count, float post_scale,
                              ReduceOutput out, const WireFormat& fmt, cudaStream_t stream, LaunchOptions opt) {
  return detail::reduce_impl("dequantize_reduce", inputs, k, nullptr, ElemType::f32, 0, count, post_scale, out, fmt,
                             stream, opt);
}

cudaError_t dequantize_reduce_mixed(const void* const* inputs, int k, const void* plain, ElemType plain_type,
                                    int plain_position, size_t count, float post_scale, ReduceOutput out,
                                    const WireFormat& fmt, cudaStream_t stream, LaunchOptions opt) {
  return detail::reduce_impl("dequantize_reduce_mixed", inputs, k, plain, plain_type, plain_position, count,
                             post_scale, out, fmt, stream, opt);
}

cudaError_t dequantize_then_reduce_naive(const void* const* inputs, int k, size_t count, float post_scale,
                                         float* scratch_f32, ReduceOutput out, const WireFormat& fmt,
                                         cudaStream_t stream, LaunchOptions opt) {
  using namespace detail;
  constexpr const char* kName = "dequantize_then_reduce_naive";
  ReduceParams p{};
  bool native = false;
  if (cudaError_t e = prepare_reduce(kName, k, false, count, post_scale, out, fmt, opt, &p, &native)) return e;
  if (count == 0) return cudaSuccess;
  if (!scratch_f32 || !is_aligned16(scratch_f32)) return reject(kName, "scratch_f32 must be non-null and 16-byte aligned");
  if (!inputs) return reject(kName, "inputs array is null");
  for (int j = 0; j < k; ++j)
    if (cudaError_t e = dequantize(inputs[j], Segmented::single(count, fmt), count, scratch_f32 + size_t(j) * count,
                                   ElemType::f32, fmt, stream, opt))
      return e;
  p.f32_in = scratch_f32;
  return launch_reduce_kernel(p, out_kind(out), fmt.fp8, native, true, grid_for(count, opt), stream);
}

}  // namespace fp8wire::quant
