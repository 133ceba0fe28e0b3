#!/usr/bin/env bash
# THE main job (README): fp8wire end to end on the GPUs present.
#   1. builds fp8wire (scripts/build.sh), installing missing packages first where apt can;
#   2. trains the bundled Pi0.5 reference model (trainer/configs/pi05_small.toml) for a short run,
#      data parallel over NCCL: one rank per GPU, or RANKS ranks sharing one GPU (distinct
#      NCCL_HOSTID per rank, so NCCL joins them over sockets) when there is a single GPU, side by side
#      under a private MPS daemon where nvidia-cuda-mps-control exists (FP8WIRE_MPS=0: time-sliced);
#   3. runs it under the exposure profiler: plain NCCL (bf16 gradients), then with
#      LD_PRELOAD=libfp8wire.so (FP8 on the wire); same seed, same data. Ranks sharing one GPU stand in
#      for two kinds of machine, and the fp8wire run is made once for each, labelled: ranks as
#      separate hosts (fp8wire over NCCL's transports), and ranks as one PCIe host without P2P
#      (fp8wire's direct transport over shared host memory; MAIN_DIRECT=0 leaves it out);
#   4. prints each run's exposure report, the side-by-side comparison with plain NCCL (step ms,
#      exposed communication ms, bytes on the wire) and the loss parity, for each fp8wire run.
# Environment: RANKS (default: GPUs, or 2 on one GPU), STEPS (30), CONFIG, MAIN_DIRECT, MAIN_OUT (default
#   $OUT/main-job, OUT default out), TRAIN_SET (extra --set overrides, space separated), SKIP_BUILD=1,
#   FP8WIRE_MPS=0 (ranks sharing a GPU time-sliced). On one GPU, NCCL_P2P_NET_CHUNKSIZE (default there
#   524288) as measured best, and a calibration sweep first whose profile the fp8wire runs load
#   (MAIN_CALIBRATE=0, or an FP8WIRE_CONFIG of your own, skips it). Every other variable reaches both
#   runs (e.g. NCCL_P2P_DISABLE=1 bash scripts/main-job.sh).
# Also an area of scripts/gpu/all.sh (`all.sh main-job`: the build is all.sh's, results under its OUT).
source "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
set -e

# The GPU first: installing and building take minutes this job cannot use without one. An empty
# CUDA_VISIBLE_DEVICES hides every GPU from the trainer, so it counts as none.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[[ -n "${CUDA_VISIBLE_DEVICES-unset}" ]] || gpus=0
if (( gpus == 0 )); then
  echo "main-job: no GPU visible (nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES is empty); this job trains" \
       "on GPUs, so nothing was installed or built (scripts/test.sh runs every test that needs none)" >&2
  exit 1
fi

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  # Header-only and small libraries the build needs; found in the system, in .carry/include (what
  # scripts/dev/carry-deps.sh copies for machines without apt) or in FP8WIRE_EXTRA_INCLUDE.
  missing_headers() {
    local h d found
    for h in toml++ doctest/doctest.h CLI/CLI.hpp nlohmann/json.hpp fmt/format.h; do
      found=0
      for d in /usr/include /usr/local/include .carry/include ${FP8WIRE_EXTRA_INCLUDE:-}; do
        [[ -e "$d/$h" ]] && found=1 && break
      done
      (( found )) || echo "$h"
    done
  }
  missing="$(missing_headers)"
  if [[ -n "$missing" ]]; then
    if command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]]; then
      echo "main-job: installing missing build dependencies ($(echo $missing))"
      # torch is installed only when the python that builds the trainer lacks it.
      if "${TORCH_PYTHON:-python3}" -c 'import torch' 2>/dev/null; then
        FP8WIRE_SKIP_TORCH=1 bash scripts/install-deps.sh
      else
        bash scripts/install-deps.sh
      fi
    else
      echo "main-job: missing headers ($(echo $missing)) and no apt-get as root to install them;" \
           "copy them into .carry/include (scripts/dev/carry-deps.sh) or set FP8WIRE_EXTRA_INCLUDE" >&2
      exit 1
    fi
  fi
  bash scripts/build.sh "$BUILD"
fi

