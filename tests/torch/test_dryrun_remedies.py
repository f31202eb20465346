"""dryrun --remedies on real programs: each remedy applied from outside to
the unchanged script (its file is not touched), measured under vramguard's
allocator, its work counted; the combination chosen fits; a Hugging Face
model through Trainer takes its own checkpointing path, a plain module the
wrapper on its repeated blocks, a model with none says so; a script that
fails or never uses the GPU gets one line and no remedy runs."""
import hashlib
import io
import subprocess
import textwrap

import pytest

from test_dryrun import MiB, _env, dryrun, report, write

pytestmark = pytest.mark.torch

# A GPT of a few blocks: its classes, shared with the notebook test of the
# remedies measured from a session (test_measure_remedies.py).
GPT_CLASSES = """
    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self, vocab, d, layers, seq):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
            self.head = nn.Linear(d, vocab)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.head(x)
"""

# Its training: two fp32 steps of AdamW (foreach) at the batch argv[1] names.
GPT_TRAINING = """
    B, S, D, L, V = int(sys.argv[1]), 256, 256, 4, 4096
    model = GPT(V, D, L, S).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # fp32, foreach
    for _ in range(2):
        idx = torch.randint(0, V, (B, S), device="cuda")
        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
"""

GPT = """
    import sys, torch
    import torch.nn as nn
    import torch.nn.functional as F
""" + GPT_CLASSES + GPT_TRAINING


