#!/usr/bin/env bash
# GPU checks of the Pi0.5 reference trainer, in parts (TRAINER_PARTS, default "checks"; results under
# $OUT/<part>, OUT default out/trainer; each part's summary is printed last):
#   checks   (a) full pi05 preset on one GPU: micro-batch 32, 2 cameras, 762 tokens, 10 steps; the
#            loss falls; reports samples/s, step ms, peak memory, MFU and the parameter count (if the
#            preset runs out of memory: a FAIL row, then the same with every other layer recomputed);
#            then, time permitting, micro-batch 16 without remat (the community's setting) as INFO;
#            (b) pi05_small on 2 emulated ranks (one GPU, NCCL_HOSTID per rank, side by side under
#            fp8wire-train's private MPS daemon where one can be started), 20 steps, overlapped bf16
#            bucket all-reduce; every rank's parameter checksum must agree at the end;
#            (c) the same run with one all-reduce after backward: the same loss curve up to the GPU's
#            non-deterministic attention backward (scripts/loss_parity.py), and both modes' step times.
#            Optional runs are skipped when they would not fit the area's limit (GPU_AREA_LIMIT_S,
#            240 s by default); expected ~2-3 min.
#   quick    the GPU unit test and a few steps of the full pi05 preset on one GPU (micro-batch 32, the
#            preset's remat policy), for throughput and peak memory (TRAIN_QUICK_STEPS, TRAIN_QUICK_LIMIT).
#   profile  where the pi05 step's GPU time goes (~2 min): the full preset at micro-batch 16 without
#            recomputation, 8 steps, steps 4-5 recorded by LibTorch's profiler (train.profile_from),
#            then scripts/kernel_breakdown.py sums the kernels by family. TRAIN_PROFILE_SET adds --set
#            overrides (e.g. "train.micro_batch=32 train.remat=layers").
#   speed    the pi05 trainer's speed on one GPU (~6-8 min):
#            1. the fused kernels against ATen and fp64 (trainer_fused_ops_gpu_test);
#            2. throughput rows, 10 steps each (mean of steps 2..9): micro-batch, remat, fused kernels
#               on/off -> samples/s, ms/step, peak GiB, MFU (SPEED_ROWS overrides the list:
#               "mb:remat:every:fused ...");
#            3. where the step goes with the fused kernels (the profile part, SPEED_PROFILE=0 skips it);
#            4. the loss over SPEED_LOSS_STEPS (200) steps with and without the fused kernels, same seed
#               and data (scripts/loss_parity.py), and with SPEED_NOISE_RUN=1 the ATen run repeated:
#               how far two identical runs drift apart (cuDNN's attention backward is not
#               deterministic) is the noise the comparison is judged against.
#               SPEED_LOSS_BASELINE=<train_log.jsonl> of an earlier ATen run of the same settings skips
#               the ATen run.
#   bash scripts/gpu/trainer.sh                     TRAINER_PARTS="quick profile" bash scripts/gpu/trainer.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_out trainer
BIN="${TRAIN_BIN:-$BUILD/trainer/fp8wire-train}"
if [[ ! -x "$BIN" ]]; then
  echo "FAIL: $BIN not built (FP8WIRE_BUILD_TRAINER needs LibTorch)"; exit 1
fi

