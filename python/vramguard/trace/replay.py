"""Replaying traces on a simulated device: "would this fit in 15 GiB?",
the smallest budget that fits, and the same for PyTorch's own policy."""
import heapq
from dataclasses import dataclass, field
from typing import Optional

from .._core import SEGMENT_GRANULE, Heap, expandable_replay
from .._search import bisect, double
from .importer import load_trace
from .._presets import find_preset
from .stacks import group_by_line
from .format import ALLOC, FREE, Trace
from .._units import format_size, parse_budget
from ..render.words import count

__all__ = ["FirstOOM", "LiveSet", "ReplayResult", "replay", "min_budget", "live_at", "live_at_peak"]

#: The simulated device of a replay: large enough never to be the limit,
#: so that the budget alone decides.
UNLIMITED = 1 << 50
#: Every policy a replay and min_budget() take: "vramguard" is the one
#: vramguard recommends; "torch-expandable" is PyTorch with
#: expandable_segments:True, emulated (a Heap takes the others).
REPLAY_POLICIES = ("vramguard", "arena", "segments", "torch", "torch-expandable")


def check_policy_name(policy):
    """A TypeError unless `policy` is a str, a ValueError that lists every
    policy a replay takes unless it is one of them."""
    if not isinstance(policy, str):
        raise TypeError(f"policy must be a str, one of {', '.join(REPLAY_POLICIES)}; "
                        f"got {type(policy).__name__}")
    if policy not in REPLAY_POLICIES:
        raise ValueError(f"unknown policy {policy!r}: use one of {', '.join(REPLAY_POLICIES)}")


def _sizes(items):
    return ", ".join(f"{format_size(b)} ({w})" for b, w in items)


@dataclass(frozen=True)
class LiveSet:
    """What was live at one point of a trace.

    `where` names the point as its source does ("snapshot event 1,622": the
    index memory_viz shows), `event` is that index (None when the source has
    none), `op` the trace's own op index, and `site` the line that made the
    allocation there when the source says. `largest_live` holds the few
    largest live allocations as (bytes, where each was made); `by_line`, when
    the source says which line made each allocation (a snapshot's frames),
    the lines holding the most as (bytes, allocations, "file.py:line function")."""

    op: int
    where: str
    event: Optional[int]
    site: Optional[str]
    live_bytes: int
    live_allocations: int
    largest_live: tuple
    by_line: tuple

    @property
    def place(self):
        """`where`, and the line when known: "snapshot event 1,622, train.py:82 step"."""
        return f"{self.where}, {self.site}" if self.site else self.where

    def __str__(self):
        text = f"{self.place}: {format_size(self.live_bytes)} live in {count(self.live_allocations, 'allocation')}"
        if self.by_line:
            text += "; by line: " + ", ".join(f"{format_size(b)} from {site}" for b, _, site in self.by_line)
        elif self.largest_live:
            text += "; largest: " + _sizes(self.largest_live)
        return text


@dataclass(frozen=True)
class FirstOOM(LiveSet):
    """The first allocation a replay could not serve (`request_bytes`), named
    as its source names it, and what was live when it was asked for."""

    request_bytes: int = 0

    def __str__(self):
        text = (f"{self.place}: an allocation of {format_size(self.request_bytes)}, with "
                f"{format_size(self.live_bytes)} live in {count(self.live_allocations, 'allocation')}")
        if self.largest_live:
            text += "; largest live: " + _sizes(self.largest_live)
        return text


def _live_after(trace, end):
    """{id: the op that allocated it} for the allocations live after ops [0, end)."""
    kinds, ids = trace.kinds, trace.ids
    live = {}
    for i in range(end):
        kind = kinds[i]
        if kind == ALLOC:
            live[ids[i]] = i
        elif kind == FREE:
            live.pop(ids[i], None)
    return live


def _live_set(trace, live, name_op, keep, cls=LiveSet, **extra):
    sizes, ids, made = trace.sizes, trace.ids, live.values()
    largest = heapq.nlargest(keep, made, key=sizes.__getitem__)
    by_line = [(b, n, label) for label, b, n in
               group_by_line(((sizes[i], trace.stack_of(i)) for i in made), trace.stacks, keep)] \
        if trace.has_stacks else []
    return cls(
        op=name_op, where=trace.event_name(name_op, site=False), event=trace.event_of(name_op),
        site=trace.site_of(name_op),
        live_bytes=sum(sizes[i] for i in made), live_allocations=len(live),
        largest_live=tuple((sizes[i], trace.event_name(i)) for i in largest), by_line=tuple(by_line), **extra,
    )