def _hash(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rows(result):
    return {r["name"]: r for r in result["remedies"]["rows"]}


def _a_combination_that_fits(result, block_module):
    """The GPT at 875 MiB (475 for tensors): as written a step needs about
    1 GiB; no single remedy is enough, checkpointing with autocast is."""
    rows = _rows(result)
    written, amp, ckpt, opt8 = (rows[n] for n in ("as written", "autocast fp16", "checkpointing", "8-bit AdamW"))
    assert written["fits"] is False and written["peaks_on_larger_phantom"] == 8 * 875 * MiB
    # each single measured, whole (on the larger phantom where the card ran out)
    assert all(r["applied"] and r["peak_allocated_bytes"] for r in (amp, ckpt, opt8))
    assert amp["peak_allocated_bytes"] < written["peak_allocated_bytes"]  # half the activations
    assert ckpt["peak_allocated_bytes"] < amp["peak_allocated_bytes"]  # only the blocks' inputs kept
    assert ckpt["how"]["checkpoint"] == {"applied": True, "model": "GPT", "how": "wrapper", "blocks": 4,
                                         "block_class": "Block",
                                         "block_sites": [{"module": block_module, "name": "Block"}]}
    assert opt8["how"]["optimizer"]["to"] == "bitsandbytes.optim.AdamW8bit"
    # 8-bit states: 2 x (4 - 1) bytes less per parameter
    params = 2 * 4096 * 256 + 4096 + 256 * 256 + 4 * (12 * 256 * 256 + 13 * 256)
    saved = written["peak_allocated_bytes"] - opt8["peak_allocated_bytes"]
    assert 5 * params <= saved <= 6 * params + 8 * MiB
    assert not any(r["fits"] for r in (amp, ckpt, opt8))
    combos = [r for r in result["remedies"]["rows"] if len(r["remedies"]) > 1]
    assert combos and combos[-1]["fits"] is True
    assert combos[0]["remedies"][:2] == ["checkpoint", "autocast"]  # the most saving first
    assert result["remedies"]["cheapest"] == combos[-1]["name"]
    lines = report(result).splitlines()
    assert lines[lines.index(result["remedies"]["sentence"]) + 1] == (
        "    import vramguard; vramguard.install()  # before the first CUDA call")
    assert "    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))" in lines


def test_work_counts_are_exact_and_checkpointing_costs_what_theory_says(tmp_path):
    write(tmp_path, "gpt.py", GPT)
    result, _ = dryrun(tmp_path, "--allocator", "vramguard", "--no-snapshot", "--memory", "4GiB",
                       "--remedies", "gpt.py", "8", expect=0)
    work = result["vramguard"]["work"]
    tokens, d, vocab = 8 * 256, 256, 4096
    forward = 4 * 2 * tokens * 12 * d * d + 2 * tokens * d * vocab  # the blocks' Linears and the head
    # a step: the forward's GEMMs, and twice them in the backward (inputs' and weights' gradients); two steps
    assert work["gemm_flops"] == 2 * 3 * forward
    assert work["operator_gemm_flops"] == work["gemm_flops"]  # the two counts agree on eager code
    attention = work["operator_other_flops"] // 2
    assert work["step_flops"] == 3 * forward + attention
    ratio = _rows(result)["checkpointing"]["work_ratio"]
    # the blocks' forward again (PyTorch stops recomputing once the last saved tensor is back): at most
    # a third more than a step's GEMMs
    assert 1.1 < ratio <= round(1 + (4 * 2 * tokens * 12 * d * d + attention) / work["step_flops"], 3)
    assert _rows(result)["autocast fp16"]["work_ratio"] == 1.0
    assert result["remedies"]["sentence"].startswith("As written it fits with the vramguard allocator")


MLP = """
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 8)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(4, 4096, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
"""


@pytest.mark.torch_version
def test_fused_adamw_frees_the_foreach_temporaries_and_a_model_without_blocks_says_so(tmp_path, monkeypatch):
    """Without bitsandbytes the optimizer remedy is PyTorch's fused AdamW:
    the foreach step's temporary (a copy of every parameter) is gone."""
    import vramguard
    from vramguard.dryrun.features import remedies

    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(remedies, "settings", lambda preset: {"autocast": "float16", "optimizer": "fused"})
    write(tmp_path, "mlp.py", MLP)
    err = io.StringIO()
    result = vramguard.dryrun(str(tmp_path / "mlp.py"), gpu="T4", allocators="native,vramguard", memory="2GiB",
                              out=str(tmp_path / "out"), stdout=io.StringIO(), stderr=err, snapshot=False,
                              remedies=True)
    rows = _rows(result)
    params = (4096 * 4096 + 4096 + 4096 * 8 + 8) * 4
    fused = rows["fused AdamW"]
    assert fused["how"]["optimizer"] == {"applied": True, "to": "torch.optim.AdamW(fused=True)", "from": "AdamW"}
    # as written the step holds weights, gradients, two states and the foreach temporary: 5 x the
    # parameters; fused, 4 x. cuBLAS's workspaces (8 MiB per thread's handle) come on top where
    # PyTorch's allocator holds them: in allocated on torch 2.10 (about 17 MiB, both), and in
    # fused's backward peak on 2.15 (8 MiB): the temporary freed is a copy of the parameters less that
    written = rows["as written"]["peak_allocated_bytes"]
    assert 5 * params <= written <= 5 * params + 18 * MiB
    assert 4 * params <= fused["peak_allocated_bytes"] <= 4 * params + 18 * MiB
    assert params - 9 * MiB <= written - fused["peak_allocated_bytes"] <= params
    assert rows["checkpointing"]["applied"] is False
    assert rows["checkpointing"]["why_not"]["checkpoint"].startswith("no repeated blocks in Sequential")
    text = str(result)
    assert "checkpointing: not applied: no repeated blocks in Sequential (a ModuleList or Sequential" in text
    html = result._repr_html_()
    assert "<pre>Remedies, each run on the unchanged program with the vramguard allocator:" in html
    assert "fused AdamW" in html
    assert result["remedies"]["sentence"] == ("As written it fits with PyTorch's default allocator: nothing needs "
                                              "changing; the rows say what each remedy would free.")


TRAINER = """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    config = LlamaConfig(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    rows = [{"input_ids": torch.arange(128), "labels": torch.arange(128)} for _ in range(8)]
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, max_steps=2, report_to="none",
                             save_strategy="no")
    Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=rows).train()
"""


def test_a_huggingface_model_through_trainer_takes_its_own_checkpointing(tmp_path):
    write(tmp_path, "train.py", TRAINER)
    result, _ = dryrun(tmp_path, "--allocator", "vramguard", "--no-snapshot", "--memory", "1GiB",
                       "--remedies", "train.py", expect=0)
    program = result["remedies"]["program"]
    assert program["trainer"] is True and program["huggingface"] is True
    ckpt = _rows(result)["checkpointing"]
    assert ckpt["applied"] is True and ckpt["how"]["checkpoint"]["how"] == "huggingface"
    assert ckpt["how"]["checkpoint"]["model"] == "LlamaForCausalLM"
    assert ckpt["peak_allocated_bytes"] < _rows(result)["as written"]["peak_allocated_bytes"]
    assert ckpt["work_ratio"] > 1.0
    from vramguard.dryrun.features.remedies import code_for

    assert code_for(ckpt, result["remedies"]) == [
        "import vramguard; vramguard.install()  # before the first CUDA call",
        "TrainingArguments(..., gradient_checkpointing=True)"]


@pytest.mark.parametrize("code, status, why", [
    ("import torch\nx = torch.empty(1 << 20, device='cuda')\nraise SystemExit('broken')\n", 3,
     "Remedies: not measured: the script failed before its end as written (below): a remedy's run would fail "
     "there too."),
    ("print('no GPU here')\n", 4,
     "Remedies: not measured: the program never used the GPU: there is no memory for a remedy to free.")])
def test_nothing_to_measure_is_one_line_and_no_remedy_runs(tmp_path, code, status, why):
    write(tmp_path, "s.py", code)
    result, err = dryrun(tmp_path, "--allocator", "vramguard", "--no-snapshot", "--remedies", "s.py", expect=status)
    assert report(result).splitlines().count(why) == 1
    assert "autocast" not in err and result["remedies"]["rows"] == []
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "s.py")], capture_output=True, text=True)
    assert left.stdout == ""


