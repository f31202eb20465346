"""Reading traces others recorded: PyTorch memory snapshots (the pickle that
torch.cuda.memory._dump_snapshot() writes, read without importing torch) and
buffer lifetime logs (`alloc_op free_op size` per line). load_trace() picks
the reader from the file's first bytes."""
import gzip
import io
import pickle
import zlib

from ._trace import MAGIC, Trace, TraceAssembler, TraceFormatError, parse_vgtrace

__all__ = ["load_trace", "trace_from_snapshot", "trace_from_lifetimes"]


# ------------------------------------------------------------------ dispatch


def load_trace(path, device=None):
    """A Trace from a vramguard trace file (.vgtrace, optionally gzipped), a
    PyTorch memory snapshot pickle, or a lifetime log. Unreadable input
    raises TraceFormatError naming the file and the byte offset."""
    path = str(path)
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(path, 0, f"broken gzip stream: {exc}") from None
    if data.startswith(MAGIC):
        return parse_vgtrace(data, path)
    if data[:1] == b"\x80":
        snapshot = _unpickle(data, path)
        try:
            return trace_from_snapshot(snapshot, path, device=device)
        except TraceFormatError:
            raise
        except (AttributeError, TypeError, KeyError, ValueError, OverflowError) as exc:
            # A pickle of plain data, but not laid out as a snapshot is.
            raise TraceFormatError(path, 0, f"unexpected snapshot structure: {exc!r}") from None
    return trace_from_lifetimes(data, path)


# ------------------------------------------------------------------ snapshots


class _PlainDataUnpickler(pickle.Unpickler):
    """Snapshots are plain dicts and lists: refuse every class, so a crafted
    file cannot run code and torch is never imported."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refers to {module}.{name}; only plain data is read")


def _unpickle(data, path):
    stream = io.BytesIO(data)
    try:
        return _PlainDataUnpickler(stream).load()
    except Exception as exc:  # pickle raises many types on corrupt input
        raise TraceFormatError(path, stream.tell(), f"not a readable snapshot pickle: {exc}") from None


def _pick_device(snapshot, device, path):
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    if not isinstance(traces, list):
        raise TraceFormatError(path, 0, "snapshot has no 'device_traces' list")
    if device is None:
        candidates = [i for i, t in enumerate(traces) if t]
        if not candidates:
            raise TraceFormatError(path, 0, "snapshot holds no events (was _record_memory_history() on?)")
        device = max(candidates, key=lambda i: len(traces[i]))
    if not 0 <= device < len(traces):
        raise TraceFormatError(path, 0, f"no device {device}; the snapshot has {len(traces)}")
    return device, traces[device]


def _live_at_dump(snapshot, device):
    """(address, requested size, stream) of blocks allocated at dump time."""
    out = []
    for seg in snapshot.get("segments", []):
        if seg.get("device", device) != device:
            continue
        addr = seg.get("address", 0)
        for blk in seg.get("blocks", []):
            if blk.get("state") in ("active_allocated", "active_pending_free"):
                size = blk.get("requested_size") or blk.get("size", 0)
                out.append((blk.get("address", addr), size, seg.get("stream", 0)))
            addr += blk.get("size", 0)
    return out


class _SnapshotReader:
    """One pass over a device's events: ops through a TraceAssembler, and
    the native allocator's reserved-memory curve beside them."""

    def __init__(self, name):
        self.ops = TraceAssembler(name)
        self.reserved = 0      # relative to the start
        self.curve = []        # (op position, reserved) at each change
        self.freeing = False   # inside a burst of segment_free
        self.empty_caches = 0
        self.retries = 0

    def end_burst(self, next_action):
        # A burst that an allocation's new segment follows at once is
        # PyTorch's own release-and-retry; any other burst is empty_cache().
        if self.freeing:
            if next_action in ("segment_alloc", "segment_map"):
                self.retries += 1
            else:
                self.ops.empty_cache()
                self.empty_caches += 1
        self.freeing = False

    def event(self, ev):
        action, addr = ev.get("action"), ev.get("addr", 0)
        size, stream = ev.get("size", 0), ev.get("stream", 0)
        if action != "segment_free" and action != "segment_unmap":
            self.end_burst(action)
        if action == "alloc":
            self.ops.alloc(addr, size, stream)
        elif action == "free_completed":
            self.ops.free(addr, size, stream)
        elif action in ("segment_alloc", "segment_map"):
            self.reserved += size
            self.curve.append((self.ops.position(), self.reserved))
        elif action in ("segment_free", "segment_unmap"):
            self.reserved -= size
            self.curve.append((self.ops.position(), self.reserved))
            self.freeing = True


