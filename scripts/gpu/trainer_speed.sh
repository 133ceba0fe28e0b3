#!/usr/bin/env bash
# The pi05 trainer's speed on one GPU (scripts/gpu/all.sh trainer_speed, ~6-8 min):
#   1. the fused kernels against ATen and fp64 (trainer_fused_ops_gpu_test);
#   2. throughput rows, 10 steps each (mean of steps 2..9): micro-batch, remat, fused kernels on/off
#      -> samples/s, ms/step, peak GiB, MFU (SPEED_ROWS overrides the list: "mb:remat:every:fused ...");
#   3. where the step goes with the fused kernels (LibTorch profiler, scripts/kernel_breakdown.py);
#   4. the loss over SPEED_LOSS_STEPS (200) steps with and without the fused kernels, same seed and
#      data (scripts/loss_parity.py), and with SPEED_NOISE_RUN=1 the ATen run repeated: how far two
#      identical runs drift apart (cuDNN's attention backward is not deterministic) is the noise the
#      comparison is judged against. SPEED_LOSS_BASELINE=<train_log.jsonl> of an earlier ATen run of
#      the same settings skips the ATen run.
# Tables under $OUT (throughput.md, loss_parity.txt); the summary is printed last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-$PWD/out/trainer-speed}"; mkdir -p "$OUT"
BIN=build/trainer/fp8wire-train
PY="${PYTHON:-python3}"
[[ -x "$BIN" ]] || { echo "FAIL: $BIN not built"; exit 1; }
summary=()
note() { summary+=("$1"); echo "$1"; }

# 1. kernels --------------------------------------------------------------------------------------
T=build/tests/trainer/trainer_fused_ops_gpu_test
if [[ -x "$T" ]]; then
  timeout -k 5 90 "$T" > "$OUT/fused_ops_test.log" 2>&1
  rc=$?
  cat "$OUT/fused_ops_test.log"
  note "fused kernels test: rc=$rc, $(grep -c '^PASS' "$OUT/fused_ops_test.log") PASS, $(grep -c '^FAIL' "$OUT/fused_ops_test.log") FAIL"
else
  note "fused kernels test: FAIL ($T not built)"
fi

