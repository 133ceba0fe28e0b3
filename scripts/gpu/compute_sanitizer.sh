#!/usr/bin/env bash
# compute-sanitizer over the GPU code (scripts/gpu/all.sh compute_sanitizer; GPU_LIMIT_COMPUTE_SANITIZER=420):
#   1. memcheck (with leak check) over the codec test matrix: test_quant_gpu --quick (every kernel x
#      dtype x format x scale x block x rounding x conversion path at small and odd counts, fused
#      reduce, CUDA graph replay; each checked bit for bit against the CPU reference);
#   2. racecheck (shared-memory hazards) over the same matrix;
#   3. memcheck over one multi-rank run: fp8wire-bench sweep on 2 emulated ranks (every FP8
#      all-reduce path through sched::Engine, NCCL and the codec kernels, 64 KiB..1 MiB, each
#      result checked), all processes followed (--target-processes all).
# Findings are counted per kernel family: fp8wire's own kernels (names with "fp8wire") against
# everything else (NCCL's, the CUDA runtime's), and leaks (device allocations alive at exit). Any
# finding in fp8wire's code, any failed test inside the tool, or a time-out is a FAIL; findings
# elsewhere and leaks are a WARN row, listed for a look.
# Logs under $OUT; the summary table is printed last. SAN_LIMIT_S (per run, default 150).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# Ranks stay time-sliced here (no MPS daemon): the checks are about correctness, and the tool is
# run the way its findings were established.
export FP8WIRE_MPS=0
gpu_out compute-sanitizer
build="$BUILD"
limit="${SAN_LIMIT_S:-150}"
cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
if [[ ! -x "$cs" ]]; then echo "FAIL: compute-sanitizer not found (CUDA toolkit bin/)"; exit 1; fi
"$cs" --version | tail -n 1
rows=()
fails=0

# run LABEL TOOL [sanitizer options] -- COMMAND...
run() {
  local label="$1" tool="$2"; shift 2
  local opts=()
  while [[ "$1" != -- ]]; do opts+=("$1"); shift; done
  shift
  local log="$OUT/$label.log" t0=$SECONDS
  timeout -k 10 "$limit" "$cs" --tool "$tool" "${opts[@]}" --print-limit 200 --error-exitcode 99 \
    --log-file "$OUT/$label.sanitizer.log" "$@" > "$log" 2>&1
  local rc=$?
  local dt=$(( SECONDS - t0 ))
  # Findings per kernel family (findings in fp8wire's code, elsewhere, leaks) and the tool's summary.
  local counts ours theirs leaks summary
  counts="$("$PY" - "$OUT/$label.sanitizer.log" <<'PYEOF'
import re, sys
text = open(sys.argv[1], errors="replace").read().splitlines()
head = re.compile(r"^=+ +(Invalid|Out-of-range|Program hit|Uninitialized|Race reported|Error:|Misaligned|"
                  r"Warning: Race|Leaked|Cuda API|Malloc|Barrier|Device heap)")
blocks, current = [], None
for line in text:
    if head.match(line):
        current = [line]
        blocks.append(current)
    elif current is not None and line.startswith("=") and line.strip("= ").strip():
        current.append(line)
    else:
        current = None
# A finding is fp8wire's when its kernel is (a memory or race report names the kernel on its first
# lines) or, for a CUDA API error, when the innermost host frame is in fp8wire's code; a frame of the
# program further out (fp8wire-bench's main calling ncclCommInitRank) does not make NCCL's own
# probe fp8wire's.
def ours_of(b):
    if b[0].split()[1] == "Program":
        frames = [l for l in b if "Host Frame:" in l]
        return bool(frames) and "fp8wire" in frames[0] and "libnccl" not in frames[0]
    return any("fp8wire" in l for l in b[:4])
ours = sum(1 for b in blocks if not b[0].split()[1].startswith("Leaked") and ours_of(b))
theirs = sum(1 for b in blocks if not b[0].split()[1].startswith("Leaked") and not ours_of(b))
leaks = sum(1 for b in blocks if b[0].split()[1].startswith("Leaked"))
summary = " ".join(l.strip("= ").strip() for l in text if "SUMMARY" in l)
print(ours, theirs, leaks, summary)
PYEOF
)"
  read -r ours theirs leaks summary <<< "$counts"
  local tool_fails
  tool_fails=$(grep -cE "^FAIL" "$log")
  local verdict=PASS
  if (( rc == 124 || rc == 137 )); then verdict=FAIL; summary="timed out after ${limit}s; $summary"
  elif (( ${ours:-0} > 0 || tool_fails > 0 )); then verdict=FAIL
  elif (( rc != 0 && ${theirs:-0} == 0 && ${leaks:-0} == 0 )); then verdict=FAIL  # failed without a finding
  elif (( ${theirs:-0} + ${leaks:-0} > 0 )); then verdict=WARN  # not in fp8wire's kernels: listed below
  fi
  [[ "$verdict" == FAIL ]] && fails=$((fails + 1))
  rows+=("$(printf '%-26s %-4s rc=%-3s %4ss  fp8wire kernels: %s findings; elsewhere: %s; leaks: %s; test FAIL lines: %s; %s' \
    "$label" "$verdict" "$rc" "$dt" "${ours:-?}" "${theirs:-?}" "${leaks:-?}" "$tool_fails" "${summary:-}")")
  echo "${rows[-1]}"
  if (( ${theirs:-0} + ${leaks:-0} > 0 )); then
    echo "  first findings outside fp8wire's kernels or leaks (full list: $OUT/$label.sanitizer.log):"
    grep -hE "^=+ +(Invalid|Out-of-range|Program hit|Uninitialized|Race reported|Error:|Leaked)" -A3 \
      "$OUT/$label.sanitizer.log" | head -n 12 | sed 's/^/    /'
  fi
}

quant="$build/tests/quant/test_quant_gpu"
bench="$build/bench/fp8wire-bench"
gpu_require "$quant" "$bench"

parts="${CS_PARTS:-memcheck racecheck multirank}"   # which of the three runs
[[ " $parts " == *" memcheck "* ]] && run memcheck_codec_matrix memcheck --leak-check full -- "$quant" --quick
[[ " $parts " == *" racecheck "* ]] && run racecheck_codec_matrix racecheck --racecheck-report hazard -- "$quant" --quick
[[ " $parts " == *" multirank "* ]] && run memcheck_multirank_bench memcheck --target-processes all -- \
  "$bench" sweep --emulate-ranks 2 --collectives all_reduce --min 64KiB --max 1MiB --step 4 --warmup 1 --repeats 2 \
  --buffers 2 --timeout "$(( limit - 20 ))" --out "$OUT/bench"

echo "==================== compute-sanitizer summary ===================="
printf '%s\n' "${rows[@]}"
echo "compute-sanitizer: $fails FAIL"
exit $(( fails > 0 ))
