"""last_oom().measure_remedies(): the standard remedies measured on the
session's own cells, from the notebook itself, without touching the GPU.

The cells the session ran (IPython's history, up to and including the cell
the out-of-memory error came from) are written to a notebook of their own,
and `python -m vramguard dryrun --remedies` runs it in a subprocess on a
phantom of this card (its name, total memory and compute capability read
from the real device), loading Hugging Face models without their weights
(where the session has imported transformers), under vramguard's
allocator. Its output (each run as it ends, then the
measured table and the cheapest change that fits) is shown in the cell as
it comes. Nothing runs on the GPU: the dry run's processes are on the CPU.

Magics (`%time`, `%%capture`) and shell lines (`!pip install ...`) are not
run again (a dry run would install or time for real): they are left out and
named. Where the cells cannot be had (no IPython), the call says why in one
line. Inside a dry run (the cell that calls it, run again by the dry run) it
measures nothing.
"""
import json
import os
import subprocess
import sys
import tempfile

from .._presets import PRESETS
from .._units import format_size

__all__ = ["session_cells", "phantom_card", "measure_remedies", "MeasuredRemedies", "IN_DRYRUN_ENV"]

#: Set in every dry run's processes (dryrun/launch.py).
IN_DRYRUN_ENV = "VRAMGUARD_DRYRUN_DIR"  # dryrun/contract.py's DIR_ENV, a layer above this one


class MeasuredRemedies:
    """What measure_remedies() did: `text` the dry run's output, `exit_code`
    its exit status (0 fits as written, 1 does not: the table says what
    does), `command` as run, `notebook` the cells' file, `skipped` [(cell,
    line)] the magics and shell lines left out; `why` instead when nothing
    was measured."""

    def __init__(self, text="", exit_code=None, command=(), notebook=None, skipped=(), why=None, result=None):
        self.text, self.exit_code, self.command = text, exit_code, list(command)
        self.notebook, self.skipped, self.why = notebook, list(skipped), why
        self.result = result  # the dry run's figures (its JSON), None when it wrote none

    @property
    def remedies(self):
        """The measured remedies (the dry run's result["remedies"]), or None."""
        return (self.result or {}).get("remedies")

    def __repr__(self):
        if self.why is not None:
            return f"vramguard: the remedies were not measured: {self.why}"
        cheapest = (self.remedies or {}).get("cheapest")
        return f"MeasuredRemedies(exit_code={self.exit_code}, cheapest={cheapest!r}, notebook={self.notebook!r})"


