# The prologue scripts/build.sh, scripts/test.sh and scripts/sanitize.sh source (never run on its own):
#   source "$(dirname "${BASH_SOURCE[0]}")/prologue.sh"
# It sets strict mode, the working directory (the repository root, FP8WIRE_ROOT), JOBS (BUILD_JOBS,
# default nproc), START (the time it began, for the scripts' "N s so far"), CUDA's bin on PATH and
# CCACHE_DIR (default ~/.cache/fp8wire-ccache), and defines
#   torch_python          prints the python with torch: TORCH_PYTHON, else .venv/bin/python, else python3
#   gpu_cuda_arch         prints the first GPU's compute capability ("90"), nothing without a GPU
# shellcheck shell=bash
set -euo pipefail
FP8WIRE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$FP8WIRE_ROOT"
# shellcheck disable=SC2034  # JOBS and START are for the scripts that source this file
JOBS="${BUILD_JOBS:-$(nproc)}"
# shellcheck disable=SC2034
START=$(date +%s)
export PATH="/usr/local/cuda/bin:$PATH"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/fp8wire-ccache}"

gpu_cuda_arch() {
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true
}

torch_python() {
  if [[ -n "${TORCH_PYTHON:-}" ]]; then echo "$TORCH_PYTHON"
  elif [[ -x .venv/bin/python ]]; then echo "$FP8WIRE_ROOT/.venv/bin/python"
  else command -v python3; fi
}
