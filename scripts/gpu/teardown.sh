#!/usr/bin/env bash
# GPU checks of the direct transports at the end of a job (scripts/gpu/all.sh teardown; build in build/):
#   1. tests/sched/direct_faults_gpu: a peer killed mid-collective or absent (an error or the abort's
#      release, never a hang), a peer that exited or destroyed its communicator while nothing waits on
#      it (no error), for both direct kinds;
#   2. tests/integration/test_teardown.py: a PyTorch job whose ranks finish and end at different times
#      exits 0 under plain NCCL, fp8wire over NCCL and both direct kinds;
#   3. the main job (scripts/main-job.sh) with the direct transport over host memory: it must exit 0,
#      and its comparison and exposure reports land in $OUT/main-job.
# Every part runs with the emulated ranks side by side under a private MPS daemon where the machine has
# one (scripts/gpu/lib.sh); TEARDOWN_PARTS (default "faults torch mainjob") picks parts.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_out teardown
parts="${TEARDOWN_PARTS:-faults torch mainjob}"
has() { [[ " $parts " == *" $1 "* ]]; }
summary=(); failed=0; t0=$(date +%s)
gpu_run() {  # gpu_run <label> <limit s> <command...>
  local label="$1" limit="$2"; shift 2
  local s; s=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$OUT/$label.log" 2>&1
  local rc=$?
  grep -E "^(PASS|FAIL|SKIPPED)" "$OUT/$label.log" | tail -n 30
  summary+=("$(printf '%-34s rc=%-3s %4ss' "$label" "$rc" "$(( $(date +%s) - s ))")")
  if (( rc != 0 )); then failed=1; echo "---- $label rc=$rc, log tail:"; tail -n 20 "$OUT/$label.log"; fi
}
gpu_mps_start

if has faults; then
  gpu_run direct_faults 150 "$BUILD"/tests/sched/direct_faults_gpu
fi
if has torch; then
  gpu_run torch_teardown 280 "$PY" tests/integration/test_teardown.py --shim "$BUILD"/shim/libfp8wire.so \
    --out "$OUT" --timeout 120
fi
if has mainjob; then
  gpu_run mainjob_direct_host_memory 420 env SKIP_BUILD=1 STEPS="${TEARDOWN_STEPS:-20}" MAIN_OUT="$OUT/main-job" \
    FP8WIRE_DIRECT_TRANSPORT=host_memory FP8WIRE_DIRECT_ASSUME_ONE_HOST=1 bash scripts/main-job.sh
  tail -n 25 "$OUT/mainjob_direct_host_memory.log"
fi
echo "================ teardown summary ($(( $(date +%s) - t0 )) s, testbed $FP8WIRE_TESTBED_MODE) ================"
for line in "${summary[@]}"; do echo "$line"; done
if (( failed )); then echo "TEARDOWN: FAIL"; exit 1; fi
echo "TEARDOWN: PASS"
