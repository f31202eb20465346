#!/usr/bin/env bash
# One step of `make test` (and of CI), timed: runs COMMAND, then prints
# "== step NAME: N s" and appends NAME, seconds, exit status, and its start
# and end (seconds since the epoch: steps can run side by side,
# tests/beside.sh) to $STEPS_FILE (default build/steps.tsv), which
# tests/steps_table.sh prints as a table at the end. The step's exit status is COMMAND's.
#   usage: tests/timed_step.sh NAME COMMAND [ARG...]
set -u
if [ $# -lt 2 ]; then
    echo "usage: $0 NAME COMMAND [ARG...]" >&2
    exit 2
fi
name=$1
shift
file=${STEPS_FILE:-build/steps.tsv}
mkdir -p "$(dirname "$file")"
start=$(date +%s)
"$@"
status=$?
end=$(date +%s)
seconds=$(( end - start ))
printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$seconds" "$status" "$start" "$end" >> "$file"
if [ "$status" -eq 0 ]; then
    echo "== step $name: $seconds s"
else
    echo "== step $name: $seconds s, failed (exit $status)"
fi
exit "$status"
