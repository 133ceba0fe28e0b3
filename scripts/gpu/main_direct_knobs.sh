#!/usr/bin/env bash
# The main job's direct run (pi05_small, 2 ranks on one GPU, fp8wire's direct transport over host
# memory, as scripts/main-job.sh runs it, without the profiler) once per variant below: environment
# overrides of the launcher's thread share and of configuration keys. Prints each run's summary line
# (the trainer's mean step over the steps after warm-up), then the shim's host time per FP8 call from
# the debug run's log (from entering the call to its return: how much of a host-bound step the library itself takes).
# Env: STEPS (default 15), MAIN_KNOBS_VARIANTS (labels from the list below, default all).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_out main_direct_knobs
gpu_mps_start

# label | env overrides ("-" for none)
variants=(
  "default|-"
  "omp1|OMP_NUM_THREADS=1"
  "omp2|OMP_NUM_THREADS=2"
  "omp8|OMP_NUM_THREADS=8"
  "omp_all|OMP_NUM_THREADS=$(nproc)"
  "kernels|FP8WIRE_DIRECT_PROTOCOL=kernels"
  "sets2_kernels|FP8WIRE_DIRECT_PROTOCOL=kernels FP8WIRE_DIRECT_SETS=2"
  "shared_max_stages8|FP8WIRE_COST_MODEL_PCIE_DIRECT_SHARED_MAX_STAGES=8"
  "debug|FP8WIRE_LOG_LEVEL=debug"
)
wanted="${MAIN_KNOBS_VARIANTS:-}"
status=0
for entry in "${variants[@]}"; do
  label="${entry%%|*}"; envs="${entry#*|}"; [[ "$envs" == "-" ]] && envs=""
  [[ -n "$wanted" && " $wanted " != *" $label "* ]] && continue
  log="$OUT/$label.log"
  # shellcheck disable=SC2086  # envs: space-separated assignments
  env $envs FP8WIRE_DIRECT_TRANSPORT=host_memory FP8WIRE_DIRECT_ASSUME_ONE_HOST=1 \
    FP8WIRE_GATHER_TRANSPORT="${FP8WIRE_GATHER_TRANSPORT:-sendrecv}" LD_PRELOAD="$PWD/$BUILD/shim/libfp8wire.so" \
    "$BUILD/trainer/fp8wire-train" --config trainer/configs/pi05_small.toml --ranks 2 --steps "${STEPS:-15}" \
    --set "train.out_dir=$OUT/$label/train" > "$log" 2>&1
  rc=$?
  (( rc == 0 )) || status=1
  echo "== $label ${envs:-(defaults)}: rc=$rc"
  grep -E "^summary|^fp8wire launcher" "$log"
done

if [[ -f "$OUT/debug.log" ]]; then
  echo "== the shim's host time per FP8 call (debug run)"
  "$PY" - "$OUT/debug.log" <<'PYEOF'
import re, sys
by_rank = {}
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"\[rank (\d+)\].* ([0-9.]+) us on the host", line)
    if m:
        by_rank.setdefault(m.group(1), []).append(float(m.group(2)))
for rank, v in sorted(by_rank.items()):
    v.sort()
    print(f"rank {rank}: {len(v)} FP8 calls, host time per call median {v[len(v) // 2]:.0f} us, "
          f"p90 {v[int(len(v) * 0.9)]:.0f} us, max {v[-1]:.0f} us")
PYEOF
fi
exit $status
