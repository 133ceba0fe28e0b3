#!/usr/bin/env bash
# GPU tier of the shim (run from the repo root, build in build/):
#   1. the shim's CPU tests (fake NCCL: resolution paths, exact forwarding, re-entry, config errors,
#      exported symbols, pass-through cost) on this machine too;
#   2. tests/shim/torch_passthrough.py: a 2-rank PyTorch job on one GPU gives bitwise the same
#      results without the shim, with it disabled, and with it enabled but nothing eligible.
# Detailed logs under $OUT (default out/shim). Ends with a summary table; exit 0 only if all pass.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
gpu_out shim
shim=build/shim/libfp8wire.so

if [[ ! -f "$shim" ]]; then
  echo "FAIL $shim not built (cmake --build build --target fp8wire test_shim test_config)"
  exit 1
fi

# 1. CPU tests, here against this machine's loader and libraries.
for t in tests/common/test_config tests/shim/test_shim; do
  gpu_step "$(basename "$t")" 120 "build/$t"
done
grep -m1 -A3 'configuration  *direct (ns)' "$OUT/test_shim.log" > "$OUT/overhead.txt" || true

# 2. PyTorch pass-through, bitwise.
gpu_step_show  # its report is printed below
gpu_step torch 170 "$PY" tests/shim/torch_passthrough.py --shim "$shim" --out "$OUT/torch" --timeout 50

echo "---- details: torch_passthrough.py ----"
sed -n '/==== shim GPU tier/,$p' "$OUT/torch.log"
if [[ ! -s "$OUT/torch.log" ]] || ! grep -q '==== shim GPU tier' "$OUT/torch.log"; then tail -40 "$OUT/torch.log"; fi
echo "---- pass-through cost (ns per ncclAllReduce, CPU time) ----"
cat "$OUT/overhead.txt" 2>/dev/null
echo
gpu_summary shim
