"""A Jupyter kernel on a phantom GPU: `python -m vramguard install-kernel
--gpu T4` writes a kernelspec ("Python 3 (phantom T4)") whose environment
preloads the phantom (vramguard.phantom.gpu.environ), so that a notebook run
with it makes a T4's allocations on a CPU. Where jupyter_client is
installed its KernelSpecManager installs it (as `jupyter kernelspec
install` does); else kernel.json is written by hand, atomically. Where: the
user's Jupyter data dir (the default, --user), or
PREFIX/share/jupyter/kernels (--prefix PREFIX; --sys-prefix: this Python's,
as for a virtualenv).

A kernel of another size (--memory) or allocator (--allocator expandable)
is a kernel of its own, named for them ("vramguard-phantom-t4-8gib-expandable",
"Python 3 (phantom T4, 8.00 GiB, expandable)"), so that installing one never
replaces another."""
import json
import os
import shutil
import sys
import tempfile

from .._core import format_size
from .._files import write_atomically
from .._presets import find_preset, preset_names

__all__ = ["kernel_name", "install_kernel", "remove_kernel"]

PREFIX = "vramguard-phantom-"
KERNEL_ALLOCATORS = ("native", "expandable")


def _size_word(nbytes):
    """A size as a kernel name can hold it: 8gib, 1536mib, or bytes."""
    for unit, shift in (("gib", 30), ("mib", 20), ("kib", 10)):
        if nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes}b"


def kernel_name(gpu, memory=None, allocator="native"):
    """The kernelspec's name: vramguard-phantom-t4, with the device's size
    where it is not the card's total (`memory`: bytes, None for the total)
    and the allocator where it is not native."""
    name = PREFIX + gpu.lower().replace("_", "-")
    preset = find_preset(gpu)
    if memory is not None and (preset is None or int(memory) != preset.total_bytes):
        name += "-" + _size_word(int(memory))
    if allocator and allocator != "native":
        name += "-" + allocator
    return name


def _display_name(preset, memory, allocator):
    extra = []
    if memory is not None and int(memory) != preset.total_bytes:
        extra.append(format_size(int(memory)))
    if allocator != "native":
        extra.append(allocator)
    return f"Python 3 (phantom {', '.join([preset.name] + extra)})"


def _spec(preset, memory=None, allocator="native"):
    from .settings import alloc_conf
    from .gpu import environ

    env = dict(environ(preset.name, memory))  # the context's share held from the start, as on the card
    conf = alloc_conf(allocator)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    return {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": _display_name(preset, memory, allocator),
        "language": "python",
        "env": env,
        "metadata": {"vramguard": {"gpu": preset.name, "allocator": allocator,
                                   "memory_bytes": int(memory or preset.total_bytes)}},
    }


def _user_data_dir():
    if os.environ.get("JUPYTER_DATA_DIR"):
        return os.environ["JUPYTER_DATA_DIR"]
    if sys.platform == "darwin":
        return os.path.expanduser("~/Library/Jupyter")
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return os.path.join(base, "jupyter")


def _kernels_dir(prefix):
    if prefix is None:
        manager = _manager()
        return manager.user_kernel_dir if manager is not None else os.path.join(_user_data_dir(), "kernels")
    return os.path.join(prefix, "share", "jupyter", "kernels")


def _manager():
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        return None
    return KernelSpecManager()


def _preset(gpu):
    preset = find_preset(gpu)
    if preset is None:
        raise ValueError(f"unknown GPU {gpu!r}: one of {preset_names()}")
    return preset


def _variant(preset, memory, allocator):
    """(memory bytes or None for the card's total, allocator), checked as a
    dry run checks them: one line for a device with nothing beside its
    CUDA context, or an allocator a kernel cannot have."""
    from .settings import check_device

    allocator = allocator or "native"
    if allocator not in KERNEL_ALLOCATORS:
        raise ValueError(f"a phantom kernel's allocator is native or expandable, got {allocator!r} "
                         "(for vramguard's, call vramguard.install() in the notebook's first cell)")
    if memory is not None:
        memory, _ = check_device(memory, preset)
        if memory == preset.total_bytes:
            memory = None
    return memory, allocator


def install_kernel(gpu, prefix=None, memory=None, allocator="native"):
    """Installs the kernelspec, in the user's Jupyter data dir, or under
    `prefix`; returns (its name, the directory written). `memory` (bytes or
    "8GiB") must leave something beside the CUDA context; a size other than
    the card's, or an allocator other than native, is in the kernel's name."""
    preset = _preset(gpu)
    memory, allocator = _variant(preset, memory, allocator)
    name = kernel_name(preset.name, memory, allocator)
    spec = _spec(preset, memory, allocator)
    manager = _manager()
    if manager is not None:
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "kernel.json"), "w", encoding="utf-8") as f:
                json.dump(spec, f, indent=1)
            where = manager.install_kernel_spec(tmp, name, user=prefix is None, prefix=prefix, replace=True)
        return name, where
    where = os.path.join(_kernels_dir(prefix), name)
    os.makedirs(where, exist_ok=True)
    # whole or not at all: Jupyter listing its kernels never reads half of it; a failed write keeps the old one
    write_atomically(os.path.join(where, "kernel.json"), json.dumps(spec, indent=1))
    return name, where


def _spec_gpu(path):
    try:
        with open(os.path.join(path, "kernel.json"), encoding="utf-8") as f:
            return json.load(f)["metadata"]["vramguard"]["gpu"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_kernel(gpu=None, prefix=None, memory=None, allocator=None):
    """Removes phantom kernelspecs from where install_kernel(prefix=) puts
    them: with `memory` or `allocator`, the one kernel of `gpu` installed
    with them (the other one defaulting as install_kernel's); else every
    kernel of `gpu` (None: every phantom one). Returns the directories
    removed."""
    exact = None
    preset = None
    if gpu is not None:
        preset = _preset(gpu)
    if memory is not None or allocator is not None:
        if preset is None:
            raise ValueError("--memory and --allocator name one kernel of one GPU: give --gpu too")
        exact = kernel_name(preset.name, *_variant(preset, memory, allocator))
    base = _kernels_dir(prefix)
    removed = []
    if os.path.isdir(base):
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name)
            if not name.startswith(PREFIX):
                continue
            if exact is not None:
                wanted = name == exact
            elif preset is not None:
                wanted = name == kernel_name(preset.name) or _spec_gpu(path) == preset.name
            else:
                wanted = True
            if wanted:
                shutil.rmtree(path)
                removed.append(path)
    return removed
