#!/usr/bin/env bash
# Scheduler and benchmark measurements on a machine with 2+ GPUs, one rank per GPU (run from the repo root, build in
# build/). Every sweep point is checked for correctness by fp8wire-bench; the sweep tables, JSON,
# profiles and plots land under $OUT.
#   correct   tests/sched/multirank_collectives --per-gpu: the whole FP8 matrix with each gather
#             transport across real GPUs, NCCL's own transport (NVLink), then host memory
#             (NCCL_P2P_DISABLE=1)
#   fabrics   fp8wire-bench sweep --fabric both: NVLink as detected, then pcie mode (NCCL_P2P_DISABLE=1,
#             traffic through host memory) for baseline and fp8wire alike, both gather transports,
#             crossovers side by side, merged profile: all-reduce 64 KiB..256 MiB (x4 steps), then
#             reduce-scatter and all-gather 64 KiB..16 MiB (x2 steps, where their crossovers lie).
#             (A 16 KiB..1 GiB x2 sweep of all three did not finish in 325 s: the host-side check of
#             each point >= 512 MiB takes seconds.)
#   sockets   the socket path (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1), all-reduce 16..256 MiB
#   fine      pcie mode, reduce-scatter and all-gather 192 KiB..1.5 MiB in x1.25 steps (not by default)
#   model     fp8wire-bench model against every fabric measured
#   direct    the direct transports across real GPUs: the collectives matrix over peer memory (NVLink)
#             and over host memory (NCCL_P2P_DISABLE=1), then sweeps with --transport both --fabric both
#             (NCCL's transports and the direct one, NVLink then pcie mode): all-reduce 256 KiB..256 MiB,
#             reduce-scatter and all-gather 256 KiB..64 MiB, and the all-reduce at 64 / 256 MiB with 8, 16,
#             32 and 64 CTAs per codec kernel (direct.ctas): SMs used against bandwidth
#   standin   4+ GPUs as two hosts (NCCL_HOSTID per block of MULTI_RANKS_PER_HOST GPUs: NVLink inside,
#             sockets between): the matrix with the hierarchical path across real GPUs, the all-reduce
#             and reduce-scatter sweeps with plain NCCL, flat FP8 and hierarchical FP8 side by side, and
#             the model's check against them (on 8 GPUs run it twice: MULTI_RANKS_PER_HOST=2 and 4)
# MULTI_PARTS selects (default "correct fabrics sockets model"); MULTI_RANKS = GPUs used (default: all);
# MULTI_FABRIC = the fabrics sweeps' --fabric (default both).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
OUT="${OUT:-out/multigpu}"; mkdir -p "$OUT"
parts="${MULTI_PARTS:-correct fabrics sockets model}"
BIN=build/bench/fp8wire-bench
# Visible GPUs: CUDA_VISIBLE_DEVICES when set, else all; the first MULTI_RANKS of them are used.
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then visible="$CUDA_VISIBLE_DEVICES"
else visible=$(nvidia-smi -L 2>/dev/null | awk '/^GPU/{printf "%s%d", n++ ? "," : "", n - 1}'); fi
gpus=$(awk -F, '{print NF}' <<< "$visible")
ranks="${MULTI_RANKS:-$gpus}"
if (( gpus < 2 )); then echo "SKIPPED: ${gpus:-0} GPU(s) visible; this needs 2+"; exit 77; fi
if (( ranks < 2 || ranks > gpus )); then echo "MULTI_RANKS=$ranks: expected 2..$gpus (visible: $visible)"; exit 2; fi
CUDA_VISIBLE_DEVICES=$(cut -d, -f1-"$ranks" <<< "$visible")
export CUDA_VISIBLE_DEVICES
echo "== $gpus GPUs, using $ranks: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
nvidia-smi topo -m 2>/dev/null | head -n $(( ranks + 2 ))
status=0

has() { [[ " $parts " == *" $1 "* ]]; }

if has correct; then
  for fab in nvlink pcie; do
    envs=(); [[ $fab == pcie ]] && envs=(NCCL_P2P_DISABLE=1)
    s=$(date +%s)
    env ${envs[@]+"${envs[@]}"} timeout -k 5 "${MULTI_CORRECT_LIMIT:-150}" build/tests/sched/multirank_collectives \
      --per-gpu --ranks "$ranks" --big --timeout "$(( ${MULTI_CORRECT_LIMIT:-150} - 10 ))" > "$OUT/correct_$fab.log" 2>&1
    rc=$?; (( rc == 0 )) || status=1
    echo "==== correctness, $ranks GPUs, $fab ${envs[*]-}: rc=$rc ($(( $(date +%s) - s )) s)"
    grep -E "^FAIL" "$OUT/correct_$fab.log" | head -10
    grep -E "^(PASS|FAIL) multirank world|fabric" "$OUT/correct_$fab.log" | tail -n 3
  done
fi

