"""Replaying traces on a simulated device: "would this fit in 15 GiB?",
the smallest budget that fits, and the same for PyTorch's own policy."""
from dataclasses import dataclass, field

from ._core import SEGMENT_GRANULE, Heap
from ._import import load_trace
from ._trace import Trace
from ._units import parse_size

__all__ = ["ReplayResult", "replay", "min_budget"]

#: The simulated device of a replay: large enough never to be the limit,
#: so that the budget alone decides.
UNLIMITED = 1 << 50


@dataclass
class ReplayResult:
    """What a replay found. Sizes are bytes."""

    trace: str
    policy: str
    budget: int                     # 0 = none
    fits: bool
    ooms: int
    first_oom: int                  # op index, -1 if none
    events: int
    peak_requested_bytes: int       # the physical limit (peak live requested)
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_alloc: int
    device_free: int
    alloc_retries: int
    seconds: float
    curve: list = field(repr=False, default_factory=list)  # (op, requested, allocated, reserved)

    @property
    def events_per_second(self):
        return self.events / self.seconds if self.seconds > 0 else float("inf")

    @property
    def fragmentation(self):
        """1 - peak live / peak reserved."""
        return 1 - self.peak_requested_bytes / self.peak_reserved_bytes if self.peak_reserved_bytes else 0.0


def _as_trace(trace):
    return trace if isinstance(trace, Trace) else load_trace(trace)


def _budget_bytes(budget):
    if budget is None:
        return 0
    value = parse_size(budget, "budget")
    if value <= 0:
        raise ValueError("a budget must be positive (None means no budget)")
    return value


def replay(trace, budget=None, policy="vramguard", samples=1000):
    """Drive `trace` (a Trace or a path) through a heap on a simulated device
    with `budget` (bytes, "15GiB", or None) under `policy` ("vramguard" or
    "torch"). Allocations that do not fit are counted as OOMs and the replay
    goes on, as a training script that caught the error would."""
    trace = _as_trace(trace)
    limit = _budget_bytes(budget)
    heap = Heap(UNLIMITED, budget=limit or None, policy=policy)
    r = heap.replay(*trace.columns(), trace.nids, samples)
    return ReplayResult(
        trace=trace.name,
        policy=policy,
        budget=limit,
        fits=r["ooms"] == 0,
        ooms=r["ooms"],
        first_oom=r["first_oom"],
        events=r["ops"],
        peak_requested_bytes=trace.peak_live(),
        peak_allocated_bytes=r["peak_allocated_bytes"],
        peak_reserved_bytes=r["peak_reserved_bytes"],
        device_alloc=r["device_alloc"],
        device_free=r["device_free"],
        alloc_retries=r["alloc_retries"],
        seconds=r["seconds"],
        curve=r["curve"],
    )


def _fits(trace, policy, budget):
    return replay(trace, budget, policy, samples=0).fits


def _granularity(granularity):
    if isinstance(granularity, bool) or not isinstance(granularity, int):
        raise TypeError(f"granularity must be an int of bytes, not {type(granularity).__name__}")
    if not 1 <= granularity <= UNLIMITED:
        raise ValueError(f"granularity must be from 1 to {UNLIMITED} bytes, got {granularity}")
    return granularity


def min_budget(trace, policy="vramguard", granularity=SEGMENT_GRANULE):
    """The smallest budget, a multiple of `granularity` (an int of bytes),
    at which `trace` replays under `policy` without an OOM: a bisection
    between the physical limit and the peak reserved with no budget."""
    trace = _as_trace(trace)
    g = _granularity(granularity)
    live = trace.peak_live()
    if live == 0:
        return 0
    if live > UNLIMITED:
        raise ValueError(
            f"{trace.name}: {live} bytes live at once, more than the {UNLIMITED}-byte device "
            "a replay simulates"
        )
    # The search runs in whole units of g, so that every step narrows it.
    lo = live // g  # the physical limit rounded down: it fits only if equal
    if lo and _fits(trace, policy, lo * g):
        return lo * g
    hi = max(-(-replay(trace, None, policy, samples=0).peak_reserved_bytes // g), lo + 1)
    for _ in range(8):  # a budget equal to the free-running peak nearly always fits
        if _fits(trace, policy, hi * g):
            break
        hi *= 2
    else:
        raise RuntimeError(f"{trace.name}: no budget up to {hi * g} bytes fits under policy {policy!r}")
    while hi - lo > 1:  # lo does not fit (or is 0), hi fits
        mid = (lo + hi) // 2
        if _fits(trace, policy, mid * g):
            hi = mid
        else:
            lo = mid
    return hi * g
