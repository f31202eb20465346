"""The remedies' report (vramguard.dryrun.features.remedies) and the out-of-memory
report's dry-run command (vramguard.report.oom_dryrun), from figures given:
every sentence at its cases, the choice of the cheapest change, the code."""
import os
import sys

import pytest

from vramguard.dryrun.features import remedies
from vramguard.report import oom_dryrun

MiB = 1 << 20
CHOSEN = {"autocast": "float16", "optimizer": "8bit"}


def row(name, kinds, fits, reserved, work=1.0, **extra):
    r = {"name": name, "remedies": kinds, "allocator": "vramguard", "fits": fits,
         "peak_allocated_bytes": reserved - 10 * MiB, "peak_reserved_bytes": reserved, "applied": True,
         "why_not": None, "how": {}, "work_ratio": work, "peaks_on_larger_phantom": None}
    r.update(extra)
    return r


def result(rows, native_fits=False, sweep=None, program=None, **runs):
    out = {"gpu": "T4", "allocators": ["native", "vramguard"], "native": {"fits": native_fits},
           "vramguard": {"fits": False, "peak_reserved_bytes": 900 * MiB}}
    out.update(runs)
    rem = {"measured": True, "allocator": "vramguard", "settings": CHOSEN, "rows": rows,
           "program": program or {"trainer": False}, "target": max(sweep["values"]) if sweep else None,
           "sweep_name": sweep["name"] if sweep else None, "sweep_values": sweep["values"] if sweep else None}
    if sweep:
        out["sweep"] = sweep
    rem.update(remedies.choose(out, rem))
    out["remedies"] = rem
    return out


def test_fewest_changes_first_then_least_work():
    rows = [row("as written", [], False, 900 * MiB, as_written=True),
            row("autocast fp16", ["autocast"], True, 500 * MiB, 1.0),
            row("checkpointing", ["checkpoint"], True, 400 * MiB, 1.2),
            row("autocast fp16 + checkpointing", ["autocast", "checkpoint"], True, 300 * MiB, 1.2)]
    r = result(rows)
    assert r["remedies"]["cheapest"] == "autocast fp16"
    assert r["remedies"]["sentence"] == (
        "Cheapest change that fits: autocast fp16 (1 change, no extra work) (measured with the vramguard "
        "allocator, which the code installs too).")
    assert r["remedies"]["code"] == [
        "import vramguard; vramguard.install()  # before the first CUDA call",
        'with torch.autocast("cuda", dtype=torch.float16):  # around the forward pass and the loss',
        'scaler = torch.amp.GradScaler("cuda")  # fp16: scaler.scale(loss).backward(); scaler.step(optimizer); '
        "scaler.update()"]


def test_an_allocator_that_fits_as_written_is_the_cheapest():
    rows = [row("as written", [], True, 900 * MiB, as_written=True),
            row("checkpointing", ["checkpoint"], True, 400 * MiB, 1.2)]
    r = result(rows, vramguard={"fits": True, "peak_reserved_bytes": 900 * MiB})
    assert r["remedies"]["cheapest"] == "vramguard allocator"
    assert r["remedies"]["sentence"] == "Cheapest change that fits: vramguard allocator (1 change, no extra work)."
    assert r["remedies"]["code"] == ["import vramguard; vramguard.install()  # before the first CUDA call"]


def test_extra_work_is_said():
    rows = [row("checkpointing", ["checkpoint"], True, 400 * MiB, 1.18,
                how={"checkpoint": {"how": "wrapper", "block_class": "Block"}})]
    r = result(rows)
    assert "(1 change, 1.18x the work)" in r["remedies"]["sentence"]
    assert r["remedies"]["code"][-1] == "apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))"


def test_fits_as_written():
    r = result([row("autocast fp16", ["autocast"], True, 500 * MiB)], native_fits=True)
    assert r["remedies"]["sentence"] == ("As written it fits with PyTorch's default allocator: nothing needs "
                                         "changing; the rows say what each remedy would free.")
    assert r["remedies"]["code"] == []


