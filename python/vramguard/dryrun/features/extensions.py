"""Which CUDA extensions ran kernels in a dry run's child.

The phantom records, per shared object that registered CUDA kernels as it
loaded (its fat binaries), how many of its kernels were launched and how
often (csrc/phantom/rt_fatbin.c, read through the vg_fakecuda_kernel_library*
knobs). An extension is named only when its kernels ran: importing a
library that registers kernels (transformers imports bitsandbytes) launches
none. PyTorch's own kernels, NVIDIA's libraries that PyTorch calls and
Triton's are not extensions.
"""
import ctypes
import os
import sys

from ...render.words import count
from .base import Feature

__all__ = ["launched_extensions", "library_name"]

#: Top-level packages whose kernels are PyTorch's own or the CUDA libraries it calls.
NOT_EXTENSIONS = frozenset({"torch", "nvidia", "triton"})
#: What a library dladdr could not name is called.
UNNAMED = "an unnamed library"


def library_name(path, search_path=None):
    """The name a user knows a library by: its top-level package when it
    lies under a folder of sys.path (.../site-packages/bitsandbytes/libbitsandbytes_cuda.so
    is bitsandbytes), else its file's name without "lib" and suffixes
    (~/.cache/torch_extensions/.../fused_adam.so is fused_adam)."""
    if not path:
        return UNNAMED
    path = os.path.abspath(path)
    roots = sorted((os.path.abspath(p or os.curdir) for p in (sys.path if search_path is None else search_path)),
                   key=len, reverse=True)
    for root in roots:
        if path.startswith(root.rstrip(os.sep) + os.sep):
            return _stem(os.path.relpath(path, root).split(os.sep)[0])
    return _stem(os.path.basename(path))


def _stem(name):
    base = name.split(".", 1)[0]
    return base[3:] if base.startswith("lib") and len(base) > 3 else base


def _knobs(fake):
    """The phantom's knob functions, typed; None when this phantom lacks them."""
    try:
        count = fake.vg_fakecuda_kernel_libraries
        path = fake.vg_fakecuda_kernel_library
        launches = fake.vg_fakecuda_kernel_library_launches
        kernels = fake.vg_fakecuda_kernel_library_kernels
    except AttributeError:
        return None
    count.restype = ctypes.c_int
    path.restype, path.argtypes = ctypes.c_char_p, [ctypes.c_int]
    for fn in (launches, kernels):
        fn.restype, fn.argtypes = ctypes.c_long, [ctypes.c_int]
    return count, path, launches, kernels


def launched_extensions(fake=None):
    """{name: {"kernels": distinct kernels launched, "launches": launches,
    "libraries": [paths]}} of the extensions whose kernels ran in this
    process; None when the phantom does not count launches per library."""
    knobs = _knobs(fake if fake is not None else ctypes.CDLL(None))
    if knobs is None:
        return None
    count, path, launches, kernels = knobs
    found = {}
    for index in range(count()):
        ran = launches(index)
        if ran <= 0:
            continue
        raw = path(index)
        library = raw.decode(errors="replace") if raw else ""
        name = library_name(library)
        if name in NOT_EXTENSIONS:
            continue
        entry = found.setdefault(name, {"kernels": 0, "launches": 0, "libraries": []})
        entry["kernels"] += kernels(index)
        entry["launches"] += ran
        entry["libraries"].append(library)
    return found


def extensions_that_ran(runs):
    """"bitsandbytes (2 kernels, 40 launches)" per extension whose kernels
    ran, as the first run that launched them counted."""
    seen = {}
    for r in runs:
        for name, ran in (r.get("extensions") or {}).items():
            seen.setdefault(name, ran)
    return [f"{name} ({count(ran['kernels'], 'kernel')}, {count(ran['launches'], 'launch', 'launches')})"
            for name, ran in sorted(seen.items())]


class _Extensions(Feature):
    name = "extensions"

    def figures(self, state, run):
        return {"extensions": launched_extensions(run.fake) or {}}

    def notes(self, result, runs):
        ran = extensions_that_ran(runs)
        if not ran:
            return []
        return [f"Custom CUDA extensions ran kernels: {', '.join(ran)}: their kernels compute nothing "
                "here, and memory they take outside PyTorch's allocator is not in the peaks above."]


FEATURE = _Extensions()
