"""The cheapest change written as a patch of the user's script
(python/vramguard/dryrun/features/remedy_patch.py), from what the
program's own run recorded: each edit at its place, the diff one that
`patch -p1` applies, and one line saying why where none can be written.
(The patch applied to a copy and run, in the torch tier:
tests/torch/test_dryrun_remedies.py.)"""
import ast
import shutil
import subprocess
import textwrap

import pytest

from vramguard.dryrun.features.remedy_patch import NoPatch, patch_for

TRAIN = '''\
"""Trains a GPT."""
from __future__ import annotations

import sys
import torch
from model import GPT


def main():
    model = GPT().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    for step in range(10):
        with torch.autocast("cuda", dtype=torch.float32):
            loss = model(torch.zeros(4, device="cuda")).sum()
        loss.backward()
        opt.step()


main()
'''


def _program(tmp_path, **extra):
    script = str(tmp_path / "train.py")
    program = {"models": ["GPT"], "model_sites": [{"file": script, "line": 14, "name": "model"}],
               "optimizer_site": {"file": script, "line": 11, "class": "AdamW"}, "trainer": False}
    program.update(extra)
    return program


def _patch(tmp_path, remedies, allocator="vramguard", settings=None, accumulation=None, source=TRAIN, **program):
    (tmp_path / "train.py").write_text(source)
    row = {"remedies": remedies, "allocator": allocator, "accumulation": accumulation,
           "how": {"checkpoint": {"how": "wrapper", "block_sites": [{"module": "model", "name": "Block"}]}}}
    plan = {"program": _program(tmp_path, **program),
            "settings": settings or {"autocast": "float16", "optimizer": "fused"}}
    patched, diff, rel = patch_for(row, plan, str(tmp_path / "train.py"), str(tmp_path))
    ast.parse(patched)  # the patched script is Python
    return patched, diff, rel


def test_checkpointing_goes_before_the_loop_with_its_block_class_imported(tmp_path):
    patched, diff, rel = _patch(tmp_path, ["checkpoint"])
    assert rel == "train.py"
    assert textwrap.dedent("""\
        def main():
            model = GPT().cuda()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
            from model import Block
            apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
            for step in range(10):
        """) in patched
    assert patched.splitlines()[3] == "import vramguard; vramguard.install()  # before the first CUDA call"
    assert diff.startswith("--- a/train.py\n+++ b/train.py\n")


def test_the_fused_optimizer_is_a_keyword_at_the_line_that_builds_it(tmp_path):
    patched, _, _ = _patch(tmp_path, ["optimizer"], allocator="native")
    assert "    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False, fused=True)\n" in patched
    assert "vramguard" not in patched


def test_the_8bit_optimizer_replaces_the_class_and_drops_what_it_does_not_take(tmp_path):
    patched, _, _ = _patch(tmp_path, ["optimizer"], allocator="native",
                           settings={"autocast": "float16", "optimizer": "8bit"})
    assert "    opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-3)\n" in patched
    assert "import bitsandbytes as bnb\n" in patched


def test_autocast_in_the_programs_float32_region_is_that_regions_dtype(tmp_path):
    patched, _, _ = _patch(tmp_path, ["autocast"], allocator="native",
                           full_width_autocast={"line": "train.py:13", "dtype": "float32", "regions": 10})
    assert '        with torch.autocast("cuda", dtype=torch.float16):\n' in patched


def test_autocast_everywhere_goes_after_the_imports(tmp_path):
    patched, _, _ = _patch(tmp_path, ["autocast"], allocator="native",
                           source=TRAIN.replace('torch.autocast("cuda", dtype=torch.float32)', "open('/dev/null')"))
    lines = patched.splitlines()
    assert lines[lines.index("from model import GPT") + 1] == (
        'torch.set_autocast_enabled("cuda", True); torch.set_autocast_dtype("cuda", torch.float16); '
        "torch.set_autocast_cache_enabled(False)  # the program's CUDA work under autocast")


