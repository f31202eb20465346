"""Allocation traces: the Trace type, and vramguard's own file format.

A trace is a sequence of ops kept as four columns (kinds, allocation ids,
sizes, streams), so that replaying it costs the C engine a pass over arrays
and costs Python nothing per op; a fifth, when the source numbers its events
(a PyTorch snapshot, a lifetime log), says which event each op came from, so
that a report can name the event the user will find in the source. See
docs/trace-format.md for the file layout.
"""
import gzip
import json
import operator
import struct
import sys
import zlib
from array import array

from .. import _core
from .stacks import MAX_STACK_DEPTH, StackTable
from ..render.words import a, count

ALLOC, FREE, EMPTY_CACHE, SYNCHRONIZE = 1, 2, 3, 4
KIND_NAMES = {ALLOC: "alloc", FREE: "free", EMPTY_CACHE: "empty_cache", SYNCHRONIZE: "synchronize"}

MAGIC = b"VGTRACE\x00"
VERSION = 1
_HEADER = struct.Struct("<8sHHIQII")  # magic, version, flags, meta len, ops, ids, crc32
#: Bytes one op takes in the columns (kind u8, id u32, size u64, stream u64).
OP_BYTES = 1 + 4 + 8 + 8
MAX_IDS = 1 << 32
MAX_STREAM = (1 << 64) - 1
#: The event of an op that has none in its source (an allocation seeded
#: from the state at dump time).
NO_EVENT = (1 << 64) - 1
#: Header flag: an event column (u64 per op) follows the streams.
FLAG_EVENTS = 1
#: Header flag: a stack column (u32 per op) follows, and the metadata's
#: "stack_table" holds the frames and stacks it indexes.
FLAG_STACKS = 2
#: An op with no stack (every op but an allocation, and allocations whose
#: source did not say).
NO_STACK = (1 << 32) - 1
#: What a stack table read from a file may hold: names and paths are cut to
#: this many characters when read from a snapshot, and longer ones refused
#: in a trace file.
MAX_NAME_CHARS = 4096
MAX_LINE = (1 << 31) - 1


class TraceFormatError(ValueError):
    """A trace file that cannot be read: names the file and the byte offset."""

    def __init__(self, path, offset, what):
        self.path, self.offset, self.what = str(path), offset, what
        super().__init__(f"{path}: offset {offset}: {what}")


def _column(typecode, data=b""):
    col = array(typecode)
    col.frombytes(data)
    if sys.byteorder != "little":
        col.byteswap()
    return col


def _le_bytes(col):
    if sys.byteorder == "little":
        return col.tobytes()
    swapped = array(col.typecode, col)
    swapped.byteswap()
    return swapped.tobytes()


def _short(value):
    """A metadata value as a summary shows it: long lists counted, not listed."""
    if isinstance(value, (list, tuple)) and len(value) > 4:
        return f"<{count(len(value), 'entry', 'entries')}>"
    if isinstance(value, dict) and len(repr(value)) > 60:
        return f"{{<{count(len(value), 'entry', 'entries')}>}}"
    return repr(value)


class TraceMeta(dict):
    """A trace's metadata: a dict, shown short (a snapshot's reserved curve
    is a thousand points; the repr says so instead of printing them)."""

    def __repr__(self):
        return "{" + ", ".join(f"{k!r}: {_short(v)}" for k, v in self.items()) + "}"

    def _repr_pretty_(self, printer, cycle):
        printer.text(repr(self))


