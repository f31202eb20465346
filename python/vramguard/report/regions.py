"""Regions: several max_memory_allocated counters at once.

    with vramguard.track("forward"):      # or @vramguard.track("forward")
        loss = model(x)
    ...
    vramguard.regions()                   # name, calls, peak, live at exit, bytes allocated

Each region has its own peak of allocated bytes, whatever the global peak
(reset_peaks() does not touch it) and whatever regions open and close
inside it: every boundary folds the heap's one interval peak into the
regions open then (tracked_heaps.py). Memory is the device's: a region
counts every allocation on its device while it is open, from any thread.

The steps and their leaks are steps.py's; the table regions() returns is
region_table.py's.
"""
import functools
import inspect
import threading
import types

from .. import _core
from . import oom_notes as _oom_notes
from .region_table import RegionRow, RegionTable
from .tracked_heaps import RegionFrame, tracked_device_heap, tracked_heap

__all__ = ["open_regions", "regions", "reset_regions", "track"]


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
        target = tracked_heap(self.device)
        with target.lock:
            live = target.fold()
            if frame is None:
                frame = RegionFrame(self.name, live)
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


def _note_oom_inside(device, frame):
    """An out-of-memory came while the region was open (raised through it
    or caught inside): the report says which regions were open at it, and
    what each had added."""
    _oom_notes.note_region_at_oom(device, frame.name, frame.live_at_entry, frame.peak)


def open_regions(device):
    """[(name, live at entry, peak so far)] of the regions open now on a
    device, outermost first (for the OOM report)."""
    target = tracked_device_heap(device)
    if target is None:
        return []
    with target.lock:
        target.fold()
        return [(f.name, f.live_at_entry, f.peak) for f in target.open if f.shown]


def regions(device=None):
    """The table of regions of a device (or of a vramguard.Heap): name,
    calls, peak, allocated bytes live at its last exit, bytes allocated
    inside it. Peaks are of allocated bytes, as max_memory_allocated()."""
    target = tracked_heap(device)
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
    target = tracked_heap(device)
    with target.lock:
        target.fold()
        target.rows.clear()
        target.boundaries.clear()
        target.steps = 0
        target.leaking = False
        target.baseline = None
