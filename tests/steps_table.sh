#!/usr/bin/env bash
# The steps tests/timed_step.sh recorded in $STEPS_FILE (default
# build/steps.tsv), as a markdown table: each step's wall time, its share
# of the whole, and the steps that failed. Nothing recorded: says so.
#   usage: tests/steps_table.sh [STEPS_FILE]
set -u
file=${1:-${STEPS_FILE:-build/steps.tsv}}
if [ ! -s "$file" ]; then
    echo "no step was timed ($file is missing or empty)"
    exit 0
fi
awk -F '\t' '
    { name[NR] = $1; secs[NR] = $2; status[NR] = $3; total += $2 }
    function clock(s) { return sprintf("%d min %02d s", int(s / 60), s % 60) }
    END {
        print "| step | wall time | share |"
        print "|---|---:|---:|"
        for (i = 1; i <= NR; i++) {
            failed = status[i] == 0 ? "" : sprintf(" (failed, exit %d)", status[i])
            printf "| %s%s | %d s | %.0f%% |\n", name[i], failed, secs[i], total ? 100 * secs[i] / total : 0
        }
        printf "| **all %d steps** | **%s** | |\n", NR, clock(total)
    }' "$file"