def test_nothing_fits_says_the_lowest_peak():
    rows = [row("autocast fp16", ["autocast"], False, 700 * MiB), row("checkpointing", ["checkpoint"], False, 650 * MiB)]
    r = result(rows)
    assert r["remedies"]["sentence"] == ("Nothing tried fits on a T4: the lowest peak, checkpointing, still "
                                         "reserves 650.00 MiB; a smaller batch or a larger card is needed.")


def test_nothing_applied():
    r = result([row("checkpointing", ["checkpoint"], None, 1, applied=False, why_not={"checkpoint": "no blocks"})])
    assert r["remedies"]["sentence"] == ("No remedy could be applied to this program (the rows say why): nothing "
                                         "tried fits on a T4.")


def test_sweep_nothing_fits():
    sweep = {"name": "BATCH", "values": [8, 16, 32, 64]}
    rows = [row("autocast fp16", ["autocast"], False, 700 * MiB, largest_value=None, accumulation=None)]
    r = result(rows, sweep=sweep, native={"largest_value": None})
    assert r["remedies"]["sentence"] == "No remedy tried fits even the smallest BATCH on a T4."
    assert r["remedies"]["code"] == []


SWEEP = {"name": "BATCH", "values": [8, 16, 32, 64]}


@pytest.mark.parametrize("native, rows, sentence", [
    # accumulation alone is one change and no extra work: the cheapest
    (8, [row("checkpointing", ["checkpoint"], True, 500 * MiB, 1.24, largest_value=64,
             accumulation=remedies.accumulation(64, 64))],
     "Cheapest change that makes up BATCH=64: gradient accumulation, BATCH=8 over 8 accumulation steps "
     "(1 change, no extra work)."),
    # nothing fits as written: a remedy and accumulation, two changes
    (None, [row("checkpointing", ["checkpoint"], False, 500 * MiB, 1.24, largest_value=16,
                accumulation=remedies.accumulation(64, 16))],
     "Cheapest change that makes up BATCH=64: checkpointing, BATCH=16 over 4 accumulation steps (2 changes, "
     "1.24x the work) (measured with the vramguard allocator, which the code installs too)."),
    # one remedy that fits the whole batch beats one with accumulation at the same work
    (None, [row("autocast fp16", ["autocast"], False, 500 * MiB, 1.0, largest_value=32,
                accumulation=remedies.accumulation(64, 32)),
            row("8-bit AdamW", ["optimizer"], True, 600 * MiB, 1.0, largest_value=64,
                accumulation=remedies.accumulation(64, 64))],
     "Cheapest change that makes up BATCH=64: 8-bit AdamW (1 change, no extra work) (measured with the vramguard "
     "allocator, which the code installs too)."),
    # an effective batch above the one asked for is said
    (None, [row("checkpointing", ["checkpoint"], False, 500 * MiB, 1.2, largest_value=24,
                accumulation=remedies.accumulation(64, 24))],
     "Cheapest change that makes up BATCH=64: checkpointing, BATCH=24 over 3 accumulation steps (an effective 72) "
     "(2 changes, 1.20x the work) (measured with the vramguard allocator, which the code installs too).")])
def test_sweep_choice_with_accumulation(native, rows, sentence):
    sweep = dict(SWEEP, values=[8, 16, 24, 32, 64])
    r = result(rows, sweep=sweep, native={"largest_value": native})
    assert r["remedies"]["sentence"] == sentence


def test_accumulation_code():
    rows = [row("checkpointing", ["checkpoint"], False, 500 * MiB, 1.24, largest_value=16,
                accumulation=remedies.accumulation(64, 16), how={"checkpoint": {"how": "huggingface",
                                                                               "method": "gradient_checkpointing_enable"}})]
    plain = result(rows, sweep=SWEEP, native={"largest_value": None})
    assert plain["remedies"]["code"] == [
        "import vramguard; vramguard.install()  # before the first CUDA call",
        "model.gradient_checkpointing_enable()  # before training",
        "# BATCH=16: the loss divided by 4, backward() every batch, optimizer.step() and zero_grad() every 4 batches"]
    trainer = result(rows, sweep=SWEEP, native={"largest_value": None}, program={"trainer": True})
    assert trainer["remedies"]["code"][1:] == [
        "TrainingArguments(..., gradient_checkpointing=True)",
        "TrainingArguments(..., per_device_train_batch_size=16, gradient_accumulation_steps=4)"]


