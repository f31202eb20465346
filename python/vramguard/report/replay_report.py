"""The replay report: would a trace fit under a budget, and what each policy
(vramguard's arena and segments, PyTorch's default and expandable segments)
needs on it, side by side (`python -m vramguard replay`)."""
from functools import lru_cache

from .._core import Heap, format_size
from .._presets import PRESETS
from ..trace.replay import UNLIMITED, check_policy_name, min_budget, replay
from ..trace.format import Trace
from .._units import format_size_column
from ..render.words import a, count

#: The policies a report sets side by side, in the order shown.
COMPARED = ("arena", "segments", "torch", "torch-expandable")
#: Names a replay also takes: "vramguard" is the policy vramguard recommends.
POLICIES = ("vramguard",) + COMPARED
#: Live allocations a report lists at the first OOM.
LARGEST_SHOWN = 3
#: What one map or unmap (or cudaMalloc or cudaFree) costs the program, for
#: the report's estimate: a driver call, tens of microseconds.
DEVICE_CALL_SECONDS = 20e-6


# ------------------------------------------------------------------ policies


def _probe_trace():
    t = Trace("probe")
    t.free(t.alloc(1 << 20))
    return t


@lru_cache(maxsize=None)
def _engine(policy):
    """(policy, None) when this build replays `policy`, else (None, why not)."""
    try:
        replay(_probe_trace(), None, policy, samples=0)
    except (ValueError, NotImplementedError) as exc:
        return None, str(exc).strip().splitlines()[0]
    return policy, None


def available_policies():
    """The policies of COMPARED this build replays, in order: each one
    vramguard.replay(trace, "T4", policy=p) and min_budget() take."""
    return tuple(p for p in COMPARED if _engine(p)[0] is not None)


def unavailable_policies():
    """{policy: why this build cannot replay it} for the rest of COMPARED."""
    return {p: _engine(p)[1] for p in COMPARED if _engine(p)[0] is None}


def check_policy(policy):
    """`policy` when this build replays it; a ValueError that says which
    policies exist when it is unknown or not in this build."""
    if not isinstance(policy, str):
        check_policy_name(policy)
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
    engine, why = _engine(policy)
    if engine is None:
        raise ValueError(f"policy {policy!r} is not available in this build of vramguard ({why}); "
                         f"available: {', '.join(('vramguard',) + available_policies())}")
    return engine


#: The policies that map physical pages into a virtual range: their device
#: calls are maps and unmaps; the others' are cudaMalloc and cudaFree.
PAGED = ("arena", "torch-expandable")
#: Policies replayed by an emulation of their own rather than a Heap.
_NOT_A_HEAP = ("torch-expandable",)


def device_calls(trace, engine, budget):
    """(maps, unmaps) when `trace` is replayed under `engine` and `budget`:
    with the paged policies the page maps and unmaps, with the segment
    policies the cudaMalloc and cudaFree calls that take their place. A
    heap's own counters say, where the replay result does not carry them."""
    if engine in _NOT_A_HEAP:
        r = replay(trace, budget, engine, samples=0)
        return r.maps, r.unmaps
    heap = Heap(UNLIMITED, budget=budget, policy=engine)
    heap.replay(*trace.columns(), trace.nids, 0)
    stats = heap.stats()
    if engine in PAGED:
        return stats["num_maps"], stats["num_unmaps"]
    return stats["num_device_alloc"], stats["num_device_free"]


def key(policy):
    """The prefix of a policy's keys in the report: torch-expandable -> torch_expandable."""
    return policy.replace("-", "_")


def _policy_figures(trace, engine, free_run=None):
    """Peak reserved with no budget, the minimum budget, and the device calls
    of a replay at that budget."""
    free_run = free_run or replay(trace, None, engine, samples=0)
    need = min_budget(trace, engine)
    maps, unmaps = device_calls(trace, engine, need) if need else (0, 0)
    return {"peak_reserved_bytes": free_run.peak_reserved_bytes, "min_budget_bytes": need,
            "maps_at_min_budget": maps, "unmaps_at_min_budget": unmaps}


def compare_policies(trace, reuse=None):
    """{policy: figures or None} for POLICIES ("vramguard" too), each engine
    replayed once; `reuse` = (engine, free-running ReplayResult) to skip one."""
    by_engine, out = {}, {}
    for policy in POLICIES:
        engine = _engine(policy)[0]
        if engine is not None and engine not in by_engine:
            free_run = reuse[1] if reuse and reuse[0] == engine else None
            by_engine[engine] = _policy_figures(trace, engine, free_run)
        out[policy] = by_engine.get(engine)
    return out


# ------------------------------------------------------------------ the report


