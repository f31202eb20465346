"""vramguard's command line.

  python -m vramguard demo                 a training loop on a simulated T4
  python -m vramguard replay TRACE [...]   would this trace fit? every policy side by side

Sizes are bytes, a number with a unit ("15GiB", "12.5GB") or a GPU preset
(T4, L4, A100-40GB, A100-80GB, V100-16GB, H100-80GB: their usable memory).

Exit status: 0 done (the trace fits), 1 the trace does not fit the budget,
2 bad input (one line on stderr says what), 130 interrupted (Ctrl-C),
141 stdout was closed before the output was written (`... | head`), said
on no line, as a program killed by SIGPIPE is.
"""
import argparse
import json
import os
import stat
import sys

from ._report import POLICIES
from ._units import parse_budget, parse_size

EXIT_DOES_NOT_FIT = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE, what `yes | head -1` reports for yes


class BadInput(Exception):
    """Input the command cannot use; its message is the line printed."""


def _first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _demo(args):
    from ._demo import run_demo

    parse_size(args.capacity, "capacity")  # a bad size is bad input, said before anything runs
    try:
        run_demo(capacity=args.capacity, steps=args.steps)
    except MemoryError as exc:  # the model itself does not fit the device
        raise BadInput(f"--capacity {args.capacity} is too small for the demo's model: {_first_line(exc)}") from None
    return 0


def _replay(args):
    from ._import import load_trace
    from ._report import check_policy, format_replay_report, replay_report

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


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, like every other bad input."""

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"vramguard: {message} (see: python -m vramguard --help)\n")


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
    args = parser.parse_args(argv)
    try:
        status = args.run(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_STDOUT_CLOSED
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
