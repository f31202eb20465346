"""Getting memory back after an out-of-memory error, without a restart.

After an exception, Python and IPython keep the failed call alive: the
traceback holds every frame of the call, and each frame its local
variables, so the activations of a failed forward pass stay on the GPU
(sys.last_traceback, sys.last_value, sys.last_exc; IPython's Out, _, __,
___ and _N when a cell showed a CUDA tensor). recover() drops those
references, collects garbage (tensors in reference cycles too), empties
vramguard's cache and says how much came back.

It cannot free what the program itself still holds (globals, a model, an
optimizer's state): that is the "still live" figure.
"""
import gc
import inspect
import sys

from .._core import format_size

# sys attributes that keep the last uncaught exception (last_exc: 3.12+).
LAST_EXCEPTION_ATTRS = ("last_traceback", "last_value", "last_exc", "last_type")
# How far into containers a displayed value is searched for CUDA tensors:
# Out holds what a cell returned, often a tuple or a dict of tensors.
CONTAINER_DEPTH = 2


class Recovered:
    """What recover() did, in bytes, summed over the devices.

    freed: live bytes freed (tensors only the traceback or Out held);
    released: cached bytes given back to the device;
    live: bytes still allocated; cached: bytes still reserved but free (in
    segments that also hold live blocks, which cannot be released)."""

    __slots__ = ("freed", "released", "live", "cached")

    def __init__(self, freed, released, live, cached):
        self.freed, self.released, self.live, self.cached = freed, released, live, cached

    def __str__(self):
        text = f"vramguard recovered {format_size(self.freed)}; {format_size(self.live)} still live"
        if self.cached:
            text += f", {format_size(self.cached)} cached in segments that live blocks share"
        return text

    def __repr__(self):
        return (f"Recovered(freed={format_size(self.freed)}, released={format_size(self.released)}, "
                f"live={format_size(self.live)}, cached={format_size(self.cached)})")

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}


def _torch_if_imported():
    return sys.modules.get("torch")


def holds_cuda(value, depth=CONTAINER_DEPTH):
    """True when `value` is a CUDA tensor, a module with CUDA parameters, or
    a list, tuple, set or dict holding one within `depth` levels."""
    torch = _torch_if_imported()
    if torch is None or value is None:
        return False
    if isinstance(value, torch.Tensor):
        return value.is_cuda
    if isinstance(value, torch.nn.Module):
        return any(p.is_cuda for p in value.parameters())
    if depth <= 0:
        return False
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    else:
        return False
    return any(holds_cuda(item, depth - 1) for item in items)


def drop_last_exception():
    """Forget the last uncaught exception: clear its frames' locals and the
    sys attributes that keep it."""
    value = getattr(sys, "last_value", None) or getattr(sys, "last_exc", None)
    tb = getattr(sys, "last_traceback", None)
    if value is not None:
        clear_exception_frames(value)
    elif tb is not None:
        clear_frames(tb)
    for name in LAST_EXCEPTION_ATTRS:
        if hasattr(sys, name):
            setattr(sys, name, None)


def clear_frames(tb):
    """Clear the locals of every finished frame of a traceback, and empty
    the snapshots of them that `frame.f_locals` made before (Python < 3.13
    caches one dict per function frame: a traceback formatter that read it
    keeps the tensors alive after frame.clear()). A frame still running is
    skipped. Only a function's f_locals is a snapshot: a module's, a class
    body's or exec()'s is the namespace itself, never emptied."""
    while tb is not None:
        frame = tb.tb_frame
        is_function = bool(frame.f_code.co_flags & inspect.CO_OPTIMIZED)
        snapshot = frame.f_locals if is_function else None
        try:
            frame.clear()
        except RuntimeError:  # still executing
            pass
        else:
            if type(snapshot) is dict:
                snapshot.clear()
        tb = tb.tb_next


def clear_exception_frames(exc, seen=None):
    """clear_frames() for `exc`'s traceback and for those of the
    exceptions it chains to."""
    seen = set() if seen is None else seen
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            clear_frames(exc.__traceback__)
        if exc.__cause__ is not None:
            clear_exception_frames(exc.__cause__, seen)
        exc = exc.__context__


def drop_ipython_outputs(shell):
    """Remove IPython's references to displayed values that hold CUDA
    tensors: Out[n] and _n, and _, __, ___ when they are IPython's own (a
    value the user assigned to _ is the user's). Returns how many."""
    if shell is None:
        return 0
    ns = shell.user_ns
    # IPython pushes _, __, ___ and _N into user_ns_hidden too (%who's list).
    namespaces = [ns, getattr(shell, "user_ns_hidden", {})]
    out = ns.get("_oh", {})
    dropped = 0
    for number in [n for n, value in list(out.items()) if holds_cuda(value)]:
        del out[number]
        for space in namespaces:
            space.pop(f"_{number}", None)
        dropped += 1
    hook = getattr(shell, "displayhook", None)
    for unders in ("_", "__", "___"):
        kept = getattr(hook, unders, None) if hook is not None else None
        if not holds_cuda(kept):
            continue
        for space in namespaces:
            if space.get(unders) is kept:
                space[unders] = ""
        setattr(hook, unders, "")
        dropped += 1
    last = getattr(shell, "last_execution_result", None)
    if last is not None and holds_cuda(getattr(last, "result", None)):
        last.result = None
        dropped += 1
    return dropped


def _current_shell():
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def _totals(devices, stats):
    live = reserved = 0
    for device in devices:
        s = stats(device)
        live += s["allocated_bytes.all.current"]
        reserved += s["reserved_bytes.all.current"]
    return live, reserved


def recover(exc=None, shell=None):
    """Drop what the last exception and IPython's outputs hold, collect
    garbage, empty vramguard's cache; returns a Recovered with the figures.

    exc: an exception being handled now (its frames are cleared too);
    shell: the IPython shell (default: the running one, if any)."""
    from ..torch import install as _torch

    _torch._require_installed()
    devices = _torch._core.existing_devices()
    live_before, reserved_before = _totals(devices, _torch.stats)
    if exc is not None:
        clear_exception_frames(exc)
    drop_last_exception()
    drop_ipython_outputs(shell if shell is not None else _current_shell())
    gc.collect()
    _torch.empty_cache()
    devices = _torch._core.existing_devices()
    live, reserved = _totals(devices, _torch.stats)
    return Recovered(freed=max(live_before - live, 0), released=max(reserved_before - reserved, 0),
                     live=live, cached=reserved - live)