ranks="${RANKS:-$(( gpus > 1 ? gpus : 2 ))}"
steps="${STEPS:-30}"
config="${CONFIG:-trainer/configs/pi05_small.toml}"
out="${MAIN_OUT:-${OUT:-out}/main-job}"
rm -rf "$out"; mkdir -p "$out"
echo "main-job: $gpus GPU(s), $ranks ranks$( (( gpus == 1 )) && echo ' sharing GPU 0 (emulated hosts over NCCL sockets)'), $steps steps, $config"
# Ranks sharing GPU 0: one private MPS daemon for both runs (fp8wire-train joins it), so they are
# measured on the same testbed; the mode goes into the comparison.
if (( gpus == 1 )); then gpu_mps_start > "$out/testbed.txt"; else echo "testbed: one GPU per rank" > "$out/testbed.txt"; fi
cat "$out/testbed.txt"
fp8_env=()
if (( gpus == 1 )); then
  # Measured for this testbed (docs/PERF.md), kept when already set: NCCL's point-to-point chunk over
  # its network transport at 512 KiB (for both runs; NCCL's all-reduce, which the baseline uses, does
  # not depend on it).
  export NCCL_P2P_NET_CHUNKSIZE="${NCCL_P2P_NET_CHUNKSIZE:-524288}"
  echo "main-job: emulated-testbed setting: NCCL_P2P_NET_CHUNKSIZE=$NCCL_P2P_NET_CHUNKSIZE (both runs)"
  # Ranks standing in for hosts over NCCL's sockets are a fabric no built-in figure describes: the
  # fp8wire runs plan with a profile measured here first, at this rank count (every all-reduce
  # variant against plain NCCL over the gradient buckets' sizes; the profile's measured routes pick
  # the fastest), unless FP8WIRE_CONFIG names one or MAIN_CALIBRATE=0.
  if [[ -z "${FP8WIRE_CONFIG:-}" && "${MAIN_CALIBRATE:-1}" != 0 ]]; then
    echo "main-job: calibrating fp8wire for $ranks ranks on this testbed (fp8wire-bench sweep, log $out/calibration.log)"
    if "$BUILD/bench/fp8wire-bench" sweep --emulate-ranks "$ranks" --collectives all_reduce --paths two_shot,one_shot \
         --gather-transport both --min 1MiB --max 64MiB --step 4 --warmup 2 --repeats 5 --no-check \
         --out "$out/calibration" > "$out/calibration.log" 2>&1; then
      fp8_env=(FP8WIRE_CONFIG="$out/calibration/fp8wire-profile.toml")
      grep -A8 "planner's pick" "$out/calibration.log" || true
    else
      echo "main-job: the calibration sweep failed (its log's end below); the fp8wire runs plan with the built-in figures" >&2
      tail -5 "$out/calibration.log" >&2
    fi
  fi
  if (( ${#fp8_env[@]} )); then echo "main-job: fp8wire runs with ${fp8_env[*]}"; fi
fi

train() {  # train <label> [--shim]
  local label="$1"; shift
  local set_args=(--set "train.out_dir=$out/$label/train")
  for kv in ${TRAIN_SET:-}; do set_args+=(--set "$kv"); done
  echo; echo "================ $label ================"
  "$BUILD/profiler/fp8wire-prof" --out "$out/$label" "$@" -- \
    "$BUILD/trainer/fp8wire-train" --config "$config" --ranks "$ranks" --steps "$steps" "${set_args[@]}" \
    2>&1 | tee "$out/$label.log"
}
train baseline
(
  (( ${#fp8_env[@]} )) && export "${fp8_env[@]}"
  FP8WIRE_LOG_LEVEL="${FP8WIRE_LOG_LEVEL:-info}" train fp8wire --shim
)

direct=0
if (( gpus == 1 )) && [[ "${MAIN_DIRECT:-1}" != 0 ]]; then
  direct=1
  (
    (( ${#fp8_env[@]} )) && export "${fp8_env[@]}"
    export FP8WIRE_DIRECT_TRANSPORT=host_memory FP8WIRE_DIRECT_ASSUME_ONE_HOST=1
    FP8WIRE_LOG_LEVEL="${FP8WIRE_LOG_LEVEL:-info}" train fp8wire_direct --shim
  )
fi

stand_in=""
(( gpus == 1 )) && stand_in=", ranks as separate hosts (NCCL's transports)"
echo; echo "================ comparison: fp8wire$stand_in ================"
{ cat "$out/testbed.txt"; echo "fp8wire$stand_in"; "$PY" scripts/compare_runs.py "$out/baseline" "$out/fp8wire"; } |
  tee "$out/comparison.txt"
if (( direct )); then
  echo; echo "================ comparison: fp8wire, ranks as one PCIe host without P2P (direct host memory) ================"
  { cat "$out/testbed.txt"; echo "fp8wire, ranks as one PCIe host without P2P (direct transport over host memory)"
    "$PY" scripts/compare_runs.py "$out/baseline" "$out/fp8wire_direct"; } | tee "$out/comparison_direct.txt"
fi
