#!/usr/bin/env bash
# The side-by-side testbed (scripts/gpu/all.sh testbed, ~3 min): ranks emulated on one GPU run under
# a private MPS daemon their launcher owns, and every launcher says which way its ranks ran.
#   1. fp8wire-bench sweep --emulate-ranks 2 (bf16 all-reduce, 16 and 64 MiB, pass-through and
#      two-shot), once with FP8WIRE_MPS=0 and once with the daemon: the launcher's line and the JSON's
#      machine.testbed must say time-sliced / mps; both tables are printed for the times side by side.
#   2. while the MPS sweep runs, its daemon (found through the pipe directory the launcher printed)
#      lists a running MPS server (get_server_list): the ranks really are its clients.
#   3. the same for the Python launcher (tests/pylib/emulated_launch.py, two ranks initialising CUDA),
#      then two such launches at once (as under ctest -j): two private daemons on the one GPU.
#   4. fp8wire-train --ranks 2 (pi05_small, a few steps): its launcher line and summary say mps.
#   5. a daemon the user runs on the default pipe directory (/tmp/nvidia-mps) is left alone: no launcher
#      here may use that directory, and its control socket, if there is one, is still there at the end;
#      every private daemon is gone at the end (no control daemon that was not running before) with its
#      directory. A daemon from before may end meanwhile (an earlier script's, still shutting down).
# Needs nvidia-cuda-mps-control on PATH (else every row is SKIP). Logs under $OUT; summary last.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_out testbed
unset FP8WIRE_TESTBED_MODE CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY FP8WIRE_MPS  # each launcher owns its daemon
rows=()
fails=0
row() { rows+=("$(printf '%-58s %s' "$1" "$2")"); [[ "$2" == FAIL* ]] && fails=$((fails + 1)); echo "$2: $1"; }
if ! command -v nvidia-cuda-mps-control > /dev/null; then
  echo "SKIP: nvidia-cuda-mps-control not on PATH; the launchers run ranks time-sliced here"
  exit 77
fi
user_socket=""
[[ -S /tmp/nvidia-mps/control ]] && user_socket=/tmp/nvidia-mps/control
pids_before=" $(pgrep -x nvidia-cuda-mps | tr '\n' ' ')"  # the kernel keeps 15 characters of a name

# server_seen LOG PID: polls LOG for the launcher's pipe directory while PID runs, then asks that
# daemon for its MPS servers; prints the server list (empty: none seen).
server_seen() {
  local log="$1" pid="$2" pipe="" servers=""
  while kill -0 "$pid" 2>/dev/null; do
    [[ -z "$pipe" ]] && pipe="$(grep -o 'pipe directory [^)]*' "$log" 2>/dev/null | head -1 | cut -d' ' -f3)"
    if [[ -n "$pipe" ]]; then
      servers="$(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY="$pipe" nvidia-cuda-mps-control 2>/dev/null)"
      [[ -n "$servers" ]] && break
    fi
    sleep 0.5
  done
  echo "$servers"
}

# 1 and 2: the benchmark, time-sliced then side by side.
bench="$BUILD/bench/fp8wire-bench"
for mode in time-sliced mps; do
  log="$OUT/sweep_$mode.log"
  FP8WIRE_MPS=$([[ $mode == mps ]] && echo 1 || echo 0) timeout -k 5 240 "$bench" sweep --emulate-ranks 2 \
    --collectives all_reduce --dtypes bf16 --paths two_shot --min 16MiB --max 64MiB --step 4 --repeats 5 \
    --out "$OUT/sweep_$mode" > "$log" 2>&1 &
  pid=$!
  servers=""
  [[ $mode == mps ]] && servers="$(server_seen "$log" "$pid")"
  wait "$pid"; rc=$?
  said="$(grep -o 'fp8wire launcher: .*' "$log" | head -1)"
  json_mode="$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['machine'].get('testbed',''))" \
    "$OUT/sweep_$mode/fp8wire-sweep.json" 2>/dev/null)"
  if (( rc == 0 )) && [[ "$json_mode" == "$mode" && "$said" == *"$([[ $mode == mps ]] && echo 'side by side under a private MPS daemon' || echo 'time-sliced')"* ]]; then
    row "fp8wire-bench --emulate-ranks 2, $mode: launcher line and JSON" PASS
  else
    row "fp8wire-bench --emulate-ranks 2, $mode: launcher line and JSON" "FAIL (rc=$rc, JSON testbed '$json_mode', line '$said')"
  fi
  if [[ $mode == mps ]]; then
    if [[ -n "$servers" ]]; then row "MPS server running for the benchmark's ranks" "PASS (server $(echo $servers))"
    else row "MPS server running for the benchmark's ranks" "FAIL (get_server_list empty: the ranks did not use the daemon)"; fi
  fi
  echo "---- $mode"; grep -E "^#|^ +[0-9]" "$log" | head -n 12
