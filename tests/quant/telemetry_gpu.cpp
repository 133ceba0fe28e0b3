// The codec kernels' telemetry against the CPU reference (quant/telemetry.hpp): counts exactly, the
// squared sums within the stated tolerance, and the guard flags bit for bit (the wire bytes with the
// guard on equal the reference's). GPU only: exits 77 without a device.
//
// Tolerance of the sums: the kernels take the residual in the scaled domain, s (x/s - q), in fp32
// per 16-element group and fp64 beyond; per element that differs from x - s q by at most 3 * 2^-24 |x|,
// so |sq_error - ref| <= 6 * 2^-24 * sqrt(sq_error * sq_input) + 1e-5 * sq_error (fp32 sums of 16 terms),
// and |sq_input - ref| <= 1e-5 * sq_input.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "quant/quant.hpp"
#include "quant/reference.hpp"
#include "quant/telemetry.hpp"

using namespace fp8wire;
using namespace fp8wire::quant;

namespace {

int g_failures = 0;
int g_cases = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++g_failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

// The kernels may compute an element's residual x - decode(q) with a fused multiply-add, which the
// reference rounds in two steps: per element the two differ by at most one ulp of x, so the sums of
// squares differ by at most 2 ulp * sqrt(sq_error * sq_input) (Cauchy-Schwarz) plus ulp^2 * sq_input;
// that last term is what remains where the reference's residuals are all exactly 0 (a requantization
// of values already on the FP8 grid).
bool sums_close(const ErrorStats& g, const ErrorStats& r) {
  const double e_tol = 6.0 * std::ldexp(1.0, -24) * std::sqrt(r.sq_error * r.sq_input) + 1e-5 * r.sq_error +
                       std::ldexp(1.0, -44) * r.sq_input;
  return std::fabs(g.sq_error - r.sq_error) <= e_tol && std::fabs(g.sq_input - r.sq_input) <= 1e-5 * r.sq_input;
}

bool counts_equal(const ErrorStats& g, const ErrorStats& r) {
  return g.elements == r.elements && g.saturated == r.saturated && g.flushed == r.flushed &&
         g.nonfinite == r.nonfinite;
}

std::string describe(const ErrorStats& s) {
  char b[256];
  std::snprintf(b, sizeof(b), "sq_error %.9g sq_input %.9g elements %llu sat %llu flushed %llu nonfinite %llu",
                s.sq_error, s.sq_input, s.elements, s.saturated, s.flushed, s.nonfinite);
  return b;
}

std::vector<float> data(int kind, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::student_t_distribution<float> t3(3);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = kind == 1 ? t3(rng) : normal(rng);
  if (kind == 2)  // an outlier 1e5x larger inside every block
    for (size_t i = 0; i < n; i += 128) x[i] = 4e5f;
  if (kind == 3) {  // an all-NaN block and an Inf
    for (size_t i = 256; i < 384 && i < n; ++i) x[i] = std::numeric_limits<float>::quiet_NaN();
    x[n / 2] = std::numeric_limits<float>::infinity();
  }
  if (kind == 4)  // below e4m3's range after scaling: block scales under FLT_MIN
    for (float& v : x) v *= 1e-40f;
  return x;
}

const char* kind_name(int k) {
  static const char* names[] = {"normal", "student-t(3)", "outlier 1e5x per block", "NaN block + Inf", "below range"};
  return names[k];
}

// One quantize (and one requantizing reduce of two such inputs) on the GPU and in the reference.
void check_case(int kind, Fp8Format fp8, ScaleType st, Rounding rounding, size_t n, bool guard) {
  const WireFormat f{fp8, st, 128, rounding, 5};
  const std::vector<float> x = data(kind, n, 17 + uint32_t(kind));
  const size_t cb = chunk_bytes(n, f);
  TelemetryOptions topt;
  topt.guard = guard;
  // Reference.
  CallTelemetry ref_rec;
  topt.record = &ref_rec;
  std::vector<uint8_t> ref_wire(cb);
  ref::quantize(x.data(), ElemType::f32, n, ref_wire.data(), Segmented::single(n, f), f, 0, &topt);
  std::vector<uint8_t> ref_out(cb);
  const void* ref_in[2] = {ref_wire.data(), ref_wire.data()};
  ref::ReduceOutput ro;
  ro.wire = ref_out.data();
  ref::dequantize_reduce(ref_in, 2, nullptr, ElemType::f32, 0, n, 0.5f, ro, f, 0, &topt);
  // GPU.
  float* dx = nullptr;
  uint8_t *dw = nullptr, *dout = nullptr;
  CallTelemetry* drec = nullptr;
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&dx, n * sizeof(float)));
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&dw, cb));
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&dout, cb));
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&drec, sizeof(CallTelemetry)));
  FP8WIRE_CUDA_OR_EXIT(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  FP8WIRE_CUDA_OR_EXIT(cudaMemset(drec, 0, sizeof(CallTelemetry)));
  LaunchOptions opt;
  opt.telemetry = topt;
  opt.telemetry.record = drec;
  FP8WIRE_CUDA_OR_EXIT(quantize(dx, ElemType::f32, n, dw, Segmented::single(n, f), f, nullptr, opt));
  const void* gin[2] = {dw, dw};
  ReduceOutput out;
  out.wire = dout;
  FP8WIRE_CUDA_OR_EXIT(dequantize_reduce(gin, 2, n, 0.5f, out, f, nullptr, opt));
  FP8WIRE_CUDA_OR_EXIT(cudaDeviceSynchronize());
  CallTelemetry got;
  std::vector<uint8_t> wire(cb), wout(cb);
  FP8WIRE_CUDA_OR_EXIT(cudaMemcpy(&got, drec, sizeof(got), cudaMemcpyDeviceToHost));
  FP8WIRE_CUDA_OR_EXIT(cudaMemcpy(wire.data(), dw, cb, cudaMemcpyDeviceToHost));
  FP8WIRE_CUDA_OR_EXIT(cudaMemcpy(wout.data(), dout, cb, cudaMemcpyDeviceToHost));
  char name[200];
  std::snprintf(name, sizeof(name), "%s %s/%s/%s n=%zu guard=%d", kind_name(kind), to_string(fp8), to_string(st),
                rounding == Rounding::nearest ? "nearest" : "stochastic", n, guard ? 1 : 0);
  ++g_cases;
  expect(counts_equal(got.input, ref_rec.input), std::string(name) + ": input counts: gpu " + describe(got.input) +
                                                      " ref " + describe(ref_rec.input));
  expect(sums_close(got.input, ref_rec.input), std::string(name) + ": input sums: gpu " + describe(got.input) +
                                                   " ref " + describe(ref_rec.input));
  expect(counts_equal(got.requant, ref_rec.requant), std::string(name) + ": requant counts: gpu " +
                                                         describe(got.requant) + " ref " + describe(ref_rec.requant));
  expect(sums_close(got.requant, ref_rec.requant), std::string(name) + ": requant sums: gpu " + describe(got.requant) +
                                                     " ref " + describe(ref_rec.requant));
  expect(wire == ref_wire, std::string(name) + ": quantized bytes (flag included) differ from the reference");
  expect(wout == ref_out, std::string(name) + ": requantized bytes (flag included) differ from the reference");
  expect(got.vote == ref_rec.vote && got.relay == ref_rec.relay,
         std::string(name) + ": votes differ from the reference");
  const CallTelemetry measured = got;  // the quantize's and the reduce's record; `got` is reused below
  // The decision of a decode of the requantized chunk.
  FP8WIRE_CUDA_OR_EXIT(cudaMemset(drec, 0, sizeof(CallTelemetry)));
  float* dy = nullptr;
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&dy, n * sizeof(float)));
  FP8WIRE_CUDA_OR_EXIT(dequantize(dout, Segmented::single(n, f), n, dy, ElemType::f32, f, nullptr, opt));
  FP8WIRE_CUDA_OR_EXIT(cudaMemcpy(&got, drec, sizeof(got), cudaMemcpyDeviceToHost));
  expect(got.decision == (guard && ref::guard_flag(ref_out.data(), n, f) ? 1u : 0u), std::string(name) + ": decision");
  if (kind <= 1) expect(guard_vote(measured.input, GuardBounds{}) == 0, std::string(name) + ": ordinary data voted");
  // An outlier 1e5x larger breaks e4m3 (its neighbours flush); e5m2's 2^32 range holds it.
  const bool breaks = kind >= 3 || (kind == 2 && fp8 == Fp8Format::e4m3);
  if (breaks) expect(guard_vote(measured.input, GuardBounds{}) != 0, std::string(name) + ": broken data did not vote");
  std::printf("%-60s rel %.4e flushed %llu nonfinite %llu vote %u\n", name,
              measured.input.sq_input > 0 ? std::sqrt(measured.input.sq_error / measured.input.sq_input) : 0.0,
              measured.input.flushed, measured.input.nonfinite,
              measured.input.elements ? guard_vote(measured.input, GuardBounds{}) : 0u);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dout);
  cudaFree(drec);
  cudaFree(dy);
}

}  // namespace

