"""last_oom().measure_remedies()'s parts that need no GPU and no torch: the
session's cells as the dry run gets them (magics and shell lines left out
and named), the phantom chosen for a device, and the one line it says
where it cannot run. The whole call, in a kernel on a phantom T4, is
tests/torch/test_measure_remedies.py."""
import types


from vramguard import PRESETS
from vramguard.report import oom_measure


def _shell(*cells):
    return types.SimpleNamespace(history_manager=types.SimpleNamespace(input_hist_raw=["", *cells]))


def test_the_session_cells_up_to_the_failing_one_with_magics_left_out():
    shell = _shell("import torch\n!pip install x", "%%time\nrun()", "for i in range(2):\n    %time f(i)\n    g(i)",
                   "after()")
    cells, skipped = oom_measure.session_cells(shell, 3)
    assert cells == ["import torch\npass  # vramguard: left out of the dry run: !pip install x",
                     "for i in range(2):\n    pass  # vramguard: left out of the dry run: %time f(i)\n    g(i)"]
    assert skipped == [(1, "!pip install x"), (2, "%%time"), (3, "%time f(i)")]
    compile(cells[1], "cell", "exec")  # a magic inside a block leaves the block valid
    assert oom_measure.session_cells(shell, 1) == (["import torch\npass  # vramguard: left out of the dry run: "
                                                    "!pip install x"], [(1, "!pip install x")])
    assert oom_measure.session_cells(shell, 99)[0][-1] == "after()"     # no cell past the history


def test_the_phantom_is_the_card_by_name_else_by_compute_capability():
    t4 = PRESETS["T4"]
    assert oom_measure.phantom_card("Tesla T4", t4.total_bytes, (7, 5)) == {"gpu": "T4", "memory": t4.total_bytes}
    # ECC off, or a phantom of another size: the card's kernels, the device's own memory
    assert oom_measure.phantom_card("Tesla T4", 875 << 20, (7, 5)) == {"gpu": "T4", "memory": 875 << 20}
    # a card with no preset: the preset of its compute capability nearest in memory
    a100_80 = PRESETS["A100-80GB"]
    assert oom_measure.phantom_card("NVIDIA A800 80GB", a100_80.total_bytes - (1 << 30), (8, 0)) == {
        "gpu": "A100-80GB", "memory": a100_80.total_bytes - (1 << 30)}
    assert oom_measure.phantom_card("Some card", 8 << 30, (5, 2)) == {"gpu": "T4", "memory": 8 << 30}


def test_outside_ipython_it_says_why_in_one_line(capsys, monkeypatch):
    monkeypatch.delenv(oom_measure.IN_DRYRUN_ENV, raising=False)
    result = oom_measure.measure_remedies(report=None, shell=None)
    assert result.why.startswith("it needs IPython's history of the cells") and result.result is None
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and said.startswith("vramguard: the remedies were not measured: it needs IPython")


def test_in_a_dry_run_s_own_run_of_the_cell_nothing_is_measured(capsys, monkeypatch):
    monkeypatch.setenv(oom_measure.IN_DRYRUN_ENV, "/tmp/x")
    result = oom_measure.measure_remedies(report=None, shell=_shell("x"))
    assert result.why == "this is a dry run's own run of the cell: nothing is measured again"
    assert capsys.readouterr().out == ""