done

# 3: the Python launcher.
log="$OUT/python_launcher.log"
timeout -k 5 120 "$PY" tests/pylib/emulated_launch.py --nproc 2 --timeout 100 -- "$PY" -c \
  'import os, time, torch; torch.ones(1, device="cuda"); print("rank", os.environ["RANK"], os.environ["FP8WIRE_TESTBED_MODE"]); time.sleep(8)' \
  > "$log" 2>&1 &
pid=$!
servers="$(server_seen "$log" "$pid")"
wait "$pid"; rc=$?
if (( rc == 0 )) && (( $(grep -c "^rank [01] mps" "$log") == 2 )) && [[ -n "$servers" ]]; then
  row "Python launcher: both ranks mps, MPS server running" "PASS (server $(echo $servers))"
else
  row "Python launcher: both ranks mps, MPS server running" "FAIL (rc=$rc, servers '$(echo $servers)'; see $log)"
fi

# 3b: two launches at once (ctest -j on a GPU machine): two private daemons on one GPU side by side.
for i in 1 2; do
  timeout -k 5 120 "$PY" tests/pylib/emulated_launch.py --nproc 2 --timeout 100 -- "$PY" -c \
    'import os, time, torch; torch.ones(1, device="cuda"); print("rank", os.environ["RANK"], os.environ["FP8WIRE_TESTBED_MODE"]); time.sleep(8)' \
    > "$OUT/two_daemons_$i.log" 2>&1 &
  pids[i]=$!
done
servers1="$(server_seen "$OUT/two_daemons_1.log" "${pids[1]}")"
servers2="$(server_seen "$OUT/two_daemons_2.log" "${pids[2]}")"
wait "${pids[1]}"; rc1=$?
wait "${pids[2]}"; rc2=$?
ok=$(cat "$OUT"/two_daemons_[12].log | grep -c "^rank [01] mps")
if (( rc1 == 0 && rc2 == 0 && ok == 4 )) && [[ -n "$servers1" && -n "$servers2" ]]; then
  row "two launches at once, each its own daemon and server" PASS
else
  row "two launches at once, each its own daemon and server" "FAIL (rc $rc1/$rc2, $ok/4 ranks mps, servers '$(echo $servers1)' '$(echo $servers2)')"
fi

# 4: the trainer's launcher.
train="$BUILD/trainer/fp8wire-train"
if [[ -x "$train" ]]; then
  log="$OUT/trainer.log"
  timeout -k 5 120 "$train" --config trainer/configs/pi05_small.toml --ranks 2 --steps 4 --set train.plot=false \
    --set "train.out_dir=$OUT/trainer" > "$log" 2>&1
  rc=$?
  if (( rc == 0 )) && grep -q "ranks: 2 on one GPU, ranks side by side under a private MPS daemon" "$log" \
     && grep -q "^summary:.*| testbed mps" "$log"; then
    row "fp8wire-train --ranks 2: launcher line and summary" PASS
  else
    row "fp8wire-train --ranks 2: launcher line and summary" "FAIL (rc=$rc; see $log)"
  fi
else
  row "fp8wire-train --ranks 2" "SKIP ($train not built)"
fi

# 5: a daemon of the user's is left alone.
if grep -l "/tmp/nvidia-mps\b" "$OUT"/*.log > /dev/null 2>&1; then
  row "no launcher used the default pipe directory" "FAIL ($(grep -l '/tmp/nvidia-mps\b' "$OUT"/*.log | head -3))"
else
  row "no launcher used the default pipe directory" PASS
fi
if [[ -n "$user_socket" ]]; then
  if [[ -S "$user_socket" ]]; then row "the user's daemon (/tmp/nvidia-mps) still runs" PASS
  else row "the user's daemon (/tmp/nvidia-mps) still runs" "FAIL (its control socket is gone)"; fi
fi
sleep 2
new_daemons=""
for pid in $(pgrep -x nvidia-cuda-mps); do [[ "$pids_before" == *" $pid "* ]] || new_daemons+=" $pid"; done
left=$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'fp8wire-mps-*' 2>/dev/null | head -3)
if [[ -z "$new_daemons" && -z "$left" ]]; then
  row "every private daemon stopped, its directory removed" "PASS (no control daemon left of those started here)"
else
  row "every private daemon stopped, its directory removed" "FAIL (control daemons started here still running:${new_daemons:- none}; directories left: ${left:-none})"
fi

echo "==================== testbed summary ===================="
printf '%s\n' "${rows[@]}"
echo "testbed: $fails FAIL"
exit $(( fails > 0 ))
