"""One row per trace: events, physical limit (peak live requested), minimum
budget under vramguard's policy and under the torch policy, each one's
overhead over the limit, provider calls at the torch policy's minimum
budget, the recorded native peak, and replay speed (median of repeats).

    python bench/replay_table.py [TRACE ...]     (default: tests/data and ../shared/traces)
"""
import statistics
import sys
import time
from pathlib import Path

import vramguard
from vramguard import load_trace, min_budget, replay

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


def events_per_second(trace, repeats=7):
    """Median over repeats of the C replay loop's own rate, no budget."""
    return statistics.median(replay(trace, samples=0).events_per_second for _ in range(repeats))


def row(path):
    t = load_trace(path)
    live = t.peak_live()
    ours, theirs = min_budget(t, "vramguard"), min_budget(t, "torch")
    at = {p: replay(t, theirs, p, samples=0) for p in ("vramguard", "torch")}
    calls = {p: r.device_alloc + r.device_free for p, r in at.items()}
    recorded = t.recorded_peak_reserved
    return [
        t.name, f"{len(t):,}", mib(live), mib(ours), mib(theirs),
        f"{ours / live - 1:+.1%}", f"{theirs / live - 1:+.1%}",
        f"{calls['vramguard']}/{calls['torch']}",
        mib(recorded) if recorded else "-", f"{events_per_second(t) / 1e6:.1f}M",
    ]


HEADER = ["trace", "events", "limit MiB", "vg min MiB", "torch min MiB", "vg over", "torch over",
          "calls vg/torch", "recorded MiB", "events/s"]


def main(argv):
    paths = find_traces(argv)
    if not paths:
        print("no traces found: pass paths, or put them in tests/data or ../shared/traces")
        return 1
    t0 = time.time()
    rows = [HEADER] + [row(p) for p in paths]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    for i, r in enumerate(rows):
        print("| " + " | ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print(f"\nvramguard {vramguard.__version__}; calls = provider reserve+release at the torch policy's "
          f"minimum budget; events/s = median of 7 replays (C loop), no budget. ({time.time() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
