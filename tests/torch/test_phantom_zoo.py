"""Real models on a phantom T4: the zoo (bench/zoo_models.py, at its small
size) run by `vramguard.dryrun` under PyTorch's allocator, expandable
segments and vramguard, two training steps each, and each allocator's
smallest device found by running again on smaller phantoms.

What must hold for every model: the three allocators hold the same tensors
(peak allocated equal, but for the native allocator's unsplit remainders),
and vramguard's smallest device is not above the other two's. And a model
using more than 12 GiB of the device costs the host less than 1 GiB beyond
the program's own memory."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
ZOO_RUN = ROOT / "bench" / "zoo_run.py"
MiB, GiB = 1 << 20, 1 << 30


def _needs(model):
    if model in ("resnet18", "vit_b_16"):
        pytest.importorskip("torchvision", reason="the vision models need torchvision")
    if model.startswith("gpt2"):
        pytest.importorskip("transformers", reason="GPT-2 needs transformers")


# GPT-2 is not among them: the reduced zoo of `make test` (make check-zoo,
# bench/zoo.py --check) runs it at this size on a T4 under each allocator and
# holds it to the same goal, vramguard's smallest device not above the others'.
@pytest.mark.parametrize("model", ["mlp", "resnet18", "vit_b_16"])
def test_zoo_model_on_a_phantom_t4(model, tmp_path):
    _needs(model)
    from vramguard import dryrun

    result = dryrun(str(ZOO_RUN), model, "--allocator", "given", "--size", "small", "--steps", "2",
                    gpu="T4", min_memory=True, echo=False, out=str(tmp_path))
    runs = {name: result[name] for name in ("native", "expandable", "vramguard")}
    for name, run in runs.items():
        assert run["fits"], (name, run.get("error"), run.get("first_oom"))
    allocated = {name: run["peak_allocated_bytes"] for name, run in runs.items()}
    # Expandable segments and vramguard split every block exactly: the same
    # bytes. PyTorch's native allocator leaves a large block whole when less
    # than 1 MiB would remain, and counts it whole.
    assert allocated["vramguard"] == allocated["expandable"]
    extra = allocated["native"] - allocated["vramguard"]
    assert 0 <= extra <= max(16 * MiB, allocated["vramguard"] // 50), allocated
    smallest = {name: run["min_memory_bytes"] for name, run in runs.items()}
    assert all(smallest.values()), smallest
    assert smallest["vramguard"] <= min(smallest["native"], smallest["expandable"]), smallest
    # every device is a whole number of the search's steps, above what the tensors need
    context = result["vramguard"]["context_bytes"]
    for name, size in smallest.items():
        assert size % (16 * MiB) == 0
        assert size >= context + allocated[name]


# PyTorch's teardown aborts now and then while autograd's device threads
# finish (bench/zoo_run.py says why that file cannot skip it); a run whose
# figures were written before it stands, as in bench/zoo.py.
TEARDOWN_ABORT = "terminate called without an active exception"


def test_more_than_12_gib_on_the_device_costs_the_host_under_1_gib(tmp_path):
    """GPT-2 small, batch 8 x 1024, bf16 autocast, AdamW, on a phantom
    A100-40GB: its tensors take more than 12 GiB of the device and the
    process's resident memory grows by less than 1 GiB from before the
    model existed (interpreter, torch and the CUDA libraries loaded)."""
    pytest.importorskip("transformers", reason="GPT-2 needs transformers")
    from vramguard.phantom import gpu as _phantom

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VRAMGUARD_", "VG_FAKECUDA_")) and k != "PYTORCH_CUDA_ALLOC_CONF"}
    env.update(_phantom.environ("A100-40GB"))
    figures = tmp_path / "gpt2.json"
    proc = subprocess.run([sys.executable, str(ZOO_RUN), "gpt2", "--allocator", "native", "--steps", "2",
                           "--json", str(figures)], env=env, capture_output=True, text=True, timeout=600)
    teardown = proc.returncode == -6 and proc.stderr.rstrip().endswith(TEARDOWN_ABORT)
    assert proc.returncode == 0 or teardown, proc.stderr[-3000:]
    assert figures.is_file(), proc.stderr[-3000:]
    r = json.loads(figures.read_text())
    assert r["fits"] and r["device"] == "NVIDIA A100-SXM4-40GB"
    assert r["peak_allocated_bytes"] > 12 * GiB
    assert r["host_peak_rss_bytes"] - r["host_rss_start_bytes"] < 1 * GiB, r
