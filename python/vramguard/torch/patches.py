"""The Python functions of torch.cuda and torch.accelerator that read the
allocator's statistics, made to read vramguard's device heaps
(install(patch_torch=True)); and PyTorch's memory history functions,
replaced by the stand-ins that vramguard/trace/memory_history.py registers.

Under any pluggable allocator PyTorch's memory statistics raise
(torch.cuda.memory_stats: "CUDAPluggableAllocator does not yet support
getDeviceStats", and so memory_allocated, memory_summary, ...,
get_per_process_memory_fraction: "getMemoryFraction"), and the
torch.accelerator ones read the native allocator, which is no longer used
(silent zeros, an empty_cache that does nothing). No hook of the pluggable
allocator covers them, so the Python functions are replaced here. What a
hook covers stays PyTorch's own (hooks.py sets the hooks):
torch.cuda.empty_cache, set_per_process_memory_fraction and
Tensor.record_stream, with PyTorch's argument checks.

Each replacement keeps the native function's contract:
- arguments are read by PyTorch's own helpers (torch.cuda._utils and
  torch.accelerator._utils._get_device_index), so the same devices are
  accepted and the same errors raised;
- a statistics call never starts CUDA: before CUDA is initialised it
  returns what the native one does (0, an empty dict) without resolving
  "the current device", which would create a context on GPU 0 in every
  process (and trip accelerate's notebook_launcher fork check);
- it never creates a heap, which would create a context on that device: a
  device vramguard has not used reads as zeros;
- mem_get_info and get_memory_info run PyTorch's own first (its checks,
  its CUDA start), then apply the budget.
"""
import collections
import functools

from .. import _core
from . import stats as _torch_stats
from .state import install_state
from ..render import words
from ..render.summary import SEARCH_OOMS, format_summary, with_device_room
from . import search_ooms


def _existing_heap(index):
    """The device heap if vramguard has used that device, else None."""
    return _core.device_heap(index) if index in _core.existing_devices() else None


def _heap_stats(index):
    """The device's figures, its CUDA-graph pools included."""
    heap = _existing_heap(index)
    return _torch_stats.device_stats(index, heap) if heap is not None else {}


def _check_index(torch, index):
    """What the native allocator refuses with 'Invalid device argument'."""
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise RuntimeError(f"Invalid device argument {index}: this process sees {words.count(count, 'CUDA device')}")
    return index


# ------------------------------------------------------------------ torch.cuda


class CudaStats:
    """torch.cuda's statistics over vramguard's heaps."""

    def __init__(self, torch):
        self.torch = torch
        from torch.cuda import _utils

        self.device_index = _utils._get_device_index

    def index(self, device):
        """The device a statistics call is about; None before CUDA starts."""
        if not self.torch.cuda.is_initialized():
            return None
        return _check_index(self.torch, self.device_index(device, optional=True))

    def memory_stats(self, device=None):
        index = self.index(device)
        if index is None:
            return collections.OrderedDict()
        return _torch_stats.flat(_heap_stats(index))

    def memory_stats_as_nested_dict(self, device=None):
        index = self.index(device)
        return {} if index is None else _torch_stats.nested(_heap_stats(index))

    def reset_peak_memory_stats(self, device=None):
        index = self._used_index(device)
        if index is not None:
            _core.reset_device_peaks(index)

    def reset_accumulated_memory_stats(self, device=None):
        index = self._used_index(device)
        if index is not None:
            _core.reset_device_accumulated(index)
            search_ooms.clear(index)  # counted in num_ooms, reset with it

    def _used_index(self, device):
        """The device's index when vramguard has a heap for it, else None."""
        index = self.index(device)
        return None if index is None or _existing_heap(index) is None else index

    def memory_summary(self, device=None, abbreviated=False):
        index = self.index(device)
        stats = {} if index is None else _heap_stats(index)
        if index is None:
            index = self.named_index(device)
        else:
            with_device_room(stats, _existing_heap(index))
            stats[SEARCH_OOMS] = search_ooms.count(index)
        # PyTorch's full table unless abbreviated: every counter, zeros too.
        return format_summary(stats, title=f"vramguard memory summary, device {index}", verbose=not abbreviated)

    def named_index(self, device):
        """The index a device argument names, without asking CUDA which
        device is current: before CUDA starts that is device 0."""
        if isinstance(device, str):
            device = self.torch.device(device)
        if device is None or (isinstance(device, self.torch.device) and device.type == "cuda"
                              and device.index is None):
            return 0
        return self.device_index(device)


def _budget_of(torch, index, total):
    """(budget, reserved) of a device: its heap's, or for a device not used
    yet, what install() would give it."""
    heap = _existing_heap(index)
    if heap is not None:
        stats = _torch_stats.device_stats(index, heap)  # graph pools share the budget
        return stats["budget_bytes"], stats["reserved_bytes.all.current"]
    settings = install_state["settings"] or {}
    if settings.get("budget_fraction"):
        return int(total * settings["budget_fraction"]), 0
    return settings.get("budget_bytes") or 0, 0


def within_budget(torch, index, free, total):
    """mem_get_info under a budget: total is the budget (or the device, if
    smaller), free what the budget still lets vramguard reserve, bounded by
    what the device has free. As with the native allocator, memory cached
    and unused counts as used (memory_reserved() - memory_allocated() is
    that part), so that free + cached is never counted twice."""
    budget, reserved = _budget_of(torch, index, total)
    if not budget:
        return free, total
    return max(0, min(free, budget - reserved)), min(total, budget)


