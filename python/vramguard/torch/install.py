"""Plugging vramguard into PyTorch.

    import vramguard
    vramguard.install(budget="T4")   # before anything touches the GPU

install() hands PyTorch vramguard's allocator through
torch.cuda.memory.CUDAPluggableAllocator, pointing it at the very shared
object Python imported (vramguard._core), so the heaps PyTorch allocates from
and the numbers vramguard.stats() reads are one instance.

Besides malloc and free, install() sets the pluggable allocator's other
hooks (empty cache, memory fraction, record stream, base allocation, init,
and the private pools of CUDA graphs) to vramguard's C entry points
(hooks.py), so C++ inside PyTorch reaches vramguard too: NCCL's
record_stream, torch._C._cuda_emptyCache, torch.cuda.graph. An
out-of-memory is torch.OutOfMemoryError where a C++ compiler could build
the small shim that throws it (oom_shim.py), else RuntimeError. The
memory statistics have no hook and raise under any pluggable allocator (or,
in torch.accelerator, read the unused native one), so with patch_torch=True
install() also replaces the Python functions of torch.cuda and
torch.accelerator that read them (patches.py), and PyTorch's memory
history functions (refused under any pluggable allocator), which then run
on vramguard's own recording (vramguard/trace/memory_history.py); and it
keeps cuDNN's benchmark mode off (cudnn.py). See
docs/pytorch.md. In IPython, it also registers a handler that recovers
the memory an out-of-memory error leaves held by the stored traceback
(vramguard/notebook/: ipython.py, recover.py). summary() is
vramguard/report/summary.py's.

There is no uninstall: PyTorch cannot swap an allocator that has been used.
"""
import os
import threading
import warnings

from .. import _core
from . import budget_over_device as _over, cudnn as _cudnn, cuda_started as _cuda_started, graphs, hooks as _hooks, nccl
from . import mode_watch as _mode_watch, oom_shim as _oom_shim, patches as _torch_patches, stats as _torch_stats
from .device_heaps import VramguardError, current_device_heap, device_heap, device_index, require_installed
from .state import install_state
from .._units import parse_budget

__all__ = [
    "VramguardError", "install", "is_installed", "stats", "empty_cache",
    "reset_peaks", "is_oom",
]

ENV_BUDGET = "VRAMGUARD_BUDGET"
ENV_GC_THRESHOLD = "VRAMGUARD_GC_THRESHOLD"
ENV_PATCH_TORCH = "VRAMGUARD_PATCH_TORCH"
ENV_ARENA = "VRAMGUARD_ARENA"


_lock = threading.Lock()

# What install() calls, once it is done, to register the out-of-memory
# handler in IPython: vramguard/notebook/ipython.py, a layer above this one,
# adds it when imported (`import vramguard` imports it).
on_install_hooks = []


# ------------------------------------------------------------------ settings


def parse_budget_setting(budget):
    """(bytes, fraction of the device) from None, an int of bytes, a float
    fraction in (0, 1], or a string: "15GiB", "12.5GB", "0.8", "80%"."""
    if budget is None or budget == "":
        return 0, 0.0
    if isinstance(budget, float) or (isinstance(budget, str) and budget.strip().endswith("%")):
        fraction = _percent(budget) if isinstance(budget, str) else budget
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


def _percent(text):
    """The fraction "80%" writes; a ValueError naming the budget for what is
    not a number before the sign ("%", "lots%")."""
    try:
        return float(text.strip()[:-1]) / 100
    except ValueError:
        raise ValueError(f"a budget given as a percentage must be a number followed by %, e.g. '80%', "
                         f"got {text!r}") from None


def _parse_gc(gc_threshold):
    if gc_threshold is None or gc_threshold == "":
        return 0.0
    if isinstance(gc_threshold, bool):  # float(True) is 1.0: a flag passed where a fraction goes
        raise ValueError(f"gc_threshold must be a fraction in (0, 1], got {gc_threshold!r}")
    try:
        value = float(gc_threshold)
    except (TypeError, ValueError):
        raise ValueError(f"gc_threshold must be a fraction in (0, 1], got {gc_threshold!r}") from None
    if not 0.0 < value <= 1.0:
        raise ValueError(f"gc_threshold must be a fraction in (0, 1], got {gc_threshold!r}")
    return value


def _parse_arena(arena):
    """True, False or None (the default: the C core's, used where the
    device supports virtual memory); from VRAMGUARD_ARENA ("1" or "0")
    when the argument is None."""
    if arena is None:
        text = os.environ.get(ENV_ARENA, "")
        if text not in ("", "1", "0"):
            raise ValueError(f"{ENV_ARENA} must be 1 (the arena) or 0 (segments), got {text!r}")
        return None if text == "" else text == "1"
    if not isinstance(arena, bool):
        raise ValueError(f"arena must be True (the arena), False (segments) or None (the default), "
                         f"got {arena!r}")
    return arena


