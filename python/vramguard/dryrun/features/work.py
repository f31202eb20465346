"""The work of a dry run, counted: floating-point operations, for comparing
one setting of a program with another (activation checkpointing recomputes
the forward), never a time.

Two counts, neither complete, combined so that nothing is counted twice:

- the phantom's: every GEMM cuBLAS and cuBLASLt were asked for, from the
  calls' shapes (vg_fakecuda_gemm_flops, csrc/phantom/core_work.c): exact,
  for eager and compiled code alike, and for libraries that call cuBLAS
  (bitsandbytes dequantizes, then multiplies through PyTorch);
- PyTorch's operator formulas (torch.utils.flop_counter.FlopCounterMode)
  for the operators that do not reach cuBLAS: attention kernels and
  convolutions (cuDNN). Its matrix products are left out (the phantom
  counts them exactly).

Neither sees the non-GEMM operators inside compiled code (the operator
count leaves the dispatch stack at the first call of compiled code, since
Dynamo compiles nothing while a dispatch mode is active, and the program
must run as written) nor custom kernels: the record says which applied.

Installed from the child before the script runs when WORK_ENV is set.
"""
import ctypes
import functools
import os

from ..contract import WORK_ENV
from .base import Feature


#: Operators whose work reaches cuBLAS (the phantom counts those exactly).
GEMM_OPERATORS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_int_mm")


class _GlobalOnly:
    """FlopCounterMode's module tracker, without its global module hooks
    (their cost on every call, and their part in the program): every count
    goes to "Global", the only one read."""

    parents = ("Global",)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class WorkCount:
    def __init__(self, torch):
        self.torch = torch
        self.fake = ctypes.CDLL(None)
        self.counter = None
        self.stopped_at_compile = False
        self.at_steps = []  # the total at the end of each of the first optimizer steps
        self.left_in_place = False  # another dispatch mode above it at torch.compile

    def install(self):
        try:
            from torch.utils.flop_counter import FlopCounterMode
        except ImportError:
            return
        counter = FlopCounterMode(display=False)
        if hasattr(counter, "mod_tracker"):
            counter.mod_tracker = _GlobalOnly()
        counter.__enter__()
        self.counter = counter
        self._watch_compile()

    def _watch_compile(self):
        """The operator count leaves at the first call of anything compiled:
        Dynamo compiles nothing while a dispatch mode is active, and the
        program must run as written. Not at torch.compile itself, which
        libraries call at import for functions they may never run
        (bitsandbytes' CPU fallbacks)."""
        torch = self.torch
        original = torch.compile
        if getattr(original, "_vramguard_work_watch", False):
            return
        stop = self.stop

        def watched(compiled):
            if isinstance(compiled, torch.nn.Module):
                compiled.register_forward_pre_hook(lambda module, args: stop())
                return compiled
            if not callable(compiled):
                return compiled

            @functools.wraps(compiled)
            def call(*args, **kwargs):
                stop()
                return compiled(*args, **kwargs)

            return call

        @functools.wraps(original)
        def compile(model=None, *args, **kwargs):
            if model is None:  # @torch.compile(mode=...): a decorator
                decorator = original(None, *args, **kwargs)
                return lambda fn: watched(decorator(fn))
            return watched(original(model, *args, **kwargs))

        compile._vramguard_work_watch = True
        torch.compile = compile

    def stop(self):
        """The operator count off the dispatch stack (at the first call of
        compiled code): its counts so far are kept."""
        counter = self.counter
        if counter is None or counter.mode is None or self.stopped_at_compile:
            return
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        self.stopped_at_compile = True
        if _get_current_dispatch_mode() is counter.mode:
            counter.__exit__(None, None, None)
        else:
            self.left_in_place = True

    def mark_step(self):
        """An optimizer step ended: the total so far, for the first three."""
        if len(self.at_steps) < 3:
            self.at_steps.append(self._total())

    def _total(self):
        gemm = self._gemm_flops() or 0
        return gemm + sum(self._other().values())

    def _other(self):
        by_op = {}
        if self.counter is not None:
            for op, flops in self.counter.get_flop_counts().get("Global", {}).items():
                name = str(op).split(".")[-1]
                if name not in GEMM_OPERATORS:
                    by_op[name] = by_op.get(name, 0) + int(flops)
        return by_op

    def step_flops(self):
        """The work of one optimizer step: the second's (the first one's
        includes what the program does once, before it), or the first's
        when the run took one step; None before any."""
        marks = self.at_steps
        if len(marks) >= 2:
            return marks[1] - marks[0]
        return marks[0] if marks else None

    def _gemm_flops(self):
        fn = getattr(self.fake, "vg_fakecuda_gemm_flops", None)
        if fn is None:
            return None
        fn.restype = ctypes.c_longlong
        return int(fn())

    def figures(self):
        """The run's counts: JSON-ready."""
        gemm = self._gemm_flops()
        operator_gemm = 0
        if self.counter is not None:
            operator_gemm = sum(int(f) for op, f in self.counter.get_flop_counts().get("Global", {}).items()
                                if str(op).split(".")[-1] in GEMM_OPERATORS)
        other = self._other()
        return {
            "gemm_flops": gemm,
            "operator_gemm_flops": operator_gemm,
            "operator_other_flops": sum(other.values()),
            "operator_other": other,
            "total_flops": None if gemm is None else gemm + sum(other.values()),
            "step_flops": self.step_flops(),
            "steps_marked": len(self.at_steps),
            "operator_count": self.counter is not None,
            "operator_count_stopped_at_compile": self.stopped_at_compile,
        }


class _Work(Feature):
    name = "work"

    def env(self, options):
        return {WORK_ENV: "1"} if options.remedies else {}

    def install(self, run):
        if not os.environ.get(WORK_ENV):
            return None
        count = WorkCount(run.torch)
        count.install()
        return count

    def figures(self, count, run):
        return {"work": count.figures() if count is not None else None}


FEATURE = _Work()
