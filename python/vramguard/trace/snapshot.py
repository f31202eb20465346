"""Memory snapshots in PyTorch's format, for pytorch.org/memory_viz:

    vramguard.start_recording()                 # what _record_memory_history() did
    ...train a few steps...
    vramguard.dump_snapshot("memory.pickle")    # what _dump_snapshot() did

Under any pluggable allocator PyTorch refuses _record_memory_history and
_dump_snapshot; this writes the same pickle from vramguard's own state: the
heap's segments and blocks (copied under the heap's lock by the extension's
visitor, turned into dicts after) and the recording's events as
`device_traces`. The file holds plain dicts, lists, tuples, ints and strs,
so PyTorch's readers (torch.cuda._memory_viz, MemoryViz.js) and
vramguard.load_trace read it alike.

What PyTorch's format says and vramguard's heap does not know is written as
the native allocator writes it when the feature is unused: every segment in
the default pool ((0, 0)), none expandable, no graph pools; `device_free`
of an `oom` event is what the budget left (0 with no budget).
"""
import errno
import os
import pickle

from .. import _core
from .._files import write_atomically
from ..torch import install as _torch
from ..torch.device_heaps import index_of_heap
from .record import EVENT, running_recording, record, EV_ALLOC, EV_FREE, EV_MAP, EV_OOM, EV_RELEASE, EV_RESERVE, EV_UNMAP
from .importer import DROPPED_KEY
from .stacks import capture_table
from .format import ALLOC, EMPTY_CACHE, FREE, SYNCHRONIZE, Trace

__all__ = ["dump_snapshot", "snapshot"]

#: A block's state as PyTorch names it, from Heap.segments()'s.
BLOCK_STATES = {"live": "active_allocated", "pending": "active_pending_free", "free": "inactive"}
DEFAULT_POOL = (0, 0)
#: A simulated device big enough for any trace a replay can serve.
_TRACE_DEVICE = 1 << 50


#: The events that change the reserved bytes: PyTorch's action for each,
#: and whether it adds its size (+1) or takes it away (-1).
_SEGMENT_ACTIONS = {
    EV_RESERVE: ("segment_alloc", 1), EV_RELEASE: ("segment_free", -1),
    EV_MAP: ("segment_map", 1), EV_UNMAP: ("segment_unmap", -1),
}


def _no_frames(_event):
    return []


def _frames_made_once(frames_of_stack):
    """stack -> PyTorch's frame dicts from `frames_of_stack(stack)`'s
    (file, line, name) tuples, each stack's made once: an allocation site
    recurs thousands of times in a recording."""
    made = {}

    def frames(stack):
        if stack not in made:
            made[stack] = [{"filename": f, "line": line, "name": name} for f, line, name in frames_of_stack(stack)]
        return made[stack]

    return frames


def trace_entries(data, reserved_start=0, budget=0, frames_of=_no_frames):
    """A device's `device_traces` list from packed ring events (the format of
    Heap.history_take()). `frames_of(event)` gives an event's stack as
    PyTorch's frame dicts ({'filename', 'line', 'name'}); the default, for
    recordings without stacks, gives []. Each vramguard event becomes the
    PyTorch actions the native allocator writes for the same thing:

      alloc        -> alloc (size: the requested bytes, as PyTorch's)
      free         -> free_requested, free_completed
      reserve      -> segment_alloc        release -> segment_free
      map          -> segment_map          unmap   -> segment_unmap (the arena's
                      pages, as PyTorch writes an expandable segment's)
      oom          -> oom (size: the rounded request; device_free)
    An empty_cache() shows as the segment_free events it caused, as in
    PyTorch's traces; record_stream has no action of its own."""
    entries, reserved = [], reserved_start
    for event in EVENT.iter_unpack(data):
        time_ns, addr, size, requested, stream, kind, _ = event
        frames = frames_of(event)
        if kind == EV_ALLOC:
            entries.append(_entry("alloc", addr, requested, stream, time_ns, frames))
        elif kind == EV_FREE:
            entries.append(_entry("free_requested", addr, requested, stream, time_ns, frames))
            entries.append(_entry("free_completed", addr, requested, stream, time_ns, frames))
        elif kind in _SEGMENT_ACTIONS:
            action, sign = _SEGMENT_ACTIONS[kind]
            reserved += sign * size
            entries.append(_entry(action, addr, size, stream, time_ns, frames))
        elif kind == EV_OOM:
            entry = _entry("oom", 0, size, stream, time_ns, frames)
            del entry["addr"]  # PyTorch's oom carries device_free in its place
            entry["device_free"] = max(budget - reserved, 0) if budget else 0
            entries.append(entry)
        # EV_EMPTY_CACHE, EV_RECORD_STREAM and kinds this version does not
        # know have no action of PyTorch's: left out.
    return entries