def replay_report(trace, budget=None, policy="vramguard"):
    """A dict: the replay of `trace` under `policy` and `budget`, and for
    every policy this build has, its peak reserved (free-running), its
    minimum budget and the device calls at that budget; a policy it lacks
    has None there and its reason in `policies_unavailable`."""
    engine = check_policy(policy)
    main = replay(trace, budget, engine)
    side = compare_policies(trace, (engine, main) if budget is None else None)
    oom = main.first_oom_at
    report = {
        "trace": trace.name,
        "policy": policy,
        "budget_bytes": main.budget or None,
        "budget_label": main.budget_label,
        "fits": main.fits,
        # Refusals counted while the replay carries on past each OOM: the
        # first is the one that matters (first_oom_*), the rest follow from it.
        "ooms": main.ooms,
        "first_oom_op": oom.op if oom else None,
        "first_oom_event": oom.event if oom else None,
        "first_oom_where": oom.where if oom else None,
        "first_oom_site": oom.site if oom else None,
        "first_oom_request_bytes": oom.request_bytes if oom else None,
        "live_at_first_oom_bytes": oom.live_bytes if oom else None,
        "live_allocations_at_first_oom": oom.live_allocations if oom else None,
        "largest_live_at_first_oom": [list(x) for x in oom.largest_live] if oom else None,
        "live_by_line_at_first_oom": [list(x) for x in oom.by_line] if oom else None,
        "events": main.events,
        "allocations": trace.counts()["alloc"],
        "source_events": trace.meta.get("source_events"),
        "event_label": trace.event_label,
        "events_per_second": main.events_per_second,
        "peak_requested_bytes": main.peak_requested_bytes,
        "peak_reserved_bytes": main.peak_reserved_bytes,
        "min_budget_bytes": side[policy]["min_budget_bytes"],
        "policies": list(COMPARED),
        "policies_unavailable": unavailable_policies(),
        "recorded_peak_reserved_bytes": trace.recorded_peak_reserved,
        "recorded_by": "vramguard" if trace.meta.get("source") == "vramguard" else "native",
        "recorded_policy": _recorded_policy(trace),
        "recorded_release_retries": trace.meta.get("native_release_retries"),
        "device_alloc": main.device_alloc,
        "device_free": main.device_free,
    }
    for name, figures in side.items():
        for field in ("peak_reserved_bytes", "min_budget_bytes", "maps_at_min_budget", "unmaps_at_min_budget"):
            report[f"{key(name)}_{field}"] = figures[field] if figures else None
    return report


def _recorded_policy(trace):
    """The emulation of the allocator that recorded a PyTorch snapshot
    (default or expandable segments, from its allocator settings), whose
    replay should give back the recorded peak; None for other sources."""
    if trace.meta.get("source") != "pytorch-snapshot":
        return None
    settings = trace.meta.get("allocator_settings") or {}
    return "torch-expandable" if settings.get("expandable_segments") is True else "torch"


def _allocations(n):
    return count(n, "allocation")


def _over(value, live):
    return f"{value / live - 1:+.1%}" if live else "-"


def _header(r):
    ops = count(r["events"], "op")
    if r["source_events"]:
        ops += f" from {count(r['source_events'], r['event_label'])}"
    return f"Trace {r['trace']}: {ops}, replayed at {r['events_per_second']:,.0f} ops/s"


def _verdict(r):
    if not r["budget_bytes"]:
        return []
    verdict = "FITS" if r["fits"] else "DOES NOT FIT"
    lines = [f"Under {a(r['budget_label'] + ' budget')} with the {r['policy']} policy: {verdict}"]
    if not r["fits"]:
        lines.append(
            f"  first OOM at {r['first_oom_where']}{', ' + r['first_oom_site'] if r['first_oom_site'] else ''}: "
            f"{format_size(r['first_oom_request_bytes'])} asked, "
            f"{format_size(r['live_at_first_oom_bytes'])} live then in {_allocations(r['live_allocations_at_first_oom'])}"
            + (", most from:" if r["live_by_line_at_first_oom"] else "; the largest:")
        )
        for size, count, site in r["live_by_line_at_first_oom"][:LARGEST_SHOWN]:
            lines.append(f"    {format_size(size):>11} in {_allocations(count)}  {site}")
        if not r["live_by_line_at_first_oom"]:
            for size, where in r["largest_live_at_first_oom"][:LARGEST_SHOWN]:
                lines.append(f"    {format_size(size):>11}  {where}")
    return lines


def calls_per_thousand(r, policy):
    """Maps plus unmaps at `policy`'s minimum budget per 1,000 allocations
    of the trace, or None when the policy was not replayed."""
    maps = r.get(f"{key(policy)}_maps_at_min_budget")
    if maps is None or not r["allocations"]:
        return None
    return (maps + r[f"{key(policy)}_unmaps_at_min_budget"]) * 1000 / r["allocations"]


LABEL_WIDTH, COLUMN = 34, 12


def _maybe(value, form):
    return "-" if value is None else form.format(value)


def _width(policy):
    return max(COLUMN, len(policy) + 2)


