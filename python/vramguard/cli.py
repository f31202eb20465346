"""vramguard's command line.

  python -m vramguard demo                 a training loop on a simulated T4
  python -m vramguard replay TRACE [...]   would this trace fit? every policy side by side
  python -m vramguard dryrun --gpu T4 train.py ARGS...
                                           will this script fit? it runs on a phantom T4,
                                           once per allocator, side by side
  python -m vramguard install-kernel --gpu T4
                                           a Jupyter kernel on a phantom T4

Sizes are bytes, a number with a unit ("15GiB", "12.5GB") or a GPU preset
(T4, L4, A100-40GB, A100-80GB, V100-16GB, H100-80GB: their usable memory).

Exit status: 0 done (the trace fits), 1 the trace does not fit the budget,
2 bad input (one line on stderr says what), 130 interrupted (Ctrl-C),
143 terminated (SIGTERM: what `timeout`, `kill` and a cancelled CI job send),
141 stdout was closed before the output was written (`... | head`), said
on no line, as a program killed by SIGPIPE is; for dryrun also 3 the
script failed for a reason other than memory (its own exit status is in
the report), 4 the program never used the GPU (nothing to measure),
5 the phantom GPU could not run it (a CUDA call it does not model).
"""
import argparse
import contextlib
import json
import os
import signal
import stat
import sys
import threading

from ._presets import preset_names
from .report.replay_report import POLICIES
from ._units import parse_budget, parse_size
from .render.words import count

EXIT_DOES_NOT_FIT = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a program `kill` ended
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE, what `yes | head -1` reports for yes


class BadInput(Exception):
    """Input the command cannot use; its message is the line printed."""