def ipython_shell():
    """The running IPython shell, or None (IPython not imported, or none)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def current_cell(shell):
    """The number of the shell's cell running now, or None without a
    history: its input is the last the history holds (execution_count is
    that number or the next, by IPython's version)."""
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    return len(history) - 1 if history else None


def _is_magic(line):
    return line.lstrip().startswith(("%", "!"))


def session_cells(shell, upto):
    """([source] of the cells 1 to `upto` of the session's history, their
    magics and shell lines replaced by `pass`, [(cell number, line)] of
    what was left out). A cell magic's cell (%%time, %%bash) is left out
    whole: its body may not be Python."""
    history = list(shell.history_manager.input_hist_raw)
    cells, skipped = [], []
    for number in range(1, min(upto, len(history) - 1) + 1):
        source = history[number]
        if source.lstrip().startswith("%%"):
            skipped.append((number, source.strip().splitlines()[0]))
            continue
        lines = []
        for line in source.splitlines():
            if _is_magic(line):
                skipped.append((number, line.strip()))
                indent = line[:len(line) - len(line.lstrip())]
                line = f"{indent}pass  # vramguard: left out of the dry run: {line.strip()}"
            lines.append(line)
        cells.append("\n".join(lines))
    return cells, skipped


def _notebook_json(cells):
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
            "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                       "id": f"cell-{i}", "source": source} for i, source in enumerate(cells, 1)]}


def phantom_card(name, total, capability):
    """{"gpu": preset name, "memory": bytes} of a phantom of this device:
    the preset CUDA's name for it matches, else the preset of its compute
    capability nearest in memory, else T4's; always with the device's own
    total (a card with ECC off, a phantom of another size)."""
    by_name = [p for p in PRESETS.values() if name and p.cuda_name == name]
    same = [p for p in PRESETS.values() if tuple(p.compute_capability) == tuple(capability or ())]
    base = (by_name or [min(same, key=lambda p: abs(p.total_bytes - total))] if same or by_name
            else [PRESETS["T4"]])[0]
    return {"gpu": base.name, "memory": int(total)}


def _card(device):
    torch = sys.modules.get("torch")
    props = torch.cuda.get_device_properties(device)
    return props.name, props.total_memory, (props.major, props.minor)


def measure_remedies(report, cell=None, out=None, shell=None, steps=None, timeout=None):
    """Runs the dry run's remedies on the session's cells; returns a
    MeasuredRemedies. `cell`: the last cell to run (default: the cell the
    report was made in, the one that failed); `out`: where the dry run
    writes its folder (default: a temporary one); `steps`, `timeout`: as
    the dry run's (each run stopped after that many optimizer steps, or
    seconds), for a session whose cells train for long."""
    if os.environ.get(IN_DRYRUN_ENV):
        return MeasuredRemedies(why="this is a dry run's own run of the cell: nothing is measured again")
    shell = shell if shell is not None else ipython_shell()
    if shell is None or getattr(shell, "history_manager", None) is None:
        result = MeasuredRemedies(why="it needs IPython's history of the cells (a notebook or an IPython shell); "
                                      "for a script: python -m vramguard dryrun --remedies SCRIPT.py")
        print(repr(result))
        return result
    upto = cell if cell is not None else (report.cell or current_cell(shell))
    cells, skipped = session_cells(shell, upto)
    folder = tempfile.mkdtemp(prefix="vramguard-measure-", dir=out)
    notebook = os.path.join(folder, "session.ipynb")
    with open(notebook, "w", encoding="utf-8") as f:
        json.dump(_notebook_json(cells), f)
    card = phantom_card(*_card(report.device))
    # Hub models without their weights, where the session loads any (the
    # dry run would otherwise note a flag the user never gave)
    settings = dict(card, allocators="vramguard", remedies=True, weights="transformers" not in sys.modules,
                    echo=False, out=folder, steps=steps, timeout=timeout)
    saved = os.path.join(folder, "result.json")
    command = [sys.executable, "-c", _CHILD, notebook, json.dumps(settings), saved]
    left_out = "; ".join(f"cell {n}: {line}" for n, line in skipped)
    print(f"vramguard: measuring the remedies on cells 1 to {upto} of this session on a phantom "
          f"{card['gpu']} with this card's {format_size(card['memory'])}, on the CPU (the GPU is not used)"
          + (f"; left out: {left_out}" if skipped else "") + ":", flush=True)
    text, exit_code = _run_showing(command)
    result = None
    if os.path.isfile(saved):
        with open(saved, encoding="utf-8") as f:
            result = json.load(f)
    return MeasuredRemedies(text, exit_code, command, notebook, skipped, result=result)


# The dry run, in a process of its own (the GPU session imports nothing of
# it): its text report on stdout as it ends, its figures as JSON in a file.
_CHILD = """
import json, sys
import vramguard
notebook, settings, saved = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
result = vramguard.dryrun(notebook, **settings)
print(result, flush=True)
with open(saved, "w", encoding="utf-8") as f:  # read once this process has ended
    f.write(result.to_json())
raise SystemExit(result["exit_code"])
"""


def _run_showing(command):
    """(output, exit status) of the command, each line of its output printed
    as it comes (the runs as they end: the cell's progress)."""
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          text=True, cwd=os.getcwd()) as proc:
        try:
            for line in proc.stdout:
                lines.append(line)
                print(line, end="", flush=True)
        except KeyboardInterrupt:  # the dry run ends its runs on SIGTERM
            proc.terminate()
            proc.wait()
            raise
    return "".join(lines), proc.returncode