def test_every_remedy_at_once_and_patch_applies_it(tmp_path):
    patched, diff, _ = _patch(tmp_path, ["checkpoint", "autocast", "optimizer"],
                              full_width_autocast={"line": "train.py:13", "dtype": "float32", "regions": 10})
    if shutil.which("patch") is None:
        pytest.skip("no patch(1) on this machine")
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "train.py").write_text(TRAIN)
    (tmp_path / "cheapest.patch").write_text(diff)
    proc = subprocess.run(["patch", "-p1", "-i", str(tmp_path / "cheapest.patch")], cwd=clean, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (clean / "train.py").read_text() == patched


def test_a_trainers_changes_are_its_arguments(tmp_path):
    source = textwrap.dedent("""\
        from transformers import Trainer, TrainingArguments
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=16,
                                 fp16=False)
        Trainer(model=None, args=args).train()
        """)
    patched, _, _ = _patch(tmp_path, ["checkpoint", "autocast", "optimizer"], allocator="native",
                           settings={"autocast": "float16", "optimizer": "8bit"}, source=source, trainer=True,
                           accumulation={"batch": 4, "steps": 4, "effective": 16})
    assert patched == textwrap.dedent("""\
        from transformers import Trainer, TrainingArguments
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=4,
                                 fp16=True, gradient_checkpointing=True, optim='adamw_bnb_8bit', gradient_accumulation_steps=4)
        Trainer(model=None, args=args).train()
        """)


@pytest.mark.parametrize("change, why", [
    (dict(accumulation={"batch": 4, "steps": 2, "effective": 8}),
     "its gradient accumulation changes the training loop, which is not written as a patch"),
    (dict(remedies=["checkpoint"], model_sites=[]), "no frame of the script held the model it trains"),
    (dict(remedies=["checkpoint"], model_sites=[{"file": "/elsewhere/run.py", "line": 3, "name": "m"}]),
     "the model is held in /elsewhere/run.py, not in the script"),
    (dict(remedies=["optimizer"], optimizer_site=None),
     "the script built no torch.optim.Adam or AdamW that the run saw"),
    (dict(remedies=["checkpoint"], trainer=True), "the script has 0 TrainingArguments(...) calls, not one"),
])
def test_what_cannot_be_written_says_why(tmp_path, change, why):
    remedies = change.pop("remedies", ["checkpoint"])
    accumulation = change.pop("accumulation", None)
    with pytest.raises(NoPatch) as refused:
        _patch(tmp_path, remedies, accumulation=accumulation, **change)
    assert str(refused.value) == why


NOTEBOOK_CELLS = [
    "!pip install --quiet something\n",
    "import torch\nfrom model import GPT",
    "%%time\nmodel = GPT().cuda()\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)\n"
    "for step in range(10):\n    loss = model(torch.zeros(4, device='cuda')).sum()\n    loss.backward()\n"
    "    opt.step()",
]


def _notebook(tmp_path, cells=NOTEBOOK_CELLS, layout=None):
    """A notebook as Jupyter writes it (sorted keys, an indent of 1), one
    markdown cell first, so that code cells are numbered apart from it."""
    import json

    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# Training ✓"]}]
          + [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
              "source": source.splitlines(True)} for source in cells],
          "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb, **(layout or dict(indent=1, sort_keys=True, ensure_ascii=False))) + "\n")
    return path


def _notebook_patch(tmp_path, remedies, **program):
    path = _notebook(tmp_path, **{k: program.pop(k) for k in ("cells", "layout") if k in program})
    cell = "nb.ipynb[cell 3]"
    plan = {"program": dict({"models": ["GPT"], "model_sites": [{"file": cell, "line": 5, "name": "model"}],
                             "optimizer_site": {"file": cell, "line": 3, "class": "AdamW"}, "trainer": False},
                            **program),
            "settings": {"autocast": "float16", "optimizer": "8bit"}}
    row = {"remedies": remedies, "allocator": "vramguard", "accumulation": None,
           "how": {"checkpoint": {"how": "wrapper", "block_sites": [{"module": "model", "name": "Block"}]}}}
    return path, patch_for(row, plan, str(path), str(tmp_path))