class _Terminated(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C is (a KeyboardInterrupt, so that a dry run
    ends every run's process group on its way out), but said as itself."""


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup short
    raise _Terminated()


def _first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _demo(args):
    from .report.demo import run_demo

    parse_size(args.capacity, "capacity")  # a bad size is bad input, said before anything runs
    try:
        run_demo(capacity=args.capacity, steps=args.steps)
    except MemoryError as exc:  # the model itself does not fit the device
        raise BadInput(f"--capacity {args.capacity} is too small for the demo's model: {_first_line(exc)}") from None
    return 0


def _replay(args):
    from .trace.importer import load_trace
    from .report.replay_report import check_policy, format_replay_report, replay_report

    check_policy(args.policy)  # one not in this build is said before the trace is read
    budget = parse_budget(args.budget) if args.budget is not None else None
    _check_trace_file(args.trace)
    trace = load_trace(args.trace)
    if not trace.counts()["alloc"]:
        raise BadInput(f"{args.trace}: the trace holds no allocations; there is nothing to replay")
    # The budget as typed, so that a preset keeps its name in the report.
    report = replay_report(trace, args.budget if budget else None, args.policy)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(format_replay_report(report))
    return 0 if report["fits"] else EXIT_DOES_NOT_FIT


def _check_trace_file(path):
    """A trace is a regular file with something in it. Asked of the file's
    status, which never blocks: opening a FIFO with no writer would wait
    forever, and a device (/dev/zero) reads without end."""
    try:
        status = os.stat(path)
    except OSError as exc:
        raise BadInput(f"{path}: {exc.strerror}") from None
    if stat.S_ISDIR(status.st_mode):
        raise BadInput(f"{path}: is a directory, not a trace file")
    if not stat.S_ISREG(status.st_mode):
        raise BadInput(f"{path}: not a regular file (a pipe or a device): give a trace file")
    if status.st_size == 0:
        raise BadInput(f"{path}: the file is empty")


def _dryrun(args):
    from .dryrun import dryrun, exit_status
    from .phantom.argnames import as_flags
    from .phantom.gpu import PhantomUnavailable

    if args.script is None:
        raise BadInput("dryrun: no script given (python -m vramguard dryrun --gpu T4 train.py ARGS...)")
    script_args = args.args[1:] if args.args[:1] == ["--"] else args.args
    sweeps = args.sweep or []
    if len(sweeps) > 1:  # argparse would keep the last and drop the others without a word
        raise BadInput(f"dryrun: --sweep given {count(len(sweeps), 'time')} ({', '.join(sweeps)}): "
                       "one sweep at a time")
    # With --json, stdout is the one JSON object: the script's own output goes to stderr.
    echo_to = sys.stderr if args.json else sys.stdout
    try:
        with as_flags():  # a bad value is said with its flag (--nproc), not its keyword (nproc=)
            result = dryrun(args.script, *script_args, gpu=args.gpu, allocators=args.allocator,
                            memory=args.memory, min_memory=args.min_memory, sweep=sweeps[0] if sweeps else None,
                            out=args.out,
                            steps=args.steps, context=args.context, snapshot=not args.no_snapshot,
                            echo=not args.quiet, stdout=echo_to, stderr=sys.stderr, jobs=args.jobs,
                            no_compile=args.no_compile, cwd=args.cwd, nproc=args.nproc, timeout=args.timeout,
                            weights=not args.no_weights, world_size=args.world_size, rank=args.rank,
                            gpus_per_node=args.gpus_per_node, remedies=args.remedies,
                            check_needs=not args.no_check_needs)
    except PhantomUnavailable as exc:
        raise BadInput(str(exc)) from None
    if args.json:
        print(result.to_json())
    else:
        print(result)
    return exit_status(result)


def _install_kernel(args):
    from .phantom.argnames import as_flags
    from .phantom.gpu import PhantomUnavailable
    from .phantom.kernel import install_kernel, remove_kernel

    prefix = sys.prefix if args.sys_prefix else args.prefix
    if args.remove:
        removed = remove_kernel(args.gpu, prefix=prefix, memory=args.memory, allocator=args.allocator)
        if not removed:
            print("no phantom kernel to remove" + (f" for {args.gpu}" if args.gpu else ""))
        for path in removed:
            print(f"removed {path}")
        return 0
    if args.gpu is None:
        raise BadInput("install-kernel: --gpu is required (e.g. --gpu T4)")
    try:
        # --memory is checked as dryrun checks it (one line: nothing beside the context), before the phantom
        with as_flags():
            name, where = install_kernel(args.gpu, prefix=prefix, memory=args.memory, allocator=args.allocator)
    except PhantomUnavailable as exc:
        raise BadInput(str(exc)) from None
    print(f"installed kernel {name} in {where}")
    return 0


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, like every other bad input, pointing at
    the help that lists the options of the command given (a subcommand's
    prog is "vramguard dryrun")."""

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"vramguard: {message} (see: python -m {self.prog} --help)\n")


def main(argv=None):
    parser = _Parser(prog="vramguard", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="a training loop on a simulated device, and its report")
    demo.add_argument("--capacity", default="T4", help="simulated device size (default T4: its usable 14.35 GiB)")
    demo.add_argument("--steps", type=_positive_int, default=5)
    demo.set_defaults(run=_demo)
    rep = sub.add_parser("replay", help="replay an allocation trace: would it fit?")
    rep.add_argument("trace", help="a .vgtrace file, a PyTorch memory snapshot pickle, or a lifetime log")
    rep.add_argument("--budget", help="e.g. 15GiB or T4; the exit status is 1 when it does not fit")
    rep.add_argument("--policy", default="vramguard", choices=POLICIES,
                     help="the policy the budget is tried with (default vramguard: the one it recommends); "
                          "the report sets all of them side by side")
    rep.add_argument("--json", action="store_true", help="one JSON object instead of text")
    rep.set_defaults(run=_replay)
    dry = sub.add_parser(
        "dryrun", help="run a script on a phantom GPU, once per allocator: will it fit?",
        description="Runs SCRIPT (a .py file or a .ipynb notebook) unchanged with ARGS on a phantom GPU "
                    "(kernels compute nothing, device memory costs no host memory), once per allocator, "
                    "and reports each one's need (the smallest device it runs on, from a replay of its "
                    "run's recorded allocations), peak allocated and reserved memory, whether it fits, and "
                    "its first out-of-memory line. The runs go one at a time; a run's stdin is /dev/null (input "
                    "piped to the dry run is not passed on), and its file I/O is real (files it writes are "
                    "real files). Exit status (of the vramguard run, or of every allocator asked without "
                    "it): 0 it fits, 1 it does not fit, 2 bad input, 3 the script failed for another reason "
                    "(its own exit status is in the report and the JSON), 4 the program never used the GPU "
                    "(nothing allocated, no kernel launched: nothing to measure), 5 the phantom GPU could "
                    "not run it (a CUDA call it does not model), 124 a run past --timeout, 130 Ctrl-C, "
                    "143 SIGTERM (every run's processes ended either way).")
    dry.add_argument("--gpu", default="T4", help=f"the card: {preset_names()} (default T4)")
    dry.add_argument("--allocators", "--allocator", dest="allocator", metavar="NAMES",
                     default="native,expandable,vramguard",
                     help="comma-separated, of native (PyTorch's), expandable (PyTorch's with "
                          "expandable_segments:True), vramguard (default: all three)")
    dry.add_argument("--memory", help="the device's memory instead of the card's total (e.g. 8GiB)")
    dry.add_argument("--min-memory", action="store_true",
                     help="also find each allocator's smallest device by real runs on phantoms of "
                          "other sizes (above the card's when it does not fit), to 16 MiB (more runs)")
    dry.add_argument("--sweep", metavar="NAME=V1,V2,...", action="append",
                     help="e.g. BATCH=1,2,4,8: each value replaces {BATCH} in ARGS (or is the variable "
                          "BATCH when no argument has it); the largest that fits is found by bisection; "
                          "one --sweep at a time")
    dry.add_argument("--remedies", action="store_true",
                     help="also run the standard remedies on the unchanged script (autocast, activation "
                          "checkpointing, an 8-bit or fused optimizer, then combinations until one fits): "
                          "what each frees, its largest --sweep value, its work relative to the script "
                          "as written, and the code for the cheapest that fits")
    dry.add_argument("--steps", type=_positive_int, help="stop each run after this many optimizer steps")
    dry.add_argument("--context", help="device memory the CUDA context holds (default: the card's, "
                                       "400MiB unless measured)")
    dry.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                     help="end each run after this many seconds (for a loop with no optimizer step for "
                          "--steps to count); the run is reported as timed out, with its figures so far")
    dry.add_argument("--jobs", type=_positive_int,
                     help="allocators run at once (default 1); more needs a folder per run: --cwd DIR/{allocator}")
    dry.add_argument("--out", help="where the dry run makes a new folder of its own, dryrun-TIME-XXXX, for the "
                                   "memory snapshots, logs and results (default: a new temporary folder); "
                                   "named in the report")
    dry.add_argument("--cwd", help="the directory the script runs in (default: this one; the script's "
                                   "files are real: a checkpoint it saves, zeros, replaces a real one); "
                                   "{allocator} in it: a folder per allocator, made when missing")
    dry.add_argument("--no-compile", action="store_true",
                     help="turn torch.compile off (TORCH_COMPILE_DISABLE=1): eager mode's figures, for a script "
                          "whose compilation fails on the phantom (Triton's kernels are built on the CPU and "
                          "launched as no-ops otherwise)")
    dry.add_argument("--no-snapshot", action="store_true",
                     help="record no memory history (faster): then there is no recording to replay, so each "
                          "allocator's need is not measured, no snapshot is written, and an out-of-memory the "
                          "script catches has no line")
    dry.add_argument("--no-check-needs", action="store_true",
                     help="do not check each allocator's need (the replay's smallest device) by runs on "
                          "phantoms of that size and 16 MiB less (two more runs each, more where the replay "
                          "is off): the needs are then the replay's, and said to be unchecked")
    dry.add_argument("--no-weights", action="store_true",
                     help="load Hugging Face models (from_pretrained of a Hub id or a local folder) from a "
                          "stand-in of their safetensors checkpoint: the same tensors' names, shapes and "
                          "dtypes, no data; only configs and headers are downloaded or read")
    dry.add_argument("--quiet", action="store_true", help="do not pass the script's output through "
                                                          "(it is still in the logs)")
    dry.add_argument("--nproc", type=_positive_int, default=1,
                     help="ranks, under torchrun --nproc_per_node N, each on a phantom device of its own "
                          "(torch.distributed's nccl backend runs on the phantom's NCCL); figures per rank")
    dry.add_argument("--world-size", type=_positive_int,
                     help="run as one rank of a job of this many GPUs, in one process, on PyTorch's fake "
                          "process group (collectives move nothing): one rank's figures for DDP, FSDP or "
                          "ZeRO at any size; not with --nproc")
    dry.add_argument("--rank", type=int, help="with --world-size: the rank to be (default 0)")
    dry.add_argument("--gpus-per-node", type=_positive_int, default=8,
                     help="with --world-size: GPUs per node, for LOCAL_RANK and LOCAL_WORLD_SIZE (default 8)")
    dry.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    dry.add_argument("script", nargs="?", help="a .py script or a .ipynb notebook")
    dry.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    dry.set_defaults(run=_dryrun)
    ker = sub.add_parser("install-kernel",
                         help="a Jupyter kernel whose GPU is a phantom (--remove: uninstall)")
    ker.add_argument("--gpu", help="the card (T4, L4, ...); with --remove, left out: every phantom kernel")
    ker.add_argument("--memory", help="the device's memory instead of the card's total (in the kernel's "
                                      "name; with --remove: remove that kernel)")
    ker.add_argument("--allocator", choices=("native", "expandable"),
                     help="default native (expandable: in the kernel's name; with --remove: remove that kernel)")
    where = ker.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="in the user's Jupyter data dir (the default)")
    where.add_argument("--prefix", help="under PREFIX/share/jupyter/kernels")
    where.add_argument("--sys-prefix", action="store_true", help="under this Python's prefix (a virtualenv)")
    ker.add_argument("--remove", action="store_true", help="uninstall the phantom kernel(s)")
    ker.set_defaults(run=_install_kernel)
    args = parser.parse_args(argv)
    with _sigterm_as_interrupt():
        return _run(args)


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM raises _Terminated while the command runs (where it has the
    default action, in the main thread), so that what the command started
    is ended before it exits."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(args):
    try:
        status = args.run(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_STDOUT_CLOSED
    except _Terminated:
        print("vramguard: terminated (SIGTERM)", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print("vramguard: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (BadInput, ValueError, OSError) as exc:
        print(f"vramguard: {_first_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _silence_stdout():
    """The reader of stdout is gone: what is still buffered would fail
    again when the interpreter flushes it at exit (a second error printed),
    so stdout is pointed at /dev/null instead."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
