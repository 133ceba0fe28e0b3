#!/bin/sh
# The shim's include rule (shim/README.md): of the project's folders, shim/ includes only common/,
# itself, the engine's entry points (sched/engine/engine.hpp, which brings the platform, the GPU's
# platform and the real-NCCL table the shim builds an engine from) and the totals the C API reads
# (sched/engine/accounting.hpp, sched/comm/telemetry_monitor.hpp). Every other include of a project
# folder is listed as FILE:LINE: HEADER and fails the check.
#   include_rule.sh SHIM_DIR
dir=${1:?usage: include_rule.sh SHIM_DIR}
bad=$(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]' "$dir"/*.cpp "$dir"/*.hpp "$dir"/*.h 2>/dev/null |
  sed -E 's/^([^:]*:[0-9]+):[^<"]*[<"]([^>"]*)[>"].*/\1: \2/' |
  while IFS= read -r line; do
    header=${line#*: }
    case $header in
      common/* | shim/* | sched/engine/engine.hpp | sched/engine/accounting.hpp | sched/comm/telemetry_monitor.hpp) ;;
      sched/* | quant/* | profiler/* | bench/* | trainer/* | tests/* | python/*) echo "$line" ;;
    esac
  done)
if [ -n "$bad" ]; then
  printf '%s\n' "$bad"
  echo "include_rule: FAIL: shim/ includes sched/ only through sched/engine/engine.hpp (and accounting.hpp, telemetry_monitor.hpp for the C API), see shim/README.md"
  exit 1
fi
echo "include_rule: ok ($(ls "$dir"/*.cpp "$dir"/*.hpp "$dir"/*.h 2>/dev/null | wc -l) files)"
