// GPU codec kernels against the CPU reference, bit for bit: every kernel x caller dtype x format x scale
// type x block size x rounding x conversion path x odd counts (plus segmented layouts, misaligned
// caller buffers, NaN/Inf/zero blocks), outputs poisoned with 0xFF before each run. The fused reduce
// (k = 1, 2, 3, 8, 64) is also checked against an fp64 sum within a stated tolerance, and a CUDA
// graph replay must reproduce a direct launch. Prints FAIL lines as they happen and a compact matrix.
// Exit: 0 all passed, 1 a failure, 77 no CUDA device (skipped). --quick: small counts only.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "quant/fp8_math.hpp"
#include "common/status.hpp"
#include "quant/quant.hpp"
#include "quant/reference.hpp"

using namespace fp8wire;
using namespace fp8wire::quant;

namespace {

// A CUDA error inside a case throws; run_case() reports it with the case's description and carries
// on with the next case unless the error is sticky (the context is then unusable: the matrix so far is
// printed and the program exits).
struct CudaFailure {
  std::string what;
};
std::string g_case;   // what is running now, for error messages


struct Tally {
  int pass = 0, total = 0;
  std::string first_failure;
};
std::map<std::string, Tally> g_matrix;   // "row|path"
int g_failures = 0;

void record(const std::string& row, const std::string& col, bool ok, const std::string& detail) {
  Tally& t = g_matrix[row + "|" + col];
  ++t.total;
  if (ok) {
    ++t.pass;
    return;
  }
  ++g_failures;
  if (t.first_failure.empty()) {
    t.first_failure = detail;
    std::printf("FAIL: %s [%s] %s\n", row.c_str(), col.c_str(), detail.c_str());
  }
}

long first_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (a[i] != b[i]) return long(i);
  return a.size() == b.size() ? -1 : long(std::min(a.size(), b.size()));
}

std::string diff_text(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, long at, const char* what) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s differs at byte %ld: got 0x%02x want 0x%02x (size %zu)", what, at,
                at < long(got.size()) ? got[at] : 0, at < long(want.size()) ? want[at] : 0, want.size());
  return buf;
}

// Normal values with heavy-tailed outliers, an all-zero block, a block of tiny values, NaN and Inf in
// two blocks and a large value (when the count reaches them), as fp32.
std::vector<float> make_data(size_t n, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::student_t_distribution<float> td(2.5f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = (i % 97 == 0) ? 30.0f * td(rng) : nd(rng);
  if (specials) {
    for (size_t i = 256; i < 512 && i < n; ++i) x[i] = 0.0f;
    for (size_t i = 4096; i < 4160 && i < n; ++i) x[i] = 1e-38f * nd(rng);
    if (n > 700) x[700] = NAN;
    if (n > 3000) x[3000] = -INFINITY;
    if (n > 2100) x[2100] = 60000.0f;
  }
  return x;
}

std::vector<uint8_t> to_type(const std::vector<float>& x, ElemType t) {
  std::vector<uint8_t> out(x.size() * elem_size(t));
  for (size_t i = 0; i < x.size(); ++i) ref::store_elem(out.data(), t, i, x[i]);
  return out;
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t n) { FP8WIRE_CUDA_OR(cudaMalloc(&p, n ? n : 1), throw CudaFailure{"a CUDA call failed (logged above)"}); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T = uint8_t>
  T* as(size_t byte_offset = 0) const { return reinterpret_cast<T*>(static_cast<char*>(p) + byte_offset); }
};

std::vector<uint8_t> download(const void* d, size_t n) {
  std::vector<uint8_t> h(n);
  if (n) FP8WIRE_CUDA_OR(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost), throw CudaFailure{"a CUDA call failed (logged above)"});
  return h;
}
void upload(void* d, const void* h, size_t n) {
  if (n) FP8WIRE_CUDA_OR(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), throw CudaFailure{"a CUDA call failed (logged above)"});
}

const char* path_name(ConvertPath p) { return p == ConvertPath::native ? "native" : "software"; }

