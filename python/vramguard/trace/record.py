"""Recording a heap's allocations into a Trace:

    with vramguard.record(heap) as rec:     # heap=None: the installed allocator
        ...train a step...
    vramguard.save_trace(rec.trace, "step.vgtrace")

The heap's event ring is off until recording starts and costs no allocation
per event while on. Memory already live when recording started (a model's weights) is
seeded at the start of the trace, read from the heap's live blocks as the
recording begins, so that a replay's peak holds it whether it is freed
later or not.

With `stacks=True` each allocation also keeps the Python stack that made it
(the innermost `stack_depth` frames of user code: not torch, vramguard or
the standard library), captured in C where the allocating thread holds the
GIL. PyTorch runs its ops without the GIL, so while such a recording runs, a
torch function mode on the recording thread sets each torch call's stack
aside before the op starts (csrc/python/py_stacks.c); allocations made by
other threads without the GIL (autograd's device threads) get no stack, nor
do a sub-interpreter's threads (a recording with stacks started in one
warns and keeps none). Once the program calls torch.compile, the mode
leaves the stack (Dynamo would trace it into the graphs it builds):
_watch_compile."""
import functools
import struct
import sys
import warnings

from .. import _core
from ..render.words import count
from .stacks import DEFAULT_STACK_DEPTH, capture_table, skip_rules
from .format import MAX_NAME_CHARS, TraceAssembler

__all__ = ["record", "start_recording", "stop_recording", "trace_from_events"]

EVENT = struct.Struct("<QQQQQII")  # time_ns, addr, size, requested, stream, kind, stack
EV_ALLOC, EV_FREE, EV_RESERVE, EV_RELEASE, EV_RECORD_STREAM, EV_EMPTY_CACHE, EV_OOM, EV_MAP, EV_UNMAP = range(1, 10)
DEFAULT_CAPACITY = 1 << 20  # events: 48 MiB of host memory at most


def resolve_heap(heap):
    if heap is not None:
        return heap
    from ..torch.device_heaps import current_device_heap  # only when no heap is named

    return current_device_heap()


def heap_key(heap):
    """What names a heap across calls: a device heap's Python object is
    made anew by each device_heap() call, so it is named by its device."""
    if heap is None:
        from ..torch.device_heaps import device_index

        return ("device", device_index(None))
    return id(heap)


def _stack_mapper(ops, captured):
    """Stack id of the extension -> index in the trace's own table (only
    the stacks the recording used travel with the trace)."""
    if captured is None:
        return lambda stack: None
    known = {}

    def trace_stack(stack):
        if not 0 < stack <= len(captured):
            return None
        index = known.get(stack)
        if index is None:
            # cut as a trace file keeps them: a path's end, a name's start
            frames = [(file[-MAX_NAME_CHARS:], line, func[:MAX_NAME_CHARS])
                      for file, line, func in captured.frames_of(stack - 1)]
            index = known[stack] = ops.stacks.stack(ops.stacks.frame(*f) for f in frames)
        return index

    return trace_stack


def live_blocks(heap):
    """{address: (requested bytes, stream)} of the heap's live blocks now."""
    return {blk["address"]: (blk["requested"], seg["stream"]) for seg in heap.segments()
            for blk in seg["blocks"] if blk["state"] == "live"}


def _seed_live_at_start(ops, data, live_start):
    """Seeds the blocks live when recording began. `live_start` was read
    just after the ring started: a block whose first event is its
    allocation was made after the start (the ring has it), any other was
    live before and is seeded; its free, if any, then names it."""
    first = {}
    for _t, addr, _size, _requested, _stream, kind, _stack in EVENT.iter_unpack(data):
        if addr in live_start and addr not in first and kind in (EV_ALLOC, EV_FREE):
            first[addr] = kind
    seeded = 0
    for addr, (requested, stream) in live_start.items():
        if first.get(addr) != EV_ALLOC:
            ops.live_at_start(addr, requested, stream)
            seeded += requested
    return seeded


def trace_from_events(data, dropped=0, reserved_start=0, name="recording", stacks=None, live_start=None):
    """A Trace from packed heap events (Heap.history_take()'s bytes);
    `stacks`, the extension's StackTable when the recording kept stacks;
    `live_start`, live_blocks() of the heap as the recording began (None:
    not known; what was live then shows only where it is freed)."""
    ops = TraceAssembler(name)
    trace_stack = _stack_mapper(ops, stacks)
    live_start_bytes = _seed_live_at_start(ops, data, live_start) if live_start else 0
    reserved, peak, ooms, first_oom = reserved_start, reserved_start, 0, None
    for _t, addr, size, requested, stream, kind, stack in EVENT.iter_unpack(data):
        if kind == EV_ALLOC:
            ops.alloc(addr, requested, stream, stack=trace_stack(stack) if stack else None)
        elif kind == EV_FREE:
            ops.free(addr, requested, stream)
        elif kind in (EV_RESERVE, EV_MAP):  # the arena's reserved memory is its mapped pages
            reserved += size
            peak = max(peak, reserved)
        elif kind in (EV_RELEASE, EV_UNMAP):
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
    if live_start_bytes:  # a recording that began on an empty heap reads as before
        trace.meta["recorded_live_start_bytes"] = live_start_bytes
    return trace


