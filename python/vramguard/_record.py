"""Recording a heap's allocations into a Trace:

    with vramguard.record(heap) as rec:     # heap=None: the installed allocator
        ...train a step...
    vramguard.save_trace(rec.trace, "step.vgtrace")

The heap's event ring is off until recording starts and costs no allocation
per event while on. Memory already live when recording started shows up as
frees of unknown addresses; those allocations are seeded at the start of the
trace, as for PyTorch snapshots."""
import struct

from ._trace import TraceAssembler

__all__ = ["record", "start_recording", "stop_recording", "trace_from_events"]

_EVENT = struct.Struct("<QQQQQII")  # time_ns, addr, size, requested, stream, kind, pad
EV_ALLOC, EV_FREE, EV_RESERVE, EV_RELEASE, EV_RECORD_STREAM, EV_EMPTY_CACHE, EV_OOM = range(1, 8)
DEFAULT_CAPACITY = 1 << 20  # events: 48 MiB of host memory at most


def _resolve(heap):
    if heap is not None:
        return heap
    from ._torch import _current_device_heap  # only when no heap is named

    return _current_device_heap()


def trace_from_events(data, dropped=0, reserved_start=0, name="recording"):
    """A Trace from packed heap events (Heap.history_take()'s bytes)."""
    ops = TraceAssembler(name)
    reserved, peak, ooms, first_oom = reserved_start, reserved_start, 0, None
    for _t, addr, size, requested, stream, kind, _ in _EVENT.iter_unpack(data):
        if kind == EV_ALLOC:
            ops.alloc(addr, requested, stream)
        elif kind == EV_FREE:
            ops.free(addr, requested, stream)
        elif kind == EV_RESERVE:
            reserved += size
            peak = max(peak, reserved)
        elif kind == EV_RELEASE:
            reserved -= size
        elif kind == EV_EMPTY_CACHE:
            ops.empty_cache()
        elif kind == EV_OOM:
            ooms += 1
            if first_oom is None:
                first_oom = ops.position()
    trace = ops.finish()
    trace.meta.update(
        source="vramguard",
        recorded_peak_reserved_bytes=peak,
        recorded_reserved_start_bytes=reserved_start,
        recorded_ooms=ooms,
        recorded_first_oom=None if first_oom is None else ops.finish_index(first_oom),
        dropped_events=dropped,
    )
    return trace


class record:
    """Context manager: `with record(heap) as rec: ...`, then `rec.trace`.

    `capacity` bounds the ring (events); when a recording overflows it, the
    oldest events are lost and `rec.trace.meta['dropped_events']` says how
    many. A heap has one ring: recording a heap that is being recorded
    raises RuntimeError (recordings do not nest), and the first recording
    keeps every event."""

    def __init__(self, heap=None, capacity=DEFAULT_CAPACITY, name="recording"):
        self.heap = heap
        self.capacity = capacity
        self.name = name
        self.trace = None
        self._reserved_start = 0
        self._taken = bytearray()  # packed events drained from the ring so far
        self._dropped = 0
        self._running = False

    def start(self):
        self.heap = _resolve(self.heap)
        self._reserved_start = self.heap.stats()["reserved_bytes.all.current"]
        self.heap.history_start(self.capacity)
        self._running = True
        return self

    def stop(self):
        self.heap.history_stop()
        data, dropped = self.events()
        self._running = False
        self.trace = trace_from_events(data, dropped, self._reserved_start, self.name)
        global _last
        _last = self.trace
        return self.trace

    def events(self):
        """(packed events recorded so far, events dropped). Reading drains
        the heap's ring into this recording, so that a snapshot dumped while
        it runs (dump_snapshot) takes nothing away from stop()'s trace."""
        if self._running:  # once stopped, the ring may be another recording's
            data, self._dropped = self.heap.history_take()
            self._taken += data
        return bytes(self._taken), self._dropped

    @property
    def reserved_start(self):
        """Bytes the heap held in segments when recording started."""
        return self._reserved_start

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


_active = {}
_last = None  # the trace of the last recording stopped (vramguard.plot())


def last_trace():
    """The Trace of the last recording stopped, None before any."""
    return _last


def start_recording(heap=None, capacity=DEFAULT_CAPACITY, name="recording"):
    """Start recording `heap` (None: the installed allocator's current device)."""
    rec = record(heap, capacity, name).start()
    _active[id(rec.heap)] = rec
    return rec


def stop_recording(heap=None):
    """Stop the recording started on `heap`; returns its Trace."""
    heap = _resolve(heap)
    rec = _active.pop(id(heap), None)
    if rec is None:
        raise RuntimeError("no recording was started on this heap (call start_recording first)")
    return rec.stop()
