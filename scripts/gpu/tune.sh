#!/usr/bin/env bash
# Tuning experiments (notes and outcomes in docs/PERF.md, "Codec kernels" and
# "Collectives over NCCL"):
#   kernels     quantize / dequantize at 64 and 256 MiB with the work per CTA and kernel variant
#               forced (TUNE_KERNEL_RUNS="work:variant ..."; 0:0 = production), each run with its own
#               copy ceiling;
#   transports  fp8wire-transport-probe on the emulated testbed: all-gather vs grouped send/recv vs
#               both in one group, at 2 and 4 ranks (TUNE_PROBE_ENV adds one more 4-rank run with
#               that NCCL environment, e.g. "NCCL_P2P_NET_CHUNKSIZE=524288").
# TUNE_PARTS selects (default: "kernels transports").
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
OUT="${OUT:-out/tune}"; mkdir -p "$OUT"
parts="${TUNE_PARTS:-kernels transports}"
kb=build/tests/quant/fp8wire-kernel-bench
probe=build/bench/fp8wire-transport-probe
if [[ " $parts " == *" kernels "* ]]; then
  # TUNE_KERNEL_RUNS: "work:variant" pairs, each one run with its own copy ceiling.
  for wv in ${TUNE_KERNEL_RUNS:-0:0 1:0 2:0 4:0}; do
    w=${wv%%:*}; v=${wv##*:}
    timeout 60 "$kb" --sizes 64MiB,256MiB --kernels quantize,dequantize --repeats 30 --work-per-cta "$w" \
      --kernel-variant "$v" > "$OUT/kernels_w${w}_v$v.log" 2>&1
    echo "==== kernels, work per CTA $w, variant $v (rc=$?)"
    grep -E "^(copy|quantize|dequantize|traffic) .*(native|software|-) " "$OUT/kernels_w${w}_v$v.log" | grep -v graph
  done
fi
if [[ " $parts " == *" transports "* ]]; then
  probe_run() {  # label ranks sizes [env...]
    local label=$1 ranks=$2 sizes=$3; shift 3
    env "$@" timeout 150 "$probe" --emulate-ranks "$ranks" --sizes $sizes --fractions 0.5 0.6 0.7 \
      > "$OUT/probe_$label.log" 2>&1
    echo "==== transports $label: $ranks ranks $* (rc=$?)"
    grep -vE "^\s*$" "$OUT/probe_$label.log" | grep -v "^NCCL" | tail -n 40
  }
  probe_run r2 2 "64MiB 256MiB"
  probe_run r4 4 "4MiB 64MiB"
  if [[ -n "${TUNE_PROBE_ENV:-}" ]]; then probe_run r4_env 4 "4MiB 64MiB" $TUNE_PROBE_ENV; fi
fi
