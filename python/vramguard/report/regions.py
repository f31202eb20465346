"""Regions and steps: several max_memory_allocated counters at once, and
leaks across training steps.

    with vramguard.track("forward"):      # or @vramguard.track("forward")
        loss = model(x)
    ...
    vramguard.step()                      # the end of a training step
    vramguard.regions()                   # name, calls, peak, live at exit, bytes allocated
    vramguard.leak_check()                # None, or the leak the steps show

Each region has its own peak of allocated bytes, whatever the global peak
(reset_peaks() does not touch it) and whatever regions open and close
inside it. The heap keeps one resettable maximum (its interval peak, one
compare per allocation); each boundary of any region, and each step(),
takes it and folds it into every region open then, so any number of
nested regions share that one field. Memory is the device's: a region
counts every allocation on its device while it is open, from any thread.

A leak, as step() judges it: over the last LEAK_WINDOW step boundaries,
the memory live at the boundary grew, and at least 3/4 of the increments
were growth. The figure per step is the median increment of that window
(exact for a constant leak, and not moved by one large step); a one-off
growth (the optimizer's state made at the first step) or a steady loop is
never one. step() warns (LeakWarning) when a leak begins, once until it
stops.
"""
import functools
import html
import inspect
import threading
import types
import warnings
import weakref
from collections import deque

from .. import _core
from . import oom_notes as _oom_notes
from .._units import format_size
from ..render import words

#: Step boundaries the leak rule looks at (7 increments).
LEAK_WINDOW = 8
#: The share of the window's increments that must be growth.
LEAK_GROWING_SHARE = 0.75
#: Boundaries kept per device, for the leak's start and accumulated bytes.
_KEPT_BOUNDARIES = 1024
#: Lines compared when a leak is seen with stacks recorded.
_BASELINE_LINES = 50

__all__ = ["LeakWarning", "Leak", "RegionRow", "RegionTable", "leak_check", "regions", "step", "track"]


class LeakWarning(UserWarning):
    """step() sees memory live at step boundaries keep growing."""


# ------------------------------------------------------------------ targets


class _Frame:
    """One open entry of a region; `shown` is False for a PeakProbe's, which
    is vramguard's own bookkeeping and appears in nothing a user reads."""

    __slots__ = ("name", "peak", "live_at_entry", "allocated", "oom_seq", "shown")

    def __init__(self, name, live, shown=True):
        self.name = name
        self.shown = shown
        self.peak = live
        self.live_at_entry = live
        self.allocated = 0
        self.oom_seq = _core.last_oom_seq()  # an OOM while open changes it


class RegionRow:
    """A region's figures over its completed calls: `peak` the highest
    allocated bytes while it was open (any call), `live_at_exit` allocated
    bytes at its last exit, `allocated` bytes allocated inside it (all
    calls, freed or not)."""

    __slots__ = ("name", "calls", "peak", "live_at_exit", "allocated")

    def __init__(self, name):
        self.name = name
        self.calls = 0
        self.peak = 0
        self.live_at_exit = 0
        self.allocated = 0

    def __repr__(self):
        return (f"RegionRow({self.name!r}, calls={self.calls}, peak={format_size(self.peak)}, "
                f"live_at_exit={format_size(self.live_at_exit)}, allocated={format_size(self.allocated)})")


class _Target:
    """The regions and steps of one device heap (or of one Heap object)."""

    def __init__(self, heap, device):
        # A Heap object is held weakly (the table of targets must not keep
        # every heap ever tracked alive); a device heap lives for good.
        self._heap = weakref.ref(heap) if device is None else (lambda: heap)
        self.device = device          # an index, or None for a Heap object
        self.lock = threading.Lock()
        self.open = []                # _Frame, in order of entry
        self.rows = {}                # name -> RegionRow, in order of first exit
        self.last_total = _core.take_interval(heap)[2]
        self.step_peak = 0
        self.boundaries = deque(maxlen=_KEPT_BOUNDARIES)  # (live, step peak)
        self.steps = 0
        self.leaking = False
        self.baseline = None          # (steps, lines) when the leak was first seen
        # (steps, lines) at the last boundaries, stacks recorded: what grew
        # when the leak is first seen, rather than what is largest (the
        # current batch, replaced each step, is large and not a leak).
        self.line_history = deque(maxlen=LEAK_WINDOW)

    @property
    def heap(self):
        return self._heap()

    def fold(self):
        """Takes the heap's interval peak into every open frame; returns the
        allocated bytes now. Called with self.lock held."""
        peak, current, total = _core.take_interval(self.heap)  # the caller holds the heap
        # The total restarts from 0 at reset_accumulated_memory_stats().
        delta = total - self.last_total if total >= self.last_total else total
        self.last_total = total
        for frame in self.open:
            frame.peak = max(frame.peak, peak)
            frame.allocated += delta
        self.step_peak = max(self.step_peak, peak)
        return current


