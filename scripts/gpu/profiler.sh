#!/usr/bin/env bash
# GPU checks of the exposure profiler (profiler/). Runs from the repo root with the build in build/.
#  1. CPU unit tests (test_prof_host).
#  2. synthetic_overlap (2 ranks on GPU 0, distinct NCCL_HOSTID) twice under fp8wire-prof (the CLI:
#     LD_PRELOAD=libfp8wire_prof.so + NVTX injection) and twice without it, alternating.
#     check_profiler.py compares reported exposed ms with the designed value (CUDA events) per step:
#     within 5 % or 0.1 ms, whichever is larger; then the overhead (step time on vs off, <= 2 %) and
#     the coalescing lesson (per-layer all-reduces hidden in "backward" vs one merged after it).
#  3. fp8wire-prof analyze on a real PyTorch profiler (Kineto) trace from a 2-rank job.
#  4. the same torch.profiler job under fp8wire-prof: CUPTI is contended; the job must still finish.
#  5. the Pi0.5 reference trainer (2 ranks, a few steps) under fp8wire-prof, when it is built: a real
#     many-threaded LibTorch job. Every step after the first must show compute and communication,
#     and no record may be dropped or arrive after its step was reported.
# Detailed logs go to $OUT (default out/profiler); the summary table is printed last.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
gpu_out profiler
build="$BUILD"
py="$PY"
prof="$build/profiler/fp8wire-prof"
synth="$build/tests/profiler/synthetic_overlap"
summary=()
note() { summary+=("$1"); echo "$1"; }

gpu_require "$prof" "$build/profiler/libfp8wire_prof.so" "$synth" "$build/tests/profiler/test_prof_host"

# 1. CPU tier
if "$build/tests/profiler/test_prof_host" > "$OUT/test_prof_host.log" 2>&1; then
  note "PASS: test_prof_host ($(grep -o '[0-9]* passed' "$OUT/test_prof_host.log" | head -1) test cases)"
else
  note "FAIL: test_prof_host (see $OUT/test_prof_host.log)"
fi

# 2. synthetic validation, overhead, lesson
synth_args=(--ranks 2 --steps 6)
run_synth() {  # on|off name
  local d="$OUT/$2"
  mkdir -p "$d"
  if [[ "$1" == on ]]; then
    timeout -k 5 60 "$prof" --out "$d" -- "$synth" "${synth_args[@]}" --designed-dir "$d" > "$d/stdout.log" 2>&1
  else
    timeout -k 5 60 "$synth" "${synth_args[@]}" --designed-dir "$d" > "$d/stdout.log" 2>&1
  fi
  local rc=$?
  if (( rc == 0 )); then note "PASS: synthetic_overlap profiler $1 ($2)"; else note "FAIL: synthetic_overlap profiler $1 ($2) rc=$rc, see $d/stdout.log"; fi
  return $rc
}
run_synth off off1; run_synth on on1; run_synth off off2; run_synth on on2
echo "---- fp8wire-prof merged report of run on1 ----"
tail -n 30 "$OUT/on1/stdout.log"
"$py" tests/profiler/check_profiler.py --on "$OUT/on1" "$OUT/on2" --off "$OUT/off1" "$OUT/off2" > "$OUT/check.log" 2>&1
check_rc=$?
sed -n '1,/==== profiler validation summary ====/p' "$OUT/check.log" | head -n -1
while IFS= read -r line; do summary+=("$line"); done < <(sed -n '/==== profiler validation summary ====/,$p' "$OUT/check.log" | tail -n +2)
(( check_rc == 0 )) || echo "(check_profiler.py rc=$check_rc)"

# 2b. the same validation with libfp8wire.so preloaded too: per-call attribution from the shim
shim_lib="$build/shim/libfp8wire.so"
if [[ -e "$shim_lib" ]]; then
  d="$OUT/shim"
  mkdir -p "$d"
  if timeout -k 5 60 "$prof" --shim --out "$d" -- "$synth" "${synth_args[@]}" --scenarios overlap,serial,partial,bucketed,merged \
       --designed-dir "$d" > "$d/stdout.log" 2>&1; then
    note "PASS: synthetic_overlap under fp8wire-prof --shim"
  else
    note "FAIL: synthetic_overlap under fp8wire-prof --shim (see $d/stdout.log)"
  fi
  "$py" tests/profiler/check_profiler.py --on "$d" --validate-only --expect-shim --title "profiler + shim" > "$OUT/check_shim.log" 2>&1
  sed -n '1,/==== profiler + shim ====/p' "$OUT/check_shim.log" | head -n -1
  while IFS= read -r line; do summary+=("shim: $line"); done < <(sed -n '/==== profiler + shim ====/,$p' "$OUT/check_shim.log" | tail -n +2)
else
  note "SKIP: $shim_lib not built; no profiler + shim run"
fi

