#!/usr/bin/env bash
# GPU integration tests (tests/integration, ctest label "integration"): FSDP2 (reduce fp32 / bf16),
# HSDP, DDP + torch.compile, DDP + CUDA-graph capture, a non-blocking communicator job, DeepSpeed
# ZeRO-1/2/3, a job that times out and aborts its communicator, and `fp8wire run` under torchrun and
# deepspeed. Each trains on emulated ranks (processes sharing GPU 0, each its own NCCL_HOSTID) with
# and without libfp8wire.so. Run from the repo root; without a build it builds the library alone
# (GPU_SKIP_BUILD=1 scripts/gpu/all.sh integration). DeepSpeed and its missing dependencies come as
# wheels in .whl/ (beside the tree; installed into /tmp/site here when deepspeed is not importable).
# Env: INTEGRATION_JOBS (tests at once, default 3), INTEGRATION_TESTS (ctest -R regex, default all),
#      FP8WIRE_BUILD (default build). Logs and one JSON per test under $OUT; the table is printed last.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
export OUT="${OUT:-$PWD/out/integration}"
mkdir -p "$OUT"
build="$BUILD"
py="$PY"
t0=$(date +%s)

if [[ ! -f "$build/shim/libfp8wire.so" || ! -f "$build/CTestTestfile.cmake" ]]; then
  # Only what the tests load: the library and the configuration checker (a minute, not a full build).
  BUILD_TARGETS="fp8wire fp8wire-config" bash scripts/build.sh "$build" > "$OUT/build.log" 2>&1 \
    || { echo "FAIL: build (see $OUT/build.log)"; tail -20 "$OUT/build.log"; exit 1; }
  echo "built $build/shim/libfp8wire.so ($(( $(date +%s) - t0 )) s)"
fi
if ! "$py" -c 'import deepspeed' >/dev/null 2>&1; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 \
      || { echo "wheel install failed:"; tail -5 "$OUT/pip.log"; }
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  "$py" -c 'import deepspeed; print("deepspeed", deepspeed.__version__)' 2>&1 | grep -E "^deepspeed|Error" | tail -1
fi
rm -f "$OUT"/*.result.json

# The tests skip themselves without a GPU; each bounds its own runs and ctest bounds each test.
ctest --test-dir "$build" -L integration ${INTEGRATION_TESTS:+-R "$INTEGRATION_TESTS"} \
  -j "${INTEGRATION_JOBS:-3}" -V > "$OUT/ctest.log" 2>&1
rc=$?
# -V: every test's output, each line prefixed with the test's number.
grep -hE "^[0-9]+: (FAIL|SKIPPED|INFO) " "$OUT/ctest.log" | tail -n 60
sed -n '/tests passed/,$p' "$OUT/ctest.log"

echo "================ integration ($(( $(date +%s) - t0 )) s, logs in $OUT) ================"
"$py" - "$OUT" "$OUT/ctest.log" <<'EOF'
import glob, json, os, re, sys
sys.path.insert(0, "tests/integration")
import parity
out, log = sys.argv[1], open(sys.argv[2], errors="replace").read()
rows = {}
for path in sorted(glob.glob(os.path.join(out, "*.result.json"))):
    s = json.load(open(path))
    rows[s["stack"]] = s
for name, why in re.findall(r"^\d+: SKIPPED (\S+): (.*)$", log, re.M):
    rows.setdefault(name, {"stack": name, "verdict": f"SKIPPED ({why[:70]})"})
print(parity.TABLE_HEADER)
for s in rows.values():
    print(parity.format_row(s))
EOF
exit $rc
