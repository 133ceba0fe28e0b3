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
# one; TEARDOWN_PARTS (default "faults torch mainjob") picks parts.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-$PWD/out/teardown}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
summary=(); failed=0; t0=$(date +%s)
gpu_run() {  # gpu_run <label> <limit s> <command...>
  local label="$1" limit="$2"; shift 2
  local s=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$OUT/$label.log" 2>&1
  local rc=$?
  grep -E "^(PASS|FAIL|SKIPPED)" "$OUT/$label.log" | tail -n 30
  summary+=("$(printf '%-34s rc=%-3s %4ss' "$label" "$rc" "$(( $(date +%s) - s ))")")
  if (( rc != 0 )); then failed=1; echo "---- $label rc=$rc, log tail:"; tail -n 20 "$OUT/$label.log"; fi
}
gpu_summary() {
  echo "================ $1 summary ($(( $(date +%s) - t0 )) s, $TESTBED_MODE) ================"
  for line in "${summary[@]}"; do echo "$line"; done
  if (( failed )); then echo "${1^^}: FAIL"; return 1; fi
  echo "${1^^}: PASS"
}
# A private MPS daemon (its own pipe and log folders; never a daemon the user runs): the emulated ranks'
# kernels then run side by side instead of taking turns. FP8WIRE_MPS=0 leaves it off.
mps_pipe=""
mps_start() {
  export TESTBED_MODE="time-sliced"
  [[ "${FP8WIRE_MPS:-1}" != 0 ]] && command -v nvidia-cuda-mps-control >/dev/null || return 0
  mps_pipe="$(mktemp -d /tmp/fp8wire-mps.XXXXXX)"; mkdir -p "$mps_pipe/log"
  if CUDA_MPS_PIPE_DIRECTORY="$mps_pipe" CUDA_MPS_LOG_DIRECTORY="$mps_pipe/log" nvidia-cuda-mps-control -d; then
    export CUDA_MPS_PIPE_DIRECTORY="$mps_pipe" CUDA_MPS_LOG_DIRECTORY="$mps_pipe/log"
    TESTBED_MODE="side by side (private MPS daemon)"
  else
    rm -rf "$mps_pipe"; mps_pipe=""
  fi
  echo "testbed: emulated ranks $TESTBED_MODE"
}
mps_stop() {
  [[ -n "$mps_pipe" ]] || return 0
  echo quit | CUDA_MPS_PIPE_DIRECTORY="$mps_pipe" nvidia-cuda-mps-control >/dev/null 2>&1
  cp -r "$mps_pipe/log" "$OUT/mps-log" 2>/dev/null; rm -rf "$mps_pipe"; mps_pipe=""
}
parts="${TEARDOWN_PARTS:-faults torch mainjob}"
has() { [[ " $parts " == *" $1 "* ]]; }
mps_start
trap mps_stop EXIT

if has faults; then
  gpu_run direct_faults 150 build/tests/sched/direct_faults_gpu
fi
if has torch; then
  gpu_run torch_teardown 280 "$PY" tests/integration/test_teardown.py --shim build/shim/libfp8wire.so \
    --out "$OUT" --timeout 120
fi
if has mainjob; then
  gpu_run mainjob_direct_host_memory 420 env SKIP_BUILD=1 STEPS="${TEARDOWN_STEPS:-20}" MAIN_OUT="$OUT/main-job" \
    FP8WIRE_DIRECT_TRANSPORT=host_memory FP8WIRE_DIRECT_ASSUME_ONE_HOST=1 bash scripts/main-job.sh
  tail -n 25 "$OUT/mainjob_direct_host_memory.log"
fi
gpu_summary teardown
