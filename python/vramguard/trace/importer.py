"""Reading traces others recorded: PyTorch memory snapshots (the pickle that
torch.cuda.memory._dump_snapshot() writes, read without importing torch) and
buffer lifetime logs (`alloc_op free_op size` per line). load_trace() picks
the reader from the file's first bytes.

Every reader treats its file as hostile: a field of the wrong type is a
TraceFormatError, not a crash, and what reading costs is bounded by the
file's size (see Allowance)."""
import gzip
import io
import os
import pickle
import zlib
from array import array

from .. import _core
from ..render.words import a
from .stacks import MAX_STACK_DEPTH
from .format import MAGIC, MAX_LINE, OP_BYTES, Trace, TraceAssembler, TraceFormatError, parse_vgtrace

__all__ = ["load_trace", "trace_from_snapshot", "trace_from_lifetimes"]

ENV_MAX_EXPANSION = "VRAMGUARD_MAX_EXPANSION"
#: How many times its size on disk a trace file may grow while it is read.
#: Real files stay near 15x (gzip of a trace or of a snapshot, the columns
#: of a snapshot's ops); a gzip bomb or a pickle that names one record a
#: million times goes far past it.
DEFAULT_MAX_EXPANSION = 128
#: Small files may always grow this far.
MIN_ALLOWANCE = 1 << 20
_U64 = (1 << 64) - 1
_CHUNK = 1 << 20


# ------------------------------------------------------------------ limits


def _expansion_factor(max_expansion):
    source = "max_expansion"
    if max_expansion is None:
        max_expansion = os.environ.get(ENV_MAX_EXPANSION) or DEFAULT_MAX_EXPANSION
        source = ENV_MAX_EXPANSION
    if isinstance(max_expansion, str):
        try:
            max_expansion = int(max_expansion)
        except ValueError:
            raise ValueError(f"{source} must be a positive integer, got {max_expansion!r}") from None
    if isinstance(max_expansion, bool) or not isinstance(max_expansion, int) or max_expansion < 1:
        raise ValueError(f"{source} must be a positive integer, got {max_expansion!r}")
    return max_expansion


class Allowance:
    """What reading one file may cost: `factor` times its size on disk (at
    least MIN_ALLOWANCE bytes), both in inflated bytes and in trace columns
    (OP_BYTES for each op or snapshot record read). Going past it is a
    TraceFormatError that says how to raise it."""

    def __init__(self, path, file_bytes, factor):
        self.path, self.file_bytes, self.factor = path, file_bytes, factor
        self.bytes = max(MIN_ALLOWANCE, factor * file_bytes) if factor else float("inf")
        self.records = 0

    @classmethod
    def unlimited(cls, path):
        """For a snapshot already in memory: there is no file size to bound it
        by (load_trace is the reader for files nobody vouches for)."""
        return cls(path, 0, None)

    def refuse(self, what, offset=0):
        raise TraceFormatError(
            self.path, offset,
            f"{what} more than {self.factor} times the file's {self.file_bytes} bytes "
            f"(the cap is {self.bytes} bytes); if the file is trusted, raise the cap with "
            f"load_trace(..., max_expansion=N) or {ENV_MAX_EXPANSION}=N",
        )

    def charge(self, records=1):
        """Count records read; refuse once their columns would pass the cap.
        A pickle can name one record many times for two bytes each."""
        self.records += records
        if self.records * OP_BYTES > self.bytes:
            self.refuse("its snapshot names records whose ops would take")


def _read_capped(f, allowance, what):
    """All of `f`, a chunk at a time, never past the allowance."""
    chunks, total = [], 0
    while True:
        chunk = f.read(_CHUNK)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > allowance.bytes:
            allowance.refuse(what)
        chunks.append(chunk)


def _inflate(f, path, allowance):
    """The decompressed bytes of a gzip file, never past the allowance."""
    try:
        with gzip.GzipFile(fileobj=f, mode="rb") as z:
            return _read_capped(z, allowance, "it decompresses to")
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(path, 0, f"broken gzip stream: {exc}") from None


# ------------------------------------------------------------------ dispatch