class Trace:
    """Ops to replay: alloc(id, size, stream), free(id), empty_cache, synchronize.

    `meta` carries what is known of the recording: its name and source, and
    for PyTorch snapshots the native allocator's own reserved-memory peak
    (`recorded_peak_reserved_bytes`) and curve. `events`, when not None,
    holds for each op the index of the event it came from in its source
    (`meta['event_label']` says what those indices count), NO_EVENT for none.
    """

    def __init__(self, name="trace", meta=None):
        self.kinds = array("B")
        self.ids = array("I")
        self.sizes = array("Q")
        self.streams = array("Q")
        self.events = None
        # The Python stacks of allocations, where the source says: a
        # StackTable, and for each op its stack's index there (NO_STACK for
        # none), or None for a trace without stacks.
        self.stacks = None
        self.op_stacks = None
        self.nids = 0
        self.name = name
        self.meta = meta
        self._live = {}
        self._peak_live = None  # (ops when computed, value)

    @property
    def meta(self):
        return self._meta

    @meta.setter
    def meta(self, value):
        self._meta = TraceMeta(value or {})

    # -------------------------------------------------------------- building

    def alloc(self, size, stream=0, frames=None):
        """Append an allocation; returns its id for the matching free.
        `frames`, when given, is the stack that made it: (filename, line,
        function) tuples, innermost first. Everything is checked before
        anything is written, so a refused call leaves the trace as it was."""
        size = _whole(size, "an allocation's size")
        stream = _whole(stream, "a stream")
        if not 0 < size <= _core.MAX_REQUEST:
            raise ValueError(
                f"an allocation needs a positive int size of at most {_core.MAX_REQUEST} bytes "
                f"(the largest request a heap serves), got {size!r}"
            )
        if not 0 <= stream <= MAX_STREAM:
            raise ValueError(f"a stream is a handle from 0 to 2**64-1, got {stream!r}")
        if self.nids >= MAX_IDS:
            raise ValueError(f"a trace holds at most {MAX_IDS} allocations")
        stack = NO_STACK if frames is None else self._intern(_checked_frames(frames))
        ident = self.nids
        self.nids += 1
        self._append(ALLOC, ident, size, stream, stack=stack)
        self._live[ident] = size
        return ident

    def free(self, ident):
        if self._live.pop(ident, None) is None:
            raise ValueError(f"free of allocation {ident}, which is not live")
        self._append(FREE, ident, 0, 0)

    def empty_cache(self):
        self._append(EMPTY_CACHE, 0, 0, 0)

    def synchronize(self):
        self._append(SYNCHRONIZE, 0, 0, 0)

    def _intern(self, frames):
        if self.stacks is None:
            self.stacks = StackTable()
        if self.op_stacks is None:
            self.op_stacks = array("I", [NO_STACK]) * len(self)
        return self.stacks.stack(self.stacks.frame(*f) for f in frames)

    def _append(self, kind, ident, size, stream, event=NO_EVENT, stack=NO_STACK):
        # Callers pass values already checked: a column that refused one
        # would leave the others a row longer.
        self.kinds.append(kind)
        self.ids.append(ident)
        self.sizes.append(size)
        self.streams.append(stream)
        if self.events is not None:
            self.events.append(event)
        if self.op_stacks is not None:
            self.op_stacks.append(stack)

    # -------------------------------------------------------------- reading

    def __len__(self):
        return len(self.kinds)

    def __repr__(self):
        return f"<Trace {self.name!r}: {count(len(self), 'op')}, {count(self.nids, 'allocation')}>"

    def event_of(self, op):
        """The source's own index of the event behind op `op`, or None."""
        if self.events is None or not 0 <= op < len(self.events) or self.events[op] == NO_EVENT:
            return None
        return self.events[op]

    @property
    def event_label(self):
        """What event indices count ("snapshot event", "log op"); "op" for
        a trace whose source does not number its events."""
        return self.meta.get("event_label", "op") if self.events is not None else "op"

    def event_name(self, op, site=True):
        """How a report names op `op`: by its source's event when it has
        one, and (`site`) for an allocation by the line that made it when known."""
        event = self.event_of(op)
        if event is not None:
            name = f"{self.event_label} {event:,}"
        else:
            name = f"op {op:,}" if self.events is None else f"op {op:,} (live before recording began)"
        line = self.site_of(op) if site else None
        return f"{name}, {line}" if line else name

    def stack_of(self, op):
        """The index in `stacks` of the stack that made allocation op `op`, or None."""
        if self.op_stacks is None or not 0 <= op < len(self.op_stacks):
            return None
        stack = self.op_stacks[op]
        return None if stack == NO_STACK else stack

    def frames_of(self, op):
        """The stack that made allocation op `op` as (filename, line,
        function) tuples, innermost first; [] when the source does not say."""
        stack = self.stack_of(op)
        return [] if stack is None else self.stacks.frames_of(stack)

    def site_of(self, op):
        """"file.py:line function" that made allocation op `op` (its stack's
        innermost frame), when the source says."""
        stack = self.stack_of(op)
        return None if stack is None else self.stacks.label(stack)

    @property
    def sites(self):
        """{allocation id: "file.py:line function"} for the allocations whose
        stack is known (built on each call: site_of is the cheap way)."""
        if not self.has_stacks:
            return {}
        return {self.ids[op]: self.stacks.label(stack) for op, stack in enumerate(self.op_stacks)
                if stack != NO_STACK}

    @property
    def has_stacks(self):
        return self.op_stacks is not None and self.stacks is not None and len(self.stacks) > 0

    def columns(self):
        """(kinds, ids, sizes, streams) as bytes, as the C engine takes them."""
        return (self.kinds.tobytes(), self.ids.tobytes(), self.sizes.tobytes(), self.streams.tobytes())

    def peak_live(self):
        """Peak of live requested bytes: the physical limit of this workload.
        Computed once (and again only if ops were appended since): replays
        and budget searches ask for it every time."""
        if self._peak_live is None or self._peak_live[0] != len(self):
            kinds, ids, sizes, _ = self.columns()
            self._peak_live = (len(self), _core.trace_peak_live(kinds, ids, sizes, self.nids))
        return self._peak_live[1]

    @property
    def recorded_peak_reserved(self):
        """The native allocator's own peak reserved bytes, when recorded."""
        return self.meta.get("recorded_peak_reserved_bytes")

    def counts(self):
        return {name: self.kinds.count(kind) for kind, name in KIND_NAMES.items()}


