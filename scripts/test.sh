#!/usr/bin/env bash
# THE test command (README, .ci/run): installs what is missing, builds everything, runs every test.
# On a machine without a GPU the GPU tests skip themselves (ctest reports them as skipped).
#   scripts/test.sh                 # full: deps, configure, build, ctest
#   BUILD_DIR=build-ci scripts/test.sh
# Environment: BUILD_JOBS (parallel build jobs, default nproc), CMAKE_CUDA_ARCHITECTURES
# (default: the project's 80-real;89-real;90), CTEST_ARGS (extra ctest arguments),
# FP8WIRE_SKIP_PACKAGE=1 (no wheel test, scripts/test-package.sh), SKIP_SANITIZE=1 (leave out the
# sanitizer and fuzz tier, scripts/sanitize.sh; FUZZ_SECONDS sets its fuzz runs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"
jobs="${BUILD_JOBS:-$(nproc)}"

start=$(date +%s)
bash scripts/install-deps.sh

export PATH="/usr/local/cuda/bin:$PATH"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/fp8wire-ccache}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"

cmake_args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release)
[[ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ]] && cmake_args+=("-DCMAKE_CUDA_ARCHITECTURES=$CMAKE_CUDA_ARCHITECTURES")
cmake "${cmake_args[@]}"
echo "[test] building with $jobs jobs ($(($(date +%s) - start)) s so far)"
cmake --build "$build" -j "$jobs"
echo "[test] build done ($(($(date +%s) - start)) s so far)"

# shellcheck disable=SC2086
ctest --test-dir "$build" --output-on-failure -j "$jobs" ${CTEST_ARGS:-}
# The pip package: wheel built (reusing this build's objects through ccache), installed in a fresh
# venv, tested there. FP8WIRE_SKIP_PACKAGE=1 leaves it out.
if [[ "${FP8WIRE_SKIP_PACKAGE:-0}" != 1 ]]; then
  package_start=$(date +%s)
  bash scripts/test-package.sh "$build"
  echo "[test] package test took $(($(date +%s) - package_start)) s"
fi
# The sanitizer and fuzz tier: host code with ASan + UBSan, then the libFuzzer targets (own folders).
if [[ "${SKIP_SANITIZE:-0}" != 1 ]]; then
  sanitize_start=$(date +%s)
  BUILD_JOBS="$jobs" bash scripts/sanitize.sh
  echo "[test] sanitizer and fuzz tier took $(($(date +%s) - sanitize_start)) s"
fi
echo "[test] done in $(($(date +%s) - start)) s"
