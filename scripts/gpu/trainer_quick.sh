#!/usr/bin/env bash
# A short trainer check for a batched GPU call: the GPU unit test and a few steps of the full pi05
# preset on one GPU (micro-batch 32, the preset's remat policy), for throughput and peak memory.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT="${OUT:-out/trainer-quick}"; mkdir -p "$OUT"
timeout -k 5 60 build/tests/trainer/trainer_gpu_test > "$OUT/gpu_test.log" 2>&1; echo "trainer_gpu_test rc=$?"
grep -E "PASS|FAIL" "$OUT/gpu_test.log" | tail -n 12
timeout -k 5 "${TRAIN_QUICK_LIMIT:-110}" build/trainer/fp8wire-train --config trainer/configs/pi05.toml --steps "${TRAIN_QUICK_STEPS:-6}" \
  --set "train.out_dir=$OUT/pi05" > "$OUT/pi05.log" 2>&1; echo "pi05 rc=$?"
grep -vE '^\s*$' "$OUT/pi05.log" | tail -n 12
