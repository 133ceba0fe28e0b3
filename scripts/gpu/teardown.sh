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
gpu_mps_start

if has faults; then
  gpu_step direct_faults 150 "$BUILD"/tests/sched/direct_faults_gpu
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
gpu_summary teardown
