"""Where the real traces are: ../shared/traces beside the checkout (or
$VRAMGUARD_TRACES), and the project's own recordings in tests/data."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(os.environ.get("VRAMGUARD_TRACES", ROOT.parent / "shared" / "traces"))
OWN_TRACES = ROOT / "tests" / "data"
SUFFIXES = (".pickle", ".log", ".gz", ".vgtrace")


def real_traces():
    """Every trace file found: the shared ones and the project's own."""
    found = []
    for folder in (SHARED_TRACES, OWN_TRACES):
        if folder.is_dir():
            found += sorted(p for p in folder.iterdir() if p.name.endswith(SUFFIXES))
    return found
