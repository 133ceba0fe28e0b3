#!/usr/bin/env bash
# The current library against a base version, same GPU, same run (run from the repo root, current
# build in build/ with fp8wire, fp8wire-bench and tests/shim built):
#   1. fp8wire-bench sweep, bf16, passthrough/two_shot/one_shot, per transport of
#      REGRESSION_TRANSPORTS (default "nccl"; also host_memory, peer_memory: the direct transports
#      between the emulated ranks), collectives REGRESSION_COLLECTIVES (default all_reduce), 2 ranks
#      from REGRESSION_MIN (default 1MiB) and 4 ranks from 4MiB (or REGRESSION_MIN) to 256 MiB in x4
#      steps (REGRESSION_RANKS picks), emulated on GPU 0 under the script's private MPS daemon where
#      there is one; base and current alternately, REGRESSION_ROUNDS times (default 1: two rounds give
#      two baseline runs, so the base's own spread beside the difference). Per transport one table
#      (scripts/linklimit_table.py): each point's times, the faster FP8 path's speedup over plain NCCL,
#      and the current tree against the base of its own round;
#   (REGRESSION_CHECK=0 skips the sweeps' host-side checks);
#   2. the pass-through cost per ncclAllReduce (test_shim's timing over a fake NCCL): base, current;
#   3. communicator creation (with its first 4-byte all-reduce): plain NCCL, base, current library.
# The base tree comes as .carry/base-src.tar.gz (git archive of the base commit); it is built into
# /tmp/base/build by scripts/gpu/build_base.sh (started early, in the background, by the caller or
# here when missing). Tables under $OUT, printed last.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
OUT="${OUT:-out/regression}"; mkdir -p "$OUT"
BASE=/tmp/base
if [[ ! -f "$BASE/build.done" ]]; then
  [[ -f "$BASE/build.started" ]] || bash scripts/gpu/build_base.sh
  for _ in $(seq 1 300); do [[ -f "$BASE/build.done" ]] && break; sleep 1; done
fi
cat "$BASE/build.log" 2>/dev/null | tail -n 3
nccl_dir="$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)/lib"
export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
sweep() {  # sweep <dir> <bench> <ranks> <min> <max> <transport>
  local dir="$1" bin="$2" ranks="$3" min="$4" max="$5" transport="$6"
  local s; s=$(date +%s)
  mkdir -p "$dir"
  # REGRESSION_CHECK=0: the host-side checks skipped (seconds per 256 MiB point; the matrices check the bytes).
  local check=(); [[ "${REGRESSION_CHECK:-1}" == 0 ]] && check=(--no-check)
  timeout -k 5 "${SWEEP_LIMIT:-110}" "$bin" sweep --emulate-ranks "$ranks" --transport "$transport" ${check[@]+"${check[@]}"} \
    --collectives "${REGRESSION_COLLECTIVES:-all_reduce}" --dtypes bf16 --paths passthrough,two_shot,one_shot \
    --min "$min" --max "$max" --step 4 --warmup 2 --repeats 5 --buffers 2 --timeout "$(( ${SWEEP_LIMIT:-110} - 5 ))" \
    --json "$dir/sweep.json" --out "$dir" > "$dir/sweep.log" 2> "$dir/sweep.err"
  echo "== sweep $dir rc=$? ($(( $(date +%s) - s )) s)"
}
parts="${REGRESSION_PARTS:-sweeps passthrough creation}"
ranks="${REGRESSION_RANKS:-2 4}"
transports="${REGRESSION_TRANSPORTS:-nccl}"
for round in $(seq 1 "${REGRESSION_ROUNDS:-1}"); do
  for n in $ranks; do
    [[ " $parts " == *" sweeps "* ]] || break
    min="${REGRESSION_MIN:-1MiB}"; (( n == 4 )) && min="${REGRESSION_MIN:-4MiB}"
    for t in $transports; do
      # A base older than the testbed reads FP8WIRE_TESTBED_MODE and FP8WIRE_MPS as unknown keys: it runs
      # under the same daemon (CUDA_MPS_PIPE_DIRECTORY), or the same time slicing, without them.
      (unset FP8WIRE_TESTBED_MODE FP8WIRE_MPS; sweep "$OUT/$t/r$round/base_n$n" "$BASE/build/bench/fp8wire-bench" "$n" "$min" 256MiB "$t")
      sweep "$OUT/$t/r$round/new_n$n" build/bench/fp8wire-bench "$n" "$min" 256MiB "$t"
    done
  done
done
for v in base new; do
  [[ " $parts " == *" passthrough "* ]] || break
  bin=build/tests/shim/test_shim; [[ $v == base ]] && bin="$BASE/build/tests/shim/test_shim"
  "$bin" -tc="pass-through cost*" > "$OUT/passthrough_$v.txt" 2>&1
done
[[ " $parts " == *" creation "* ]] && timeout -k 5 "${CREATE_LIMIT:-150}" python3 tests/sched/comm_creation_cost.py --nproc 2 --groups 12 \
  --lib "$BASE/build/shim/libfp8wire.so" --lib build/shim/libfp8wire.so > "$OUT/comm_creation.txt" 2>&1
echo "==== regression tables ($FP8WIRE_TESTBED_MODE)"
if [[ " $parts " == *" sweeps "* ]]; then
  for t in $transports; do echo "-- $t"; "$PY" scripts/linklimit_table.py "$OUT/$t" --baseline base; done
fi
for v in base new; do echo "-- pass-through cost, $v"; grep -E "FP8WIRE_ENABLE|enabled, not" "$OUT/passthrough_$v.txt" | head -2; done
grep -E "RESULT|FAIL|SKIPPED|communicator creation" "$OUT/comm_creation.txt"
