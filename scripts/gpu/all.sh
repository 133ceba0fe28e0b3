#!/usr/bin/env bash
# The GPU checks in one go: build, then run the named area checks (scripts/gpu/<area>.sh), each under
# a time limit, logs packed into $OUT/logs.tar.gz and each area's summary printed last.
#   scripts/gpu/all.sh quant shim sched bench profiler trainer main-job
# Area main-job is the user-facing scripts/main-job.sh, on the build made here.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export OUT="${OUT:-$PWD/out}"
logs="$OUT/logs"; mkdir -p "$logs"
limit="${GPU_AREA_LIMIT_S:-240}"
t0=$(date +%s)
{ nvidia-smi -L; nvidia-smi topo -m; } > "$logs/machine.txt" 2>&1
if [[ "${GPU_SKIP_BUILD:-0}" != 1 ]]; then
  bash scripts/build.sh "$BUILD" > "$logs/build.log" 2>&1; rc=$?
  echo "== build rc=$rc ($(( $(date +%s) - t0 )) s)"
  if (( rc != 0 )); then grep -E "error|Error|FAILED" "$logs/build.log" | head -40; fi
fi
summary=""
# Text results only (logs, JSON, tables, plots), one small archive. Packed after every area, so a run
# cut off at its time limit still keeps what ran.
pack() {
  (cd "$OUT" && find logs -type f -size -4M \( -name '*.log' -o -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \
     -o -name '*.md' -o -name '*.toml' -o -name '*.csv' -o -name '*.png' \) -print0 |
     tar --null -czf logs.tar.gz -T -)
}
pack
for area in "$@"; do
  s=$(date +%s)
  var="GPU_LIMIT_${area^^}"; var="${var//-/_}"; area_limit="${!var:-$limit}"   # e.g. GPU_LIMIT_MAIN_JOB=600
  script="scripts/gpu/$area.sh"
  [[ "$area" == main-job ]] && script=scripts/main-job.sh
  OUT="$logs/$area" SKIP_BUILD=1 timeout -k 10 "$area_limit" bash "$script" > "$logs/$area.log" 2>&1
  rc=$?
  summary+="$area rc=$rc $(( $(date +%s) - s ))s"$'\n'
  echo "================ $area rc=$rc ($(( $(date +%s) - s )) s) ================"
  tail -n "${GPU_TAIL:-40}" "$logs/$area.log"
  pack
done
rm -rf "$logs"
echo "================ summary ($(( $(date +%s) - t0 )) s) ================"
printf '%s' "$summary"
