#!/usr/bin/env bash
# The Python package as a user gets it: builds the wheel from pyproject.toml (scikit-build-core over
# the project's CMake, in an isolated build environment: no torch), installs it into a fresh venv,
# and runs fp8wire there (lib, config --check, run -- python) plus the package's tests against the
# installed copy. scripts/test.sh runs it after the main build.
#   scripts/test-package.sh [main-build-dir]     (default: build)
# In CI the wheel is built for the main build's CUDA architectures, in build-wheel/ beside it, so
# ccache serves the main build's objects and only configuring, linking and packing remain; a release
# wheel is built with pyproject.toml's own list (sm_80, sm_89, sm_90, sm_100 + PTX):
#   python3 -m pip wheel --no-deps -w dist .
# Env: PACKAGE_TEST_DIR (scratch folder, default a new temporary one).
source "$(dirname "${BASH_SOURCE[0]}")/prologue.sh"
main_build="${1:-build}"
work="${PACKAGE_TEST_DIR:-$(mktemp -d /tmp/fp8wire-package.XXXXXX)}"
mkdir -p "$work/dist"
py=python3
[[ -x .venv/bin/python ]] && py="$FP8WIRE_ROOT/.venv/bin/python"

args=(-C build-dir=build-wheel)
cached() { sed -n "s/^$1:[A-Z]*=//p" "$main_build/CMakeCache.txt" 2>/dev/null | head -1; }
# The same architectures, compilers and carried headers as the main build: same compile lines,
# so ccache answers them.
for var in CMAKE_CUDA_ARCHITECTURES CMAKE_CXX_COMPILER CMAKE_CUDA_COMPILER CMAKE_CUDA_HOST_COMPILER FP8WIRE_EXTRA_INCLUDE; do
  value="$(cached "$var")"
  [[ -n "$value" ]] && args+=(-C "cmake.define.$var=$value")
done
arch="$(cached CMAKE_CUDA_ARCHITECTURES)"
echo "[package] building the wheel (CUDA architectures ${arch:-from pyproject.toml})"
CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "$py" -m pip wheel -q --no-deps -w "$work/dist" "${args[@]}" . \
  > "$work/wheel.log" 2>&1 || { tail -40 "$work/wheel.log"; exit 1; }
wheel="$(ls "$work"/dist/fp8wire-*.whl)"
echo "[package] $(basename "$wheel"): $(du -h "$wheel" | cut -f1) ($(( $(date +%s) - START )) s so far)"

# A new user: a fresh venv, the wheel and nothing else (it depends on nothing).
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --no-index "$wheel"
cd "$work" || exit 1
env -u FP8WIRE_SHIM_LIB -u FP8WIRE_PROF_LIB -u LD_PRELOAD PATH="$work/venv/bin:$PATH" bash -euo pipefail -c '
  echo "\$ fp8wire lib"; fp8wire lib
  echo "\$ fp8wire config --check | head -3"; fp8wire config --check | head -3
  echo "\$ fp8wire run -- python -c ..."
  out="$(fp8wire run -- python -c "import fp8wire; print(\"loaded\", fp8wire.loaded(), \"active\", fp8wire.active())" 2>&1)"
  echo "$out"
  # Loaded, but not able to act: no NCCL in a plain python (fp8wire.active() checks for it).
  grep -q "loaded True active False" <<<"$out"
'
env -u FP8WIRE_SHIM_LIB -u FP8WIRE_PROF_LIB -u LD_PRELOAD \
  "$work/venv/bin/python" "$FP8WIRE_ROOT/tests/python/test_package.py" --installed > "$work/test_package.log" 2>&1 \
  || { tail -40 "$work/test_package.log"; exit 1; }
tail -1 "$work/test_package.log"
echo "[package] ok: wheel built, installed in a fresh venv, tested ($(( $(date +%s) - START )) s)"
[[ -n "${PACKAGE_TEST_DIR:-}" ]] || rm -rf "$work"
