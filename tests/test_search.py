"""The package's one search over whole numbers (python/vramguard/_search.py):
doubling to a bracket, bisection inside it. Every question is a costly run,
so the tests count the questions: none is asked twice, and the answer is
the boundary of the predicate, for seeded random boundaries."""
import random

import pytest

from vramguard._search import adjacent, bisect, double


class Asked:
    """A monotone predicate (true up to `boundary`), counting its questions."""

    def __init__(self, boundary):
        self.boundary, self.asked = boundary, []

    def __call__(self, n):
        assert n not in self.asked, f"{n} asked twice"
        self.asked.append(n)
        return n <= self.boundary


def test_double_from_start_until_it_no_longer_holds():
    holds = Asked(40)
    assert double(holds, 1, 1000) == (32, 64)
    assert holds.asked == [1, 2, 4, 8, 16, 32, 64]


def test_double_caps_at_stop_and_tries_it_last():
    holds = Asked(10 ** 6)
    assert double(holds, 3, 100) == (100, None)
    assert holds.asked == [3, 6, 12, 24, 48, 96, 100]


def test_double_without_a_cap_ends_at_the_first_double_over_stop_untried():
    holds = Asked(10 ** 6)
    assert double(holds, 3, 100, cap=False) == (96, None)
    assert holds.asked == [3, 6, 12, 24, 48, 96]
    assert double(Asked(0), 200, 100, cap=False) == (None, None)  # nothing to try


def test_double_when_the_start_does_not_hold():
    holds = Asked(0)
    assert double(holds, 5, 100) == (None, 5)
    assert holds.asked == [5]


@pytest.mark.parametrize("seed", range(20))
def test_double_then_bisect_finds_the_boundary(seed):
    rng = random.Random(seed)
    boundary = rng.randrange(1, 1 << 20)
    holds = Asked(boundary)
    good, bad = double(holds, 1, 1 << 21)
    good, bad = bisect(lambda n: not holds(n), good, bad)
    assert (good, bad) == (boundary, boundary + 1)
    assert len(holds.asked) <= 2 * 21 + 1  # log2 of the range, twice: doubling, then halving


def test_bisect_does_not_ask_the_ends_and_stops_when_close():
    asked = []

    def high(n):
        asked.append(n)
        return n >= 700

    assert bisect(high, 0, 1024, close=lambda lo, hi: hi - lo <= 100) == (640, 704)
    assert asked == [512, 768, 640, 704]  # halving: the ends are never asked


def test_bisect_on_a_grid_of_its_callers():
    """A search in steps (16 MiB for a device): the midpoint is the caller's,
    and a midpoint at an end stops the search instead of asking it."""
    grid = 16

    def mid(lo, hi):
        return max((lo + hi) // 2 // grid * grid, lo + grid)

    low, high = bisect(lambda n: n >= 200, 0, 1000, close=lambda lo, hi: hi - lo <= grid, midpoint=mid)
    assert (low, high) == (192, 208)
    assert bisect(lambda n: True, 0, 10, close=lambda lo, hi: hi - lo <= grid, midpoint=mid) == (0, 10)


def test_adjacent():
    assert adjacent(3, 4) and adjacent(4, 4) and not adjacent(3, 5)