COMPILED = """
    import torch
    import torch.nn as nn
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).cuda()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        compiled(torch.randn(64, 512, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
"""


def test_a_compiled_program_compiles_as_written_and_its_gemms_are_counted(tmp_path):
    """The remedies' hooks stay out of Dynamo's graphs (a global forward hook
    is traced into them), and the operator count leaves before compiled code
    runs: the cuBLAS count is the compiled program's, exactly."""
    write(tmp_path, "compiled.py", COMPILED)
    result, _ = dryrun(tmp_path, "--allocator", "vramguard", "--no-snapshot", "--remedies", "compiled.py", expect=0)
    work = result["vramguard"]["work"]
    assert work["operator_count_stopped_at_compile"] is True and work["operator_gemm_flops"] == 0
    forward = 2 * (2 * 64 * 512 * 2048)
    # the backward's: both weights' gradients and the hidden layer's input gradient (the input needs none)
    assert work["step_flops"] == forward + 2 * forward - forward // 2
    rows = _rows(result)
    assert all(rows[n]["fits"] for n in ("as written", "autocast fp16", "8-bit AdamW"))
    assert rows["checkpointing"]["why_not"]["checkpoint"].startswith("no repeated blocks in Sequential")
    assert "attention and convolutions inside compiled code" in report(result)


# The GPT, its forward and loss under the program's own autocast region, in
# the dtype its config names (argv[2]): "float32" is a config switch many
# training scripts have, and no mixed precision.
GPT_AUTOCAST = GPT.replace(
    "        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()",
    "        with torch.autocast('cuda', dtype=getattr(torch, sys.argv[2])):\n"
    "            loss = F.cross_entropy(model(idx).flatten(0, 1), idx.flatten())\n"
    "        loss.backward()")


def test_an_autocast_region_in_float32_is_no_mixed_precision_and_its_remedy_is_measured(tmp_path):
    """The autocast row is measured, not skipped: the program's own region
    runs in float16 there, named by its line; and the program changed as
    the row says (its region's dtype float16) peaks where the row does."""
    write(tmp_path, "gpt.py", GPT_AUTOCAST)
    result, _ = dryrun(tmp_path, "--allocator", "vramguard", "--no-snapshot", "--memory", "4GiB",
                       "--remedies", "gpt.py", "8", "float32", expect=0)
    rows = _rows(result)
    written, amp = rows["as written"], rows["autocast fp16"]
    assert amp["applied"] and not amp.get("skipped")
    assert result["remedies"]["program"]["full_width_autocast"] == {"line": "gpt.py:36", "made_at": "gpt.py:36",
                                                                    "dtype": "float32", "regions": 2}
    assert amp["peak_allocated_bytes"] < written["peak_allocated_bytes"]
    text = report(result)
    assert ("autocast fp16: the program's own autocast region at gpt.py:36 runs in float32, which is no mixed "
            "precision: this row ran it in float16.") in text
    changed, _ = dryrun(tmp_path, "--allocator", "vramguard", "--no-snapshot", "--memory", "4GiB", "gpt.py", "8",
                        "float16", expect=0)
    assert changed["vramguard"]["peak_allocated_bytes"] == amp["peak_allocated_bytes"]


def test_an_autocast_region_in_float16_keeps_the_remedy_skipped(tmp_path):
    write(tmp_path, "gpt.py", GPT_AUTOCAST)
    result, _ = dryrun(tmp_path, "--allocator", "vramguard", "--no-snapshot", "--memory", "4GiB",
                       "--remedies", "gpt.py", "8", "float16", expect=0)
    amp = _rows(result)["autocast fp16"]
    assert amp["skipped"] and amp["why_not"] == {
        "autocast": "the program already runs under autocast, and its own regions keep their dtype"}
    assert result["remedies"]["program"]["full_width_autocast"] is None