# 3. offline analysis of a real Kineto trace
kdir="$OUT/kineto"
mkdir -p "$kdir"
if timeout -k 5 60 "$py" tests/pylib/emulated_launch.py --nproc 2 --timeout 55 -- "$py" tests/profiler/kineto_job.py "$kdir" > "$kdir/job.log" 2>&1 \
   && [[ -f "$kdir/trace.rank0.json" ]]; then
  "$prof" analyze "$kdir/trace.rank0.json" --json "$kdir/analysis.json" > "$kdir/analyze.log" 2>&1
  arc=$?
  cat "$kdir/analyze.log" | head -n 20
  steps=$("$py" -c "import json; d=json.load(open('$kdir/analysis.json')); print(len(d['per_step']))" 2>/dev/null || echo 0)
  comm=$("$py" -c "import json; d=json.load(open('$kdir/analysis.json')); print(sum(s['comm_kernels'] for s in d['per_step']))" 2>/dev/null || echo 0)
  addup=$("$py" -c "
import json; d=json.load(open('$kdir/analysis.json'))
print(all(abs(s['compute_ms']+s['exposed_comm_ms']+s['exposed_memcpy_ms']+s['idle_ms']-s['step_ms'])<1e-6*max(1,s['step_ms']) for s in d['per_step']))" 2>/dev/null || echo False)
  if (( arc == 0 && steps > 0 && comm > 0 )) && [[ "$addup" == True ]]; then
    note "PASS: analyze Kineto trace: $steps ProfilerSteps, $comm NCCL kernels, partition adds up"
  else
    note "FAIL: analyze Kineto trace (rc=$arc, steps=$steps, nccl kernels=$comm, adds up=$addup; see $kdir)"
  fi
else
  note "FAIL: kineto_job.py did not produce a trace (see $kdir/job.log)"
fi

# 4. torch.profiler under the live profiler: CUPTI contended, the job must carry on
k2="$OUT/kineto_under_prof"
mkdir -p "$k2"
if timeout -k 5 60 "$prof" --out "$k2/prof" -- "$py" tests/pylib/emulated_launch.py --nproc 2 --timeout 55 -- "$py" tests/profiler/kineto_job.py "$k2" > "$k2/job.log" 2>&1; then
  note "PASS: torch.profiler job under fp8wire-prof finished ($(grep -c 'CUPTI' "$k2/job.log") CUPTI warning line(s))"
else
  rc=$?
  if [[ -f "$k2/trace.rank0.json" ]]; then
    note "PASS: torch.profiler job under fp8wire-prof wrote its trace (fp8wire-prof rc=$rc: no profiler report)"
  else
    note "FAIL: torch.profiler job under fp8wire-prof rc=$rc (see $k2/job.log)"
  fi
fi

# 5. the trainer: many threads, thousands of launches per step (the main job's workload)
trainer="$build/trainer/fp8wire-train"
if [[ -x "$trainer" ]]; then
  td="$OUT/trainer"
  mkdir -p "$td"
  timeout -k 5 150 "$prof" --out "$td" -- "$trainer" --config trainer/configs/pi05_small.toml --ranks 2 --steps 6 \
    --set "train.out_dir=$td/train" > "$td/job.log" 2>&1
  trc=$?
  grep -E "fp8wire profiler, rank [0-9]+: [0-9]+ steps" "$td/job.log" || true
  verdict=$("$py" - "$td" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
steps, sums = [], []
for path in sorted(glob.glob(os.path.join(d, "rank*.jsonl"))):
    for line in open(path):
        r = json.loads(line)
        (steps if r.get("type") == "step" else sums).append(r)
later = [s for s in steps if s["step"] >= 1]
busy = [s for s in later if s["compute_ms"] > 0.05 * s["step_ms"] and s["comm_ms"] > 0]
late = sum(x.get("counters", {}).get("late_activities", 0) for x in sums)
dropped = sum(x.get("dropped_cupti_records", 0) + x.get("counters", {}).get("dropped_activities", 0) for x in sums)
joined = sum(x.get("counters", {}).get("joined_activities", 0) for x in sums)
ok = later and len(busy) == len(later) and len(sums) >= 2 and late == 0 and dropped == 0
print(("PASS" if ok else "FAIL") + f": trainer under fp8wire-prof: {len(busy)}/{len(later)} steps after step 0 with "
      f"compute > 5% and comm > 0, {late} late, {dropped} dropped records, {joined} kernels joined to ranges, "
      f"{len(sums)} rank summaries")
PY
)
  note "${verdict:-FAIL: trainer under fp8wire-prof: no verdict (rc=$trc, see $td/job.log)}"
  (( trc == 0 )) || note "FAIL: trainer under fp8wire-prof rc=$trc (see $td/job.log)"
else
  note "SKIP: $trainer not built; no trainer run under the profiler"
fi

echo
echo "================ profiler summary ================"
for line in "${summary[@]}"; do echo "$line"; done
if printf '%s\n' "${summary[@]}" | grep -qE '(^|: )FAIL'; then echo "profiler: FAIL"; exit 1; fi
echo "profiler: PASS"
