# The preamble every GPU script sources (never run on its own):
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"     (from scripts/gpu/<area>.sh)
# It sets: strict mode without -e (each script collects its checks' exit codes itself), the working
# directory (the repository root), BUILD (FP8WIRE_BUILD, default build), PY (python with torch:
# TORCH_PYTHON, PYTHON, .venv/bin/python, else python3), CUDA's bin on PATH, and the environment every
# GPU run shares: NVLink SHARP and multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
# NVSHMEM_DISABLE_NVLS=1), which machines that only emulate ranks or lack the fabric manager cannot use.
#   gpu_out NAME          OUT=${OUT:-$PWD/out/NAME}, created
#   gpu_require FILE...   each FILE built, else one FAIL line naming it (and how to build) and exit 1
#   gpu_mps_start         ranks emulated on one GPU run side by side under a private MPS daemon (see
#                         below); call it in a script whose ranks share a GPU. Stopped at exit.
# and each script's checks, counted alike:
#   gpu_step LABEL LIMIT COMMAND...
#                         one check: COMMAND under `timeout LIMIT` (seconds), its output in
#                         $OUT/LABEL.log. Prints the log's verdict lines (those the gpu_step_show
#                         pattern matches; never doctest's per-case "PASS n="), adds a row to
#                         gpu_rows (its PASS / FAIL / SKIPPED lines counted, doctest's case counts
#                         where the log has them), and where the command failed (any exit but 0, a
#                         time-out's 124 included) sets gpu_failed=1 and prints the log's last lines.
#                         Returns the command's exit code.
#   gpu_step_show [ERE]   which log lines gpu_step prints: by default PASS / FAIL / SKIPPED lines;
#                         no argument prints none (for scripts that print their own report)
#   gpu_fail TEXT         a check that failed without running (a program not built): a row, gpu_failed=1
#   gpu_summary NAME      the rows under one heading (the script's seconds, the testbed), then
#                         "NAME: PASS" and exit 0, or "NAME: FAIL" and exit 1
# The MPS daemon: when nvidia-cuda-mps-control is on PATH and FP8WIRE_MPS is not 0, a daemon of our own
# (its own pipe and log directories in a fresh temporary directory, never the default ones, so a daemon
# the user runs is not touched), started with `nvidia-cuda-mps-control -d` and sent `quit` on exit
# (trap). The script's processes get CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY and
# FP8WIRE_TESTBED_MODE=mps; fp8wire's launchers below it (fp8wire-bench, fp8wire-train, the tests)
# join that daemon instead of starting their own. Otherwise FP8WIRE_TESTBED_MODE=time-sliced. Either
# way one line says which ("testbed: ..."). The same protocol as common/mps_daemon.hpp.
# shellcheck shell=bash
set -uo pipefail
FP8WIRE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$FP8WIRE_ROOT" || exit 1
# shellcheck disable=SC2034  # BUILD and PY are for the scripts that source this file
BUILD="${FP8WIRE_BUILD:-build}"
# shellcheck disable=SC2034
if [[ -n "${TORCH_PYTHON:-}" ]]; then PY="$TORCH_PYTHON"
elif [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -x .venv/bin/python ]] && .venv/bin/python -c 'import torch' 2>/dev/null; then PY="$FP8WIRE_ROOT/.venv/bin/python"
else PY=python3; fi
export PATH="/usr/local/cuda/bin:$PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

gpu_out() {  # gpu_out NAME: the results folder
  OUT="${OUT:-$PWD/out/$1}"
  mkdir -p "$OUT"
  export OUT
}

gpu_require() {  # gpu_require FILE...: what the script runs, built
  local f
  for f in "$@"; do
    [[ -e "$f" ]] || { echo "FAIL: $f is missing (build first: scripts/build.sh $BUILD)"; exit 1; }
  done
}

_gpu_mps_dir=""
_gpu_mps_control=""

gpu_mps_stop() {
  if [[ -n "$_gpu_mps_dir" ]]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$_gpu_mps_dir/pipe" CUDA_MPS_LOG_DIRECTORY="$_gpu_mps_dir/log" \
      "$_gpu_mps_control" >/dev/null 2>&1 ||
      echo "testbed: stopping the private MPS daemon ($_gpu_mps_dir/pipe) failed" >&2
    rm -rf "$_gpu_mps_dir"
    _gpu_mps_dir=""
  fi
}

