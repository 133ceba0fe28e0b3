#!/usr/bin/env bash
# THE test command (README, .ci/run): installs what is missing, builds everything, runs every test.
# On a machine without a GPU the GPU tests skip themselves (ctest reports them as skipped).
#   scripts/test.sh                 # full: deps, configure, build, ctest
#   BUILD_DIR=build-ci scripts/test.sh
# Environment: BUILD_JOBS (parallel build jobs, default nproc), CMAKE_CUDA_ARCHITECTURES
# (default: the GPU's own, else 75: one architecture keeps the build short, and CI runs no GPU code), CTEST_ARGS (extra ctest arguments),
# FP8WIRE_SKIP_PACKAGE=1 (no wheel test, scripts/test-package.sh), SKIP_SANITIZE=1 (leave out the
# sanitizer and fuzz tier, scripts/sanitize.sh; FUZZ_SECONDS sets its fuzz runs).
source "$(dirname "${BASH_SOURCE[0]}")/prologue.sh"
build="${BUILD_DIR:-build}"
bash scripts/install-deps.sh

export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"

cmake_args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release)
arch="${CMAKE_CUDA_ARCHITECTURES:-$(gpu_cuda_arch)}"
cmake_args+=("-DCMAKE_CUDA_ARCHITECTURES=${arch:-75}")
cmake "${cmake_args[@]}"
echo "[test] building with $JOBS jobs ($(($(date +%s) - START)) s so far)"
cmake --build "$build" -j "$JOBS"
echo "[test] build done ($(($(date +%s) - START)) s so far)"

# shellcheck disable=SC2086
ctest --test-dir "$build" --output-on-failure -j "$JOBS" ${CTEST_ARGS:-}
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
  BUILD_JOBS="$JOBS" bash scripts/sanitize.sh
  echo "[test] sanitizer and fuzz tier took $(($(date +%s) - sanitize_start)) s"
fi
echo "[test] done in $(($(date +%s) - START)) s"