def _choose_arena(arena):
    """Hands the choice to the device registry; heaps keep what they were
    created with, so a change once one exists would apply to no one."""
    if arena is None and install_state["arena"] is not None:
        return  # a later install() without it keeps the first one's choice
    wanted = _core.arena_default() if arena is None else arena
    if install_state["arena"] is not None and wanted != install_state["arena"] and _core.existing_devices():
        raise VramguardError(
            f"arena={wanted} cannot take effect: the device heaps exist already, on "
            f"{'the arena' if install_state['arena'] else 'segments'}. Restart the runtime and pass arena "
            "to the first install().")
    _core.use_arena(arena)
    install_state["arena"] = wanted


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


class _Kept:
    """install()'s default for the budget and the threshold: left out, a
    later install() keeps what the earlier one set, where None turns it off."""

    def __repr__(self):
        return "<as before>"


_KEPT = _Kept()


def install(budget=_KEPT, gc_threshold=_KEPT, patch_torch=None, oom_error=None, arena=None):
    """Make vramguard PyTorch's CUDA allocator. Call it before anything
    initialises CUDA: a tensor on the GPU, but also get_device_name(),
    get_device_properties(), mem_get_info() (is_available() and
    device_count() do not; cuda_started.py). A budget larger than a device
    warns once CUDA starts; a bad setting raises from this call.

    budget: the most memory vramguard may reserve per device: bytes, a
        string ("14GiB", "12.5GB"), a GPU preset ("T4", "L4", "A100-40GB"),
        or a fraction of the device (0.8, "80%").
        Use it to behave like a smaller GPU (budget="T4" on an A100).
    gc_threshold: a fraction of the budget past which idle cached segments
        are released before the cache grows.
    patch_torch: make the memory statistics of torch.cuda and
        torch.accelerator (memory_allocated(), memory_stats(), ...),
        mem_get_info(), get_per_process_memory_fraction() and
        torch.accelerator.empty_cache() use vramguard, and make PyTorch's
        memory history (_record_memory_history, _snapshot, _dump_snapshot,
        memory_snapshot), which PyTorch refuses under any pluggable
        allocator, run on vramguard's recording (default True).
    oom_error: "auto" (default): out-of-memory errors are
        torch.OutOfMemoryError, through a small C++ shim built against the
        installed torch the first time (cached in ~/.cache/vramguard),
        RuntimeError where it cannot be built; "runtime": RuntimeError,
        no build. Read once, by the first install().
    arena: True: one virtual address range per device with 2 MiB pages
        mapped as blocks need them (the CUDA driver's virtual memory
        calls), so that free neighbours always merge; False: segments
        from cudaMalloc; None: the default, the arena, since it needs
        the least memory on the real traces measured (minimum budget
        0.17-0.67% over the tensors' peak, against 1.4-1.6% for segments
        and 3.0-4.8% for PyTorch's policy). Where the device
        or the driver lacks virtual memory, segments, and summary() says
        why. Fixed once the first tensor is allocated.

    Settings left as None are read from VRAMGUARD_BUDGET,
    VRAMGUARD_GC_THRESHOLD, VRAMGUARD_PATCH_TORCH ("0" to turn off),
    VRAMGUARD_OOM_ERROR and VRAMGUARD_ARENA ("1" or "0"), for
    scripts launched by others. Calling install() again changes the budget
    and the threshold of every device heap; one it leaves out (and whose
    variable is unset) keeps what the earlier call set, where None turns
    it off."""
    if patch_torch is None:
        patch_torch = _patch_torch_from_env()
    if oom_error is None:
        oom_error = os.environ.get(_oom_shim.ENV_MODE) or "auto"
    if oom_error not in _oom_shim.MODES:
        raise ValueError(f"oom_error (or {_oom_shim.ENV_MODE}) must be 'auto' or 'runtime', got {oom_error!r}")
    try:
        nbytes, fraction = _setting(budget, ENV_BUDGET, parse_budget_setting, ("budget_bytes", "budget_fraction"))
        gc = _setting(gc_threshold, ENV_GC_THRESHOLD, _parse_gc, ("gc_threshold",))
        arena = _parse_arena(arena)
    except (ValueError, TypeError) as exc:
        raise public_error(exc) from None
    torch = _import_torch()
    with _lock:
        _choose_arena(arena)
        if not install_state["installed"]:
            _check_cuda(torch)
            _plug_in(torch, oom_error)
            install_state["nccl"] = nccl.use_legacy_process_group()
            graphs.end_pool_after_failed_capture(torch)
            _mode_watch.watch(torch, is_oom)  # the OOM report's "already under autocast, no_grad"
        _core.configure_devices(nbytes, fraction, gc)
        install_state["settings"] = {"budget_bytes": nbytes or None, "budget_fraction": fraction or None,
                              "gc_threshold": gc or None}
        if patch_torch and not install_state["patched"]:
            _torch_patches.patch(torch)
            install_state["patched"] = True
        _cudnn.keep_benchmark_off(torch)
    _over.warn_if_over(torch, nbytes)
    _register_in_ipython()


