#!/usr/bin/env bash
# GPU checks of the direct transports on one GPU (scripts/gpu/all.sh direct; build in build/):
#   1. tests/sched/direct_kernels_gpu: the direct algorithms' kernels with N = 2..8 simulated peers in
#      one process (device and host windows), bit for bit the CPU reference; graph replay; the
#      host-memory link's bandwidth against pinned cudaMemcpyAsync, per CTA cap;
#   2. tests/sched/multirank_collectives --direct host_memory | peer_memory: the collectives matrix with
#      every FP8 call the direct transport carries over it, between processes sharing the GPU
#      (direct.assume_one_host), and a case checking that they went over it, with the library's
#      defaults (host memory: the copy_engine protocol); host memory once more with the kernels
#      protocol (DIRECT_MULTIRANK_KERNELS world sizes, default 2,4), with 2 and with 4 buffer sets
#      (DIRECT_MULTIRANK_SETS, default 2,4); both kinds once more with CUDA_DEVICE_MAX_CONNECTIONS=1,
#      every stream of a rank on one hardware queue (DIRECT_MULTIRANK_ONE_CONNECTION, default 2,4);
#   3. tests/sched/direct_faults_gpu: a peer gone, a peer absent: released by an abort, no hang;
#   4. PyTorch DDP parity under the shim with each transport forced, CUDA-graph capture with host memory
#      (each protocol: captured calls hand their stages over by events);
#   5. fp8wire-bench sweep at 2 emulated ranks: --transport both (NCCL's sockets and the direct transport,
#      peer memory here) and --transport host_memory, and the profiles they calibrate.
# Env: DIRECT_MULTIRANK_HOST (world sizes, default 2,3,4), DIRECT_MULTIRANK_PEER (default 2,3,4),
# DIRECT_MULTIRANK_KERNELS, _SETS and _ONE_CONNECTION (default 2,4),
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
  gpu_step multirank_host_memory_kernels 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-protocol kernels --ranks "${DIRECT_MULTIRANK_KERNELS:-2,4}" --timeout 140
  gpu_step multirank_host_memory_sets2 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-sets 2 --ranks "${DIRECT_MULTIRANK_SETS:-2,4}" --timeout 140
  gpu_step multirank_host_memory_sets4 150 build/tests/sched/multirank_collectives --direct host_memory \
    --direct-sets 4 --ranks "${DIRECT_MULTIRANK_SETS:-2,4}" --timeout 140
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
  mkdir -p "$OUT/kernels"
  gpu_step graph_capture_kernels 175 env "${direct_env[@]}" FP8WIRE_DIRECT_PROTOCOL=kernels "$PY" tests/sched/graph_capture.py \
    --nproc 2 --out "$OUT/kernels" --step-timeout 30
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
