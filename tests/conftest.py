"""Where the real traces are: ../shared/traces beside the checkout, or
$VRAMGUARD_TRACES. Tests that need them skip, saying why, when absent."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(os.environ.get("VRAMGUARD_TRACES", ROOT.parent / "shared" / "traces"))
OWN_TRACES = ROOT / "tests" / "data"


def real_traces():
    """Every trace file we can find: the shared ones and the project's own."""
    found = []
    for folder in (SHARED_TRACES, OWN_TRACES):
        if folder.is_dir():
            found += sorted(p for p in folder.iterdir() if p.suffix in (".pickle", ".log", ".gz", ".vgtrace"))
    return found


@pytest.fixture
def shared_traces():
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"no real traces at {SHARED_TRACES} (set VRAMGUARD_TRACES)")
    return SHARED_TRACES
