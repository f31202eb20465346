"""One run of the user's program in the child: its set-up (vramguard or
PyTorch's history recording, the child's hooks, the features), the script
or notebook run as __main__, and the RunRecord of what it did."""
import ctypes
import dataclasses
import os
import runpy
import signal
import sys
import time
import warnings

from ..contract import WORLD_ENV, RunRecord, write_run
from ..features import FEATURES
from . import hooks
from .cells import run_notebook
from .ending import Terminated, exit_code, sigint_received
from .figures import (card_arch, compiled, context_bytes, cudnn_benchmark_kept_off, heap_policy,
                      peak_rss_bytes)
from .first_oom import find_first_oom, is_oom
from .frames import first_line, print_user_traceback, traceback_frames, user_line
from .log import mib, say

__all__ = ["Run", "StopRun"]


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


#: PyTorch's own warnings that it has no kernels for the device: the dry run
#: says it once, in its report (card_arch), not once per run.
_NO_KERNELS_WARNINGS = (r"(?s).*which is of compute capability", r"(?s).*is not compatible with the current PyTorch")


class StopRun(BaseException):
    """--steps reached: the run ends there, as if the script had."""


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
        self.terminated = False
        self.ended = None  # "SIGTERM" when the dry run (or torchrun) ended the script
        self.states = {}  # each feature's state in this run (features/), by its name
        self.optimizers_stepped = []  # the classes of the optimizers that stepped, in order first seen
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

        if os.environ.get(WORLD_ENV):  # --world-size: one rank of many; its device's heap and figures
            self.opts.rank = int(os.environ.get("LOCAL_RANK", "0"))

        self.torch = torch
        for message in _NO_KERNELS_WARNINGS:  # before install(), which starts CUDA
            warnings.filterwarnings("ignore", message=message)
        if self.opts.allocator == "vramguard":
            from ...torch.install import install
            from ...trace.record import start_recording

            install()
            if self.opts.snapshot:
                # under torchrun the rank's own device (LOCAL_RANK, which the script
                # selects later), not device 0's heap
                heap = None
                if self.opts.rank is not None:
                    from ...torch.device_heaps import device_heap

                    heap = device_heap(self.opts.rank)
                self.recording = start_recording(heap, stacks=True, name="dryrun")
                self.history = True
                hooks.give_way_to_the_scripts_recording(self)
        elif self.opts.snapshot:
            # Started when CUDA starts, not now: recording makes PyTorch's
            # allocator "used", and a script that calls vramguard.install()
            # itself (or sets PYTORCH_CUDA_ALLOC_CONF) must still be able to.
            lazy = getattr(torch.cuda, "_lazy_call", None)
            if lazy is not None and not torch.cuda.is_initialized():
                lazy(lambda: hooks.start_history(self))
            else:
                hooks.start_history(self)
        self.hook_steps()
        hooks.hook_grad_scaler(self)
        if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            hooks.adjust_ddp(self)
        for feature in FEATURES:
            self.states[feature.name] = feature.install(self)
        self.gpu_work_at_start = self.gpu_work()
        self.unsupported_at_start = self.counter("vg_fakecuda_unsupported_calls", ctypes.c_long) or 0

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
            work = self.states.get("work")
            if work is not None:
                work.mark_step()
            n = self.steps
            if n <= 3 or n % 10 == 0 or n == self.opts.steps:
                try:
                    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else 0
                except Exception:
                    peak = 0
                say(f"step {n}: peak allocated {mib(peak)}")
            self.write_progress()
            if self.opts.steps and n >= self.opts.steps:
                raise StopRun()

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
        except StopRun:
            self.stopped_at_steps = True
        except Terminated as exc:
            self.terminated = True
            self.error = self.ended = "SIGTERM"  # as ending.py says it: "rank 0 ended by SIGTERM at ..."
            self.error_at = user_line(traceback_frames(exc))
            self.exit_status = 128 + signal.SIGTERM
        except SystemExit as exc:
            self.exit_status = exit_code(exc.code)
            if exc.code not in (None, 0) and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)  # what Python prints for sys.exit("message")
            if self.exit_status:
                self.error = f"SystemExit: {exc.code}"
                self.error_at = user_line(traceback_frames(exc))
        except KeyboardInterrupt as exc:
            if sigint_received():  # the dry run's Ctrl-C (its SIGINT to the run): it ends, quietly
                raise
            # The script's own KeyboardInterrupt: its failure, with the status
            # Python gives it.
            self.error = "KeyboardInterrupt" + (f": {first_line(exc)}" if str(exc).strip() else "")
            self.error_at = user_line(traceback_frames(exc))
            self.exit_status = 130
            print_user_traceback(exc)
        except BaseException as exc:
            if is_oom(self, exc):
                self.oom = (exc, traceback_frames(exc))
                self.exit_status = 1
                print_user_traceback(exc)  # in the log and the terminal, as Python would print it
                say(f"out of memory at {user_line(self.oom[1]) or 'an unknown line'}")
            else:
                self.error = f"{type(exc).__name__}: {first_line(exc)}"
                self.error_at = user_line(traceback_frames(exc))
                self.exit_status = 1
                print_user_traceback(exc)

    # --------------------------------------------------------- after

    def dump_snapshot(self):
        path = self.opts.snapshot
        if not path or not self.history or not self.torch.cuda.is_initialized():
            return None
        try:
            if self.opts.allocator == "vramguard":
                import warnings

                from ...trace.snapshot import dump_snapshot

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a ring that dropped its oldest events says so
                    dump_snapshot(path, recording=self.recording if self.gave_way else None)
            else:
                self.torch.cuda.memory._dump_snapshot(path)
        except Exception as exc:
            say(f"the memory snapshot was not written: {exc}")
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
            write_run(self.opts.result, dataclasses.replace(self.result(self.started, snapshot=False),
                                                           partial=True))
        except Exception as exc:
            say(f"the figures so far were not written: {exc}")

    def write_ended(self, ended, status, frames):
        """The figures when the script ends the process itself (ending.py):
        how and where, its status, the snapshot."""
        self.exit_status = status
        at = user_line(frames)
        if status or not ended.startswith("os._exit"):
            self.error, self.error_at = ended, at
        write_run(self.opts.result, dataclasses.replace(self.result(self.started), ended=ended, ended_at=at))

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
        """The run's RunRecord; snapshot False (the figures written as the
        run goes): neither the snapshot nor the history's lookups, which
        cost a copy of the whole history."""
        torch = self.torch
        used = torch.cuda.is_initialized()
        peak_allocated = peak_reserved = 0
        if used:
            peak_allocated = int(torch.cuda.max_memory_allocated())
            peak_reserved = int(torch.cuda.max_memory_reserved())
        first_oom = find_first_oom(self, history=snapshot)
        # The script's own use, not CUDA's start: vramguard's install() starts CUDA in every script.
        used_gpu = bool(peak_reserved) or self.gpu_work() > self.gpu_work_at_start
        ended_well = self.error is None and self.exit_status == 0
        record = RunRecord(
            allocator=self.opts.allocator,
            peak_allocated_bytes=peak_allocated,
            peak_reserved_bytes=peak_reserved,
            fits=False if first_oom is not None else True if ended_well and used_gpu else None,
            first_oom=first_oom,
            error=self.error,
            error_at=self.error_at,
            exit_status=self.exit_status,
            used_cuda=used,
            used_gpu=used_gpu,
            phantom_unsupported=self.phantom_gap(),
            ended=self.ended,  # how, when the process was ended before the script's end (SIGTERM)
            steps=self.steps,
            stopped_at_steps=self.stopped_at_steps,
            d2h_reads=self.counter("vg_fakecuda_d2h_reads", ctypes.c_long),
            ddp_adjusted=self.ddp_adjusted,
            device_peak_bytes=self.counter("vg_fakecuda_peak_bytes", ctypes.c_longlong, self.opts.rank or 0),
            context_bytes=context_bytes(),
            compiled=compiled(),
            # what the script changed itself: its own vramguard.install(), its own allocator settings
            script_installed_vramguard=(self.opts.allocator != "vramguard" and "vramguard" in sys.modules
                                        and sys.modules["vramguard"].is_installed()),
            alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or None,
            heap_policy=heap_policy() if self.opts.allocator == "vramguard" else None,
            card_arch=card_arch(torch),
            cudnn_benchmark_kept_off=cudnn_benchmark_kept_off(),
            # PyTorch's stream pool, made at the first side stream (the script's, NCCL's)
            side_streams=(self.counter("vg_fakecuda_calls", ctypes.c_long, b"cudaStreamCreateWithPriority")
                          or 0) > 0,
            grad_scalers=self.grad_scalers,
            optimizers=list(self.optimizers_stepped),
            torch=torch.__version__,
            elapsed_s=round(time.monotonic() - started, 3),
            terminated=self.terminated,
            **self.feature_figures())
        record.snapshot = self.dump_snapshot() if snapshot else None
        # The whole run's peak: writing the snapshot (pickling every event
        # and its stack) is often the costliest step of all.
        record.host_peak_rss_bytes = peak_rss_bytes()
        return record

    def feature_figures(self):
        figures = {}
        for feature in FEATURES:
            figures.update(feature.figures(self.states.get(feature.name), self))
        return figures