def load_trace(path, device=None, max_expansion=None):
    """A Trace from a vramguard trace file (.vgtrace, optionally gzipped), a
    PyTorch memory snapshot pickle (optionally gzipped), or a lifetime log.
    Unreadable input raises TraceFormatError naming the file and the byte
    offset. A file may grow at most `max_expansion` times its size while it
    is read (default: VRAMGUARD_MAX_EXPANSION, else 128)."""
    path = str(path)
    factor = _expansion_factor(max_expansion)
    with open(path, "rb") as f:
        return read_trace_bytes(f, path, device, Allowance(path, os.fstat(f.fileno()).st_size, factor))


def read_trace_bytes(f, path, device, allowance):
    """A Trace from an open binary file of any format load_trace reads."""
    head = f.read(2)
    if head == b"\x1f\x8b":
        f.seek(0)
        data = _inflate(f, path, allowance)
    else:  # not seekable, maybe, and endless (/dev/zero): read on, within bounds
        data = head + _read_capped(f, allowance, "it reads as")
    if data.startswith(MAGIC):
        return parse_vgtrace(data, path)
    if data[:1] == b"\x80":
        return _read_snapshot(data, path, device, allowance)
    return trace_from_lifetimes(data, path)


# ------------------------------------------------------------------ snapshots