# Reentrant: a heap's weakref callback (_drop_heap_target) takes it, and the
# collector may run that callback in this very thread while the lock is
# held (any allocation in _heap_target can start a collection): a plain
# lock deadlocked there, once, under Python 3.12.
_targets_lock = threading.RLock()
_targets = {}


def _device_target_index(device):
    """The device index a call means: None is the current device once
    vramguard is installed (device 0 of simulated devices)."""
    from ..torch import install as _torch

    if isinstance(device, bool):
        raise TypeError("device must be an int, a torch device or a vramguard Heap, not bool")
    simulated = _core.devices_simulated()
    if not (_torch.is_installed() or simulated):
        _torch._require_installed()  # a device heap now would be one PyTorch never uses
    if device is None:
        if simulated:
            return 0
        import torch

        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    return _torch._device_index(device)


def _heap_target(heap):
    """The target of a Heap object. The table holds the heap weakly: a
    heap's regions go with it, and a new heap that gets the dead one's id
    finds no entry (the weakref's callback dropped it)."""
    key = ("heap", id(heap))
    with _targets_lock:
        entry = _targets.get(key)
        if entry is not None and entry[0]() is heap:
            return entry[1]
        target = _Target(heap, None)
        _targets[key] = (weakref.ref(heap, functools.partial(_drop_heap_target, key)), target)
        return target


def _drop_heap_target(key, ref):
    with _targets_lock:
        entry = _targets.get(key)
        if entry is not None and entry[0] is ref:
            del _targets[key]


def _target(device=None):
    if isinstance(device, _core.Heap):
        return _heap_target(device)
    index = _device_target_index(device)
    key = ("device", index)
    with _targets_lock:
        target = _targets.get(key)
        if target is None:
            target = _targets[key] = _Target(_core.device_heap(index), index)
        return target


# ------------------------------------------------------------------ regions


