"""The device heaps vramguard's allocator serves, as the package's other
modules reach them: one Heap object per device (a recording started on a
device's heap is found again by its object: start_recording, then
stop_recording or dump_snapshot with no heap named), and the refusal of
every call that needs install() first."""
from .. import _core
from .state import install_state

__all__ = ["VramguardError", "current_device_heap", "device_heap", "device_index", "index_of_heap", "require_installed"]


class VramguardError(RuntimeError):
    """vramguard cannot do what was asked; the message says what to do."""


def device_index(device):
    """The index of `device` (an int, a torch.device, "cuda:1", None: the current one)."""
    if isinstance(device, int):
        return device
    import torch

    return torch.cuda._get_device_index(device, optional=True)


def require_installed():
    if not install_state["installed"]:
        raise VramguardError("vramguard is not installed: call vramguard.install() first")


# _core.device_heap makes a new Heap object at each call: kept here, one per device.
_heaps = {}


def device_heap(device=None):
    require_installed()
    index = device_index(device)
    heap = _heaps.get(index)
    return heap if heap is not None else _heaps.setdefault(index, _core.device_heap(index))


def index_of_heap(heap):
    """The device index of one of the device heaps above, or None (a heap of its own)."""
    return next((index for index, known in list(_heaps.items()) if known is heap), None)


def current_device_heap():
    return device_heap(None)
