#!/usr/bin/env bash
# Where a direct call's time goes on the GPU (scripts/gpu/all.sh direct_trace, ~1 min): bf16
# all-reduces and reduce-scatters under the shim over host memory, ranks emulated on one GPU
# (direct.assume_one_host), profiled with torch.profiler (scripts/gpu/direct_trace_job.py), then every
# rank's kernels and copies on one timeline (scripts/direct_timeline.py): how busy each direction of
# the host link was, whether the ranks' copies ran at once, and one call period op by op.
# Env: DIRECT_TRACE_RANKS (default "2 4"), DIRECT_TRACE_MIB (default 16,64), DIRECT_TRACE_OPS (ar,rs),
# DIRECT_TRACE_ENV (configuration overrides for the library, e.g. "FP8WIRE_DIRECT_PROTOCOL=kernels"),
# DIRECT_TRACE_KEEP=1 (keep the raw traces, packed).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_out direct-trace
lib="$BUILD/shim/libfp8wire.so"
[[ -f "$lib" ]] || { echo "FAIL: $lib not built"; exit 1; }
status=0
for w in ${DIRECT_TRACE_RANKS:-2 4}; do
  env ${DIRECT_TRACE_ENV:-} LD_PRELOAD="$PWD/$lib" FP8WIRE_DIRECT_TRANSPORT=host_memory FP8WIRE_DIRECT_ASSUME_ONE_HOST=1 \
    timeout -k 5 150 "$PY" tests/pylib/emulated_launch.py --nproc "$w" --timeout 140 -- \
    "$PY" scripts/gpu/direct_trace_job.py "$OUT/traces" "${DIRECT_TRACE_MIB:-16,64}" "${DIRECT_TRACE_OPS:-ar,rs}" \
    > "$OUT/job_w$w.log" 2>&1 || { status=1; echo "FAIL: $w ranks (see job_w$w.log)"; tail -n 5 "$OUT/job_w$w.log"; }
  grep -E "^rank |testbed" "$OUT/job_w$w.log"
done
shopt -s nullglob
for first in "$OUT"/traces/*_r0.json; do
  case="${first%_r0.json}"
  traces=("$case"_r*.json)
  echo "==== $(basename "$case")"
  # Written whole, then its head shown (a pipe into head would cut the file short).
  "$PY" scripts/direct_timeline.py "${traces[@]}" > "$OUT/$(basename "$case").timeline.txt" || status=1
  head -n 3 "$OUT/$(basename "$case").timeline.txt"
done
# Megabytes per case; the timelines above keep what they show (DIRECT_TRACE_KEEP=1 packs the traces
# into traces.tar.gz instead, for another look with scripts/direct_timeline.py --window).
if [[ "${DIRECT_TRACE_KEEP:-0}" == 1 ]]; then tar -C "$OUT" -czf "$OUT/traces.tar.gz" traces; fi
rm -rf "$OUT/traces"
exit "$status"
