#!/usr/bin/env bash
# GPU tier of the telemetry, the audit and the guard (scripts/gpu/all.sh guard, ~4-6 min). Needs the
# build's targets telemetry_ref_test telemetry_gpu guard_gpu fp8wire-bench fp8wire-train.
#   1. telemetry_gpu   the kernels' error figures, guard flags and votes against the CPU reference;
#                      then (--time) what measuring adds to the quantize and the requantizing reduce
#                      of 64 MiB, one process, CUDA events;
#   2. guard_gpu       synthetic gradients that break e4m3 on one of 2 and 4 emulated ranks trip the
#                      guard at their call; the next guard.retry_after calls equal plain NCCL bit for
#                      bit on every rank, then FP8 resumes; prints the synthetic-failure table;
#   3. overhead        fp8wire-bench sweep, all-reduce bf16 64 MiB, 2 emulated ranks, two-shot and
#                      one-shot: telemetry off, 1 in 16 calls (the default), every call, and the same
#                      with the guard on; median time per call and the cost against telemetry off;
#   4. pi05            the Pi0.5 trainer (pi05_small, 2 ranks, direct host memory) with telemetry off,
#                      the default telemetry, then the guard on, then also the audit every
#                      GUARD_AUDIT_EVERY calls: the error per collective over training (the trainer's
#                      fp8wire_errors per logged step), guard trips (none expected), the audit against
#                      the telemetry, and each run's step time against telemetry off.
# Ranks share the GPU under one private MPS daemon. Parts: GUARD_PARTS (default "telemetry guard
# overhead pi05"); GUARD_STEPS (pi05 steps, default 120). Exit 0 only if the correctness checks passed
# (the overhead prints PASS/FAIL against the 2 % target for the defaults but does not fail the run).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_out guard
gpu_mps_start
parts=" ${GUARD_PARTS:-telemetry guard overhead pi05} "
steps="${GUARD_STEPS:-120}"
audit_every="${GUARD_AUDIT_EVERY:-20}"
BENCH="$BUILD/bench/fp8wire-bench"
gpu_step_show  # each part prints what it found itself

need() {  # the binaries a part runs
  for b in "$@"; do
    [[ -x "$b" ]] && continue
    gpu_fail "$b not built (cmake --build $BUILD --target $(basename "$b"))"
    return 1
  done
}

if [[ "$parts" == *" telemetry "* ]] && need "$BUILD/tests/quant/telemetry_ref_test" "$BUILD/tests/quant/telemetry_gpu"; then
  gpu_step telemetry_ref 60 "$BUILD/tests/quant/telemetry_ref_test"
  gpu_step telemetry_gpu 60 "$BUILD/tests/quant/telemetry_gpu"
  echo "## telemetry_gpu"
  grep -E "^FAIL" "$OUT/telemetry_gpu.log" | head -10
  grep -E "(PASS|FAIL|SKIPPED).*telemetry_gpu|SKIPPED" "$OUT/telemetry_gpu.log"
  gpu_step telemetry_cost 60 "$BUILD/tests/quant/telemetry_gpu" --time
  cat "$OUT/telemetry_cost.log"
  echo
fi

if [[ "$parts" == *" guard "* ]] && need "$BUILD/tests/sched/guard_gpu"; then
  gpu_step guard_gpu 150 "$BUILD/tests/sched/guard_gpu" --ranks 2,4 --timeout 90
  echo "## synthetic failures (guard_gpu; telemetry of the broken rank's input at the bad call)"
  grep -E "^(ranks|testbed|[0-9])" "$OUT/guard_gpu.log"
  grep -E "guard_gpu:" "$OUT/guard_gpu.log"
  echo
fi

# Overhead: one sweep point per setting (64 MiB bf16 all-reduce, 2 emulated ranks).
# Alternated, "off" three times: their spread is the noise floor of the figures beside them.
settings=("off:0:0" "default_1in16:16:0" "guard_1in16:16:1" "off_2:0:0" "every_call:1:0" "guard_every_call:1:1"
          "off_3:0:0" "default_1in16_2:16:0")
