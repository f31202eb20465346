"""The rule that says whether memory live at step boundaries leaks.

A leak, as step() judges it: over the last LEAK_WINDOW step boundaries,
the memory live at the boundary grew, and at least 3/4 of the increments
were growth. The figure per step is the median increment of that window
(exact for a constant leak, and not moved by one large step); a one-off
growth (the optimizer's state made at the first step) or a steady loop is
never one.

Pure arithmetic on lists of byte counts: steps.py feeds it the boundaries
it keeps, and tests feed it figures of their own.
"""

__all__ = ["LEAK_WINDOW", "LEAK_GROWING_SHARE", "judge_leak", "window_grows"]

#: Step boundaries the leak rule looks at (7 increments).
LEAK_WINDOW = 8
#: The share of the window's increments that must be growth.
LEAK_GROWING_SHARE = 0.75


def _increments(lives):
    return [b - a for a, b in zip(lives, lives[1:])]


def _rule_holds(increments):
    growing = sum(1 for d in increments if d > 0)
    return sum(increments) > 0 and growing >= LEAK_GROWING_SHARE * len(increments)


def _median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) // 2


def window_grows(lives):
    """Whether the rule holds over these boundary figures (oldest first)
    alone: step() asks it of the last window before it copies every
    boundary it keeps, so a steady loop costs O(window) a step."""
    return _rule_holds(_increments(lives))


def judge_leak(lives):
    """(bytes per step, index where it began) for boundary figures `lives`
    (oldest first), or None when they do not show a leak (see the module's
    rule)."""
    if len(lives) < LEAK_WINDOW:
        return None
    window = _increments(lives[-LEAK_WINDOW:])
    if not _rule_holds(window):
        return None
    return _median(window), _leak_start(lives, window)


def _leak_start(lives, window):
    """The earliest boundary from which the rule still holds, given that it
    holds over the last window (its increments `window`)."""
    # Back while the longer stretch still holds to the rule, with a running
    # count (one pass: step() may see a thousand boundaries).
    start = len(lives) - LEAK_WINDOW
    growing = sum(1 for d in window if d > 0)
    while start > 0:
        more = growing + (lives[start] > lives[start - 1])
        if lives[-1] - lives[start - 1] <= 0 or more < LEAK_GROWING_SHARE * (len(lives) - start):
            break
        start, growing = start - 1, more
    while lives[start + 1] <= lives[start]:  # a leak begins with growth
        start += 1
    return start
