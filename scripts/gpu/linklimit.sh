#!/usr/bin/env bash
# The direct transport through host memory against its host-link limit, ranks emulated on one GPU (run
# from the repo root, build in build/). Its sweeps share one private MPS daemon (scripts/gpu/lib.sh), so
# the emulated ranks' kernels run side by side (the testbed the limit is meant for); with FP8WIRE_MPS=0
# they take turns and the percentages say more about time-slicing than about the code.
#   fp8wire-bench sweep --emulate-ranks 2 and 4, all_reduce and reduce_scatter, bf16, --transport
#   host_memory (plain NCCL over sockets timed beside it): 64 KiB..256 MiB in x4 steps with the default
#   knobs, then 16..256 MiB once per variant below (env overrides of configuration keys). Each sweep
#   measures the pinned-copy rates itself (every rank at once) and prints "link%" per direct point:
#   the percent of the host-link limit reached (bench/host/link_limit.hpp names the bytes: the fewest
#   any of the algorithms must move, the rank's own data kept on the GPU). The default, kernels and
#   sets2/4 runs check every point; the other variants only re-cut or re-size the same work and skip the checks.
#   The stage variants set the pcie fabric's pipeline shape (cost_model.pcie.direct_*): the ranks'
#   agreed fabric on this testbed (host memory, no P2P).
# At the end, one table (scripts/linklimit_table.py): ranks x collective x size x variant -> ms (plain
# NCCL, each direct path) and % of the link limit of the faster direct path, and each variant against
# the default of its own round.
# Env: LINKLIMIT_RANKS (default "2 4"), LINKLIMIT_VARIANTS (labels from the list below, default all),
# LINKLIMIT_ROUNDS (default 1: the variants run this many times, in the same order each round, so each
# is paired with a default swept minutes apart at most; sweep-to-sweep spread is about +-10-14 %, and the
# table says which variants moved the same way in every round), LINKLIMIT_BUDGET (seconds, default 145:
# a sweep that would end past it, judged by the last one of the same world size, is skipped and named),
# LINKLIMIT_SWEEP_S (one sweep's time limit, default 90; 4 ranks from 64 KiB need more), LINKLIMIT_MIN
# (the default run's smallest size in the first round, default 64KiB; 16MiB in later rounds and for the
# other variants), LINKLIMIT_MAX (every run's largest size, default 256MiB).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_out linklimit
gpu_mps_start
rm -rf "$OUT"/r[0-9]*  # the table reads every sweep under $OUT: none from an earlier run
BIN="$BUILD/bench/fp8wire-bench"
budget="${LINKLIMIT_BUDGET:-145}"
t0=$(date +%s)
status=0

# label | env overrides (space separated; "-" for none)
# In order of interest: the budget skips the last ones first.
variants=(
  "default|-"
  "kernels|FP8WIRE_DIRECT_PROTOCOL=kernels"
  "sets2|FP8WIRE_DIRECT_SETS=2"
  "sets4|FP8WIRE_DIRECT_SETS=4"
  "shared_max_stages8|FP8WIRE_COST_MODEL_PCIE_DIRECT_SHARED_MAX_STAGES=8"
  "shared_max_stages4|FP8WIRE_COST_MODEL_PCIE_DIRECT_SHARED_MAX_STAGES=4"
  "shared_stage256M|FP8WIRE_COST_MODEL_PCIE_DIRECT_SHARED_STAGE_BYTES=256MiB"
  "stage16M|FP8WIRE_COST_MODEL_PCIE_DIRECT_STAGE_BYTES=16MiB"
  "stage32M|FP8WIRE_COST_MODEL_PCIE_DIRECT_STAGE_BYTES=32MiB"
  "stage4M|FP8WIRE_COST_MODEL_PCIE_DIRECT_STAGE_BYTES=4MiB"
  "conn32|CUDA_DEVICE_MAX_CONNECTIONS=32"
)
wanted="${LINKLIMIT_VARIANTS:-}"

mode="${FP8WIRE_TESTBED_MODE:-time-sliced}"
echo "== linklimit: testbed $mode; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)"

sweep() {  # sweep <round> <label> <ranks> <min> <max> <env overrides...>
  local round="$1" label="$2" ranks="$3" min="$4" max="$5"; shift 5
  local dir="$OUT/r$round/${label}_n${ranks}" limit="${LINKLIMIT_SWEEP_S:-90}" s
  s=$(date +%s)
  mkdir -p "$dir"
  # The knobs that only cut or size the work differently are bit-exact on the CPU tier: their sweeps
  # skip the host-side checks (seconds per 256 MiB point); the default, kernels and sets2/sets4 (another
  # protocol or set count) keep them.
  local check=(); [[ "$label" == default || "$label" == kernels || "$label" == sets? ]] || check=(--no-check)
  env "$@" timeout -k 5 "$limit" "$BIN" sweep --emulate-ranks "$ranks" --transport host_memory ${check[@]+"${check[@]}"} \
    --collectives all_reduce,reduce_scatter --dtypes bf16 --paths passthrough,two_shot,one_shot \
    --min "$min" --max "$max" --step 4 --warmup 1 --repeats 3 --buffers 2 --timeout $(( limit - 5 )) \
    --json "$dir/sweep.json" --profile "$dir/profile.toml" > "$dir/sweep.log" 2> "$dir/sweep.err.log"
  local rc=$?
  (( rc == 0 )) || status=1
  last[$ranks]=$(( $(date +%s) - s ))
  echo "==== round $round: $label, $ranks ranks, $min..$max ${*:-}: rc=$rc (${last[$ranks]} s)"
  grep -E "^# pinned|^FAIL|^(PASS|FAIL) checks" "$dir/sweep.log"
  (( rc == 0 )) || tail -n 8 "$dir/sweep.err.log"
}

declare -A last=()
rounds="${LINKLIMIT_ROUNDS:-1}"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "LINKLIMIT_ROUNDS: got '$rounds', expected a whole number from 1" >&2; exit 2; }
for (( round = 1; round <= rounds; round++ )); do
  for entry in "${variants[@]}"; do
    label="${entry%%|*}"; envs="${entry#*|}"; [[ "$envs" == "-" ]] && envs=""
    [[ -n "$wanted" && " $wanted " != *" $label "* ]] && continue
    for n in ${LINKLIMIT_RANKS:-2 4}; do
      if (( $(date +%s) - t0 + ${last[$n]:-0} > budget )); then
        echo "==== round $round: $label, $n ranks: skipped (it would end past LINKLIMIT_BUDGET=${budget} s)"; continue
      fi
      max="${LINKLIMIT_MAX:-256MiB}"
      if [[ "$label" == default && $round == 1 ]]; then sweep "$round" "$label" "$n" "${LINKLIMIT_MIN:-64KiB}" "$max" $envs
      else sweep "$round" "$label" "$n" 16MiB "$max" $envs; fi
    done
  done
done

# The default run's crossovers: where the direct transport starts to pay against plain NCCL
# (".../direct" rows) and against fp8wire over NCCL's transports ("direct/fp8", when timed).
for n in ${LINKLIMIT_RANKS:-2 4}; do
  log="$OUT/r1/default_n$n/sweep.log"
  [[ -f "$log" ]] && { echo "==== crossovers, $n ranks (default knobs)"; sed -n '/^# crossovers/,/^$/p' "$log" | grep -E "direct|^#"; }
done

python3 "$(dirname "${BASH_SOURCE[0]}")/../linklimit_table.py" "$OUT" || status=1
echo "== linklimit: $(( $(date +%s) - t0 )) s, testbed $mode"
exit $status
