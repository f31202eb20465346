"""The one search over whole numbers this package makes, wherever it
looks for a boundary: the smallest budget a trace replays in
(trace/replay.py), the largest batch that fits (find_max_batch), a dry
run's smallest device and largest swept value (dryrun/runner.py).

Each asks a monotone question of a whole number (a size in granules, a
batch, an index into increasing values): below some boundary the answer
is one thing, above it the other. `double` finds a bracket by doubling;
`bisect` narrows a bracket by halving it. Each call of the question is
a costly run, so neither asks twice for the same number."""

__all__ = ["adjacent", "bisect", "double", "halfway"]


def adjacent(low, high):
    """The default end of a bisection: nothing lies between."""
    return high - low <= 1


def double(holds, start, stop, cap=True):
    """Doubling from `start` while holds(n) is true: (the last n that
    held or None, the first that did not or None). With `cap`, the number
    after the last below `stop` is `stop` itself (tried last); without,
    the search ends at the first double over `stop`, untried."""
    if not cap and start > stop:
        return None, None
    held, n = None, start
    while True:
        if not holds(n):
            return held, n
        held = n
        if n >= stop:
            return held, None
        n = min(2 * n, stop) if cap else 2 * n
        if not cap and n > stop:
            return held, None


def halfway(low, high):
    return (low + high) // 2


def bisect(on_high_side, low, high, close=adjacent, midpoint=halfway):
    """Narrows the bracket (low, high), whose ends answer differently and
    are not asked again, until close(low, high): each midpoint(low, high)
    asked on_high_side(mid) goes to the side whose answer it shares (a
    midpoint on the grid of a search in steps, such as 16 MiB, is the
    caller's). Returns the narrowed (low, high)."""
    while not close(low, high):
        mid = midpoint(low, high)
        if mid <= low or mid >= high:
            break
        if on_high_side(mid):
            high = mid
        else:
            low = mid
    return low, high
