#!/bin/sh
# Runs a command that must refuse its input: exit status 1..125 (an error, not a crash or a signal),
# or exactly N with --status N; the expected text in its output; and optionally a text that must not
# appear (a line claiming success, such as "report: PATH").
#   expect_failure.sh EXPECTED [--absent TEXT] [--status N] -- COMMAND [ARGS...]
expected=$1
shift
absent=
status=
while :; do
  case $1 in
    --absent) absent=$2; shift 2 ;;
    --status) status=$2; shift 2 ;;
    *) break ;;
  esac
done
[ "$1" = -- ] && shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ -n "$status" ]; then
  if [ "$rc" -ne "$status" ]; then
    echo "expect_failure: exit status $rc, expected $status"
    exit 1
  fi
elif [ "$rc" -eq 0 ] || [ "$rc" -gt 125 ]; then
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
