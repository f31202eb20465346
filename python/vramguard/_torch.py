"""Plugging vramguard into PyTorch.

    import vramguard
    vramguard.install(budget="15GiB")   # before anything touches the GPU

install() hands PyTorch vramguard's allocator through
torch.cuda.memory.CUDAPluggableAllocator, pointing it at the very shared
object Python imported (vramguard._core), so the heaps PyTorch allocates from
and the numbers vramguard.stats() reads are one instance.

Besides malloc and free, install() sets the pluggable allocator's other
hooks (empty cache, memory fraction, record stream, base allocation, init,
and the private pools of CUDA graphs) to vramguard's C entry points
(_hooks.py), so C++ inside PyTorch reaches vramguard too: NCCL's
record_stream, torch._C._cuda_emptyCache, torch.cuda.graph. An
out-of-memory is torch.OutOfMemoryError where a C++ compiler could build
the small shim that throws it (_oom_shim.py), else RuntimeError. With
patch_torch=True, install() also makes the Python functions people and
libraries call use vramguard where no hook reaches: the memory_* statistics
(which otherwise raise under any pluggable allocator). See docs/pytorch.md.

There is no uninstall: PyTorch cannot swap an allocator that has been used.
"""
import collections
import importlib
import os
import threading
import warnings

from . import _core, _hooks, _oom_shim
from ._summary import format_summary
from ._units import parse_budget

__all__ = [
    "VramguardError", "install", "is_installed", "stats", "summary", "empty_cache",
    "reset_peaks", "is_oom",
]

ENV_BUDGET = "VRAMGUARD_BUDGET"
ENV_GC_THRESHOLD = "VRAMGUARD_GC_THRESHOLD"
ENV_PATCH_TORCH = "VRAMGUARD_PATCH_TORCH"

RESTART_ADVICE = (
    "PyTorch's CUDA allocator is already in use in this process, and PyTorch cannot swap an "
    "allocator once it has been used. Restart the runtime (in Colab: Runtime > Restart session), "
    "then call vramguard.install() first, before any tensor is put on the GPU."
)


class VramguardError(RuntimeError):
    """vramguard cannot do what was asked; the message says what to do."""


_lock = threading.Lock()
_state = {"installed": False, "allocator": None, "patched": False, "settings": None, "hooks": None}


# ------------------------------------------------------------------ settings


def _parse_budget(budget):
    """(bytes, fraction of the device) from None, an int of bytes, a float
    fraction in (0, 1], or a string: "15GiB", "12.5GB", "0.8", "80%"."""
    if budget is None or budget == "":
        return 0, 0.0
    if isinstance(budget, float) or (isinstance(budget, str) and budget.strip().endswith("%")):
        fraction = float(budget.strip().rstrip("%")) / 100 if isinstance(budget, str) else budget
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"a budget given as a fraction of the device must be in (0, 1], got {budget!r}")
        return 0, fraction
    if isinstance(budget, str):
        try:
            value = float(budget)
        except ValueError:
            value = None
        if value is not None and 0.0 < value <= 1.0 and "." in budget:
            return 0, value
    return parse_budget(budget), 0.0


def _parse_gc(gc_threshold):
    if gc_threshold is None or gc_threshold == "":
        return 0.0
    try:
        value = float(gc_threshold)
    except (TypeError, ValueError):
        raise ValueError(f"gc_threshold must be a fraction in (0, 1], got {gc_threshold!r}") from None
    if not 0.0 < value <= 1.0:
        raise ValueError(f"gc_threshold must be a fraction in (0, 1], got {gc_threshold!r}")
    return value


def _import_torch():
    try:
        import torch
    except ImportError:
        raise VramguardError(
            "PyTorch is not installed: vramguard.install() replaces PyTorch's CUDA allocator. "
            "Install PyTorch with CUDA (pip install torch). Without a GPU, vramguard.Heap and "
            "vramguard.replay() still work."
        ) from None
    return torch


def _check_cuda(torch):
    if torch.cuda.is_available():
        return
    if getattr(torch.version, "cuda", None) is None:
        raise VramguardError(
            f"this PyTorch ({torch.__version__}) is built without CUDA: install a CUDA build of PyTorch."
        )
    raise VramguardError(
        "PyTorch sees no CUDA GPU (torch.cuda.is_available() is False). In Colab, choose a GPU "
        "under Runtime > Change runtime type; elsewhere check the driver and CUDA_VISIBLE_DEVICES."
    )


# ------------------------------------------------------------------ install