def live_at(trace, op, keep=5):
    """The FirstOOM view of allocation op `op` of `trace`: what was live just
    before it ran (one pass over the ops before it)."""
    return _live_set(trace, _live_after(trace, op), op, keep, FirstOOM, request_bytes=trace.sizes[op])


def live_at_peak(trace, keep=5):
    """What was live at the trace's peak of live bytes (just after the
    allocation that reached it), and which lines held it when known."""
    kinds, ids, sizes = trace.kinds, trace.ids, trace.sizes
    live, now, peak, at = {}, 0, -1, 0
    for i in range(len(kinds)):
        kind = kinds[i]
        if kind == ALLOC:
            live[ids[i]] = sizes[i]
            now += sizes[i]
            if now > peak:
                peak, at = now, i
        elif kind == FREE:
            now -= live.pop(ids[i], 0)
    if peak < 0:
        raise ValueError(f"{trace.name}: the trace holds no allocations")
    return _live_set(trace, _live_after(trace, at + 1), at, keep)


@dataclass(repr=False)
class ReplayResult:
    """What a replay found. Sizes are bytes; the repr shows them in GiB/MiB."""

    trace: str
    policy: str
    budget: int                     # 0 = none
    fits: bool
    ooms: int                       # refused allocations, carrying on past each (see first_oom_at)
    first_oom: int                  # the trace's op index, -1 if none
    events: int                     # ops replayed
    peak_requested_bytes: int       # the physical limit (peak live requested)
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_alloc: int
    device_free: int
    alloc_retries: int
    seconds: float
    curve: list = field(default_factory=list)  # (op, requested, allocated, reserved)
    first_oom_at: Optional[FirstOOM] = None    # the first OOM as its source names it
    budget_name: Optional[str] = None          # the preset named, e.g. "T4"
    peak_at: Optional[LiveSet] = None          # what was live at the peak, when the trace has stacks
    # Virtual-memory work, where the policy maps pages (torch-expandable):
    maps: int = 0                   # map calls (PyTorch's num_device_alloc there)
    unmaps: int = 0                 # unmap calls (num_device_free)
    pages_mapped: int = 0
    pages_unmapped: int = 0
    syncs: int = 0                  # stream and device synchronizations the unmaps cost

    @property
    def by_line(self):
        """The lines holding the most live memory as (bytes, allocations,
        "file.py:line function"): at the first OOM when the trace does not
        fit, else at its peak; () when the trace has no stacks."""
        where = self.first_oom_at if self.first_oom_at is not None else self.peak_at
        return where.by_line if where is not None else ()

    @property
    def holders(self):
        """One line for a person: "live at the first OOM: 12.7 GiB, of which
        9.1 GiB from train.py:82 step" (at the peak when it fits); None when
        the trace has no stacks."""
        where = self.first_oom_at if self.first_oom_at is not None else self.peak_at
        return _holders_line(where, "the first OOM" if self.first_oom_at is not None else "the peak")

    @property
    def events_per_second(self):
        return self.events / self.seconds if self.seconds > 0 else float("inf")

    @property
    def reserve_overhead(self):
        """Peak reserved over peak live: peak_reserved / peak_requested - 1,
        what the cache cost above the tensors themselves at the peak."""
        live = self.peak_requested_bytes
        return self.peak_reserved_bytes / live - 1 if live else 0.0

    @property
    def budget_label(self):
        if not self.budget:
            return "no budget"
        if self.budget_name:
            return f"{self.budget_name} ({format_size(self.budget)} usable)"
        return format_size(self.budget)

    def _repr_html_(self):
        from ..render.html import replay_html

        return replay_html(self)

    def plot(self, ax=None, regions=None):
        """Allocated and reserved over the ops, the budget and the first OOM
        (matplotlib; see vramguard.plot). Returns the axes."""
        from ..render.plot import plot_replay

        return plot_replay(self, ax=ax, regions=regions)

    def __repr__(self):
        budget = f"budget {self.budget_label}" if self.budget else "no budget"
        text = f"ReplayResult({self.trace!r}, policy={self.policy!r}, {budget}: "
        if self.fits:
            text += (f"FITS; peak live {format_size(self.peak_requested_bytes)}, peak reserved "
                     f"{format_size(self.peak_reserved_bytes)} ({self.reserve_overhead:+.1%} over live)")
        else:
            text += f"DOES NOT FIT; peak live {format_size(self.peak_requested_bytes)}"
            if self.first_oom_at is not None:
                oom = self.first_oom_at
                text += (f", first OOM at {oom.place} ({format_size(oom.request_bytes)} asked, "
                         f"{format_size(oom.live_bytes)} live)")
                if self.holders:
                    text += f"; {self.holders}"
        return text + f", {count(self.events, 'op')})"


