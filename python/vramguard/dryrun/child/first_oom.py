"""A run's first out-of-memory (contract.FirstOom): the uncaught one's
line from its traceback, or one the script caught, from the allocator's
count and PyTorch's memory history; its request from the allocator's
record, the history, or PyTorch's message."""
import re

from ..contract import FirstOom
from .frames import first_line, library_line, user_line

__all__ = ["find_first_oom", "is_oom"]

# "Tried to allocate 2.00 GiB" in PyTorch's (and vramguard's) out-of-memory message.
_TRIED = re.compile(r"Tried to allocate ([0-9.]+) (B|bytes|KiB|MiB|GiB|TiB)")
_UNIT = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
#: How a library's out-of-memory reaches the script: its status, in PyTorch's error.
_LIBRARY_OOM = ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def is_oom(run, exc):
    torch = run.torch
    if isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return True
    # A library that cannot get device memory for itself (cuBLAS's handle
    # in a new thread, at the peak; cuDNN's) is out of memory too.
    return isinstance(exc, RuntimeError) and ("out of memory" in str(exc)
                                              or any(s in str(exc) for s in _LIBRARY_OOM))


def find_first_oom(run, history=True):
    """The first out-of-memory: the uncaught one's line (its traceback),
    else one the script caught (the allocator counted it), its line
    from the memory history where that has the stack (history False:
    not looked up, which costs a snapshot of the whole history)."""
    torch = run.torch
    ooms = 0
    if torch.cuda.is_initialized():
        try:
            ooms = int(torch.cuda.memory_stats().get("num_ooms", 0))
        except Exception:
            ooms = 0
    if run.oom is None and ooms == 0:
        return None
    entry = history_oom(run) if history else None
    out = FirstOom(caught=run.oom is None)
    if run.oom is not None:
        exc, frames = run.oom
        out.line = user_line(frames)
        out.inner_line = library_line(frames, out.line)
        out.message = first_line(exc)
    if entry is not None:
        if out.line is None:
            frames = [(f.get("filename", ""), f.get("line")) for f in entry.get("frames", [])]
            out.line = user_line(frames)
        out.request_bytes = int(entry["size"])
    if run.opts.allocator == "vramguard":
        try:
            from ... import _core

            record = _core.last_oom()
            if record is not None:
                out.request_bytes = int(record["requested"])
        except Exception:
            pass
    if out.request_bytes is None and out.message:
        match = _TRIED.search(out.message)
        if match:
            out.request_bytes = int(float(match.group(1)) * _UNIT[match.group(2)])
    return out


def history_oom(run):
    """The first 'oom' entry of PyTorch's memory history."""
    if not run.history or run.opts.allocator == "vramguard":
        return None
    try:
        snap = run.torch.cuda.memory._snapshot()
    except Exception:
        return None
    for trace in snap.get("device_traces", []):
        for entry in trace:
            if entry.get("action") == "oom":
                return entry
    return None