def _mem_get_info(torch, original):
    from torch.cuda import _utils

    @functools.wraps(original)
    def mem_get_info(device=None):
        free, total = original(device)  # starts CUDA as the native one does, and checks the device
        index = torch.cuda.current_device() if device is None else _utils._get_device_index(device, optional=True)
        return within_budget(torch, index, free, total)

    return mem_get_info


def _get_fraction(torch, original):
    from torch.cuda import _utils

    @functools.wraps(original)
    def get_per_process_memory_fraction(device=None):
        torch.cuda._lazy_init()
        index = torch.cuda.current_device() if device is None else _utils._get_device_index(device)
        total = torch.cuda.get_device_properties(_check_index(torch, index)).total_memory
        budget, _ = _budget_of(torch, index, total)
        if budget == _core.BUDGET_NOTHING:  # how the memory-fraction hook keeps a fraction of 0
            return 0.0
        return min(1.0, budget / total) if budget else 1.0

    return get_per_process_memory_fraction


def patch_cuda(torch):
    stats = CudaStats(torch)
    memory = torch.cuda.memory
    replacements = {
        "memory_stats": stats.memory_stats,
        "memory_stats_as_nested_dict": stats.memory_stats_as_nested_dict,
        "reset_peak_memory_stats": stats.reset_peak_memory_stats,
        "reset_accumulated_memory_stats": stats.reset_accumulated_memory_stats,
        "memory_summary": stats.memory_summary,
        "mem_get_info": _mem_get_info(torch, memory.mem_get_info),
    }
    if hasattr(memory, "get_per_process_memory_fraction"):
        replacements["get_per_process_memory_fraction"] = _get_fraction(
            torch, memory.get_per_process_memory_fraction)
    # memory_allocated, max_memory_reserved, memory_cached, ... and
    # reset_max_memory_allocated stay PyTorch's: they call memory_stats and
    # reset_peak_memory_stats of torch.cuda.memory, replaced here.
    _replace(replacements, torch.cuda, memory)


def _replace(replacements, *modules):
    for name, fn in replacements.items():
        for module in modules:
            if hasattr(module, name):
                setattr(module, name, fn)


# ------------------------------------------------------------------ torch.accelerator


class AcceleratorStats:
    """torch.accelerator's statistics (newer PyTorch; 2.15 here) over
    vramguard's heaps, when the accelerator is CUDA."""

    def __init__(self, torch):
        self.torch = torch
        from torch.accelerator import _utils

        self.device_index = _utils._get_device_index

    def index(self, device_index):
        if not self.torch.cuda.is_initialized():
            return None
        return _check_index(self.torch, self.device_index(device_index, optional=True))

    def memory_stats(self, device_index=None, /):
        index = self.index(device_index)
        if index is None:
            return collections.OrderedDict()
        return _torch_stats.flat(_heap_stats(index), private_pools=False)

    def reset_peak_memory_stats(self, device_index=None, /):
        index = self.index(device_index)
        if index is not None and _existing_heap(index) is not None:
            _core.reset_device_peaks(index)

    def reset_accumulated_memory_stats(self, device_index=None, /):
        index = self.index(device_index)
        if index is not None and _existing_heap(index) is not None:
            _core.reset_device_accumulated(index)
            search_ooms.clear(index)

    def empty_cache(self):
        # torch.cuda's: the reset hook, once CUDA has started
        self.torch.cuda.empty_cache()

    def get_memory_info(self, original):
        @functools.wraps(original)
        def get_memory_info(device_index=None, /):
            free, total = original(device_index)  # checks the device, starts CUDA as the native one does
            return within_budget(self.torch, self.device_index(device_index, optional=True), free, total)

        return get_memory_info


def patch_accelerator(torch):
    accelerator = getattr(torch, "accelerator", None)
    memory = getattr(accelerator, "memory", None)
    if memory is None or not hasattr(memory, "memory_stats"):
        return  # an older PyTorch
    current = accelerator.current_accelerator()
    if current is None or current.type != "cuda":
        return
    stats = AcceleratorStats(torch)
    replacements = {
        "memory_stats": stats.memory_stats,
        "reset_peak_memory_stats": stats.reset_peak_memory_stats,
        "reset_accumulated_memory_stats": stats.reset_accumulated_memory_stats,
        "empty_cache": stats.empty_cache,
    }
    if hasattr(memory, "get_memory_info"):
        replacements["get_memory_info"] = stats.get_memory_info(memory.get_memory_info)
    # memory_allocated, max_memory_reserved, ... stay PyTorch's: they call
    # torch.accelerator.memory.memory_stats, replaced here.
    _replace(replacements, accelerator, memory)


# ------------------------------------------------------------------ memory history

#: Makers of stand-ins for PyTorch's memory history ({name: function} from
#: make(torch)): vramguard/trace/memory_history.py, a layer above this one,
#: adds its own when imported (`import vramguard` imports it). PyTorch
#: refuses its own (_record_memory_history, _snapshot and so
#: _dump_snapshot, memory_snapshot) under any pluggable allocator.
history_stand_ins = []


def patch_history(torch):
    memory = torch.cuda.memory
    for make in history_stand_ins[-1:]:
        made = make(torch)
        _replace({name: fn for name, fn in made.items() if hasattr(memory, name)}, torch.cuda, memory)


def patch(torch):
    patch_cuda(torch)
    patch_accelerator(torch)
    patch_history(torch)