class record:
    """Context manager: `with record(heap) as rec: ...`, then `rec.trace`.

    `capacity` bounds the ring (events); when a recording overflows it, the
    oldest events are lost and `rec.trace.meta['dropped_events']` says how
    many. A heap has one ring: recording a heap that is being recorded
    raises RuntimeError (recordings do not nest), and the first recording
    keeps every event.

    `stacks=True` keeps each allocation's Python stack, `stack_depth` frames
    of user code at most (1 to vramguard.MAX_STACK_DEPTH, default
    DEFAULT_STACK_DEPTH); the trace then says which line made each
    allocation (`Trace.site_of`, `frames_of`), and `vramguard.live_by_line()`
    sums live memory by line meanwhile. The depth is the process's: while a
    recording with stacks runs, another with stacks must ask for the same
    depth (ValueError otherwise), so that neither cuts the other's stacks."""

    def __init__(self, heap=None, capacity=DEFAULT_CAPACITY, name="recording", stacks=False,
                 stack_depth=None):
        if stack_depth is not None:
            if not stacks:
                raise ValueError(f"stack_depth={stack_depth!r} is only used with stacks=True")
            if type(stack_depth) is not int:  # True is an int, but not a depth
                raise TypeError(f"stack_depth must be an int (frames), got {stack_depth!r}")
        self.heap = heap
        self.capacity = capacity
        self.name = name
        self.stacks = bool(stacks)
        self.stack_depth = DEFAULT_STACK_DEPTH if stack_depth is None else stack_depth
        self.trace = None
        self._reserved_start = 0
        self._taken = bytearray()  # packed events drained from the ring so far
        self._dropped = 0
        self._running = False
        self._mode = None
        self._not_kept_start = 0
        self._stacks_here = False  # the tables are this interpreter's (the main one)
        self._live_start = None  # live_blocks() as recording began

    def start(self):
        self._key = heap_key(self.heap)
        self.heap = resolve_heap(self.heap)
        self._reserved_start = self.heap.stats()["reserved_bytes.all.current"]
        if self.stacks:
            _check_same_depth(self)
            skip, keep = skip_rules()
            self._stacks_here = _core.stacks_configure(skip, keep, self.stack_depth)
            if not self._stacks_here:
                warnings.warn("record(stacks=True) in a sub-interpreter keeps no stacks: they are kept for "
                              "the main interpreter's threads only", RuntimeWarning, stacklevel=3)
            self._not_kept_start = _stacks_not_kept()
        self.heap.history_start(self.capacity, stacks=self.stacks)
        # after the start, so that no block is missed; trace_from_events
        # tells those allocated meanwhile by their events
        self._live_start = live_blocks(self.heap)
        if self.stacks:
            self._mode = _enter_stack_mode()
        self._running = True
        _running_on[id(self.heap)] = self
        return self

    def stop(self):
        if self._mode is not None:
            if self._mode in _active_modes:  # not taken off already by torch.compile (_retire_stack_modes)
                _active_modes.remove(self._mode)
                self._mode.__exit__(None, None, None)
            self._mode = None
        self.heap.history_stop()
        data, dropped = self.events()
        self._running = False
        if _running_on.get(id(self.heap)) is self:
            del _running_on[id(self.heap)]
        if self.stacks and not any(r.stacks for r in _running_on.values()):
            # what other threads set aside in ops still running is not
            # attached to a later recording's allocations
            _core.stacks_void_set_aside()
        if dropped:
            warnings.warn(f"recording {self.name!r} dropped its {count(dropped, 'oldest event')}: its ring holds "
                          f"capacity={self.capacity:,}; record again with a larger capacity= (the trace's "
                          f"peak and pairs are wrong without them)", RuntimeWarning, stacklevel=2)
        captured = capture_table()[0] if self.stacks else None
        self.trace = trace_from_events(data, dropped, self._reserved_start, self.name, captured,
                                       None if dropped else self._live_start)
        global _last
        _last = self.trace
        if self.stacks:
            self.trace.meta["stacks_not_kept"] = (_stacks_not_kept() - self._not_kept_start if self._stacks_here
                                                  else self.trace.counts()["alloc"])
            last_with_stacks[self._key] = self.trace
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


