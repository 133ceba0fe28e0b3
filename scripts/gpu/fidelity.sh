#!/usr/bin/env bash
# FP8-wire training fidelity (scripts/gpu/all.sh fidelity): pi05_small on 2 emulated ranks (one GPU,
# NCCL over sockets, as the main job) for FIDELITY_STEPS (1000) steps, same seed and data, plain NCCL
# and under libfp8wire.so three ways: e4m3 (the default), e4m3 with error feedback (the trainer
# names every gradient bucket: fp8wire_set_feedback_key), e5m2. Then scripts/fidelity.py: loss
# Pearson and mean relative error against plain NCCL, gradient-norm curves, the plot.
# Environment: FIDELITY_STEPS, FIDELITY_RUNS ("plain fp8wire fp8wire_ef fp8wire_e5m2"),
# FIDELITY_PARALLEL (1: runs at once; they share the GPU and the sockets), FIDELITY_LIMIT_S (per
# wave), FIDELITY_SET (extra --set overrides for every run), FIDELITY_BASELINE (the train_log.jsonl
# of a plain run of the same settings from an earlier run: no plain run then).
# Runs at once are slower than one after the other on this testbed (one H200, 2026-12-02: four at
# once made 2,058 steps in 545 s, plain 1.9 s/step and the FP8 runs 0.9; alone the main job runs
# plain 310 ms/step and fp8wire 173). One after the other, 1,000 steps of plain took 359 s and of
# each FP8 run ~222 s (2026-12-02). Under a 600 s limit per run, they take two or three runs:
#   FIDELITY_RUNS="plain fp8wire" scripts/gpu/all.sh fidelity     (~580 s, build included; keep plain/train_log.jsonl)
#   FIDELITY_RUNS="fp8wire_ef fp8wire_e5m2" FIDELITY_BASELINE=<that log> scripts/gpu/all.sh fidelity   (~510 s)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
gpu_out fidelity
steps="${FIDELITY_STEPS:-1000}"
runs=()
for r in ${FIDELITY_RUNS:-plain fp8wire fp8wire_ef fp8wire_e5m2}; do
  [[ -n "${FIDELITY_BASELINE:-}" && "$r" == plain ]] || runs+=("$r")
done
baseline="${FIDELITY_BASELINE:-$OUT/plain/train_log.jsonl}"
parallel="${FIDELITY_PARALLEL:-1}"
limit="${FIDELITY_LIMIT_S:-540}"
BIN=build/trainer/fp8wire-train
SHIM="$PWD/build/shim/libfp8wire.so"
gpu_require "$BIN" "$SHIM"
# As the main job on one GPU (docs/PERF.md, "Collectives over NCCL"): NCCL's point-to-point
# chunk for every run, fp8wire gathering by send/recv.
export NCCL_P2P_NET_CHUNKSIZE="${NCCL_P2P_NET_CHUNKSIZE:-524288}"

start() {  # start NAME: in the background, pid appended to pids
  local name="$1" dir="$OUT/$1"
  rm -rf "$dir"; mkdir -p "$dir"
  local sets=(--set train.out_dir="$dir" --set train.log_every=1 --set train.plot=false --set train.decay_steps="$steps")
  for kv in ${FIDELITY_SET:-}; do sets+=(--set "$kv"); done
  local env_args=()
  case "$name" in
    plain) ;;
    fp8wire) env_args=(LD_PRELOAD="$SHIM" FP8WIRE_GATHER_TRANSPORT=sendrecv) ;;
    fp8wire_ef) env_args=(LD_PRELOAD="$SHIM" FP8WIRE_GATHER_TRANSPORT=sendrecv FP8WIRE_ERROR_FEEDBACK_ENABLE=1) ;;
    fp8wire_e5m2) env_args=(LD_PRELOAD="$SHIM" FP8WIRE_GATHER_TRANSPORT=sendrecv FP8WIRE_FORMAT=e5m2) ;;
    *) echo "FAIL: unknown run $name"; return 1 ;;
  esac
  echo "fidelity: $name: ${env_args[*]:-plain NCCL}"
  env ${env_args[@]+"${env_args[@]}"} timeout -k 20 "$limit" "$BIN" --config trainer/configs/pi05_small.toml --ranks 2 --steps "$steps" "${sets[@]}" \
    > "$dir/run.log" 2>&1 &
  pids+=($!)
}

t0=$(date +%s)
i=0
while (( i < ${#runs[@]} )); do
  pids=()
  wave=("${runs[@]:i:parallel}")
  for r in "${wave[@]}"; do start "$r"; done
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}"; rc=$?
    echo "fidelity: ${wave[$k]} rc=$rc ($(( $(date +%s) - t0 )) s); $(grep '^summary' "$OUT/${wave[$k]}/run.log" | tail -1)"
    (( rc == 0 )) || tail -n 8 "$OUT/${wave[$k]}/run.log"
    grep -h -E "ranks in sync|^fp8wire: rank 0" "$OUT/${wave[$k]}/run.log" | head -3
  done
  i=$(( i + parallel ))
done

cands=()
for r in "${runs[@]}"; do
  [[ "$r" == plain ]] && continue
  [[ -s "$OUT/$r/train_log.jsonl" ]] && cands+=("$r=$OUT/$r/train_log.jsonl")
done
# The collectives each FP8 run carried on FP8 paths (fp8wire-train prints libfp8wire.so's totals),
# so a run that silently passed through shows.
for r in "${runs[@]}"; do
  [[ "$r" == plain ]] && continue
  echo "$r: $(grep -m1 '^fp8wire: rank 0' "$OUT/$r/run.log" || echo 'FAIL: no fp8wire totals (was the library loaded?)')"
done
if [[ -s "$baseline" && ${#cands[@]} -gt 0 ]]; then
  "$PY" scripts/fidelity.py "$baseline" "${cands[@]}" --plot "$OUT/fidelity.png" | tee "$OUT/fidelity.md"
  echo "fidelity rc=${PIPESTATUS[0]}"
else
  echo "FAIL: no plain run or no FP8 run to compare"
  exit 1
fi
