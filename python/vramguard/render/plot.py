"""Memory over time, as a matplotlib figure (an optional extra:
`pip install vramguard[plot]`).

    vramguard.plot("memory.pickle", budget="T4")   # a trace, replayed
    result.plot()                                  # a ReplayResult
    vramguard.plot()                               # the last recording

Every curve comes from a replay: its samples are maxima over windows of
ops, so a peak shown is a peak that happened, never one averaged away.
Here: the drawing of a replay (plot_replay, ReplayResult.plot()); what
vramguard.plot() replays first is report/plot.py."""

from .._core import format_size

__all__ = ["plot_replay"]

EMPTY_CACHE = 3  # a trace op kind (replay.h: VG_OP_EMPTY_CACHE)
TOP_LINES = 3    # lines named at the peak


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "vramguard.plot needs matplotlib: pip install matplotlib (or vramguard[plot])"
        ) from None
    return plt


def _axes(ax):
    if ax is not None:
        return ax
    _, ax = _pyplot().subplots(figsize=(10, 4))
    return ax


def _bytes_axis(ax, top):
    """Ticks at round binary sizes (0, 512 MiB, 1 GiB, ...), about six of
    them, labelled in the unit that suits each."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    step = 1 << max(int(max(top, 1) / 6).bit_length(), 0)
    ax.yaxis.set_major_locator(MultipleLocator(step))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: format_size(int(v)) if v >= 0 else ""))
    ax.set_ylim(0, top * 1.08 if top else 1)


def _curve_columns(curve):
    ops = [point[0] for point in curve]
    return ops, [p[1] for p in curve], [p[2] for p in curve], [p[3] for p in curve]


def _mark_empty_caches(ax, trace):
    """A thin vertical line at every empty_cache op of the trace."""
    if trace is None:
        return 0
    ops = [i for i, kind in enumerate(trace.kinds) if kind == EMPTY_CACHE]
    for i, op in enumerate(ops):
        ax.axvline(op, color="tab:green", lw=0.8, ls=":", label="empty_cache" if i == 0 else None)
    return len(ops)


def _shade_regions(ax, regions):
    """`regions`: (name, first op, last op) triples, shaded and named."""
    for i, (name, start, end) in enumerate(regions or ()):
        ax.axvspan(start, end, color=f"C{4 + i % 5}", alpha=0.12)
        ax.text((start + end) / 2, 0.98, name, transform=ax.get_xaxis_transform(),
                ha="center", va="top", fontsize=8)


def _name_top_lines(ax, live, y):
    """Label the peak (or the first OOM) with the lines that held the most."""
    lines = getattr(live, "by_line", None) or ()
    if not lines:
        return
    text = "\n".join(f"{format_size(b)} {site}" for b, _n, site in lines[:TOP_LINES])
    ax.annotate(text, xy=(live.op, y), xytext=(10, -10), textcoords="offset points",
                fontsize=8, va="top", bbox=dict(boxstyle="round", fc="white", alpha=0.8))


def plot_replay(result, ax=None, trace=None, regions=None, live=None):
    """Draw a ReplayResult: allocated and reserved over the trace's ops,
    the budget line, the first OOM, empty_cache calls (when the trace is
    given), `regions` shaded, and the lines holding the most at `live` (a
    LiveSet: the peak's or the first OOM's). Returns the axes."""
    if not result.curve:
        refuse_empty(result)
        raise ValueError("this replay kept no curve: replay with samples > 0")
    ax = _axes(ax)
    ops, requested, allocated, reserved = _curve_columns(result.curve)
    ax.plot(ops, reserved, color="tab:orange", lw=1.2, label=f"reserved ({result.policy})")
    ax.plot(ops, allocated, color="tab:blue", lw=1.2, label="allocated")
    ax.fill_between(ops, requested, color="tab:blue", alpha=0.15, label="live (requested)")
    top = max(max(reserved), result.budget)
    if result.budget:
        ax.axhline(result.budget, color="tab:red", lw=1, ls="--", label=f"budget {result.budget_label}")
    if result.first_oom >= 0:
        ax.axvline(result.first_oom, color="tab:red", lw=1.5, label="first OOM")
    _mark_empty_caches(ax, trace)
    _shade_regions(ax, regions)
    if live is not None:
        _name_top_lines(ax, live, live.live_bytes)
    _bytes_axis(ax, top)
    ax.set_xlabel("op")
    ax.set_title(f"{result.trace}: {'fits' if result.fits else 'does not fit'}"
                 f" ({result.budget_label}, policy {result.policy})")
    ax.legend(loc="upper left", fontsize=8)
    return ax


def refuse_empty(result):
    if result.events == 0:  # samples would not help: there is nothing over time
        raise ValueError(f"nothing to plot: the trace {result.trace!r} is empty (no allocations or frees)")