if [[ "$parts" == *" overhead "* ]] && need "$BENCH"; then
  for s in "${settings[@]}"; do
    IFS=: read -r name every guard <<< "$s"
    FP8WIRE_TELEMETRY_SAMPLE_EVERY=$every FP8WIRE_GUARD_ENABLE=$guard \
      timeout -k 5 60 "$BENCH" sweep --emulate-ranks 2 --collectives all_reduce --dtypes bf16 --paths two_shot,one_shot \
        --min 64MiB --max 64MiB --warmup 3 --repeats 8 --iters 4 --buffers 3 --no-check --timeout 50 \
        --out "$OUT/sweep_$name" > "$OUT/sweep_$name.log" 2>&1
    rc=$?
    if (( rc != 0 )); then gpu_fail "overhead sweep $name rc=$rc (see sweep_$name.log)"; fi
  done
  echo "## overhead (all-reduce bf16 64 MiB, 2 emulated ranks, median us per call; testbed ${FP8WIRE_TESTBED_MODE:-?})"
  "$PY" - "$OUT" "${settings[@]}" <<'PYEOF'
import json, sys, os
out, settings = sys.argv[1], sys.argv[2:]
times = {}
for s in settings:
    name = s.split(":")[0]
    try:
        j = json.load(open(os.path.join(out, f"sweep_{name}", "fp8wire-sweep.json")))
    except Exception as e:
        print(f"{name}: no sweep JSON ({e})")
        continue
    times[name] = {p["path"]: p["time_us"]["median"] for p in j["points"] if p.get("supported")}
import statistics
offs = [times[n] for n in times if n.startswith("off")]
base = {p: statistics.median(t[p] for t in offs if p in t) for p in ("two_shot", "one_shot") if any(p in t for t in offs)}
spread = {p: (min(t[p] for t in offs if p in t), max(t[p] for t in offs if p in t)) for p in base}
print("vs off: against the median of the off runs; their spread: " +
      ", ".join(f"{p} {lo:.0f}..{hi:.0f} us ({100 * (hi / lo - 1):.1f} %)" for p, (lo, hi) in spread.items()))
print(f"{'setting':<18} {'two_shot us':>12} {'vs off':>8} {'one_shot us':>12} {'vs off':>8}")
for s in settings:
    name = s.split(":")[0]
    t = times.get(name)
    if not t:
        continue
    cells = []
    for path in ("two_shot", "one_shot"):
        v, b = t.get(path), base.get(path)
        cells.append(f"{v:>12.1f}" if v else f"{'-':>12}")
        cells.append(f"{100 * (v / b - 1):>+7.2f}%" if v and b else f"{'-':>8}")
    print(f"{name:<18} " + " ".join(cells))
for path in ("two_shot", "one_shot"):
    d = [times[n][path] for n in times if n.startswith("default_1in16") and path in times[n]]
    if d and base.get(path):
        over = 100 * (statistics.median(d) / base[path] - 1)
        print(("PASS" if over <= 2.0 else "FAIL") + f" overhead {path} at the default telemetry.sample_every=16: {over:+.2f} % (target <= 2 %)")
PYEOF
  echo
fi