std::string fmt_key(const WireFormat& f) {
  return std::string(to_string(f.fp8)) + "/" + to_string(f.scale) + (f.rounding == Rounding::stochastic ? "/sr" : "/rne");
}

constexpr size_t kMaxCount = 1000003;
constexpr size_t kMaxReduceCount = 100003;
constexpr int kMaxK = 64;

struct Buffers {
  DeviceBuffer in{(kMaxCount + 64) * 4};
  DeviceBuffer wire{2 * chunk_bytes(kMaxCount, WireFormat{}) + 4096 * 8};
  DeviceBuffer out{(kMaxCount + 64) * 4};
  DeviceBuffer residual{(kMaxCount + 64) * 4};
  DeviceBuffer chunks{size_t(kMaxK) * (chunk_bytes(kMaxReduceCount, WireFormat{}) + 4096)};
  DeviceBuffer scratch{size_t(8) * kMaxReduceCount * 4 + 64};
};

// ---- quantize, dequantize, quantize_with_residual ----------------------------------------------------
void check_codec(Buffers& b, ElemType dtype, const WireFormat& f, ConvertPath path, size_t count, bool segmented,
                 bool misaligned, bool with_residual) {
  const std::string col = path_name(path);
  {
    char c[200];
    std::snprintf(c, sizeof c, "%s %s %s count=%zu block=%u%s%s [%s]", with_residual ? "quantize_with_residual" : "quantize",
                  to_string(dtype), fmt_key(f).c_str(), count, f.block, segmented ? " segmented" : "",
                  misaligned ? " misaligned" : "", col.c_str());
    g_case = c;
  }
  const auto x = make_data(count, uint32_t(count * 7 + f.block), true);
  const auto xin = to_type(x, dtype);
  const size_t offset_bytes = misaligned ? elem_size(dtype) : 0;   // caller buffer not 16-byte aligned
  upload(b.in.as(offset_bytes), xin.data(), xin.size());
  Segmented layout = Segmented::single(count, f);
  if (segmented) {
    const size_t seg = align_up((count + 2) / 3, f.block);
    layout = Segmented{seg, align_up(chunk_bytes(seg, f) + 16, kWireAlign)};
  }
  const size_t wire_bytes = segment_count(count, layout) * layout.seg_stride;
  const LaunchOptions opt{path, 12345};

  std::vector<uint8_t> want(wire_bytes, 0xFF);
  std::vector<float> res_want(count);
  const char* err;
  if (with_residual) {
    std::mt19937 rng{uint32_t(count)};
    std::normal_distribution<float> nd(0.0f, 0.01f);
    for (float& r : res_want) r = nd(rng);
    upload(b.residual.p, res_want.data(), count * 4);
    err = ref::quantize_with_residual(xin.data(), dtype, count, res_want.data(), want.data(), layout, f, opt.sr_offset);
  } else {
    err = ref::quantize(xin.data(), dtype, count, want.data(), layout, f, opt.sr_offset);
  }
  if (err) {
    record("reference", col, false, err);
    return;
  }

  FP8WIRE_CUDA_OR(cudaMemset(b.wire.p, 0xFF, wire_bytes), throw CudaFailure{"a CUDA call failed (logged above)"});
  const cudaError_t e =
      with_residual
          ? quantize_with_residual(b.in.as(offset_bytes), dtype, count, b.residual.as<float>(), b.wire.p, layout, f, nullptr, opt)
          : quantize(b.in.as(offset_bytes), dtype, count, b.wire.p, layout, f, nullptr, opt);
  FP8WIRE_CUDA_OR(cudaDeviceSynchronize(), throw CudaFailure{"a CUDA call failed (logged above)"});
  const std::string row =
      std::string(with_residual ? "quantize_with_residual " : "quantize ") + to_string(dtype) + " " + fmt_key(f);
  char ctx[160];
  std::snprintf(ctx, sizeof ctx, "count=%zu block=%u%s%s: ", count, f.block, segmented ? " segmented" : "",
                misaligned ? " misaligned" : "");
  if (e != cudaSuccess) {
    record(row, col, false, std::string(ctx) + "launch returned " + cudaGetErrorName(e));
    return;
  }
  const auto got = download(b.wire.p, wire_bytes);
  const long at = first_diff(got, want);
  bool ok = at < 0;
  std::string detail = ok ? "" : std::string(ctx) + diff_text(got, want, at, "wire");
  if (ok && with_residual) {
    const auto r = download(b.residual.p, count * 4);
    const auto* rw = reinterpret_cast<const uint8_t*>(res_want.data());
    const long rat = first_diff(r, std::vector<uint8_t>(rw, rw + count * 4));
    ok = rat < 0;
    if (!ok) detail = std::string(ctx) + "residual differs at byte " + std::to_string(rat);
  }
  record(row, col, ok, detail);
  if (with_residual) return;

  // Dequantize the reference bytes into every caller dtype.
  upload(b.wire.p, want.data(), wire_bytes);
  for (ElemType out_type : {ElemType::f32, ElemType::f16, ElemType::bf16}) {
    // Misaligned case: the output is offset by one element of its own type (element-aligned, not
    // 16-byte aligned), as a PyTorch view or a bucket offset can be.
    const size_t out_offset = misaligned ? elem_size(out_type) : 0;
    g_case = std::string("dequantize -> ") + to_string(out_type) + " " + fmt_key(f) + " " + ctx + "[" + col + "]";
    const size_t out_bytes = count * elem_size(out_type);
    std::vector<uint8_t> dwant(out_bytes);
    ref::dequantize(want.data(), layout, count, dwant.data(), out_type, f);
    FP8WIRE_CUDA_OR(cudaMemset(b.out.p, 0xFF, out_bytes + 64), throw CudaFailure{"a CUDA call failed (logged above)"});
    const cudaError_t de = dequantize(b.wire.p, layout, count, b.out.as(out_offset), out_type, f, nullptr, opt);
    FP8WIRE_CUDA_OR(cudaDeviceSynchronize(), throw CudaFailure{"a CUDA call failed (logged above)"});
    const std::string drow = std::string("dequantize ") + to_string(out_type) + " " + to_string(f.fp8) + "/" + to_string(f.scale);
    if (de != cudaSuccess) {
      record(drow, col, false, std::string(ctx) + "launch returned " + cudaGetErrorName(de));
      continue;
    }
    const auto dgot = download(b.out.as(out_offset), out_bytes);
    const long dat = first_diff(dgot, dwant);
    bool tail_ok = true;   // nothing past the end may be written
    for (uint8_t t : download(b.out.as(out_offset + out_bytes), 16)) tail_ok &= t == 0xFF;
    record(drow, col, dat < 0 && tail_ok,
           dat >= 0 ? std::string(ctx) + diff_text(dgot, dwant, dat, "output") : std::string(ctx) + "wrote past the end");
  }
}

