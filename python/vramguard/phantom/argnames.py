"""Arguments named as the caller wrote them: a bad value given to the
command line is said with its flag (`--nproc 0`), one given to the Python
API with its keyword (`nproc=0`). The checks are shared; the command line
says, for the time of its call, that it is the one asking (`as_flags()`).
"""
import contextlib
import contextvars

__all__ = ["as_flags", "given", "name"]

_FLAGS = contextvars.ContextVar("vramguard_arguments_as_flags", default=False)


@contextlib.contextmanager
def as_flags():
    """Within it, the checks name command-line flags, not keywords."""
    token = _FLAGS.set(True)
    try:
        yield
    finally:
        _FLAGS.reset(token)


def name(keyword):
    """`--min-memory` on the command line, `min_memory=` in Python."""
    return "--" + keyword.replace("_", "-") if _FLAGS.get() else f"{keyword}="


def given(keyword, value, quote=True):
    """The argument with its value: `--memory 'lots'` (or, quote False, as
    typed: `--out runs`) on the command line, `memory='lots'` in Python."""
    if _FLAGS.get():
        return f"{name(keyword)} {value!r}" if quote else f"{name(keyword)} {value}"
    return f"{keyword}={value!r}"
