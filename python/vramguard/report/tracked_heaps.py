"""What regions and steps keep of each heap they follow, and the table that
finds it by device (or by Heap object).

Each region has its own peak of allocated bytes, whatever the global peak
(reset_peaks() does not touch it) and whatever regions open and close
inside it. The heap keeps one resettable maximum (its interval peak, one
compare per allocation); each boundary of any region, and each step(),
takes it (TrackedHeap.fold) and folds it into every region open then, so
any number of nested regions share that one field.

regions.py, peak_probe.py and steps.py each keep their figures here, on
the heap's TrackedHeap, under its lock.
"""
import functools
import threading
import weakref
from collections import deque

from .. import _core
from .leak_rule import LEAK_WINDOW

__all__ = ["RegionFrame", "TrackedHeap", "tracked_heap", "tracked_device_heap"]

#: Boundaries kept per device, for the leak's start and accumulated bytes.
_KEPT_BOUNDARIES = 1024


class RegionFrame:
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


class TrackedHeap:
    """The regions and steps of one device heap (or of one Heap object)."""

    def __init__(self, heap, device):
        # A Heap object is held weakly (the table of tracked heaps must not
        # keep every heap ever tracked alive); a device heap lives for good.
        self._heap = weakref.ref(heap) if device is None else (lambda: heap)
        self.device = device          # an index, or None for a Heap object
        self.lock = threading.Lock()
        self.open = []                # RegionFrame, in order of entry
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
_targets = {}  # ("device", index) -> TrackedHeap; ("heap", id) -> (weakref to the Heap, TrackedHeap)


def _device_target_index(device):
    """The device index a call means: None is the current device once
    vramguard is installed (device 0 of simulated devices)."""
    from ..torch import install as _torch

    if isinstance(device, bool):
        raise TypeError("device must be an int, a torch device or a vramguard Heap, not bool")
    simulated = _core.devices_simulated()
    if not (_torch.is_installed() or simulated):
        _torch.require_installed()  # a device heap now would be one PyTorch never uses
    if device is None:
        if simulated:
            return 0
        import torch

        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    return _torch.device_index(device)


def _heap_target(heap):
    """The TrackedHeap of a Heap object. The table holds the heap weakly: a
    heap's regions go with it, and a new heap that gets the dead one's id
    finds no entry (the weakref's callback dropped it)."""
    key = ("heap", id(heap))
    with _targets_lock:
        entry = _targets.get(key)
        if entry is not None and entry[0]() is heap:
            return entry[1]
        target = TrackedHeap(heap, None)
        _targets[key] = (weakref.ref(heap, functools.partial(_drop_heap_target, key)), target)
        return target


def _drop_heap_target(key, ref):
    with _targets_lock:
        entry = _targets.get(key)
        if entry is not None and entry[0] is ref:
            del _targets[key]


def tracked_heap(device=None):
    """The TrackedHeap of a device (an index, a torch device, None for the
    current one) or of a vramguard.Heap, made on first use."""
    if isinstance(device, _core.Heap):
        return _heap_target(device)
    index = _device_target_index(device)
    key = ("device", index)
    with _targets_lock:
        target = _targets.get(key)
        if target is None:
            target = _targets[key] = TrackedHeap(_core.device_heap(index), index)
        return target


def tracked_device_heap(device):
    """The TrackedHeap of device index `device`, or None when no region or
    step has been on it: the OOM report reads what is there and makes
    nothing."""
    with _targets_lock:
        return _targets.get(("device", device))
