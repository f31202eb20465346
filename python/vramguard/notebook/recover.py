"""Getting memory back after an out-of-memory error, without a restart.

After an exception, Python and IPython keep the failed call alive: the
traceback holds every frame of the call, and each frame its local
variables, so the activations of a failed forward pass stay on the GPU
(sys.last_traceback, sys.last_value, sys.last_exc; IPython's Out, _, __,
___ and _N when a cell showed a CUDA tensor). recover() drops those
references, collects garbage (tensors in reference cycles too), empties
vramguard's cache and says how much came back.

It cannot free what the program itself still holds (globals, a model, an
optimizer's state): that is the "still live" figure, per device, with the
variables that hold the most of it (holders.py) or, with stacks recorded,
the lines that made it. PyTorch's own cuBLAS workspaces are released too
and said apart, so that nobody hunts them as a leak.
"""
import gc
import inspect
import sys

from .. import _core
from .._core import format_size
from .holders import holders, release_torch_workspaces, union_by_device

# sys attributes that keep the last uncaught exception (last_exc: 3.12+).
LAST_EXCEPTION_ATTRS = ("last_traceback", "last_value", "last_exc", "last_type")
# How far into containers a displayed value is searched for CUDA tensors:
# Out holds what a cell returned, often a tuple or a dict of tensors.
CONTAINER_DEPTH = 2
# How many holders the line names per device.
TOP_HOLDERS = 3
# What is live but held by nothing named is said only above this: a
# tensor's block is its storage rounded up, which no variable explains.
UNNAMED_MIN = 1 << 20


class DeviceLeft:
    """What one device still holds after recover(): live and cached bytes,
    the largest holders [(label, bytes)] and what none of them holds."""

    __slots__ = ("device", "live", "cached", "holders", "unnamed")

    def __init__(self, device, live, cached, holders=(), unnamed=0):
        self.device, self.live, self.cached = device, live, cached
        self.holders, self.unnamed = list(holders), unnamed

    def text(self, where=""):
        """The sentence: "16.00 MiB still live[ on GPU n], held by x (16.00 MiB)"."""
        out = f"{format_size(self.live)} still live{where}"
        if self.holders:
            out += ", held by " + ", ".join(f"{label} ({format_size(n)})" for label, n in self.holders)
            if self.unnamed >= UNNAMED_MIN:
                out += f", and {format_size(self.unnamed)} by objects vramguard cannot name"
        if self.cached:
            out += f", {format_size(self.cached)} cached in segments that live blocks share"
        return out


class Recovered:
    """What recover() did, in bytes, summed over the devices.

    freed: live bytes freed (tensors only the traceback or Out held);
    released: cached bytes given back to the device;
    live: bytes still allocated; cached: bytes still reserved but free (in
    segments that also hold live blocks, which cannot be released);
    workspaces: of `freed`, PyTorch's own cuBLAS workspaces; devices: a
    DeviceLeft per device, with who holds what is still live."""

    __slots__ = ("freed", "released", "live", "cached", "workspaces", "devices")

    def __init__(self, freed, released, live, cached, workspaces=0, devices=None):
        self.freed, self.released, self.live, self.cached = freed, released, live, cached
        self.workspaces = workspaces
        self.devices = list(devices) if devices is not None else [DeviceLeft(None, live, cached)]

    def __str__(self):
        text = f"vramguard recovered {format_size(self.freed)}"
        if self.workspaces:
            text += (f" ({format_size(self.workspaces)} of it PyTorch's own cuBLAS workspaces, which it makes "
                     "again at the next matrix multiply)")
        if self.released > self.freed:  # cache held before (a failed step's segments) came back too
            where = "the devices" if len(self.devices) > 1 else "the device"
            text += f", and gave {format_size(self.released)} of cached memory back to {where}"
        if len(self.devices) == 1:
            return f"{text}; {self.devices[0].text()}"
        # Several devices: each apart, as the meter shows one device at a time.
        held = [d for d in self.devices if d.live or d.cached]
        if not held:
            return f"{text}; 0 bytes still live"
        return f"{text}; " + "; ".join(d.text(f" on GPU {d.device}") for d in held)

    def __repr__(self):
        return (f"Recovered(freed={format_size(self.freed)}, released={format_size(self.released)}, "
                f"live={format_size(self.live)}, cached={format_size(self.cached)})")

    def as_dict(self):
        """The figures, in bytes (devices: per device, with its holders)."""
        out = {name: getattr(self, name) for name in ("freed", "released", "live", "cached", "workspaces")}
        out["devices"] = [{"device": d.device, "live": d.live, "cached": d.cached,
                           "holders": [list(h) for h in d.holders], "unnamed": d.unnamed} for d in self.devices]
        return out


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


def _user_namespace(shell):
    if shell is not None:
        return shell.user_ns
    main = sys.modules.get("__main__")
    return vars(main) if main is not None else {}


def _lines_of(device):
    """[(label, bytes)] of the lines holding the device's memory, when
    stacks are recorded; [] otherwise."""
    from ..report.oom_notes import lines_by_line

    return [(f"line {label}", nbytes) for label, nbytes, _ in (lines_by_line(device, top=TOP_HOLDERS) or [])]


def _left_on(devices, stats, namespace):
    """A DeviceLeft per device: its figures and who holds its live memory:
    the largest variables, else (stacks recorded) the lines."""
    found = holders(namespace)
    named = union_by_device([namespace[name] for name, _ in found]) if found else {}
    out = []
    for device in devices:
        s = stats(device)
        live, reserved = s["allocated_bytes.all.current"], s["reserved_bytes.all.current"]
        top = [(name, held[device]) for name, held in found if held.get(device)][:TOP_HOLDERS]
        unnamed = max(live - named.get(device, 0), 0) if top else 0
        if live and not top:
            top = _lines_of(device)
        out.append(DeviceLeft(device, live, reserved - live, top, unnamed))
    return out


def recover(exc=None, shell=None, outputs=True):
    """Drop what the last exception and IPython's outputs hold, collect
    garbage, empty vramguard's cache; returns a Recovered with the figures.

    exc: an exception whose frames to clear too (default: the exception
        being handled, so that recover() in an `except` block frees what
        the failed call's frames hold; its own frame keeps running);
    shell: the IPython shell (default: the running one, if any);
    outputs: False keeps IPython's Out and _ (after an interrupt, which
    asked for no memory back, only the interrupted frames are dropped)."""
    from ..torch import install as _torch

    _torch.require_installed()
    devices = _core.existing_devices()
    live_before, reserved_before = _totals(devices, _torch.stats)
    if exc is None:
        exc = sys.exc_info()[1]
    if exc is not None:
        clear_exception_frames(exc)
    drop_last_exception()
    shell = shell if shell is not None else _current_shell()
    if outputs:
        drop_ipython_outputs(shell)
    gc.collect()
    live_before_workspaces, _ = _totals(_core.existing_devices(), _torch.stats)
    workspaces = 0
    if release_torch_workspaces():
        workspaces = max(live_before_workspaces - _totals(_core.existing_devices(), _torch.stats)[0], 0)
    _torch.empty_cache()
    devices = _core.existing_devices()
    live, reserved = _totals(devices, _torch.stats)
    return Recovered(freed=max(live_before - live, 0), released=max(reserved_before - reserved, 0),
                     live=live, cached=reserved - live, workspaces=workspaces,
                     devices=_left_on(devices, _torch.stats, _user_namespace(shell)))
