"""Allocation traces: the Trace type, and vramguard's own file format.

A trace is a sequence of ops kept as four columns (kinds, allocation ids,
sizes, streams), so that replaying it costs the C engine a pass over arrays
and costs Python nothing per op. See docs/trace-format.md for the file
layout.
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


class Trace:
    """Ops to replay: alloc(id, size, stream), free(id), empty_cache, synchronize.

    `meta` carries what is known of the recording: its name and source, and
    for PyTorch snapshots the native allocator's own reserved-memory peak
    (`recorded_peak_reserved_bytes`) and curve.
    """

    def __init__(self, name="trace", meta=None):
        self.kinds = array("B")
        self.ids = array("I")
        self.sizes = array("Q")
        self.streams = array("Q")
        self.nids = 0
        self.name = name
        self.meta = dict(meta or {})
        self._live = {}
        self._peak_live = None  # (ops when computed, value)

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

    def _append(self, kind, ident, size, stream):
        # Callers pass values already checked: a column that refused one
        # would leave the others a row longer.
        self.kinds.append(kind)
        self.ids.append(ident)
        self.sizes.append(size)
        self.streams.append(stream)

    # -------------------------------------------------------------- reading

    def __len__(self):
        return len(self.kinds)

    def __repr__(self):
        return f"<Trace {self.name!r}: {len(self)} ops, {self.nids} allocations>"

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

    def _new_id(self):
        self.nids += 1
        return self.nids - 1

    def alloc(self, addr, size, stream):
        if addr in self.live:  # a free we never saw: close it first
            self.ops.append((FREE, self.live.pop(addr), 0, 0))
        ident = self._new_id()
        self.live[addr] = ident
        self.ops.append((ALLOC, ident, size, stream))

    def free(self, addr, size, stream):
        ident = self.live.pop(addr, None)
        if ident is None:
            ident = self.seed(size, stream)
        self.ops.append((FREE, ident, 0, 0))

    def seed(self, size, stream):
        """An allocation live before recording began; returns its id."""
        ident = self._new_id()
        self.seeds.append((ALLOC, ident, size, stream))
        return ident

    def empty_cache(self):
        self.ops.append((EMPTY_CACHE, 0, 0, 0))

    def position(self):
        """The index the next op will have once the seeds are put first:
        pass it through finish_index() after the last seed is known."""
        return len(self.ops)

    def finish_index(self, position):
        return position + len(self.seeds)

    def finish(self):
        trace = Trace(self.name, self.meta)
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
    meta_bytes = json.dumps(meta, sort_keys=True).encode()
    body = meta_bytes + b"".join(
        _le_bytes(col) for col in (trace.kinds, trace.ids, trace.sizes, trace.streams)
    )
    header = _HEADER.pack(MAGIC, VERSION, 0, len(meta_bytes), len(trace), trace.nids, zlib.crc32(body))
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
    "recorded_reserved_start_bytes": (int, type(None)),
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
    magic, version, _flags, meta_len, n, nids, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise TraceFormatError(path, 0, "not a vramguard trace (bad magic)")
    if version != VERSION:
        raise TraceFormatError(path, 8, f"format version {version}; this vramguard reads version {VERSION}")
    # Counts are checked against what the file can hold before anything is
    # sized from them: every id needs an op, every op OP_BYTES.
    if nids > n:
        raise TraceFormatError(path, 24, f"header claims {nids} allocation ids for {n} ops (each id needs an op)")
    need = _HEADER.size + meta_len + n * OP_BYTES
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
    for attr, code, width in (("kinds", "B", 1), ("ids", "I", 4), ("sizes", "Q", 8), ("streams", "Q", 8)):
        setattr(trace, attr, _column(code, data[offset:offset + n * width]))
        offset += n * width
    trace.nids = nids
    try:
        trace.peak_live()  # validates ids, kinds and pairing in C
    except ValueError as exc:
        raise TraceFormatError(path, _HEADER.size + meta_len, str(exc)) from None
    return trace
