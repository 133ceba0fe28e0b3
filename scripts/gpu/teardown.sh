#!/usr/bin/env bash
# GPU checks of the direct transports at the end of a job (scripts/gpu/all.sh teardown; build in build/):
#   1. tests/sched/direct_faults_gpu: a peer killed mid-collective or absent (an error or the abort's
#      release, never a hang; a destroy instead of the abort returns an error), a peer that exited or
#      destroyed its communicator while nothing waits on it (no error), for both direct kinds;
#   2. tests/integration/test_teardown.py: a PyTorch job whose ranks finish and end at different times
#      exits 0 under plain NCCL, fp8wire over NCCL and both direct kinds;
#   3. the main job (scripts/main-job.sh) with the direct transport over host memory: it must exit 0,
#      and its comparison and exposure reports land in $OUT/main-job.
#   4. tests/sched/setup_faults_gpu: a peer killed or stopped at each point of a communicator's
#      set-up (2 and 4 ranks, both direct kinds: every other rank's creation fails within the deadline),
#      a job after a killed one (its /dev/shm leftovers swept, nothing left), a /dev/shm too small for
#      the windows (every rank on NCCL alike);
#   5. with TEARDOWN_REPEAT=N (and TEARDOWN_PARALLEL=k series at once): the torch row "direct host memory: rank 1 ends first by destroy" (a hang
#      was seen there once) and its neighbours N times each, under MPS and then time-sliced, counting
#      the failures; a rank that stalls prints its state (tests/integration/test_teardown.py).
# Every part runs with the emulated ranks side by side under a private MPS daemon where the machine has
# one (scripts/gpu/lib.sh); TEARDOWN_PARTS (default "faults setup torch mainjob", plus "repeat" when
# TEARDOWN_REPEAT is set) picks parts.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_out teardown
parts="${TEARDOWN_PARTS:-faults setup torch mainjob${TEARDOWN_REPEAT:+ repeat}}"
has() { [[ " $parts " == *" $1 "* ]]; }
gpu_mps_start

if has faults; then
  gpu_step direct_faults 150 "$BUILD"/tests/sched/direct_faults_gpu
fi
if has setup; then
  gpu_step setup_faults 900 "$BUILD"/tests/sched/setup_faults_gpu
fi
if has torch; then
  gpu_step torch_teardown 280 "$PY" tests/integration/test_teardown.py --shim "$BUILD"/shim/libfp8wire.so \
    --out "$OUT" --timeout 120
fi
if has mainjob; then
  gpu_step mainjob_direct_host_memory 420 env SKIP_BUILD=1 STEPS="${TEARDOWN_STEPS:-20}" MAIN_OUT="$OUT/main-job" \
    FP8WIRE_DIRECT_TRANSPORT=host_memory FP8WIRE_DIRECT_ASSUME_ONE_HOST=1 bash scripts/main-job.sh
  tail -n 25 "$OUT/mainjob_direct_host_memory.log"
fi
if has repeat; then
  n="${TEARDOWN_REPEAT:-10}"
  k="${TEARDOWN_PARALLEL:-1}"
  # Four rows of about 15 s each, n times, under the private MPS daemon, then time-sliced (no daemon).
  # TEARDOWN_PARALLEL=k runs k such series at once (k jobs of 2 ranks sharing the GPU and the CPUs: more
  # runs per minute, and a busier machine than any one job sees).
  repeat_series() {  # repeat_series LABEL ENV...: k series side by side, one gpu_step each
    local label="$1" i; shift
    for (( i = 1; i <= k; i++ )); do
      gpu_step "${label}_$i" $((n * 4 * 45 + 60)) env "$@" "$PY" tests/integration/test_teardown.py \
        --shim "$BUILD"/shim/libfp8wire.so --out "$OUT/${label}_$i" --timeout 120 --repeat "$n" &
    done
    wait
  }
  repeat_series torch_teardown_repeat_mps FP8WIRE_TESTBED_MODE=mps
  repeat_series torch_teardown_repeat_time_sliced -u CUDA_MPS_PIPE_DIRECTORY -u CUDA_MPS_LOG_DIRECTORY \
    FP8WIRE_MPS=0 FP8WIRE_TESTBED_MODE=time-sliced
  # gpu_step ran in subshells: its rows and verdicts are in the logs, counted here.
  grep -h "repeated" "$OUT"/torch_teardown_repeat_*.log | sed 's/^/  /'
  grep -qE "^FAIL" "$OUT"/torch_teardown_repeat_*.log && gpu_fail "a repeated teardown row failed (its log above)"
fi
gpu_summary teardown
