#!/usr/bin/env bash
# GPU checks of the direct transports on one GPU (scripts/gpu/all.sh direct; build in build/):
#   1. tests/sched/direct_kernels_gpu: the direct algorithms' kernels with N = 2..8 simulated peers in
#      one process (device and host windows), bit for bit the CPU reference; graph replay; the
#      host-memory link's bandwidth against pinned cudaMemcpyAsync, per CTA cap;
#   2. tests/sched/multirank_collectives --direct host_memory | peer_memory: the collectives matrix with
#      every FP8 call the direct transport carries over it, between processes sharing the GPU
#      (direct.assume_one_host), and a case checking that they went over it, with the library's
#      defaults (own data on the device, copied in and out); host memory once more with own data in
#      the window (DIRECT_MULTIRANK_OWN_IN_WINDOW world sizes, default 2,4), without copy-in and
#      copy-out, and with one of them (DIRECT_MULTIRANK_COPIES, default 2,4), with 2 and with 4 buffer
#      sets (DIRECT_MULTIRANK_SETS, default 2,4), with lane flags
#      (DIRECT_MULTIRANK_LANE_FLAGS, default 2,4), without copy lanes (DIRECT_MULTIRANK_NO_COPY_LANES,
#      default 2,4), with per-peer flags (DIRECT_MULTIRANK_PER_PEER_FLAGS, default 2,3,4), with an outbox
#      (DIRECT_MULTIRANK_OUTBOX, default 2,3,4; over peer memory too, DIRECT_MULTIRANK_OUTBOX_PEER, default 2,4)
#      and with the lanes apart (DIRECT_MULTIRANK_LANES_APART, default 2,4; also without the copies, and
#      with copy-in alone); both kinds once more with CUDA_DEVICE_MAX_CONNECTIONS=1, every stream of a
#      rank on one hardware queue (DIRECT_MULTIRANK_ONE_CONNECTION, default 2,4);
#   3. tests/sched/direct_faults_gpu: a peer gone, a peer absent: released by an abort, no hang;
#   4. PyTorch DDP parity under the shim with each transport forced, CUDA-graph capture with host memory
#      (with the default lane events, and with direct.lane_flags);
#   5. fp8wire-bench sweep at 2 emulated ranks: --transport both (NCCL's sockets and the direct transport,
#      peer memory here) and --transport host_memory, and the profiles they calibrate.
# Env: DIRECT_MULTIRANK_HOST (world sizes, default 2,3,4), DIRECT_MULTIRANK_PEER (default 2,3,4),
# DIRECT_MULTIRANK_OWN_IN_WINDOW, _COPIES, _SETS, _LANE_FLAGS, _LANES_APART and _NO_COPY_LANES (default 2,4),
# DIRECT_MULTIRANK_PER_PEER_FLAGS and _OUTBOX (default 2,3,4), DIRECT_MULTIRANK_OUTBOX_PEER and
# DIRECT_MULTIRANK_ONE_CONNECTION (default 2,4),
# DIRECT_PARTS
# (default "kernels multirank faults torch bench").
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
gpu_out direct
parts="${DIRECT_PARTS:-kernels multirank faults torch bench}"
gpu_step_show '^(PASS|FAIL|SKIPPED|bandwidth|direct)'
has() { [[ " $parts " == *" $1 "* ]]; }
direct_env=(FP8WIRE_DIRECT_TRANSPORT=host_memory FP8WIRE_DIRECT_ASSUME_ONE_HOST=1)

if has kernels; then
  gpu_step direct_kernels 150 build/tests/sched/direct_kernels_gpu