class _PlainDataUnpickler(pickle.Unpickler):
    """Snapshots are plain dicts and lists: refuse every class, so a crafted
    file cannot run code and torch is never imported."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refers to {module}.{name}; only plain data is read")


def _unpickle(data, path):
    # First a walk over the opcodes in C: the unpickler itself would crash
    # hashing a dict key nested 200,000 tuples deep.
    problem = _core.pickle_problem(data)
    if problem is not None:
        offset, why = problem
        raise TraceFormatError(path, offset, f"not a readable snapshot pickle: {why}")
    stream = io.BytesIO(data)
    try:
        return _PlainDataUnpickler(stream).load()
    except Exception as exc:  # pickle raises many types on corrupt input
        raise TraceFormatError(path, stream.tell(), f"not a readable snapshot pickle: {exc}") from None


def _read_snapshot(data, path, device, allowance):
    snapshot = _unpickle(data, path)
    return trace_from_snapshot(snapshot, path, device=device, allowance=allowance)


def _describe(value):
    """A value for a message, short whatever it is (never its repr: a
    crafted one can be deep or huge)."""
    if type(value) is int:
        return str(value) if value.bit_length() <= 64 else f"an int of {value.bit_length()} bits"
    return a(type(value).__name__)


class _Fields:
    """Typed reads from the records of one snapshot: every field is checked
    before use, and a wrong one names the record."""

    def __init__(self, path):
        self.path = path

    def bad(self, where, what):
        raise TraceFormatError(self.path, 0, f"unexpected snapshot structure: {where}: {what}")

    def u64(self, record, key, where, default=0):
        value = record.get(key, default)
        if type(value) is not int or not 0 <= value <= _U64:
            self.bad(where, f"'{key}' must be an int from 0 to 2**64-1, not {_describe(value)}")
        return value

    def text(self, record, key, where):
        value = record.get(key)
        if value is not None and type(value) is not str:
            self.bad(where, f"'{key}' must be a str, not {_describe(value)}")
        return value

    def records(self, value, where, allowance):
        """A list of dicts, each charged to the allowance as it is read."""
        if type(value) is not list:
            self.bad(where, f"must be a list, not {_describe(value)}")
        for i, record in enumerate(value):
            allowance.charge()
            if type(record) is not dict:
                self.bad(f"{where}[{i}]", f"must be a dict, not {_describe(record)}")
            yield i, record


#: The key a vramguard snapshot names its recordings' dropped events by
#: (written only when some were; PyTorch's readers ignore keys they do not use).
DROPPED_KEY = "vramguard_dropped_events"


def _pick_device(snapshot, device, fields):
    if type(snapshot) is not dict or type(snapshot.get("device_traces")) is not list:
        raise TraceFormatError(fields.path, 0, "snapshot has no 'device_traces' list")
    traces = snapshot["device_traces"]
    for i, events in enumerate(traces):
        if type(events) is not list:
            fields.bad(f"device_traces[{i}]", f"must be a list, not {_describe(events)}")
    if device is None:
        candidates = [i for i, t in enumerate(traces) if t]
        if not candidates:
            raise TraceFormatError(fields.path, 0, "snapshot holds no events (was _record_memory_history() on?)")
        device = max(candidates, key=lambda i: len(traces[i]))
    if type(device) is not int:
        raise TypeError(f"device must be an int, not {type(device).__name__}")
    if not 0 <= device < len(traces):
        raise TraceFormatError(fields.path, 0, f"no device {device}; the snapshot has {len(traces)}")
    return device, traces[device]


def _state_at_dump(snapshot, device, fields, allowance):
    """(blocks allocated at dump time as (address, requested size, stream,
    frames), bytes the device's segments held then)."""
    live, reserved = [], 0
    for i, seg in fields.records(snapshot.get("segments", []), "segments", allowance):
        where = f"segments[{i}]"
        if fields.u64(seg, "device", where, default=device) != device:
            continue
        addr = fields.u64(seg, "address", where)
        stream = fields.u64(seg, "stream", where)
        reserved += fields.u64(seg, "total_size", where)
        for j, blk in fields.records(seg.get("blocks", []), f"{where}.blocks", allowance):
            at = f"{where}.blocks[{j}]"
            size = fields.u64(blk, "size", at)
            if fields.text(blk, "state", at) in ("active_allocated", "active_pending_free"):
                requested = fields.u64(blk, "requested_size", at) if blk.get("requested_size") is not None else 0
                live.append((fields.u64(blk, "address", at, default=addr), requested or size, stream,
                             blk.get("frames")))
            addr += size
    return live, reserved


#: Actions that change what the native allocator holds, and by how much.
_GROWS = ("segment_alloc", "segment_map")
_SHRINKS = ("segment_free", "segment_unmap")


def _most_reserved(events, fields, where, allowance):
    """The most the native allocator held over `events`, relative to the
    start: what the device was seen to hold, against which a release is
    judged forced or not (see _SnapshotReader.end_burst). Looks at no more
    events than the allowance lets the main pass read."""
    now = most = 0
    readable = max(int(min(allowance.bytes, 1 << 62)) // OP_BYTES - allowance.records, 0)
    for i, ev in enumerate(events[:readable + 1]):
        if type(ev) is not dict:
            continue  # the main pass names it
        action = ev.get("action")
        if action in _GROWS:
            now += fields.u64(ev, "size", f"{where}[{i}]")
            most = max(most, now)
        elif action in _SHRINKS:
            now -= fields.u64(ev, "size", f"{where}[{i}]")
    return most


class _SnapshotReader:
    """One pass over a device's events: ops through a TraceAssembler, and
    the native allocator's reserved-memory curve beside them."""

    def __init__(self, name, fields, most_reserved):
        self.ops = TraceAssembler(name)
        self.fields = fields
        self.most_reserved = most_reserved  # relative to the start, like `reserved`
        self.reserved = 0      # relative to the start
        self.curve = []        # (op position, reserved) at each change
        self.freeing = None    # inside a burst of segment_free: (its first event, reserved before it)
        self.empty_caches = 0
        self.retries = 0

    def end_burst(self, next_action, next_size=0):
        """Close a burst of segment frees or unmaps: an empty_cache() call,
        named by its first event, unless PyTorch's allocator released on its
        own because the device was full (release and retry): then an OOM
        entry follows at once, or a new segment that, without the release,
        would have taken the device past the most it was ever seen to hold.
        A program's empty_cache() is followed by a new segment too (the
        cache is empty), but one the device had room for."""
        if self.freeing is not None:
            first, before = self.freeing
            forced = next_action == "oom" or (
                next_action in _GROWS and before + next_size > self.most_reserved)
            if forced:
                self.retries += 1
            else:
                self.ops.empty_cache(first)
                self.empty_caches += 1
        self.freeing = None

    def event(self, ev, where, index):
        """Read event number `index` of the device's trace: each op keeps
        that number, the one memory_viz shows."""
        f = self.fields
        action = f.text(ev, "action", where)
        size, stream = f.u64(ev, "size", where), f.u64(ev, "stream", where)
        # An OOM entry carries device_free where others carry addr.
        addr = 0 if action == "oom" else f.u64(ev, "addr", where)
        if action not in _SHRINKS:
            self.end_burst(action, size)
        if action == "alloc":
            self.ops.alloc(addr, size, stream, index, self.stack(ev.get("frames")))
        elif action == "free_completed":
            self.ops.free(addr, size, stream, index)
        elif action in _GROWS:
            self.reserved += size
            self.curve.append((self.ops.position(), self.reserved))
        elif action in _SHRINKS:
            if self.freeing is None:
                self.freeing = (index, self.reserved)
            self.reserved -= size
            self.curve.append((self.ops.position(), self.reserved))

    def stack(self, frames):
        """The stack that made an allocation, interned in the trace's
        StackTable: the innermost MAX_STACK_DEPTH frames of Python code
        outside torch, or the innermost frame when there is none; None when
        the event has no readable frame. Frames are optional: malformed ones
        are skipped, at most _FRAMES_LOOKED_AT are looked at, and paths and
        names are cut to _PATH_TAIL characters, so that a crafted list
        shared by every event costs little."""
        if type(frames) is not list:
            return None
        table, first, kept = self.ops.stacks, None, []
        for frame in frames[:_FRAMES_LOOKED_AT]:
            if type(frame) is not dict:
                continue
            filename, line, name = frame.get("filename"), frame.get("line"), frame.get("name")
            if type(filename) is not str or type(line) is not int or type(name) is not str:
                continue
            if not 0 <= line <= MAX_LINE:
                continue
            tail = filename[-_PATH_TAIL:]  # a crafted path can be long: look at its end only
            key = (tail, line, name[:_PATH_TAIL])
            if first is None:
                first = key
            if tail.endswith(".py") and not _is_torch_file(tail):
                kept.append(table.frame(*key))
                if len(kept) == MAX_STACK_DEPTH:
                    break
        if not kept and first is not None:
            kept.append(table.frame(*first))
        return table.stack(kept) if kept else None


#: Frames looked at per event to find the line that allocated, and the
#: characters of a path or function name read: what a crafted snapshot
#: can make one event cost.
_FRAMES_LOOKED_AT = 64
_PATH_TAIL = 200


def _is_torch_file(path_tail):
    path = path_tail.replace("\\", "/")
    return "/torch/" in path or path.startswith("torch/")


def _envelope(curve, points=1000):
    if len(curve) <= points:
        return curve
    step = -(-len(curve) // points)
    return [max(curve[i:i + step], key=lambda p: p[1]) for i in range(0, len(curve), step)]


def _plain_settings(settings):
    """The allocator settings as JSON can hold them: str keys, scalar values
    and one level of nesting (roundup_power2_divisions); the rest dropped, so
    that a crafted snapshot cannot make saving the trace expensive."""
    def scalar(v):
        return v is None or type(v) in (bool, float, str) or (type(v) is int and v.bit_length() <= 64)

    def flat(d, limit=256):
        out = {}
        for k, v in list(d.items())[:limit]:
            if type(k) in (str, int) and (type(k) is str or k.bit_length() <= 64) and scalar(v):
                out[str(k)] = v[:1000] if type(v) is str else v
        return out

    if type(settings) is not dict:
        return {}
    out = flat(settings)
    for k, v in list(settings.items())[:256]:
        if type(k) is str and type(v) is dict:
            out[k] = flat(v)
    return out


def _dropped_events(snapshot, device, fields):
    """Events the recording behind a vramguard snapshot lost to its full
    ring (DROPPED_KEY: one count per device); 0 for PyTorch's snapshots."""
    counts = snapshot.get(DROPPED_KEY, [])
    if type(counts) is not list:
        fields.bad(DROPPED_KEY, f"must be a list, not {_describe(counts)}")
    if device >= len(counts):
        return 0
    return fields.u64({"count": counts[device]}, "count", f"{DROPPED_KEY}[{device}]")


def trace_from_snapshot(snapshot, path="snapshot", device=None, allowance=None):
    """A Trace from a loaded snapshot dict: `alloc` and `free_completed`
    events become ops; memory live before recording began is seeded at the
    start; bursts of `segment_free` (or `segment_unmap`) become
    empty_cache() unless the device was full (docs/trace-format.md); the
    native `segment_alloc`/`segment_free` curve is kept as the baseline in
    `meta`. Every field is type-checked; `allowance`
    bounds the records read (load_trace passes one sized from the file)."""
    fields = _Fields(path)
    allowance = allowance or Allowance.unlimited(path)
    device, events = _pick_device(snapshot, device, fields)
    name = str(path).rsplit("/", 1)[-1].split(".")[0]
    reader = _SnapshotReader(name, fields, _most_reserved(events, fields, f"device_traces[{device}]", allowance))
    for i, ev in fields.records(events, f"device_traces[{device}]", allowance):
        reader.event(ev, f"device_traces[{device}][{i}]", i)
    reader.end_burst(None)
    ops = reader.ops
    live, at_dump = _state_at_dump(snapshot, device, fields, allowance)
    for addr, size, stream, frames in live:
        if addr not in ops.live and size > 0:  # live all along
            ops.seed(size, stream, reader.stack(frames))
    # Reserved at the start: what the segments held at dump time, less the
    # net growth the events show.
    start = max(at_dump - reader.reserved, 0)
    curve = [(0, start)] + [(ops.finish_index(at), start + r) for at, r in reader.curve]
    trace = ops.finish()
    trace.meta.update(
        source="pytorch-snapshot",
        device=device,
        event_label="snapshot event",
        source_events=len(events),
        recorded_peak_reserved_bytes=max(r for _, r in curve) if reader.curve else None,
        recorded_reserved_start_bytes=start,
        recorded_reserved_curve=_envelope(curve),
        empty_cache_calls=reader.empty_caches,
        native_release_retries=reader.retries,
        allocator_settings=_plain_settings(snapshot.get("allocator_settings", {})),
        dropped_events=_dropped_events(snapshot, device, fields),
    )
    try:
        trace.peak_live()
    except ValueError as exc:
        raise TraceFormatError(path, 0, f"events do not pair up: {exc}") from None
    return trace


# ------------------------------------------------------------------ lifetimes


def trace_from_lifetimes(data, path="lifetimes"):
    """A Trace from lines `alloc_op free_op size_bytes` (a free_op below 0
    means never freed). At one op, allocations come before frees: an op's
    outputs are made while its inputs are still live."""
    if isinstance(data, (bytes, bytearray)):
        try:
            data = data.decode("ascii")
        except UnicodeDecodeError as exc:
            raise TraceFormatError(path, exc.start, "not a lifetime log (non-text byte)") from None
    events, offset = [], 0
    for lineno, line in enumerate(data.splitlines(keepends=True), 1):
        fields = line.split("#", 1)[0].split()
        if fields:
            events.append(_lifetime_line(fields, path, offset, lineno))
        offset += len(line.encode())
    if not events:
        raise TraceFormatError(path, 0, "no buffers (expected lines 'alloc_op free_op size')")
    if len(events) > 1 << 32:
        raise TraceFormatError(path, 0, f"{len(events)} buffers; a trace holds at most 2**32")
    trace = Trace(str(path).rsplit("/", 1)[-1].split(".")[0], {"source": "lifetimes", "event_label": "log op"})
    trace.events = array("Q")  # each op keeps the log's own op index
    order = []
    for ident, (start, end, size) in enumerate(events):
        order.append((start, 0, ident, size))
        if end >= 0:
            order.append((end, 1, ident, 0))
    order.sort()
    for op, is_free, ident, size in order:
        trace._append(2 if is_free else 1, ident, size, 0, op)
    trace.nids = len(events)
    return trace


def _lifetime_line(fields, path, offset, lineno):
    if len(fields) != 3:
        raise TraceFormatError(path, offset, f"line {lineno}: expected 3 fields, got {len(fields)}")
    if any(len(x) > 40 for x in fields):  # int() of a long digit run costs more than it is worth
        raise TraceFormatError(path, offset, f"line {lineno}: a field of more than 40 characters")
    try:
        start, end, size = (int(x) for x in fields)
    except ValueError:
        raise TraceFormatError(path, offset, f"line {lineno}: fields must be integers") from None
    if start < 0 or size <= 0:
        raise TraceFormatError(path, offset, f"line {lineno}: needs alloc_op >= 0 and size > 0")
    if size > _core.MAX_REQUEST:
        raise TraceFormatError(
            path, offset, f"line {lineno}: a buffer of {size} bytes is larger than any heap serves "
            f"({_core.format_size(_core.MAX_REQUEST)})"
        )
    if 0 <= end < start:
        raise TraceFormatError(path, offset, f"line {lineno}: freed (op {end}) before allocated (op {start})")
    return start, end, size
