#!/usr/bin/env bash
# Installs everything a fresh machine of the project's kind needs to build and test fp8wire.
# Idempotent: re-running only checks what is already there.
#   Debian packages: small C++ libraries (fmt, toml++, doctest, CLI11, nlohmann-json, Google Benchmark),
#                    build tools (cmake, ninja, ccache).
#   PyPI: torch==2.11.0 into .venv, only for its LibTorch (the trainer builds against it).
# The CUDA toolkit (nvcc, NCCL, CUPTI, NVTX3) is expected under /usr/local/cuda, as on this kind.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

debs=(libfmt-dev libtomlplusplus-dev doctest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
      cmake ninja-build ccache python3-venv)
missing=()
for p in "${debs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "[install-deps] apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [[ "${FP8WIRE_SKIP_TORCH:-0}" != 1 ]]; then
  venv="$here/.venv"
  if ! "$venv/bin/python" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.11.0")' 2>/dev/null; then
    echo "[install-deps] torch==2.11.0 into $venv (LibTorch for the trainer)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q torch==2.11.0
  fi
fi
echo "[install-deps] ok"
