"""A Jupyter kernel on a phantom GPU: `python -m vramguard install-kernel
--gpu T4` writes a kernelspec ("Python 3 (phantom T4)") whose environment
preloads the phantom (vramguard._phantom.environ), so that a notebook run
with it makes a T4's allocations on a CPU. Where jupyter_client is
installed its KernelSpecManager installs it (as `jupyter kernelspec
install` does); else kernel.json is written by hand. Where: the user's
Jupyter data dir (the default, --user), or PREFIX/share/jupyter/kernels
(--prefix PREFIX; --sys-prefix: this Python's, as for a virtualenv)."""
import json
import os
import shutil
import sys
import tempfile

from ._presets import find_preset, preset_names

__all__ = ["kernel_name", "install_kernel", "remove_kernel"]

PREFIX = "vramguard-phantom-"


def kernel_name(gpu):
    return PREFIX + gpu.lower().replace("_", "-")


def _spec(preset, memory=None, allocator="native"):
    from ._phantom import environ

    env = dict(environ(preset.name, memory))  # the context's share held from the start, as on the card
    if allocator == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python 3 (phantom {preset.name})",
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


def install_kernel(gpu, prefix=None, memory=None, allocator="native"):
    """Installs the kernelspec, in the user's Jupyter data dir, or under
    `prefix`; returns (its name, the directory written)."""
    preset = find_preset(gpu)
    if preset is None:
        raise ValueError(f"unknown GPU {gpu!r}: one of {preset_names()}")
    if allocator not in ("native", "expandable"):
        raise ValueError(f"a phantom kernel's allocator is native or expandable, got {allocator!r} "
                         "(for vramguard's, call vramguard.install() in the notebook's first cell)")
    name = kernel_name(preset.name)
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
    with open(os.path.join(where, "kernel.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=1)
    return name, where


def remove_kernel(gpu=None, prefix=None):
    """Removes the phantom kernelspec of `gpu` (None: every phantom one)
    from where install_kernel(prefix=) puts them; returns the directories
    removed."""
    if gpu is not None:
        preset = find_preset(gpu)
        if preset is None:
            raise ValueError(f"unknown GPU {gpu!r}: one of {preset_names()}")
        wanted = {kernel_name(preset.name)}
    else:
        wanted = None
    base = _kernels_dir(prefix)
    removed = []
    if os.path.isdir(base):
        for name in sorted(os.listdir(base)):
            if name.startswith(PREFIX) and (wanted is None or name in wanted):
                shutil.rmtree(os.path.join(base, name))
                removed.append(os.path.join(base, name))
    return removed
