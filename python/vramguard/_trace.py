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

from . import _core

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
        return f"<{len(value):,} entries>"
    if isinstance(value, dict) and len(repr(value)) > 60:
        return f"{{<{len(value)} entries>}}"
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
        self.sites = {}  # allocation id -> "file.py:line function" where the source says
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

    def alloc(self, size, stream=0):
        """Append an allocation; returns its id for the matching free.
        Everything is checked before anything is written, so a refused call
        leaves the trace as it was."""
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
        ident = self.nids
        self.nids += 1
        self._append(ALLOC, ident, size, stream)
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

    def _append(self, kind, ident, size, stream, event=NO_EVENT):
        # Callers pass values already checked: a column that refused one
        # would leave the others a row longer.
        self.kinds.append(kind)
        self.ids.append(ident)
        self.sizes.append(size)
        self.streams.append(stream)
        if self.events is not None:
            self.events.append(event)

    # -------------------------------------------------------------- reading

    def __len__(self):
        return len(self.kinds)

    def __repr__(self):
        return f"<Trace {self.name!r}: {len(self):,} ops, {self.nids:,} allocations>"

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

    def site_of(self, op):
        """"file.py:line function" that made allocation op `op`, when the source says."""
        if not self.sites or self.kinds[op] != ALLOC:
            return None
        return self.sites.get(self.ids[op])

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
        self.sites = {}

    def _new_id(self):
        self.nids += 1
        return self.nids - 1

    def alloc(self, addr, size, stream, event=None, site=None):
        if addr in self.live:  # a free we never saw: close it first
            self.ops.append((FREE, self.live.pop(addr), 0, 0, self._event(event)))
        ident = self._new_id()
        self.live[addr] = ident
        if site is not None:
            self.sites[ident] = site
        self.ops.append((ALLOC, ident, size, stream, self._event(event)))

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

    def seed(self, size, stream):
        """An allocation live before recording began; returns its id."""
        ident = self._new_id()
        self.seeds.append((ALLOC, ident, size, stream, NO_EVENT))
        return ident

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
        for op in self.seeds + self.ops:
            trace._append(*op)
        trace.nids = self.nids
        trace.sites = self.sites
        trace.meta["seeded_allocations"] = len(self.seeds)
        return trace


# ------------------------------------------------------------------ saving


def save_trace(trace, path, compress=None):
    """Write `trace` in vramguard's format; gzip-compressed when `compress`
    is true or, by default, when the path ends in .gz."""
    path = str(path)
    meta = dict(trace.meta, name=trace.name)
    meta_bytes = json.dumps(meta, sort_keys=True).encode()
    body = meta_bytes + b"".join(
        _le_bytes(col) for col in (trace.kinds, trace.ids, trace.sizes, trace.streams)
    )
    flags = 0
    if trace.events is not None:
        flags |= FLAG_EVENTS
        body += _le_bytes(trace.events)
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
            got = value if type(value) is int else f"a {type(value).__name__}"
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
    if flags & ~FLAG_EVENTS:
        raise TraceFormatError(path, 10, f"unknown flags {flags:#x}; this vramguard reads flag {FLAG_EVENTS:#x} only")
    op_bytes = OP_BYTES + (8 if flags & FLAG_EVENTS else 0)
    # Counts are checked against what the file can hold before anything is
    # sized from them: every id needs an op, every op OP_BYTES.
    if nids > n:
        raise TraceFormatError(path, 24, f"header claims {nids} allocation ids for {n} ops (each id needs an op)")
    need = _HEADER.size + meta_len + n * op_bytes
    if len(data) < need:
        raise TraceFormatError(path, len(data), f"truncated: {len(data)} bytes of {need} for {n} ops")
    if len(data) > need:
        raise TraceFormatError(path, need, f"{len(data) - need} unexpected bytes after the last column")
    body = memoryview(data)[_HEADER.size:]
    if zlib.crc32(body) != crc:
        raise TraceFormatError(path, _HEADER.size, "checksum mismatch: the file is corrupt")
    try:
        meta = json.loads(bytes(body[:meta_len]).decode())
        _check_meta(meta)
    except (ValueError, RecursionError) as exc:  # JSON nested past the recursion limit
        raise TraceFormatError(path, _HEADER.size, f"bad metadata: {exc}") from None
    trace = Trace(meta.pop("name", "trace"), meta)
    offset = _HEADER.size + meta_len
    columns = [("kinds", "B", 1), ("ids", "I", 4), ("sizes", "Q", 8), ("streams", "Q", 8)]
    if flags & FLAG_EVENTS:
        columns.append(("events", "Q", 8))
    for attr, code, width in columns:
        setattr(trace, attr, _column(code, data[offset:offset + n * width]))
        offset += n * width
    trace.nids = nids
    try:
        trace.peak_live()  # validates ids, kinds and pairing in C
    except ValueError as exc:
        raise TraceFormatError(path, _HEADER.size + meta_len, str(exc)) from None
    return trace
