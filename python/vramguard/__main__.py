"""vramguard's command line.

  python -m vramguard demo                 a training loop on a simulated T4
  python -m vramguard replay TRACE [...]   would this trace fit? both policies
"""
import argparse
import json
import sys

from ._units import parse_size


def _demo(args):
    from ._demo import run_demo

    run_demo(capacity=parse_size(args.capacity), steps=args.steps)
    return 0


def _replay(args):
    from ._import import load_trace
    from ._report import format_replay_report, replay_report

    trace = load_trace(args.trace)
    budget = parse_size(args.budget) if args.budget is not None else None
    report = replay_report(trace, budget, args.policy)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(format_replay_report(report))
    return 0 if report["fits"] else 1


def main(argv=None):
    parser = argparse.ArgumentParser(prog="vramguard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="a training loop on a simulated device, and its report")
    demo.add_argument("--capacity", default="15GiB", help="simulated device size (default 15GiB)")
    demo.add_argument("--steps", type=int, default=5)
    demo.set_defaults(run=_demo)
    rep = sub.add_parser("replay", help="replay an allocation trace: would it fit?")
    rep.add_argument("trace", help="a .vgtrace file, a PyTorch memory snapshot pickle, or a lifetime log")
    rep.add_argument("--budget", help="e.g. 15GiB; the exit status is 1 when it does not fit")
    rep.add_argument("--policy", default="vramguard", choices=("vramguard", "torch"))
    rep.add_argument("--json", action="store_true", help="one JSON object instead of text")
    rep.set_defaults(run=_replay)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, OSError) as exc:
        print(f"vramguard: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
