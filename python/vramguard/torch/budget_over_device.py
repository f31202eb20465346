"""A budget larger than the device: said, not passed over in silence.

A budget is the most vramguard reserves; on a device with less memory
(budget="16gb" on a 14.74 GiB T4, budget="T4" on an 8 GiB card) it never
binds, and the user who meant to behave like that GPU would read the
answers (find_max_batch's largest batch, an OOM's advice) as the budget's
when they are the device's. The device's figure is its total memory as
CUDA reports it (torch.cuda.get_device_properties(i).total_memory, the
heap's device_total_bytes).
"""
import os
import sys
import warnings

from .._units import format_size


class BudgetOverDeviceWarning(UserWarning):
    """install(budget=...) is larger than a device: the device is the limit."""


def over_device(budget_bytes, device_total, device_name=None, index=None):
    """The sentence for a budget of `budget_bytes` on a device of
    `device_total` bytes (`index` named where there are several), or None
    when the budget fits the device (or either figure is unknown)."""
    if not budget_bytes or not device_total or budget_bytes <= device_total:
        return None
    whose = "the device's" if index is None else f"device {index}'s"
    name = f" ({device_name})" if device_name else ""
    return (f"the budget of {format_size(budget_bytes)} is larger than {whose} {format_size(device_total)}{name}: "
            f"the device is the limit, not the budget")


def _callers_stacklevel():
    """The stacklevel of the first frame outside PyTorch and vramguard: the
    user's line that installed, or that first touched CUDA."""
    inside = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
              os.path.dirname(os.path.abspath(getattr(sys.modules.get("torch"), "__file__", "") or "/nonexistent")))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def _over_each_device(torch, budget_bytes):
    """The sentence for each device the budget is larger than."""
    count = torch.cuda.device_count()
    texts = []
    for index in range(count):
        properties = torch.cuda.get_device_properties(index)
        text = over_device(budget_bytes, properties.total_memory, getattr(properties, "name", None),
                           index if count > 1 else None)
        if text is not None:
            texts.append(text)
    return texts


def warn_if_over(torch, budget_bytes):
    """One warning per device the budget is larger than. Reading a device's
    total initialises CUDA, which install() must not do: before that, the
    check waits for PyTorch's own initialisation (torch.cuda._lazy_call runs
    it then, at the first tensor or device call)."""
    if not budget_bytes:
        return

    def check():
        try:
            texts = _over_each_device(torch, budget_bytes)
        except Exception:  # inside PyTorch's lazy init, a failure would fail the user's first CUDA call
            return
        for text in texts:
            warnings.warn(f"vramguard.install(): {text}.", BudgetOverDeviceWarning, stacklevel=_callers_stacklevel())

    if torch.cuda.is_initialized():
        check()
        return
    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if lazy_call is not None:
        lazy_call(check)
