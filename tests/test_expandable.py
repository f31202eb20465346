"""vramguard.replay(policy="torch-expandable") and min_budget with it: the
emulation of PyTorch's expandable segments (torch_expandable.c) from Python,
on hand-made traces with the bytes PyTorch's rules give (the same sequences
run against the real PyTorch in tests/torch/test_expandable_torch.py), and
every bad argument of the extension's expandable_replay."""
import pytest

from vramguard import Trace, min_budget, replay
from vramguard._core import expandable_replay

MiB = 1 << 20
POLICY = "torch-expandable"


def build(*steps):
    """A trace from ("alloc", name, bytes[, stream]), ("free", name), ("empty_cache",)."""
    trace, ids = Trace("hand-made"), {}
    for step in steps:
        if step[0] == "alloc":
            ids[step[1]] = trace.alloc(step[2], stream=step[3] if len(step) > 3 else 0)
        elif step[0] == "free":
            trace.free(ids.pop(step[1]))
        else:
            trace.empty_cache()
    return trace


def reserved_after_each_op(trace, budget=None):
    r = replay(trace, budget=budget, policy=POLICY, samples=len(trace))
    return [reserved // MiB for _, _, _, reserved in r.curve]


def test_a_request_over_1_mib_maps_a_20_mib_page_and_a_small_one_2_mib():
    r = replay(build(("alloc", "a", MiB + 1), ("alloc", "b", 1)), policy=POLICY)
    assert r.fits and r.policy == POLICY
    assert r.peak_reserved_bytes == 22 * MiB
    assert r.peak_allocated_bytes == MiB + 512 + 512
    assert (r.maps, r.pages_mapped, r.unmaps, r.device_alloc) == (2, 2, 0, 2)


def test_free_in_the_middle_then_allocate_bigger():
    trace = build(
        ("alloc", "a", 8 * MiB), ("alloc", "b", 8 * MiB), ("alloc", "c", 8 * MiB),
        ("free", "b"),                       # an 8 MiB hole
        ("alloc", "d", 12 * MiB),            # from the segment's free tail
        ("alloc", "e", 10 * MiB),            # the tail grows by a page
        ("alloc", "f", 8 * MiB),             # the hole, exactly
        ("alloc", "g", 30 * MiB),            # the 14 MiB tail and one page more
    )
    assert reserved_after_each_op(trace) == [20, 20, 40, 40, 40, 60, 60, 80]


def test_two_streams_two_segments():
    trace = build(("alloc", "a", 4 * MiB, 1), ("alloc", "b", 4 * MiB, 2), ("free", "a"),
                  ("alloc", "c", 4 * MiB, 2), ("alloc", "d", 13 * MiB, 2))
    assert reserved_after_each_op(trace) == [20, 40, 40, 40, 60]


def test_empty_cache_unmaps_only_whole_free_pages():
    trace = build(("alloc", "a", 30 * MiB), ("alloc", "b", 5 * MiB), ("free", "a"), ("empty_cache",),
                  ("free", "b"), ("empty_cache",), ("alloc", "c", 4 * MiB))
    assert reserved_after_each_op(trace) == [40, 40, 40, 20, 20, 0, 20]
    r = replay(trace, policy=POLICY)
    assert (r.unmaps, r.pages_unmapped) == (2, 2)
    assert r.syncs == 2 + 2  # a stream sync per unmap, a device sync per empty_cache


def test_the_oom_path_on_a_120_mib_device():
    trace = build(
        ("alloc", "a", 45 * MiB), ("alloc", "b", 10 * MiB), ("free", "a"),
        ("alloc", "c", 50 * MiB, 1), ("alloc", "d", 40 * MiB, 1), ("alloc", "e", 60 * MiB),
        ("free", "b"), ("alloc", "f", 30 * MiB),
    )
    r = replay(trace, budget=120 * MiB, policy=POLICY, samples=len(trace))
    assert [reserved // MiB for _, _, _, reserved in r.curve] == [60, 60, 60, 120, 120, 120, 120, 100]
    assert (r.ooms, r.first_oom, r.alloc_retries) == (2, 5, 3)
    assert r.first_oom_at.request_bytes == 60 * MiB
    assert not r.fits


def test_min_budget_is_the_first_budget_that_fits():
    trace = build(*[("alloc", i, 10 * MiB) for i in range(5)])
    assert min_budget(trace, policy=POLICY) == 60 * MiB
    assert replay(trace, budget=58 * MiB, policy=POLICY).first_oom == 4
    assert replay(trace, budget=60 * MiB, policy=POLICY).fits


def test_min_budget_is_not_lowered_by_the_release():
    # b's free leaves page 1 mapped and free; c (30 MiB) takes it and maps
    # page 2. Under 60 MiB the release unmaps page 1, but the retry needs
    # pages 1-2 again: nothing below 60 MiB fits.
    trace = build(("alloc", "a", 20 * MiB), ("alloc", "b", 20 * MiB), ("free", "b"), ("alloc", "c", 30 * MiB))
    assert reserved_after_each_op(trace) == [20, 40, 40, 60]
    assert min_budget(trace, policy=POLICY) == 60 * MiB


def test_the_default_policies_are_untouched():
    trace = build(("alloc", "a", MiB + 1))
    r = replay(trace, policy="torch")
    assert r.peak_reserved_bytes == 20 * MiB
    assert (r.maps, r.unmaps, r.pages_mapped, r.syncs) == (0, 0, 0, 0)


COLUMNS = build(("alloc", "a", MiB)).columns()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"large_page": 3 * MiB}, ValueError, "multiples of 2 MiB"),
    ({"small_page": 0x1000}, ValueError, "multiples of 2 MiB"),
    ({"device_total": 1 << 60}, ValueError, "2\\*\\*56"),
    ({"budget": -1}, ValueError, "budget must not be negative"),
    ({"budget": "1GiB"}, TypeError, "budget must be an int"),
    ({"samples": -1}, ValueError, "samples must not be negative"),
])
def test_bad_arguments_get_one_clear_error(kwargs, error, match):
    with pytest.raises(error, match=match):
        expandable_replay(*COLUMNS, 1, **kwargs)


