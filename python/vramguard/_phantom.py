"""The phantom GPU: the real PyTorch in a process whose CUDA runtime, driver,
NVML and NVIDIA's libraries are vramguard's stand-ins (csrc/phantom/), so
that a program makes, on a CPU, the allocations it would make on a GPU.

Kernels succeed and compute nothing, device memory costs no host memory,
and the device reports a real card's properties (a preset's). This module
says how to start such a process: `preload()` (the libraries, built on
first use) and `environ(gpu)` (the variables that make the device that
card).
"""
from pathlib import Path

from ._presets import find_preset, preset_names

__all__ = ["PhantomUnavailable", "preload", "environ"]

_REPO_BUILD = Path(__file__).resolve().parents[2] / "build" / "fakecuda" / "LD_PRELOAD"


class PhantomUnavailable(RuntimeError):
    """The phantom's libraries cannot be had here; the message says why."""


def preload():
    """LD_PRELOAD's value for a phantom process: the stand-in libraries,
    absolute paths, separated by spaces."""
    if _REPO_BUILD.is_file():
        return _REPO_BUILD.read_text().strip()
    raise PhantomUnavailable("the phantom GPU is not built (make fakecuda)")


def environ(gpu, memory=None):
    """The variables a child process needs to run on a phantom `gpu` (a
    preset's name): its preload, and the device's name, compute capability,
    SM count, memory (`memory` bytes instead of the card's total, for a
    smaller device) and virtual memory support."""
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
    }
    if not preset.vmm:
        env["VG_FAKECUDA_NO_VMM"] = "1"
    return env

