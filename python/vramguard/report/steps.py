"""Steps: the memory live at each training step's end, and the leak those
boundaries show.

    vramguard.step()                      # the end of a training step
    vramguard.leak_check()                # None, or the leak the steps show

step() records each boundary on the device's TrackedHeap (tracked_heaps.py)
and judges it by the leak rule (leak_rule.py); it warns (LeakWarning) when
a leak begins, once until it stops. With stacks recorded, a Leak also says
which lines' live memory grew between boundaries.
"""
import warnings

from . import oom_notes as _oom_notes
from .leak import Leak
from .leak_rule import LEAK_WINDOW, judge_leak, window_grows
from .tracked_heaps import tracked_device_heap, tracked_heap

__all__ = ["LeakWarning", "leak_check", "step", "step_figures"]

#: Lines compared when a leak is seen with stacks recorded.
_BASELINE_LINES = 50
#: Lines of a Leak that grew the most.
_LINES_SHOWN = 5


class LeakWarning(UserWarning):
    """step() sees memory live at step boundaries keep growing."""


def step(device=None):
    """Marks the end of a training step: records the memory live now and
    this step's peak, and warns (LeakWarning) when the boundaries begin to
    show a leak. Returns None."""
    target = tracked_heap(device)
    with target.lock:
        live = target.fold()
        target.boundaries.append((live, target.step_peak))
        target.step_peak = live
        target.steps += 1
        leak = _leak_locked(target)
        began = leak is not None and not target.leaking
        target.leaking = leak is not None
        if not target.leaking:
            target.baseline = None
    lines = _lines_now(target.device, _BASELINE_LINES) if target.device is not None else None
    if lines is not None:
        with target.lock:
            target.line_history.append((target.steps, lines))
    if began:
        if target.device is not None:
            with target.lock:
                target.baseline = (target.steps, lines) if lines is not None else None
        warnings.warn(leak.headline() + " See vramguard.leak_check().", LeakWarning, stacklevel=2)


def leak_check(device=None):
    """The leak the step boundaries show now (a Leak), or None."""
    target = tracked_heap(device)
    with target.lock:
        leak = _leak_locked(target)
    return _with_lines(target, leak) if leak is not None else None


def step_figures(device):
    """For the OOM report: (steps, live at the last boundary, the last
    completed step's peak, peak of the step under way, Leak or None); None
    when step() was never called on the device."""
    target = tracked_device_heap(device)
    if target is None:
        return None
    with target.lock:
        target.fold()
        if not target.boundaries:
            return None
        live, peak = target.boundaries[-1]
        figures = (target.steps, live, peak, target.step_peak, _leak_locked(target))
    leak = figures[4]
    if leak is not None:
        leak = _with_lines(target, leak)
    return figures[:4] + (leak,)


# ------------------------------------------------------------------ the leak


def _leak_locked(target):
    """The Leak the boundaries kept show, or None. Called with target.lock
    held."""
    kept = target.boundaries
    if len(kept) < LEAK_WINDOW:
        return None
    # The window first, from the deque's end: a steady loop costs O(window) a step.
    if not window_grows([kept[k][0] for k in range(-LEAK_WINDOW, 0)]):
        return None
    lives = [live for live, _ in kept]
    judged = judge_leak(lives)
    if judged is None:
        return None
    per_step, start = judged
    first_step = target.steps - len(lives) + 1
    return Leak(per_step, first_step + start, target.steps, lives[-1] - lives[start], lives[-1])


# ------------------------------------------------------------------ which lines accumulate


def _lines_now(device, top):
    """[(label, bytes, blocks)] of live memory by line, or None when stacks
    are not recorded (python/vramguard/trace/stacks.py)."""
    return _oom_notes.lines_by_line(device, top)


def _with_lines(target, leak):
    """The lines whose live bytes grew since the leak was first seen (when
    that is this very step, since the earliest boundary kept), the most
    first: growth across steps, never size (the current batch is large
    and replaced each step)."""
    if target.device is None:
        return leak
    baseline = target.baseline
    now = _lines_at_last_boundary(target)
    if now is None:
        return leak
    if baseline is None or baseline[0] == target.steps:
        baseline = _earliest_lines_kept(target)
    if baseline is None:
        leak.lines = None
        leak.lines_note = ("which lines accumulate shows after another step with stacks recorded (vramguard "
                           "compares each line's live memory between step boundaries)")
        return leak
    grown = _grown_lines(baseline[1], now)
    leak.lines = grown[:_LINES_SHOWN] or None
    leak.lines_since = baseline[0]
    if not grown:
        leak.lines_note = "no line's live memory grew since the leak was first seen"
    return leak


def _lines_at_last_boundary(target):
    """The lines as the last step() read them, else as they are now."""
    # Boundaries against boundaries: a check made in the middle of a step
    # would count that step's allocations for some lines and not yet for
    # others.
    with target.lock:
        last = target.line_history[-1] if target.line_history else None
    return last[1] if last is not None and last[0] == target.steps else _lines_now(target.device, _BASELINE_LINES)


def _earliest_lines_kept(target):
    """(steps, lines) of the earliest boundary kept before this step's, or
    None."""
    with target.lock:
        earlier = [entry for entry in target.line_history if entry[0] < target.steps]
    return earlier[0] if earlier else None


def _grown_lines(before_rows, now_rows):
    """[(label, bytes grown, blocks grown)] of the lines whose live bytes
    grew from `before_rows` to `now_rows`, the most first."""
    before = {label: (nbytes, blocks) for label, nbytes, blocks in before_rows}
    grown = []
    for label, nbytes, blocks in now_rows:
        b_bytes, b_blocks = before.get(label, (0, 0))
        if nbytes > b_bytes:
            grown.append((label, nbytes - b_bytes, blocks - b_blocks))
    grown.sort(key=lambda row: -row[1])
    return grown
