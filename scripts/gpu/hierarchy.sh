#!/usr/bin/env bash
# The hierarchical path on one GPU (scripts/gpu/all.sh hierarchy): 4 ranks emulated on GPU 0 (NCCL
# joins all of them over sockets, each its own host to it), fp8wire's host map forced to 2 hosts x 2
# ranks (FP8WIRE_HIERARCHY_RANKS_PER_HOST=2). The algorithm, the sub-communicators and the error
# bound are checked for real; the timings of such a testbed mean nothing.
#   1. multirank_collectives --ranks 4 --ranks-per-host 2: the collectives matrix with the
#      hierarchical all-reduce and reduce-scatter among the cases;
#   2. DDP parity, 4 ranks (200 steps against plain NCCL, parameters bitwise identical across ranks);
#   3. CUDA graph capture, 4 ranks;
#   4. FSDP2 (reduce-scatter) parity, 4 ranks, reduce dtype fp32.
# Each run's log must show the hierarchical path ("first all_reduce on path hierarchical" or the
# reduce-scatter's); logs under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
OUT="${OUT:-$PWD/out/hierarchy}"; mkdir -p "$OUT"
export FP8WIRE_HIERARCHY_RANKS_PER_HOST=2
rows=()
run() {  # run <label> <limit s> <command...>
  local label="$1" limit="$2"; shift 2
  local s; s=$(date +%s)
  FP8WIRE_LOG_LEVEL=info FP8WIRE_LOG_FILE="$OUT/$label.fp8wire.%r.log" timeout -k 5 "$limit" "$@" > "$OUT/$label.log" 2>&1
  local rc=$?
  local path; path=$(grep -ho "first [a-z_]* on path [a-z_]*" "$OUT/$label".fp8wire.*.log 2>/dev/null | sort -u | paste -sd';' -)
  rows+=("$(printf '%-22s rc=%-3s %4ss  pass %-4s fail %-3s  %s' "$label" "$rc" "$(( $(date +%s) - s ))" \
    "$(grep -cE '^PASS' "$OUT/$label.log")" "$(grep -cE '^FAIL' "$OUT/$label.log")" "${path:-no FP8 path logged}")")
  grep -E "^(FAIL|SKIPPED)" "$OUT/$label.log" | head -10
}
run multirank_2x2 150 build/tests/sched/multirank_collectives --ranks 4 --ranks-per-host 2 --timeout 140
grep -E "hierarchical" "$OUT/multirank_2x2.log" | head -4
run ddp_parity_2x2 120 "$PY" tests/sched/ddp_parity.py --nproc 4 --out "$OUT"
run graph_capture_2x2 120 "$PY" tests/sched/graph_capture.py --nproc 4 --out "$OUT" --step-timeout 40
run fsdp2_2x2 200 "$PY" tests/integration/test_fsdp2.py --nproc 4 --reduce-dtype fp32
echo "================ hierarchy (2 hosts x 2 ranks forced on 4 emulated ranks) ================"
grep -hE "^(PASS|FAIL) multirank world" "$OUT/multirank_2x2.log" 2>/dev/null
tail -n 3 "$OUT/fsdp2_2x2.log"
for r in "${rows[@]}"; do echo "$r"; done
