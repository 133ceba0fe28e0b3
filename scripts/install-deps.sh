#!/usr/bin/env bash
# Installs everything a fresh machine of the project's kind needs to build and test fp8wire.
# Idempotent: re-running only checks what is already there.
#   Debian packages: small C++ libraries (fmt, toml++, doctest, CLI11, nlohmann-json, Google Benchmark,
#                    zlib), build tools (cmake, ninja, ccache), clang with its sanitizer and libFuzzer
#                    runtimes (the fuzz tier, scripts/sanitize.sh), shellcheck (test scripts_shellcheck).
#   PyPI: torch==2.11.0 into .venv, only for its LibTorch (the trainer builds against it); numpy,
#         pyarrow, pillow, sentencepiece into .venv for scripts/convert_lerobot_libero.py and its test.
# The CUDA toolkit (nvcc, NCCL, CUPTI, NVTX3) is expected under /usr/local/cuda, as on this kind.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

debs=(libfmt-dev libtomlplusplus-dev doctest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev zlib1g-dev
      cmake ninja-build ccache python3-venv clang libclang-rt-14-dev shellcheck)
missing=()
for p in "${debs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "[install-deps] apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

venv="$here/.venv"
if [[ "${FP8WIRE_SKIP_TORCH:-0}" != 1 ]]; then
  if ! "$venv/bin/python" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.11.0")' 2>/dev/null; then
    echo "[install-deps] torch==2.11.0 into $venv (LibTorch for the trainer)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q torch==2.11.0
  fi
fi

# scripts/convert_lerobot_libero.py and its ctest (trainer_convert_lerobot_libero): parquet reading,
# image decoding, SentencePiece prompts. Only the pins not already installed are fetched.
data_pins=(numpy==2.4.6 pyarrow==26.0.1 pillow==13.0.0 sentencepiece==0.2.3)
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
data_missing=()
for pin in "${data_pins[@]}"; do
  name="${pin%%==*}" version="${pin##*==}"
  installed="$("$venv/bin/python" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name" 2>/dev/null || true)"
  [[ "$installed" == "$version" ]] || data_missing+=("$pin")
done
if ((${#data_missing[@]})); then
  echo "[install-deps] ${data_missing[*]} into $venv (LeRobot dataset converter)"
  "$venv/bin/pip" install -q "${data_missing[@]}"
fi
echo "[install-deps] ok"
