#!/usr/bin/env bash
# What the direct transports rely on, on this GPU machine (scripts/gpu/all.sh direct_probe, ~1 min):
# stream memory operations on shared host memory between two processes, their graph capture and host
# release, CUDA IPC between processes of one GPU, and kernel load/store bandwidth to mapped host
# memory against cudaMemcpyAsync's (bench/direct_probe.cu says what each line means).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
OUT="${OUT:-$PWD/out/direct-probe}"; mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
nvcc -O3 -std=c++17 -arch="sm_${arch:-90}" -o "$OUT/direct_probe" bench/direct_probe.cu || { echo "FAIL: build"; exit 1; }
timeout -k 5 "${PROBE_LIMIT_S:-90}" "$OUT/direct_probe" "${PROBE_MIB:-256}" 2>&1 | tee "$OUT/direct_probe.txt"
exit "${PIPESTATUS[0]}"
