"""The child of a dry run (dryrun/launch.py): one run of the user's script
(or notebook) on a phantom GPU, under one allocator, in a process of its own.

    python -m vramguard.dryrun.child --allocator native --result R.json \
        [--snapshot S.pickle] [--steps N] [--notebook] -- SCRIPT ARGS...

The parent sets the phantom's environment (vramguard.phantom.gpu.environ, the
CUDA context's memory in VG_FAKECUDA_CONTEXT), PYTORCH_CUDA_ALLOC_CONF
for `expandable`, and the features' variables (dryrun/contract.py). Here
(run.py): vramguard is installed for `vramguard`, the memory history is
recorded with stacks, the features are installed, and the script runs as
__main__ with its own sys.argv. Whatever happens to it (it ends, it exits,
it runs out of memory, it raises), its RunRecord goes to the result file
(contract.write_run); the exit status is the script's (1 for an uncaught
exception, its own for sys.exit).
"""
import argparse
import ctypes
import os
import signal
import sys
import time
import traceback

from ..contract import ALLOCATORS, write_run
from .ending import Endings, Terminated, on_sigint, on_sigterm
from .run import Run

__all__ = ["main", "parse"]


def die_with_parent():
    """The run ends when the dry run does (Linux: PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            os._exit(130)
    except Exception:
        pass


def parse(argv):
    parser = argparse.ArgumentParser(prog="vramguard.dryrun.child")
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
    die_with_parent()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_sigint)
    started = time.monotonic()
    opts = parse(sys.argv[1:] if argv is None else argv)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_sigterm)
    run = Run(opts)
    run.started = started
    endings = run.endings = Endings(run.write_ended)
    try:
        try:
            run.setup()
        except Terminated:  # ended before the script started: nothing to write
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
    write_run(opts.result, result)
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
