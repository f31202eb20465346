"""The cell meter in a real IPython kernel (nbclient) on a phantom T4, with
the real PyTorch: its bookkeeping shows nowhere a user reads, and the peaks
PyTorch reports are the session's while the meter keeps each cell's."""
import re
from pathlib import Path

import pytest

from test_recover_kernel import run_cells

pytestmark = pytest.mark.torch

DOCS = Path(__file__).resolve().parents[2] / "docs" / "notebook.md"

SETUP = """
import torch, vramguard
GiB = 1 << 30
vramguard.install(budget="T4")
vramguard.meter()
"""


def _t4():
    from vramguard.phantom.gpu import environ

    return environ("T4")


def test_the_meters_probe_shows_nowhere(tmp_path):
    """meter() twice, then a region, an OOM inside another region, the
    summary: the meter's own probe is in none of them, and one probe is open,
    not two; meter(False) leaves none."""
    setup, region, table, oom, summary, probes, off = run_cells(
        tmp_path, SETUP + "vramguard.meter()",
        'with vramguard.track("forward"):\n    x = torch.empty(GiB, dtype=torch.uint8, device="cuda")',
        "print(vramguard.regions())",
        'with vramguard.track("train"):\n    y = torch.empty(20 * GiB, dtype=torch.uint8, device="cuda")',
        "print(vramguard.summary())",
        "from vramguard.report import tracked_heaps\nprint('open=%d' % len(tracked_heaps.tracked_heap(0).open))",
        "vramguard.meter(False)\nprint('open=%d' % len(tracked_heaps.tracked_heap(0).open))",
        gpu_env=_t4())
    assert setup["errors"] == [] and region["errors"] == []
    text = table["out"].splitlines()
    assert text[:3] == ["Region   Calls      Peak  Live at exit  Allocated",
                        "-------  -----  --------  ------------  ---------",
                        "forward      1  1.00 GiB      1.00 GiB   1.00 GiB"]
    assert len(text) == 4 and text[3].startswith("this cell: ")  # no "Open now: <probe>" line
    assert oom["errors"] == ["OutOfMemoryError"]
    report = "".join(oom["displays"]) + oom["out"]
    assert "by region, train: +0 bytes since it began" in report
    assert "<probe>" not in report and "probe" not in report.lower()
    assert "<probe>" not in summary["out"]
    assert probes["out"].splitlines()[0] == "open=1"  # the meter's, once
    assert off["out"] == "open=0\n"


def _documented_cells():
    """The docs' example of the meter and the peaks: [(code, expected output)]."""
    text = DOCS.read_text()
    block = re.search(r"<!-- the meter and the peaks: tests/torch/test_meter_kernel.py -->\n```python\n(.*?)```",
                      text, re.S)
    assert block, "docs/notebook.md has no example of the meter and the peaks"
    cells = []
    for line in block.group(1).splitlines():
        if line.startswith("# "):
            cells[-1][1].append(line[2:])
        else:
            cells.append((line, []))
    return cells


def test_the_peaks_are_the_sessions_and_the_meters_are_the_cells(tmp_path):
    """As docs/notebook.md says, with its example run: a 1 GiB tensor made
    and freed in one cell, the next cell reads max_memory_allocated() 1 GiB
    (the meter resets nothing) while the meter's peak of that cell is its
    own."""
    cells = _documented_cells()
    assert len(cells) == 2
    outputs = run_cells(tmp_path, SETUP, *[code for code, _ in cells], gpu_env=_t4())
    assert [o["errors"] for o in outputs] == [[], [], []]
    assert [o["out"].splitlines() for o in outputs[1:]] == [expected for _, expected in cells]
