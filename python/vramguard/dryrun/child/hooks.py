"""What the child adjusts in PyTorch around the script, each counted for
the report: DistributedDataParallel's reads of device values, GradScaler's
scale, the memory history PyTorch records, and vramguard's own recording
where the script starts one of its own."""
import functools
import sys

from ..need import HISTORY_ENTRIES
from .log import say
from .stderr_filter import drop_from_stderr

__all__ = ["adjust_ddp", "give_way_to_the_scripts_recording", "hook_grad_scaler", "start_history"]

_UNUSED_PARAMETERS_WARNING = "find_unused_parameters=True was specified in DDP constructor"


def adjust_ddp(run):
    """DDP reads two things back from the device, which a phantom
    answers with zeros: its start-up check of the parameters (init_sync)
    fails, and after the first step rank 0's new bucket order arrives as
    zeros, which crashes every rank. So each DistributedDataParallel
    gets init_sync=False and find_unused_parameters=True (which keeps
    the first order: the same buckets of the same sizes), static_graph
    off (it rebuilds too); counted, and the report says so."""
    import inspect

    ddp = getattr(getattr(run.torch.nn, "parallel", None), "DistributedDataParallel", None)
    if ddp is None:
        return
    original = ddp.__init__
    signature = inspect.signature(original)
    wanted = {"init_sync": False, "find_unused_parameters": True, "static_graph": False}
    wanted = {k: v for k, v in wanted.items() if k in signature.parameters}

    @functools.wraps(original)
    def __init__(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs)
        changed = {k: v for k, v in wanted.items()
                   if bound.arguments.get(k, signature.parameters[k].default) != v}
        if not changed:
            return original(*args, **kwargs)
        run.ddp_adjusted += 1
        if "find_unused_parameters" in changed and not run.dropping_unused_warning:
            # PyTorch's C++ then warns, at every rank's first backward, that no
            # parameter was unused: the dry run's doing, not the script's
            run.dropping_unused_warning = drop_from_stderr(_UNUSED_PARAMETERS_WARNING)
        bound.arguments.update(changed)
        return original(*bound.args, **bound.kwargs)

    ddp.__init__ = __init__


def give_way_to_the_scripts_recording(run):
    """A heap has one recording at a time: where the script starts its
    own (vramguard.record(), start_recording(): the quickstart does) on
    the heap the dry run records, the dry run's stops there, instead of
    the script failing with "recordings do not nest". Its snapshot then
    covers the run up to that point (said)."""
    from ...trace import record as recording

    original = recording.record.start

    @functools.wraps(original)
    def start(rec):
        mine = run.recording
        if rec is not mine and recording.stop_in_favour_of(mine, rec.heap):
            run.gave_way = True
            say("the script records the GPU's memory itself: the dry run's own recording stopped there, "
                 "so its snapshot covers the run up to that point")
        return original(rec)

    recording.record.start = start


def hook_grad_scaler(run):
    """Counts the GradScalers the script makes that are on: on a phantom
    their scale reads 0, which the report says."""
    scaler = getattr(getattr(run.torch, "amp", None), "GradScaler", None)
    if scaler is None:
        return
    original = scaler.__init__

    @functools.wraps(original)
    def __init__(obj, *args, **kwargs):
        original(obj, *args, **kwargs)
        if getattr(obj, "_enabled", True):
            run.grad_scalers += 1

    scaler.__init__ = __init__


def start_history(run):
    torch = run.torch
    if "vramguard" in sys.modules and sys.modules["vramguard"].is_installed():
        return  # the script installed vramguard: PyTorch's history is refused under it
    try:
        torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES, stacks="python")
        run.history = True
    except Exception as exc:  # an older PyTorch without stacks="python"
        say(f"memory history not recorded: {exc}")
