"""PyTorch's memory history under vramguard: torch.cuda.memory's
_record_memory_history, _snapshot, memory_snapshot (and _dump_snapshot,
which calls _snapshot) made to run on vramguard's own recording, so that
code written for PyTorch's allocator (tutorials, training libraries'
profilers) runs unchanged.

Under any pluggable allocator PyTorch refuses these ("CUDAPluggableAllocator
does not yet support recordHistory"). install(patch_torch=True) replaces
them with the functions made here (torch/patches.py calls make_stand_ins,
which this module registers: the torch layer does not import this one).

How PyTorch's arguments map (docs/pytorch.md says what differs):
- enabled "all" (or True): a recording of the current device, with stacks
  unless context=None; "state": the same, and _snapshot() then gives no
  `device_traces` entries; None (or False): stops it, its events dropped,
  as PyTorch drops its history.
- max_entries: the snapshot keeps the last max_entries events, as PyTorch's
  ring does; the recording's ring holds at most that many between reads.
- stacks "python" and "all": Python frames of user code (vramguard keeps no
  C++ frames); context "state", "alloc" and "all": stacks of allocations
  (vramguard keeps none for frees).
- clear_history: the recording restarts. skip_actions: those actions are
  left out of `device_traces`. record_cuda=False records nothing;
  record_pinned_host_memory=True is refused (vramguard does not allocate
  host memory). compile_context and global_record_annotations are not
  recorded.
- A recording the program started itself (vramguard.start_recording()) is
  used as it is, and not stopped by enabled=None.
"""
import sys
import warnings

from ..torch import install as _torch
from ..torch import patches as _patches
from .record import DEFAULT_CAPACITY, running_recording, start_recording
from .snapshot import snapshot

__all__ = ["make_stand_ins"]

_ENABLED = ("state", "all")
_CONTEXT = (None, "state", "alloc", "all")
_STACKS = ("python", "all")
_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
            "segment_unmap", "oom", "snapshot")


class _History:
    """What the stand-ins started: the recording, PyTorch's settings."""

    def __init__(self):
        self.recording = None  # the one started here (a program's own is not ours to stop)
        self.state_only = False
        self.max_entries = sys.maxsize
        self.skip_actions = ()

    def stop(self):
        """Stops the recording started here; its events are dropped."""
        rec, self.recording = self.recording, None
        if rec is not None and rec._running:
            with warnings.catch_warnings():  # an overflowing ring is what max_entries asked for
                warnings.simplefilter("ignore", RuntimeWarning)
                rec.stop()
        self.state_only, self.max_entries, self.skip_actions = False, sys.maxsize, ()


_history = _History()


def _check(enabled, context, stacks, max_entries, skip_actions, record_pinned_host_memory):
    if enabled is not None and enabled not in _ENABLED:
        raise ValueError(f"enabled must be None, 'state' or 'all', got {enabled!r}")
    if context not in _CONTEXT:
        raise ValueError(f"context must be None, 'state', 'alloc' or 'all', got {context!r}")
    if stacks not in _STACKS:
        raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
    if type(max_entries) is not int or max_entries < 1:
        raise ValueError(f"max_entries must be an int >= 1, got {max_entries!r}")
    unknown = [a for a in (skip_actions or ()) if a not in _ACTIONS]
    if unknown:
        raise ValueError(f"skip_actions: unknown action(s) {unknown!r}; known: {', '.join(_ACTIONS)}")
    if record_pinned_host_memory:
        raise RuntimeError("vramguard: record_pinned_host_memory=True: vramguard allocates no pinned host "
                           "memory, so it has no host history to record; leave it False")


def record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None,
                          clear_history=False, compile_context=False, global_record_annotations=False,
                          skip_actions=None, record_pinned_host_memory=False, record_cuda=True):
    """torch.cuda.memory._record_memory_history on vramguard's recording
    (this module's docstring: how each argument maps)."""
    _check(enabled, context, stacks, max_entries, skip_actions, record_pinned_host_memory)
    if enabled is None or not record_cuda:
        _history.stop()
        return
    heap = _torch.device_heap(None)  # the current device's, as start_recording() records
    running = running_recording(heap)
    ours = _history.recording
    if ours is not None and (ours is not running or clear_history or ours.stacks != (context is not None)):
        _history.stop()  # on another device, stopped by the program, or asked to start again
        ours, running = None, running_recording(heap)
    if ours is None and running is None:
        _history.recording = start_recording(heap, capacity=min(max_entries, DEFAULT_CAPACITY),
                                             name="memory history", stacks=context is not None)
    # else ours goes on, or the program's own recording serves (not ours to stop)
    _history.state_only = enabled == "state"
    _history.max_entries = max_entries
    _history.skip_actions = tuple(skip_actions or ())


def _record_memory_history(enabled="all", *args, **kwargs):
    """PyTorch's entry point: its legacy form takes a bool first
    (enabled, record_context, trace_alloc_max_entries, ...)."""
    if isinstance(enabled, bool):
        return _legacy(enabled, *args, **kwargs)
    return record_memory_history(enabled, *args, **kwargs)


def _legacy(enabled, record_context=True, trace_alloc_max_entries=1, trace_alloc_record_context=False,
            device=None, record_context_cpp=False, clear_history=False, compile_context=False,
            global_record_annotations=False, skip_actions=None, record_pinned_host_memory=False,
            record_cuda=True):
    """The legacy form as PyTorch maps it: history kept when
    trace_alloc_max_entries > 1, stacks when record_context."""
    if not enabled:
        return record_memory_history(None)
    return record_memory_history("all" if trace_alloc_max_entries > 1 else "state",
                                 "all" if record_context else None, "python",
                                 max(1, trace_alloc_max_entries), device, clear_history,
                                 skip_actions=skip_actions, record_pinned_host_memory=record_pinned_host_memory,
                                 record_cuda=record_cuda)


def _traces_kept(entries):
    """A device's trace entries as PyTorch's history would hold them."""
    if _history.state_only:
        return []
    if _history.skip_actions:
        entries = [e for e in entries if e.get("action") not in _history.skip_actions]
    return entries[-_history.max_entries:] if len(entries) > _history.max_entries else entries


def _snapshot(device=None, augment_with_fx_traces=False):
    """torch.cuda.memory._snapshot: every device vramguard serves, with the
    history's events as `device_traces` (augment_with_fx_traces: no FX
    frames are added)."""
    snap = snapshot()
    snap["device_traces"] = [_traces_kept(entries) for entries in snap["device_traces"]]
    return snap


def memory_snapshot(mempool_id=None, include_traces=True):
    """torch.cuda.memory_snapshot: the segments (of one pool when
    mempool_id is given)."""
    segments = snapshot()["segments"]
    if mempool_id is not None:
        pool = tuple(mempool_id)
        segments = [s for s in segments if tuple(s["segment_pool_id"]) == pool]
    return segments


def make_stand_ins(torch):
    """{name: function} for torch.cuda.memory (and torch.cuda)."""
    return {"_record_memory_history": _record_memory_history, "_snapshot": _snapshot,
            "memory_snapshot": memory_snapshot}


_patches.history_stand_ins.append(make_stand_ins)