gpu_mps_start() {
  local why
  if [[ "${FP8WIRE_MPS:-1}" == 0 ]]; then
    why="FP8WIRE_MPS=0"
  elif [[ "${FP8WIRE_MPS:-1}" != 1 ]]; then
    why="FP8WIRE_MPS='$FP8WIRE_MPS' is not 0 or 1; taken as 0"
  elif [[ "${FP8WIRE_TESTBED_MODE:-}" == mps && -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]]; then
    echo "testbed: ranks side by side under a private MPS daemon (the enclosing script's, $CUDA_MPS_PIPE_DIRECTORY)"
    return 0
  elif ! _gpu_mps_control="$(command -v nvidia-cuda-mps-control)"; then
    why="nvidia-cuda-mps-control not found on PATH"
  else
    _gpu_mps_dir="$(mktemp -d "${TMPDIR:-/tmp}/fp8wire-mps-XXXXXX")"
    mkdir -m 700 "$_gpu_mps_dir/pipe" "$_gpu_mps_dir/log"
    trap gpu_mps_stop EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    if CUDA_MPS_PIPE_DIRECTORY="$_gpu_mps_dir/pipe" CUDA_MPS_LOG_DIRECTORY="$_gpu_mps_dir/log" \
         "$_gpu_mps_control" -d; then
      export CUDA_MPS_PIPE_DIRECTORY="$_gpu_mps_dir/pipe" CUDA_MPS_LOG_DIRECTORY="$_gpu_mps_dir/log"
      export FP8WIRE_TESTBED_MODE=mps
      echo "testbed: ranks side by side under a private MPS daemon (pipe directory $CUDA_MPS_PIPE_DIRECTORY)"
      return 0
    fi
    why="the private MPS daemon did not start ($_gpu_mps_control -d failed; its log: $(tail -c 300 "$_gpu_mps_dir/log/control.log" 2>/dev/null || true))"
    rm -rf "$_gpu_mps_dir"
    _gpu_mps_dir=""
  fi
  export FP8WIRE_TESTBED_MODE=time-sliced
  echo "testbed: time-sliced ($why)"
}

gpu_rows=()
gpu_failed=0
_gpu_t0=$(date +%s)
_gpu_step_show='^(PASS|FAIL|SKIPPED)'

gpu_step_show() {
  _gpu_step_show="${1-}"
}

gpu_step() {
  local label="$1" limit="$2"; shift 2
  local log="$OUT/$label.log" s rc
  s=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$log" 2>&1
  rc=$?
  [[ -n "$_gpu_step_show" ]] && grep -E "$_gpu_step_show" "$log" | grep -vE "^PASS n=" | tail -n 30
  local verdict=PASS doctest
  (( rc == 0 )) || verdict=FAIL
  # doctest programs print no PASS lines: their own summaries, summed, say what ran.
  doctest=$(awk '/^\[doctest\] test cases:/ { gsub(/\|/, " "); n += $4; p += $5; f += $7; seen = 1 }
                 END { if (seen) printf "; doctest: %d of %d cases passed, %d failed", p, n, f }' "$log")
  gpu_rows+=("$(printf '%-4s %-40s rc=%-3s %4ss  %s pass, %s fail, %s skipped%s%s' "$verdict" "$label" "$rc" \
    "$(( $(date +%s) - s ))" "$(grep -E '^PASS' "$log" | grep -cvE '^PASS n=')" "$(grep -cE '^FAIL' "$log")" "$(grep -cE '^SKIPPED' "$log")" \
    "$doctest" "$( (( rc == 124 || rc == 137 )) && echo ", timed out after ${limit} s")")")
  if (( rc != 0 )); then
    gpu_failed=1
    echo "---- $label failed (rc=$rc), the end of $log:"
    tail -n 20 "$log"
  fi
  return "$rc"
}

gpu_fail() {
  gpu_rows+=("FAIL $1")
  gpu_failed=1
}

gpu_summary() {
  echo "================ $1 summary ($(( $(date +%s) - _gpu_t0 )) s, testbed ${FP8WIRE_TESTBED_MODE:-not set}, logs in $OUT) ================"
  printf '%s\n' "${gpu_rows[@]}"
  if (( gpu_failed )); then echo "${1^^}: FAIL"; exit 1; fi
  echo "${1^^}: PASS"
  exit 0
}