# 2. throughput -----------------------------------------------------------------------------------
# run DIR STEPS TIMEOUT [--set ...]: the pi05 preset; 0 = ran, 2 = out of memory.
run() {
  local dir="$1" steps="$2" limit="$3"; shift 3
  rm -rf "$dir"; mkdir -p "$dir"
  timeout -k 5 "$limit" "$BIN" --config trainer/configs/pi05.toml --steps "$steps" "$@" --set train.plot=false \
    --set train.out_dir="$dir" --set train.log_jsonl="$dir/train_log.jsonl" > "$dir/run.log" 2>&1
  local rc=$?
  (( rc != 0 )) && grep -qi "out of memory" "$dir/run.log" && return 2
  return $rc
}
rows="${SPEED_ROWS:-16:none:1:false 16:none:1:true 24:none:1:true 32:none:1:true 48:none:1:true}"
{
  echo "| micro-batch | remat | fused kernels | samples/s | ms/step | peak GiB | MFU |"
  echo "|---|---|---|---|---|---|---|"
} > "$OUT/throughput.md"
for r in $rows; do
  IFS=: read -r mb remat every fused <<< "$r"
  dir="$OUT/mb${mb}_${remat}${every}_fused-${fused}"
  run "$dir" 10 120 --set train.micro_batch="$mb" --set train.remat="$remat" --set train.remat_every="$every" \
    --set train.fused_kernels="$fused"
  rc=$?
  label="$remat$([[ $remat != none ]] && echo " every $every")"
  if (( rc == 0 )); then
    line=$(grep '^summary' "$dir/run.log" | tail -1)
    sps=$(grep -o 'mean [0-9.]* samples/s' <<< "$line" | awk '{print $2}')
    ms=$(grep -o 'mean step [0-9.]* ms' <<< "$line" | awk '{print $3}')
    peak=$(grep -o 'peak [0-9.]* GiB' <<< "$line" | awk '{print $2}')
    mfu=$(grep -o 'MFU [0-9.]*%' <<< "$line" | awk '{print $2}')
    echo "| $mb | $label | $fused | $sps | $ms | $peak | $mfu |" >> "$OUT/throughput.md"
    note "throughput mb $mb, $label, fused $fused: $sps samples/s, $ms ms/step, peak $peak GiB, MFU $mfu"
  else
    echo "| $mb | $label | $fused | $([[ $rc == 2 ]] && echo 'out of memory' || echo "failed (rc $rc)") | | | |" >> "$OUT/throughput.md"
    note "throughput mb $mb, $label, fused $fused: $([[ $rc == 2 ]] && echo 'out of memory' || echo "FAIL rc=$rc")"
    tail -n 5 "$dir/run.log"
  fi
  rm -f "$dir"/*.safetensors
done
cat "$OUT/throughput.md"

# 3. where the step goes, fused ---------------------------------------------------------------------
if [[ "${SPEED_PROFILE:-1}" == 1 ]]; then
  OUT="$OUT/profile" TRAIN_PROFILE_SET="train.fused_kernels=true" bash scripts/gpu/trainer_profile.sh \
    > "$OUT/profile.log" 2>&1
  head -n 40 "$OUT/profile.log"
fi

# 4. loss with and without the fused kernels ------------------------------------------------------
steps="${SPEED_LOSS_STEPS:-200}"
if (( steps > 0 )); then
  # A schedule that moves the loss within the window (the preset warms up over 1,000 steps).
  loss_sets=(--set train.micro_batch=16 --set train.remat=none --set train.warmup_steps=20 --set train.peak_lr=1e-4
             --set train.log_every=1 --set train.seed=7)
  limit=$(( steps * 6 / 10 + 60 ))
  base="${SPEED_LOSS_BASELINE:-$OUT/loss_aten/train_log.jsonl}"
  rc_a="given ($base)"
  if [[ -z "${SPEED_LOSS_BASELINE:-}" ]]; then
    run "$OUT/loss_aten" "$steps" "$limit" "${loss_sets[@]}" --set train.fused_kernels=false; rc_a=$?
  fi
  run "$OUT/loss_fused" "$steps" "$limit" "${loss_sets[@]}" --set train.fused_kernels=true; rc_f=$?
  note "loss runs: ATen rc=$rc_a, fused rc=$rc_f"
  : > "$OUT/loss_parity.txt"
  parity=$("$PY" scripts/loss_parity.py "$base" "$OUT/loss_fused/train_log.jsonl" \
    --min-pearson 0.99 --max-rel-err 0.02 2>&1)
  echo "ATen vs fused, $steps steps: $parity" | tee -a "$OUT/loss_parity.txt"
  if [[ "${SPEED_NOISE_RUN:-0}" == 1 ]]; then
    run "$OUT/loss_aten2" "$steps" "$limit" "${loss_sets[@]}" --set train.fused_kernels=false
    parity2=$("$PY" scripts/loss_parity.py "$base" "$OUT/loss_aten2/train_log.jsonl" \
      --min-pearson 0.99 --max-rel-err 0.02 2>&1)
    echo "ATen vs ATen (the noise), $steps steps: $parity2" | tee -a "$OUT/loss_parity.txt"
  fi
  for d in loss_aten loss_fused loss_aten2; do
    [[ -f "$OUT/$d/run.log" ]] && grep '^summary' "$OUT/$d/run.log" | sed "s/^/$d: /" | tee -a "$OUT/loss_parity.txt"
  done
  "$PY" scripts/plot_loss.py "$base" "$OUT/loss_fused/train_log.jsonl" \
    -o "$OUT/loss_fused_vs_aten.png" > /dev/null 2>&1 || true
  note "$(head -n 1 "$OUT/loss_parity.txt")"
fi

echo "==================== trainer speed summary ===================="
printf '%s\n' "${summary[@]}"
