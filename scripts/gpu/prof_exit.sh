#!/usr/bin/env bash
# The exposure profiler keeps every completed step when a job ends without exit()
# (scripts/gpu/all.sh prof_exit, ~30 s): tests/profiler/exit_job.py runs 12 short steps under
# fp8wire-prof and ends by a normal exit, os._exit, SIGTERM with the default action, and SIGTERM
# with a Python handler. Each must leave a per-rank report with all 12 steps and a summary line; the
# SIGTERM job must still die by SIGTERM (status 143) and the handler job exit 3 after its handler ran.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_out prof-exit
build="$BUILD"
prof="$build/profiler/fp8wire-prof"
gpu_require "$prof" "$build/profiler/libfp8wire_prof.so"
steps=12
rows=()
fails=0
for mode in exit os_exit sigterm sigterm_handler; do
  d="$OUT/$mode"
  rm -rf "$d"
  timeout -k 5 60 "$prof" --out "$d" -- "$PY" tests/profiler/exit_job.py "$mode" "$steps" > "$d.log" 2>&1
  rc=$?
  reported=$(cat "$d"/*.jsonl 2>/dev/null | grep -c '"type":"step"')
  summaries=$(cat "$d"/*.jsonl 2>/dev/null | grep -c '"type":"summary"')
  job_status=$(grep -o "the job exited with status [0-9]*" "$d.log" | grep -o "[0-9]*$")
  job_status=${job_status:-0}
  case $mode in
    sigterm) want_status=143 ;;
    sigterm_handler) want_status=3 ;;
    *) want_status=0 ;;
  esac
  ok=1
  (( reported == steps && summaries >= 1 && job_status == want_status )) || ok=0
  [[ $mode == sigterm_handler ]] && ! grep -q "handler ran" "$d.log" && ok=0
  (( ok )) || fails=$((fails + 1))
  rows+=("$(printf '%-16s %s  steps reported %s/%s, summary lines %s, job status %s (expected %s), fp8wire-prof rc=%s' \
    "$mode" "$( ((ok)) && echo PASS || echo FAIL)" "$reported" "$steps" "$summaries" "$job_status" "$want_status" "$rc")")
  (( ok )) || tail -n 15 "$d.log"
done
echo "==================== profiler exit summary ===================="
printf '%s\n' "${rows[@]}"
echo "prof_exit: $fails FAIL"
exit $(( fails > 0 ))
