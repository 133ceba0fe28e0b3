#!/usr/bin/env bash
# The sanitizer and fuzz tier (scripts/test.sh runs it after the main tier; it also runs alone):
#  1. a build folder of its own (build-san) with the project's compiler and FP8WIRE_SANITIZE=ON
#     (AddressSanitizer + UndefinedBehaviorSanitizer, every finding fatal): every CPU test (label cpu)
#     whose command uses only targets without CUDA code (CMake writes the list:
#     fp8wire_targets.txt) is built, with nothing else (no .cu file is compiled), and run;
#  2. another (build-fuzz) with clang and FP8WIRE_FUZZ=ON (libFuzzer, with the same sanitizers):
#     each fuzz target (label fuzz) runs for FUZZ_SECONDS from its seed corpus.
#   scripts/sanitize.sh
# Environment: SAN_BUILD_DIR (build-san), FUZZ_BUILD_DIR (build-fuzz), BUILD_JOBS (default nproc),
# FUZZ_SECONDS (15), SAN_SKIP_FUZZ=1 (tests only), CTEST_ARGS, TORCH_PYTHON (as scripts/build.sh).
source "$(dirname "${BASH_SOURCE[0]}")/prologue.sh"
build="${SAN_BUILD_DIR:-build-san}"

# Tests that cannot run under the sanitizers, and why (the rest are found automatically):
#   profiler_cli  preloads libfp8wire_prof.so into sh; a sanitized library cannot be preloaded
#                 into a program without the sanitizer runtime (the regular tier runs it).
#   profiler_cli_no_gpu_job_status  needs libfp8wire_prof.so, which has CUDA code and so is not
#                 built here (the regular tier runs it).
excluded='^(profiler_cli|profiler_cli_no_gpu_job_status)$'

py="$(torch_python)"

# configure DIR [cmake options]: the CUDA language stays enabled (nvcc must be found) but nothing is
# compiled with it; one architecture keeps the configure short.
configure() {
  local dir="$1" opt="$2"; shift 2
  mkdir -p "$dir"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=None "-DCMAKE_C_FLAGS=$opt" "-DCMAKE_CXX_FLAGS=$opt" \
    -DFP8WIRE_SANITIZE=ON "-DFP8WIRE_TORCH_PYTHON=$py" "-DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES:-90}" \
    "$@" > "$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
}

# select DIR LABEL: "targets|tests" for the tests of LABEL whose every build-folder program is a host
# target's file (cmake/Fp8wireSanitize.cmake writes the list), minus $excluded.
select_tests() {
  ctest --test-dir "$1" --show-only=json-v1 | "$py" -c '
import json, re, sys
build, label, excluded = sys.argv[1], sys.argv[2], re.compile(sys.argv[3])
kind_of, target_of, path_of, program_of = {}, {}, {}, {}
for line in open(f"{build}/fp8wire_targets.txt"):
    kind, target, path = line.split(maxsplit=2)
    if kind == "test":  # "test <test name> <program target>"
        program_of[target] = path.strip()
        continue
    kind_of[path.strip()] = kind
    target_of[path.strip()] = target
    path_of[target] = path.strip()
tests, targets = [], set()
for t in json.load(sys.stdin)["tests"]:
    labels = next((p["value"] for p in t.get("properties", []) if p["name"] == "LABELS"), [])
    if label not in labels or excluded.match(t["name"]):
        continue
    # ctest leaves out the command of a test whose program is not built yet; those are the tests
    # of fp8wire_add_test, whose program fp8wire_targets.txt names.
    program = program_of.get(t["name"], t["name"])
    command = t.get("command") or ([path_of[program]] if program in path_of else None)
    if command is None:
        continue
    used = [a for a in command if a in kind_of]
    # A test runs here when it runs a program of ours and every such program is host code: a test
    # of Python code alone (the package, the launchers) checks nothing the sanitizers see, and some
    # need the CUDA libraries this folder never builds.
    if not used or any(kind_of[a] != "host" for a in used):
        continue
    tests.append(t["name"])
    targets.update(target_of[a] for a in used)
print(" ".join(sorted(targets)) + "|" + "|".join(tests))
' "$1" "$2" "$excluded"
}

# Leaks are findings too; tests/lsan.supp lists the known ones not yet fixed.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$FP8WIRE_ROOT/tests/lsan.supp:print_suppressions=1}"

# 1. Sanitizers with the project's compiler: every host test. -O0 -g1 compiles in a quarter of the
# time of -O2 -g; the sanitizers' checks are the same, and most tests are small or spend their time
# in LibTorch's own optimised code. The simulated-machine tests are the exception: the code they run
# is built at -O1 (fp8wire_sanitize_optimise in tests/sched/CMakeLists.txt). No NDEBUG: assertions
# stay on.
configure "$build" "${SAN_OPT_FLAGS:--O0 -g1}"
selection="$(select_tests "$build" cpu)"
targets="${selection%%|*}"
tests="${selection#*|}"
[[ -n "$tests" ]] || { echo "[sanitize] no tests selected"; exit 1; }
echo "[sanitize] building $(wc -w <<< "$targets") host targets with ASan+UBSan: $targets"
# shellcheck disable=SC2086
cmake --build "$build" -j "$JOBS" --target $targets
echo "[sanitize] build done ($(($(date +%s) - START)) s so far)"
# shellcheck disable=SC2086
ctest --test-dir "$build" --output-on-failure -j "$JOBS" -L cpu -R "^(${tests})\$" ${CTEST_ARGS:-}
echo "[sanitize] tests done ($(($(date +%s) - START)) s so far)"

# 2. libFuzzer (clang), its own folder: only the fuzz targets and the libraries they drive.
if [[ "${SAN_SKIP_FUZZ:-0}" != 1 ]]; then
  fuzz="${FUZZ_BUILD_DIR:-build-fuzz}"
  # -O1: executions per second matter here, and only a few small libraries are compiled.
  configure "$fuzz" "-O1 -g1" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DFP8WIRE_FUZZ=ON \
    -DFP8WIRE_BUILD_TRAINER=OFF "-DFP8WIRE_FUZZ_SECONDS=${FUZZ_SECONDS:-15}"
  selection="$(select_tests "$fuzz" fuzz)"
  targets="${selection%%|*}"
  tests="${selection#*|}"
  echo "[sanitize] building fuzz targets: $targets"
  # shellcheck disable=SC2086
  cmake --build "$fuzz" -j "$JOBS" --target $targets
  # One at a time: each fuzzer keeps a core busy, and its final statistics are the record.
  set +e
  # shellcheck disable=SC2086
  ctest --test-dir "$fuzz" -L fuzz -R "^(${tests})\$" -V ${CTEST_ARGS:-} > "$fuzz/fuzz.log" 2>&1
  rc=$?
  set -e
  grep -E "Test +#|stat::number_of_executed_units|stat::peak_rss_mb|Done [0-9]+ runs|tests passed" "$fuzz/fuzz.log" || true
  if (( rc != 0 )); then
    grep -E -B2 -A40 "ERROR: (AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer)|runtime error|deadly signal" \
      "$fuzz/fuzz.log" | head -120
    echo "[sanitize] a fuzz target failed (log: $fuzz/fuzz.log; the crashing input is named there)"
    exit 1
  fi
fi
echo "[sanitize] done in $(($(date +%s) - START)) s"
