#!/usr/bin/env bash
# The recorded performance points on the emulated testbed (N ranks sharing one GPU over NCCL
# sockets), every point checked for correctness by fp8wire-bench:
#   ar2       bf16 all-reduce, 2 ranks, 64 KiB..256 MiB: plain NCCL vs two-shot / one-shot / ring,
#             crossover, threshold profile, plot
#   ar2_tree  the same against NCCL's Tree all-reduce (set per collective: NCCL_ALGO=allreduce:tree,
#             because NCCL_ALGO=Tree alone breaks all-gather), 4..256 MiB
#   ar4       4 ranks, 4..256 MiB
#   rsag2     reduce-scatter and all-gather, 2 ranks, 64 KiB..64 MiB (crossovers)
#   ar4_sr    ar4 with the FP8 gather step over grouped send/recv (--gather-transport sendrecv)
#   ar2_sr    2 ranks, 4..256 MiB, the same paths, gather step over send/recv
# JSON, profiles, plots and tables under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
OUT="${OUT:-out/perf}"; mkdir -p "$OUT"
BIN=build/bench/fp8wire-bench
only="${PERF_SWEEPS:-ar2 ar4 ar2_tree rsag2 ar4_sr ar2_sr}"   # which sweeps to run
sweep() {  # sweep <label> <ranks> <min> <max> <collectives> <paths> [VAR=value...] [-- sweep args...]
  local label="$1" ranks="$2" min="$3" max="$4" coll="$5" paths="$6"; shift 6
  [[ " $only " == *" $label "* ]] || return 0
  local envs=() args=()
  while (( $# )) && [[ "$1" != "--" ]]; do envs+=("$1"); shift; done
  (( $# )) && { shift; args=("$@"); }
  set -- "${envs[@]}"
  mkdir -p "$OUT/$label"
  local s; s=$(date +%s)
  env "$@" timeout -k 5 "${PERF_SWEEP_LIMIT:-100}" "$BIN" sweep --emulate-ranks "$ranks" --collectives "$coll" \
    --dtypes bf16 --paths "$paths" --min "$min" --max "$max" --step 4 --warmup 2 --repeats 5 --buffers 2 \
    --timeout "$(( ${PERF_SWEEP_LIMIT:-100} - 5 ))" --out "$OUT/$label" "${args[@]}" > "$OUT/$label.log" 2> "$OUT/$label.err"
  local rc=$?
  echo "==== $label: $ranks ranks, $coll, $min..$max $* ${args[*]} rc=$rc ($(( $(date +%s) - s )) s)"
  (( rc == 0 )) || tail -n 5 "$OUT/$label.err"
  grep -vE '^\s*$' "$OUT/$label.log" | tail -n 24
  python3 scripts/plot_sweep.py "$OUT/$label/fp8wire-sweep.json" -o "$OUT/$label.png" >/dev/null 2>&1 || true
}
sweep ar2 2 64KiB 256MiB all_reduce passthrough,two_shot,one_shot,ring
sweep ar4 4 4MiB 256MiB all_reduce passthrough,two_shot,one_shot
sweep ar2_tree 2 4MiB 256MiB all_reduce passthrough,two_shot,one_shot NCCL_ALGO=allreduce:tree
sweep rsag2 2 64KiB 64MiB reduce_scatter,all_gather passthrough,two_shot,one_shot
sweep ar4_sr 4 4MiB 256MiB all_reduce passthrough,two_shot,one_shot -- --gather-transport sendrecv
sweep ar2_sr 2 4MiB 256MiB all_reduce passthrough,two_shot,one_shot -- --gather-transport sendrecv
# Experiments (only when named in PERF_SWEEPS): the ring path at 4 ranks, and NCCL's point-to-point
# chunk at 512 KiB (an NCCL setting of the job; the all-reduce baseline does not use it) per transport.
sweep ar4_ring 4 64MiB 256MiB all_reduce passthrough,ring
sweep ar4_sr_chunk 4 64MiB 256MiB all_reduce passthrough,two_shot NCCL_P2P_NET_CHUNKSIZE=524288 -- --gather-transport sendrecv
sweep ar4_ag_chunk 4 64MiB 256MiB all_reduce passthrough,two_shot NCCL_P2P_NET_CHUNKSIZE=524288 -- --gather-transport allgather
sweep ar2_chunk 2 64MiB 256MiB all_reduce passthrough,two_shot,one_shot NCCL_P2P_NET_CHUNKSIZE=524288 -- --gather-transport sendrecv
sweep ar2_chunk_small 2 1MiB 64MiB all_reduce passthrough,one_shot,two_shot NCCL_P2P_NET_CHUNKSIZE=524288 -- --gather-transport sendrecv
sweep ar2_chunk_ag 2 1MiB 64MiB all_reduce passthrough,one_shot NCCL_P2P_NET_CHUNKSIZE=524288 -- --gather-transport allgather
sweep ar4_chunk_small 4 4MiB 16MiB all_reduce passthrough,one_shot,two_shot NCCL_P2P_NET_CHUNKSIZE=524288 -- --gather-transport sendrecv
# Both gather transports in one sweep (the calibrated profile then prices both, and the planner picks).
sweep ar4_both 4 4MiB 256MiB all_reduce passthrough,two_shot,one_shot -- --gather-transport both
sweep ar2_both_chunk 2 1MiB 256MiB all_reduce passthrough,two_shot,one_shot NCCL_P2P_NET_CHUNKSIZE=524288 -- --gather-transport both
jsons=$(ls "$OUT"/*/fp8wire-sweep.json 2>/dev/null)
if [[ -n "$jsons" ]]; then
  "$BIN" model $jsons > "$OUT/model.log" 2>&1
  echo "==== model rc=$?"; tail -n 25 "$OUT/model.log"
fi
