"""Every policy side by side on real traces: vramguard's arena and segments,
PyTorch's default and expandable segments (emulated). Per trace and policy:
the physical limit (peak live requested), the minimum budget (bisection at
2 MiB) and its overhead over the limit, the peak reserved with no budget,
and the device calls (maps + unmaps; cudaMalloc + cudaFree for the segment
policies) at the minimum budget per 1,000 allocations, with what they cost
at 20 us each. A policy this build lacks is listed with the reason.

    python bench/replay_table.py [TRACE ...]     (default: tests/data and ../shared/traces)
"""
import statistics
import sys
import time
from pathlib import Path

import vramguard
from vramguard import load_trace, replay
from vramguard.report.replay_report import (
    COMPARED, DEVICE_CALL_SECONDS, check_policy, available_policies, compare_policies, unavailable_policies,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIRS = [ROOT / "tests" / "data", ROOT.parent / "shared" / "traces"]
SUFFIXES = (".pickle", ".log", ".gz", ".vgtrace")


def find_traces(args):
    if args:
        return [Path(a) for a in args]
    found = []
    for d in DEFAULT_DIRS:
        if d.is_dir():
            found += sorted(p for p in d.iterdir() if p.suffix in SUFFIXES)
    return found


def mib(n):
    return f"{n / 2**20:,.0f}"


def events_per_second(trace, policy, repeats=7):
    """Median over repeats of the replay loop's own rate, no budget."""
    engine = check_policy(policy)
    return statistics.median(replay(trace, None, engine, samples=0).events_per_second for _ in range(repeats))


def rows(path):
    """One row per available policy of one trace."""
    t = load_trace(path)
    live, allocs = t.peak_live(), t.counts()["alloc"]
    figures = compare_policies(t)
    recorded = t.recorded_peak_reserved
    out = []
    for policy in available_policies():
        f = figures[policy]
        calls = (f["maps_at_min_budget"] + f["unmaps_at_min_budget"]) * 1000 / allocs
        first = not out
        out.append([
            t.name if first else "", f"{len(t):,}" if first else "", mib(live) if first else "",
            mib(recorded) if first and recorded else "", policy,
            mib(f["min_budget_bytes"]), f"{f['min_budget_bytes'] / live - 1:+.1%}",
            mib(f["peak_reserved_bytes"]), f"{calls:,.1f}", f"{calls * DEVICE_CALL_SECONDS * 1e3:,.2f}",
            f"{events_per_second(t, policy) / 1e6:.1f}M",
        ])
    return out


HEADER = ["trace", "events", "limit MiB", "recorded MiB", "policy", "min budget MiB", "over limit",
          "peak reserved MiB", "calls /1k allocs", "ms /1k allocs", "events/s"]


def main(argv):
    paths = find_traces(argv)
    if not paths:
        print("no traces found: pass paths, or put them in tests/data or ../shared/traces")
        return 1
    t0 = time.time()
    table = [HEADER] + [r for p in paths for r in rows(p)]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    for i, r in enumerate(table):
        print("| " + " | ".join(c.ljust(w) if j in (0, 4) else c.rjust(w)
                                for j, (c, w) in enumerate(zip(r, widths))) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print(f"\nvramguard {vramguard.__version__}. limit = peak of live requested bytes; recorded = the peak "
          f"reserved when recorded; min budget by bisection at 2 MiB; peak reserved with no budget; calls = "
          f"device calls at the minimum budget (maps + unmaps; cudaMalloc + cudaFree for segments and torch) per "
          f"1,000 allocations, ms = their cost at {DEVICE_CALL_SECONDS * 1e6:.0f} us each; events/s = median of "
          f"7 replays, no budget. ({time.time() - t0:.1f}s)")
    for policy, why in unavailable_policies().items():
        print(f"not in this build: {policy} ({why})")
    print(f"policies: {', '.join(COMPARED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
