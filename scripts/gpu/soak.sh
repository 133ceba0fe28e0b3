#!/usr/bin/env bash
# Soak (scripts/gpu/all.sh soak): the main job's model for 2,000 steps, plain NCCL and under
# libfp8wire.so, both under fp8wire-prof, at the same time on one GPU (2 emulated ranks each: NCCL
# over sockets, as the main job on one GPU). Every 100 steps each rank's host memory (VmRSS) and GPU
# memory are sampled (scripts/gpu/soak_monitor.py); at the end: memory flat after warm-up, no
# profiler record dropped or late, the same loss curve as plain NCCL. Prints a summary table and
# writes it as Markdown ($OUT/soak_table.md) for docs/PERF.md.
#
# Size: the main job's pi05_small moves 377 MiB of gradients per step, which this testbed's sockets
# carry in ~300 ms (plain NCCL): 2,000 steps of it alone take ~10 min, two at once longer. The soak
# keeps its structure (SigLIP tower, joint attention over prefix and 50 action tokens, adaRMS
# expert, bucketed overlapped all-reduce, every bucket above the FP8 threshold) at depth 2 with a
# 4096-token vocabulary (~58 M parameters, ~116 MiB per step), micro-batch 2: expected ~90-130 ms
# per step with both runs sharing the GPU, i.e. 2,000 steps in ~4-5 min. SOAK_SET="" runs the
# full pi05_small (allow ~15 min).
# Environment: SOAK_STEPS (2000), SOAK_EVERY (100), SOAK_WARMUP (300), SOAK_SET (the overrides
# above), SOAK_LIMIT_S (420: both runs are stopped, by SIGTERM, after this), SOAK_RANKS (2),
# SOAK_DEVICE=cpu (a dry run of the script's logic on a machine without a GPU: tiny preset, one
# rank, the shim passing through), SOAK_RUNS (the runs side by side, default "plain fp8wire"):
#   plain              plain NCCL under fp8wire-prof
#   fp8wire            libfp8wire.so under fp8wire-prof (gathering by FP8WIRE_GATHER_TRANSPORT, sendrecv)
#   fp8wire_noprof     libfp8wire.so alone, no profiler (its profiler check is left out)
#   fp8wire_allgather  libfp8wire.so under fp8wire-prof, gathering by NCCL's all-gather
# The variants tell a growth's owner apart: the library, the profiler (CUPTI's buffers), or NCCL's
# point-to-point path. Loss parity is judged between plain and fp8wire when both run.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
gpu_out soak
build="$BUILD"
steps="${SOAK_STEPS:-2000}"
every="${SOAK_EVERY:-100}"
warmup="${SOAK_WARMUP:-300}"
limit="${SOAK_LIMIT_S:-420}"
prof="$build/profiler/fp8wire-prof"
trainer="$build/trainer/fp8wire-train"
gpu_require "$prof" "$trainer" "$build/shim/libfp8wire.so" "$build/profiler/libfp8wire_prof.so"

if [[ "${SOAK_DEVICE:-cuda}" == cpu ]]; then
  config=trainer/configs/tiny.toml
  rank_args=()
  ranks=1
  overrides=(train.plot=false train.log_every=1)
else
  config=trainer/configs/pi05_small.toml
  ranks="${SOAK_RANKS:-2}"
  rank_args=(--ranks "$ranks")
  overrides=(train.plot=false train.log_every=1 train.micro_batch=2)
  # shellcheck disable=SC2206
  overrides+=(${SOAK_SET-model.depth=2 model.vocab_size=4096})
  # As the main job on one GPU (docs/PERF.md, "Collectives over NCCL"): NCCL's point-to-point
  # chunk for both runs, and fp8wire gathering by send/recv.
  export NCCL_P2P_NET_CHUNKSIZE="${NCCL_P2P_NET_CHUNKSIZE:-524288}"
fi
read -r -a runs <<< "${SOAK_RUNS:-plain fp8wire}"
for name in "${runs[@]}"; do
  case "$name" in plain|fp8wire|fp8wire_noprof|fp8wire_allgather) ;;
    *) echo "FAIL: SOAK_RUNS: unknown run '$name', expected plain, fp8wire, fp8wire_noprof or fp8wire_allgather"; exit 2 ;;
  esac
done
echo "soak: $steps steps of $config (${overrides[*]}), ${rank_args[*]:-1 rank}, ${runs[*]} at once," \
     "samples every $every steps, warm-up $warmup, limit ${limit}s"

# A run that crashes leaves a core file and its backtrace in the log (cuda-gdb reads host-only cores
# too; the machine has no gdb). Build with CXXFLAGS=-g1 for line numbers.
ulimit -c unlimited 2>/dev/null
cores="$OUT/cores"
rm -rf "$cores"; mkdir -p "$cores"
echo "$cores/core.%e.%p" > /proc/sys/kernel/core_pattern 2>/dev/null || true

