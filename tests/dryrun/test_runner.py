"""The dry run's searches (python/vramguard/dryrun/runner.py): the smallest
device a run fits on (--min-memory) and the largest swept value that fits
(--sweep), each a bisection whose every step is a run. Here a run is a
stand-in that fits above a known size or up to a known value, so the
answers and the runs asked for are exact arithmetic."""
import pytest

from vramguard.dryrun.contract import GRANULE
from vramguard.dryrun.runner import MAX_SEARCH_BYTES, Runner, SearchFailed

MiB, GiB = 1 << 20, 1 << 30


def _runner(fits_from=None, fits_up_to=None, fails_at=None, memory=15 * GiB):
    runner = Runner.__new__(Runner)  # no phantom: the runs are the stand-in's
    runner.memory, runner.context, runner.args = memory, 400 * MiB, ["--batch", "{BATCH}"]
    runner.asked = []

    def run(allocator, label, memory=None, args=None, extra_env=None, snapshot=None, steps=None):
        key = memory if memory is not None else int(args[1])
        assert key not in runner.asked, f"{key} run twice"
        runner.asked.append(key)
        if fails_at is not None and key == fails_at:
            return {"fits": None, "error": "ValueError: bad"}
        fits = key >= fits_from if fits_from is not None else key <= fits_up_to
        return {"fits": fits, "peak_allocated_bytes": 1 << 20}

    runner.run = run
    return runner


def test_the_smallest_device_is_the_first_granule_that_fits():
    runner = _runner(fits_from=6244 * MiB)
    full = {"fits": True, "peak_allocated_bytes": 5 * GiB, "device_peak_bytes": 7 * GiB}
    assert runner.min_memory("native", full) == 6256 * MiB  # 391 x 16 MiB, the first multiple above 6244 MiB
    assert runner.asked[0] == 7 * GiB  # the device's peak in the full run, tried first
    assert all(size % GRANULE == 0 for size in runner.asked)
    assert all(size > 5504 * MiB for size in runner.asked)  # never below the context plus peak allocated


def test_a_run_that_fits_only_the_whole_card_answers_the_cards_size():
    card = 15 * GiB + 3 * MiB  # not a multiple of 16 MiB
    runner = _runner(fits_from=card, memory=card)
    assert runner.min_memory("native", {"fits": True, "peak_allocated_bytes": 14 * GiB}) == card


def test_above_the_card_the_search_doubles_then_bisects():
    runner = _runner(fits_from=40 * GiB)
    assert runner.min_memory("native", {"fits": False}) == 40 * GiB
    assert runner.asked[:2] == [30 * GiB, 60 * GiB]


def test_above_the_card_it_stops_at_the_largest_phantom_and_says_so():
    runner = _runner(fits_from=MAX_SEARCH_BYTES * 4)
    full = {"fits": False}
    assert runner.min_memory("native", full) is None
    assert runner.asked == [g * GiB for g in (30, 60, 120, 240, 480, 960)]
    assert full["min_memory_above_bytes"] == 960 * GiB


def test_a_run_that_fails_otherwise_stops_the_search_with_it():
    runner = _runner(fits_from=6 * GiB, fails_at=7 * GiB)
    with pytest.raises(SearchFailed) as stopped:
        runner.min_memory("native", {"fits": True, "peak_allocated_bytes": 5 * GiB, "device_peak_bytes": 7 * GiB})
    assert stopped.value.run["failed_at"] == {"memory_bytes": 7 * GiB}


@pytest.mark.parametrize("largest", [None, 1, 2, 4, 8, 16, 32])
def test_the_sweep_finds_the_largest_value_that_fits(largest):
    values = [1, 2, 4, 8, 16, 32]
    runner = _runner(fits_up_to=largest or 0)
    found, runs, failed = runner.sweep("native", "BATCH", values)
    assert (found, failed) == (largest, None)
    assert len(runs) == len(runner.asked) <= 3  # log2 of six values, rounded up
    assert [r["sweep_value"] for r in runs] == sorted(runner.asked)


def test_a_sweep_run_that_fails_otherwise_ends_it_with_no_answer():
    runner = _runner(fits_up_to=32, fails_at=4)
    found, runs, failed = runner.sweep("native", "BATCH", [1, 2, 4, 8, 16, 32])
    assert found is None and failed["failed_at"] == {"value": 4} and runner.asked == [4]


@pytest.mark.parametrize("off", [-5, -2, -1, 0, 1, 2, 3, 9])
def test_a_replays_need_off_by_a_few_granules_costs_a_few_runs(off):
    """The replay proposes 7 GiB; the runs fit from `off` granules above it.
    The search steps out from the proposal by 1, 2, 4, ... granules, so a
    right proposal costs two runs and a miss of k granules about
    2 log2(k) + 2, wherever the bracket's far end lies."""
    answer = 7 * GiB + off * GRANULE
    runner = _runner(fits_from=answer)
    full = {"fits": True, "peak_allocated_bytes": 1 * GiB, "need_bytes": 7 * GiB, "device_peak_bytes": 9 * GiB}
    assert runner.min_memory("native", full) == answer
    assert runner.asked[0] == 7 * GiB
    assert all(size % GRANULE == 0 for size in runner.asked)
    k = abs(off) or 1
    assert len(runner.asked) <= 2 * (k.bit_length() + 1), runner.asked
    if off == 0:
        assert runner.asked == [7 * GiB, 7 * GiB - GRANULE]


def test_a_replays_need_just_below_the_floor_stops_at_the_floor():
    """Nothing fits below the context plus peak allocated: stepping down
    from the proposal never asks for a size under that floor."""
    floor = 400 * MiB + 6 * GiB  # the stand-in's context and peak allocated
    runner = _runner(fits_from=floor + 1)
    full = {"fits": True, "peak_allocated_bytes": 6 * GiB, "need_bytes": floor + 3 * GRANULE}
    assert runner.min_memory("native", full) == floor + GRANULE
    assert all(size >= floor for size in runner.asked)
    assert runner.asked == [floor + d * GRANULE for d in (3, 2, 1, 0)]  # down 1, 2, then the floor itself
