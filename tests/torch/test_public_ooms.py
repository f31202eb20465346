"""Public out-of-memory reports rebuilt on the phantom (bench/public_ooms/run.py):
a few of the table's rows (docs/benchmarks.md), each dry-run again and held to
what the table measured: the failing request equal to the report's at its printed
precision (or differing, where the table says it differs), and allocated at the
failure within 0.5% of the table's signed error. A report missing from
reports.toml, or a rebuild whose library of the day is not under build/ (make
bench-public-ooms fetches them), is skipped."""
import os
import sys
from pathlib import Path

import pytest

from hookrun import SHARED_CACHE

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "public_ooms"))
import run as public_ooms  # noqa: E402

#: id: (request equal, allocated error as the table measured it). Rows whose
#: rebuild needs nothing fetched (no library of the day under build/), so that
#: CI, which reaches only the package index, runs every one.
CASES = {
    "llama-48-v100-16gb-llama1-13b-mp2-example-load-bs32-seq1024": (True, 0.0),
    "llama-455-rtx3060-llama2-7b-text-completion-load": (False, 0.0073),
    "stablelm-39-g4dn-t4-tuned-alpha-7b-readme-half-cuda-load": (True, -0.0174),
    "stanford-alpaca-189-a100-80g-llama7b-fsdp-bf16": (True, -0.0028),
    "llama2-4bit-python-coder-1-colab-t4-qlora-llama2-7b-seq2048-bs4": (True, -0.1828),
}
TOLERANCE = 0.005


def _by_id(path, key):
    return {r["id"]: r for r in public_ooms.load(path, key)}


@pytest.mark.parametrize("report_id", list(CASES))
def test_a_public_report_rebuilt(report_id, tmp_path, monkeypatch):
    reports = _by_id(os.environ.get("PUBLIC_OOMS_REPORTS", public_ooms.HERE / "reports.toml"), "report")
    rebuild = _by_id(public_ooms.HERE / "rebuilds.toml", "rebuild")[report_id]
    if report_id not in reports:
        pytest.skip(f"{report_id} is not in reports.toml")
    missing = [p for p in rebuild.get("pythonpath", []) + [a for a in rebuild.get("args", [])
                                                           if a.startswith("build/")] if not (ROOT / p).exists()]
    if missing:
        pytest.skip(f"not fetched: {', '.join(missing)} (bench/public_ooms/deps.sh)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(SHARED_CACHE))
    row = public_ooms.run_rebuild(rebuild, reports[report_id], tmp_path, timeout=170)
    assert row["phantom"], row.get("phantom_error")
    equal, error = CASES[report_id]
    assert row["request_equal"] is equal, (row["real"], row["phantom"])
    assert abs(row["allocated_error"] - error) <= TOLERANCE, (row["real"], row["phantom"])
