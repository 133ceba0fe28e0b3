#!/usr/bin/env bash
# GPU tier of the shim (run from the repo root, build in build/):
#   1. the shim's CPU tests (fake NCCL: resolution paths, exact forwarding, re-entry, config errors,
#      exported symbols, pass-through cost) on this machine too;
#   2. tests/shim/torch_passthrough.py: a 2-rank PyTorch job on one GPU gives bitwise the same
#      results without the shim, with it disabled, and with it enabled but nothing eligible.
# Detailed logs under $OUT/shim when OUT is set. Ends with a summary table; exit 0 only if all pass.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
out="${OUT:-$(mktemp -d /tmp/fp8wire-shim.XXXXXX)}/shim"
mkdir -p "$out"
python="$PY"
shim=build/shim/libfp8wire.so
declare -a rows=()
status=0

if [[ ! -f "$shim" ]]; then
  echo "FAIL $shim not built (cmake --build build --target fp8wire test_shim test_config)"
  exit 1
fi

# 1. CPU tests, here against this machine's loader and libraries.
for t in tests/common/test_config tests/shim/test_shim; do
  if timeout 120 "build/$t" >"$out/$(basename $t).log" 2>&1; then
    rows+=("PASS  $t")
  else
    rows+=("FAIL  $t (see $out/$(basename $t).log)")
    status=1
  fi
done
grep -m1 -A3 'configuration  *direct (ns)' "$out/test_shim.log" > "$out/overhead.txt" || true

# 2. PyTorch pass-through, bitwise.
if timeout 170 "$python" tests/shim/torch_passthrough.py --shim "$shim" --out "$out/torch" --timeout 50 \
    >"$out/torch.log" 2>&1; then
  rows+=("PASS  torch_passthrough.py (baseline == disabled == enabled, bitwise)")
else
  rows+=("FAIL  torch_passthrough.py (see $out/torch.log)")
  status=1
fi

echo "---- details: torch_passthrough.py ----"
sed -n '/==== shim GPU tier/,$p' "$out/torch.log"
if [[ ! -s "$out/torch.log" ]] || ! grep -q '==== shim GPU tier' "$out/torch.log"; then tail -40 "$out/torch.log"; fi
echo "---- pass-through cost (ns per ncclAllReduce, CPU time) ----"
cat "$out/overhead.txt" 2>/dev/null
echo
echo "==== scripts/gpu/shim.sh summary ===="
printf '%s\n' "${rows[@]}"
echo "logs: $out"
exit $status