// ---- fused reduce -------------------------------------------------------------------------------
struct ReduceCase {
  int k;
  size_t count;
  float post_scale;
  int out;      // 0 f32, 1 f16, 2 bf16, 3 wire
  bool mixed;   // bf16 plain addend at position k/2
  bool naive;   // the baseline instead of the fused kernel
};

void check_reduce(Buffers& b, const WireFormat& f, ConvertPath path, const ReduceCase& c) {
  const std::string col = path_name(path);
  {
    static const char* kOutName[] = {"f32", "f16", "bf16", "wire"};
    char d[200];
    std::snprintf(d, sizeof d, "%s k=%d count=%zu -> %s %s block=%u post_scale=%g [%s]",
                  c.naive ? "reduce_naive" : c.mixed ? "reduce_mixed" : "reduce", c.k, c.count, kOutName[c.out],
                  fmt_key(f).c_str(), f.block, c.post_scale, col.c_str());
    g_case = d;
  }
  const size_t cb = align_up(chunk_bytes(c.count, f), 256);
  std::vector<std::vector<uint8_t>> chunks(c.k, std::vector<uint8_t>(chunk_bytes(c.count, f)));
  std::vector<const void*> host_ptrs(c.k), dev_ptrs(c.k);
  std::vector<std::vector<float>> decoded(c.k, std::vector<float>(c.count));
  WireFormat in_fmt = f;
  in_fmt.rounding = Rounding::nearest;
  for (int j = 0; j < c.k; ++j) {
    const auto x = make_data(c.count, uint32_t(1000 + j), j == 1 && c.k > 2);
    ref::quantize(x.data(), ElemType::f32, c.count, chunks[j].data(), Segmented::single(c.count, f), in_fmt);
    ref::dequantize(chunks[j].data(), Segmented::single(c.count, f), c.count, decoded[j].data(), ElemType::f32, in_fmt);
    host_ptrs[j] = chunks[j].data();
    dev_ptrs[j] = b.chunks.as(size_t(j) * cb);
    upload(b.chunks.as(size_t(j) * cb), chunks[j].data(), chunks[j].size());
  }
  const auto plain = to_type(make_data(c.count, 77, false), ElemType::bf16);
  if (c.mixed) upload(b.in.p, plain.data(), plain.size());
  const ElemType out_type = c.out == 1 ? ElemType::f16 : c.out == 2 ? ElemType::bf16 : ElemType::f32;
  const size_t out_bytes = c.out == 3 ? chunk_bytes(c.count, f) : c.count * elem_size(out_type);
  std::vector<uint8_t> want(out_bytes, 0xFF);
  const ref::ReduceOutput rout{c.out == 3 ? nullptr : want.data(), out_type, c.out == 3 ? want.data() : nullptr};
  const LaunchOptions opt{path, 999};
  if (const char* err = ref::dequantize_reduce(host_ptrs.data(), c.k, c.mixed ? plain.data() : nullptr, ElemType::bf16,
                                               c.k / 2, c.count, c.post_scale, rout, f, opt.sr_offset)) {
    record("reference", col, false, err);
    return;
  }
  FP8WIRE_CUDA_OR(cudaMemset(b.out.p, 0xFF, out_bytes), throw CudaFailure{"a CUDA call failed (logged above)"});
  const ReduceOutput dout{c.out == 3 ? nullptr : b.out.p, out_type, c.out == 3 ? b.out.p : nullptr};
  cudaError_t e;
  if (c.naive)
    e = dequantize_then_reduce_naive(dev_ptrs.data(), c.k, c.count, c.post_scale, b.scratch.as<float>(), dout, f, nullptr, opt);
  else if (c.mixed)
    e = dequantize_reduce_mixed(dev_ptrs.data(), c.k, b.in.p, ElemType::bf16, c.k / 2, c.count, c.post_scale, dout, f, nullptr, opt);
  else
    e = dequantize_reduce(dev_ptrs.data(), c.k, c.count, c.post_scale, dout, f, nullptr, opt);
  FP8WIRE_CUDA_OR(cudaDeviceSynchronize(), throw CudaFailure{"a CUDA call failed (logged above)"});
  static const char* kOut[] = {"f32", "f16", "bf16", "wire"};
  const std::string row =
      std::string(c.naive ? "reduce_naive -> " : c.mixed ? "reduce_mixed -> " : "reduce -> ") + kOut[c.out] + " " + fmt_key(f);
  char ctx[128];
  std::snprintf(ctx, sizeof ctx, "k=%d count=%zu block=%u post_scale=%g: ", c.k, c.count, f.block, c.post_scale);
  if (e != cudaSuccess) {
    record(row, col, false, std::string(ctx) + "launch returned " + cudaGetErrorName(e));
    return;
  }
  const auto got = download(b.out.p, out_bytes);
  const long at = first_diff(got, want);
  record(row, col, at < 0, at < 0 ? "" : std::string(ctx) + diff_text(got, want, at, "output"));

  // Against an fp64 sum: |out - exact * post| <= ((k - 1) + 1) 2^-24 sum|terms| * post.
  if (c.out == 0 && !c.mixed && !c.naive) {
    bool ok = true;
    std::string detail;
    for (size_t i = 0; i < c.count && ok; ++i) {
      double exact = 0, mag = 0;
      bool nan = false;
      for (int j = 0; j < c.k; ++j) {
        exact += decoded[j][i];
        mag += std::fabs(decoded[j][i]);
        nan |= std::isnan(decoded[j][i]);
      }
      float v;
      std::memcpy(&v, got.data() + 4 * i, 4);
      if (nan) {
        ok = std::isnan(v);
        continue;
      }
      const double tol = c.k * std::ldexp(1.0, -24) * mag * c.post_scale + 1e-38;
      if (!(std::fabs(v - exact * c.post_scale) <= tol)) {
        ok = false;
        detail = std::string(ctx) + "element " + std::to_string(i) + " off the fp64 sum beyond tolerance";
      }
    }
    record("reduce f32 vs fp64 sum (tol k 2^-24 sum|x|)", col, ok, detail);
  }
}

