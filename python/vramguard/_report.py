"""The replay report: would a trace fit under a budget, and how vramguard's
policy compares with PyTorch's on it (`python -m vramguard replay`)."""
from ._core import format_size
from ._replay import min_budget, replay

POLICIES = ("vramguard", "torch")


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
    live = main.peak_requested_bytes
    return {
        "trace": trace.name,
        "policy": policy,
        "budget_bytes": main.budget or None,
        "fits": main.fits,
        "ooms": main.ooms,
        "first_oom": main.first_oom if main.first_oom >= 0 else None,
        "events": main.events,
        "events_per_second": main.events_per_second,
        "peak_requested_bytes": live,
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


def _frag(live, reserved):
    return f"{1 - live / reserved:.1%}" if reserved else "-"


def format_replay_report(r):
    """The report as text, a few lines a person reads in a terminal."""
    live = r["peak_requested_bytes"]
    lines = [f"Trace {r['trace']}: {r['events']:,} events, replayed at {r['events_per_second']:,.0f} events/s"]
    if r["budget_bytes"]:
        verdict = "FITS" if r["fits"] else "DOES NOT FIT"
        lines.append(f"Under a {format_size(r['budget_bytes'])} budget with the {r['policy']} policy: {verdict}")
        if not r["fits"]:
            lines.append(f"  first OOM at event {r['first_oom']:,}; {r['ooms']} allocations failed")
    lines.append(f"Physical limit (peak live tensors): {format_size(live)}")
    lines.append(f"{'':32}{'vramguard':>14}{'torch policy':>16}")
    for label, key in (("peak reserved, no budget", "peak_reserved_bytes"), ("minimum budget", "min_budget_bytes")):
        v, t = r[f"vramguard_{key}"], r[f"torch_{key}"]
        lines.append(f"  {label:30}{format_size(v):>14}{format_size(t):>16}")
    v, t = r["vramguard_min_budget_bytes"], r["torch_min_budget_bytes"]
    lines.append(f"  {'minimum budget over the limit':30}{v / live - 1:>14.1%}{t / live - 1:>16.1%}")
    lines.append(
        f"  {'fragmentation (1 - live/peak)':30}{_frag(live, r['vramguard_peak_reserved_bytes']):>14}"
        f"{_frag(live, r['torch_peak_reserved_bytes']):>16}"
    )
    if r["recorded_peak_reserved_bytes"]:
        who = "by vramguard" if r["recorded_by"] == "vramguard" else "by the native allocator"
        lines.append(f"Peak reserved when recorded ({who}): {format_size(r['recorded_peak_reserved_bytes'])}")
    return "\n".join(lines)