# Each part runs in a subshell of its own: its helpers, counters and OUT stay its own.
checks() (
  OUT="$OUT/checks"; mkdir -p "$OUT"
  rows=()
  fails=0
  row() { rows+=("$(printf '%-34s %-5s %s' "$1" "$2" "$3")"); [[ "$2" == FAIL ]] && fails=$((fails + 1)); echo "$2: $1 $3"; }

  # Mean of the first/last k losses of a JSONL log, and a value from the summary line.
  loss_drop() { "$PY" - "$1" <<'PY'
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1]) if x.strip()]
k = max(1, min(3, len(l) // 3))
a, b = sum(l[:k]) / k, sum(l[-k:]) / k
print(f"{a:.4f} {b:.4f} {'yes' if b < a else 'no'}")
PY
  }
  field() { grep -o "$2 [0-9.]*" "$1" | tail -1 | awk '{print $NF}'; }

  # GPU unit check (tiny preset, bf16 on the device) ----------------------------------------------------
  GT="${TRAIN_GPU_TEST:-build/tests/trainer/trainer_gpu_test}"
  if [[ -x "$GT" ]]; then
    timeout -k 5 40 "$GT" > "$OUT/gpu_test.log" 2>&1
    rc=$?
    cat "$OUT/gpu_test.log" | grep -E "PASS|FAIL|SKIPPED|loss"
    row "tiny bf16 GPU unit checks" "$([[ $rc == 0 ]] && echo PASS || echo FAIL)" "rc=$rc ($(grep -c '^PASS' "$OUT/gpu_test.log") PASS lines)"
  fi

  # (a) full model, one GPU ------------------------------------------------------------------------
  # run_pi05 DIR MICRO_BATCH TIMEOUT [--set ...]: 10 steps of the pi05 preset; 0 = ran, 2 = out of memory.
  run_pi05() {
    local dir="$1" mb="$2" limit="$3"; shift 3
    mkdir -p "$dir"
    timeout -k 5 "$limit" "$BIN" --config trainer/configs/pi05.toml --steps 10 \
      --set train.micro_batch="$mb" --set train.warmup_steps=2 --set train.peak_lr=5e-4 "$@" \
      --set train.plot=false --set train.out_dir="$dir" --set train.log_jsonl="$dir/train_log.jsonl" > "$dir/run.log" 2>&1
    local rc=$?
    (( rc != 0 )) && grep -qi "out of memory" "$dir/run.log" && return 2
    return $rc
  }
  # "mean X samples/s, Y ms/step, peak Z GiB, MFU W%" from a run log's summary line.
  throughput() {
    local summ; summ=$(grep '^summary:' "$1" | tail -1)
    echo "$(echo "$summ" | grep -o 'mean [0-9.]* samples/s' | awk '{print $2}') samples/s," \
         "$(echo "$summ" | grep -o 'mean step [0-9.]* ms' | awk '{print $3}') ms/step," \
         "peak $(echo "$summ" | grep -o 'peak [0-9.]* GiB' | awk '{print $2}') GiB," \
         "MFU $(echo "$summ" | grep -o 'MFU [0-9.]*%' | awk '{print $2}')"
  }
  # Optional runs go only where the area's time limit still leaves (b) and (c) their ~100 s.
  AREA_LIMIT="${GPU_AREA_LIMIT_S:-240}"
  time_left_for() { (( SECONDS + $1 + 100 < AREA_LIMIT )); }

  A="$OUT/pi05"
  run_pi05 "$A" 32 70   # the preset: micro-batch 32, no recomputation (115 GiB with the fused kernels)
  rc=$?
  remat_used="$(grep -o 'remat [a-z]*\( every [0-9]*\)\?' "$A/run.log" | head -1)"
  if (( rc == 2 )) && time_left_for 60; then
    # On a GPU with less memory than the H200 the preset does not fit: say so and measure every
    # other layer recomputed instead (~96 GiB).
    row "pi05 mb32 preset fits" FAIL "out of memory with '$remat_used' (see $A/run.log); rerun with remat every other layer"
    mv "$A" "$A.oom"
    run_pi05 "$A" 32 60 --set train.remat=layers --set train.remat_every=2
    rc=$?
    remat_used="remat layers every 2"
  fi
  tail -n 14 "$A/run.log"
  if (( rc == 0 )); then
    read -r first last fell < <(loss_drop "$A/train_log.jsonl")
    params=$(grep -o "| [0-9]* parameters" "$A/run.log" | head -1 | awk '{print $2}')
    row "pi05 mb32 10 steps runs" PASS "params=$params ($remat_used)"
    row "pi05 loss falls" "$([[ $fell == yes ]] && echo PASS || echo FAIL)" "$first -> $last"
    row "pi05 throughput mb32" INFO "$(throughput "$A/run.log") (LeRobot's pi05 on an H200: 29.5 at mb16)"
  else
    row "pi05 mb32 10 steps runs" FAIL "rc=$rc (see $A/run.log)"
    grep -iE "error|out of memory|what\(\)" "$A/run.log" | head -5
  fi
  # The community's reference setting: micro-batch 16 without rematerialisation (predicted ~110 GiB).
  A16="$OUT/pi05_mb16_noremat"
  if time_left_for 45; then
    run_pi05 "$A16" 16 45 --set train.remat=none
    rc=$?
    if (( rc == 0 )); then row "pi05 throughput mb16 no remat" INFO "$(throughput "$A16/run.log") (community 29.5)"
    else row "pi05 throughput mb16 no remat" INFO "did not run to the end: rc=$rc$( (( rc == 2 )) && echo ', out of memory')"; fi
  fi

  # (b) pi05_small, 2 emulated ranks, overlapped buckets ---------------------------------------------
  B="$OUT/small_overlap"; mkdir -p "$B"
  timeout -k 5 50 "$BIN" --config trainer/configs/pi05_small.toml --ranks 2 --steps 20 \
    --set train.allreduce=overlap --set train.plot=false --set train.out_dir="$B" --set train.log_jsonl="$B/train_log.jsonl" > "$B/run.log" 2>&1
  rc=$?
  tail -n 6 "$B/run.log"
  insync=$(grep -c "ranks in sync: PASS" "$B/run.log")
  row "pi05_small 2 ranks overlap runs" "$([[ $rc == 0 ]] && echo PASS || echo FAIL)" "rc=$rc"
  row "pi05_small ranks in sync" "$([[ $insync == 2 ]] && echo PASS || echo FAIL)" "$insync/2 ranks report equal checksums"
  # The all-reduce traffic fp8wire sees: bucket count, dtype (must be BFloat16) and MiB per step.
  buckets=$(grep -m1 '^gradient buckets:' "$B/run.log" | sed 's/; MiB in launch order.*//; s/^gradient buckets: //')
  row "pi05_small gradient buckets" "$([[ $buckets == *BFloat16* ]] && echo PASS || echo FAIL)" "${buckets:-none printed} (bf16 expected)"
  if [[ -s "$B/train_log.jsonl" ]]; then
    read -r first last fell < <(loss_drop "$B/train_log.jsonl")
    row "pi05_small loss falls" "$([[ $fell == yes ]] && echo PASS || echo FAIL)" "$first -> $last"
  fi

  # (c) one all-reduce after backward: same numbers, different exposure -----------------------------
  C="$OUT/small_after_backward"; mkdir -p "$C"
  timeout -k 5 40 "$BIN" --config trainer/configs/pi05_small.toml --ranks 2 --steps 20 \
    --set train.allreduce=after_backward --set train.plot=false --set train.out_dir="$C" --set train.log_jsonl="$C/train_log.jsonl" > "$C/run.log" 2>&1
  rc=$?
  row "pi05_small after_backward runs" "$([[ $rc == 0 ]] && echo PASS || echo FAIL)" "rc=$rc"
  if [[ -s "$B/train_log.jsonl" && -s "$C/train_log.jsonl" ]]; then
    parity=$("$PY" scripts/loss_parity.py "$B/train_log.jsonl" "$C/train_log.jsonl" --min-pearson 0.99 --max-rel-err 0.02 2>&1)
    prc=$?
    row "overlap vs after_backward losses" "$([[ $prc == 0 ]] && echo PASS || echo FAIL)" "$(echo "$parity" | tail -1)"
    ov=$(grep '^summary:' "$B/run.log" | grep -o 'mean step [0-9.]* ms' | awk '{print $3}')
    ab=$(grep '^summary:' "$C/run.log" | grep -o 'mean step [0-9.]* ms' | awk '{print $3}')
    row "step ms overlap / after_backward" INFO "${ov} / ${ab}"
  fi

  "$PY" scripts/plot_loss.py "$A/train_log.jsonl" "$B/train_log.jsonl" "$C/train_log.jsonl" -o "$OUT/loss.png" \
    > /dev/null 2>&1 && echo "loss curves: $OUT/loss.png"

  echo "==================== trainer summary ===================="
  printf '%s\n' "${rows[@]}"
  echo "trainer: $fails FAIL"
  (( fails == 0 ))
)

