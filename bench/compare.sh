#!/usr/bin/env bash
# The hot path of this tree against a baseline commit, in one run: both
# builds use this tree's bench/bench_hot_path.c (so only the library
# differs), and run alternately, one process per policy and round, so that
# a busy neighbour slows both alike. Prints, per policy and case, each
# build's median ns per alloc+free pair over the rounds, the ratio of the
# medians (this / baseline), and the median of the rounds' own ratios
# (each round's two runs are back to back, so it follows a load that
# drifts over the run).
#
#   bench/compare.sh [baseline ref, origin/main] [rounds, 11] [pairs per round, 300000]
set -euo pipefail
base_ref=${1:-origin/main}
rounds=${2:-11}
pairs=${3:-300000}
root=$(git rev-parse --show-toplevel)
cd "$root"
work=$(mktemp -d)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach -q "$work/base" "$base_ref"

CC=${CC:-cc}
build() { # library tree, output (a baseline from before csrc/replay has its files in csrc/core)
    local replay=()
    [ -d "$1/csrc/replay" ] && replay=("$1"/csrc/replay/*.c)
    "$CC" -O2 -DNDEBUG -std=c11 -D_GNU_SOURCE -I"$1/include" -I"$1/csrc/core" -o "$2" \
        "$1"/csrc/core/*.c "${replay[@]}" "$1"/csrc/device/*.c bench/bench_hot_path.c -lpthread -ldl
}
build "$work/base" "$work/baseline"
build "$root" "$work/this"
changed=$(git diff --quiet HEAD || echo '+changes')
echo "baseline $(git rev-parse --short "$base_ref"), this tree $(git rev-parse --short HEAD)$changed;" \
     "$rounds rounds of $pairs pairs, alternating"

for ((i = 0; i < rounds; i++)); do
    for policy in segments arena; do
        for build in baseline this; do
            "$work/$build" "$pairs" 1 "$policy" abc |
                awk -v b="$build" -v p="$policy" -v r="$i" '/^\([abc]\)/ {print p, b, $1, $NF, r}'
        done
    done
done >"$work/runs"

awk '
function median(list,   n, v, i, j, t) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++)
        for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
{
    ns[$1 " " $3 " " $2] = ns[$1 " " $3 " " $2] " " $4
    at[$1 " " $3 " " $2 " " $5] = $4
}
END {
    printf "%-9s %-4s %12s %12s %12s %14s\n", "policy", "case", "baseline ns", "this ns",
           "this/base", "median ratio"
    split("segments arena", pol, " "); split("(a) (b) (c)", cas, " ")
    for (p = 1; p <= 2; p++) for (c = 1; c <= 3; c++) {
        k = pol[p] " " cas[c]
        b = median(ns[k " baseline"]); t = median(ns[k " this"])
        ratios = ""
        for (r = 0; (k " baseline " r) in at; r++)
            ratios = ratios " " at[k " this " r] / at[k " baseline " r]
        printf "%-9s %-4s %12.1f %12.1f %12.2f %14.2f\n", pol[p], cas[c], b, t, t / b, median(ratios)
    }
}' "$work/runs"