def test_bad_traces_are_refused_before_the_replay():
    kinds, ids, sizes, streams = COLUMNS
    with pytest.raises(ValueError, match="more allocation ids than ops"):
        expandable_replay(kinds, ids, sizes, streams, 2)
    with pytest.raises(ValueError, match="columns disagree"):
        expandable_replay(kinds, ids, sizes, streams[:4], 1)
    with pytest.raises(ValueError, match="at op 0: allocation of 0 bytes"):
        expandable_replay(kinds, ids, bytes(8), streams, 1)


def test_a_huge_request_is_an_oom_not_a_crash():
    trace = build(("alloc", "a", 1 << 47), ("alloc", "b", 1 << 47), ("alloc", "c", 1))
    r = replay(trace, budget=64 * MiB, policy=POLICY)
    assert (r.ooms, r.first_oom) == (2, 0)
    assert r.peak_reserved_bytes == 2 * MiB


def test_each_budget_is_replayed_on_a_device_of_the_budget_and_what_lies_outside_it(monkeypatch):
    """PyTorch sizes each segment's address range by the device's total (9/8
    of it), the context's share included: min_budget's `outside` makes each
    budget tried a device of budget + outside, and replay(budget="T4") the
    T4's own total."""
    import vramguard.trace.replay as replay_module
    from vramguard._presets import find_preset

    totals = []

    def recording(*args, **kwargs):
        totals.append((kwargs.get("budget"), kwargs.get("device_total")))
        return expandable_replay(*args, **kwargs)

    monkeypatch.setattr(replay_module, "expandable_replay", recording)
    trace = build(("alloc", "a", 50 * MiB), ("free", "a"), ("alloc", "b", 70 * MiB))
    assert min_budget(trace, policy=POLICY, outside=400 * MiB) == 80 * MiB  # 50 MiB cached, 70 MiB more: 4 pages
    limited = [(budget, total) for budget, total in totals if budget]
    assert limited and all(total == budget + 400 * MiB for budget, total in limited)
    totals.clear()
    replay(trace, budget="T4", policy=POLICY)
    t4 = find_preset("T4")
    assert totals == [(t4.usable_bytes, t4.total_bytes)]


@pytest.mark.parametrize("outside", [-1, 1.5, True, "400MiB", 1 << 60])
def test_a_bad_outside_gets_one_clear_error(outside):
    with pytest.raises(ValueError, match="outside must be an int of bytes"):
        min_budget(build(("alloc", "a", 50 * MiB)), policy=POLICY, outside=outside)
