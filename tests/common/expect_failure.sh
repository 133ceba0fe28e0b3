#!/bin/sh
# Runs a command that must refuse its input: exit status 1..125 (an error, not a crash or a signal),
# the expected text in its output, and optionally a text that must not appear (a line claiming
# success, such as "report: PATH").
#   expect_failure.sh EXPECTED [--absent TEXT] -- COMMAND [ARGS...]
expected=$1
shift
absent=
if [ "$1" = --absent ]; then
  absent=$2
  shift 2
fi
[ "$1" = -- ] && shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ] || [ "$rc" -gt 125 ]; then
  echo "expect_failure: exit status $rc, expected an error status (1..125)"
  exit 1
fi
case $out in
  *"$expected"*) ;;
  *) echo "expect_failure: the output lacks: $expected"; exit 1 ;;
esac
if [ -n "$absent" ]; then
  case $out in
    *"$absent"*) echo "expect_failure: the output must not contain: $absent"; exit 1 ;;
  esac
fi
echo "expect_failure: ok (exit status $rc)"