def install(budget=None, gc_threshold=None, patch_torch=None, oom_error=None):
    """Make vramguard PyTorch's CUDA allocator. Call it before anything
    touches the GPU.

    budget: the most memory vramguard may reserve per device: bytes, a
        string ("15GiB", "12.5GB"), or a fraction of the device (0.8, "80%").
        Use it to behave like a smaller GPU (a T4's 15 GiB on an A100).
    gc_threshold: a fraction of the budget past which idle cached segments
        are released before the cache grows.
    patch_torch: make torch.cuda.memory_allocated() and friends,
        empty_cache(), set_per_process_memory_fraction() and
        Tensor.record_stream() use vramguard (default True).
    oom_error: "auto" (default): out-of-memory errors are
        torch.OutOfMemoryError, through a small C++ shim built against the
        installed torch the first time (cached in ~/.cache/vramguard),
        RuntimeError where it cannot be built; "runtime": RuntimeError,
        no build. Read once, by the first install().

    Settings left as None are read from VRAMGUARD_BUDGET,
    VRAMGUARD_GC_THRESHOLD, VRAMGUARD_PATCH_TORCH ("0" to turn off) and
    VRAMGUARD_OOM_ERROR, for
    scripts launched by others. Calling install() again changes the budget
    and the threshold of every device heap."""
    if budget is None:
        budget = os.environ.get(ENV_BUDGET) or None
    if gc_threshold is None:
        gc_threshold = os.environ.get(ENV_GC_THRESHOLD) or None
    if patch_torch is None:
        patch_torch = os.environ.get(ENV_PATCH_TORCH, "1") != "0"
    if oom_error is None:
        oom_error = os.environ.get(_oom_shim.ENV_MODE) or "auto"
    if oom_error not in _oom_shim.MODES:
        raise ValueError(f"oom_error (or {_oom_shim.ENV_MODE}) must be 'auto' or 'runtime', got {oom_error!r}")
    nbytes, fraction = _parse_budget(budget)
    gc = _parse_gc(gc_threshold)
    torch = _import_torch()
    with _lock:
        if not _state["installed"]:
            _check_cuda(torch)
            _plug_in(torch, oom_error)
        _core.configure_devices(nbytes, fraction, gc)
        _state["settings"] = {"budget_bytes": nbytes or None, "budget_fraction": fraction or None,
                              "gc_threshold": gc or None}
        if patch_torch and not _state["patched"]:
            _patch(torch)
        _keep_cudnn_benchmark_off(torch)


def _plug_in(torch, oom_error="auto"):
    runtime = _core.cuda_runtime()
    if not runtime["found"] and not runtime["simulated"]:
        raise VramguardError(f"vramguard: {runtime['error']}")
    if torch.cuda.is_initialized():
        raise VramguardError(RESTART_ADVICE)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        _core.__file__, "vramguard_torch_malloc", "vramguard_torch_free"
    )
    _state["hooks"] = _hooks.plug_in(torch, allocator, oom_error)
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as exc:
        raise VramguardError(RESTART_ADVICE) from exc
    _hooks.guard_checkpoint_state(torch, VramguardError)
    _state["allocator"] = allocator  # PyTorch keeps its own reference too
    _state["installed"] = True


def is_installed():
    """True once install() has made vramguard PyTorch's CUDA allocator."""
    return _state["installed"]


# ------------------------------------------------------------------ the API


def _device_index(device):
    if isinstance(device, int):
        return device
    import torch

    return torch.cuda._get_device_index(device, optional=True)


def _device_heap(device=None):
    if not _state["installed"]:
        raise VramguardError("vramguard is not installed: call vramguard.install() first")
    return _core.device_heap(_device_index(device))


def _current_device_heap():
    return _device_heap(None)


def stats(device=None):
    """The device heap's counters as a flat dict, with the key names of
    torch.cuda.memory_stats() where the quantity is the same."""
    return _device_heap(device).stats()


class Report(str):
    """Text that a notebook cell shows as text, not as a quoted string."""

    def __repr__(self):
        return str(self)


def summary(device=None):
    """The memory summary table of a device, ready to print or to show."""
    index = _device_index(device)
    return Report(format_summary(stats(index), title=f"vramguard memory summary, device {index}"))


def empty_cache(device=None):
    """Release every wholly free cached segment (of one device, or of all);
    returns the bytes released."""
    if not _state["installed"]:
        raise VramguardError("vramguard is not installed: call vramguard.install() first")
    devices = _core.existing_devices() if device is None else [_device_index(device)]
    return sum(_core.device_heap(d).empty_cache() for d in devices)


