"""Which line holds the memory: the Python stacks of allocations.

`vramguard.record(stacks=True)` keeps, for each allocation, the innermost
frames of user code (code outside torch, vramguard and the standard
library) as interned ids (csrc/python/py_stacks.c); a Trace keeps the same
as a StackTable. This module names frames for people ("train.py:82 step",
"cell [3], line 5 in step") and sums live memory by line.
"""
import getpass
import heapq
import os
import re
import sys
import sysconfig
import tempfile

from .. import _core
from ..render.words import count

__all__ = ["StackTable", "format_frame", "live_by_line", "generated_code_dirs", "DEFAULT_STACK_DEPTH",
           "MAX_STACK_DEPTH"]

#: User frames kept per allocation by default: the line that allocated and
#: the few that called it.
DEFAULT_STACK_DEPTH = 4
#: The most a recording or a trace file keeps.
MAX_STACK_DEPTH = _core.STACK_MAX_DEPTH

_IPYTHON_INPUT = re.compile(r"<ipython-input-(\d+)-[0-9a-fA-F]+>")
_IPYKERNEL_CELL = re.compile(r"[/\\]ipykernel_\d+[/\\][^/\\]+\.py$")


def _cell_number(filename):
    """The execution count of a notebook cell file, where the running
    IPython says (its compiler maps cell files to counts); None otherwise."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None) if ipython else None
    try:
        shell = get() if get else None
        mapping = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
        number = mapping.get(filename)
    except Exception:  # a display helper never fails a report
        return None
    return number if isinstance(number, int) else None


def format_frame(filename, line, name=None):
    """A frame as a person finds it: "train.py:82 step"; notebook cells as
    "cell [3], line 5 in step" (IPython's `<ipython-input-3-...>`, or an
    ipykernel cell file the running shell numbers) or "notebook cell, line
    5 in step" when the number is unknown. Module-level code has no name."""
    func = "" if name in (None, "", "<module>") else name
    match = _IPYTHON_INPUT.fullmatch(filename)
    number = int(match.group(1)) if match else None
    if match or _IPYKERNEL_CELL.search(filename):
        if number is None:
            number = _cell_number(filename)
        cell = f"cell [{number}]" if number is not None else "notebook cell"
        return f"{cell}, line {line}" + (f" in {func}" if func else "")
    base = filename.replace("\\", "/").rsplit("/", 1)[-1]
    return f"{base}:{line}" + (f" {func}" if func else "")


class StackTable:
    """Interned stacks: `frames`, unique (filename, line, function) tuples,
    and `stacks`, unique tuples of indices into frames, innermost first.
    A trace names an allocation's stack by its index in `stacks`."""

    def __init__(self, frames=(), stacks=()):
        self.frames = list(frames)
        self.stacks = list(stacks)
        self._frame_ids = {f: i for i, f in enumerate(self.frames)}
        self._stack_ids = {s: i for i, s in enumerate(self.stacks)}

    def __len__(self):
        return len(self.stacks)

    def __repr__(self):
        return f"<StackTable: {count(len(self.stacks), 'stack')} of {count(len(self.frames), 'frame')}>"

    def frame(self, filename, line, name):
        """The index of a frame, added on first sight."""
        key = (filename, line, name)
        index = self._frame_ids.get(key)
        if index is None:
            index = self._frame_ids[key] = len(self.frames)
            self.frames.append(key)
        return index

    def stack(self, frame_indices):
        """The index of a stack (a tuple of frame indices), added on first sight."""
        key = tuple(frame_indices)
        index = self._stack_ids.get(key)
        if index is None:
            index = self._stack_ids[key] = len(self.stacks)
            self.stacks.append(key)
        return index

    def frames_of(self, stack):
        """[(filename, line, function), ...] of stack index `stack`, innermost first."""
        return [self.frames[i] for i in self.stacks[stack]]

    def label(self, stack):
        """The innermost frame of stack `stack`, formatted: the line that allocated."""
        return format_frame(*self.frames[self.stacks[stack][0]])


