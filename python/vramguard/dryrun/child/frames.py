"""Whose code a frame is: the user's (their script, a notebook's cell), a
library's (transformers, a Trainer), or PyTorch's and vramguard's own
machinery; and the user's line a traceback points at, as the report
names it."""
import os
import sys
import sysconfig
import traceback

from ...trace.stacks import generated_code_dirs

__all__ = ["first_line", "is_user_file", "library_line", "print_user_traceback", "show_file",
           "traceback_frames", "user_line"]


def _not_user_prefixes():
    """Paths whose frames are not the user's: the standard library,
    site-packages (torch, transformers, ...), torch wherever it is, the code
    torch.compile generated (its line is the user's that called it) and
    vramguard itself."""
    prefixes = {os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep}  # vramguard/
    prefixes |= generated_code_dirs()
    torch = sys.modules.get("torch")
    if getattr(torch, "__file__", None):
        prefixes.add(os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            prefixes.add(os.path.abspath(paths[key]) + os.sep)
    try:
        import site

        prefixes.update(os.path.abspath(p) + os.sep for p in site.getsitepackages())
        prefixes.add(os.path.abspath(site.getusersitepackages()) + os.sep)
    except (AttributeError, TypeError):
        pass
    return tuple(prefixes)


_NOT_USER = None


def is_user_file(filename):
    global _NOT_USER
    if _NOT_USER is None:
        _NOT_USER = _not_user_prefixes()
    if not filename or filename.startswith("<frozen") or filename.startswith("<string"):
        return False
    if filename.startswith("<") or "[cell " in filename:
        return True  # a notebook's cell
    path = os.path.abspath(filename)
    return not (path.startswith(_NOT_USER) or f"{os.sep}site-packages{os.sep}" in path
                or f"{os.sep}dist-packages{os.sep}" in path)


def show_file(filename):
    """A file as the report names it: relative to the working directory
    when under it."""
    if filename.startswith("<") or "[cell " in filename:
        return filename
    path = os.path.abspath(filename)
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def user_line(frames):
    """"file:line" of the innermost user frame of `frames`, (filename, line)
    pairs innermost first; None when none is the user's."""
    for filename, line in frames:
        if is_user_file(filename):
            return f"{show_file(filename)}:{line}"
    return None


#: Packages whose frames are PyTorch's machinery, never a model's code.
_TORCH_PACKAGES = ("torch", "torchgen", "functorch", "triton", "vramguard")


def _library_name(path):
    """"transformers/models/gpt2/modeling_gpt2.py" for a file under
    site-packages (or dist-packages), else None."""
    for marker in (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return None


def library_line(frames, user):
    """Where a library's code (a model's forward in transformers, a
    Trainer's step) asked for the memory: "package/file.py:line" of the
    innermost frame under site-packages outside PyTorch's own packages,
    when it lies inside the user's line `user` (a `trainer.train()` line
    names nothing of the model); None when the innermost frame outside
    PyTorch is the user's own."""
    if user is None:
        return None
    for filename, line in frames:
        if is_user_file(filename):
            return None
        name = _library_name(os.path.abspath(filename)) if filename else None
        if name and name.split(os.sep, 1)[0] not in _TORCH_PACKAGES:
            return f"{name}:{line}"
    return None


def traceback_frames(exc):
    frames = [(fs.filename, fs.lineno) for fs in traceback.extract_tb(exc.__traceback__)]
    return frames[::-1]


def first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def print_user_traceback(exc):
    """The script's traceback as Python prints it, without this runner's
    frames (runpy's and ours above the script)."""
    tb = exc.__traceback__
    while tb is not None and not is_user_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__, file=sys.stderr)
    sys.stderr.flush()
