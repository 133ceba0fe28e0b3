#!/usr/bin/env bash
# GPU tier of the codec; run from the repo root with the build in build/:
#   1. test_quant_ref   the CPU reference's own tests (sanity on this machine);
#   2. test_quant_gpu   every kernel x dtype x format x scale x block x rounding x conversion path x
#                       odd counts against the CPU reference, bit for bit; fused reduce k=1..64 also
#                       vs fp64; CUDA graph replay; prints the bit-exactness matrix;
#   3. fp8wire-kernel-bench  GB/s against the same GPU's measured copy bandwidth, fused vs naive,
#                       software vs native, 1 MiB quantize latency, bytes on the wire per format;
#   4. error_bounds     the error table for the docs.
# Detailed logs and kernels.json under $OUT (default out/quant). Ends with a summary; exit 0 only if
# every correctness check passed (performance targets print PASS/FAIL lines but do not fail the run).
# QUANT_QUICK=1 runs test_quant_gpu --quick (small counts only).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_out quant
bin=build/tests/quant
gpu_step_show  # the details are printed below

for t in test_quant_ref test_quant_gpu fp8wire-kernel-bench error_bounds; do
  if [[ ! -x "$bin/$t" ]]; then
    echo "FAIL $bin/$t not built (cmake --build build --target $t)"
    exit 1
  fi
done

gpu_step test_quant_ref 60 "$bin/test_quant_ref"
quick=(); [[ "${QUANT_QUICK:-0}" == 1 ]] && quick=(--quick)
gpu_step test_quant_gpu 150 "$bin/test_quant_gpu" "${quick[@]}"
gpu_step kernel_bench 120 "$bin/fp8wire-kernel-bench" --sizes 1MiB,16MiB,64MiB,256MiB --k 8 --repeats 30 \
    --json "$OUT/kernels.json"
"$bin/error_bounds" 262144 > "$OUT/error_bounds.md" 2>&1 || true

echo "================ quant: details in $OUT ================"
echo "## test_quant_gpu"
# The matrix is long; show failing rows (if any) and the totals.
grep -E "^FAIL" "$OUT/test_quant_gpu.log" | head -20
grep -E "^(device:|PASS: test_quant_gpu|FAIL: test_quant_gpu|SKIPPED)" "$OUT/test_quant_gpu.log"
awk '/bit-exactness matrix/{on=1} on' "$OUT/test_quant_gpu.log" | grep -E "^(reduce ->|quantize bf16 e4m3/fp32|dequantize bf16 e4m3/fp32|graph|bad)" | head -12
echo
sed -n '/^## fp8wire codec kernels/,$p' "$OUT/kernel_bench.log"
grep -E "^(PASS|FAIL): " "$OUT/kernel_bench.log"
echo
gpu_summary quant
