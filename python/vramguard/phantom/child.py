"""The child of a dry run (dryrun.py): one run of the user's script (or
notebook) on a phantom GPU, under one allocator, in a process of its own.

    python -m vramguard.phantom.child --allocator native --result R.json \
        [--snapshot S.pickle] [--steps N] [--notebook] -- SCRIPT ARGS...

The parent sets the phantom's environment (vramguard.phantom.gpu.environ, the
CUDA context's memory in VG_FAKECUDA_CONTEXT) and PYTORCH_CUDA_ALLOC_CONF
for `expandable`. Here: vramguard is installed for `vramguard`, the
memory history is recorded with stacks, and the script runs as __main__
with its own sys.argv. Whatever happens to it (it ends, it exits, it runs
out of memory, it raises), the figures go to the result file as JSON; the
exit status is the script's (1 for an uncaught exception, its own for
sys.exit).
"""
import argparse
import ctypes
import functools
import json
import linecache
import os
import re
import resource
import runpy
import signal
import sys
import sysconfig
import time
import traceback
import warnings

from ..trace.stacks import generated_code_dirs
from .ending import Endings
from .extensions import launched_extensions
from .need import HISTORY_ENTRIES

ALLOCATORS = ("native", "expandable", "vramguard")
# "Tried to allocate 2.00 GiB" in PyTorch's (and vramguard's) out-of-memory message.
_TRIED = re.compile(r"Tried to allocate ([0-9.]+) (B|bytes|KiB|MiB|GiB|TiB)")
_UNIT = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
LOG = "vramguard dryrun:"
#: The phantom's calls that put work on the device: memory taken, a kernel
#: launched. A run that made none never used the GPU (CUDA initialised, a
#: device's name read, is not a use), whatever the allocator's set-up did.
GPU_WORK_CALLS = ("cudaMalloc", "cudaMallocAsync", "cuMemAlloc", "cuMemCreate", "cudaLaunchKernel",
                  "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                  "cuLaunchCooperativeKernel")
#: Words of the errors the phantom's stubs return (runtime and driver, cuBLAS, cuDNN, NCCL).
_STUB_ERRORS = ("not supported", "not_supported", "not implemented", "invalid usage")
#: At most this often (seconds) the figures are written as the run goes (after an optimizer step).
PROGRESS_EVERY_S = 0.5
#: Steps after which exit()'s handler is registered again (ending.py): the
#: first ones make what a run's later steps reuse; each registration stays
#: for the process's life, so not at every step.
REARM_STEPS = 3
_UNUSED_PARAMETERS_WARNING = "find_unused_parameters=True was specified in DDP constructor"
#: PyTorch's own warnings that it has no kernels for the device: the dry run
#: says it once, in its report (card_arch), not once per run.
_NO_KERNELS_WARNINGS = (r"(?s).*which is of compute capability", r"(?s).*is not compatible with the current PyTorch")


class _StopRun(BaseException):
    """--steps reached: the run ends there, as if the script had."""


class _Terminated(BaseException):
    """SIGTERM while the script ran (the dry run's --timeout): the run ends
    there, and its figures so far are written."""


def _say(text):
    print(f"{LOG} {text}", file=sys.stderr, flush=True)


def _mib(nbytes):
    return f"{nbytes / (1 << 20):,.1f} MiB"


# ------------------------------------------------------------------ whose code


def _not_user_prefixes():
    """Paths whose frames are not the user's: the standard library,
    site-packages (torch, transformers, ...), torch wherever it is, the code
    torch.compile generated (its line is the user's that called it) and
    vramguard itself."""
    prefixes = {os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep}  # vramguard/
    prefixes |= generated_code_dirs()
    torch = sys.modules.get("torch")
    if getattr(torch, "__file__", None):
        prefixes.add(os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            prefixes.add(os.path.abspath(paths[key]) + os.sep)
    try:
        import site

        prefixes.update(os.path.abspath(p) + os.sep for p in site.getsitepackages())
        prefixes.add(os.path.abspath(site.getusersitepackages()) + os.sep)
    except (AttributeError, TypeError):
        pass
    return tuple(prefixes)


_NOT_USER = None


def is_user_file(filename):
    global _NOT_USER
    if _NOT_USER is None:
        _NOT_USER = _not_user_prefixes()
    if not filename or filename.startswith("<frozen") or filename.startswith("<string"):
        return False
    if filename.startswith("<") or "[cell " in filename:
        return True  # a notebook's cell
    path = os.path.abspath(filename)
    return not (path.startswith(_NOT_USER) or f"{os.sep}site-packages{os.sep}" in path
                or f"{os.sep}dist-packages{os.sep}" in path)


def show_file(filename):
    """A file as the report names it: relative to the working directory
    when under it."""
    if filename.startswith("<") or "[cell " in filename:
        return filename
    path = os.path.abspath(filename)
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def user_line(frames):
    """"file:line" of the innermost user frame of `frames`, (filename, line)
    pairs innermost first; None when none is the user's."""
    for filename, line in frames:
        if is_user_file(filename):
            return f"{show_file(filename)}:{line}"
    return None


#: Packages whose frames are PyTorch's machinery, never a model's code.
_TORCH_PACKAGES = ("torch", "torchgen", "functorch", "triton", "vramguard")


def _library_name(path):
    """"transformers/models/gpt2/modeling_gpt2.py" for a file under
    site-packages (or dist-packages), else None."""
    for marker in (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return None


def library_line(frames, user):
    """Where a library's code (a model's forward in transformers, a
    Trainer's step) asked for the memory: "package/file.py:line" of the
    innermost frame under site-packages outside PyTorch's own packages,
    when it lies inside the user's line `user` (a `trainer.train()` line
    names nothing of the model); None when the innermost frame outside
    PyTorch is the user's own."""
    if user is None:
        return None
    for filename, line in frames:
        if is_user_file(filename):
            return None
        name = _library_name(os.path.abspath(filename)) if filename else None
        if name and name.split(os.sep, 1)[0] not in _TORCH_PACKAGES:
            return f"{name}:{line}"
    return None


def _traceback_frames(exc):
    frames = [(fs.filename, fs.lineno) for fs in traceback.extract_tb(exc.__traceback__)]
    return frames[::-1]


# ------------------------------------------------------------------ notebooks

_RUN_BODY = {"time", "capture", "timeit", "prun"}  # cell magics whose body is Python to run
#: Line magics whose argument is a statement (after their options): the statement is kept.
_WRAPS = {"time": "", "timeit": "nrp", "prun": "DTls"}  # the options that take a value
_SHELL_ASSIGN = re.compile(r"^[A-Za-z_][\w, ]*=\s*[!%]")


class _Lines:
    """Where a line of Python starts: at a new statement, or inside one
    (open brackets, a string over several lines, a backslash continuation).
    Fed one line at a time; its own small scanner, so that it reads lines
    that are not Python (the magics) as tokenize would not."""

    def __init__(self):
        self.depth = 0
        self.quote = None  # the open string's delimiter
        self.continued = False

    @property
    def at_statement(self):
        return self.depth == 0 and self.quote is None and not self.continued

    def feed(self, line):
        i, n, comment = 0, len(line), False
        while i < n:
            c = line[i]
            if self.quote is not None:
                if c == "\\":
                    i += 2
                    continue
                if line.startswith(self.quote, i):
                    i += len(self.quote)
                    self.quote = None
                    continue
                i += 1
                continue
            if c == "#":
                comment = True
                break
            if c in "'\"":
                self.quote = c * 3 if line.startswith(c * 3, i) else c
                i += len(self.quote)
                continue
            if c in "([{":
                self.depth += 1
            elif c in ")]}":
                self.depth = max(0, self.depth - 1)
            i += 1
        ends_in_backslash = not comment and line.endswith("\\")
        if self.quote is not None and len(self.quote) == 1 and not ends_in_backslash:
            self.quote = None  # a one-line string does not go on past its line
        self.continued = ends_in_backslash and self.quote is None


def _wrapped_statement(stripped):
    """The statement of `%time STMT`, `%timeit -n1 STMT`, `%prun -s cumtime
    STMT`, or None for any other line magic."""
    head, _, rest = stripped[1:].partition(" ")
    takes_value = _WRAPS.get(head)
    if takes_value is None:
        return None
    rest = rest.strip()
    while rest.startswith("-"):
        option, _, after = rest.partition(" ")
        after = after.lstrip()
        if len(option) == 2 and option[1] in takes_value:  # "-n 10": its value is the next word
            after = after.partition(" ")[2].lstrip()
        rest = after
    return rest


def _writefile(first):
    """(the target, its mode) of a `%%writefile [-a|--append] FILE` line."""
    words = first.split()[1:]
    append = any(w in ("-a", "--append") for w in words)
    names = [w for w in words if w not in ("-a", "--append")]
    if not names:
        return None
    target = " ".join(names)
    if len(target) >= 2 and target[0] == target[-1] and target[0] in "'\"":
        target = target[1:-1]
    return target, "a" if append else "w"


def notebook_cells(path):
    """[(filename, source, action)] of the notebook's code cells, in order,
    and the notes saying what was left out. IPython's line magics and shell
    escapes become `pass` (the line numbers kept), but only where a
    statement starts: a `%` or `!` that opens a line inside brackets or
    after a backslash (`    % b)`, `    != y)`) is Python. `%time`,
    `%timeit` and `%prun` keep the statement they time; `%%writefile`
    cells are actions (the file written, or appended to with -a)."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    cells, notes = [], []
    number = 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        number += 1
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        name = f"{os.path.basename(path)}[cell {number}]"
        lines = source.splitlines()
        first = lines[0].strip() if lines else ""
        if first.startswith("%%"):
            magic = first[2:].split()[0] if first[2:].split() else ""
            if magic == "writefile" and _writefile(first):
                target, mode = _writefile(first)
                cells.append((name, None, ("writefile", target, "\n".join(lines[1:]) + "\n", mode)))
                continue
            if magic not in _RUN_BODY:
                notes.append(f"cell {number}: %%{magic} cell skipped")
                continue
            lines[0] = f"pass  # %%{magic}"
        out = []
        state = _Lines()
        for i, line in enumerate(lines):
            stripped = line.lstrip()
            indent = line[: len(line) - len(stripped)]
            if state.at_statement and (stripped.startswith(("%", "!")) or _SHELL_ASSIGN.match(stripped)):
                statement = _wrapped_statement(stripped) if stripped.startswith("%") else None
                if statement:
                    out.append(indent + statement)
                    state.feed(statement)
                    continue
                out.append(f"{indent}pass  # IPython: {stripped}")
                notes.append(f"cell {number}, line {i + 1}: {stripped[:60]}")
                continue
            out.append(line)
            state.feed(line)
        cells.append((name, "\n".join(out) + "\n", None))
    return cells, notes


def _display(*objs, **kwargs):
    """IPython's display() outside IPython: each object's repr, printed."""
    for obj in objs:
        print(repr(obj))


def run_notebook(path):
    """The notebook's code cells, in order: in an IPython shell where
    IPython is installed (notebook_shell), else as plain Python, without
    get_ipython() and with the magics and shell lines left out (said)."""
    from . import notebook_shell

    if notebook_shell.available():
        notebook_shell.run_cells(path)
        return
    cells, notes = notebook_cells(path)
    _say("IPython is not installed in this Python: the notebook's cells run as plain Python, "
         "where get_ipython() is not defined" + (", and its magics and shell lines are not run: "
                                                  + "; ".join(notes) if notes else ""))
    namespace = {"__name__": "__main__", "__builtins__": __builtins__, "display": _display}
    for name, source, action in cells:
        if action is not None:
            _, target, text, mode = action
            with open(target, mode, encoding="utf-8") as f:
                f.write(text)
            continue
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        exec(compile(source, name, "exec"), namespace)


# ------------------------------------------------------------------ the run


class Run:
    def __init__(self, opts):
        self.opts = opts
        self.torch = None
        self.steps = 0
        self.oom = None  # (exception, frames) of the uncaught out-of-memory error
        self.error = None
        self.error_at = None  # the user's line the error was raised at
        self.exit_status = 0
        self.stopped_at_steps = False
        self.fake = ctypes.CDLL(None)
        self.history = False
        self.ddp_adjusted = 0
        self.weightless = None  # --no-weights: the stand-ins from_pretrained loaded
        self.world = None  # --world-size: the fake process group's counts
        self.terminated = False
        self.ended = None  # "SIGTERM" when the dry run (or torchrun) ended the script
        self.accelerate = None  # adjust_accelerate's record
        self.remedies = None  # remedy_apply's record: what the program does, what was applied
        self.work = None  # work.WorkCount: the FLOPs of the run (dryrun --remedies)
        self.optimizers_stepped = []  # the classes of the optimizers that stepped, in order first seen
        self.llm_int8 = None  # llm_int8's record: the layers whose memory depends on values
        # The phantom's counters when the script starts: what the set-up did is not the script's.
        self.gpu_work_at_start = 0
        self.unsupported_at_start = 0
        self.started = time.monotonic()
        self.last_progress = None  # when the figures were last written as the run went
        self.endings = None  # ending.py's hooks, while the script runs
        self.recording = None  # the dry run's own recording of vramguard's heap
        self.gave_way = False  # ... stopped where the script started one of its own
        self.grad_scalers = 0
        self.dropping_unused_warning = False

    # --------------------------------------------------------- before

    def setup(self):
        import torch

        from .fake_world import WORLD_ENV

        if os.environ.get(WORLD_ENV):  # --world-size: one rank of many; its device's heap and figures
            self.opts.rank = int(os.environ.get("LOCAL_RANK", "0"))

        self.torch = torch
        for message in _NO_KERNELS_WARNINGS:  # before install(), which starts CUDA
            warnings.filterwarnings("ignore", message=message)
        if self.opts.allocator == "vramguard":
            from ..torch.install import install
            from ..trace.record import start_recording

            install()
            if self.opts.snapshot:
                # under torchrun the rank's own device (LOCAL_RANK, which the script
                # selects later), not device 0's heap
                heap = None
                if self.opts.rank is not None:
                    from ..torch.install import _device_heap

                    heap = _device_heap(self.opts.rank)
                self.recording = start_recording(heap, stacks=True, name="dryrun")
                self.history = True
                self.give_way_to_the_scripts_recording()
        elif self.opts.snapshot:
            # Started when CUDA starts, not now: recording makes PyTorch's
            # allocator "used", and a script that calls vramguard.install()
            # itself (or sets PYTORCH_CUDA_ALLOC_CONF) must still be able to.
            lazy = getattr(torch.cuda, "_lazy_call", None)
            if lazy is not None and not torch.cuda.is_initialized():
                lazy(self.start_history)
            else:
                self.start_history()
        self.hook_steps()
        from . import adjust_accelerate

        self.accelerate = adjust_accelerate.install()
        from . import llm_int8

        self.llm_int8 = llm_int8.install()
        self.hook_grad_scaler()
        if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            self.adjust_ddp()
        from .fake_world import FakeWorld
        from .weightless import NO_WEIGHTS_ENV, WeightlessLoads

        if os.environ.get(WORLD_ENV):  # --world-size: this process is one rank of many
            self.world = FakeWorld(os.environ[WORLD_ENV],
                                   lambda: self.counter("vg_fakecuda_d2h_reads", ctypes.c_long))
            self.world.install()

        if os.environ.get(NO_WEIGHTS_ENV):
            self.weightless = WeightlessLoads(os.environ[NO_WEIGHTS_ENV])
            self.weightless.install()
        self.install_remedies()
        self.gpu_work_at_start = self.gpu_work()
        self.unsupported_at_start = self.counter("vg_fakecuda_unsupported_calls", ctypes.c_long) or 0

    def install_remedies(self):
        """dryrun --remedies: the work count, the watch on what the program
        does, and the remedies this run applies (remedy_apply, work)."""
        from .remedy_apply import REMEDIES_ENV
        from .work import WORK_ENV, WorkCount

        if not os.environ.get(WORK_ENV):
            return
        from . import remedy_apply

        self.remedies = remedy_apply.install(self.torch, os.environ.get(REMEDIES_ENV, ""), is_user_file)
        self.work = WorkCount(self.torch)
        self.work.install()

    def adjust_ddp(self):
        """DDP reads two things back from the device, which a phantom
        answers with zeros: its start-up check of the parameters (init_sync)
        fails, and after the first step rank 0's new bucket order arrives as
        zeros, which crashes every rank. So each DistributedDataParallel
        gets init_sync=False and find_unused_parameters=True (which keeps
        the first order: the same buckets of the same sizes), static_graph
        off (it rebuilds too); counted, and the report says so."""
        import inspect

        ddp = getattr(getattr(self.torch.nn, "parallel", None), "DistributedDataParallel", None)
        if ddp is None:
            return
        original = ddp.__init__
        signature = inspect.signature(original)
        wanted = {"init_sync": False, "find_unused_parameters": True, "static_graph": False}
        wanted = {k: v for k, v in wanted.items() if k in signature.parameters}
        run = self

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
                run.dropping_unused_warning = _drop_from_stderr(_UNUSED_PARAMETERS_WARNING)
            bound.arguments.update(changed)
            return original(*bound.args, **bound.kwargs)

        ddp.__init__ = __init__

    def give_way_to_the_scripts_recording(self):
        """A heap has one recording at a time: where the script starts its
        own (vramguard.record(), start_recording(): the quickstart does) on
        the heap the dry run records, the dry run's stops there, instead of
        the script failing with "recordings do not nest". Its snapshot then
        covers the run up to that point (said)."""
        from ..trace import record as recording

        original = recording.record.start
        run = self

        @functools.wraps(original)
        def start(rec):
            mine = run.recording
            if rec is not mine and mine is not None and mine._running and recording._resolve(rec.heap) is mine.heap:
                mine.stop()
                recording._active.pop(id(mine.heap), None)
                run.gave_way = True
                _say("the script records the GPU's memory itself: the dry run's own recording stopped there, "
                     "so its snapshot covers the run up to that point")
            return original(rec)

        recording.record.start = start

    def hook_grad_scaler(self):
        """Counts the GradScalers the script makes that are on: on a phantom
        their scale reads 0, which the report says."""
        scaler = getattr(getattr(self.torch, "amp", None), "GradScaler", None)
        if scaler is None:
            return
        original = scaler.__init__
        run = self

        @functools.wraps(original)
        def __init__(obj, *args, **kwargs):
            original(obj, *args, **kwargs)
            if getattr(obj, "_enabled", True):
                run.grad_scalers += 1

        scaler.__init__ = __init__

    def start_history(self):
        torch = self.torch
        if "vramguard" in sys.modules and sys.modules["vramguard"].is_installed():
            return  # the script installed vramguard: PyTorch's history is refused under it
        try:
            torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES, stacks="python")
            self.history = True
        except Exception as exc:  # an older PyTorch without stacks="python"
            _say(f"memory history not recorded: {exc}")

    def hook_steps(self):
        """A line on stderr per optimizer step (the first three, then every
        tenth), and --steps' stop."""
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except ImportError:
            return
        torch = self.torch

        def after_step(optimizer, args, kwargs):
            self.steps += 1
            kind = type(optimizer).__name__
            if kind not in self.optimizers_stepped:
                self.optimizers_stepped.append(kind)
            if self.work is not None:
                self.work.mark_step()
            n = self.steps
            if n <= 3 or n % 10 == 0 or n == self.opts.steps:
                try:
                    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else 0
                except Exception:
                    peak = 0
                _say(f"step {n}: peak allocated {_mib(peak)}")
            self.write_progress()
            if self.opts.steps and n >= self.opts.steps:
                raise _StopRun()

        register_optimizer_step_post_hook(after_step)

    # --------------------------------------------------------- the script

    def run_script(self):
        script = os.path.abspath(self.opts.script)
        sys.argv = [self.opts.script] + list(self.opts.args)
        sys.path[0] = os.path.dirname(script)
        try:
            if self.opts.notebook:
                run_notebook(script)
            else:
                runpy.run_path(script, run_name="__main__")
        except _StopRun:
            self.stopped_at_steps = True
        except _Terminated as exc:
            self.terminated = True
            self.error = self.ended = "SIGTERM"  # as ending.py says it: "rank 0 ended by SIGTERM at ..."
            self.error_at = user_line(_traceback_frames(exc))
            self.exit_status = 128 + signal.SIGTERM
        except SystemExit as exc:
            self.exit_status = _exit_code(exc.code)
            if exc.code not in (None, 0) and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)  # what Python prints for sys.exit("message")
            if self.exit_status:
                self.error = f"SystemExit: {exc.code}"
                self.error_at = user_line(_traceback_frames(exc))
        except KeyboardInterrupt as exc:
            if _SIGINT_RECEIVED:  # the dry run's Ctrl-C (its SIGINT to the run): it ends, quietly
                raise
            # The script's own KeyboardInterrupt: its failure, with the status
            # Python gives it.
            self.error = "KeyboardInterrupt" + (f": {_first_line(exc)}" if str(exc).strip() else "")
            self.error_at = user_line(_traceback_frames(exc))
            self.exit_status = 130
            _print_user_traceback(exc)
        except BaseException as exc:
            if self.is_oom(exc):
                self.oom = (exc, _traceback_frames(exc))
                self.exit_status = 1
                _print_user_traceback(exc)  # in the log and the terminal, as Python would print it
                _say(f"out of memory at {user_line(self.oom[1]) or 'an unknown line'}")
            else:
                self.error = f"{type(exc).__name__}: {_first_line(exc)}"
                self.error_at = user_line(_traceback_frames(exc))
                self.exit_status = 1
                _print_user_traceback(exc)

    def is_oom(self, exc):
        torch = self.torch
        if isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
            return True
        # A library that cannot get device memory for itself (cuBLAS's handle
        # in a new thread, at the peak; cuDNN's) is out of memory too.
        return isinstance(exc, RuntimeError) and ("out of memory" in str(exc)
                                                  or any(s in str(exc) for s in _LIBRARY_OOM))

    # --------------------------------------------------------- after

    def first_oom(self, history=True):
        """The first out-of-memory: the uncaught one's line (its traceback),
        else one the script caught (the allocator counted it), its line
        from the memory history where that has the stack (history False:
        not looked up, which costs a snapshot of the whole history)."""
        torch = self.torch
        ooms = 0
        if torch.cuda.is_initialized():
            try:
                ooms = int(torch.cuda.memory_stats().get("num_ooms", 0))
            except Exception:
                ooms = 0
        if self.oom is None and ooms == 0:
            return None
        entry = self.history_oom() if history else None
        out = {"line": None, "request_bytes": None, "message": None, "caught": self.oom is None}
        if self.oom is not None:
            exc, frames = self.oom
            out["line"] = user_line(frames)
            out["inner_line"] = library_line(frames, out["line"])
            out["message"] = _first_line(exc)
        if entry is not None:
            if out["line"] is None:
                frames = [(f.get("filename", ""), f.get("line")) for f in entry.get("frames", [])]
                out["line"] = user_line(frames)
            out["request_bytes"] = int(entry["size"])
        if self.opts.allocator == "vramguard":
            try:
                from .. import _core

                record = _core.last_oom()
                if record is not None:
                    out["request_bytes"] = int(record["requested"])
            except Exception:
                pass
        if out["request_bytes"] is None and out["message"]:
            match = _TRIED.search(out["message"])
            if match:
                out["request_bytes"] = int(float(match.group(1)) * _UNIT[match.group(2)])
        return out

    def history_oom(self):
        """The first 'oom' entry of PyTorch's memory history."""
        if not self.history or self.opts.allocator == "vramguard":
            return None
        try:
            snap = self.torch.cuda.memory._snapshot()
        except Exception:
            return None
        for trace in snap.get("device_traces", []):
            for entry in trace:
                if entry.get("action") == "oom":
                    return entry
        return None

    def dump_snapshot(self):
        path = self.opts.snapshot
        if not path or not self.history or not self.torch.cuda.is_initialized():
            return None
        try:
            if self.opts.allocator == "vramguard":
                import warnings

                from ..trace.snapshot import dump_snapshot

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a ring that dropped its oldest events says so
                    dump_snapshot(path, recording=self.recording if self.gave_way else None)
            else:
                self.torch.cuda.memory._dump_snapshot(path)
        except Exception as exc:
            _say(f"the memory snapshot was not written: {exc}")
            return None
        return path

    def write_progress(self):
        """The figures so far, to the result file, marked partial: what a
        kill leaves (ending.py). At most every PROGRESS_EVERY_S seconds,
        and always after the first step."""
        now = time.monotonic()
        if self.last_progress is not None and now - self.last_progress < PROGRESS_EVERY_S:
            return
        self.last_progress = now
        if self.endings is not None and self.steps <= REARM_STEPS:
            self.endings.rearm()  # after what the first steps made (ending.py)
        try:
            _write_json(self.opts.result, dict(self.result(self.started, snapshot=False), partial=True))
        except Exception as exc:
            _say(f"the figures so far were not written: {exc}")

    def write_ended(self, ended, status, frames):
        """The figures when the script ends the process itself (ending.py):
        how and where, its status, the snapshot."""
        self.exit_status = status
        at = user_line(frames)
        if status or not ended.startswith("os._exit"):
            self.error, self.error_at = ended, at
        result = self.result(self.started)
        result.update(ended=ended, ended_at=at)
        _write_json(self.opts.result, result)

    def gpu_work(self):
        """Calls that put work on the device so far (GPU_WORK_CALLS)."""
        fn = getattr(self.fake, "vg_fakecuda_calls", None)
        if fn is None:
            return 0
        fn.restype, fn.argtypes = ctypes.c_long, [ctypes.c_char_p]
        return sum(max(0, int(fn(name.encode()))) for name in GPU_WORK_CALLS)

    def phantom_gap(self):
        """The calls the phantom does not model that the script made:
        {"calls": n, "last": name}, or None. `caused_failure`: the run's
        error is the one such a stub returns, so the failure is the
        phantom's, not the script's."""
        calls = (self.counter("vg_fakecuda_unsupported_calls", ctypes.c_long) or 0) - self.unsupported_at_start
        if calls <= 0:
            return None
        fn = getattr(self.fake, "vg_fakecuda_last_unsupported", None)
        last = None
        if fn is not None:
            fn.restype = ctypes.c_char_p
            last = (fn() or b"").decode("utf-8", "replace") or None
        error = (self.error or "").lower()
        caused = bool(error) and any(word in error for word in _STUB_ERRORS + ((last or "").lower(),) if word)
        return {"calls": calls, "last": last, "caused_failure": caused}

    def counter(self, name, restype=ctypes.c_longlong, *args):
        fn = getattr(self.fake, name, None)
        if fn is None:
            return None
        fn.restype = restype
        try:
            return int(fn(*args))
        except Exception:
            return None

    def result(self, started, snapshot=True):
        """The run's figures; snapshot False (the figures written as the run
        goes): neither the snapshot nor the history's lookups, which cost
        a copy of the whole history."""
        torch = self.torch
        used = torch.cuda.is_initialized()
        peak_allocated = peak_reserved = 0
        if used:
            peak_allocated = int(torch.cuda.max_memory_allocated())
            peak_reserved = int(torch.cuda.max_memory_reserved())
        first_oom = self.first_oom(history=snapshot)
        device_peak = self.counter("vg_fakecuda_peak_bytes", ctypes.c_longlong, self.opts.rank or 0)
        # The script's own use, not CUDA's start: vramguard's install() starts CUDA in every script.
        used_gpu = bool(peak_reserved) or self.gpu_work() > self.gpu_work_at_start
        ended_well = self.error is None and self.exit_status == 0
        out = {
            "allocator": self.opts.allocator,
            "peak_allocated_bytes": peak_allocated,
            "peak_reserved_bytes": peak_reserved,
            # True: the script ended (or reached --steps) with no out-of-memory,
            # having used the GPU; False: it ran out of memory, caught or not;
            # None: it failed for another reason before its end, or never
            # used the GPU (used_gpu False), so nobody knows.
            "fits": (False if first_oom is not None
                     else True if ended_well and used_gpu else None),
            "first_oom": first_oom,
            "error": self.error,
            "error_at": self.error_at,
            "exit_status": self.exit_status,
            "used_cuda": used,
            "used_gpu": used_gpu,
            "phantom_unsupported": self.phantom_gap(),
            "ended": self.ended,  # how, when the process was ended before the script's end (ending.py, SIGTERM)
            "ended_at": None,
            "steps": self.steps,
            "stopped_at_steps": self.stopped_at_steps,
            "d2h_reads": self.counter("vg_fakecuda_d2h_reads", ctypes.c_long),
            # unified memory (bitsandbytes' paged optimizers): outside PyTorch's allocator
            "managed_bytes": self.counter("vg_fakecuda_managed_peak_bytes", ctypes.c_longlong, self.opts.rank or 0),
            "managed_prefetched_bytes": self.counter("vg_fakecuda_prefetched_peak_bytes", ctypes.c_longlong,
                                                     self.opts.rank or 0),
            "ddp_adjusted": self.ddp_adjusted,
            "accelerate_unpadded": self.accelerate.unpadded if self.accelerate else 0,
            "auto_batch_sizes": self.accelerate.batch_sizes if self.accelerate else [],
            "auto_batch_size": self.accelerate.batch_size if self.accelerate else None,
            # bitsandbytes' LLM.int8 layers with an outlier threshold: buffers sized by values
            "llm_int8_layers": self.llm_int8.outlier_layers if self.llm_int8 else 0,
            "device_peak_bytes": device_peak,
            "context_bytes": _context_bytes(),
            "host_peak_rss_bytes": None,  # below, once the snapshot is written
            "snapshot": None,
            "compiled": _compiled(),
            # what the script changed itself: its own vramguard.install(), its own allocator settings
            "script_installed_vramguard": (self.opts.allocator != "vramguard" and "vramguard" in sys.modules
                                           and sys.modules["vramguard"].is_installed()),
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or None,
            # the extensions whose kernels ran ({name: kernels, launches, libraries})
            "extensions": launched_extensions(self.fake) or {},
            "weightless_loads": self.weightless.loads if self.weightless is not None else None,
            "fake_world": self.world.figures() if self.world is not None else None,
            "heap_policy": _heap_policy() if self.opts.allocator == "vramguard" else None,
            "card_arch": _card_arch(torch),
            "cudnn_benchmark_kept_off": _cudnn_benchmark_kept_off(),
            # PyTorch's stream pool, made at the first side stream (the script's, NCCL's)
            "side_streams": (self.counter("vg_fakecuda_calls", ctypes.c_long, b"cudaStreamCreateWithPriority")
                             or 0) > 0,
            "grad_scalers": self.grad_scalers,
            "optimizers": self.optimizers_stepped,
            "remedies_seen": self.remedies.figures() if self.remedies is not None else None,
            "work": self.work.figures() if self.work is not None else None,
            "torch": torch.__version__,
            "elapsed_s": round(time.monotonic() - started, 3),
        }
        out["snapshot"] = self.dump_snapshot() if snapshot else None
        out["terminated"] = self.terminated
        # The whole run's peak: writing the snapshot (pickling every event
        # and its stack) is often the costliest step of all.
        out["host_peak_rss_bytes"] = _peak_rss_bytes()
        return out


#: How a library's out-of-memory reaches the script: its status, in PyTorch's error.
_LIBRARY_OOM = ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def _peak_rss_bytes():
    """This process's peak resident set so far: VmHWM (Linux), else
    getrusage's ru_maxrss (KiB on Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

#: A filter process between this run's stderr and the dry run: every line
#: (ended by \n or \r) copied on, but those holding argv[1]. A process of its
#: own, so that what a crash writes last still reaches the dry run.
_STDERR_FILTER = r"""
import os, re, sys
drop, pending = sys.argv[1].encode(), b""
while True:
    chunk = os.read(0, 65536)
    if not chunk:
        break
    pending += chunk
    ends = [m.end() for m in re.finditer(rb"[\r\n]", pending)]
    if not ends:
        continue
    lines = re.findall(rb"[^\r\n]*[\r\n]", pending[:ends[-1]])
    pending = pending[ends[-1]:]
    out = b"".join(line for line in lines if drop not in line)
    if out:
        os.write(1, out)
if pending and drop not in pending:
    os.write(1, pending)
"""


def _drop_from_stderr(text):
    """Lines of this process's stderr (fd 2: Python's and C++'s) holding
    `text` are left out from now on. True when the filter runs."""
    import subprocess

    try:
        sys.stderr.flush()
        read, write = os.pipe()
        subprocess.Popen([sys.executable, "-c", _STDERR_FILTER, text], stdin=read, stdout=2,
                         close_fds=True)
        os.dup2(write, 2)
        os.close(read)
        os.close(write)
    except OSError:
        return False
    return True


def _heap_policy():
    """"arena" or "segments": the vramguard heap this run used."""
    try:
        from ..torch.state import _state

        return "segments" if _state.get("arena") is False else "arena"
    except Exception:
        return "arena"


def _card_arch(torch):
    """Whether this PyTorch has kernels for the phantom's card: its compute
    capability (VG_FAKECUDA_CC), the architectures the wheel was built for
    (torch.cuda.get_arch_list(), read without starting CUDA) and PyTorch's
    own test of whether any runs on it. None where PyTorch cannot say."""
    cc = os.environ.get("VG_FAKECUDA_CC", "")
    try:
        major, minor = (int(x) for x in cc.split("."))
        arch_list = list(torch.cuda.get_arch_list())
        code_ccs = [torch.cuda._extract_arch_version(a) for a in arch_list]
        compatible = torch.cuda._code_compatible_with_device
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs = any(compatible(10 * major + minor, code) for code in code_ccs)
    except Exception:
        return None
    if not arch_list:
        return None
    return {"capability": cc, "arch_list": arch_list, "runs": bool(runs)}


def _cudnn_benchmark_kept_off():
    """How often vramguard turned the script's cudnn.benchmark = True off."""
    module = sys.modules.get("vramguard.torch.cudnn")
    return int(getattr(module, "kept_off", 0) or 0) if module is not None else 0


def _compiled():
    """Whether torch.compile ran (TorchDynamo compiled frames), and Triton."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    frames = 0
    if dynamo is not None:
        try:
            counters = dynamo.counters
            frames = sum(counters["frames"].values()) + sum(counters["stats"].values())
        except Exception:
            frames = 0
    return {"torch_compile": bool(frames), "triton": "triton" in sys.modules}


def _context_bytes():
    try:
        return int(os.environ.get("VG_FAKECUDA_CONTEXT", "0"))
    except ValueError:
        return None


def _exit_code(code):
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code & 0xFF
    return 1


def _first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _print_user_traceback(exc):
    """The script's traceback as Python prints it, without this runner's
    frames (runpy's and ours above the script)."""
    tb = exc.__traceback__
    while tb is not None and not is_user_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__, file=sys.stderr)
    sys.stderr.flush()


_SIGINT_RECEIVED = False


def _on_sigterm(signum, frame):
    """The dry run's --timeout: the script stops where it is, as at
    --steps, and the figures so far are written. Once, then ignored: the
    figures are being written."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Terminated()


def _on_sigint(signum, frame):
    """Python's own SIGINT handler (KeyboardInterrupt), and a note that a
    SIGINT came: the dry run cancelling this run, not the script raising
    KeyboardInterrupt itself. A script's own handler replaces this."""
    global _SIGINT_RECEIVED
    _SIGINT_RECEIVED = True
    raise KeyboardInterrupt


def _die_with_parent():
    """The run ends when the dry run does (Linux: PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            os._exit(130)
    except Exception:
        pass


def _write_json(path, data):
    """Whole or not at all, through a new file (mkstemp: O_EXCL, no link
    followed) renamed over `path` (a link there is replaced, not followed)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, default=repr)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def parse(argv):
    parser = argparse.ArgumentParser(prog="vramguard.phantom.child")
    parser.add_argument("--allocator", choices=ALLOCATORS, required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--snapshot")
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--notebook", action="store_true")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    if opts.args and opts.args[0] == "--":
        opts.args = opts.args[1:]
    # Under torchrun (dryrun --nproc): one file per rank, the rank's device's figures.
    opts.rank = None
    if "{rank}" in opts.result:
        opts.rank = int(os.environ.get("LOCAL_RANK", "0"))
        opts.result = opts.result.replace("{rank}", str(opts.rank))
        if opts.snapshot:
            opts.snapshot = opts.snapshot.replace("{rank}", str(opts.rank))
    return opts


def main(argv=None):
    _die_with_parent()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    started = time.monotonic()
    opts = parse(sys.argv[1:] if argv is None else argv)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    run = Run(opts)
    run.started = started
    endings = run.endings = Endings(run.write_ended)
    try:
        try:
            run.setup()
        except _Terminated:  # ended before the script started: nothing to write
            os._exit(128 + signal.SIGTERM)
        endings.arm()  # its own SIGTERM handler only where neither the script nor this one set one
        try:
            run.run_script()
        finally:
            endings.disarm()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the script is done: its figures are written whole
        result = run.result(started)
    except KeyboardInterrupt:
        os._exit(130)
    except BaseException:
        # The runner's own failure: its traceback, and an end without
        # Python's finalization, as every end of this process is (ending.py).
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    _write_json(opts.result, result)
    # The script's atexit handlers run, then the process ends without the
    # interpreter's finalization, where PyTorch's autograd threads can die
    # in a race (SIGABRT) once the figures are already written.
    import atexit

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(run.exit_status)


if __name__ == "__main__":
    sys.exit(main())