def generated_code_dirs():
    """Folders of code that torch.compile writes and runs (Inductor's cache:
    its generated `call` functions allocate the compiled graph's buffers):
    not the user's, whose line is the one that called the compiled code.
    Where torch would put them (torch/_inductor/runtime/cache_dir_utils.py),
    without making them: TORCHINDUCTOR_CACHE_DIR, else
    <tmp>/torchinductor_<user>."""
    dirs = set()
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen:
        dirs.add(os.path.abspath(chosen) + os.sep)
    try:
        user = getpass.getuser()
    except (KeyError, ImportError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    dirs.add(os.path.join(tempfile.gettempdir(), "torchinductor_" + user) + os.sep)
    return dirs


def skip_rules():
    """(skip, keep) path prefixes for the stack capture: torch, the code
    torch.compile generates, vramguard and the standard library are not user
    code, site-packages under the standard library is (the longest matching
    prefix decides)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # vramguard/, not trace/
    skip = {package + os.sep, "<frozen "} | generated_code_dirs()
    torch = sys.modules.get("torch")
    origin = getattr(torch, "__file__", None)
    if origin is None:
        try:
            import importlib.util

            spec = importlib.util.find_spec("torch")
            origin = spec.origin if spec else None
        except (ImportError, ValueError):
            origin = None
    if origin:
        skip.add(os.path.dirname(os.path.abspath(origin)) + os.sep)
    paths = sysconfig.get_paths()
    keep = set()
    for key in ("stdlib", "platstdlib"):
        if paths.get(key):
            skip.add(os.path.abspath(paths[key]) + os.sep)
    for key in ("purelib", "platlib"):
        if paths.get(key):
            keep.add(os.path.abspath(paths[key]) + os.sep)
    try:
        import site

        keep.update(os.path.abspath(p) + os.sep for p in site.getsitepackages())
    except AttributeError:  # an old virtualenv's site module
        pass
    return tuple(sorted(skip)), tuple(sorted(keep))


def capture_table():
    """The extension's interned stacks as a StackTable (ids are indices + 1)
    and the number of captures that found its tables full."""
    frames, stacks, dropped = _core.stacks_table()
    return StackTable(frames, stacks), dropped


def group_by_line(items, table, top):
    """[(label, bytes, blocks)] for the `top` lines holding the most, from
    (bytes, stack index) pairs; stacks that are None are left out. Summed by
    stack first, so that each distinct line is named once however many
    blocks it holds (a label is a few regular expressions)."""
    by_stack = {}
    for size, stack in items:
        if stack is None:
            continue
        total, count = by_stack.get(stack, (0, 0))
        by_stack[stack] = (total + size, count + 1)
    by_frame = {}
    for stack, (size, count) in by_stack.items():
        frame = table.stacks[stack][0]
        total, blocks = by_frame.get(frame, (0, 0))
        by_frame[frame] = (total + size, blocks + count)
    lines = {}
    for frame, (size, count) in by_frame.items():
        label = format_frame(*table.frames[frame])  # frames in two folders may share one
        total, blocks = lines.get(label, (0, 0))
        lines[label] = (total + size, blocks + count)
    ranked = heapq.nlargest(top, ((size, count, label) for label, (size, count) in lines.items()))
    return [(label, size, count) for size, count, label in ranked]


def live_by_line(device=None, top=5):
    """The lines holding the most live memory on a device of the installed
    allocator: [(label, bytes, blocks)], largest first, for the blocks
    allocated while a recording kept stacks (`record(stacks=True)`); bytes
    are the requested sizes. Blocks without a stack are left out."""
    from ..torch.device_heaps import device_heap

    return heap_by_line(device_heap(device), top)


def heap_by_line(heap, top=5):
    """live_by_line for a Heap."""
    table, _ = capture_table()
    items = [
        (blk["requested"], blk["stack"] - 1 if 0 < blk.get("stack", 0) <= len(table) else None)
        for seg in heap.segments() for blk in seg["blocks"] if blk["state"] == "live"
    ]
    return group_by_line(items, table, top)