def _stacks_not_kept():
    """Captures that kept nothing since the process began: a table full, a
    capture inside another (a collection's finalizer), tables released
    meanwhile, a sub-interpreter's thread (stacks are the main
    interpreter's)."""
    return sum(_core.stacks_counts().values())


def _enter_stack_mode():
    """A torch function mode that sets each torch call's stack aside for
    the allocations its op makes without the GIL; None without torch."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor"):
        return None
    if _compile_called:  # the program compiles: no mode for Dynamo to trace (_watch_compile)
        return None
    _watch_compile(torch)
    mode = _stack_mode_class()()
    mode.__enter__()
    _active_modes.append(mode)
    return mode


_mode_class = []
_active_modes = []  # the stack modes entered and not yet exited
_compile_called = []  # non-empty once torch.compile was called in this process


def _watch_compile(torch):
    """Once torch.compile is called, the stack modes leave the torch function
    mode stack for the rest of the process. Dynamo traces any mode on that
    stack into the graphs it builds, and with this one in them a compiled
    program could run otherwise (nanoGPT's compiled forward failed in its
    evaluation: `idx.size()` unpacked a torch.device). Compiled code and what
    runs with the GIL still get their stacks from the Python frames at each
    allocation; only an op that allocates without the GIL loses the stack set
    aside for it."""
    if getattr(torch.compile, "_vramguard_watches", False):
        return
    original = torch.compile

    @functools.wraps(original)
    def compile(*args, **kwargs):
        _retire_stack_modes(torch)
        return original(*args, **kwargs)

    compile._vramguard_watches = True
    torch.compile = compile


def _retire_stack_modes(torch):
    """The stack modes taken off the torch function mode stack, the other
    modes left in their order."""
    _compile_called.append(True)
    if not _active_modes:
        return
    stack = []
    while torch._C._len_torch_function_stack() > 0:
        stack.append(torch._C._pop_torch_function_stack())
    for mode in reversed(stack):
        if mode not in _active_modes:
            torch._C._push_on_torch_function_stack(mode)
    _active_modes.clear()


def _stack_mode_class():
    if not _mode_class:
        from torch.compiler import is_compiling
        from torch.overrides import TorchFunctionMode

        class StackAside(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                # Dynamo traces this mode into the graph it builds, and cannot
                # trace the extension's calls: it would break the graph at every
                # torch call, and the compiled program would be another. Tracing
                # reads is_compiling() as True and keeps only the call. The
                # compiled code allocates its buffers with the GIL held, so
                # their stacks are read from its frames (py_stacks.c), the
                # frames Inductor generated left out (stacks.skip_rules).
                if is_compiling():
                    return func(*args, **(kwargs or {}))
                before = _core.stacks_push()
                try:
                    return func(*args, **(kwargs or {}))
                finally:
                    _core.stacks_pop(before)

        _mode_class.append(StackAside)
    return _mode_class[0]


_active = {}  # id(heap) -> the recording start_recording() started on it
_running_on = {}  # id(heap) -> the recording running on it, however started


def running_recording(heap):
    """The recording running on `heap` (a `with record(heap)` or a
    start_recording()), None when none is."""
    rec = _running_on.get(id(heap))
    return rec if rec is not None and rec.heap is heap else None


def _check_same_depth(rec):
    for other in list(_running_on.values()):
        if other.stacks and other.stack_depth != rec.stack_depth:
            raise ValueError(f"a recording with stacks at stack_depth={other.stack_depth} is running; this one "
                             f"asks for stack_depth={rec.stack_depth}: the depth is the process's, so "
                             f"recordings that run together share one")
_last = None  # the trace of the last recording stopped (vramguard.plot())


def last_trace():
    """The Trace of the last recording stopped, None before any."""
    return _last


#: The last trace with stacks recorded from each heap (by heap_key): what the
#: summary names the holders at the peak from.
last_with_stacks = {}


def start_recording(heap=None, capacity=DEFAULT_CAPACITY, name="recording", stacks=False,
                    stack_depth=None):
    """Start recording `heap` (None: the installed allocator's current device)."""
    rec = record(heap, capacity, name, stacks, stack_depth).start()
    _active[id(rec.heap)] = rec
    return rec


def stop_in_favour_of(rec, heap):
    """Stops `rec`, a recording started with start_recording(), where
    another is about to start on the same heap (`heap`, or the installed
    allocator's current device's): True when it did. A heap has one
    recording at a time; the dry run's own gives way to the script's."""
    if rec is None or not rec._running or resolve_heap(heap) is not rec.heap:
        return False
    rec.stop()
    _active.pop(id(rec.heap), None)
    return True


def stop_recording(heap=None):
    """Stop the recording started on `heap`; returns its Trace."""
    heap = resolve_heap(heap)
    rec = _active.pop(id(heap), None)
    if rec is None:
        raise RuntimeError("no recording was started on this heap (call start_recording first)")
    return rec.stop()
