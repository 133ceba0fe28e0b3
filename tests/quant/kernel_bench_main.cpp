// fp8wire-kernel-bench: the codec microbenchmarks on their own (fp8wire-bench kernels runs the same
// bench::run_kernel_bench). Example:
//   fp8wire-kernel-bench --sizes 1MiB,64MiB,256MiB --k 8 --json out/kernels.json
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/kernel_bench.hpp"
#include "common/command_line.hpp"
#include "common/config.hpp"

int main(int argc, char** argv) {
  fp8wire::bench::KernelBenchOptions o;
  std::vector<std::string> sizes;
  std::string dtype = "bf16", format = "e4m3", scale = "fp32";
  uint32_t block = 128;
  CLI::App app{"fp8wire codec kernel microbenchmarks"};
  app.add_option("--sizes", sizes, "caller-dtype bytes per buffer, e.g. 1MiB,64MiB")->delimiter(',');
  app.add_option("--k", o.k, "inputs of the fused reduce")->capture_default_str();
  app.add_option("--repeats", o.repeats, "timed repeats (median reported)")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed warm-up calls")->capture_default_str();
  app.add_option("--dtype", dtype, "bf16 | f16 | f32")->capture_default_str();
  app.add_option("--format", format, "e4m3 | e5m2")->capture_default_str();
  app.add_option("--scale", scale, "fp32 | bf16 | e8m0")->capture_default_str();
  app.add_option("--block", block, "block size")->capture_default_str();
  app.add_option("--kernels", o.kernels, "subset of quantize,dequantize,reduce,reduce_requant,naive")->delimiter(',');
  app.add_option("--json", o.json_path, "write results as JSON");
  app.add_option("--work-per-cta", o.work_per_cta, "tuning: tiles per CTA (quantize, reduce) or units per thread (dequantize: 1, 2, 4); 0 = launcher's choice")
      ->check(CLI::Range(0u, 1u << 20))->capture_default_str();
  app.add_option("--kernel-variant", o.kernel_variant, "tuning: 1 = quantize with plain loads, 2 = quantize at 8 CTAs/SM, 3 = quantize without its full-tile fast path; 0 = production")
      ->check(CLI::Range(0u, 3u))->capture_default_str();
  if (const auto status = fp8wire::parse_command_line(app, argc, argv, "fp8wire-kernel-bench")) return *status;

  if (!sizes.empty()) {
    o.sizes.clear();
    for (const auto& s : sizes) {
      const auto v = fp8wire::parse_size(s);
      if (!v || *v == 0) {
        std::fprintf(stderr, "--sizes '%s': expected a byte count such as 1048576 or 64MiB\n", s.c_str());
        return 2;
      }
      o.sizes.push_back(*v);
    }
  }
  using fp8wire::quant::ElemType;
  if (dtype == "bf16") o.dtype = ElemType::bf16;
  else if (dtype == "f16" || dtype == "fp16") o.dtype = ElemType::f16;
  else if (dtype == "f32" || dtype == "fp32") o.dtype = ElemType::f32;
  else { std::fprintf(stderr, "--dtype '%s': expected bf16, f16 or f32\n", dtype.c_str()); return 2; }
  if (format == "e4m3") o.format.fp8 = fp8wire::Fp8Format::e4m3;
  else if (format == "e5m2") o.format.fp8 = fp8wire::Fp8Format::e5m2;
  else { std::fprintf(stderr, "--format '%s': expected e4m3 or e5m2\n", format.c_str()); return 2; }
  if (scale == "fp32") o.format.scale = fp8wire::ScaleType::fp32;
  else if (scale == "bf16") o.format.scale = fp8wire::ScaleType::bf16;
  else if (scale == "e8m0") o.format.scale = fp8wire::ScaleType::e8m0;
  else { std::fprintf(stderr, "--scale '%s': expected fp32, bf16 or e8m0\n", scale.c_str()); return 2; }
  o.format.block = block;
  return fp8wire::bench::run_kernel_bench(o);
}
