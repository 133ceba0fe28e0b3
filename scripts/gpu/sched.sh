#!/usr/bin/env bash
# GPU checks of sched/ (run from the repo root, build in build/, one GPU): emulated multi-rank jobs on
# GPU 0, each rank its own NCCL_HOSTID.
#   1. tests/sched/multirank_collectives: Engine all-reduce (two-shot, one-shot, ring) / reduce-scatter /
#      all-gather for f32/f16/bf16, sum/avg, 1 element .. 256 MiB, in-place and out-of-place, groups,
#      coalescing, pipelining, graph capture; error bound, ranks bitwise identical, pass-through == NCCL.
#   2. tests/sched/ddp_parity.py: PyTorch DDP 200 steps with and without LD_PRELOAD=build/shim/libfp8wire.so.
#   3. tests/sched/graph_capture.py: torch CUDA graph of dist.all_reduce under the shim (a plain-NCCL
#      capture run first; SKIPPED when plain NCCL cannot capture on this testbed; per-phase watchdog).
#   4. tests/sched/all_to_all_torch.py: dist.all_to_all_single (equal splits: ncclAlltoAll) with and
#      without the shim and FP8WIRE_COLLECTIVES_ALL_TO_ALL=1: one quantization's bound, own chunk exact.
#   5. tests/sched/send_recv_torch.py: uneven dist.all_to_all_single, batch_isend_irecv and dist.send /
#      dist.recv (ncclSend / ncclRecv) with and without the shim and FP8WIRE_COLLECTIVES_SEND_RECV=1: one
#      quantization's bound, own chunk and int32 exact, fp8 output deterministic.
#   6. tests/sched/moe_parity.py / pipeline_parity.py: an expert-parallel MoE layer (dispatch and combine by
#      uneven all_to_all_single; also with the combine kept exact) and a two-stage pipeline (dist.send /
#      dist.recv of activations and their gradients), 300 steps each with and without the shim: loss
#      curves as the main job judges them (scripts/loss_parity.py), final evaluation loss within 2 %.
# Env: SCHED_RANKS (default "2 3": DDP runs), SCHED_GRAPH_RANKS (default "2 3"), SCHED_MULTIRANK_RANKS
# (default: SCHED_RANKS and 4, comma-separated), SCHED_MULTIRANK_LIMIT (s, default 280), SCHED_BIG (1: the
# 256 MiB case; 0: 64 MiB). Logs under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
gpu_out sched
rm -f "$OUT"/*.log  # the verdict below reads every log here: none from an earlier run
ranks="${SCHED_RANKS:-2 3}"
graph_ranks="${SCHED_GRAPH_RANKS:-2 3}"
gpu_step_show '^(PASS|FAIL|SKIPPED|INFO)'

bin=build/tests/sched/multirank_collectives
if [[ -x "$bin" ]]; then
  world_list="${SCHED_MULTIRANK_RANKS:-$(echo $ranks 4 | tr ' ' '\n' | sort -un | paste -sd, -)}"
  mr_limit="${SCHED_MULTIRANK_LIMIT:-280}"
  big=(); [[ "${SCHED_BIG:-1}" == 1 ]] && big=(--big)
  gpu_step multirank_collectives "$mr_limit" "$bin" --ranks "$world_list" "${big[@]}" --timeout "$(( mr_limit - 10 ))"
  grep -E "^FAIL" "$OUT/multirank_collectives.log" | head -20
else
  gpu_fail "multirank_collectives: $bin not built (cmake --build build --target multirank_collectives)"
fi

for n in $ranks; do
  gpu_step "ddp_parity_n$n" 120 "$PY" tests/sched/ddp_parity.py --nproc "$n" --out "$OUT"
done
for n in $ranks; do
  gpu_step "all_to_all_torch_n$n" 200 "$PY" tests/sched/all_to_all_torch.py --nproc "$n" --out "$OUT"
done
for n in $ranks; do
  gpu_step "send_recv_torch_n$n" 200 "$PY" tests/sched/send_recv_torch.py --nproc "$n" --out "$OUT"
done
for n in $ranks; do
  gpu_step "moe_parity_n$n" 480 "$PY" tests/sched/moe_parity.py --nproc "$n" --out "$OUT"
done
for n in $ranks; do
  (( n % 2 )) && continue  # two stages per pipeline
  gpu_step "pipeline_parity_n$n" 330 "$PY" tests/sched/pipeline_parity.py --nproc "$n" --out "$OUT"
done
for n in $graph_ranks; do
  # graph_capture.py bounds itself (per-phase watchdog, two launches of <= 80 s); the outer timeout
  # is only a backstop. A SKIPPED (plain NCCL cannot capture on this testbed) ends the series.
  gpu_step "graph_capture_n$n" 175 "$PY" tests/sched/graph_capture.py --nproc "$n" --out "$OUT" \
    --step-timeout 30
  if grep -q "^SKIPPED" "$OUT/graph_capture_n$n.log"; then
    gpu_rows+=("     graph_capture: larger worlds not run (skipped at n=$n)")
    break
  fi
done

grep -hE "^(PASS|FAIL) multirank world" "$OUT/multirank_collectives.log" 2>/dev/null
grep -qE "^FAIL" "$OUT"/*.log 2>/dev/null && gpu_fail "a FAIL line in a log of $OUT"
gpu_summary sched