def public_error(exc):
    """The same error, raised again by the public call (`from None`): the
    user sees the line they wrote and the message, not the parsers' frames."""
    return type(exc)(*exc.args)


def _setting(value, env_name, parse, keys):
    """A setting of install(): the argument, else (None or left out) its
    environment variable (an error then names the variable, since the user
    did not type the value in this call), else, when left out of a later
    install(), what the earlier one set: install(gc_threshold=0.9) after
    install(budget="T4") keeps the budget, as a later install() keeps the
    arena. Nothing set: off."""
    if value is None or value is _KEPT:
        text = os.environ.get(env_name) or None
        if text is not None:
            try:
                return parse(text)
            except ValueError as exc:
                raise ValueError(f"{env_name}={text!r}: {exc}") from None
        settings = install_state["settings"]
        if value is _KEPT and settings is not None:
            kept = tuple(settings[key] or 0 for key in keys)
            return kept if len(kept) > 1 else kept[0]
        value = None
    return parse(value)


def _patch_torch_from_env():
    text = os.environ.get(ENV_PATCH_TORCH, "")
    if text not in ("", "1", "0"):
        raise ValueError(f"{ENV_PATCH_TORCH} must be 1 (patch torch.cuda's statistics) or 0 (leave them), "
                         f"got {text!r}")
    return text != "0"


def _register_in_ipython():
    """In IPython, an out-of-memory error recovers in the same notebook
    (vramguard/notebook/ipython.py). Never a reason for install() to fail."""
    try:
        for hook in on_install_hooks:
            hook()
    except Exception as exc:
        warnings.warn(f"vramguard: the out-of-memory handler for IPython was not registered ({exc!r}); "
                      "after an out-of-memory error, call vramguard.recover()", stacklevel=3)


def _plug_in(torch, oom_error="auto"):
    runtime = _core.cuda_runtime()
    if not runtime["found"] and not runtime["simulated"]:
        raise VramguardError(f"vramguard: {runtime['error']}")
    if torch.cuda.is_initialized():
        raise VramguardError(_cuda_started.too_late_message(torch))
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        _core.__file__, "vramguard_torch_malloc", "vramguard_torch_free"
    )
    install_state["hooks"] = _hooks.plug_in(torch, allocator, oom_error)
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as exc:
        raise VramguardError(_cuda_started.swap_refused_message(exc)) from exc
    _hooks.guard_checkpoint_state(torch, VramguardError)
    install_state["allocator"] = allocator  # PyTorch keeps its own reference too
    install_state["installed"] = True


def is_installed():
    """True once install() has made vramguard PyTorch's CUDA allocator."""
    return install_state["installed"]


# ------------------------------------------------------------------ the API


def stats(device=None):
    """The device's counters as a flat dict, with the key names of
    torch.cuda.memory_stats() where the quantity is the same, and
    "allocator": what the heap runs on, the arena or segments (and why).
    As PyTorch's, the quantities include the device's CUDA-graph private
    pools (private_pools, private_pool_reserved_bytes and
    reserved_bytes_by_private_pools say what they hold)."""
    require_installed()  # before the device's index, which asks torch
    index = device_index(device)
    out = _torch_stats.device_stats(index, device_heap(index))  # graph pools included
    out["allocator"] = _core.device_backing(index)
    return out


def empty_cache(device=None):
    """Release every wholly free cached segment (of one device, or of all);
    returns the bytes released."""
    require_installed()
    devices = _core.existing_devices() if device is None else [device_index(device)]
    return sum(_core.device_heap(d).empty_cache() for d in devices)


def reset_peaks(device=None):
    """Set every peak of a device's counters to its current value (its
    CUDA-graph pools' too, as torch.cuda.reset_peak_memory_stats() does)."""
    require_installed()  # before the device's index, which asks torch
    index = device_index(device)
    device_heap(index)
    _core.reset_device_peaks(index)


def is_oom(exc):
    """True for an out-of-memory error from vramguard or PyTorch: vramguard's
    is torch.OutOfMemoryError where install() could build its shim, else a
    RuntimeError with the same message."""
    return isinstance(exc, (RuntimeError, MemoryError)) and "out of memory" in str(exc)
