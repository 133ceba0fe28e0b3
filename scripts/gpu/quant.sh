#!/usr/bin/env bash
# GPU tier of the codec; run from the repo root with the build in build/:
#   1. test_quant_ref   the CPU reference's own tests (sanity on this machine);
#   2. test_quant_gpu   every kernel x dtype x format x scale x block x rounding x conversion path x
#                       odd counts against the CPU reference, bit for bit; fused reduce k=1..64 also
#                       vs fp64; CUDA graph replay; prints the bit-exactness matrix;
#   3. fp8wire-kernel-bench  GB/s against the same GPU's measured copy bandwidth, fused vs naive,
#                       software vs native, 1 MiB quantize latency, bytes on the wire per format;
#   4. error_bounds     the error table for the docs.
# Detailed logs and kernels.json under $OUT (or a temp dir). Ends with a summary; exit 0 only if
# every correctness check passed (performance targets print PASS/FAIL lines but do not fail the run).
# QUANT_QUICK=1 runs test_quant_gpu --quick (small counts only).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
out="${OUT:-$(mktemp -d /tmp/fp8wire-quant.XXXXXX)}"
mkdir -p "$out"
bin=build/tests/quant
declare -a rows=()
status=0

for t in test_quant_ref test_quant_gpu fp8wire-kernel-bench error_bounds; do
  if [[ ! -x "$bin/$t" ]]; then
    echo "FAIL $bin/$t not built (cmake --build build --target $t)"
    exit 1
  fi
done

run() {   # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if (( rc == 0 )); then rows+=("PASS  $name (${dt}s)"); else rows+=("FAIL  $name rc=$rc (${dt}s, see $out/$name.log)"); status=1; fi
  return $rc
}

run test_quant_ref 60 "$bin/test_quant_ref"
quick=(); [[ "${QUANT_QUICK:-0}" == 1 ]] && quick=(--quick)
run test_quant_gpu 150 "$bin/test_quant_gpu" "${quick[@]}"
run kernel_bench 120 "$bin/fp8wire-kernel-bench" --sizes 1MiB,16MiB,64MiB,256MiB --k 8 --repeats 30 \
    --json "$out/kernels.json"
"$bin/error_bounds" 262144 > "$out/error_bounds.md" 2>&1 || true

echo "================ quant: details in $out ================"
echo "## test_quant_gpu"
# The matrix is long; show failing rows (if any) and the totals.
grep -E "^FAIL" "$out/test_quant_gpu.log" | head -20
grep -E "^(device:|PASS: test_quant_gpu|FAIL: test_quant_gpu|SKIPPED)" "$out/test_quant_gpu.log"
awk '/bit-exactness matrix/{on=1} on' "$out/test_quant_gpu.log" | grep -E "^(reduce ->|quantize bf16 e4m3/fp32|dequantize bf16 e4m3/fp32|graph|bad)" | head -12
echo
sed -n '/^## fp8wire codec kernels/,$p' "$out/kernel_bench.log"
grep -E "^(PASS|FAIL): " "$out/kernel_bench.log"
echo
echo "## summary"
printf '%s\n' "${rows[@]}"
exit $status