# The Pi0.5 trainer: telemetry off, then on with the guard and the audit; same seed and data.
if [[ "$parts" == *" pi05 "* ]] && need "$BUILD/trainer/fp8wire-train" "$BUILD/shim/libfp8wire.so"; then
  pi05() {  # label, env assignments...
    local label=$1; shift
    gpu_step "pi05_$label" 300 env FP8WIRE_DIRECT_TRANSPORT=host_memory FP8WIRE_DIRECT_ASSUME_ONE_HOST=1 \
      LD_PRELOAD="$PWD/$BUILD/shim/libfp8wire.so" FP8WIRE_LOG_LEVEL=info "$@" \
      "$BUILD/trainer/fp8wire-train" --config trainer/configs/pi05_small.toml --ranks 2 --steps "$steps" \
      --set train.log_every=10 --set "train.out_dir=$OUT/pi05_$label"
  }
  pi05 telemetry_off FP8WIRE_TELEMETRY_SAMPLE_EVERY=0
  pi05 telemetry FP8WIRE_TELEMETRY_SAMPLE_EVERY=16
  pi05 guard FP8WIRE_TELEMETRY_SAMPLE_EVERY=16 FP8WIRE_GUARD_ENABLE=1
  pi05 guard_audit FP8WIRE_TELEMETRY_SAMPLE_EVERY=16 FP8WIRE_GUARD_ENABLE=1 FP8WIRE_AUDIT_EVERY="$audit_every"
  echo "## Pi0.5 (pi05_small, 2 ranks, direct host memory, $steps steps; testbed ${FP8WIRE_TESTBED_MODE:-?})"
  AUDIT_EVERY="$audit_every" "$PY" - "$OUT" <<'PYEOF' || gpu_fail "the Pi0.5 runs' checks (above)"
import json, os, sys
out = sys.argv[1]
def log(label):
    path = os.path.join(out, f"pi05_{label}", "train_log.jsonl")
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
import statistics as st
off, on = log("telemetry_off"), log("guard_audit")
if not off or not on:
    print("FAIL no training log"); sys.exit(1)
print("the guard + audit run, per logged step (rank 0; errors since the previous row): collective/path calls measured:")
print("input rel error / requant rel error, audit rel error (calls)")
print(f"{'step':>5} {'loss off':>9} {'loss on':>9}")
trips, rows = 0, []
for a, b in zip(off, on):
    cells = []
    for key, e in sorted(b.get("fp8wire_errors", {}).items()):
        if key.endswith("/guard_trips"):
            trips += e
            cells.append(f"{key} {e}")
            continue
        audit = f", audit {e['audit_rel_error']:.4f} ({e['audited_calls']})" if "audited_calls" in e else ""
        cells.append(f"{key} {e['measured_calls']}: {e['input_rel_error']:.4f} / {e['requant_rel_error']:.4f}{audit}")
        if "audited_calls" in e and e["measured_calls"]:
            rows.append((e["audit_rel_error"], e["input_rel_error"], e["requant_rel_error"]))
    print(f"{b['step']:>5} {a['loss']:>9.4f} {b['loss']:>9.4f}  " + ("; ".join(cells) or "-"))
for label in ("telemetry", "guard"):
    for x in log(label):
        trips += sum(v for k, v in x.get("fp8wire_errors", {}).items() if k.endswith("/guard_trips"))
import re
def mean_step(label):  # the trainer's summary: the mean over every step after its warm-up
    try:
        m = re.search(r"mean step ([0-9.]+) ms", open(os.path.join(out, f"pi05_{label}.log")).read())
        return float(m.group(1)) if m else None
    except OSError:
        return None
m_off = mean_step("telemetry_off")
for label, what in (("telemetry", "telemetry 1 in 16"), ("guard", "+ the guard"), ("guard_audit", f"+ the audit every {os.environ.get('AUDIT_EVERY', '?')} calls")):
    m = mean_step(label)
    if m and m_off:
        print(f"mean step: telemetry off {m_off:.1f} ms, {what}: {m:.1f} ms ({100 * (m / m_off - 1):+.1f} %)")
if rows:
    ratio = [a / max(i, r) for a, i, r in rows if max(i, r) > 0]
    print(f"audit / telemetry (larger of input and requant error), per logged interval: "
          f"min {min(ratio):.2f}, median {st.median(ratio):.2f}, max {max(ratio):.2f}")
print(("PASS" if trips == 0 else "FAIL") + f" guard trips on the Pi0.5 runs: {trips}")
sys.exit(1 if trips else 0)
PYEOF
  echo
fi

gpu_summary guard
