#!/usr/bin/env bash
# The issue-4 performance points on the emulated testbed (N ranks sharing one GPU over NCCL sockets):
# bf16 all-reduce, plain NCCL vs fp8wire's two-shot / one-shot / ring, at 4, 16, 64 and 256 MiB,
# for 2 and 4 ranks, and once more at 2 ranks against NCCL's Tree all-reduce (set per collective:
# NCCL_ALGO=allreduce:tree, because NCCL_ALGO=Tree alone breaks all-gather). Every point is checked
# for correctness by fp8wire-bench. JSON and tables under $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT="${OUT:-out/perf}"; mkdir -p "$OUT"
BIN=build/bench/fp8wire-bench
sweep() {  # sweep <label> <ranks> [env...]
  local label="$1" ranks="$2"; shift 2
  echo "==== $label: $ranks emulated ranks $*"
  env "$@" timeout -k 5 150 "$BIN" sweep --emulate-ranks "$ranks" --collectives all_reduce --dtypes bf16 \
    --min 4MiB --max 256MiB --step 4 --warmup 2 --repeats 5 --buffers 2 --timeout 140 \
    --out "$OUT/$label" > "$OUT/$label.log" 2> "$OUT/$label.err"
  echo "rc=$?"; grep -vE '^\s*$' "$OUT/$label.log" | tail -n 30
}
sweep ar2 2
sweep ar2_tree 2 NCCL_ALGO=allreduce:tree
sweep ar4 4
