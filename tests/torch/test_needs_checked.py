"""A printed need is checked by runs (dryrun's check_needs, on by
default): the replay of the run's recording proposes it, runs on phantoms of
that size and of 16 MiB less check it, and the search goes on where either
disagrees. The truth test applies the answer: the program run on a device of
the printed need fits, on 16 MiB less it does not. The headroom follows
from the need; a sweep's needs are ranked at one value only."""
import pytest

from test_dryrun import MiB, dryrun, report, write
from test_dryrun_notes import FRAGMENTS

pytestmark = pytest.mark.torch

# 600 MiB, freed, then 700 MiB: PyTorch's cache keeps the 600 MiB block it
# cannot reuse, so on a large device the peak held is far above the need.
CACHE_HOLDS_MORE = """
    import torch
    a = torch.empty(600 << 20, dtype=torch.uint8, device="cuda")
    del a
    b = torch.empty(700 << 20, dtype=torch.uint8, device="cuda")
"""


def test_the_printed_need_fits_and_16_mib_less_does_not(tmp_path):
    write(tmp_path, "frag.py", FRAGMENTS)
    result, _ = dryrun(tmp_path, "--memory", "2GiB", "--allocators", "native,vramguard", "frag.py", expect=0)
    for name in ("native", "vramguard"):
        run = result[name]
        assert run["need_checked"] is True and run["need_replayed_bytes"], run
        need = run["need_bytes"]
        at_need, _ = dryrun(tmp_path, "--memory", str(need), "--allocators", name, "--no-snapshot", "frag.py",
                            expect=0)
        assert at_need[name]["fits"] is True
        below, _ = dryrun(tmp_path, "--memory", str(need - 16 * MiB), "--allocators", name, "--no-snapshot",
                          "frag.py", expect=1)
        assert below[name]["fits"] is False
    assert "~" not in report(result).split("Needs: ")[0]  # every need in the table is checked


def test_the_headroom_follows_from_the_need(tmp_path):
    """On 1.75 GiB native holds 1.70 GiB at its peak (the cached 600 MiB
    block beside the 700 MiB one and the context's 400 MiB): without a need,
    only 92 MiB is sure to be spare; with the need checked (1,104 MiB), 688 MiB
    is, and there is no thin margin to speak of."""
    write(tmp_path, "cache.py", CACHE_HOLDS_MORE)
    args = ("--memory", str(1792 * MiB), "--allocators", "native")
    without, _ = dryrun(tmp_path, *args, "--no-snapshot", "cache.py", expect=0)
    assert without["native"]["device_peak_bytes"] == 1700 * MiB
    assert "native fits, with at least 92.00 MiB to spare" in report(without)
    checked, _ = dryrun(tmp_path, *args, "cache.py", expect=0)
    assert checked["native"]["need_bytes"] == 1104 * MiB and checked["native"]["need_checked"]
    assert "to spare" not in report(checked)


def test_unchecked_needs_say_so(tmp_path):
    write(tmp_path, "cache.py", CACHE_HOLDS_MORE)
    result, _ = dryrun(tmp_path, "--memory", "4GiB", "--allocators", "native", "--no-check-needs", "cache.py",
                       expect=0)
    run = result["native"]
    assert run["need_bytes"] == 1104 * MiB and not run.get("need_checked") and result["check_needs"] is False
    text = report(result)
    assert "native     ~1.08 GiB" in text
    assert ("A need is the smallest device a run fits on (the CUDA context included, to 16 MiB), as a replay of "
            "the run's own recorded allocations under its allocator's policy finds it, not checked by runs") in text


def test_a_sweeps_needs_are_those_of_the_value_each_was_measured_at(tmp_path):
    write(tmp_path, "s.py", """
        import os, torch
        x = torch.empty(int(os.environ["N"]) << 20, dtype=torch.uint8, device="cuda")
    """)
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native", "--sweep", "N=100,300,900",
                       "s.py", expect=0)
    run = result["native"]
    assert run["largest_value"] == 300 and run["measured_at"] == 300
    assert run["need_bytes"] == 704 * MiB and run["need_checked"]  # 400 + 300, rounded up to 16 MiB
    assert "Needs at N=300: native 704.00 MiB." in report(result)
