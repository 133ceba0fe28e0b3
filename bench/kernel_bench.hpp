// Codec kernel microbenchmarks: quantize, dequantize, fused dequantize-reduce (plain and
// requantizing) and two naive dequantize-then-reduce baselines, on both conversion paths, reported as
// GB/s (bytes read + written) against the device-to-device copy bandwidth measured in the same run.
// The naive baselines both dequantize each of the k chunks to a full-size fp32 buffer; then "naive"
// sums the k buffers in one k-input pass (74 B moved per element at k = 8, so the fused kernel's
// 10.2 B bounds its advantage near 7.3x), and "naive pairwise" keeps a running sum, acc += x_j, one
// elementwise kernel per chunk as a user-level implementation does (130 B per element).
// Method as nccl-tests: CUDA events around each repeat after warm-up, median of repeats, inputs and
// outputs rotated over enough buffer sets that the L2 cache is not what is measured. Every run also
// checks correctness (fused == both naive baselines bit for bit; the smallest quantize against the
// CPU reference).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "quant/wire_format.hpp"

namespace fp8wire::bench {

struct KernelBenchOptions {
  // Caller-dtype bytes of one buffer (the reduce's output; each of its k inputs holds as many elements).
  std::vector<size_t> sizes = {size_t(1) << 20, size_t(16) << 20, size_t(64) << 20, size_t(256) << 20};
  int warmup = 5;
  int repeats = 30;
  int k = 8;                                  // inputs of the fused reduce (a world size)
  quant::ElemType dtype = quant::ElemType::bf16;
  quant::WireFormat format{};                 // e4m3, fp32 scales, block 128, nearest
  // Which kernels: any of "quantize", "dequantize", "reduce", "reduce_requant", "naive"; empty = all.
  std::vector<std::string> kernels;
  uint32_t work_per_cta = 0;                 // quant::LaunchOptions::work_per_cta (0 = launcher's choice)
  uint32_t kernel_variant = 0;               // quant::LaunchOptions::kernel_variant (0 = production)
  std::string json_path;                      // write the results as JSON when non-empty
  bool print_table = true;
};

// Runs the benchmark on the current CUDA device. Returns 0 on success, 1 when a correctness check
// failed, 2 on bad options or a CUDA error (each reported on stderr with what was wrong).
int run_kernel_bench(const KernelBenchOptions& options);

}  // namespace fp8wire::bench
