"""The zoo past one GPU, CI's reduced run: the zoo's decoder at its small
size trained with DDP and with FSDP2 on 2 phantom ranks, under expandable
segments and vramguard (bench/zoo_ranks.py --check: every rank fits and
ends cleanly, FSDP holds 1/2 of the parameters and of AdamW's state per
rank, DDP all of them, vramguard's peak allocated is expandable segments'),
and the table it writes. PyTorch's default allocator is left to make
bench-zoo's run (its check: within 3% of vramguard's), as each allocator
is two torchrun ranks more."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]


def test_ddp_and_fsdp_on_two_phantom_ranks(tmp_path):
    pytest.importorskip("transformers")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "zoo_ranks.py"), "--out", str(tmp_path),
                           "--size", "small", "--nproc", "2", "--allocators", "expandable,vramguard", "--check"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "ranks.json").read_text())["rows"]
    assert [(r["mode"], r["nproc"]) for r in rows] == [("ddp", 2), ("fsdp", 2)]
    ddp, fsdp = ({a: run["program"] for a, run in r["runs"].items()} for r in rows)
    whole = ddp["vramguard"][0]["param_bytes"]
    assert all(p["shard_bytes"] == whole for p in ddp["vramguard"])
    assert [p["shard_bytes"] for p in fsdp["vramguard"]] == [whole // 2] * 2
    # AdamW's two moments per parameter this rank holds
    assert [p["optimizer_state_bytes"] for p in fsdp["expandable"]] == [whole] * 2
    assert all(set(r["runs"]) == {"expandable", "vramguard"} for r in rows)
    text = (tmp_path / "ranks.md").read_text()
    assert "| FSDP | 2 | vramguard |" in text and "| DDP | 2 | expandable |" in text
