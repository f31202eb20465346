"""What the failing call's frames show, for the out-of-memory report
(oom.py): the exception being handled (or the last uncaught one), the code
its traceback ran through, and the dtypes of the CUDA tensors its function
frames held. The allocator sees bytes, never dtypes: advice that depends on
a tensor's width (torch.autocast) gives a figure only from what is read here.

Only function frames are read: a cell's or a module's frame has the whole
namespace as its locals, tensors of earlier cells included, which says
nothing about the operation that failed.
"""
import inspect
import sys

__all__ = ["failing_exception", "tracebacks", "codes_of", "frame_dtypes", "holds_wide_floats", "narrow_float_names",
           "WIDE_FLOATS"]

#: The dtypes that torch.autocast computes in 16 bits: what halves.
WIDE_FLOATS = ("torch.float32", "torch.float64")
# How far into containers a frame's local is searched for tensors.
_DEPTH = 2


def failing_exception(exc=None):
    """`exc`, else the exception being handled now, else the last uncaught
    one (sys.last_exc, sys.last_value), when it is an out-of-memory error;
    None otherwise."""
    from ..torch.install import is_oom

    candidates = (exc, sys.exc_info()[1], getattr(sys, "last_exc", None), getattr(sys, "last_value", None))
    for candidate in candidates:
        if candidate is not None:
            return candidate if is_oom(candidate) else None
    return None


def tracebacks(exc, context=True):
    """The traceback entries of `exc`, outermost frame first, then those of
    the exception it was raised from (__cause__), and with `context` of the
    one being handled when it was raised (__context__)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            yield tb
            tb = tb.tb_next
        exc = exc.__cause__ or (exc.__context__ if context else None)


def codes_of(exc):
    """The code objects of every frame of `exc`'s traceback (and of the
    exceptions it chains to)."""
    return {tb.tb_frame.f_code for tb in tracebacks(exc)} if exc is not None else set()


def _tensors(value, torch, depth=_DEPTH):
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            yield value
        return
    if depth <= 0:
        return
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return
    for item in items:
        yield from _tensors(item, torch, depth - 1)


def frame_dtypes(exc):
    """{dtype name: bytes} of the distinct CUDA tensors that the function
    frames of `exc`'s traceback hold, innermost frame with any first, or
    None when none holds one (nothing known)."""
    torch = sys.modules.get("torch")
    if exc is None or torch is None:
        return None
    frames = [tb.tb_frame for tb in tracebacks(exc)
              if tb.tb_frame.f_code.co_flags & inspect.CO_OPTIMIZED]
    for frame in reversed(frames):
        found = {}
        for value in list(frame.f_locals.values()):
            for tensor in _tensors(value, torch):
                found[id(tensor)] = tensor
        if found:
            widths = {}
            for tensor in found.values():
                name = str(tensor.dtype)
                widths[name] = widths.get(name, 0) + tensor.numel() * tensor.element_size()
            return widths
    return None


def holds_wide_floats(dtypes):
    """True when the frames' tensors are known to be 32- or 64-bit floats:
    those make most of their bytes (integer tensors such as token ids may
    sit beside them) and no 16-bit or 8-bit float is among them."""
    if not dtypes:
        return False
    wide = sum(n for name, n in dtypes.items() if name in WIDE_FLOATS)
    narrow_floats = any(name in ("torch.float16", "torch.bfloat16") or "float8" in name for name in dtypes)
    return wide > 0 and not narrow_floats and wide * 2 > sum(dtypes.values())


def narrow_float_names(dtypes):
    """The 16- and 8-bit float dtypes among the frames' tensors ("float16",
    "bfloat16", ...), largest first: a program that holds them already
    computes in fewer bits there."""
    names = [name for name in (dtypes or {}) if name in ("torch.float16", "torch.bfloat16") or "float8" in name]
    return [name.replace("torch.", "") for name in sorted(names, key=lambda name: -dtypes[name])]
