"""The child's own lines on stderr, each marked as the dry run's."""
import sys

__all__ = ["LOG", "mib", "say"]

LOG = "vramguard dryrun:"


def say(text):
    print(f"{LOG} {text}", file=sys.stderr, flush=True)


def mib(nbytes):
    return f"{nbytes / (1 << 20):,.1f} MiB"