// What measuring costs on the GPU: the quantize of 64 MiB of bf16 and the requantizing reduce of two
// such chunks, each with and without a record (and with the guard's flags), alternated, median of
// CUDA-event times. One process and one stream, so the figures carry none of the noise that ranks
// sharing a GPU add to a collective's time; a measured call runs one quantize and, in the two-shot
// all-reduce, one requantizing reduce per rank.
void time_cost() {
  const size_t n = size_t(32) << 20;  // 64 MiB of bf16
  const WireFormat f{Fp8Format::e4m3, ScaleType::fp32, 128, Rounding::nearest, 5};
  const size_t cb = chunk_bytes(n, f);
  std::vector<uint16_t> host(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (uint16_t& h : host) {
    const float v = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    h = static_cast<uint16_t>(bits >> 16);
  }
  void* dx = nullptr;
  uint8_t *dw = nullptr, *dout = nullptr;
  CallTelemetry* drec = nullptr;
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&dx, n * 2));
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&dw, cb));
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&dout, cb));
  FP8WIRE_CUDA_OR_EXIT(cudaMalloc(&drec, sizeof(CallTelemetry)));
  FP8WIRE_CUDA_OR_EXIT(cudaMemcpy(dx, host.data(), n * 2, cudaMemcpyHostToDevice));
  cudaEvent_t a, b;
  FP8WIRE_CUDA_OR_EXIT(cudaEventCreate(&a));
  FP8WIRE_CUDA_OR_EXIT(cudaEventCreate(&b));
  auto timed = [&](auto&& launch) {
    FP8WIRE_CUDA_OR_EXIT(cudaEventRecord(a));
    launch();
    FP8WIRE_CUDA_OR_EXIT(cudaEventRecord(b));
    FP8WIRE_CUDA_OR_EXIT(cudaEventSynchronize(b));
    float ms = 0;
    FP8WIRE_CUDA_OR_EXIT(cudaEventElapsedTime(&ms, a, b));
    return 1000.0 * ms;
  };
  const char* names[3] = {"off", "measured", "measured+guard"};
  std::vector<double> q[3], r[3];
  for (int rep = 0; rep < 31; ++rep)
    for (int mode = 0; mode < 3; ++mode) {
      LaunchOptions opt;
      if (mode > 0) opt.telemetry.record = drec;
      opt.telemetry.guard = mode == 2;
      FP8WIRE_CUDA_OR_EXIT(cudaMemset(drec, 0, sizeof(CallTelemetry)));
      const double tq = timed([&] { FP8WIRE_CUDA_OR_EXIT(quantize(dx, ElemType::bf16, n, dw, Segmented::single(n, f), f, nullptr, opt)); });
      const void* in[2] = {dw, dw};
      ReduceOutput out;
      out.wire = dout;
      const double tr = timed([&] { FP8WIRE_CUDA_OR_EXIT(dequantize_reduce(in, 2, n, 0.5f, out, f, nullptr, opt)); });
      if (rep > 0) {  // the first round warms up
        q[mode].push_back(tq);
        r[mode].push_back(tr);
      }
    }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("telemetry cost: 64 MiB bf16, median of %zu (us; quantize, requantizing reduce of 2 chunks)\n", q[0].size());
  for (int mode = 0; mode < 3; ++mode)
    std::printf("  %-15s quantize %8.1f (%+6.1f %%)  reduce %8.1f (%+6.1f %%)  extra per measured call %6.1f us\n",
                names[mode], median(q[mode]), 100 * (median(q[mode]) / median(q[0]) - 1), median(r[mode]),
                100 * (median(r[mode]) / median(r[0]) - 1),
                median(q[mode]) - median(q[0]) + median(r[mode]) - median(r[0]));
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dout);
  cudaFree(drec);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  if (argc > 1 && std::string(argv[1]) == "--time") {
    time_cost();
    return 0;
  }
  for (int kind = 0; kind < 5; ++kind)
    for (Fp8Format fp8 : {Fp8Format::e4m3, Fp8Format::e5m2})
      for (ScaleType st : {ScaleType::fp32, ScaleType::bf16, ScaleType::e8m0})
        for (Rounding r : {Rounding::nearest, Rounding::stochastic})
          for (size_t n : {size_t(1000), size_t(1) << 18})
            check_case(kind, fp8, st, r, n, true);
  // Without the guard: no flag anywhere, figures the same.
  for (int kind : {0, 3}) check_case(kind, Fp8Format::e4m3, ScaleType::fp32, Rounding::nearest, size_t(1) << 18, false);
  std::printf("%s telemetry_gpu: %d cases, %d failures\n", g_failures ? "FAIL" : "PASS", g_cases, g_failures);
  return g_failures ? 1 : 0;
}
