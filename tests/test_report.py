"""The replay report sets every policy side by side: vramguard's arena and
segments, PyTorch's default and expandable segments. A policy this build
does not have is reported as such, with the reason, never as a crash."""
import json
import subprocess
import sys

import pytest

from vramguard import Trace, min_budget, replay, save_trace
from vramguard.report import replay_report as _report
from vramguard.report.replay_report import (
    COMPARED, available_policies, calls_per_thousand, check_policy, format_replay_report, replay_report,
    unavailable_policies,
)
from sample_traces import small_trace

MiB = 1 << 20
FIELDS = ("peak_reserved_bytes", "min_budget_bytes", "maps_at_min_budget", "unmaps_at_min_budget")


def test_the_four_policies_in_order():
    assert COMPARED == ("arena", "segments", "torch", "torch-expandable")
    assert {"segments", "torch"} <= set(available_policies())
    assert set(available_policies()) | set(unavailable_policies()) == set(COMPARED)


def test_report_keys_for_every_policy():
    r = replay_report(small_trace())
    assert r["policies"] == list(COMPARED) and r["allocations"] == 3
    for policy in COMPARED:
        prefix = policy.replace("-", "_")
        values = [r[f"{prefix}_{field}"] for field in FIELDS]
        if policy in r["policies_unavailable"]:
            assert values == [None] * 4
        else:
            assert all(type(v) is int for v in values)
    # The keys the report had before stay, with the same values.
    assert (r["vramguard_min_budget_bytes"], r["torch_min_budget_bytes"]) == (
        min_budget(small_trace()), min_budget(small_trace(), "torch"))
    assert json.loads(json.dumps(r)) == r


def test_exact_figures_of_the_segment_policies():
    r = replay_report(small_trace())
    # segments: 2 MiB small segment + 6 MiB packed for 3 MiB + 100 MiB;
    # torch: 2 + 20 + 100 MiB. At the minimum budget each makes 3 segments
    # and gives back 1: 4 calls for 3 allocations.
    assert (r["segments_peak_reserved_bytes"], r["segments_min_budget_bytes"]) == (108 * MiB, 106 * MiB)
    assert (r["torch_peak_reserved_bytes"], r["torch_min_budget_bytes"]) == (122 * MiB, 120 * MiB)
    assert (r["segments_maps_at_min_budget"], r["segments_unmaps_at_min_budget"]) == (3, 1)
    assert (r["torch_maps_at_min_budget"], r["torch_unmaps_at_min_budget"]) == (3, 1)
    assert calls_per_thousand(r, "torch") == pytest.approx(4000 / 3)
    text = format_replay_report(r)
    lines = text.splitlines()
    header = lines[2].split()
    assert header == list(COMPARED)
    row = {label: line.split()[-4:] for line in lines for label in ("minimum budget over the limit",)
           if line.startswith("  " + label)}
    cells = dict(zip(COMPARED, row["minimum budget over the limit"]))
    assert (cells["segments"], cells["torch"]) == ("+2.9%", "+16.5%")
    assert "    their cost at 20 us each" in text and "26.67 ms" in text


@pytest.mark.parametrize("policy", available_policies())
def test_each_available_policy_agrees_with_its_own_replay(policy):
    t = small_trace()
    r = replay_report(t, policy=policy)
    engine = check_policy(policy)
    assert r["min_budget_bytes"] == min_budget(t, engine) == r[f"{policy.replace('-', '_')}_min_budget_bytes"]
    assert r["peak_reserved_bytes"] == replay(t, None, engine).peak_reserved_bytes
    assert r["min_budget_bytes"] >= r["peak_requested_bytes"] == 103 * MiB


def test_a_policy_this_build_lacks_is_reported_clearly(monkeypatch):
    """A name the replay engine refuses (here one that no build has) gets a
    column of n/a and a line with the engine's reason; asked for by name,
    one ValueError that lists what is available."""
    monkeypatch.setattr(_report, "COMPARED", COMPARED + ("fastest",))
    monkeypatch.setattr(_report, "POLICIES", _report.POLICIES + ("fastest",))
    r = replay_report(small_trace())
    assert r["fastest_min_budget_bytes"] is None and r["fastest_maps_at_min_budget"] is None
    assert r["policies_unavailable"]["fastest"].startswith("unknown policy 'fastest'")
    text = format_replay_report(r)
    assert text.splitlines()[2].split()[-1] == "fastest"
    assert text.splitlines()[4].endswith("n/a")
    assert "  fastest: not available in this build (unknown policy 'fastest'" in text
    with pytest.raises(ValueError, match=r"policy 'fastest' is not available in this build of vramguard "
                                         r"\(unknown policy 'fastest'.*\); available: vramguard, .*segments"):
        replay_report(small_trace(), policy="fastest")
    with pytest.raises(ValueError, match="unknown policy 'slowest': use one of vramguard, arena, segments"):
        check_policy("slowest")


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "vramguard", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_json_carries_every_policy(tmp_path):
    save_trace(small_trace(), tmp_path / "t.vgtrace")
    proc = run_cli("replay", "t.vgtrace", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for policy in COMPARED:
        for field in FIELDS:
            assert f"{policy.replace('-', '_')}_{field}" in out
    assert out["segments_min_budget_bytes"] == 106 * MiB and out["torch_maps_at_min_budget"] == 3


@pytest.mark.parametrize("policy", sorted(unavailable_policies()) or [pytest.param(None, marks=pytest.mark.skip(
    reason="every policy is in this build"))])
def test_cli_asked_for_a_policy_this_build_lacks(tmp_path, policy):
    save_trace(small_trace(), tmp_path / "t.vgtrace")
    proc = run_cli("replay", "t.vgtrace", "--policy", policy, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"vramguard: policy '{policy}' is not available in this build of vramguard (")
    assert len(proc.stderr.splitlines()) == 1


def steady_loop(steps=3):
    t = Trace("loop")
    for _ in range(steps):
        a, b = t.alloc(4 * MiB), t.alloc(6 * MiB)
        t.free(a)
        t.free(b)
    return t


# (peak reserved, minimum budget, maps, unmaps) of three steps of a 4 + 6 MiB
# loop: every policy gets its memory in the first step and keeps it.
STEADY = {
    "arena": (10 * MiB, 10 * MiB, 2, 0),             # 2 and 3 pages of 2 MiB, one map per block
    "segments": (10 * MiB, 10 * MiB, 2, 0),          # a segment per block
    "torch": (20 * MiB, 20 * MiB, 1, 0),             # both in one 20 MiB segment
    "torch-expandable": (20 * MiB, 20 * MiB, 1, 0),  # both in one 20 MiB page
}


@pytest.mark.parametrize("policy", COMPARED)
def test_a_steady_loop_maps_in_its_first_step_only(policy):
    if policy not in available_policies():
        pytest.skip(f"{policy} is not in this build: {unavailable_policies()[policy]}")
    r = replay_report(steady_loop())
    prefix = policy.replace("-", "_")
    assert tuple(r[f"{prefix}_{field}"] for field in FIELDS) == STEADY[policy]
