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
# Each job through the shim (2-4) must log the hierarchical path ("first all_reduce on path
# hierarchical" or the reduce-scatter's); the matrix runs the algorithms itself and logs no path.
# Logs under $OUT; exit 0 only if every run passed and each job took that path.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
gpu_out hierarchy
export FP8WIRE_HIERARCHY_RANKS_PER_HOST=2
gpu_step_show '^(FAIL|SKIPPED)'
run() {  # run <label> <limit s> <command...>: a step whose row also names the path of its first FP8 call
  local label="$1" limit="$2"; shift 2
  gpu_step "$label" "$limit" env FP8WIRE_LOG_LEVEL=info FP8WIRE_LOG_FILE="$OUT/$label.fp8wire.%r.log" "$@"
  local path; path=$(grep -ho "first [a-z_]* on path [a-z_]*" "$OUT/$label".fp8wire.*.log 2>/dev/null | sort -u | paste -sd';' -)
  gpu_rows[-1]+="  ${path:-no FP8 path logged}"
}
hierarchical() {  # hierarchical <label>: a job through the shim must have taken the hierarchical path
  grep -q "on path hierarchical" "$OUT/$1".fp8wire.*.log 2>/dev/null ||
    gpu_fail "$1: no FP8 call logged on the hierarchical path (see $OUT/$1.fp8wire.*.log)"
}
# The collectives matrix runs the algorithms itself, not through the shim: no path in its log.
run multirank_2x2 150 build/tests/sched/multirank_collectives --ranks 4 --ranks-per-host 2 --timeout 140
grep -E "hierarchical" "$OUT/multirank_2x2.log" | head -4
run ddp_parity_2x2 120 "$PY" tests/sched/ddp_parity.py --nproc 4 --out "$OUT"
hierarchical ddp_parity_2x2
run graph_capture_2x2 120 "$PY" tests/sched/graph_capture.py --nproc 4 --out "$OUT" --step-timeout 40
hierarchical graph_capture_2x2
run fsdp2_2x2 200 "$PY" tests/integration/test_fsdp2.py --nproc 4 --reduce-dtype fp32
hierarchical fsdp2_2x2
echo "================ hierarchy (2 hosts x 2 ranks forced on 4 emulated ranks) ================"
grep -hE "^(PASS|FAIL) multirank world" "$OUT/multirank_2x2.log" 2>/dev/null
tail -n 3 "$OUT/fsdp2_2x2.log"
gpu_summary hierarchy
