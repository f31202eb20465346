"""The replay report: would a trace fit under a budget, and how vramguard's
policy compares with PyTorch's on it (`python -m vramguard replay`)."""
from ._core import format_size
from ._presets import PRESETS
from ._replay import min_budget, replay

POLICIES = ("vramguard", "torch")
#: Live allocations a report lists at the first OOM.
LARGEST_SHOWN = 3


def replay_report(trace, budget=None, policy="vramguard"):
    """A dict: the replay of `trace` under `policy` and `budget`, plus each
    policy's peak reserved (free-running) and minimum budget."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: use 'vramguard' or 'torch'")
    main = replay(trace, budget, policy)
    side = {}
    for name in POLICIES:
        free = main if name == policy and budget is None else replay(trace, None, name, samples=0)
        side[name] = {"peak_reserved_bytes": free.peak_reserved_bytes, "min_budget_bytes": min_budget(trace, name)}
    oom = main.first_oom_at
    return {
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
        "source_events": trace.meta.get("source_events"),
        "event_label": trace.event_label,
        "events_per_second": main.events_per_second,
        "peak_requested_bytes": main.peak_requested_bytes,
        "peak_reserved_bytes": main.peak_reserved_bytes,
        "min_budget_bytes": side[policy]["min_budget_bytes"],
        "vramguard_peak_reserved_bytes": side["vramguard"]["peak_reserved_bytes"],
        "vramguard_min_budget_bytes": side["vramguard"]["min_budget_bytes"],
        "torch_peak_reserved_bytes": side["torch"]["peak_reserved_bytes"],
        "torch_min_budget_bytes": side["torch"]["min_budget_bytes"],
        "recorded_peak_reserved_bytes": trace.recorded_peak_reserved,
        "recorded_by": "vramguard" if trace.meta.get("source") == "vramguard" else "native",
        "device_alloc": main.device_alloc,
        "device_free": main.device_free,
    }


def _allocations(n):
    return "1 allocation" if n == 1 else f"{n:,} allocations"


def _over(value, live):
    return f"{value / live - 1:.1%}" if live else "-"


def _header(r):
    ops = f"{r['events']:,} ops"
    if r["source_events"]:
        ops += f" from {r['source_events']:,} {r['event_label']}s"
    return f"Trace {r['trace']}: {ops}, replayed at {r['events_per_second']:,.0f} ops/s"


def _verdict(r):
    if not r["budget_bytes"]:
        return []
    verdict = "FITS" if r["fits"] else "DOES NOT FIT"
    lines = [f"Under a {r['budget_label']} budget with the {r['policy']} policy: {verdict}"]
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


def _table(r):
    live = r["peak_requested_bytes"]
    lines = [f"Physical limit (peak live tensors): {format_size(live)}",
             f"{'':32}{'vramguard':>14}{'torch policy':>16}"]
    for label, key in (("peak reserved, no budget", "peak_reserved_bytes"), ("minimum budget", "min_budget_bytes")):
        v, t = r[f"vramguard_{key}"], r[f"torch_{key}"]
        lines.append(f"  {label:30}{format_size(v):>14}{format_size(t):>16}")
    # Both rows are the cache's cost over the tensors themselves, at the
    # minimum budget and free-running: not the summary's free-cache pieces.
    for label, key in (("minimum budget over the limit", "min_budget_bytes"),
                       ("peak reserved over peak live", "peak_reserved_bytes")):
        v, t = r[f"vramguard_{key}"], r[f"torch_{key}"]
        lines.append(f"  {label:30}{_over(v, live):>14}{_over(t, live):>16}")
    return lines


def smallest_preset(nbytes):
    """The GPU preset with the least usable memory that holds `nbytes`, or None."""
    fitting = [p for p in PRESETS.values() if p.usable_bytes >= nbytes]
    return min(fitting, key=lambda p: p.usable_bytes) if fitting else None


def so_what(r):
    """One line: what the numbers mean for the person who asked."""
    live, budget = r["peak_requested_bytes"], r["budget_bytes"]
    need = r["min_budget_bytes"]
    if budget and not r["fits"]:
        if live > budget:
            return (f"So what: the tensors alone need {format_size(live)} at the peak, more than the budget: "
                    "no allocator fits it; make less live at once (a smaller batch, lower precision, "
                    "activation checkpointing).")
        other = "torch" if r["policy"] == "vramguard" else "vramguard"
        return (f"So what: the tensors fit ({format_size(live)} at the peak) but the cache's overhead does not: "
                f"the {r['policy']} policy needs a budget of {format_size(need)}, "
                f"the {other} policy {format_size(r[other + '_min_budget_bytes'])}.")
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
    if r["recorded_peak_reserved_bytes"]:
        who = "by vramguard" if r["recorded_by"] == "vramguard" else "by the native allocator"
        lines.append(f"Peak reserved when recorded ({who}): {format_size(r['recorded_peak_reserved_bytes'])}")
    lines.append(so_what(r))
    return "\n".join(lines)
