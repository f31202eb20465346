"""vramguard.summary(): the memory summary of a device of the installed
allocator, ready to print or to show: the table (render/summary.py), the
line saying which allocator runs, and who holds the memory (the stacks a
recording kept: trace/stacks.py, trace/record.py, trace/replay.py).
"""
from ..render.html import Report, summary_html
from ..render.summary import SEARCH_OOMS, summary_line, format_summary, is_empty, with_device_room
from ..torch import search_ooms
from ..torch.device_heaps import device_heap, device_index, require_installed
from ..torch.install import stats
from ..trace.record import last_with_stacks
from ..trace.replay import live_at_peak
from ..trace.stacks import heap_by_line
from .._units import format_size

__all__ = ["summary", "holders_line"]


def summary(device=None, verbose=False):
    """The memory summary table of a device, ready to print or to show; one
    line for a device that holds nothing. verbose=True adds every policy
    counter (as stats() has them) and the full table even when empty."""
    require_installed()
    index = device_index(device)
    figures = stats(index)
    heap = with_device_room(figures, device_heap(index))
    figures[SEARCH_OOMS] = search_ooms.count(index)
    title = f"vramguard memory summary, device {index}"
    holders = holders_line(heap, ("device", index))
    one_line = not verbose and is_empty(figures)
    text = _with_allocator_line(format_summary(figures, title=title, verbose=verbose), figures["allocator"])
    text += f"\n{holders}" if holders else ""
    return Report(text, html=None if one_line else summary_html(figures, title, text))


def _with_allocator_line(text, allocator):
    """The summary's last line inside the table: which allocator runs (at
    the end of the line when the summary is one line)."""
    if "\n" not in text:
        return f"{text}; allocator: {allocator}"
    lines = text.splitlines()
    return "\n".join(lines[:-1] + [summary_line(f"allocator: {allocator}"), lines[-1]])


def holders_line(heap, key=None):
    """The summary's line on who holds the memory, or None: at the peak of
    the heap's last recording with stacks ("live at the peak: 12.7 GiB, of
    which 9.1 GiB from train.py:82 step"), or the blocks live now that a
    recording with stacks made. `key`: the heap's record.heap_key."""
    trace = last_with_stacks.get(id(heap) if key is None else key)
    if trace is not None and trace.has_stacks:
        peak = live_at_peak(trace, keep=1)
        if peak.by_line:
            size, _, label = peak.by_line[0]
            return (f"live at the peak of the last recording: {format_size(peak.live_bytes)}, "
                    f"of which {format_size(size)} from {label}")
    lines = heap_by_line(heap, top=1)
    if not lines:
        return None
    live = heap.stats()["requested_bytes.all.current"]
    label, size, _ = lines[0]
    return f"live now: {format_size(live)}, of which {format_size(size)} from {label}"
