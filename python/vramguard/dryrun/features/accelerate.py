"""accelerate on a phantom: what its code reads back from the device, and
the batch size its search settles on.

pad_across_processes (every HF Trainer evaluation calls it through
Accelerator.pad_across_processes) gathers each tensor's shape on the device
and reads it back to pad to the largest: a phantom reads zeros, so it pads
to size 0 and fails ("The expanded size of the tensor (0) must match the
existing size"). The sizes pass through a gather, which computes nothing
here, so no general cure can keep them. With one process there is nothing
to pad, and the tensor is returned as it is; with several, each rank's
tensor is taken as the largest (a card pads a short last batch: a few rows
more). Each call is counted and the report says so.

find_executable_batch_size (TrainingArguments(auto_find_batch_size=True))
retries its function at smaller batch sizes after an out-of-memory error:
the sizes it tried and the one whose run returned are recorded.

Installed from the child before the script runs: accelerate may be imported
later, so an import hook patches its modules as they load.
"""
import functools
import sys

from .after_import import patch_after_import
from ...render.words import count, plural
from .base import Feature

OPERATIONS = "accelerate.utils.operations"
MEMORY = "accelerate.utils.memory"
#: every module that binds the two functions by name at its import
BINDERS = {"pad_across_processes": (OPERATIONS, "accelerate.utils", "accelerate.accelerator"),
           "find_executable_batch_size": (MEMORY, "accelerate.utils")}


class Record:
    """What the adjustments saw: read by the child into its result."""

    def __init__(self):
        self.unpadded = 0       # pad_across_processes calls left unpadded
        self.batch_sizes = []   # find_executable_batch_size: each size tried, in order
        self.batch_size = None  # the size whose run returned


def _unpadded(original, record):
    @functools.wraps(original)
    def pad_across_processes(tensor, dim=0, pad_index=0, pad_first=False):
        record.unpadded += 1
        return tensor
    return pad_across_processes


def _recorded(original, record):
    @functools.wraps(original)
    def find_executable_batch_size(function=None, starting_batch_size=128, reduce_batch_size_fn=None, **kwargs):
        if function is None:  # used as @find_executable_batch_size(starting_batch_size=...)
            return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                     reduce_batch_size_fn=reduce_batch_size_fn, **kwargs)

        @functools.wraps(function)
        def attempt(batch_size, *args, **kw):
            record.batch_sizes.append(batch_size)
            result = function(batch_size, *args, **kw)
            record.batch_size = batch_size
            return result

        return original(function=attempt, starting_batch_size=starting_batch_size,
                        reduce_batch_size_fn=reduce_batch_size_fn, **kwargs)
    return find_executable_batch_size


def _patch(module_name, record):
    """Replaces the functions `module_name` defines or binds; the defining
    module's own are wrapped, the others take the wrapped ones."""
    module = sys.modules.get(module_name)
    make = {"pad_across_processes": _unpadded, "find_executable_batch_size": _recorded}
    for name, modules in BINDERS.items():
        if module_name not in modules or not hasattr(module, name):
            continue
        home = sys.modules.get(modules[0])
        current = getattr(home, name, None)
        if current is None:
            continue
        if not getattr(current, "_vramguard_adjusted", False):
            current = make[name](current, record)
            current._vramguard_adjusted = True
            setattr(home, name, current)
        setattr(module, name, current)


def install():
    """The record that the adjustments fill; accelerate's modules already
    loaded are patched now, the others as they load (the defining modules
    first: the others bind what those define)."""
    record = Record()
    patch_after_import((OPERATIONS, MEMORY, "accelerate.utils", "accelerate.accelerator"),
                       lambda name: _patch(name, record))
    return record


def notes(runs, nproc):
    """The report's lines on what the adjustments did: none when nothing."""
    out = []
    unpadded = max((r.get("accelerate_unpadded") or 0 for r in runs), default=0)
    if unpadded:
        how = ("one process has nothing to pad" if nproc <= 1 else
               "each rank's tensors taken as the largest; a card pads a short last batch by a few rows")
        out.append(f"accelerate's pad_across_processes reads tensor sizes back from the device (zeros here): "
                   f"the dry run left its {count(unpadded, 'call')} unpadded ({how}).")
    for r in runs:
        tried = r.get("auto_batch_sizes") or []
        if tried:
            out.append(f"{r['allocator']}: auto_find_batch_size {_search(tried, r.get('auto_batch_size'))}.")
    return out


def _search(tried, settled):
    sizes = ", ".join(str(s) for s in tried)
    if settled is None:
        return f"tried {plural(len(tried), 'batch size')} {sizes}; none ran to its end"
    if len(tried) == 1:
        return f"kept its starting batch size, {settled}"
    larger = ", ".join(str(s) for s in tried[:-1])
    errors = f"error at {larger} was" if len(tried) == 2 else f"errors at {larger} were"
    return f"settled on batch size {settled} (tried {sizes}; the out-of-memory {errors} caught by it)"


class _Accelerate(Feature):
    name = "accelerate"

    def install(self, run):
        return install()

    def figures(self, record, run):
        return {"accelerate_unpadded": record.unpadded if record else 0,
                "auto_batch_sizes": record.batch_sizes if record else [],
                "auto_batch_size": record.batch_size if record else None}

    def notes(self, result, runs):
        return notes(runs, max([len(r.get("ranks") or []) for r in runs] + [1]))


FEATURE = _Accelerate()