def _entry(action, addr, size, stream, time_ns, frames):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": time_ns // 1000, "frames": frames}


def _block(block, frames):
    return {"address": block["address"], "size": block["size"],
            "requested_size": block["requested"], "state": BLOCK_STATES[block["state"]],
            "frames": frames}


def segment_entries(segments, device, alloc_frames=None):
    """PyTorch's `segments` list from Heap.segments(); `alloc_frames` maps a
    block's address to the stack of the allocation recorded there. An arena
    range is written as PyTorch writes an expandable segment: one segment
    per contiguous mapped run of pages (is_expandable True, total_size the
    run's bytes), with the blocks of that run, free ones cut to it."""
    alloc_frames = alloc_frames or {}
    out = []
    for seg in sorted(segments, key=lambda s: s["address"]):
        runs = seg.get("mapped_runs")
        if runs is None:
            out.append(_segment(seg, device, seg["address"], seg["size"], seg["blocks"], False, alloc_frames))
            continue
        for offset, size in runs:
            start = seg["address"] + offset
            out.append(_segment(seg, device, start, size, _blocks_in(seg["blocks"], start, start + size), True,
                                alloc_frames))
    return out


def _blocks_in(blocks, start, end):
    """The blocks of [start, end), each cut to it (only free blocks reach
    unmapped pages: a live or pending one's pages are all mapped)."""
    out = []
    for b in blocks:
        lo, hi = max(b["address"], start), min(b["address"] + b["size"], end)
        if lo < hi:
            out.append(dict(b, address=lo, size=hi - lo))
    return out


def _segment(seg, device, address, total_size, raw_blocks, expandable, alloc_frames):
    blocks = [_block(b, alloc_frames.get(b["address"], []) if b["state"] != "free" else [])
              for b in raw_blocks]
    return {
        "device": device, "address": address, "total_size": total_size,
        "allocated_size": _sum(blocks, "size", ("active_allocated",)),
        "active_size": _sum(blocks, "size", ("active_allocated", "active_pending_free")),
        "requested_size": _sum(blocks, "requested_size", ("active_allocated",)),
        "stream": seg["stream"], "segment_type": seg["pool"], "segment_pool_id": seg.get("pool_id", DEFAULT_POOL),
        "is_expandable": expandable, "frames": [], "blocks": blocks,
    }


def _sum(blocks, key, states):
    return sum(b[key] for b in blocks if b["state"] in states)


def _alloc_frames(entries):
    """Address -> stack of the last allocation recorded there."""
    frames = {}
    for e in entries:
        if e["action"] == "alloc" and e["frames"]:
            frames[e["addr"]] = e["frames"]
    return frames


def allocator_settings(heap):
    """The settings PyTorch's snapshot names, as vramguard has them: the
    native knobs vramguard does not read are written as their defaults."""
    return {
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "max_split_size": -1,
        "garbage_collection_threshold": heap.gc_threshold or 0.0,
        "expandable_segments": False,
        "roundup_power2_divisions": {},
        "allocator": "vramguard",
        "vramguard_policy": heap.policy,
        "vramguard_budget": heap.budget or 0,
    }