// ---- CUDA graph: capture, replay twice, same bytes as a direct launch ------------------------------
void check_graph(Buffers& b, ConvertPath path) {
  g_case = std::string("graph capture + replay [") + path_name(path) + "]";
  const WireFormat f{};
  const size_t count = 100003;
  const auto x = to_type(make_data(count, 5, true), ElemType::bf16);
  upload(b.in.p, x.data(), x.size());
  const LaunchOptions opt{path, 0};
  const size_t wb = chunk_bytes(count, f);
  cudaStream_t s;
  FP8WIRE_CUDA_OR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), throw CudaFailure{"a CUDA call failed (logged above)"});
  const void* ins[2] = {b.wire.p, b.wire.p};
  const ReduceOutput out{b.out.p, ElemType::bf16, nullptr};
  FP8WIRE_CUDA_OR(quantize(b.in.p, ElemType::bf16, count, b.wire.p, Segmented::single(count, f), f, s, opt), throw CudaFailure{"a CUDA call failed (logged above)"});
  FP8WIRE_CUDA_OR(dequantize_reduce(ins, 2, count, 0.5f, out, f, s, opt), throw CudaFailure{"a CUDA call failed (logged above)"});
  FP8WIRE_CUDA_OR(cudaStreamSynchronize(s), throw CudaFailure{"a CUDA call failed (logged above)"});
  const auto direct_wire = download(b.wire.p, wb);
  const auto direct_out = download(b.out.p, count * 2);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  FP8WIRE_CUDA_OR(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), throw CudaFailure{"a CUDA call failed (logged above)"});
  const cudaError_t e1 = quantize(b.in.p, ElemType::bf16, count, b.wire.p, Segmented::single(count, f), f, s, opt);
  const cudaError_t e2 = dequantize_reduce(ins, 2, count, 0.5f, out, f, s, opt);
  FP8WIRE_CUDA_OR(cudaStreamEndCapture(s, &graph), throw CudaFailure{"a CUDA call failed (logged above)"});
  FP8WIRE_CUDA_OR(cudaGraphInstantiate(&exec, graph, 0), throw CudaFailure{"a CUDA call failed (logged above)"});
  bool ok = e1 == cudaSuccess && e2 == cudaSuccess;
  for (int rep = 0; rep < 2 && ok; ++rep) {
    FP8WIRE_CUDA_OR(cudaMemset(b.wire.p, 0xFF, wb), throw CudaFailure{"a CUDA call failed (logged above)"});
    FP8WIRE_CUDA_OR(cudaMemset(b.out.p, 0xFF, count * 2), throw CudaFailure{"a CUDA call failed (logged above)"});
    FP8WIRE_CUDA_OR(cudaGraphLaunch(exec, s), throw CudaFailure{"a CUDA call failed (logged above)"});
    FP8WIRE_CUDA_OR(cudaStreamSynchronize(s), throw CudaFailure{"a CUDA call failed (logged above)"});
    ok = download(b.wire.p, wb) == direct_wire && download(b.out.p, count * 2) == direct_out;
  }
  record("graph capture + replay", path_name(path), ok, "replay differs from direct launch");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