def _row(label, cells, shown):
    return f"  {label:{LABEL_WIDTH - 2}}" + "".join(f"{c:>{_width(p)}}" for c, p in zip(cells, shown))


def _table(r):
    live, shown = r["peak_requested_bytes"], r["policies"]
    figures = {p: {f: r[f"{key(p)}_{f}"] for f in ("peak_reserved_bytes", "min_budget_bytes")} for p in shown}

    def cells(show):
        return [show(p) if figures[p]["min_budget_bytes"] is not None else "n/a" for p in shown]

    lines = [f"Physical limit (peak live tensors): {format_size(live)}",
             f"{'':{LABEL_WIDTH}}" + "".join(f"{p:>{_width(p)}}" for p in shown)]
    for label, field in (("peak reserved, no budget", "peak_reserved_bytes"), ("minimum budget", "min_budget_bytes")):
        lines.append(_row(label, cells(lambda p: format_size_column(figures[p][field])), shown))
    # Both rows are the cache's cost over the tensors themselves, at the
    # minimum budget and free-running: not the summary's free-cache pieces.
    for label, field in (("minimum budget over the limit", "min_budget_bytes"),
                         ("peak reserved over peak live", "peak_reserved_bytes")):
        lines.append(_row(label, cells(lambda p: _over(figures[p][field], live)), shown))
    per_k = {p: calls_per_thousand(r, p) for p in shown}
    lines.append(_row("device calls per 1,000 allocs", cells(lambda p: _maybe(per_k[p], "{:,.1f}")), shown))
    lines.append(_row(f"  their cost at {DEVICE_CALL_SECONDS * 1e6:.0f} us each",
                      cells(lambda p: _maybe(per_k[p] and per_k[p] * DEVICE_CALL_SECONDS * 1e3, "{:,.2f} ms")),
                      shown))
    lines.append("  (device calls at the minimum budget: maps + unmaps for arena and torch-expandable,")
    lines.append("   cudaMalloc + cudaFree for segments and torch)")
    for p, why in r["policies_unavailable"].items():
        lines.append(f"  {p}: not available in this build ({why})")
    return lines


def smallest_preset(nbytes):
    """The GPU preset with the least usable memory that holds `nbytes`, or None."""
    fitting = [p for p in PRESETS.values() if p.usable_bytes >= nbytes]
    return min(fitting, key=lambda p: p.usable_bytes) if fitting else None


def _others(r):
    """The other compared policies' minimum budgets, as a phrase."""
    return ", ".join(f"{p} {format_size(r[key(p) + '_min_budget_bytes'])}" for p in r["policies"]
                     if p != r["policy"] and r[key(p) + "_min_budget_bytes"] is not None)


def so_what(r):
    """One line: what the numbers mean for the person who asked."""
    live, budget = r["peak_requested_bytes"], r["budget_bytes"]
    need = r["min_budget_bytes"]
    if budget and not r["fits"]:
        if live > budget:
            return (f"So what: the tensors alone need {format_size(live)} at the peak, more than the budget: "
                    "no allocator fits it; make less live at once (a smaller batch, lower precision, "
                    "activation checkpointing).")
        return (f"So what: the tensors fit ({format_size(live)} at the peak) but the cache's overhead does not: "
                f"the {r['policy']} policy needs a budget of {format_size(need)}; the others: {_others(r)}.")
    if budget:
        return (f"So what: it fits; at its peak it reserved {format_size(r['peak_reserved_bytes'])} "
                f"of {format_size(budget)}, and needs at least {format_size(need)}.")
    preset = smallest_preset(need)
    where = (f"the smallest GPU preset it fits is {preset.name} ({format_size(preset.usable_bytes)} usable)"
             if preset else "no GPU preset is that large")
    return f"So what: it needs a budget of {format_size(need)} under the {r['policy']} policy; {where}."


def format_replay_report(r):
    """The report as text, a few lines a person reads in a terminal."""
    lines = [_header(r)] + _verdict(r) + _table(r)
    recorded = r["recorded_peak_reserved_bytes"]
    if recorded:
        who = "by vramguard" if r["recorded_by"] == "vramguard" else "by the native allocator"
        line = f"Peak reserved when recorded ({who}): {format_size(recorded)}"
        same, under = r["recorded_policy"], ""
        replayed = same and r.get(f"{key(same)}_peak_reserved_bytes")
        if same and same == r["policy"] and r["budget_bytes"] and r["fits"]:  # else it went past OOMs
            replayed, under = r["peak_reserved_bytes"], " under this budget"
        if replayed:
            line += (f"; the {same} policy replays it{under} to {format_size(replayed)} "
                     f"({replayed / recorded - 1:+.1%})")
        lines.append(line)
        retries = r["recorded_release_retries"]
        if retries:
            lines.append(f"  (the recording device was full {'once' if retries == 1 else f'{retries:,} times'}: "
                         "PyTorch released its cache and retried; a replay does so only under a budget)")
    lines.append(so_what(r))
    return "\n".join(lines)