MODEL_FILE = """
    import torch
    import torch.nn as nn
""" + GPT_CLASSES

TRAIN_FILE = """
    import sys, torch
    import torch.nn.functional as F
    from model import GPT
""" + GPT_TRAINING


def test_a_gpt_that_does_not_fit_gets_a_combination_whose_patch_runs_as_printed(tmp_path):
    """The GPT, its classes in a module of their own (the script imports
    only GPT), on a card where no single remedy is enough: a combination
    fits (_a_combination_that_fits), and the cheapest change is written as a
    patch of the script, run on a copy, printed with that run's peaks;
    applied with patch -p1 to a clean copy of the folder, the program fits
    as printed, and within 1% of the row's peak. (One dry run for both: the
    search is the same, and costs ten runs.)"""
    import shutil

    folder = tmp_path / "project"
    folder.mkdir()
    write(folder, "model.py", MODEL_FILE)
    write(folder, "gpt.py", TRAIN_FILE)
    before = {name: _hash(folder / name) for name in ("model.py", "gpt.py")}
    result, _ = dryrun(folder, "--allocator", "vramguard", "--no-snapshot", "--memory", "875MiB", "--remedies",
                       "gpt.py", "32", expect=1)
    assert {name: _hash(folder / name) for name in before} == before
    _a_combination_that_fits(result, "model")
    plan = result["remedies"]
    patch = plan["patch"]
    assert patch["written"] and patch["fits"] is True and patch["file"] == "gpt.py"
    assert "+from model import Block\n" in patch["diff"]
    assert sorted(p.name for p in folder.iterdir()) == ["gpt.py", "model.py", "out"]  # the copy is gone
    text = report(result)
    assert f"In {folder}: patch -p1 < {patch['path']}" in text
    row = _rows(result)[plan["cheapest"]]
    clean = tmp_path / "clean"
    clean.mkdir()
    for name in ("model.py", "gpt.py"):
        shutil.copy(folder / name, clean / name)
    applied = subprocess.run(["patch", "-p1", "-i", patch["path"]], cwd=clean, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    run, _ = dryrun(clean, "--allocator", "native", "--no-snapshot", "--memory", "875MiB", "gpt.py", "32", expect=0)
    peak = run["native"]["peak_reserved_bytes"]
    assert peak == patch["peak_reserved_bytes"]
    assert abs(peak - row["peak_reserved_bytes"]) <= 0.01 * row["peak_reserved_bytes"], (peak, row)


def _notebook_of(cells):
    import json

    return json.dumps({"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                                  "source": textwrap.dedent(c).lstrip("\n").splitlines(True)} for c in cells],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1, sort_keys=True,
                      ensure_ascii=False) + "\n"


def test_a_notebooks_cheapest_change_is_a_patch_of_its_cells_that_was_run(tmp_path):
    """The same GPT as a notebook: a shell line's cell, the imports and
    classes, then the training under %%time. The change is written as a
    patch of the notebook's cells, run on a copy; patch -p1 applies it to a
    clean copy, whose own dry run fits with the printed peak."""
    import shutil

    folder = tmp_path / "project"
    folder.mkdir()
    cells = ["!echo setting up", "import sys, torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
             + textwrap.dedent(GPT_CLASSES),
             "%%time\n" + textwrap.dedent(GPT_TRAINING).replace("int(sys.argv[1])", "32")]
    (folder / "nb.ipynb").write_text(_notebook_of(cells))
    # 960 MiB, 560 for tensors: checkpointing alone fits (522 MiB reserved), so no combination is searched
    result, _ = dryrun(folder, "--allocator", "vramguard", "--no-snapshot", "--memory", "960MiB", "--remedies",
                       "nb.ipynb", expect=1)
    assert result["remedies"]["cheapest"] == "checkpointing"
    patch = result["remedies"]["patch"]
    assert patch["written"] and patch["fits"] is True and patch["file"] == "nb.ipynb", patch
    assert sorted(p.name for p in folder.iterdir()) == ["nb.ipynb", "out"]  # the copy is gone
    clean = tmp_path / "clean"
    clean.mkdir()
    shutil.copy(folder / "nb.ipynb", clean / "nb.ipynb")
    applied = subprocess.run(["patch", "-p1", "-i", patch["path"]], cwd=clean, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    run, _ = dryrun(clean, "--allocator", "native", "--no-snapshot", "--memory", "960MiB", "nb.ipynb", expect=0)
    assert run["native"]["peak_reserved_bytes"] == patch["peak_reserved_bytes"]