void check_rejections(Buffers& b) {
  g_case = "bad arguments rejected";
  WireFormat bad{};
  bad.block = 100;
  const WireFormat good{};
  const bool r1 = quantize(b.in.p, ElemType::bf16, 1000, b.wire.p, Segmented::single(1000, good), bad, nullptr) == cudaErrorInvalidValue;
  const bool r2 = quantize(b.in.p, ElemType::bf16, 1000, b.wire.as(3), Segmented::single(1000, good), good, nullptr) == cudaErrorInvalidValue;
  const void* ins[1] = {b.wire.p};
  const bool r3 = dequantize_reduce(ins, 1, 1000, 1.0f, ReduceOutput{}, good, nullptr) == cudaErrorInvalidValue;
  const bool r4 = dequantize_reduce(ins, kMaxReduceInputs + 1, 1000, 1.0f, ReduceOutput{b.out.p, ElemType::f32, nullptr},
                                    good, nullptr) == cudaErrorInvalidValue;
  // fp32 output two bytes off its element alignment.
  const bool r5 = dequantize(b.wire.p, Segmented::single(1000, good), 1000, b.out.as(2), ElemType::f32, good, nullptr) ==
                  cudaErrorInvalidValue;
  record("bad arguments rejected (cudaErrorInvalidValue)", "any", r1 && r2 && r3 && r4 && r5, "a bad argument was accepted");
  FP8WIRE_CUDA_OR(cudaGetLastError(), throw CudaFailure{"a CUDA call failed (logged above)"});
}

