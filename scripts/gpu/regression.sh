#!/usr/bin/env bash
# The current library against a base version, same GPU, same run (run from the repo root, current
# build in build/ with fp8wire, fp8wire-bench and tests/shim built):
#   1. fp8wire-bench sweep, bf16 all-reduce, passthrough/two_shot/one_shot: 2 ranks 1..256 MiB and
#      4 ranks 4..256 MiB (x4 steps; REGRESSION_RANKS picks), emulated on GPU 0, both under the
#      script's private MPS daemon where there is one; base and current alternately;
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
sweep() {  # sweep <label> <bench> <ranks> <min> <max>
  local label="$1" bin="$2" ranks="$3" min="$4" max="$5"
  local s; s=$(date +%s)
  timeout -k 5 "${SWEEP_LIMIT:-110}" "$bin" sweep --emulate-ranks "$ranks" --collectives all_reduce --dtypes bf16 \
    --paths passthrough,two_shot,one_shot --min "$min" --max "$max" --step 4 --warmup 2 --repeats 5 --buffers 2 \
    --timeout "$(( ${SWEEP_LIMIT:-110} - 5 ))" --out "$OUT/$label" > "$OUT/$label.log" 2> "$OUT/$label.err"
  echo "== sweep $label rc=$? ($(( $(date +%s) - s )) s)"
}
parts="${REGRESSION_PARTS:-sweeps passthrough creation}"
ranks="${REGRESSION_RANKS:-2 4}"
for n in $ranks; do
  [[ " $parts " == *" sweeps "* ]] || break
  min=1MiB; (( n == 4 )) && min=4MiB
  # A base older than the testbed reads FP8WIRE_TESTBED_MODE and FP8WIRE_MPS as unknown keys: it runs
  # under the same daemon (CUDA_MPS_PIPE_DIRECTORY), or the same time slicing, without them.
  (unset FP8WIRE_TESTBED_MODE FP8WIRE_MPS; sweep "ar${n}_base" "$BASE/build/bench/fp8wire-bench" "$n" "$min" 256MiB)
  sweep "ar${n}_new" build/bench/fp8wire-bench "$n" "$min" 256MiB
done
for v in base new; do
  [[ " $parts " == *" passthrough "* ]] || break
  bin=build/tests/shim/test_shim; [[ $v == base ]] && bin="$BASE/build/tests/shim/test_shim"
  "$bin" -tc="pass-through cost*" > "$OUT/passthrough_$v.txt" 2>&1
done
[[ " $parts " == *" creation "* ]] && timeout -k 5 "${CREATE_LIMIT:-150}" python3 tests/sched/comm_creation_cost.py --nproc 2 --groups 12 \
  --lib "$BASE/build/shim/libfp8wire.so" --lib build/shim/libfp8wire.so > "$OUT/comm_creation.txt" 2>&1
echo "==== regression tables ($FP8WIRE_TESTBED_MODE)"
for n in $ranks; do
  for v in base new; do echo "-- ar${n}_$v"; grep -vE '^\s*$' "$OUT/ar${n}_$v.log" | grep -E "MiB|size|path" | head -n 14; done
done
for v in base new; do echo "-- pass-through cost, $v"; grep -E "FP8WIRE_ENABLE|enabled, not" "$OUT/passthrough_$v.txt" | head -2; done
grep -E "RESULT|FAIL|SKIPPED|communicator creation" "$OUT/comm_creation.txt"
