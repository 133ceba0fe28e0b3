#!/usr/bin/env bash
# GPU checks of fp8wire-bench (run from the repo root, build in build/, one GPU):
#   1. sweep: all-reduce bf16, 64 KiB .. 64 MiB (x2 steps), 2 emulated ranks on GPU 0 (NCCL_HOSTID per
#      rank, sockets), plain NCCL vs fp8wire two_shot / one_shot / ring through sched::Engine, every
#      correctness check (NCCL bit-exact; FP8 within the stated bound; FP8 all-reduce bitwise identical
#      on all ranks); JSON + TOML profile written to $OUT.
#   2. JSON: every size x path present, no unsupported/fallback points, every check passed,
#      busbw = algbw * 2(n-1)/n, wire bytes recorded by sched/ accounting.
#   3. profile: parses as TOML with thresholds.all_reduce.<fabric> and a calibrated cost_model.<fabric>.
#   4. a small reduce-scatter + all-gather sweep (2 ranks, 1..16 MiB) with checks; 4b. the same for the
#      all-to-all (1..64 MiB), its threshold written to the profile.
#   5. model: reads the sweep JSON, checks it against the measured crossover, prints predictions.
#   6. plot: scripts/plot_sweep.py writes $OUT/fp8wire-sweep.png.
#   7. torchrun-style rank without a rank 0: gives up after --bootstrap-timeout with a clear error.
# Prints a compact per-size table and PASS/FAIL lines at the end. Logs under $OUT when set.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
OUT="${OUT:-$(mktemp -d /tmp/fp8wire_bench_XXXX)}"
mkdir -p "$OUT"
BIN="${BENCH_BIN:-build/bench/fp8wire-bench}"
results=()
failed=0
pass() { results+=("PASS $*"); }
fail() { results+=("FAIL $*"); failed=1; }
t0=$(date +%s)

if [[ ! -x "$BIN" ]]; then
  echo "FAIL bench: $BIN not built"
  exit 1
fi

# 1. the sweep (~4.5 ms floor per all-reduce at 2 emulated ranks; ~300 timed ops + checks)
s=$(date +%s)
timeout -k 5 130 "$BIN" sweep --emulate-ranks 2 --collectives all_reduce --dtypes bf16 \
  --min 64KiB --max 64MiB --step 2 --warmup 2 --repeats 5 --iters 1 --buffers 3 --timeout 120 \
  --out "$OUT" > "$OUT/sweep.log" 2> "$OUT/sweep.err"
rc=$?
if (( rc == 0 )); then pass "sweep all_reduce bf16 2 ranks rc=0 ($(( $(date +%s) - s )) s)"
else fail "sweep all_reduce bf16 2 ranks rc=$rc ($(( $(date +%s) - s )) s): $(grep -v '^\[' "$OUT/sweep.err" | tail -n 3 | tr '\n' ' ')"; fi

# 2-3. JSON and profile contents
"$PY" - "$OUT/fp8wire-sweep.json" "$OUT/fp8wire-profile.toml" > "$OUT/json_checks.log" 2>&1 <<'PYEOF'
import json, sys
try:
    import tomllib
except ImportError:
    tomllib = None
jpath, tpath = sys.argv[1], sys.argv[2]
try:
    j = json.load(open(jpath))
except Exception as e:
    print(f"FAIL json: cannot read {jpath}: {e}"); sys.exit(0)
pts = j["points"]
n = j["machine"]["nranks"]
sizes = sorted({p["bytes"] for p in pts})
paths = ["passthrough", "two_shot", "one_shot", "ring"]
missing = [(s, p) for s in sizes for p in paths if not any(q["bytes"] == s and q["path"] == p for q in pts)]
print(("PASS" if len(sizes) == 11 and not missing else "FAIL") + f" json: {len(sizes)} sizes x {len(paths)} paths, missing {missing[:4]}")
uns = [(p["bytes"], p["path"], p["error"]) for p in pts if not p["supported"]]
print(("PASS" if not uns else "FAIL") + f" json: unsupported/fallback points: {len(uns)} {uns[:3]}")
bad = [(p["bytes"], p["path"], p["check"]["max_err_ratio"], p["check"]["bound"]) for p in pts
       if p["supported"] and not (p["check"]["ran"] and p["check"]["pass"])]
