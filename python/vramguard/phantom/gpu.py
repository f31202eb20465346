"""The phantom GPU: the real PyTorch in a process whose CUDA runtime, driver,
NVML and NVIDIA's libraries are vramguard's stand-ins (csrc/phantom/), so
that a program makes, on a CPU, the allocations it would make on a GPU.

Kernels succeed and compute nothing, device memory costs no host memory,
and the device reports a real card's properties (a preset's). This module
says how to start such a process: `preload()` (the libraries, built on
first use) and `environ(gpu)` (the variables that make the device that
card).
"""
import importlib.util
import os
import sys
from pathlib import Path

from ..torch.oom_shim import cache_dir
from .._presets import find_preset, preset_names

__all__ = ["PhantomUnavailable", "preload", "environ"]

_HERE = Path(__file__).resolve().parents[1]  # vramguard/, not phantom/
# The builder and the sources it builds: the package's copy (a wheel;
# setup.py's build_py puts it there), else the repository's (an editable
# install, or PYTHONPATH=python).
_SOURCES = (_HERE / "_phantom_src", _HERE.parents[1] / "csrc" / "phantom")


class PhantomUnavailable(RuntimeError):
    """The phantom's libraries cannot be had here; the message says why."""


def _builder():
    """csrc/phantom/build.py, as the module vramguard._phantom_build."""
    name = "vramguard._phantom_build"
    if name in sys.modules:
        return sys.modules[name]
    for src in _SOURCES:
        if (src / "build.py").is_file():
            spec = importlib.util.spec_from_file_location(name, src / "build.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
            return module
    raise PhantomUnavailable("the phantom GPU's sources are missing (%s): reinstall vramguard"
                             % " and ".join(map(str, _SOURCES)))


def cache_root():
    """Where the phantom's builds are kept: $XDG_CACHE_HOME/vramguard/phantom,
    else ~/.cache/vramguard/phantom, one directory per PyTorch version, CUDA
    major and hash of the sources and the compiler."""
    return Path(cache_dir()) / "phantom"


def preload():
    """LD_PRELOAD's value for a phantom process: the stand-in libraries,
    absolute paths, separated by spaces. They are built for the PyTorch of
    this interpreter (which is not imported) the first time, in a few
    seconds, with the machine's C compiler, and cached (cache_root()).
    Raises PhantomUnavailable, with one line, where they cannot be built."""
    builder = _builder()
    root = cache_root()
    try:
        cuda = builder.find_cuda()

        def announce(out):
            sys.stderr.write("vramguard: building the phantom GPU for torch %s (CUDA %s), once: %s\n"
                             % (cuda.torch.split("+")[0], cuda.major, out))
            sys.stderr.flush()

        result = builder.build_cached(root, cuda=cuda, announce=announce)
    except builder.BuildError as exc:
        raise PhantomUnavailable(str(exc) + _keep_log(root, exc.log)) from None
    except OSError as exc:
        raise PhantomUnavailable("cannot write the phantom GPU's cache %s (%s): set XDG_CACHE_HOME to a "
                                 "writable directory" % (root, exc.strerror or exc)) from None
    if result.built:
        sys.stderr.write("vramguard: the phantom GPU is built (%.1f s)\n" % result.seconds)
    return result.preload


def _keep_log(root, log):
    """A failed build's full output, in the cache: where it is, for the
    message."""
    if not log:
        return ""
    path = root / "build-failed.log"
    try:
        os.makedirs(root, exist_ok=True)
        path.write_text(log + "\n")
    except OSError:
        return ""
    return " (the whole output: %s)" % path


def environ(gpu, memory=None, context=None):
    """The variables a child process needs to run on a phantom `gpu` (a
    preset's name): its preload, and the device's name, compute capability,
    SM count, memory (`memory` bytes instead of the card's total, for a
    smaller device), the CUDA context's memory (`context` bytes instead of
    the preset's), virtual memory support and the L2 cache size; the
    library path that finds the driver and the runtime by their development
    names, as a driver and a toolkit install them."""
    preset = find_preset(gpu)
    if preset is None:
        raise ValueError(f"unknown GPU {gpu!r}: one of {preset_names()}")
    env = {
        "LD_PRELOAD": preload(),
        "VG_FAKECUDA_PHANTOM": "1",
        "VG_FAKECUDA_DEVICES": "1",
        "VG_FAKECUDA_MEM": str(int(memory if memory is not None else preset.total_bytes)),
        "VG_FAKECUDA_NAME": preset.cuda_name or preset.name,
        "VG_FAKECUDA_CC": "%d.%d" % preset.compute_capability,
        "VG_FAKECUDA_SMS": str(preset.sm_count),
        "VG_FAKECUDA_CONTEXT": str(int(context if context is not None else preset.context_bytes)),
    }
    # Triton (torch.compile) finds the driver here, links its launcher
    # against it and loads its kernels through it: they compile on the CPU
    # (its own ptxas, for the preset's architecture) and launch as no-ops.
    driver = next((p for p in env["LD_PRELOAD"].split() if p.endswith("/libcuda.so.1")), None)
    if driver:
        env["TRITON_LIBCUDA_PATH"] = os.path.dirname(driver)
        # libcuda.so and libcudart.so by name, as on a machine with a driver and a
        # toolkit (csrc/phantom/build.py); the user's own path after them
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (os.path.dirname(driver), os.environ.get("LD_LIBRARY_PATH"))
                                          if p)
    if not preset.vmm:
        env["VG_FAKECUDA_NO_VMM"] = "1"
    if preset.l2_cache_bytes:  # Inductor's benchmarks allocate a buffer of this size
        env["VG_FAKECUDA_L2"] = str(preset.l2_cache_bytes)
    return env

