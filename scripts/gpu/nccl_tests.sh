#!/usr/bin/env bash
# NVIDIA's nccl-tests as a second client of libfp8wire.so beside torch.distributed: all_reduce_perf
# (alltoall_perf and sendrecv_perf in the cases a2a and sendrecv), 4 ranks emulated on GPU 0 (one MPI process per rank, each its own NCCL_HOSTID through
# tests/pylib/emulated_launch.py --exec-rank, NCCL sockets; side by side under a private MPS daemon
# where one can be started, FP8WIRE_MPS=0 for time slicing),
# plain NCCL against the library, one factor varied at a time:
#   base  : nccl-tests' defaults (fp32, back-to-back -n 20 timed on the host)
#   bf16  : -d bfloat16 (the dtype of gradients and of the torch sweeps)
#   env   : bf16 + FP8WIRE_GATHER_TRANSPORT=sendrecv and NCCL_P2P_NET_CHUNKSIZE=524288 (the main job's
#           settings on this testbed)
#   graph : bf16, every iteration captured into a CUDA graph and replayed (-G 1)
#   profile: bf16 with FP8WIRE_CONFIG=$PROFILE, a profile fp8wire-bench sweep calibrated on this testbed
#           (the planner then picks path and gather transport from measurements, as torch jobs get)
#   a2a   : alltoall_perf, bf16, with collectives.all_to_all and .send_recv on (nccl-tests issues the
#           all-to-all as ncclAlltoAll or as grouped sends and receives, by its NCCL version)
#   sendrecv: sendrecv_perf, bf16, with collectives.send_recv on (each rank to the next, in one group)
# The binaries are not built here: carry them as .carry/nccl-tests.tar.gz, which
# scripts/nccl-tests-package.sh makes on any machine with nvcc (NVIDIA's source built with MPI=1
# against the MPICH of the `mpich` pip wheel, and that MPICH in its mpi/ folder). nccl-tests' own correctness check flags FP8 results by design (it allows no
# error for sums), so it is off (-c 0); fp8wire-bench checks every point it times.
#   SHIM=build/shim/libfp8wire.so [RANKS=4] [SIZES="-b 4M -e 256M -f 4"] [CASES="base bf16 env graph"] scripts/gpu/nccl_tests.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
NT="${NCCL_TESTS_DIR:-/tmp/nccl-tests}"
if [[ ! -d "$NT" && -f .carry/nccl-tests.tar.gz ]]; then mkdir -p "$NT" && tar xzf .carry/nccl-tests.tar.gz -C "$NT" --strip-components=1; fi
OUT="${OUT:-out/nccl-tests}"; mkdir -p "$OUT"
RANKS="${RANKS:-4}"; SIZES="${SIZES:--b 4M -e 256M -f 4}"; ITERS="${ITERS:-20}"
CASES="${CASES:-base bf16 env graph}"
SHIM="$(realpath "${SHIM:-build/shim/libfp8wire.so}")"
if [[ ! -x "$NT/all_reduce_perf" ]]; then echo "SKIPPED: no nccl-tests binaries in $NT"; exit 77; fi
nccl_dir="$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)/lib"
export LD_LIBRARY_PATH="$nccl_dir:$NT/mpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_TESTS_DEVICE=0   # nccl-tests would pick GPU <local rank>: ranks share one hostname here
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
# Each MPI process becomes an emulated rank, the library preloaded into the test binary only (never
# into mpiexec or its proxies).
rank=("$PY" "$PWD/tests/pylib/emulated_launch.py" --exec-rank)
PERF=all_reduce_perf  # the nccl-tests binary `run` starts; a case may name another
run() {  # run <label> <with library 0|1> [VAR=val ...] [-- extra nccl-tests args]
  local label="$1" shim="$2"; shift 2
  local envs=() args=()
  while (( $# )) && [[ "$1" != "--" ]]; do envs+=("$1"); shift; done
  (( $# )) && { shift; args=("$@"); }
  local extra=() preload=()
  (( shim )) && extra=(FP8WIRE_LOG_LEVEL=info "FP8WIRE_LOG_FILE=$OUT/$label.fp8wire.%r.log") preload=(--preload "$SHIM")
  env "${envs[@]}" "${extra[@]}" timeout -k 5 "${RUN_LIMIT:-120}" "$NT/mpi/bin/mpiexec.hydra" -n "$RANKS" \
    "${rank[@]}" "${preload[@]}" -- "$NT/$PERF" $SIZES -n "$ITERS" -w 2 -c 0 "${args[@]}" > "$OUT/$label.txt" 2>&1
  echo "$label rc=$?"
}
table() {  # table <label>: size, NCCL and fp8wire out-of-place time, ratio
  paste <(grep -E '^ +[0-9]+ ' "$OUT/$1.nccl.txt" | awk '{print $1, $6}') \
        <(grep -E '^ +[0-9]+ ' "$OUT/$1.fp8.txt" | awk '{print $6}') |
    awk -v l="$1" '{printf "%-6s %12d B  nccl %10.1f us  fp8wire %10.1f us  %5.2fx\n", l, $1, $2, $3, ($3 > 0 ? $2 / $3 : 0)}'
}
for c in $CASES; do
  case "$c" in
    base)  run base.nccl 0; run base.fp8 1 ;;
    bf16)  run bf16.nccl 0 -- -d bfloat16; run bf16.fp8 1 -- -d bfloat16 ;;
    env)   run env.nccl 0 NCCL_P2P_NET_CHUNKSIZE=524288 -- -d bfloat16
           run env.fp8 1 NCCL_P2P_NET_CHUNKSIZE=524288 FP8WIRE_GATHER_TRANSPORT=sendrecv -- -d bfloat16 ;;
    graph) run graph.nccl 0 -- -d bfloat16 -G 1; run graph.fp8 1 -- -d bfloat16 -G 1 ;;
    profile) run profile.nccl 0 -- -d bfloat16
             run profile.fp8 1 "FP8WIRE_CONFIG=$(realpath "${PROFILE:?set PROFILE=fp8wire-profile.toml}")" -- -d bfloat16 ;;
    a2a)   PERF=alltoall_perf
           run a2a.nccl 0 -- -d bfloat16
           run a2a.fp8 1 FP8WIRE_COLLECTIVES_ALL_TO_ALL=1 FP8WIRE_COLLECTIVES_SEND_RECV=1 -- -d bfloat16
           PERF=all_reduce_perf ;;
    sendrecv) PERF=sendrecv_perf
           run sendrecv.nccl 0 -- -d bfloat16
           run sendrecv.fp8 1 FP8WIRE_COLLECTIVES_SEND_RECV=1 -- -d bfloat16
           PERF=all_reduce_perf ;;
    *) echo "unknown case $c" ;;
  esac
done
echo "==== nccl-tests (all_reduce_perf; a2a: alltoall_perf; sendrecv: sendrecv_perf), $RANKS emulated ranks ($FP8WIRE_TESTBED_MODE), out-of-place time per call"
for c in $CASES; do table "$c"; grep -h "first .* on path" "$OUT/$c".fp8wire.*.log 2>/dev/null | sed 's/.*first/  first/' | sort -u | head -3; done