print(("PASS" if not bad else "FAIL") + f" json: correctness checks ran and passed on every point (failures: {bad[:4]})")
exact = [p for p in pts if p["path"] == "passthrough" and p["supported"]]
print(("PASS" if exact and all(p["check"]["max_err_ratio"] == 0 for p in exact) else "FAIL") + " json: plain NCCL bit-exact")
fp8 = [p for p in pts if p["path"] != "passthrough" and p["supported"]]
worst = max((p["check"]["max_err_ratio"] for p in fp8), default=-1)
print(("PASS" if fp8 and all(p["check"]["bitwise_required"] and p["check"]["bitwise_identical"] for p in fp8) else "FAIL")
      + f" json: FP8 all-reduce bitwise identical on all ranks; worst error ratio {worst:.4f}")
busok = all(abs(p["busbw_gbps"] - p["algbw_gbps"] * 2 * (n - 1) / n) <= 1e-9 + 1e-6 * p["busbw_gbps"]
            and abs(p["algbw_gbps"] - p["bytes"] / (p["time_us"]["median"] * 1e3)) <= 1e-6 * max(p["algbw_gbps"], 1e-9)
            for p in pts if p["supported"])
print(("PASS" if busok else "FAIL") + " json: algbw = bytes/time, busbw = algbw*2(n-1)/n")
src = {p["wire_source"] for p in pts if p["supported"]}
ratio = [p["wire_bytes"] / max(b["wire_bytes"], 1) for p in fp8 for b in exact if b["bytes"] == p["bytes"] and p["path"] == "two_shot"]
print(("PASS" if src == {"accounting"} else "FAIL") + f" json: wire bytes from sched accounting (sources {sorted(src)});"
      f" two_shot/NCCL wire ratio {min(ratio, default=0):.3f}..{max(ratio, default=0):.3f}")
print("PASS" if j["machine"]["nccl_version"] > 0 and j["machine"]["gpu"] else "FAIL", "json: machine", j["machine"]["gpu"],
      "NCCL", j["machine"]["nccl_version"], "CUDA", j["machine"]["cuda_runtime_version"], "fabric", j["machine"]["fabric"])
def parse_profile(path):
    if tomllib is not None:
        return tomllib.load(open(path, "rb"))
    # Python < 3.11: the profile is flat "[a.b]" tables of "key = value  # comment" lines.
    import re
    out, table = {}, None
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"\[([\w.]+)\]", line)
        if m:
            table = out
            for part in m.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        k, v = (x.strip() for x in line.split("=", 1))
        table[k] = True if v == "true" else False if v == "false" else float(v) if "." in v else int(v)
    return out
try:
    t = parse_profile(tpath)
except Exception as e:
    print(f"FAIL profile: {tpath} does not parse: {e}"); sys.exit(0)
fab = j["machine"]["fabric"]
thr = t.get("thresholds", {}).get("all_reduce", {}).get(fab)
cm = t.get("cost_model", {}).get(fab, {})
print(("PASS" if isinstance(thr, int) else "FAIL") + f" profile: thresholds.all_reduce.{fab} = {thr}")
print(("PASS" if cm.get("calibrated") is True and cm.get("bus_bandwidth_gbps", 0) > 0 else "FAIL")
      + f" profile: cost_model.{fab} {cm}")
# compact per-size table for the summary
print("TABLE size        nccl_us  two_shot  one_shot      ring  best_x  check")
for s in sizes:
    row = {p["path"]: p for p in pts if p["bytes"] == s}
    def t_us(k):
        p = row.get(k); return f"{p['time_us']['median']:9.0f}" if p and p["supported"] else "        -"
    best = max((row[k]["speedup"] for k in ("two_shot", "one_shot") if k in row and row[k]["supported"]), default=0)
    ok = all(p["check"]["pass"] for p in row.values() if p["supported"])
    size = f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
    print(f"TABLE {size:>8} {t_us('passthrough')} {t_us('two_shot')} {t_us('one_shot')} {t_us('ring')} {best:6.2f}x  {'ok' if ok else 'FAIL'}")
for x in j["crossovers"]:
    if x["candidate"] in ("best", "two_shot"):
        print(f"TABLE crossover {x['collective']} {x['candidate']}: " + (f"{x['bytes']} B ({x['speedup']:.2f}x, min {x['min_speedup_above']:.2f}x above)" if x["found"] else "never in range"))
PYEOF
while IFS= read -r line; do
  case "$line" in
    PASS*) results+=("$line") ;;
    FAIL*) results+=("$line"); failed=1 ;;
  esac
