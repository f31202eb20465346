#!/usr/bin/env bash
# The out-of-memory benchmark (bench/bench_oom.c) on this tree's library
# against a baseline commit's, in one run: both builds use this tree's
# bench/bench_oom.c (so only the library differs) and run alternately, one
# process per round, so that a busy neighbour slows both alike. Prints,
# per policy, each build's median over the rounds of operations per second
# and of microseconds per OOM, their ratios (this / baseline), and the
# median of the rounds' own ratios of operations per second.
#
#   bench/compare_oom.sh [baseline ref, origin/main] [rounds, 9] [bench_oom arguments...]
set -euo pipefail
base_ref=${1:-origin/main}
rounds=${2:-9}
shift $(($# < 2 ? $# : 2))
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
        "$1"/csrc/core/*.c "${replay[@]}" "$1"/csrc/device/*.c bench/bench_oom.c -lpthread -ldl
}
build "$work/base" "$work/baseline"
build "$root" "$work/this"
changed=$(git diff --quiet HEAD || echo '+changes')
echo "baseline $(git rev-parse --short "$base_ref"), this tree $(git rev-parse --short HEAD)$changed;" \
     "$rounds rounds, alternating; bench_oom --repeats 1 $*"

# One line per policy and run: policy build ops/s us-per-OOM OOMs provider-calls-per-op round
for ((i = 0; i < rounds; i++)); do
    for build in baseline this; do
        "$work/$build" --repeats 1 "$@" |
            awk -v b="$build" -v r="$i" '$3 == "ops/s" {print $1, b, $2, $6, $4, $10, r}'
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
    k = $1 " " $2
    ops[k] = ops[k] " " $3; oom[k] = oom[k] " " $4; n[k] = n[k] " " $5; calls[k] = calls[k] " " $6
    at[$1 " " $2 " " $7] = $3
}
END {
    printf "%-9s %-9s %12s %10s %8s %14s\n", "policy", "build", "ops/s", "us/OOM", "OOMs", "calls/op"
    split("segments arena", pol, " ")
    for (p = 1; p <= 2; p++) {
        for (b = 0; b < 2; b++) {
            k = pol[p] " " (b ? "this" : "baseline")
            if (!(k in ops)) continue
            printf "%-9s %-9s %12.0f %10.2f %8.0f %14.3f\n", pol[p], (b ? "this" : "baseline"),
                   median(ops[k]), median(oom[k]), median(n[k]), median(calls[k])
        }
        kb = pol[p] " baseline"; kt = pol[p] " this"
        if (!(kb in ops)) continue
        ratios = ""
        for (r = 0; (pol[p] " baseline " r) in at; r++)
            ratios = ratios " " at[pol[p] " this " r] / at[pol[p] " baseline " r]
        ob = median(oom[kb]); ot = median(oom[kt])
        printf "%-9s this/base: ops/s %.2f (median of rounds %.2f), us/OOM %.2f\n", pol[p],
               median(ops[kt]) / median(ops[kb]), median(ratios), (ob > 0 ? ot / ob : 0)
    }
}' "$work/runs"
