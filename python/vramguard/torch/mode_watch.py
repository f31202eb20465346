"""Which modes the failing operation ran under, for the out-of-memory
report's advice (report/oom_advice.py): advice to compute in 16 bits is
false for a program that already does, and torch.no_grad() for one
already under it.

autocast's and grad mode's states are thread-local and are restored as the
error leaves the `with torch.autocast(...)` or `with torch.no_grad():`
block, so by the time last_oom() reads the error nothing says it was raised
under them. install() wraps the __exit__ of torch.autocast, torch.no_grad
and torch.inference_mode (the decorator forms exit through it too): an
out-of-memory error leaving an enabled CUDA autocast region is marked with
the region's dtype, one leaving a no-grad or inference-mode region with
that region's name (the innermost region's, the first to exit). Nothing
else changes: the original __exit__ runs first and its answer is returned.
Under torch.compile the wrappers do nothing (Dynamo handles these modes
itself and must not trace this code).
"""
import functools

__all__ = ["watch", "autocast_dtype_of", "grad_off_of", "AUTOCAST_MARK", "GRAD_MARK"]

#: The attributes an out-of-memory error gets: the autocast dtype's name,
#: and the no-grad region's name.
AUTOCAST_MARK = "_vramguard_autocast_dtype"
GRAD_MARK = "_vramguard_grad_off"


def _is_compiling(torch):
    compiler = getattr(torch, "compiler", None)
    return getattr(compiler, "is_compiling", None) or (lambda: False)


def _wrap_exit(cls, mark_of, is_oom, compiling):
    """Wraps cls.__exit__ once: mark_of(self) is the mark for an
    out-of-memory error leaving this region (None: none)."""
    original = getattr(cls, "__exit__", None)
    if original is None or getattr(original, "_vramguard_watch", False):
        return

    @functools.wraps(original)
    def __exit__(self, exc_type, exc_value, traceback):
        answer = original(self, exc_type, exc_value, traceback)
        if exc_value is not None and not compiling() and is_oom(exc_value):
            for attribute, value in mark_of(self):
                if value is not None and not hasattr(exc_value, attribute):
                    try:
                        setattr(exc_value, attribute, value)
                    except (AttributeError, TypeError):  # an exception type that takes no attributes
                        pass
        return answer

    __exit__._vramguard_watch = True
    cls.__exit__ = __exit__


def _autocast_mark(region):
    if getattr(region, "device", None) == "cuda" and getattr(region, "_enabled", False):
        return [(AUTOCAST_MARK, str(region.fast_dtype).replace("torch.", ""))]
    return []


def _grad_mark(name):
    def mark(region):
        if name == "torch.inference_mode()" and not getattr(region, "mode", True):
            return []  # inference_mode(False) turns it off
        return [(GRAD_MARK, name)]

    return mark


def watch(torch, is_oom):
    """Wrap the modes' __exit__ once per process."""
    compiling = _is_compiling(torch)
    autocast = getattr(getattr(getattr(torch, "amp", None), "autocast_mode", None), "autocast", None)
    if autocast is not None:
        _wrap_exit(autocast, _autocast_mark, is_oom, compiling)
    grad_mode = getattr(getattr(torch, "autograd", None), "grad_mode", None)
    for cls_name, name in (("no_grad", "torch.no_grad()"), ("inference_mode", "torch.inference_mode()")):
        cls = getattr(grad_mode, cls_name, None)
        if cls is not None:
            _wrap_exit(cls, _grad_mark(name), is_oom, compiling)


def _mark_of(exc, attribute):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        value = getattr(exc, attribute, None)
        if value is not None:
            return value
        exc = exc.__cause__ or exc.__context__
    return None


def autocast_dtype_of(exc):
    """The dtype name ("float16", "bfloat16") of the enabled CUDA autocast
    region the error left, or None (none, or not known)."""
    return _mark_of(exc, AUTOCAST_MARK)


def grad_off_of(exc):
    """"torch.no_grad()" or "torch.inference_mode()": the region that had
    turned gradients off when the error left it, or None."""
    return _mark_of(exc, GRAD_MARK)
