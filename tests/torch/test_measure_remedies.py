"""last_oom().measure_remedies() in a Jupyter kernel on a phantom T4: after
an fp32 GPT runs out of memory, the session's own cells are dry-run with
the remedies in a CPU subprocess (the session's GPU untouched), the table
and the cheapest change are shown in the cell, and that change, applied by
hand in the next cell, fits, with the peak the table printed."""
import json
import textwrap

import pytest

from test_dryrun_remedies import GPT_CLASSES
from test_recover_kernel import run_cells

pytestmark = pytest.mark.torch

MiB = 1 << 20
CARD = 875 * MiB  # as test_dryrun_remedies: as written about 1 GiB, no single remedy enough

SETUP = """
import gc, json, torch, vramguard
import torch.nn as nn
import torch.nn.functional as F
vramguard.install()
"""

MODEL = textwrap.dedent(GPT_CLASSES) + """
B, S, D, L, V = 32, 256, 256, 4, 4096
model = GPT(V, D, L, S).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
"""

TRAIN = """
%time x = 1
for _ in range(2):
    idx = torch.randint(0, V, (B, S), device="cuda")
    F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""

MEASURE = """
allocations = torch.cuda.memory_stats()["allocation.all.allocated"]
r = vramguard.last_oom().measure_remedies()
rows = {row["name"]: row for row in r.remedies["rows"]}
cheapest = rows[r.remedies["cheapest"]]
print("@@" + json.dumps({"exit": r.exit_code, "skipped": r.skipped, "kinds": cheapest["remedies"],
                         "how": cheapest.get("how"), "peak": cheapest["peak_allocated_bytes"],
                         "fits": cheapest["fits"], "settings": r.remedies.get("settings"),
                         "session_allocations": torch.cuda.memory_stats()["allocation.all.allocated"] - allocations}))
"""

# The cheapest change, applied by hand: each remedy as the printed code says it.
APPLY = """
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
kinds, settings = cheapest["remedies"], r.remedies["settings"]
del opt
gc.collect()
if "checkpoint" in kinds:
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
if "optimizer" in kinds and settings["optimizer"] == "8bit":
    import bitsandbytes as bnb
    opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-3)
elif "optimizer" in kinds:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
else:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
dtype = getattr(torch, settings["autocast"])
torch.cuda.reset_peak_memory_stats()
for _ in range(2):
    idx = torch.randint(0, V, (B, S), device="cuda")
    with torch.autocast("cuda", dtype=dtype, enabled="autocast" in kinds):
        loss = F.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("@@" + json.dumps({"peak": torch.cuda.max_memory_allocated()}))
"""


def _marked(cell):
    (line,) = [l for l in cell["out"].splitlines() if l.startswith("@@")]
    return json.loads(line[2:])


def test_the_cheapest_change_measured_from_the_session_fits_when_applied(tmp_path):
    from vramguard.phantom.gpu import environ

    setup, model, train, measure, apply = run_cells(tmp_path, SETUP, MODEL, TRAIN, MEASURE, APPLY,
                                                    gpu_env=environ("T4", memory=CARD))
    assert train["errors"] == ["OutOfMemoryError"]
    # the report's last line offers the call, no placeholder
    shown = train["out"] + "".join(train["displays"])
    assert "Measure the remedies on this session's cells, without a GPU: vramguard.last_oom().measure_remedies()" \
        in shown and "NOTEBOOK.ipynb" not in shown
    assert measure["errors"] == [], measure
    out = measure["out"]
    assert out.startswith("vramguard: measuring the remedies on cells 1 to 3 of this session on a phantom T4 "
                          "with this card's 875.00 MiB, on the CPU (the GPU is not used); left out: cell 3: "
                          "%time x = 1:\n")
    assert "Remedies, each run on the unchanged program with the vramguard allocator:" in out
    measured = _marked(measure)
    assert measured["exit"] == 1                        # as written it does not fit
    assert measured["skipped"] == [[3, "%time x = 1"]]
    assert measured["fits"] is True and len(measured["kinds"]) > 1
    assert measured["session_allocations"] == 0           # the session's device was not used
    assert apply["errors"] == [], apply
    peak = _marked(apply)["peak"]
    assert peak <= CARD
    assert abs(peak - measured["peak"]) <= 0.02 * measured["peak"], (peak, measured["peak"])