def _holders_line(live, when):
    if live is None or not live.by_line:
        return None
    size, _, label = live.by_line[0]
    return (f"live at {when}: {format_size(live.live_bytes)}, of which {format_size(size)} "
            f"from {label}")


def as_trace(trace):
    return trace if isinstance(trace, Trace) else load_trace(trace)


def _budget_bytes(budget):
    return 0 if budget is None else parse_budget(budget)


def replay(trace, budget=None, policy="vramguard", samples=1000):
    """Drive `trace` (a Trace or a path) through a heap on a simulated device
    with `budget` (bytes, "15GiB", a GPU preset such as "T4", or None) under
    `policy` ("vramguard", "torch", or "torch-expandable": PyTorch with
    expandable_segments:True, emulated). An allocation that does not fit is an
    OOM; the replay goes on, as a training script that caught the error
    would, and `first_oom_at` says where the first one was (in the source's
    own event numbers) and what was live then."""
    trace = as_trace(trace)
    preset = find_preset(budget)
    limit = _budget_bytes(budget)
    # A card's own total, where the budget names one: expandable segments
    # size their address ranges by it, not by the part the tensors may use.
    outside = max(0, preset.total_bytes - limit) if preset and limit else 0
    result = _run(trace, limit, policy, samples, outside)
    result.budget_name = preset.name if preset else None
    if result.first_oom >= 0:
        result.first_oom_at = live_at(trace, result.first_oom)
    if trace.has_stacks:
        result.peak_at = live_at_peak(trace)
    return result


def _run(trace, limit, policy, samples, outside=0):
    """The replay itself, `limit` bytes already checked (0 for none), on a
    device that holds `outside` bytes beside the allocator's (its total:
    limit + outside)."""
    check_policy_name(policy)
    if policy == "torch-expandable":  # an emulation, not a heap: torch_expandable.c
        # PyTorch reserves each segment's address range as 9/8 of the
        # device's total (the context's share included): a range sized by
        # the limit alone fills sooner, and the replay then makes a segment
        # that the run on that device never made.
        total = {"device_total": limit + outside} if limit and outside else {}
        r = expandable_replay(*trace.columns(), trace.nids, budget=limit, samples=samples, **total)
    else:
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
        maps=r.get("map_calls", 0),
        unmaps=r.get("unmap_calls", 0),
        pages_mapped=r.get("map_pages", 0),
        pages_unmapped=r.get("unmap_pages", 0),
        syncs=r.get("stream_syncs", 0) + r.get("device_syncs", 0),
    )


def _fits(trace, policy, budget, outside=0):
    # Every allocation takes a segment of at least 2 MiB: a smaller budget
    # fits nothing (and a heap refuses one, as a person's budget is refused).
    return budget >= SEGMENT_GRANULE and _run(trace, budget, policy, 0, outside).fits


def _granularity(granularity):
    if isinstance(granularity, bool) or not isinstance(granularity, int):
        raise TypeError(f"granularity must be an int of bytes, not {type(granularity).__name__}")
    if not 1 <= granularity <= UNLIMITED:
        raise ValueError(f"granularity must be from 1 to {UNLIMITED} bytes, got {granularity}")
    return granularity


def min_budget(trace, policy="vramguard", granularity=SEGMENT_GRANULE, outside=0):
    """The smallest budget, a multiple of `granularity` (an int of bytes),
    at which `trace` replays under `policy` without an OOM: a bisection
    between the physical limit and the peak reserved with no budget.
    `outside`: the bytes the device holds beside the allocator's (the CUDA
    context), so that each budget tried is a device of budget + outside."""
    check_policy_name(policy)
    trace = as_trace(trace)
    g = _granularity(granularity)
    if isinstance(outside, bool) or not isinstance(outside, int) or not 0 <= outside <= UNLIMITED:
        raise ValueError(f"outside must be an int of bytes from 0 to {UNLIMITED}, got {outside!r}")
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
    if lo and _fits(trace, policy, lo * g, outside):
        return lo * g
    start = max(-(-_run(trace, 0, policy, 0).peak_reserved_bytes // g), lo + 1)
    # a budget equal to the free-running peak nearly always fits: doubled at most 7 times
    _, hi = double(lambda units: not _fits(trace, policy, units * g, outside), start, start << 7, cap=False)
    if hi is None:
        raise RuntimeError(f"{trace.name}: no budget up to {(start << 8) * g} bytes fits under policy {policy!r}")
    _, hi = bisect(lambda units: _fits(trace, policy, units * g, outside), lo, hi)  # lo does not fit (or is 0), hi fits
    return hi * g