void print_matrix() {
  // Compact matrix: one line per kernel variant, one column per conversion path.
  std::map<std::string, std::map<std::string, Tally>> rows;
  for (auto& [key, t] : g_matrix) {
    const auto bar = key.find('|');
    rows[key.substr(0, bar)][key.substr(bar + 1)] = t;
  }
  std::printf("\n## bit-exactness matrix (passed/total per conversion path)\n");
  std::printf("%-52s %-14s %-14s\n", "kernel dtype format/scale/rounding", "native", "software");
  for (const auto& row_cols : rows) {
    const std::string& row = row_cols.first;
    const std::map<std::string, Tally>& cols = row_cols.second;
    auto cell = [&](const char* c) {
      auto it = cols.find(c);
      if (it == cols.end()) it = cols.find("any");
      if (it == cols.end()) return std::string("-");
      return std::to_string(it->second.pass) + "/" + std::to_string(it->second.total) +
             (it->second.pass == it->second.total ? "" : " FAIL");
    };
    std::printf("%-52s %-14s %-14s\n", row.c_str(), cell("native").c_str(), cell("software").c_str());
  }
  int total = 0;
  for (auto& [k, t] : g_matrix) total += t.total;
  std::printf("\n%s: test_quant_gpu %d checks, %d failures\n", g_failures ? "FAIL" : "PASS", total, g_failures);
}

// Runs one case; a CUDA error is recorded against the case. After a sticky error (e.g. a misaligned
// access) the context cannot be used any more: print what we have and stop.
template <class Case>
void run_case(const char* col, Case&& body) {
  try {
    body();
  } catch (const CudaFailure& f) {
    record("CUDA error in a case", col, false, g_case + ": " + f.what);
    std::printf("FAIL: during '%s': %s\n", g_case.c_str(), f.what.c_str());
    (void)cudaGetLastError();
    if (cudaDeviceSynchronize() != cudaSuccess || cudaGetLastError() != cudaSuccess) {
      std::printf("FAIL: the CUDA context is unusable after that error (sticky); stopping here\n");
      print_matrix();
      std::fflush(stdout);
      std::exit(1);
    }
  }
}

}  // namespace