done < "$OUT/json_checks.log"

# 4. reduce-scatter and all-gather (one FP8 algorithm each), short
s=$(date +%s)
timeout -k 5 60 "$BIN" sweep --emulate-ranks 2 --collectives reduce_scatter,all_gather --dtypes bf16,fp32 \
  --min 1MiB --max 16MiB --step 4 --warmup 1 --repeats 3 --buffers 2 --timeout 50 \
  --json "$OUT/rs_ag.json" --profile "$OUT/rs_ag-profile.toml" > "$OUT/rs_ag.log" 2> "$OUT/rs_ag.err"
rc=$?
if (( rc == 0 )) && grep -q "^PASS checks" "$OUT/rs_ag.log"; then pass "sweep reduce_scatter+all_gather bf16/fp32: $(grep '^PASS checks' "$OUT/rs_ag.log")"
else fail "sweep reduce_scatter+all_gather rc=$rc: $(grep -E '^FAIL' "$OUT/rs_ag.log" | head -n 2 | tr '\n' ' ') $(grep -v '^\[' "$OUT/rs_ag.err" | tail -n 2 | tr '\n' ' ')"; fi

# 4b. all-to-all (equal splits; one FP8 algorithm), short: checked, and its threshold in the profile
timeout -k 5 60 "$BIN" sweep --emulate-ranks 2 --collectives all_to_all --dtypes bf16,fp32 \
  --min 1MiB --max 64MiB --step 4 --warmup 1 --repeats 3 --buffers 2 --timeout 50 \
  --json "$OUT/a2a.json" --profile "$OUT/a2a-profile.toml" > "$OUT/a2a.log" 2> "$OUT/a2a.err"
rc=$?
if (( rc == 0 )) && grep -q "^PASS checks" "$OUT/a2a.log" && grep -q "^\[thresholds.all_to_all\]" "$OUT/a2a-profile.toml"; then
  pass "sweep all_to_all bf16/fp32: $(grep '^PASS checks' "$OUT/a2a.log"); $(grep -A1 '^\[thresholds.all_to_all\]' "$OUT/a2a-profile.toml" | tail -n 1)"
else fail "sweep all_to_all rc=$rc: $(grep -E '^FAIL' "$OUT/a2a.log" | head -n 2 | tr '\n' ' ') $(grep -v '^\[' "$OUT/a2a.err" | tail -n 2 | tr '\n' ' ')"; fi

# 5. model
if "$BIN" model "$OUT/fp8wire-sweep.json" --nranks 8 --json "$OUT/model.json" > "$OUT/model.log" 2>&1 \
   && grep -q PREDICTED "$OUT/model.log"; then
  pass "model: $(grep -c 'oct\|agree' "$OUT/model.log") measured crossovers checked, predictions in model.log"
else fail "model: $(tail -n 2 "$OUT/model.log" | tr '\n' ' ')"; fi

# 6. plot
if "$PY" scripts/plot_sweep.py "$OUT/fp8wire-sweep.json" -o "$OUT/fp8wire-sweep.png" > "$OUT/plot.log" 2>&1 \
   && [[ -s "$OUT/fp8wire-sweep.png" ]]; then pass "plot: $OUT/fp8wire-sweep.png"
else fail "plot: $(tail -n 2 "$OUT/plot.log" | tr '\n' ' ')"; fi

# 7. a rank whose rank 0 never shows up (torchrun-style variables): it must give up with a clear error.
s=$(date +%s)
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 timeout -k 5 30 "$BIN" sweep --max 64KiB --min 64KiB --bootstrap-timeout 3 \
  > "$OUT/hung.log" 2>&1
rc=$?
if (( rc == 2 )) && grep -q "could not get the NCCL id" "$OUT/hung.log"; then pass "bootstrap without rank 0 fails cleanly ($(( $(date +%s) - s )) s)"
else fail "bootstrap without rank 0: rc=$rc $(tail -n 1 "$OUT/hung.log")"; fi

echo
echo "== fp8wire-bench sweep table (full: $OUT/sweep.log)"
grep -E "^# (crossovers|cost model)|^  all_reduce" "$OUT/sweep.log" | head -n 8
grep "^TABLE" "$OUT/json_checks.log" | sed 's/^TABLE //'
echo "== bench summary ($(( $(date +%s) - t0 )) s)"
printf '%s\n' "${results[@]}"
exit $failed
