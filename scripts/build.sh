#!/usr/bin/env bash
# Configures and builds fp8wire (everything, trainer included when LibTorch is found).
# Used by the main job on GPU machines and by the GPU checks; scripts/test.sh is the CI path.
#   scripts/build.sh [build-dir]        (default: build)
# It links the benchmark and tests against the NCCL that PyTorch uses (the pip nvidia-nccl wheel)
# when that Python has one, so every program in one job talks to the same NCCL version.
# Environment:
#   TORCH_PYTHON           python with torch (default: .venv/bin/python, else python3)
#   CMAKE_CUDA_ARCHITECTURES  default: the GPU's own (nvidia-smi), else the project default
#   FP8WIRE_EXTRA_INCLUDE  header-only dependencies carried to machines that lack them (default .carry/include)
#   BUILD_TARGETS          build only these targets (default: everything)
source "$(dirname "${BASH_SOURCE[0]}")/prologue.sh"
build="${1:-build}"
py="$(torch_python)"
args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DFP8WIRE_TORCH_PYTHON=$py")
nccl_root="$("$py" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
if [[ -n "$nccl_root" && -f "$nccl_root/include/nccl.h" ]]; then
  args+=("-DFP8WIRE_NCCL_ROOT=$nccl_root")
fi
extra="${FP8WIRE_EXTRA_INCLUDE:-$FP8WIRE_ROOT/.carry/include}"
[[ -d "$extra" ]] && args+=("-DFP8WIRE_EXTRA_INCLUDE=$extra")
arch="${CMAKE_CUDA_ARCHITECTURES:-$(gpu_cuda_arch)}"
[[ -n "$arch" ]] && args+=("-DCMAKE_CUDA_ARCHITECTURES=$arch")
cmake "${args[@]}"
keep=()
[[ "${BUILD_KEEP_GOING:-0}" == 1 ]] && keep=(-- -k 0)   # build what can be built
targets=()
if [[ -n "${BUILD_TARGETS:-}" ]]; then   # e.g. BUILD_TARGETS="fp8wire fp8wire-config"
  read -ra names <<< "$BUILD_TARGETS"
  targets=(--target "${names[@]}")
fi
cmake --build "$build" -j "$JOBS" "${targets[@]}" "${keep[@]}"