static int run_all(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp prop{};
  FP8WIRE_CUDA_OR(cudaGetDeviceProperties(&prop, 0), throw CudaFailure{"a CUDA call failed (logged above)"});
  std::printf("device: %s (sm_%d%d), native FP8 conversion: %s\n", prop.name, prop.major, prop.minor,
              device_has_native_fp8(0) ? "yes" : "no");
  std::vector<ConvertPath> paths = {ConvertPath::software};
  if (device_has_native_fp8(0)) paths.insert(paths.begin(), ConvertPath::native);

  Buffers b;
  const uint32_t blocks[] = {32, 64, 128, 256, 512, 1024, 2048, 4096};
  // 8192: whole tiles only, so the quantize fast path also writes the chunk's last block and its scale padding.
  const size_t small_counts[] = {1, 127, 129, 4097, 8192, 65537};
  for (ConvertPath path : paths)
    for (ElemType dtype : {ElemType::bf16, ElemType::f16, ElemType::f32})
      for (Fp8Format fp8 : {Fp8Format::e4m3, Fp8Format::e5m2})
        for (ScaleType st : {ScaleType::fp32, ScaleType::bf16, ScaleType::e8m0})
          for (Rounding r : {Rounding::nearest, Rounding::stochastic}) {
            for (uint32_t block : blocks) {
              const WireFormat f{fp8, st, block, r, 0xABCDEF};
              for (size_t count : small_counts) {
                if (quick && count > 8192) continue;
                run_case(path_name(path), [&] { check_codec(b, dtype, f, path, count, false, false, false); });
              }
              run_case(path_name(path), [&] { check_codec(b, dtype, f, path, quick ? 4097 : 65537, true, block == 128, false); });   // segmented (+ misaligned)
            }
            if (quick) continue;
            for (uint32_t block : {128u, 4096u}) {
              const WireFormat f{fp8, st, block, r, 0xABCDEF};
              run_case(path_name(path), [&] { check_codec(b, dtype, f, path, kMaxCount, block == 4096, false, false); });
              run_case(path_name(path), [&] { check_codec(b, dtype, f, path, block == 128 ? kMaxCount : 4097, false, false, true); });
            }
            run_case(path_name(path), [&] { check_codec(b, dtype, WireFormat{fp8, st, 32, r, 1}, path, 129, true, true, true); });
          }
  std::printf("codec matrix done: %d failures so far\n", g_failures);

  for (ConvertPath path : paths)
    for (Fp8Format fp8 : {Fp8Format::e4m3, Fp8Format::e5m2})
      for (ScaleType st : {ScaleType::fp32, ScaleType::bf16, ScaleType::e8m0})
        for (int k : {1, 2, 3, 8, 64})
          for (size_t count : {size_t(1), size_t(129), size_t(4097), kMaxReduceCount}) {
            if (k == 64 && count > 4097) continue;
            if (quick && count > 4097) continue;
            for (int out = 0; out < 4; ++out)
              for (Rounding r : {Rounding::nearest, Rounding::stochastic}) {
                if (out != 3 && r == Rounding::stochastic) continue;
                const float post = (out == 0 || out == 3) && k > 1 ? 1.0f / float(k) : 1.0f;
                const WireFormat f{fp8, st, count == 4097 ? 512u : 128u, r, 31};
                run_case(path_name(path), [&] { check_reduce(b, f, path, ReduceCase{k, count, post, out, false, false}); });
              }
            if (k <= 8) {
              const WireFormat f{fp8, st, 128, Rounding::nearest, 31};
              run_case(path_name(path), [&] { check_reduce(b, f, path, ReduceCase{k, count, 1.0f, 2, true, false}); });
              run_case(path_name(path), [&] { check_reduce(b, f, path, ReduceCase{k, count, 1.0f, 0, true, false}); });
              run_case(path_name(path), [&] { check_reduce(b, f, path, ReduceCase{k, count, 0.5f, 3, false, true}); });
            }
          }
  for (ConvertPath path : paths) run_case(path_name(path), [&] { check_graph(b, path); });
  run_case("any", [&] { check_rejections(b); });

  print_matrix();
  return g_failures ? 1 : 0;
}

int main(int argc, char** argv) {
  try {
    return run_all(argc, argv);
  } catch (const CudaFailure& f) {   // outside any case: device query or buffer allocation
    std::printf("FAIL: %s (while: %s)\n", f.what.c_str(), g_case.empty() ? "setting up" : g_case.c_str());
    return 1;
  }
}
