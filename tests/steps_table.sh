#!/usr/bin/env bash
# The steps tests/timed_step.sh recorded in $STEPS_FILE (default
# build/steps.tsv), as a markdown table: each step's wall time, its share
# of the whole, and the steps that failed. Steps run side by side
# (tests/beside.sh) say beside which; the whole is the wall time from the
# first step's start to the last one's end, not the sum of the steps. Rows
# of an older file (no start and end) count their seconds one after the
# other. Nothing recorded: says so.
#   usage: tests/steps_table.sh [STEPS_FILE]
set -u
file=${1:-${STEPS_FILE:-build/steps.tsv}}
if [ ! -s "$file" ]; then
    echo "no step was timed ($file is missing or empty)"
    exit 0
fi
awk -F '\t' '
    { name[NR] = $1; secs[NR] = $2; status[NR] = $3; sum += $2
      if (NF >= 5) { start[NR] = $4; stop[NR] = $5 } else { start[NR] = t; stop[NR] = t + $2 }
      t = stop[NR]
      if (NR == 1 || start[NR] < first) first = start[NR]
      if (NR == 1 || stop[NR] > last) last = stop[NR] }
    function clock(s) { return sprintf("%d min %02d s", int(s / 60), s % 60) }
    # the other steps that ran while step i did (sharing more than a second)
    function beside(i,    j, names) {
        names = ""
        for (j = 1; j <= NR; j++)
            if (j != i && start[j] < stop[i] - 1 && start[i] < stop[j] - 1)
                names = names (names == "" ? "" : "; ") name[j]
        return names
    }
    END {
        wall = last - first
        print "| step | wall time | share | beside |"
        print "|---|---:|---:|---|"
        for (i = 1; i <= NR; i++) {
            failed = status[i] == 0 ? "" : sprintf(" (failed, exit %d)", status[i])
            printf "| %s%s | %d s | %.0f%% | %s |\n", name[i], failed, secs[i], wall ? 100 * secs[i] / wall : 0, beside(i)
        }
        overlap = sum > wall ? sprintf("%d s side by side", sum - wall) : ""
        printf "| **all %d steps** | **%s** | | %s |\n", NR, clock(wall), overlap
    }' "$file"
