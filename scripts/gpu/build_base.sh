#!/usr/bin/env bash
# Builds the base version of the library (for scripts/gpu/regression.sh) from .carry/base-src.tar.gz
# into /tmp/base/build: the shim, fp8wire-bench and the shim test, sm_90 only, against the NCCL of
# PyTorch's pip wheel. Marks /tmp/base/build.done when finished.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BASE=/tmp/base
mkdir -p "$BASE" && touch "$BASE/build.started"
tar xzf .carry/base-src.tar.gz -C "$BASE"
nccl_root="$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
{
  cmake -S "$BASE" -B "$BASE/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DFP8WIRE_BUILD_TRAINER=OFF "-DFP8WIRE_EXTRA_INCLUDE=$PWD/.carry/include" ${nccl_root:+"-DFP8WIRE_NCCL_ROOT=$nccl_root"} &&
  cmake --build "$BASE/build" --target fp8wire fp8wire-bench test_shim fake_nccl -j "${BASE_JOBS:-8}"
  echo "base build rc=$?"
} > "$BASE/build.log" 2>&1
touch "$BASE/build.done"