def test_sweep_accumulation_in_table_and_code():
    sweep = {"name": "BATCH", "values": [8, 16, 32, 64]}
    rows = [row("as written", [], False, 900 * MiB, as_written=True, largest_value=8,
                accumulation=remedies.accumulation(64, 8)),
            row("8-bit AdamW", ["optimizer"], True, 500 * MiB, 1.0, largest_value=64,
                accumulation=remedies.accumulation(64, 64))]
    r = result(rows, sweep=sweep, native={"largest_value": None}, program={"trainer": True})
    assert remedies.accumulation(64, 24) == {"batch": 24, "steps": 3, "effective": 72}
    assert r["remedies"]["code"][-1] == 'TrainingArguments(..., optim="adamw_bnb_8bit")'
    lines = remedies.table_lines(r)
    assert lines[1:5] == [
        "Remedy       Peak allocated  Peak reserved  Fits BATCH=64  Largest BATCH  Accumulation   Work",
        "-----------  --------------  -------------  -------------  -------------  ------------  -----",
        "as written       890.00 MiB     900.00 MiB             no              8         8 x 8  1.00x",
        "8-bit AdamW      490.00 MiB     500.00 MiB            yes             64             -  1.00x"]


def test_rows_that_could_not_be_applied_and_larger_phantom_peaks():
    rows = [row("as written", [], False, 900 * MiB, as_written=True, peaks_on_larger_phantom=8 << 30),
            remedies._skipped_row("optimizer", CHOSEN, "vramguard", "the program built no optimizer"),
            row("checkpointing", ["checkpoint"], None, 1, applied=False, peak_allocated_bytes=None,
                peak_reserved_bytes=None, peaks_on_larger_phantom=8 << 30,
                why_not={"checkpoint": "no repeated blocks in Net"})]
    lines = remedies.table_lines(result(rows))
    assert "900.00 MiB*" in lines[3]
    assert lines[4].split()[:4] == ["8-bit", "AdamW", "-", "-"]
    assert "> 8.00 GiB" in lines[5]
    assert "* out of memory on the card: the peak of its steps on a larger phantom (8.00 GiB)." in lines
    assert "8-bit AdamW: not applied: the program built no optimizer." in lines
    assert "checkpointing: not applied: no repeated blocks in Net." in lines


def test_not_measured_is_one_line():
    r = {"remedies": {"measured": False, "why": "the program never used the GPU: there is no memory for a "
                                                "remedy to free", "rows": []}}
    assert remedies.table_lines(r) == ["Remedies: not measured: the program never used the GPU: there is no "
                                       "memory for a remedy to free."]
    assert remedies.table_lines({}) == []


@pytest.mark.parametrize("runs, unseen", [
    ([{}], "not counted: elementwise and normalization operators (no formula)."),
    ([{"work": {"operator_count_stopped_at_compile": True}, "extensions": {"bitsandbytes": {}}}],
     "not counted: the custom kernels of bitsandbytes; the attention and convolutions inside compiled code; "
     "elementwise and normalization operators (no formula).")])
def test_work_note_says_what_was_not_seen(runs, unseen):
    res = {"allocators": ["vramguard"], "vramguard": runs[0]}
    assert remedies.work_note(res).endswith(unseen)


def test_settings_follow_the_card():
    from vramguard import PRESETS

    assert remedies.settings(PRESETS["T4"])["autocast"] == "float16"
    assert remedies.settings(PRESETS["L4"])["autocast"] == "bfloat16"
    assert remedies.env_for(["autocast", "checkpoint", "optimizer"], CHOSEN) == {
        "VRAMGUARD_DRYRUN_REMEDIES": "autocast:float16,checkpoint,optimizer:8bit", "VRAMGUARD_DRYRUN_WORK": "1"}


# ------------------------------------------------------------ the OOM report's command


def test_card_flags():
    assert oom_dryrun.card_flags("Tesla T4", 15_828_320_256) == ["--gpu", "T4"]
    assert oom_dryrun.card_flags("NVIDIA A10G", 23_836_033_024) == ["--memory", "23836033024"]