def test_a_notebooks_change_is_a_patch_of_its_cells_in_its_own_layout(tmp_path):
    """The imports go before the first import of the first cell that has one
    (after its pip line's cell); checkpointing before the loop of the %%time
    cell, below the magic; the optimizer at its line. Only those lines of
    the file change, and patch -p1 applies the diff."""
    import json

    path, (patched, diff, rel) = _notebook_patch(tmp_path, ["checkpoint", "optimizer"])
    assert rel == "nb.ipynb"
    cells = [("".join(c["source"])) for c in json.loads(patched)["cells"] if c["cell_type"] == "code"]
    assert cells[0] == NOTEBOOK_CELLS[0]
    assert cells[1] == ("import vramguard; vramguard.install()  # before the first CUDA call\n"
                        "import bitsandbytes as bnb\nimport torch\nfrom model import GPT")
    assert cells[2].splitlines()[:7] == [
        "%%time", "model = GPT().cuda()", "opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-3)",
        "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing",
        "from model import Block",
        "apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))",
        "for step in range(10):"]
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert len(changed) == 2 + 5  # the optimizer's line out and in, five lines added
    assert "# Training ✓" in patched  # not escaped, as Jupyter writes it
    if shutil.which("patch"):
        clean = tmp_path / "clean"
        clean.mkdir()
        shutil.copy(path, clean / "nb.ipynb")
        (clean / "p.diff").write_text(diff)
        subprocess.run(["patch", "-p1", "-s", "-i", "p.diff"], cwd=clean, check=True)
        assert (clean / "nb.ipynb").read_text() == patched


@pytest.mark.parametrize("program, why", [
    (dict(layout=dict(indent=3)),
     "its file is not in a layout this writer reproduces (Jupyter's, or json.dumps'), so a patch would rewrite all of it"),
    (dict(cells=["import torch", "%time opt = torch.optim.AdamW([], foreach=True)"],
          optimizer_site={"file": "nb.ipynb[cell 2]", "line": 1, "class": "AdamW"}),
     "line 1 of nb.ipynb[cell 2] is an IPython line"),
    (dict(model_sites=[{"file": "helpers.py", "line": 3, "name": "m"}]),
     "the model is held in helpers.py, not in the notebook"),
    (dict(cells=["x = 1"], optimizer_site={"file": "nb.ipynb[cell 1]", "line": 1, "class": "AdamW"}),
     "no AdamW(...) call at line 1 of nb.ipynb[cell 1]"),
])
def test_what_a_notebook_cannot_have_written_says_why(tmp_path, program, why):
    remedies = ["checkpoint"] if "model_sites" in program else ["optimizer"]
    with pytest.raises(NoPatch) as refused:
        _notebook_patch(tmp_path, remedies, **program)
    assert str(refused.value) == why


def test_a_notebook_that_is_not_json_says_so(tmp_path):
    (tmp_path / "nb.ipynb").write_text("{ not json")
    with pytest.raises(NoPatch) as refused:
        patch_for({"remedies": ["checkpoint"], "allocator": "native"}, {}, str(tmp_path / "nb.ipynb"), str(tmp_path))
    assert str(refused.value).startswith("the notebook is not JSON (")


def test_a_script_without_torch_at_its_top_gets_it_above_the_autocast_line(tmp_path):
    patched, _, _ = _patch(tmp_path, ["autocast"], allocator="vramguard", source="print('hi')\n")
    assert patched.splitlines() == [
        "import vramguard; vramguard.install()  # before the first CUDA call", "import torch",
        'torch.set_autocast_enabled("cuda", True); torch.set_autocast_dtype("cuda", torch.float16); '
        "torch.set_autocast_cache_enabled(False)  # the program's CUDA work under autocast", "print('hi')"]


def test_a_region_built_on_one_line_and_entered_on_another_is_patched_where_it_is_built(tmp_path):
    """A config's context (`ctx = torch.autocast(..., dtype=ptdtype)`, as many
    training scripts build it), entered later (`with ctx:`)."""
    source = textwrap.dedent("""\
        import torch
        ptdtype = {"float32": torch.float32, "float16": torch.float16}["float32"]
        ctx = torch.amp.autocast(device_type="cuda", dtype=ptdtype)
        with ctx:
            pass
        """)
    patched, _, _ = _patch(tmp_path, ["autocast"], allocator="native", source=source,
                           full_width_autocast={"line": "train.py:4", "made_at": "train.py:3", "dtype": "float32",
                                                "regions": 1})
    assert patched.splitlines()[2] == 'ctx = torch.amp.autocast(device_type="cuda", dtype=torch.float16)'