class track:
    """A region of code with its own peak of allocated bytes:

        with vramguard.track("forward"):
            ...

        @vramguard.track("eval")
        def evaluate(): ...

    device: an index, a torch device, or a vramguard.Heap (a simulated
    device); None is the current device. Regions nest; each keeps its own
    peak, independent of the others and of reset_peaks(). The figures are in
    vramguard.regions()."""

    def __init__(self, name, device=None):
        if callable(name) and not isinstance(name, str):  # @vramguard.track without arguments
            fn, name = name, getattr(name, "__qualname__", repr(name))
            self._init(name, device)
            self._wrapped = self(fn)
            return
        if not isinstance(name, str) or not name:
            raise TypeError(f"a region's name must be a non-empty str, got {name!r}")
        self._init(name, device)

    def _init(self, name, device):
        self.name = name
        self.device = device
        self._wrapped = None
        self._entries_lock = threading.Lock()
        self._entries = []            # (thread ident, target, frame), in order of entry

    def __enter__(self):
        target, frame = self._open()
        with self._entries_lock:
            self._entries.append((threading.get_ident(), target, frame))
        return self

    def __exit__(self, exc_type, exc, tb):
        me = threading.get_ident()
        with self._entries_lock:
            mine = [k for k, entry in enumerate(self._entries) if entry[0] == me]
            entry = self._entries.pop(mine[-1] if mine else -1) if self._entries else None
        if entry is None:
            raise RuntimeError(f"track({self.name!r}).__exit__ without a matching __enter__")
        if not mine:
            # Closed, so it is not open for good; uncounted, its figures
            # belong to no one call.
            self._discard(entry[1], entry[2])
            raise RuntimeError(f"track({self.name!r}).__exit__ on a thread that did not enter it: "
                               f"a region opens and closes on one thread; the region was closed uncounted")
        self._close(entry[1], entry[2], finished=True)
        return False

    def _open(self, frame=None):
        """Opens a new frame, or resumes `frame` (a generator's, between
        its resumptions)."""
        target = _target(self.device)
        with target.lock:
            live = target.fold()
            if frame is None:
                frame = _Frame(self.name, live)
            target.open.append(frame)
        return target, frame

    @staticmethod
    def _remove(target, frame):
        # Not always the last: another thread's region may have opened since.
        for i in range(len(target.open) - 1, -1, -1):
            if target.open[i] is frame:
                del target.open[i]
                return

    def _discard(self, target, frame):
        with target.lock:
            target.fold()
            self._remove(target, frame)

    def _close(self, target, frame, finished):
        """Closes the frame; a finished call becomes part of its row, a
        suspended generator's frame waits for the next resumption."""
        with target.lock:
            live = target.fold()
            self._remove(target, frame)
            if not finished:
                return
            row = target.rows.get(frame.name)
            if row is None:
                row = target.rows[frame.name] = RegionRow(frame.name)
            row.calls += 1
            row.peak = max(row.peak, frame.peak)
            row.live_at_exit = live
            row.allocated += frame.allocated
        if target.device is not None and _core.last_oom_seq() != frame.oom_seq:
            _note_oom_inside(target.device, frame)

    def _drive(self, gen):
        """Runs a generator or a coroutine with the region open over each
        resumption, and closed while it is suspended: one call per run, whose
        peak is the body's, not the caller's between resumptions."""
        frame, value, thrown = None, None, None
        while True:
            target, frame = self._open(frame)
            try:
                out = gen.send(value) if thrown is None else gen.throw(thrown)
            except StopIteration as stop:
                self._close(target, frame, finished=True)
                return stop.value
            except BaseException:
                self._close(target, frame, finished=True)
                raise
            self._close(target, frame, finished=False)
            value, thrown = None, None
            try:
                value = yield out
            except GeneratorExit:
                target, frame = self._open(frame)
                try:
                    gen.close()
                finally:
                    self._close(target, frame, finished=True)
                raise
            except BaseException as error:  # gen.throw(): into the body, with the region open
                thrown = error

    def __call__(self, *args, **kwargs):
        if self._wrapped is not None:  # the function @vramguard.track decorated
            return self._wrapped(*args, **kwargs)
        (fn,) = args
        if inspect.isasyncgenfunction(fn):
            raise TypeError(f"track({self.name!r}) cannot decorate an async generator function; "
                            f"use `with vramguard.track(...)` inside it")
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def tracked_generator(*a, **kw):
                return (yield from self._drive(fn(*a, **kw)))

            return tracked_generator
        if inspect.iscoroutinefunction(fn):
            drive = types.coroutine(self._drive)

            @functools.wraps(fn)
            async def tracked_coroutine(*a, **kw):
                return await drive(fn(*a, **kw))

            return tracked_coroutine

        @functools.wraps(fn)
        def tracked(*a, **kw):
            with self:
                return fn(*a, **kw)

        return tracked


class PeakProbe:
    """A peak of allocated bytes over a stretch of code, as a region keeps
    one, but invisible: no row in regions(), not among its open regions nor
    the OOM report's. For the cell meter and find_max_batch, which must not
    reset the peaks torch.cuda.max_memory_allocated() reports. close() it:
    an open probe costs every region boundary a compare."""

    def __init__(self, device=None):
        self._target = _target(device)
        with self._target.lock:
            self._frame = _Frame("<probe>", self._target.fold(), shown=False)
            self._target.open.append(self._frame)
        self.live_at_start = self._frame.live_at_entry

    def close(self):
        """(peak, live now); the probe stops following the heap."""
        target, frame = self._target, self._frame
        with target.lock:
            live = target.fold()
            if frame in target.open:
                target.open.remove(frame)
        return frame.peak, live


def _note_oom_inside(device, frame):
    """An out-of-memory came while the region was open (raised through it
    or caught inside): the report says which regions were open at it, and
    what each had added."""
    _oom_notes.note_region_at_oom(device, frame.name, frame.live_at_entry, frame.peak)


def open_regions(device):
    """[(name, live at entry, peak so far)] of the regions open now on a
    device, outermost first (for the OOM report)."""
    with _targets_lock:
        target = _targets.get(("device", device))
    if target is None:
        return []
    with target.lock:
        target.fold()
        return [(f.name, f.live_at_entry, f.peak) for f in target.open if f.shown]