def test_command_for_a_script(tmp_path, monkeypatch):
    script = tmp_path / "my train.py"
    script.write_text("")
    monkeypatch.setattr(sys, "argv", [str(script), "--batch", "64"])
    monkeypatch.setattr(oom_dryrun, "_notebook_path", lambda: None)
    assert oom_dryrun.command_line("Tesla T4", 1) == (
        f"Measure the remedies on this script, without a GPU: python -m vramguard dryrun --gpu T4 --remedies "
        f"'{script}' --batch 64")


@pytest.mark.parametrize("path, tail", [
    ("/c/nb.ipynb", "python -m vramguard dryrun --gpu T4 --remedies /c/nb.ipynb"),
    ("", "python -m vramguard dryrun --gpu T4 --remedies NOTEBOOK.ipynb")])
def test_command_for_a_notebook(monkeypatch, path, tail):
    monkeypatch.setattr(oom_dryrun, "_notebook_path", lambda: path)
    line = oom_dryrun.command_line("Tesla T4", 1)
    assert line == ("Measure the remedies on this notebook, without a GPU (the whole notebook: its cells depend "
                    f"on the ones before): {tail}")


def test_command_when_the_program_is_not_known(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["-c"])
    monkeypatch.setattr(oom_dryrun, "_notebook_path", lambda: None)
    assert oom_dryrun.command_line(None, 0) == (
        "Measure the remedies on the program, without a GPU: python -m vramguard dryrun --gpu T4 --remedies "
        "SCRIPT.py ARGS...")
    assert not os.path.isfile("-c")


@pytest.mark.parametrize("program, kind, why", [
    ({"autocast_regions": 1, "checkpointing": False, "optimizers": ["AdamW"]}, "autocast",
     "the program already runs under autocast, and its own regions keep their dtype"),
    ({"autocast_regions": 12, "checkpointing": False, "optimizers": ["AdamW"]}, "autocast",
     "the program already runs under autocast, and its own regions keep their dtype"),
    ({"autocast_regions": 0, "autocast_off_regions": 3, "checkpointing": False, "optimizers": ["AdamW"]},
     "autocast", "the program turns autocast off in its own region (torch.autocast(..., enabled=False)), which a "
     "default cannot reach: enable it there"),
    ({"autocast_regions": 0, "checkpointing": True, "optimizers": ["AdamW"]}, "checkpoint",
     "the program already turns activation checkpointing on"),
    ({"autocast_regions": 0, "checkpointing": False, "optimizers": ["SGD"]}, "optimizer",
     "the program's optimizer is SGD, not torch.optim.Adam or AdamW"),
    ({"autocast_regions": 0, "checkpointing": False, "optimizers": ["PagedAdamW8bit", "SGD"]}, "optimizer",
     "the program's optimizer is PagedAdamW8bit, SGD, not torch.optim.Adam or AdamW"),
    ({"autocast_regions": 0, "checkpointing": False, "optimizers": []}, "optimizer",
     "the program built no optimizer")])
def test_what_the_program_already_does_is_not_run_again(program, kind, why):
    assert remedies._skip(kind, program, CHOSEN) == why


def test_a_plain_program_skips_nothing():
    plain = {"autocast_regions": 0, "checkpointing": False, "optimizers": ["SGD", "AdamW"]}
    assert [remedies._skip(k, plain, CHOSEN) for k in remedies.SINGLES] == [None, None, None]


@pytest.mark.parametrize("chosen, built, lines", [
    ({"autocast": "float16", "optimizer": "8bit"}, "Adam",
     ["import bitsandbytes as bnb", "optimizer = bnb.optim.Adam8bit(model.parameters(), lr=...)  # instead of "
                                    "torch.optim.Adam"]),
    ({"autocast": "float16", "optimizer": "fused"}, "AdamW",
     ["optimizer = torch.optim.AdamW(model.parameters(), lr=..., fused=True)"])])
def test_optimizer_code_names_the_class_the_program_built(chosen, built, lines):
    r = row("opt", ["optimizer"], True, 1, how={"optimizer": {"applied": True, "from": built}}, allocator="native")
    assert remedies.code_for(r, {"program": {}, "settings": chosen}) == lines