def _envelope(curve, points=1000):
    if len(curve) <= points:
        return curve
    step = -(-len(curve) // points)
    return [max(curve[i:i + step], key=lambda p: p[1]) for i in range(0, len(curve), step)]


def trace_from_snapshot(snapshot, path="snapshot", device=None):
    """A Trace from a loaded snapshot dict: `alloc` and `free_completed`
    events become ops; memory live before recording began is seeded at the
    start; bursts of `segment_free` that no new segment follows become
    empty_cache(); the native `segment_alloc`/`segment_free` curve is kept
    as the baseline in `meta`."""
    device, events = _pick_device(snapshot, device, path)
    name = str(path).rsplit("/", 1)[-1].split(".")[0]
    reader = _SnapshotReader(name)
    for ev in events:
        if isinstance(ev, dict):
            reader.event(ev)
    reader.end_burst(None)
    ops = reader.ops
    for addr, size, stream in _live_at_dump(snapshot, device):
        if addr not in ops.live and size > 0:  # live all along
            ops.seed(size, stream)
    # Reserved at the start: what the segments held at dump time, less the
    # net growth the events show.
    at_dump = sum(seg.get("total_size", 0) for seg in snapshot.get("segments", [])
                  if seg.get("device", device) == device)
    start = max(at_dump - reader.reserved, 0)
    curve = [(0, start)] + [(ops.finish_index(at), start + r) for at, r in reader.curve]
    trace = ops.finish()
    trace.meta.update(
        source="pytorch-snapshot",
        device=device,
        recorded_peak_reserved_bytes=max(r for _, r in curve) if reader.curve else None,
        recorded_reserved_start_bytes=start,
        recorded_reserved_curve=_envelope(curve),
        empty_cache_calls=reader.empty_caches,
        native_release_retries=reader.retries,
        allocator_settings=snapshot.get("allocator_settings", {}),
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
    if isinstance(data, bytes):
        try:
            data = data.decode("ascii")
        except UnicodeDecodeError as exc:
            raise TraceFormatError(path, exc.start, "not a lifetime log (non-text byte)") from None
    events, offset = [], 0
    for lineno, line in enumerate(data.splitlines(keepends=True), 1):
        fields = line.split("#", 1)[0].split()
        if fields:
            events.append(_lifetime_line(fields, path, offset, lineno, len(events)))
        offset += len(line.encode())
    if not events:
        raise TraceFormatError(path, 0, "no buffers (expected lines 'alloc_op free_op size')")
    trace = Trace(str(path).rsplit("/", 1)[-1].split(".")[0], {"source": "lifetimes"})
    order = []
    for ident, (start, end, size) in enumerate(events):
        order.append((start, 0, ident, size))
        if end >= 0:
            order.append((end, 1, ident, 0))
    order.sort()
    for _op, is_free, ident, size in order:
        trace._append(2 if is_free else 1, ident, size, 0)
    trace.nids = len(events)
    return trace


def _lifetime_line(fields, path, offset, lineno, ident):
    if len(fields) != 3:
        raise TraceFormatError(path, offset, f"line {lineno}: expected 3 fields, got {len(fields)}")
    try:
        start, end, size = (int(x) for x in fields)
    except ValueError:
        raise TraceFormatError(path, offset, f"line {lineno}: fields must be integers") from None
    if start < 0 or size <= 0:
        raise TraceFormatError(path, offset, f"line {lineno}: needs alloc_op >= 0 and size > 0")
    if 0 <= end < start:
        raise TraceFormatError(path, offset, f"line {lineno}: freed (op {end}) before allocated (op {start})")
    return start, end, size