quick() (
  OUT="$OUT/quick"; mkdir -p "$OUT"
  timeout -k 5 60 build/tests/trainer/trainer_gpu_test > "$OUT/gpu_test.log" 2>&1; echo "trainer_gpu_test rc=$?"
  grep -E "PASS|FAIL" "$OUT/gpu_test.log" | tail -n 12
  timeout -k 5 "${TRAIN_QUICK_LIMIT:-110}" "$BIN" --config trainer/configs/pi05.toml --steps "${TRAIN_QUICK_STEPS:-6}" \
    --set "train.out_dir=$OUT/pi05" > "$OUT/pi05.log" 2>&1; echo "pi05 rc=$?"
  grep -vE '^\s*$' "$OUT/pi05.log" | tail -n 12
)

profile() (
  OUT="$OUT/profile"; mkdir -p "$OUT"
  sets=(--set train.micro_batch=16 --set train.remat=none --set train.plot=false --set train.profile_from=4
        --set train.profile_steps=2 --set "train.out_dir=$OUT/run")
  # shellcheck disable=SC2206
  for kv in ${TRAIN_PROFILE_SET:-}; do sets+=(--set "$kv"); done
  timeout -k 5 "${TRAIN_PROFILE_LIMIT_S:-150}" "$BIN" --config trainer/configs/pi05.toml --steps 8 \
    "${sets[@]}" > "$OUT/run.log" 2>&1
  echo "fp8wire-train rc=$?"
  grep -E "^step|^summary|^profile" "$OUT/run.log" | tail -n 12
  "$PY" scripts/kernel_breakdown.py "$OUT/run/torch_trace.json" --steps 2 --top 30 --json "$OUT/breakdown.json" \
    | tee "$OUT/breakdown.txt"
  rm -f "$OUT/run/torch_trace.json"
)

speed() (
  OUT="$OUT/speed"; mkdir -p "$OUT"
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
  speed_rows="${SPEED_ROWS:-16:none:1:false 16:none:1:true 24:none:1:true 32:none:1:true 48:none:1:true}"
  {
    echo "| micro-batch | remat | fused kernels | samples/s | ms/step | peak GiB | MFU |"
    echo "|---|---|---|---|---|---|---|"
  } > "$OUT/throughput.md"
  for r in $speed_rows; do
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
    OUT="$OUT" TRAIN_PROFILE_SET="train.fused_kernels=true" profile > "$OUT/profile.log" 2>&1
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
)

rc=0
for part in ${TRAINER_PARTS:-checks}; do
  case "$part" in
    checks|quick|profile|speed) "$part" || rc=1 ;;
    *) echo "FAIL: TRAINER_PARTS: unknown part '$part' (expected checks, quick, profile, speed)"; rc=2 ;;
  esac
done
exit $rc
