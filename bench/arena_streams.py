"""Per-stream ranges or one shared range, for the arena (docs/design.md):
the arena's minimum budget and its maps + unmaps per 1,000 allocations on
each trace as recorded, and with every stream collapsed into one (an upper
bound of what one shared range could gain), plus two synthetic sequences
of streams taking turns.

    python bench/arena_streams.py [TRACE ...]     (default: ../shared/traces)
"""
import random
import sys
from array import array
from pathlib import Path

from vramguard import Heap, Trace, load_trace, min_budget
from vramguard.trace.replay import UNLIMITED

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT.parent / "shared" / "traces"


def collapsed(t):
    out = Trace(t.name + "-one-stream")
    out.kinds, out.ids, out.sizes = t.kinds, t.ids, t.sizes
    out.streams = array("Q", [0] * len(t.streams))
    out.nids = t.nids
    return out


def vm_calls(t, budget):
    h = Heap(UNLIMITED, budget=budget, policy="arena")
    h.replay(*t.columns(), t.nids, 0)
    s = h.stats()
    return s["num_maps"] + s["num_unmaps"]


def synthetic(seed, streams, rounds):
    """Streams take turns at bursts of 4-12 tensors of up to 48 MiB, each
    keeping 3 live after its burst."""
    rng = random.Random(seed)
    t = Trace(f"synthetic-{streams}-streams")
    live = {s: [] for s in range(streams)}
    for _ in range(rounds):
        s = rng.randrange(streams)
        for _ in range(rng.randrange(4, 12)):
            size = rng.choice([rng.randrange(1, MiB), rng.randrange(MiB, 48 * MiB)])
            live[s].append(t.alloc(size, s))
        rng.shuffle(live[s])
        while len(live[s]) > 3:
            t.free(live[s].pop())
    for s in live:
        for ident in live[s]:
            t.free(ident)
    return t


def row(t):
    live, allocs = t.peak_live(), t.counts()["alloc"]
    cells = [t.name, str(len(set(t.streams))), f"{allocs:,}"]
    for variant in (t, collapsed(t)):
        budget = min_budget(variant, "arena")
        calls = vm_calls(variant, budget)
        cells += [f"{budget / live - 1:+.2%}", f"{1000 * calls / allocs:.0f}"]
    return cells


def main(argv):
    paths = [Path(a) for a in argv] or sorted(
        p for p in DEFAULT_DIR.iterdir() if p.suffix in (".pickle", ".log", ".gz", ".vgtrace"))
    traces = [load_trace(p) for p in paths] + [synthetic(3, 4, 200), synthetic(5, 8, 400)]
    header = ["trace", "streams", "allocs", "per-stream min", "maps+unmaps/1k", "one-stream min",
              "maps+unmaps/1k"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for t in traces:
        print("| " + " | ".join(row(t)) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
