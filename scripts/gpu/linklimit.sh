#!/usr/bin/env bash
# The direct transport through host memory against its host-link limit, ranks emulated on one GPU (run
# from the repo root, build in build/). Its sweeps share one private MPS daemon (scripts/gpu/lib.sh), so
# the emulated ranks' kernels run side by side (the testbed the limit is meant for); with FP8WIRE_MPS=0
# they take turns and the percentages say more about time-slicing than about the code.
#   fp8wire-bench sweep --emulate-ranks 2 and 4, all_reduce and reduce_scatter, bf16, --transport
#   host_memory (plain NCCL over sockets timed beside it): 64 KiB..256 MiB in x4 steps with the default
#   knobs, then 16..256 MiB once per variant below (env overrides of configuration keys). Each sweep
#   measures the pinned-copy rates itself (every rank at once) and prints "link%" per direct point:
#   the percent of the host-link limit reached (bench/host/link_limit.hpp names the bytes: the fewest
#   any of the algorithms must move, the rank's own data kept on the GPU). The default, own_*, *cop*, *lanes_apart*,
#   *flags*, *box* and sets2/4 runs check every point; the other variants only re-cut or re-size the same work and skip the checks.
# At the end, one table: ranks x collective x size x variant -> ms (plain NCCL, each direct path) and
# % of the link limit of the faster direct path.
# Env: LINKLIMIT_RANKS (default "2 4"), LINKLIMIT_VARIANTS (labels from the list below, default all),
# LINKLIMIT_BUDGET (seconds, default 145: a sweep that would end past it, judged by the last one of the
# same world size, is skipped and named), LINKLIMIT_SWEEP_S (one sweep's time limit, default 90; 4 ranks
# from 64 KiB need more), LINKLIMIT_MIN (the default run's smallest size, default 64KiB), LINKLIMIT_MAX
# (every run's largest size, default 256MiB).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_out linklimit
gpu_mps_start
rm -rf "$OUT"/*_n[0-9]*  # the table reads every sweep under $OUT: none from an earlier run
BIN="$BUILD/bench/fp8wire-bench"
budget="${LINKLIMIT_BUDGET:-145}"
t0=$(date +%s)
status=0

# label | env overrides (space separated; "-" for none)
# In order of interest: the budget skips the last ones first.
variants=(
  "default|-"
  "outbox|FP8WIRE_DIRECT_OUTBOX=1"
  "per_peer_flags|FP8WIRE_DIRECT_PER_PEER_FLAGS=1"
  "no_copy_lanes|FP8WIRE_DIRECT_COPY_LANES=0"
  "late_copy_in|FP8WIRE_DIRECT_EARLY_COPY_IN=0 FP8WIRE_DIRECT_COPY_LANES=0"
  "unpaced|FP8WIRE_DIRECT_PACED_SENDS=0"
  "unpaced_late_copy_in|FP8WIRE_DIRECT_PACED_SENDS=0 FP8WIRE_DIRECT_EARLY_COPY_IN=0 FP8WIRE_DIRECT_COPY_LANES=0"
  "lanes_apart|FP8WIRE_DIRECT_LANES_APART=1"
  "sets2|FP8WIRE_DIRECT_SETS=2"
  "sets4|FP8WIRE_DIRECT_SETS=4"
  "no_copies|FP8WIRE_DIRECT_COPY_IN=0 FP8WIRE_DIRECT_COPY_OUT=0"
  "copy_in_only|FP8WIRE_DIRECT_COPY_OUT=0"
  "stages4|FP8WIRE_DIRECT_MIN_STAGES=4"
  "shared_max_stages8|FP8WIRE_DIRECT_SHARED_MAX_STAGES=8"
  "shared_max_stages4|FP8WIRE_DIRECT_SHARED_MAX_STAGES=4"
  "shared_uncapped|FP8WIRE_DIRECT_SHARED_MAX_STAGE_BYTES=0"
  "stage16M|FP8WIRE_DIRECT_STAGE_BYTES=16MiB"
  "stage32M|FP8WIRE_DIRECT_STAGE_BYTES=32MiB"
  "stage4M|FP8WIRE_DIRECT_STAGE_BYTES=4MiB"
  "lanes_apart_no_copies|FP8WIRE_DIRECT_LANES_APART=1 FP8WIRE_DIRECT_COPY_IN=0 FP8WIRE_DIRECT_COPY_OUT=0"
  "lane_flags|FP8WIRE_DIRECT_LANE_FLAGS=1"
  "own_in_window|FP8WIRE_DIRECT_OWN_ON_DEVICE=0"
  "conn32|CUDA_DEVICE_MAX_CONNECTIONS=32"
)
wanted="${LINKLIMIT_VARIANTS:-}"

mode="${FP8WIRE_TESTBED_MODE:-time-sliced}"
echo "== linklimit: testbed $mode; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)"

sweep() {  # sweep <label> <ranks> <min> <max> <env overrides...>
  local label="$1" ranks="$2" min="$3" max="$4"; shift 4
  local dir="$OUT/${label}_n${ranks}" s=$(date +%s) limit="${LINKLIMIT_SWEEP_S:-90}"
  mkdir -p "$dir"
  # The knobs that only cut or size the work differently are bit-exact on the CPU tier: their sweeps
  # skip the host-side checks (seconds per 256 MiB point); the default, own_*, *cop*, *lanes_apart*,
  # lane_flags, per_peer_flags, outbox and sets2/sets4 (other data flows, layouts, orders or set counts) keep them.
  local check=(); [[ "$label" == default || "$label" == own* || "$label" == *cop* || "$label" == *flags || "$label" == *box* || "$label" == *lanes_apart* || "$label" == sets? ]] || check=(--no-check)
  env "$@" timeout -k 5 "$limit" "$BIN" sweep --emulate-ranks "$ranks" --transport host_memory ${check[@]+"${check[@]}"} \
    --collectives all_reduce,reduce_scatter --dtypes bf16 --paths passthrough,two_shot,one_shot \
    --min "$min" --max "$max" --step 4 --warmup 1 --repeats 3 --buffers 2 --timeout $(( limit - 5 )) \
    --json "$dir/sweep.json" --profile "$dir/profile.toml" > "$dir/sweep.log" 2> "$dir/sweep.err.log"
  local rc=$?
  (( rc == 0 )) || status=1
  last[$ranks]=$(( $(date +%s) - s ))
  echo "==== $label, $ranks ranks, $min..$max ${*:-}: rc=$rc (${last[$ranks]} s)"
  grep -E "^# pinned|^FAIL|^(PASS|FAIL) checks" "$dir/sweep.log"
  (( rc == 0 )) || tail -n 8 "$dir/sweep.err.log"
}

declare -A last=()
for entry in "${variants[@]}"; do
  label="${entry%%|*}"; envs="${entry#*|}"; [[ "$envs" == "-" ]] && envs=""
  [[ -n "$wanted" && " $wanted " != *" $label "* ]] && continue
  for n in ${LINKLIMIT_RANKS:-2 4}; do
    if (( $(date +%s) - t0 + ${last[$n]:-0} > budget )); then
      echo "==== $label, $n ranks: skipped (it would end past LINKLIMIT_BUDGET=${budget} s)"; continue
    fi
    max="${LINKLIMIT_MAX:-256MiB}"
    if [[ "$label" == default ]]; then sweep "$label" "$n" "${LINKLIMIT_MIN:-64KiB}" "$max" $envs
    else sweep "$label" "$n" 16MiB "$max" $envs; fi
  done
done

# The default run's crossovers: where the direct transport starts to pay against plain NCCL
# (".../direct" rows) and against fp8wire over NCCL's transports ("direct/fp8", when timed).
for n in ${LINKLIMIT_RANKS:-2 4}; do
  log="$OUT/default_n$n/sweep.log"
  [[ -f "$log" ]] && { echo "==== crossovers, $n ranks (default knobs)"; sed -n '/^# crossovers/,/^$/p' "$log" | grep -E "direct|^#"; }
done

python3 - "$OUT" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = []
for f in sorted(out.glob("*_n*/sweep.json")):
    variant, n = f.parent.name.rsplit("_n", 1)
    j = json.loads(f.read_text())
    pc = j.get("pinned_copy", {})
    by = {}
    for p in j["points"]:
        if not p.get("supported", True) or p["time_us"]["median"] <= 0:
            continue
        key = (p["collective"], p["bytes"])
        d = by.setdefault(key, {})
        name = "nccl" if p["path"] == "passthrough" else p["path"] + ("/direct" if p.get("transport") else "")
        d[name] = p
    for (coll, size), d in by.items():
        direct = [p for k, p in d.items() if k.endswith("/direct")]
        best = min(direct, key=lambda p: p["time_us"]["median"]) if direct else None
        rows.append((int(n), coll, size, variant, d, best, pc))