sweep() {  # sweep <label> <collectives> <min> <max> [VAR=value...] -- [sweep args...]
  local label="$1" coll="$2" min="$3" max="$4"; shift 4
  local envs=() args=()
  while (( $# )) && [[ "$1" != "--" ]]; do envs+=("$1"); shift; done
  (( $# )) && { shift; args=("$@"); }
  mkdir -p "$OUT/$label"
  local s; s=$(date +%s)
  # --timeout bounds each round of ranks; --fabric both runs two rounds under the one outer limit.
  local limit="${MULTI_SWEEP_LIMIT:-200}" rounds=1
  [[ " ${args[*]-} " == *" both "* ]] && rounds=2
  env ${envs[@]+"${envs[@]}"} timeout -k 5 "$limit" "$BIN" sweep --collectives "$coll" --dtypes bf16 \
    --paths passthrough,two_shot,one_shot --min "$min" --max "$max" --warmup 5 --repeats 15 --buffers 2 \
    --gather-transport both --timeout "$(( (limit - 5) / rounds ))" --out "$OUT/$label" ${args[@]+"${args[@]}"} \
    > "$OUT/$label.log" 2> "$OUT/$label.err.log"
  local rc=$?; (( rc == 0 )) || status=1
  echo "==== $label: $coll $min..$max ${envs[*]-} ${args[*]-} rc=$rc ($(( $(date +%s) - s )) s)"
  (( rc == 0 )) || tail -n 5 "$OUT/$label.err.log"
  grep -vE '^\s*$' "$OUT/$label.log" | tail -n "${MULTI_TAIL:-60}"
  for j in "$OUT/$label"/fp8wire-sweep*.json; do
    [[ -f "$j" ]] && python3 scripts/plot_sweep.py "$j" -o "${j%.json}.png" >/dev/null 2>&1
  done
}

has fabrics && sweep fabrics_ar all_reduce 64KiB 256MiB -- --fabric "${MULTI_FABRIC:-both}" --step 4
has fabrics && sweep fabrics_rsag reduce_scatter,all_gather 64KiB 16MiB -- --fabric "${MULTI_FABRIC:-both}" --step 2
has sockets && sweep sockets all_reduce 16MiB 256MiB NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 -- --fabric net
# The pcie-mode crossovers of reduce-scatter and all-gather between the x2 steps (published all-gather
# figure to beat: 767 KiB).
has fine && sweep fine_pcie reduce_scatter,all_gather 192KiB 1536KiB -- --fabric pcie --step 1.25

if has direct; then
  for fab in nvlink pcie; do
    kind=peer_memory; envs=()
    [[ $fab == pcie ]] && kind=host_memory && envs=(NCCL_P2P_DISABLE=1)
    s=$(date +%s)
    env ${envs[@]+"${envs[@]}"} timeout -k 5 "${MULTI_CORRECT_LIMIT:-150}" build/tests/sched/multirank_collectives \
      --per-gpu --ranks "$ranks" --direct "$kind" --big --timeout "$(( ${MULTI_CORRECT_LIMIT:-150} - 10 ))" \
      > "$OUT/direct_correct_$fab.log" 2>&1
    rc=$?; (( rc == 0 )) || status=1
    echo "==== direct transport correctness, $ranks GPUs, $kind ${envs[*]-}: rc=$rc ($(( $(date +%s) - s )) s)"
    grep -E "^FAIL|direct/|^(PASS|FAIL) multirank world" "$OUT/direct_correct_$fab.log" | head -12
  done
  sweep direct_ar all_reduce 256KiB 256MiB -- --fabric "${MULTI_FABRIC:-both}" --step 4 --transport both
  sweep direct_rsag reduce_scatter,all_gather 256KiB 64MiB -- --fabric "${MULTI_FABRIC:-both}" --step 4 --transport both
  for ctas in 8 16 32 64; do
    sweep "direct_ctas$ctas" all_reduce 64MiB 256MiB FP8WIRE_DIRECT_CTAS=$ctas -- --fabric "${MULTI_FABRIC:-both}" \
      --step 4 --transport direct
  done
fi

if has standin; then
  rph="${MULTI_RANKS_PER_HOST:-2}"
  if (( ranks < 2 * rph || ranks % rph != 0 )); then
    echo "standin: $ranks GPUs cannot make 2+ hosts of $rph; skipped"
  else
    s=$(date +%s)
    timeout -k 5 "${MULTI_CORRECT_LIMIT:-150}" build/tests/sched/multirank_collectives --per-gpu --ranks "$ranks" \
      --ranks-per-host "$rph" --timeout "$(( ${MULTI_CORRECT_LIMIT:-150} - 10 ))" > "$OUT/standin_correct.log" 2>&1
    rc=$?; (( rc == 0 )) || status=1
    echo "==== stand-in $((ranks / rph)) hosts x $rph GPUs, correctness: rc=$rc ($(( $(date +%s) - s )) s)"
    grep -E "^FAIL|hierarchical|^(PASS|FAIL) multirank world" "$OUT/standin_correct.log" | head -12
    sweep "standin_${rph}" all_reduce,reduce_scatter 1MiB 256MiB -- --ranks-per-host "$rph" --fabric net --step 4 \
      --paths passthrough,two_shot,one_shot,hierarchical
    "$BIN" model --hierarchy "$OUT/standin_${rph}"/fp8wire-sweep*.json > "$OUT/standin_model.log" 2>&1
    echo "==== stand-in model check rc=$?"; tail -n 30 "$OUT/standin_model.log"
  fi
fi

if has model; then
  jsons=$(ls "$OUT"/*/fp8wire-sweep*.json 2>/dev/null)
  if [[ -n "$jsons" ]]; then
    "$BIN" model $jsons > "$OUT/model.log" 2>&1
    echo "==== model rc=$?"; tail -n 40 "$OUT/model.log"
  fi
fi
exit $status
