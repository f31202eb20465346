"""vramguard.plot(): memory over time, as a matplotlib figure, of a
ReplayResult, a trace (replayed first) or the last recording. The drawing
is render/plot.py's.

    vramguard.plot("memory.pickle", budget="T4")   # a trace, replayed
    result.plot()                                  # a ReplayResult
    vramguard.plot()                               # the last recording
"""
import os

from ..render.plot import refuse_empty, plot_replay
from ..trace import record as _record
from ..trace.format import Trace
from ..trace.replay import ReplayResult, as_trace, live_at_peak, replay

__all__ = ["plot"]


def _last_recording():
    trace = getattr(_record, "last_trace", lambda: None)()
    if trace is None:
        raise ValueError("nothing to plot: give a trace or a ReplayResult, or record first "
                         "(with vramguard.record(): ...)")
    return trace


def plot(source=None, budget=None, policy="vramguard", ax=None, regions=None):
    """Plot memory over time. `source`: a ReplayResult, a Trace or a path
    to one (replayed under `budget` and `policy`), or None for the last
    recording made with vramguard.record(). Returns the axes."""
    if isinstance(source, ReplayResult):
        return plot_replay(source, ax=ax, regions=regions)
    if source is not None and not isinstance(source, (Trace, str, os.PathLike)):
        raise TypeError(f"plot() takes a ReplayResult, a Trace, a path to a trace or None (the last "
                        f"recording), not {type(source).__name__}")
    trace = _last_recording() if source is None else as_trace(source)
    result = replay(trace, budget=budget, policy=policy)
    refuse_empty(result)
    live = result.first_oom_at if result.first_oom_at is not None else live_at_peak(trace)
    return plot_replay(result, ax=ax, trace=trace, regions=regions, live=live)
