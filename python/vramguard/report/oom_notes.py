"""What the next out-of-memory report (oom.py, vramguard.last_oom()) adds
to the C core's record, noted as it happens: the regions an out-of-memory
left (regions.py), a batch-size fit (find_max_batch), and the lines holding
memory when stacks are recorded. Kept apart from the report so that the
regions, which the report reads, note here without importing it.
"""
import threading

from .. import _core

__all__ = ["note_batch_fit", "clear_batch_fit", "note_region_at_oom", "lines_by_line", "noted_fit", "regions_noted_at",
           "built_report", "keep_built_report"]

_lock = threading.Lock()
_fit = {"value": None, "step": None, "scoped": False, "failed": (), "fitted": ()}
_regions_at_oom = {}  # seq -> [(device, name, live at entry, peak)], innermost first
_built = {"seq": 0, "report": None}


def note_batch_fit(fixed, per_sample, batch=None, *, step=None, failed=(), fitted=()):
    """A fit of memory = fixed + per_sample x batch (bytes), as
    find_max_batch measures it; `batch`: the batch size in use, when known.
    The next report says the largest batch that should fit.

    step: the step function the fit was measured on: the report uses the
    fit only for a failure inside it (a batch figure from another
    computation would be false); None: any failure (a fit the user noted).
    failed: batch sizes measured to run out of memory, never advised;
    fitted: batch sizes measured to fit, the only ones the report calls
    measured."""
    for name, value in (("fixed", fixed), ("per_sample", per_sample)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be a number of bytes >= 0, got {value!r}")
    if per_sample <= 0:
        raise ValueError(f"per_sample must be more than 0 bytes, got {per_sample!r}")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch must be an int >= 1 or None, got {batch!r}")
    failed, fitted = tuple(failed), tuple(fitted)
    for name, sizes in (("failed", failed), ("fitted", fitted)):
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
            raise ValueError(f"{name} must hold batch sizes (ints >= 1), got {sizes!r}")
    code = getattr(step, "__code__", None)
    if step is not None and code is None:  # functools.partial, a callable object
        inner = getattr(step, "func", None) or getattr(step, "__call__", None)
        code = getattr(inner, "__code__", None)
    with _lock:
        _fit["value"] = (float(fixed), float(per_sample), batch)
        _fit["step"] = code if step is not None else None
        _fit["scoped"] = step is not None
        _fit["failed"] = failed
        _fit["fitted"] = fitted
        _built["report"] = None


def clear_batch_fit():
    with _lock:
        _fit.update(value=None, step=None, scoped=False, failed=(), fitted=())
        _built["report"] = None


def note_region_at_oom(device, name, live_at_entry, peak):
    """A region was left by an out-of-memory (regions.py: track.__exit__)."""
    seq = _core.last_oom_seq()
    with _lock:
        _regions_at_oom.setdefault(seq, []).append((device, name, live_at_entry, peak))
        for old in [s for s in _regions_at_oom if s < seq]:
            del _regions_at_oom[old]
        if _built["seq"] == seq:
            _built["report"] = None


def lines_by_line(device, top=5):
    """[(label, bytes, blocks)] of live memory by line of the device, or
    None when stacks are not recorded."""
    try:
        from ..trace import stacks as _stacks
    except ImportError:
        return None
    live_by_line = getattr(_stacks, "live_by_line", None)
    if live_by_line is None:
        return None
    try:
        rows = live_by_line(device=device, top=top)
    except (RuntimeError, ValueError, LookupError):  # not recording
        return None
    return [tuple(row) for row in rows] or None


def noted_fit():
    """(fit, scoped, step code, failed, fitted) as note_batch_fit() left
    them: fit is (fixed, per_sample, batch) or None; scoped whether it holds
    only for a failure in the step whose code is given."""
    with _lock:
        return _fit["value"], _fit["scoped"], _fit["step"], _fit["failed"], _fit["fitted"]


def regions_noted_at(seq, device):
    """[(name, live at entry, peak)] of the regions out-of-memory `seq` left
    on `device`, as they were left: innermost first."""
    with _lock:
        return [(name, entry, peak) for noted_device, name, entry, peak in _regions_at_oom.get(seq, ())
                if noted_device == device]


def built_report(seq):
    """The report already built for out-of-memory `seq`, or None (none
    yet, or a note since has made it stale)."""
    with _lock:
        return _built["report"] if _built["seq"] == seq else None


def keep_built_report(seq, report):
    """last_oom() hands out the same report until the next out-of-memory or
    note."""
    with _lock:
        _built["seq"], _built["report"] = seq, report