# ------------------------------------------------------------------ sources


class _DeviceState:
    """What one device contributes: its heap, its recording's events, and
    how to read an event's frames."""

    def __init__(self, index, heap, data=b"", reserved_start=0, frames_of=_no_frames):
        self.index, self.heap, self.data, self.reserved_start = index, heap, data, reserved_start
        self.frames_of = frames_of
        self.dropped = 0  # events the recording's ring lost (its oldest)
        self.installed = False  # the installed allocator's device: its graph pools are written too

    def segments(self):
        """The heap's segments, then (installed) its CUDA graphs' private
        pools' with their pool ids, as PyTorch lists a pool's segments with
        the device's; each copied under its lock."""
        segs = self.heap.segments()
        return segs + _core.pool_segments(self.index) if self.installed else segs


def _frames_source(rec):
    """frames_of(event) for a recording's events. The ring's last field is
    the stack id an allocation of a recording with stacks carries (0 for
    none); each stack is made into frame dicts once."""
    if not getattr(rec, "stacks", False):
        return _no_frames
    table, _ = capture_table()
    frames = _frames_made_once(lambda stack: table.frames_of(stack - 1))

    def frames_of(event):
        stack = event[-1]
        return frames(stack) if 0 < stack <= len(table) else []

    return frames_of


def _recording_of(heap, recording):
    if recording is not None:
        return recording
    return running_recording(heap)  # a `with record(heap)` or start_recording()


def _state(index, heap, recording):
    rec = _recording_of(heap, recording)
    if rec is None:
        return _DeviceState(index, heap)
    data, dropped = rec.events()
    state = _DeviceState(index, heap, data, rec.reserved_start, _frames_source(rec))
    state.dropped = dropped
    return state


def _installed_states(device):
    _torch.require_installed()
    indices = _core.existing_devices() if device is None else [_torch.device_index(device)]
    states = [_state(i, _torch.device_heap(i), None) for i in indices]
    for s in states:
        s.installed = True
    return states


def _index_of(heap, device):
    """The device index a named heap is written as: `device` when given,
    else the installed allocator's index for it, else 0 (a simulated heap)."""
    if device is not None:
        if type(device) is not int or device < 0:
            raise ValueError(f"device must be a device index (an int >= 0) with heap=, got {device!r}")
        return device
    index = index_of_heap(heap)
    return 0 if index is None else index


def _trace_state(trace):
    """A Trace run on a fresh simulated device, recorded as it goes: its ops
    at the addresses that device gives them, and what is live at its end
    still live in the segments (Heap.replay would free it). Run under
    segments, not the default arena: their segment_alloc/segment_free
    events are what a PyTorch trace holds (an empty_cache reads back from
    its segment_free), and what the arena does is not recorded as such."""
    heap = _core.Heap(_TRACE_DEVICE, policy="segments")
    heap.history_start(2 * len(trace) + 16)  # an op makes at most a block's and a segment's event
    try:
        _run(heap, trace)
    finally:
        heap.history_stop()
    data, _dropped = heap.history_take()
    state = _DeviceState(0, heap, data, frames_of=_trace_frames_source(trace))
    state.dropped = trace.meta.get("dropped_events", 0) or 0
    return state


def _trace_frames_source(trace):
    """frames_of(event) for a trace's replay: its allocations come back as
    the ring's alloc events in the trace's order, so the n-th alloc event
    has the stack of the trace's n-th allocation op."""
    if not trace.has_stacks:
        return _no_frames
    alloc_ops = iter([op for op, kind in enumerate(trace.kinds) if kind == ALLOC])
    frames = _frames_made_once(trace.stacks.frames_of)

    def frames_of(event):
        if event[5] != EV_ALLOC:
            return []
        stack = trace.stack_of(next(alloc_ops, -1))
        return [] if stack is None else frames(stack)

    return frames_of


