#!/usr/bin/env bash
# The same commands on both testbeds of one GPU (scripts/gpu/all.sh testbed_figures, ~2 min): bf16
# all-reduce as fp8wire-bench times it, at 2 and 4 emulated ranks, 64 and 256 MiB, for plain NCCL
# (pass-through), fp8wire over NCCL's transports (two-shot, one-shot) and fp8wire's direct transport
# over shared host memory (NCCL_P2P_DISABLE=1 makes `--transport both` pick host memory), first
# time-sliced (FP8WIRE_MPS=0: the ranks' kernels take turns on the GPU) and then side by side under a
# private MPS daemon. Each sweep's table and JSON (machine.testbed says which) land under $OUT; the
# table printed last puts the two testbeds side by side. TESTBED_FIGURE_MODES picks testbeds (default
# "time-sliced mps"); SWEEP_LIMIT bounds each sweep (default 90 s; time-sliced 4-rank sweeps need more).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_out testbed-figures
unset FP8WIRE_TESTBED_MODE CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY  # each sweep's launcher owns its daemon
bench="$BUILD/bench/fp8wire-bench"
nccl_dir="$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)/lib"
export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
failed=0
for mode in ${TESTBED_FIGURE_MODES:-time-sliced mps}; do
  for n in 2 4; do
    label="ar${n}_${mode}"
    s=$(date +%s)
    FP8WIRE_MPS=$([[ $mode == mps ]] && echo 1 || echo 0) NCCL_P2P_DISABLE=1 timeout -k 5 "${SWEEP_LIMIT:-90}" \
      "$bench" sweep --emulate-ranks "$n" --transport both --collectives all_reduce --dtypes bf16 \
      --paths passthrough,two_shot,one_shot --min 64MiB --max 256MiB --step 4 --warmup 1 --repeats 3 \
      --buffers 2 --timeout "$(( ${SWEEP_LIMIT:-90} - 5 ))" --out "$OUT/$label" --json "$OUT/$label.json" \
      > "$OUT/$label.log" 2>&1
    rc=$?
    echo "== $label rc=$rc ($(( $(date +%s) - s )) s): $(grep -m1 'fp8wire launcher' "$OUT/$label.log")"
    (( rc == 0 )) || { failed=1; tail -n 8 "$OUT/$label.log"; }
  done
done
"$PY" - "$OUT" <<'PYEOF'
import json, os, sys
out = sys.argv[1]
def load(label):
    p = os.path.join(out, label + ".json")
    if not os.path.exists(p):
        return {}, "?"
    d = json.load(open(p))
    best = {}
    for pt in d.get("points", []):
        if pt.get("collective") != "all_reduce" or pt.get("error"):
            continue
        path, transport = pt.get("path", ""), pt.get("transport", "nccl") or "nccl"
        kind = "nccl" if path == "passthrough" else ("direct" if transport not in ("nccl", "") else "fp8_nccl")
        key = (pt.get("bytes"), kind)
        t = (pt.get("time_us") or {}).get("median")
        if t is not None and (key not in best or t < best[key][0]):
            best[key] = (t, path)
    return best, d.get("machine", {}).get("testbed", "?")
print("\nbf16 all-reduce, ms (best FP8 path per transport); ratios against plain NCCL in the same run")
print(f"{'ranks':>5} {'size':>8} | {'testbed':<12} {'plain NCCL':>10} {'FP8 over NCCL':>18} {'FP8 direct host mem':>24}")
for n in (2, 4):
    for mode in ("time-sliced", "mps"):
        best, testbed = load(f"ar{n}_{mode}")
        for size in sorted({k[0] for k in best}):
            nccl = best.get((size, "nccl"), (None,))[0]
            def cell(kind):
                v = best.get((size, kind))
                if not v or not nccl:
                    return "-"
                return f"{v[0] / 1e3:.2f} ({nccl / v[0]:.2f}x {v[1]})"
            print(f"{n:>5} {size / 2**20:>6.0f}Mi | {testbed:<12} {nccl / 1e3 if nccl else float('nan'):>10.2f} "
                  f"{cell('fp8_nccl'):>18} {cell('direct'):>24}")
PYEOF
exit $failed