class RegionTable:
    """vramguard.regions(): one row per region name, in order of first exit."""

    def __init__(self, rows, open_names, device):
        self.rows = rows
        self.open = open_names
        self.device = device

    def __getitem__(self, name):
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(name)

    def __iter__(self):
        return iter(self.rows)

    def __len__(self):
        return len(self.rows)

    def _cells(self):
        return [(r.name, str(r.calls), format_size(r.peak), format_size(r.live_at_exit), format_size(r.allocated))
                for r in self.rows]

    _HEADER = ("Region", "Calls", "Peak", "Live at exit", "Allocated")

    def __str__(self):
        if not self.rows:
            text = "No region has closed yet: wrap code in `with vramguard.track(\"name\"):`."
        else:
            cells = [self._HEADER] + self._cells()
            widths = [max(len(row[i]) for row in cells) for i in range(len(self._HEADER))]
            lines = []
            for n, row in enumerate(cells):
                lines.append("  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]))
                if n == 0:
                    lines.append("  ".join("-" * w for w in widths))
            text = "\n".join(lines)
        if self.open:
            text += "\nOpen now: " + ", ".join(self.open)
        return text

    def __repr__(self):
        return str(self)

    def _repr_html_(self):
        if not self.rows:
            return f"<p>{html.escape(str(self))}</p>"
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self._HEADER)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self._cells())
        extra = f"<p>Open now: {html.escape(', '.join(self.open))}</p>" if self.open else ""
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{extra}"


def regions(device=None):
    """The table of regions of a device (or of a vramguard.Heap): name,
    calls, peak, allocated bytes live at its last exit, bytes allocated
    inside it. Peaks are of allocated bytes, as max_memory_allocated()."""
    target = _target(device)
    with target.lock:
        target.fold()
        rows = [_copy_row(r) for r in target.rows.values()]
        open_names = [f.name for f in target.open if f.shown]
    return RegionTable(rows, open_names, target.device)


def _copy_row(row):
    copy = RegionRow(row.name)
    copy.calls, copy.peak, copy.live_at_exit, copy.allocated = row.calls, row.peak, row.live_at_exit, row.allocated
    return copy


def reset_regions(device=None):
    """Forget the regions and steps of a device (open regions stay open)."""
    target = _target(device)
    with target.lock:
        target.fold()
        target.rows.clear()
        target.boundaries.clear()
        target.steps = 0
        target.leaking = False
        target.baseline = None


# ------------------------------------------------------------------ steps and leaks


class Leak:
    """Memory live at step boundaries that keeps growing.

    bytes_per_step: the median increment over the last LEAK_WINDOW
    boundaries; since_step: the step from which the boundaries grew (the
    earliest that keeps the rule true); accumulated: bytes live at the last
    boundary beyond those at since_step; lines: [(label, bytes grown,
    blocks grown)] of the lines that allocated what accumulates (stacks
    recorded), else None."""

    CAUSES = (
        "a tensor kept across steps, such as losses.append(loss) (keep loss.item() instead, a float)",
        "outputs or activations kept in a list or a dict across steps (detach() and .cpu(), or drop them)",
        "a growing cache keyed by step (hidden states, attention masks)",
    )

    def __init__(self, bytes_per_step, since_step, steps, accumulated, live, lines=None, lines_note=None,
                 lines_since=None):
        self.bytes_per_step = bytes_per_step
        self.since_step = since_step
        self.steps = steps
        self.accumulated = accumulated
        self.live = live
        self.lines = lines
        self.lines_note = lines_note
        # the step boundary the lines' growth is counted from (stacks are
        # compared from where they were first kept, which may be later than
        # since_step): the lines' figures cover lines_since to steps only
        self.lines_since = lines_since

    def _lines_title(self):
        if self.lines and self.lines_since is not None:
            return f"What accumulates, by line (from step {self.lines_since} to step {self.steps}):"
        return "What accumulates, by line:"

    def headline(self):
        return (f"Leak: memory live at step boundaries grows by {format_size(self.bytes_per_step)} per step "
                f"(since step {self.since_step}, {format_size(self.accumulated)} so far; "
                f"{format_size(self.live)} live at step {self.steps}).")

    def _line_texts(self):
        if self.lines:
            return [f"{label}: +{format_size(nbytes)} in {words.count(blocks, 'block')}" for label, nbytes, blocks in self.lines]
        return [self.lines_note or "vramguard.record(stacks=True) shows which lines allocate it."]

    def __str__(self):
        out = [self.headline(), self._lines_title()]
        out += ["  " + t for t in self._line_texts()]
        out.append("Usual causes:")
        out += ["  - " + c for c in self.CAUSES]
        return "\n".join(out)

    def __repr__(self):
        return str(self)

    def _repr_html_(self):
        lines = "".join(f"<li>{html.escape(t)}</li>" for t in self._line_texts())
        causes = "".join(f"<li>{html.escape(c)}</li>" for c in self.CAUSES)
        return (f"<p><b>{html.escape(self.headline())}</b></p><p>{html.escape(self._lines_title())}</p><ul>{lines}</ul>"
                f"<p>Usual causes:</p><ul>{causes}</ul>")