def _run(heap, trace):
    ptrs = {}
    for kind, ident, size, stream in zip(trace.kinds, trace.ids, trace.sizes, trace.streams):
        if kind == ALLOC:
            ptrs[ident] = heap.malloc(size, stream)
        elif kind == FREE:
            heap.free(ptrs.pop(ident))
        elif kind == EMPTY_CACHE:
            heap.empty_cache()
        elif kind == SYNCHRONIZE:
            heap.synchronize()


def _check_types(heap, recording, trace):
    if heap is not None and not isinstance(heap, _core.Heap):
        raise TypeError(f"heap must be a vramguard.Heap, got {type(heap).__name__} {heap!r}")
    if recording is not None and not isinstance(recording, record):
        raise TypeError(f"recording must be a vramguard.record, got {type(recording).__name__} {recording!r}")
    if trace is not None and not isinstance(trace, Trace):
        raise TypeError(f"trace must be a vramguard.Trace, got {type(trace).__name__} {trace!r}")
    if heap is not None and recording is not None and recording.heap is not None and recording.heap is not heap:
        raise ValueError("recording= records another heap than heap=: a snapshot pairs a heap with its own recording")


def _states(device, heap, recording, trace):
    _check_types(heap, recording, trace)
    if trace is not None:
        if heap is not None or recording is not None:
            raise ValueError("dump a trace, or a heap and its recording, not both")
        return [_trace_state(trace)]
    if heap is None and recording is not None:
        if recording.heap is None:
            raise ValueError("this recording was never started: it has no heap to dump")
        heap = recording.heap
    if heap is not None:
        return [_state(_index_of(heap, device), heap, recording)]
    return _installed_states(device)


# ------------------------------------------------------------------ the API


def snapshot(device=None, *, heap=None, recording=None, trace=None):
    """The snapshot dict torch.cuda.memory._snapshot() would give.

    With no arguments: every device of the installed allocator (device=:
    one), with the recording start_recording() left running on each.
    heap=: a Heap (a simulated device), as device `device` (default 0).
    recording=: a vramguard.record, running or stopped, whose events
    become `device_traces` (default: the running one of the heap).
    trace=: a Trace, replayed on a fresh simulated device."""
    states = _states(device, heap, recording, trace)
    traces = [[] for _ in range(max(s.index for s in states) + 1)] if states else []
    segments = []
    for s in states:
        segs = s.segments()
        budget = s.heap.budget or 0
        entries = trace_entries(s.data, s.reserved_start, budget, s.frames_of)
        traces[s.index] = entries
        segments += segment_entries(segs, s.index, _alloc_frames(entries))
    snap = {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": allocator_settings(states[0].heap) if states else {},
        "external_annotations": [],
    }
    if any(s.dropped for s in states):  # load_trace carries it into meta['dropped_events']
        dropped = [0] * len(traces)
        for s in states:
            dropped[s.index] = s.dropped
        snap[DROPPED_KEY] = dropped
    return snap


def dump_snapshot(path, device=None, *, heap=None, recording=None, trace=None):
    """Write snapshot(...) to `path` as PyTorch's _dump_snapshot() does (a
    pickle), for pytorch.org/memory_viz, torch.cuda._memory_viz and
    vramguard.load_trace. The file appears whole or not at all (written and
    synced to a temporary file beside it, then renamed over `path`); a file
    it replaces keeps its permission bits, and a symbolic link at `path`
    has its target written, as open(path, "wb") would."""
    path = os.fspath(path)
    target = _file_target(path)
    data = pickle.dumps(snapshot(device, heap=heap, recording=recording, trace=trace))
    write_atomically(target, data)


def _file_target(path):
    """The file a write to `path` lands in (a link's target), refused
    up front when it is a directory: else the temporary file would be made
    in the wrong place and the rename's error would name it."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    target = os.path.realpath(path) if path else path
    if not path or path.endswith(os.sep) or os.path.isdir(target):
        raise IsADirectoryError(errno.EISDIR, "is a directory: dump_snapshot writes a file", path)
    return target
