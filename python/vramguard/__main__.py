"""Command line: `python -m vramguard demo`."""
import argparse
import sys

from ._units import parse_size


def _demo(args):
    from ._demo import run_demo

    run_demo(capacity=parse_size(args.capacity), steps=args.steps)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="vramguard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="a training loop on a simulated device, and its report")
    demo.add_argument("--capacity", default="15GiB", help="simulated device size (default 15GiB)")
    demo.add_argument("--steps", type=int, default=5)
    demo.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, OSError) as exc:
        print(f"vramguard: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