start_run() {  # start_run NAME: in the background, pid in $run_pid
  local name="$1"
  local dir="$OUT/$name"
  rm -rf "$dir"; mkdir -p "$dir"
  local set_args=(--set "train.out_dir=$dir/train")
  for kv in "${overrides[@]}"; do set_args+=(--set "$kv"); done
  local launch=("$prof" --out "$dir/prof" --shim --) gather=sendrecv
  case "$name" in
    plain) launch=("$prof" --out "$dir/prof" --) ;;
    fp8wire) gather="${FP8WIRE_GATHER_TRANSPORT:-sendrecv}" ;;
    fp8wire_noprof) launch=(env "LD_PRELOAD=$(realpath "$build/shim/libfp8wire.so")") ;;
    fp8wire_allgather) gather=allgather ;;
  esac
  # NCCL's warnings, one file per process: a crash in one of its threads leaves its last words there.
  FP8WIRE_GATHER_TRANSPORT="$gather" NCCL_DEBUG="${NCCL_DEBUG:-WARN}" \
    NCCL_DEBUG_FILE="${NCCL_DEBUG_FILE:-$dir/nccl.%h.%p.log}" \
    timeout -k 20 "$limit" "${launch[@]}" \
    "$trainer" --config "$config" "${rank_args[@]}" --steps "$steps" "${set_args[@]}" > "$dir/run.log" 2>&1 &
  run_pid=$!
}
t0=$(date +%s)
pids=() watch_args=()
for name in "${runs[@]}"; do
  start_run "$name"
  pids+=("$run_pid")
  watch_args+=(--run "$name:$run_pid:$OUT/$name/train/train_log.jsonl")
done
rm -f "$OUT/samples.jsonl"
"$PY" scripts/gpu/soak_monitor.py watch --every "$every" --out "$OUT/samples.jsonl" --ranks "$ranks" "${watch_args[@]}" &
monitor_pid=$!
rcs=()
for pid in "${pids[@]}"; do wait "$pid"; rcs+=($?); done
wait "$monitor_pid"
elapsed=$(( $(date +%s) - t0 ))
status_line="soak:"
for i in "${!runs[@]}"; do status_line+=" ${runs[$i]} rc=${rcs[$i]},"; done
echo "$status_line ${elapsed}s"
for name in "${runs[@]}"; do
  echo "---- $name: last lines"
  grep -E "^summary:|ranks in sync|fp8wire profiler, rank [0-9]+: [0-9]+ steps|error|Error" "$OUT/$name/run.log" | tail -n 8
  # The per-rank traces of 2,000 steps are large and not needed for the verdict; the reports stay.
  rm -f "$OUT/$name"/prof/*.trace.json "$OUT/$name/prof/trace.json"
done

# With NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALLOC (say) each process's NCCL allocations are in its log:
# how many lines each wrote, and the last of them, tell whether NCCL kept allocating after warm-up.
if [[ "${NCCL_DEBUG:-WARN}" == INFO ]]; then
  for name in "${runs[@]}"; do
    for f in "$OUT/$name"/nccl.*.log; do
      [[ -s "$f" ]] || continue
      echo "---- $f: $(wc -l < "$f") lines; the last 3:"
      tail -n 3 "$f"
    done
  done
fi

# The kernel's line for a crashed process names the faulting library and offset, which a lost core
# does not (dmesg may be closed to containers).
crashed=0
for i in "${!runs[@]}"; do
  if [[ "${rcs[$i]}" == 139 ]] || grep -qE "exited with status 139|signal 11|Segmentation" "$OUT/${runs[$i]}/run.log" 2>/dev/null; then
    crashed=1
  fi
done
if (( crashed )); then
  echo "---- kernel log (segfault lines)"
  dmesg 2>/dev/null | grep -iE "segfault|general protection|trap" | tail -n 10 || echo "(dmesg not readable here)"
  for name in "${runs[@]}"; do
    for f in "$OUT/$name"/nccl.*.log; do [[ -s "$f" ]] && { echo "---- $f (last lines)"; tail -n 5 "$f"; }; done
  done
fi
for c in "$cores"/core.*; do
  [[ -e "$c" ]] || continue
  echo "---- a process crashed: $c"
  if command -v cuda-gdb >/dev/null; then
    cuda-gdb -batch -ex "set pagination off" -ex "bt 30" -ex "thread apply all bt 12" "$trainer" "$c" > "$c.bt.txt" 2>&1
    sed -n '1,60p' "$c.bt.txt"
  fi
  rm -f "$c"  # the backtrace stays, the core (gigabytes) does not
done

cpu_flag=()
[[ "${SOAK_DEVICE:-cuda}" == cpu ]] && cpu_flag=(--cpu)
report_args=()
for name in "${runs[@]}"; do
  profdir="$OUT/$name/prof"
  [[ "$name" == fp8wire_noprof ]] && profdir=-   # no profiler: no record to count
  report_args+=(--run "$name:$OUT/$name/train/train_log.jsonl:$profdir")
done
[[ " ${runs[*]} " == *" plain "* && " ${runs[*]} " == *" fp8wire "* ]] && report_args+=(--parity plain fp8wire)
"$PY" scripts/gpu/soak_monitor.py report --samples "$OUT/samples.jsonl" --steps "$steps" --warmup "$warmup" "${cpu_flag[@]}" \
  --ranks "$ranks" "${report_args[@]}" --markdown "$OUT/soak_table.md"
verdict=$?
for i in "${!runs[@]}"; do
  rc="${rcs[$i]}"
  # Without a GPU (dry run) CUPTI records nothing, so fp8wire-prof has no report to merge (status 1).
  [[ "${SOAK_DEVICE:-cuda}" == cpu && "$rc" == 1 && "${runs[$i]}" != fp8wire_noprof ]] && continue
  if (( rc == 124 || rc == 137 )); then echo "soak: ${runs[$i]} was stopped at the ${limit}s limit"; verdict=1
  elif (( rc != 0 )); then echo "soak: ${runs[$i]} exited with status $rc (see its run.log)"; verdict=1; fi
done
echo "---- Markdown for docs/PERF.md ($OUT/soak_table.md):"
cat "$OUT/soak_table.md"
exit "$verdict"
