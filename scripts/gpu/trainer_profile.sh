#!/usr/bin/env bash
# Where the pi05 step's GPU time goes (scripts/gpu/all.sh trainer_profile, ~2 min): the full preset on
# one GPU at micro-batch 16 without recomputation, 8 steps, steps 4-5 recorded by LibTorch's profiler
# (train.profile_from), then scripts/kernel_breakdown.py sums the kernels by family.
# TRAIN_PROFILE_SET adds --set overrides (e.g. "train.micro_batch=32 train.remat=layers").
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-$PWD/out/trainer-profile}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
sets=(--set train.micro_batch=16 --set train.remat=none --set train.plot=false --set train.profile_from=4
      --set train.profile_steps=2 --set "train.out_dir=$OUT/run")
# shellcheck disable=SC2206
for kv in ${TRAIN_PROFILE_SET:-}; do sets+=(--set "$kv"); done
timeout -k 5 "${TRAIN_PROFILE_LIMIT_S:-150}" build/trainer/fp8wire-train --config trainer/configs/pi05.toml --steps 8 \
  "${sets[@]}" > "$OUT/run.log" 2>&1
echo "fp8wire-train rc=$?"
grep -E "^step|^summary|^profile" "$OUT/run.log" | tail -n 12
"$PY" scripts/kernel_breakdown.py "$OUT/run/torch_trace.json" --steps 2 --top 30 --json "$OUT/breakdown.json" \
  | tee "$OUT/breakdown.txt"
rm -f "$OUT/run/torch_trace.json"
