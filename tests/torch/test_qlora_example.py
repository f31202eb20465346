"""examples/train_qlora.py dry-run as its docstring says, without weights: a
Llama-2-7B's shapes in 4-bit NF4 through bitsandbytes, LoRA r=16 on every
linear layer, HF Trainer with fp16 and the paged 8-bit AdamW, on a phantom
T4. Its figures are the arithmetic's: the paged optimizer state is the
8-bit AdamW's two bytes per element of every LoRA matrix of at least 1e5
elements (bitsandbytes pages only those), in unified memory."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_dryrun import _env

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def test_the_qlora_example_fits_a_t4_with_its_paged_state_measured(tmp_path):
    for module in ("bitsandbytes", "peft", "transformers", "accelerate"):
        pytest.importorskip(module)
    cmd = [sys.executable, "-m", "vramguard", "dryrun", "--gpu", "T4", "--no-weights", "--json", "--quiet",
           "--no-snapshot", "--allocator", "vramguard", "--out", str(tmp_path / "out"),
           str(ROOT / "examples" / "train_qlora.py"), "--seq", "128", "--steps", "1", "--accumulation", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    run = result["vramguard"]
    assert run["fits"] is True and run["steps"] == 1
    # per layer, the MLP's three LoRA matrices with 11008 x 16 elements (gate's and up's B,
    # down's A) are paged; q, k, v and o's are 4096 x 16 = 65,536 elements, under 1e5
    assert run["managed_bytes"] == 32 * 3 * 11008 * 16 * 2
    log = Path(run["log"]).read_text()
    # NF4 weights and their double-quantized absmax, the fp16 embeddings, lm_head and norms
    assert "after loading: 3,687 MiB allocated" in log
    (load,) = run["weightless_loads"]
    assert load["tensors"] == 291
    text = __import__("vramguard.dryrun", fromlist=["format_report"]).format_report(result)
    assert "Paged optimizer state: 32.25 MiB of unified memory" in text
    assert "Weights not loaded (--no-weights)" in text
