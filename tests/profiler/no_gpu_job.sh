#!/bin/sh
# fp8wire-prof running a job where no GPU is visible (CUDA_VISIBLE_DEVICES= hides any): one line
# saying the profiler recorded nothing, and the job's own exit status, whatever it is.
#   no_gpu_job.sh FP8WIRE_PROF OUT_DIR
prof=$1
out=$2
fail() { echo "no_gpu_job: $*"; exit 1; }
for status in 0 3; do
  log=$(CUDA_VISIBLE_DEVICES="" "$prof" --out "$out" -- sh -c "echo job ran; exit $status" 2>&1)
  rc=$?
  printf '%s\n' "$log"
  [ "$rc" -eq "$status" ] || fail "exit status $rc for a job that exited $status"
  case $log in *"job ran"*) ;; *) fail "the job did not run" ;; esac
  n=$(printf '%s\n' "$log" | grep -c "fp8wire-prof: no GPU: the profiler recorded nothing")
  [ "$n" -eq 1 ] || fail "expected the no-GPU line once, got it $n times"
  case $log in *"no per-rank reports"*) fail "a missing report was reported as an error" ;; esac
  # Where there is no driver at all (CI), no process may warn about CUPTI either.
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
    case $log in *CUPTI*) fail "CUPTI warnings on a machine without a driver" ;; esac
  fi
done
echo "no_gpu_job: ok"