fi
if has multirank; then
  gpu_step multirank_host_memory 150 build/tests/sched/multirank_collectives --direct host_memory \
    --ranks "${DIRECT_MULTIRANK_HOST:-2,3,4}" --timeout 140
  gpu_step multirank_peer_memory 150 build/tests/sched/multirank_collectives --direct peer_memory \
    --ranks "${DIRECT_MULTIRANK_PEER:-2,3,4}" --timeout 140
  gpu_step multirank_host_memory_own_in_window 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-own-in-window --ranks "${DIRECT_MULTIRANK_OWN_IN_WINDOW:-2,4}" --timeout 140
  gpu_step multirank_host_memory_no_copies 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-no-copy-in --direct-no-copy-out --ranks "${DIRECT_MULTIRANK_COPIES:-2,4}" --timeout 140
  gpu_step multirank_host_memory_copy_in_only 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-no-copy-out --ranks "${DIRECT_MULTIRANK_COPIES:-2,4}" --timeout 140
  gpu_step multirank_host_memory_copy_out_only 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-no-copy-in --ranks "${DIRECT_MULTIRANK_COPIES:-2,4}" --timeout 140
  gpu_step multirank_host_memory_sets2 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-sets 2 --ranks "${DIRECT_MULTIRANK_SETS:-2,4}" --timeout 140
  gpu_step multirank_host_memory_sets4 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-sets 4 --ranks "${DIRECT_MULTIRANK_SETS:-2,4}" --timeout 140
  gpu_step multirank_host_memory_lane_flags 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-lane-flags --ranks "${DIRECT_MULTIRANK_LANE_FLAGS:-2,4}" --timeout 140
  gpu_step multirank_host_memory_no_copy_lanes 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-no-copy-lanes --ranks "${DIRECT_MULTIRANK_NO_COPY_LANES:-2,4}" --timeout 140
  gpu_step multirank_host_memory_per_peer_flags 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-per-peer-flags --ranks "${DIRECT_MULTIRANK_PER_PEER_FLAGS:-2,3,4}" --timeout 140
  gpu_step multirank_host_memory_outbox 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-outbox --ranks "${DIRECT_MULTIRANK_OUTBOX:-2,3,4}" --timeout 140
  gpu_step multirank_peer_memory_outbox 150 build/tests/sched/multirank_collectives --direct peer_memory \
    --direct-outbox --ranks "${DIRECT_MULTIRANK_OUTBOX_PEER:-2,4}" --timeout 140
  gpu_step multirank_host_memory_lanes_apart 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-lanes-apart --ranks "${DIRECT_MULTIRANK_LANES_APART:-2,4}" --timeout 140
  gpu_step multirank_host_memory_lanes_apart_no_copies 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-lanes-apart --direct-no-copy-in --direct-no-copy-out --ranks "${DIRECT_MULTIRANK_LANES_APART:-2,4}" \
    --timeout 140
  gpu_step multirank_host_memory_lanes_apart_copy_in 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-lanes-apart --direct-no-copy-out --ranks "${DIRECT_MULTIRANK_LANES_APART:-2,4}" --timeout 140
  # Every stream of a rank on one hardware queue, as some training stacks set it: a wait issued ahead
  # of a signal its peer needs would hang here.
  for kind in host_memory peer_memory; do
    gpu_step "multirank_${kind}_one_connection" 150 env CUDA_DEVICE_MAX_CONNECTIONS=1 \
      build/tests/sched/multirank_collectives --direct "$kind" --ranks "${DIRECT_MULTIRANK_ONE_CONNECTION:-2,4}" \
      --timeout 140
  done
  grep -hE "direct/|^(PASS|FAIL) multirank" "$OUT"/multirank_*.log | sort | uniq -c | head -20
fi
if has faults; then
  gpu_step direct_faults 120 build/tests/sched/direct_faults_gpu
fi
if has torch; then
  for kind in host_memory peer_memory; do
    mkdir -p "$OUT/ddp_$kind"
    gpu_step "ddp_parity_$kind" 120 env FP8WIRE_DIRECT_TRANSPORT=$kind FP8WIRE_DIRECT_ASSUME_ONE_HOST=1 \
      "$PY" tests/sched/ddp_parity.py --nproc 2 --out "$OUT/ddp_$kind"
    echo "ddp ($kind): $(grep -ohE 'first all_reduce on path [a-z_]+ over [a-z_]+' "$OUT/ddp_$kind"/ddp_fp8_*.log | sort -u)"
  done
  gpu_step graph_capture_host_memory 175 env "${direct_env[@]}" "$PY" tests/sched/graph_capture.py --nproc 2 --out "$OUT" \
    --step-timeout 30
  echo "graph: $(grep -ohE 'first all_reduce on path [a-z_]+ over [a-z_]+' "$OUT"/graph_n2.rank*.log | sort -u)"
  mkdir -p "$OUT/lane_flags"
  gpu_step graph_capture_lane_flags 175 env "${direct_env[@]}" FP8WIRE_DIRECT_LANE_FLAGS=1 "$PY" tests/sched/graph_capture.py \
    --nproc 2 --out "$OUT/lane_flags" --step-timeout 30
fi
if has bench; then
  gpu_step bench_direct 150 build/bench/fp8wire-bench sweep --emulate-ranks 2 --transport both --collectives all_reduce \
    --dtypes bf16 --paths passthrough,two_shot,one_shot --min 4MiB --max 64MiB --step 4 --warmup 2 --repeats 5 \
    --buffers 2 --out "$OUT" --json "$OUT/sweep_direct_2ranks.json" --profile "$OUT/profile_direct_2ranks.toml"
  grep -E "^#|MiB|direct" "$OUT/bench_direct.log" | tail -n 30
  gpu_step bench_host_memory 120 build/bench/fp8wire-bench sweep --emulate-ranks 2 --transport host_memory \
    --collectives all_reduce --dtypes bf16 --paths passthrough,two_shot,one_shot --min 4MiB --max 64MiB --step 4 \
    --warmup 2 --repeats 5 --buffers 2 --out "$OUT" --json "$OUT/sweep_host_memory_2ranks.json" \
    --profile "$OUT/profile_host_memory_2ranks.toml"
  grep -E "^#|MiB|direct" "$OUT/bench_host_memory.log" | tail -n 16
fi
gpu_summary direct