order = {"default": 0}
rows.sort(key=lambda r: (r[0], r[1], r[2], order.get(r[3], 1), r[3]))
def ms(p):
    return f"{p['time_us']['median'] / 1e3:9.3f}" if p else f"{'-':>9}"
def size(b):
    for u, s in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << s and b % (1 << s) == 0:
            return f"{b >> s}{u}"
    return str(b)
# "vs default": the default run's faster direct time over this variant's, both from this run (above 1:
# the variant is faster).
default_best = {(n, coll, sz): best for n, coll, sz, variant, d, best, pc in rows if variant == "default"}
print("\n# link limit table (ms = median of the slowest rank; link% = limit / time of the faster direct path;"
      " vs default = the defaults' time / this one's, same run)")
print(f"# {'ranks':>5} {'collective':<15} {'size':>7} {'variant':<28} {'nccl':>9} {'two_shot':>9} {'one_shot':>9} {'limit':>9} {'link%':>6} {'vs default':>10}  pinned D2H/H2D GB/s (both at once)")
for n, coll, sz, variant, d, best, pc in rows:
    lim = best["link_limit_us"] / 1e3 if best and best.get("link_limit_us") else 0
    pct = f"{best['link_limit_pct']:5.1f}%" if best and best.get("link_limit_pct") else f"{'-':>6}"
    base = default_best.get((n, coll, sz))
    vs = f"{base['time_us']['median'] / best['time_us']['median']:9.2f}x" if base and best and variant != "default" else f"{'':>10}"
    print(f"  {n:>5} {coll:<15} {size(sz):>7} {variant:<28} {ms(d.get('nccl'))} {ms(d.get('two_shot/direct'))} "
          f"{ms(d.get('one_shot/direct'))} {lim:9.3f} {pct} {vs}  {pc.get('d2h_gbps', 0):.1f}/{pc.get('h2d_gbps', 0):.1f} "
          f"({pc.get('duplex_d2h_gbps', 0):.1f}/{pc.get('duplex_h2d_gbps', 0):.1f})")
bases = {}
for f in sorted(out.glob("default_n*/sweep.json")):
    for k, v in json.loads(f.read_text()).get("pinned_copy", {}).get("link_limit_basis", {}).items():
        bases[f"{f.parent.name.rsplit('_n', 1)[1]} ranks, {k}"] = v
for k, v in bases.items():
    print(f"# limit basis, {k}: {v}")
EOF
echo "== linklimit: $(( $(date +%s) - t0 )) s, testbed $mode"
exit $status
