"""The report's needs and headroom (python/vramguard/dryrun/notes.py,
table.py), on results whose figures are given: how each need was found
(checked by runs, a replay's unchecked, or some of each), where runs found
another need than the replay proposed, a sweep's needs ranked at one value
only, and the headroom from the need where runs checked it."""
from vramguard.dryrun import DryRunResult, format_report

MiB, GiB = 1 << 20, 1 << 30
T4 = 15828320256


def _run(name, **figures):
    run = {"allocator": name, "peak_allocated_bytes": GiB, "peak_reserved_bytes": GiB, "fits": True,
           "first_oom": None, "error": None, "exit_status": 0, "used_gpu": True}
    run.update(figures)
    return run


def _result(*runs, **extra):
    result = DryRunResult(gpu="T4", device_bytes=T4, context_bytes=400 * MiB, script="s.py",
                          allocators=[r["allocator"] for r in runs], **extra)
    for r in runs:
        result[r["allocator"]] = r
    return result


def _needs_line(result):
    return next(line for line in format_report(result).splitlines() if line.startswith("Needs"))


CHECKED = ("A need is the smallest device a run fits on (the CUDA context included, to 16 MiB), checked by runs: "
           "it fits a phantom of that size, and one of 16 MiB less does not (a replay of the run's own recorded "
           "allocations under its allocator's policy proposed it); peak reserved is what a cache with room keeps, "
           "not what it needs.")


def test_checked_needs():
    result = _result(_run("native", need_bytes=13 * GiB, need_checked=True, need_replayed_bytes=13 * GiB),
                     _run("vramguard", need_bytes=12 * GiB, need_checked=True, need_replayed_bytes=12 * GiB))
    assert _needs_line(result) == f"Needs: vramguard 12.00 GiB, the least; native 13.00 GiB. {CHECKED}"
    text = format_report(result)
    assert "The replay proposed" not in text
    assert "native     13.00 GiB" in text and "~" not in text


def test_where_runs_found_another_need_than_the_replay_both_are_said():
    result = _result(_run("vramguard", need_bytes=12 * GiB + 800 * MiB, need_checked=True,
                          need_replayed_bytes=13 * GiB + 300 * MiB))
    assert "The replay proposed another need than the runs found: vramguard 13.29 GiB (runs: 12.78 GiB)." \
        in format_report(result)


def test_unchecked_needs_are_marked_in_the_table_and_said():
    result = _result(_run("native", need_bytes=13 * GiB), check_needs=False)
    assert _needs_line(result) == (
        "Needs: native 13.00 GiB. A need is the smallest device a run fits on (the CUDA context included, to "
        "16 MiB), as a replay of the run's own recorded allocations under its allocator's policy finds it, not "
        "checked by runs; peak reserved is what a cache with room keeps, not what it needs.")
    assert "native     ~13.00 GiB" in format_report(result)


def test_some_checked_some_not():
    result = _result(_run("native", need_bytes=13 * GiB, need_checked=True),
                     _run("expandable", need_bytes=12 * GiB))
    assert ": runs on phantoms checked it for native; for expandable it is a replay's of the run's recording, " \
           "not checked by runs;" in _needs_line(result)


def test_a_sweeps_needs_are_ranked_at_one_value_only():
    """native's largest value is 10, the others' 14: their needs are of other
    programs, and are not ranked against native's."""
    sweep = {"name": "BATCH", "values": [8, 10, 12, 14]}
    result = _result(_run("native", need_bytes=12 * GiB + 940 * MiB, need_checked=True, measured_at=10,
                          largest_value=10, largest_batch=10),
                     _run("expandable", need_bytes=14 * GiB + 750 * MiB, need_checked=True, measured_at=14,
                          largest_value=14, largest_batch=14),
                     _run("vramguard", need_bytes=14 * GiB + 620 * MiB, need_checked=True, measured_at=14,
                          largest_value=14, largest_batch=14), sweep=sweep)
    assert _needs_line(result) == ("Needs at BATCH=14: vramguard 14.61 GiB, the least; expandable 14.73 GiB. "
                                   f"At BATCH=10: native 12.92 GiB. {CHECKED}")


def _margin(result):
    return [line for line in format_report(result).splitlines() if "to spare" in line]


def test_the_headroom_is_from_the_checked_need_not_the_peak_held():
    """The case that was false: vramguard's arena held nearly the whole card
    at its peak, yet the run needs 12.80 GiB of the 14.74."""
    held = T4 - int(1.06 * MiB)
    run = _run("vramguard", device_peak_bytes=held, need_bytes=12 * GiB + 820 * MiB, need_checked=True)
    assert _margin(_result(run)) == []
    unchecked = _run("vramguard", device_peak_bytes=held, need_bytes=12 * GiB + 820 * MiB)
    (line,) = _margin(_result(unchecked))
    assert line.startswith("vramguard fits, with at least 1.06 MiB to spare (of the 14.35 GiB beside the CUDA "
                           "context, under 2% or 256.00 MiB)")


def test_the_headroom_takes_the_larger_of_its_two_bounds():
    """A need is rounded up to 16 MiB: where the peak held leaves more, that
    is the bound said."""
    need = T4 - 100 * MiB
    run = _run("native", device_peak_bytes=T4 - 110 * MiB, need_bytes=need, need_checked=True)
    (line,) = _margin(_result(run))
    assert line.startswith("native fits, with at least 110.00 MiB to spare")
    run = _run("native", device_peak_bytes=T4 - 90 * MiB, need_bytes=need, need_checked=True)
    (line,) = _margin(_result(run))
    assert line.startswith("native fits, with at least 100.00 MiB to spare")
