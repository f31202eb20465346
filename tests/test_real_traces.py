"""On real traces recorded by others: the torch policy must reproduce the
native allocator's recorded peak, and vramguard's policy must need at most
2% (or 2 MiB) over the physical limit, and never more than the torch policy."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trace_paths import SHARED_TRACES, real_traces
from vramguard import load_trace, min_budget, replay

MiB = 1 << 20
TRACES = real_traces()
pytestmark = pytest.mark.skipif(not TRACES, reason=f"no real traces at {SHARED_TRACES} or tests/data")


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.name)
def trace(request):
    return load_trace(request.param)


def test_torch_policy_reproduces_the_recorded_peak(trace):
    recorded = trace.recorded_peak_reserved
    if recorded is None:
        pytest.skip(f"{trace.name} records no native segment events")
    emulated = replay(trace, policy="torch").peak_reserved_bytes
    assert abs(emulated - recorded) <= 0.02 * recorded, (emulated, recorded)


def test_vramguard_needs_at_most_2_percent_over_the_physical_limit(trace):
    live = trace.peak_live()
    ours = min_budget(trace, "vramguard")
    theirs = min_budget(trace, "torch")
    assert ours <= max(live * 1.02, live + 2 * MiB), (ours, live)
    assert ours <= theirs, (ours, theirs)


def test_min_budget_is_tight(trace):
    """The budget found fits, and one granule less does not."""
    best = min_budget(trace, "vramguard")
    assert replay(trace, best, samples=0).fits
    assert not replay(trace, best - 2 * MiB, samples=0).fits
