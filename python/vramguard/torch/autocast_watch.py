"""Which autocast the failing operation ran under, for the out-of-memory
report (report/oom.py): advice to compute in 16 bits is false for a
program that already does.

autocast's state is thread-local and is restored as the error leaves the
`with torch.autocast(...)` block, so by the time last_oom() reads the
error nothing says it was raised under autocast. install() wraps
torch.autocast's __exit__: an out-of-memory error leaving an enabled CUDA
region is marked with the region's dtype (the innermost region's, the
first to exit). Nothing else changes: the original __exit__ runs first
and its answer is returned. Under torch.compile the wrapper does nothing
(Dynamo handles autocast itself and must not trace this code).
"""
import functools

__all__ = ["watch", "autocast_dtype_of", "MARK"]

#: The attribute an out-of-memory error gets: the autocast dtype's name.
MARK = "_vramguard_autocast_dtype"


def _is_compiling(torch):
    compiler = getattr(torch, "compiler", None)
    return getattr(compiler, "is_compiling", None) or (lambda: False)


def watch(torch, is_oom):
    """Wrap torch.autocast.__exit__ once per process."""
    cls = getattr(getattr(torch, "amp", None), "autocast_mode", None)
    cls = getattr(cls, "autocast", None)
    if cls is None or getattr(cls.__exit__, "_vramguard_watch", False):
        return
    original = cls.__exit__
    compiling = _is_compiling(torch)

    @functools.wraps(original)
    def __exit__(self, exc_type, exc_value, traceback):
        answer = original(self, exc_type, exc_value, traceback)
        if (exc_value is not None and not compiling() and getattr(self, "device", None) == "cuda"
                and getattr(self, "_enabled", False) and is_oom(exc_value)
                and not hasattr(exc_value, MARK)):
            try:
                setattr(exc_value, MARK, str(self.fast_dtype).replace("torch.", ""))
            except (AttributeError, TypeError):  # an exception type that takes no attributes
                pass
        return answer

    __exit__._vramguard_watch = True
    cls.__exit__ = __exit__


def autocast_dtype_of(exc):
    """The dtype name ("float16", "bfloat16") of the enabled CUDA autocast
    region the error left, or None (none, or not known)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        dtype = getattr(exc, MARK, None)
        if dtype is not None:
            return dtype
        exc = exc.__cause__ or exc.__context__
    return None