def reset_peaks(device=None):
    """Set every peak of a device's counters to its current value."""
    _device_heap(device).reset_peaks()


def is_oom(exc):
    """True for an out-of-memory error from vramguard or PyTorch: vramguard's
    is torch.OutOfMemoryError where install() could build its shim, else a
    RuntimeError with the same message."""
    return isinstance(exc, (RuntimeError, MemoryError)) and "out of memory" in str(exc)


# ------------------------------------------------------------------ patches


def _memory_stats(device=None):
    return collections.OrderedDict(sorted(stats(device).items()))


def _memory_stats_as_nested_dict(device=None):
    nested = {}
    for key, value in stats(device).items():
        node = nested
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def _set_per_process_memory_fraction(fraction, device=None):
    if not isinstance(fraction, float) and not isinstance(fraction, int):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    # A fraction of 0 means no memory at all to PyTorch; here the smallest budget.
    _core.set_device_budget(_device_index(device), budget_fraction=float(fraction) or 1e-9)


def _record_stream(self, stream):
    """Tensor.record_stream: the storage's block is also used by `stream`,
    a stream of its own device (handle 0 is every device's default stream)."""
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:  # a generic torch.Stream: ask torch for its CUDA handle
        import torch

        handle = torch.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                                   device_type=stream.device_type).cuda_stream
    device = getattr(stream, "device_index", None)
    _core.record_stream_any(self.untyped_storage().data_ptr(), handle, -1 if device is None else device)


def _empty_all_caches():
    empty_cache(None)


def _stat(key):
    def read(device=None):
        return stats(device)[key]

    read.__name__ = key
    return read


def _patch(torch):
    replacements = {
        "memory_allocated": _stat("allocated_bytes.all.current"),
        "max_memory_allocated": _stat("allocated_bytes.all.peak"),
        "memory_reserved": _stat("reserved_bytes.all.current"),
        "max_memory_reserved": _stat("reserved_bytes.all.peak"),
        "memory_cached": _stat("reserved_bytes.all.current"),
        "max_memory_cached": _stat("reserved_bytes.all.peak"),
        "reset_peak_memory_stats": reset_peaks,
        "reset_max_memory_allocated": reset_peaks,
        "reset_max_memory_cached": reset_peaks,
        "reset_accumulated_memory_stats": lambda device=None: _device_heap(device).reset_accumulated(),
        "memory_stats": _memory_stats,
        "memory_stats_as_nested_dict": _memory_stats_as_nested_dict,
        "memory_summary": lambda device=None, abbreviated=False: str(summary(device)),
        "empty_cache": _empty_all_caches,
        "set_per_process_memory_fraction": _set_per_process_memory_fraction,
    }
    for name, fn in replacements.items():
        for module in (torch.cuda, torch.cuda.memory):
            if hasattr(module, name):
                setattr(module, name, fn)
    torch.Tensor.record_stream = _record_stream
    _state["patched"] = True


_benchmark_warned = []


def _keep_cudnn_benchmark_off(torch):
    """cudnn.benchmark asks the allocator for its largest free block
    (cacheInfo), which PyTorch's pluggable allocator refuses with an error
    in the middle of a convolution. Keep it off, and say so once."""
    try:
        cudnn = importlib.import_module("torch.backends.cudnn")
    except ImportError:
        return
    if getattr(cudnn, "benchmark", False):
        cudnn.benchmark = False
        _warn_benchmark()
    cls = type(cudnn)
    if getattr(cls, "_vramguard_guarded", False):
        return
    try:
        original = cls.benchmark
    except AttributeError:
        return

    def get(self):
        return original.__get__(self, cls) if hasattr(original, "__get__") else False

    def set_(self, value):
        if value:
            _warn_benchmark()
            value = False
        if hasattr(original, "__set__"):
            original.__set__(self, value)

    try:
        cls.benchmark = property(get, set_)
        cls._vramguard_guarded = True
    except (TypeError, AttributeError):
        pass  # not a class we can guard; the warning above still stands


def _warn_benchmark():
    if _benchmark_warned:
        return
    _benchmark_warned.append(True)
    warnings.warn(
        "vramguard: torch.backends.cudnn.benchmark is kept off. With any pluggable allocator, "
        "cuDNN's benchmark mode asks for the largest cached block (cacheInfo), which PyTorch "
        "refuses with an error in the middle of a convolution. Training works without it; to use "
        "benchmark mode, run without vramguard.",
        RuntimeWarning,
        stacklevel=3,
    )
