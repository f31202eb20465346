"""Why install() comes too late: what started CUDA before it.

PyTorch swaps its allocator only before CUDA is initialised
(torch._C._cuda_changeCurrentAllocator refuses after), and its lazy init
runs on the first tensor put on the GPU but also on the first call that
asks the device anything: get_device_name(), get_device_properties(),
get_device_capability(), mem_get_info(), current_device(), set_device(),
synchronize(), is_bf16_supported(), torch.cuda.init(). is_available(),
device_count(), memory_allocated(), manual_seed() and empty_cache() do
not (each checked with PyTorch 2.15 on the phantom GPU). Users run such
calls in a first cell to see which GPU they got, and then read "before
any tensor is put on the GPU" without having made one: the message says
which of the two happened.
"""
from ..render.words import count

#: What people run to look at their GPU, each one initialising CUDA.
INITIALISING_CALLS = ("torch.cuda.get_device_name()", "get_device_properties()", "mem_get_info()",
                      "get_device_capability()", "current_device()", "set_device()")

#: Calls checked, as the tests run them (tests/torch/test_install.py), and
#: as docs/notebook.md lists them: those that initialise CUDA, and those
#: that do not.
INITIALISE = ("torch.cuda.get_device_name()", "torch.cuda.get_device_properties(0)", "torch.cuda.mem_get_info()",
              "torch.cuda.get_device_capability()", "torch.cuda.current_device()", "torch.cuda.set_device(0)",
              "torch.cuda.synchronize()", "torch.cuda.is_bf16_supported()", "torch.cuda.init()")
DO_NOT_INITIALISE = ("torch.cuda.is_available()", "torch.cuda.device_count()", "torch.cuda.memory_allocated()",
                     "torch.cuda.empty_cache()", "torch.cuda.manual_seed(0)", "torch.manual_seed(0)",
                     "torch.device('cuda')")

_RESTART = "Restart the runtime (in Colab: Runtime > Restart session), then call vramguard.install() first"
_BEFORE = ("before any tensor is put on the GPU and before any torch.cuda call that asks about the device "
           "(torch.cuda.is_available() and device_count() do not initialise CUDA and may come before it; "
           "docs/notebook.md lists the calls that do)")


def _allocations_made(torch):
    """The tensors PyTorch's own allocator has put on the GPU so far, or
    None when its statistics cannot tell."""
    try:
        return int(torch.cuda.memory_stats().get("allocation.all.allocated", 0))
    except Exception:
        return None


def _cause(made):
    calls = ", ".join(INITIALISING_CALLS[:-1]) + " or " + INITIALISING_CALLS[-1]
    if made == 0:
        return (f"CUDA is already initialised in this process, though no tensor was put on the GPU: a call "
                f"such as {calls} initialises it, and PyTorch cannot swap its allocator once CUDA is initialised.")
    if made is None:
        return (f"CUDA is already initialised in this process, by a tensor put on the GPU or by a call such "
                f"as {calls}, and PyTorch cannot swap its allocator once CUDA is initialised.")
    return (f"PyTorch's CUDA allocator is already in use in this process: tensors were put on the GPU "
            f"({count(made, 'allocation')} so far), and PyTorch cannot swap an allocator once it has been used.")


def too_late_message(torch):
    """The refusal of an install() after CUDA was initialised: what did it
    (a tensor, or a call that only looked at the device) and what to do."""
    return f"{_cause(_allocations_made(torch))} {_RESTART}, {_BEFORE}."


def swap_refused_message(refusal):
    """PyTorch refused the swap though CUDA was not initialised: another
    allocator was set first (change_current_allocator), which a tensor
    never does."""
    said = str(refusal).splitlines()[0] if str(refusal) else type(refusal).__name__
    return (f"PyTorch refused to make vramguard its CUDA allocator ({said!r}): another allocator was set in "
            f"this process first (torch.cuda.memory.change_current_allocator()). {_RESTART}, {_BEFORE}.")