def _increments(lives):
    return [b - a for a, b in zip(lives, lives[1:])]


def _rule_holds(increments):
    growing = sum(1 for d in increments if d > 0)
    return sum(increments) > 0 and growing >= LEAK_GROWING_SHARE * len(increments)


def _median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) // 2


def judge_leak(lives):
    """(bytes per step, index where it began) for boundary figures `lives`
    (oldest first), or None when they do not show a leak (see the module's
    rule)."""
    if len(lives) < LEAK_WINDOW:
        return None
    window = _increments(lives[-LEAK_WINDOW:])
    if not _rule_holds(window):
        return None
    # Back while the longer stretch still holds to the rule, with a running
    # count (one pass: step() may see a thousand boundaries).
    start = len(lives) - LEAK_WINDOW
    growing = sum(1 for d in window if d > 0)
    while start > 0:
        more = growing + (lives[start] > lives[start - 1])
        if lives[-1] - lives[start - 1] <= 0 or more < LEAK_GROWING_SHARE * (len(lives) - start):
            break
        start, growing = start - 1, more
    while lives[start + 1] <= lives[start]:  # a leak begins with growth
        start += 1
    return _median(window), start


def _lines_now(device, top):
    """[(label, bytes, blocks)] of live memory by line, or None when stacks
    are not recorded (python/vramguard/trace/stacks.py)."""
    return _oom_notes.lines_by_line(device, top)


def _leak_locked(target):
    kept = target.boundaries
    if len(kept) < LEAK_WINDOW:
        return None
    # The window first, from the deque's end: a steady loop costs O(window) a step.
    if not _rule_holds(_increments([kept[k][0] for k in range(-LEAK_WINDOW, 0)])):
        return None
    lives = [live for live, _ in kept]
    judged = judge_leak(lives)
    if judged is None:
        return None
    per_step, start = judged
    first_step = target.steps - len(lives) + 1
    return Leak(per_step, first_step + start, target.steps, lives[-1] - lives[start], lives[-1])


def _with_lines(target, leak):
    """The lines whose live bytes grew since the leak was first seen (when
    that is this very step, since the earliest boundary kept), the most
    first: growth across steps, never size (the current batch is large
    and replaced each step)."""
    if target.device is None:
        return leak
    baseline = target.baseline
    # Boundaries against boundaries: the lines as the last step() read them
    # (a check made in the middle of a step would count that step's
    # allocations for some lines and not yet for others).
    with target.lock:
        last = target.line_history[-1] if target.line_history else None
    now = last[1] if last is not None and last[0] == target.steps else _lines_now(target.device, _BASELINE_LINES)
    if now is None:
        return leak
    if baseline is None or baseline[0] == target.steps:
        with target.lock:
            earlier = [entry for entry in target.line_history if entry[0] < target.steps]
        baseline = earlier[0] if earlier else None
    if baseline is None:
        leak.lines = None
        leak.lines_note = ("which lines accumulate shows after another step with stacks recorded (vramguard "
                           "compares each line's live memory between step boundaries)")
        return leak
    before = {label: (nbytes, blocks) for label, nbytes, blocks in baseline[1]}
    grown = []
    for label, nbytes, blocks in now:
        b_bytes, b_blocks = before.get(label, (0, 0))
        if nbytes > b_bytes:
            grown.append((label, nbytes - b_bytes, blocks - b_blocks))
    grown.sort(key=lambda row: -row[1])
    leak.lines = grown[:5] or None
    leak.lines_since = baseline[0]
    if not grown:
        leak.lines_note = "no line's live memory grew since the leak was first seen"
    return leak


def step(device=None):
    """Marks the end of a training step: records the memory live now and
    this step's peak, and warns (LeakWarning) when the boundaries begin to
    show a leak. Returns None."""
    target = _target(device)
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
    target = _target(device)
    with target.lock:
        leak = _leak_locked(target)
    return _with_lines(target, leak) if leak is not None else None


def step_figures(device):
    """For the OOM report: (steps, live at the last boundary, the last
    completed step's peak, peak of the step under way, Leak or None); None
    when step() was never called on the device."""
    with _targets_lock:
        target = _targets.get(("device", device))
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