def _whole(value, what):
    """An int from anything that is one (numpy's too), never from a bool."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None


class TraceAssembler:
    """Builds a Trace from events keyed by address, as recorders see them
    (PyTorch snapshots, vramguard's own ring): each allocation gets the next
    id, a free names the allocation live at its address, and a free of an
    address nobody allocated was live before recording began, so it is
    seeded as an allocation at the start of the trace."""

    def __init__(self, name, meta=None):
        self.name, self.meta = name, dict(meta or {})
        self.ops, self.seeds, self.live = [], [], {}
        self.nids = 0
        self.numbered = False  # whether any op named its source event
        self.stacks = StackTable()  # the sources' stacks, interned

    def _new_id(self):
        self.nids += 1
        return self.nids - 1

    def alloc(self, addr, size, stream, event=None, stack=None):
        """`stack`: an index into self.stacks, or None."""
        if addr in self.live:  # a free we never saw: close it first
            self.ops.append((FREE, self.live.pop(addr), 0, 0, self._event(event)))
        ident = self._new_id()
        self.live[addr] = ident
        self.ops.append((ALLOC, ident, size, stream, self._event(event),
                         NO_STACK if stack is None else stack))

    def free(self, addr, size, stream, event=None):
        ident = self.live.pop(addr, None)
        if ident is None:
            ident = self.seed(size, stream)
        self.ops.append((FREE, ident, 0, 0, self._event(event)))

    def _event(self, event):
        if event is None:
            return NO_EVENT
        self.numbered = True
        return event

    def seed(self, size, stream, stack=None):
        """An allocation live before recording began; returns its id."""
        ident = self._new_id()
        self.seeds.append((ALLOC, ident, size, stream, NO_EVENT, NO_STACK if stack is None else stack))
        return ident

    def live_at_start(self, addr, size, stream):
        """A block live when recording began, at `addr`: seeded, so that the
        trace holds it from its start whether it is freed later or not (a
        model's weights never are)."""
        self.live[addr] = self.seed(size, stream)

    def empty_cache(self, event=None):
        self.ops.append((EMPTY_CACHE, 0, 0, 0, self._event(event)))

    def position(self):
        """The index the next op will have once the seeds are put first:
        pass it through finish_index() after the last seed is known."""
        return len(self.ops)

    def finish_index(self, position):
        return position + len(self.seeds)

    def finish(self):
        trace = Trace(self.name, self.meta)
        if self.numbered:
            trace.events = array("Q")
        if len(self.stacks):
            trace.stacks, trace.op_stacks = self.stacks, array("I")
        for op in self.seeds + self.ops:
            trace._append(*op)
        trace.nids = self.nids
        trace.meta["seeded_allocations"] = len(self.seeds)
        return trace


# ------------------------------------------------------------------ saving


def save_trace(trace, path, compress=None):
    """Write `trace` in vramguard's format; gzip-compressed when `compress`
    is true or, by default, when the path ends in .gz."""
    path = str(path)
    meta = dict(trace.meta, name=trace.name)
    if trace.has_stacks:
        meta[STACK_TABLE_KEY] = {"frames": [list(f) for f in trace.stacks.frames],
                                 "stacks": [list(s) for s in trace.stacks.stacks]}
    meta_bytes = json.dumps(meta, sort_keys=True).encode()
    body = meta_bytes + b"".join(
        _le_bytes(col) for col in (trace.kinds, trace.ids, trace.sizes, trace.streams)
    )
    flags = 0
    if trace.events is not None:
        flags |= FLAG_EVENTS
        body += _le_bytes(trace.events)
    if trace.has_stacks:
        flags |= FLAG_STACKS
        body += _le_bytes(trace.op_stacks)
    header = _HEADER.pack(MAGIC, VERSION, flags, len(meta_bytes), len(trace), trace.nids, zlib.crc32(body))
    data = header + body
    if compress is None:
        compress = path.endswith(".gz")
    if compress:
        data = gzip.compress(data, mtime=0)
    with open(path, "wb") as f:
        f.write(data)


#: Metadata vramguard itself reads, and the types it reads them as; the
#: rest is carried along as it is.
_META_TYPES = {
    "name": (str,), "source": (str,), "recorded_peak_reserved_bytes": (int, type(None)),
    "recorded_reserved_start_bytes": (int, type(None)), "event_label": (str,),
}


def _check_meta(meta):
    if not isinstance(meta, dict):
        raise ValueError("metadata is not an object")
    for key, types in _META_TYPES.items():
        value = meta.get(key)
        if key in meta and (type(value) not in types or (type(value) is int and not 0 <= value <= MAX_STREAM)):
            want = "a str" if str in types else "an int from 0 to 2**64-1 or null"
            got = value if type(value) is int else a(type(value).__name__)
            raise ValueError(f"'{key}' must be {want}, not {got}")


def parse_vgtrace(data, path):
    """A Trace from the bytes of a vramguard trace file."""
    if len(data) < _HEADER.size:
        raise TraceFormatError(path, len(data), f"truncated header ({len(data)} of {_HEADER.size} bytes)")
    magic, version, flags, meta_len, n, nids, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise TraceFormatError(path, 0, "not a vramguard trace (bad magic)")
    if version != VERSION:
        raise TraceFormatError(path, 8, f"format version {version}; this vramguard reads version {VERSION}")
    if flags & ~(FLAG_EVENTS | FLAG_STACKS):
        raise TraceFormatError(path, 10, f"unknown flags {flags:#x}; this vramguard reads flags "
                                         f"{FLAG_EVENTS | FLAG_STACKS:#x} only")
    op_bytes = OP_BYTES + (8 if flags & FLAG_EVENTS else 0) + (4 if flags & FLAG_STACKS else 0)
    # Counts are checked against what the file can hold before anything is
    # sized from them: every id needs an op, every op OP_BYTES.
    if nids > n:
        raise TraceFormatError(path, 24, f"header claims {count(nids, 'allocation id')} for {count(n, 'op')} "
                                         "(each id needs an op)")
    need = _HEADER.size + meta_len + n * op_bytes
    if len(data) < need:
        raise TraceFormatError(path, len(data), f"truncated: {len(data)} bytes of {need} for {count(n, 'op')}")
    if len(data) > need:
        raise TraceFormatError(path, need, f"{count(len(data) - need, 'unexpected byte')} after the last column")
    body = memoryview(data)[_HEADER.size:]
    if zlib.crc32(body) != crc:
        raise TraceFormatError(path, _HEADER.size, "checksum mismatch: the file is corrupt")
    try:
        meta = json.loads(bytes(body[:meta_len]).decode())
        _check_meta(meta)
        table = _stack_table(meta.pop(STACK_TABLE_KEY, None), flags & FLAG_STACKS)
    except (ValueError, RecursionError) as exc:  # JSON nested past the recursion limit
        raise TraceFormatError(path, _HEADER.size, f"bad metadata: {exc}") from None
    trace = Trace(meta.pop("name", "trace"), meta)
    offset = _HEADER.size + meta_len
    columns = [("kinds", "B", 1), ("ids", "I", 4), ("sizes", "Q", 8), ("streams", "Q", 8)]
    if flags & FLAG_EVENTS:
        columns.append(("events", "Q", 8))
    if flags & FLAG_STACKS:
        columns.append(("op_stacks", "I", 4))
    for attr, code, width in columns:
        setattr(trace, attr, _column(code, data[offset:offset + n * width]))
        offset += n * width
    trace.nids = nids
    if flags & FLAG_STACKS:
        trace.stacks = table
        bad = _bad_stack_op(trace)
        if bad is not None:
            raise TraceFormatError(path, offset - 4 * n + 4 * bad,
                                   f"op {bad}: stack {trace.op_stacks[bad]} is not in the stack table "
                                   f"({count(len(table), 'stack')}), or the op is not an allocation")
    try:
        trace.peak_live()  # validates ids, kinds and pairing in C
    except ValueError as exc:
        raise TraceFormatError(path, _HEADER.size + meta_len, str(exc)) from None
    return trace


# ------------------------------------------------------------------ stacks

#: The metadata key that holds a trace file's stack table.
STACK_TABLE_KEY = "stack_table"


def _checked_frames(frames):
    """A stack as Trace.alloc takes it: 1 to MAX_STACK_DEPTH (filename,
    line, function) tuples."""
    frames = [tuple(f) for f in frames]
    if not 1 <= len(frames) <= MAX_STACK_DEPTH:
        raise ValueError(f"a stack holds 1 to {MAX_STACK_DEPTH} frames, got {len(frames)}")
    for f in frames:
        if not (len(f) == 3 and type(f[0]) is str and type(f[1]) is int and type(f[2]) is str
                and 0 <= f[1] <= MAX_LINE and len(f[0]) <= MAX_NAME_CHARS and len(f[2]) <= MAX_NAME_CHARS):
            raise ValueError(f"a frame is (filename, line, function): a str, an int from 0 to {MAX_LINE} "
                             f"and a str of at most {MAX_NAME_CHARS} characters each")
    return frames


def _stack_table(value, flagged):
    """The StackTable of a file's metadata, every entry checked; a table
    without the flag (or the flag without one) is refused."""
    if not flagged:
        if value is not None:
            raise ValueError(f"'{STACK_TABLE_KEY}' present but the stack column flag is not set")
        return None
    if type(value) is not dict or type(value.get("frames")) is not list or type(value.get("stacks")) is not list:
        raise ValueError(f"'{STACK_TABLE_KEY}' must be an object with 'frames' and 'stacks' lists")
    frames, stacks = value["frames"], value["stacks"]
    for i, f in enumerate(frames):
        if type(f) is not list:
            raise ValueError(f"{STACK_TABLE_KEY}.frames[{i}] must be a [filename, line, function] list")
        try:
            _checked_frames([f])
        except ValueError as exc:
            raise ValueError(f"{STACK_TABLE_KEY}.frames[{i}]: {exc}") from None
    for i, st in enumerate(stacks):
        if (type(st) is not list or not 1 <= len(st) <= MAX_STACK_DEPTH
                or any(type(x) is not int or not 0 <= x < len(frames) for x in st)):
            raise ValueError(f"{STACK_TABLE_KEY}.stacks[{i}] must list 1 to {MAX_STACK_DEPTH} indices "
                             f"of frames (0 to {len(frames) - 1})")
    table = StackTable([tuple(f) for f in frames], [tuple(st) for st in stacks])
    if len(table.frames) != len(table._frame_ids) or len(table.stacks) != len(table._stack_ids):
        raise ValueError(f"'{STACK_TABLE_KEY}' repeats a frame or a stack (each is listed once)")
    return table


def _bad_stack_op(trace):
    """The first op whose stack is out of the table or not on an
    allocation, or None."""
    count, kinds = len(trace.stacks), trace.kinds
    for op, stack in enumerate(trace.op_stacks):
        if stack != NO_STACK and (stack >= count or kinds[op] != ALLOC):
            return op
    return None
