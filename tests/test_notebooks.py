"""The notebooks, run as a user runs them: every cell in a real IPython
kernel (nbclient), top to bottom; any cell that fails fails the test."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import vramguard
from trace_paths import SHARED_TRACES

nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[test]')")
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[test]')")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _this_python_kernel(folder):
    """A kernel manager for a kernel on this very interpreter (the one with
    vramguard and the test extra installed), whatever other kernels named
    "python3" the machine has."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = folder / "vramguard-tests"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "vramguard tests", "language": "python",
    }))
    # The connection file in the test's folder, not a temporary file of the machine's that outlives the test.
    return KernelManager(kernel_name="vramguard-tests", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder)]),
                         connection_file=str(folder / "connection.json"))


def run_notebook(name, tmp_path, env=None):
    """The notebook executed in its own folder, its kernel's environment
    updated with `env`; returns (notebook, all text output)."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    km = _this_python_kernel(tmp_path / "kernels")
    # Run in the test's own folder: what a notebook writes (memory.pickle) stays out of the repository.
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    client = nbclient.NotebookClient(nb, km=km, timeout=300, resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute(env={**os.environ, **(env or {})})  # CellExecutionError, naming the cell, if one fails
    finally:
        km.shutdown_kernel(now=True)  # nbclient leaves a kernel it was given running
    return nb, "\n".join(_text(output) for cell in nb.cells if cell.cell_type == "code" for output in cell.outputs)


def _text(output):
    if "text" in output:
        return output["text"]
    return output.get("data", {}).get("text/plain", "")


# ---------------------------------------------------------------- what_if


def test_what_if_on_the_shipped_trace(tmp_path):
    """Where no real trace is found, the trace shipped in the package: its
    answers are known exactly (see test_first_use for the numbers)."""
    _, out = run_notebook("what_if.ipynb", tmp_path, env={"VRAMGUARD_TRACES": str(tmp_path / "none")})
    assert "The example trace that ships with vramguard" in out
    assert "<Trace 'synthetic-gpt-train-batch25-3steps': 1,892 ops, 1,238 allocations>" in out
    assert "Peak of live tensors: 13.92 GiB" in out
    # vramguard is the arena: 1.2 MiB over the tensors' peak
    assert "         vramguard        13.93 GiB             +0.0%            13.93 GiB" in out
    assert "          segments        13.99 GiB             +0.5%            14.98 GiB" in out
    assert "             torch        15.01 GiB             +7.8%            15.01 GiB" in out
    assert "T4: 14.35 GiB usable of 14.74 GiB (15,828,320,256 bytes)" in out
    assert "         vramguard: fits, peak reserved 13.93 GiB, 434.00 MiB to spare" in out
    assert "          segments: fits, peak reserved 14.04 GiB, 318.00 MiB to spare" in out
    assert "             torch: does not fit; first OOM at op 1,200: an allocation of 2.40 GiB" in out
    assert "  Would it fit on a T4? yes with vramguard" in out and "; no with torch." in out
    assert "L4: 21.57 GiB usable" in out and "A100-40GB: 39.00 GiB usable" in out
    assert "  Would it fit on an L4? yes." in out
    assert "At the peak (op 1,201): 13.92 GiB live in 670 allocations" in out
    # Every policy replay() takes is replayed; the others are named as
    # skipped, and no cell fails for them.
    have = ("vramguard",) + vramguard.available_policies()
    assert f"Policies replayed: {', '.join(have)}" in out
    missing = [p for p in ("arena", "segments", "torch", "torch-expandable") if p not in have]
    assert (f"Not in this vramguard, skipped: {', '.join(missing)}" in out) == bool(missing)
    for policy in have:
        assert f"{policy:>16}: " in out  # its T4 / L4 / A100-40GB answers


@pytest.mark.shared
@pytest.mark.skipif(not (SHARED_TRACES / "opt125m_zo_finetune.snapshot.pickle").is_file(),
                    reason=f"the real traces are not in {SHARED_TRACES}")
def test_what_if_on_a_real_snapshot(tmp_path):
    _, out = run_notebook("what_if.ipynb", tmp_path, env={"VRAMGUARD_TRACES": str(SHARED_TRACES)})
    assert "A real PyTorch snapshot: opt125m_zo_finetune.snapshot.pickle" in out
    assert "'recorded_reserved_curve': <62 entries>" in out  # the metadata, short
    assert "first OOM: snapshot event " in out
    assert "from adam_forward.py:168 <listcomp>" in out  # the lines that hold the peak


# ---------------------------------------------------------------- quickstart


def test_quickstart_runs_without_a_gpu(tmp_path):
    """No GPU (nor PyTorch) here: the install cell uses the installed
    vramguard, the GPU cells skip instead of failing with NameError, and the
    'would it fit' part runs on the shipped trace."""
    _, out = run_notebook("quickstart.ipynb", tmp_path, env={"CUDA_VISIBLE_DEVICES": ""})
    assert "using the vramguard installed in this runtime" in out
    assert "No GPU here: " in out
    assert out.count("skipped: needs a GPU") == 4
    assert "ReplayResult('synthetic-gpt-train-batch25-3steps', policy='torch', budget T4 (14.35 GiB usable): DOES NOT FIT" in out
    assert "            torch: needs at least 15.01 GiB" in out
    assert " torch-expandable: needs at least 13.93 GiB" in out
    assert "now drag memory.pickle onto https://pytorch.org/memory_viz" in out
    assert vramguard.load_trace(tmp_path / "cwd" / "memory.pickle").peak_live() == vramguard.example_trace().peak_live()


def test_quickstart_install_cell_says_what_to_set(tmp_path):
    """Without vramguard installed and with the source unset, the install
    cell stops with one clear message (python -S: no site-packages, so no
    vramguard, as in a fresh Colab runtime)."""
    nb = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    cell = nb.cells[1].source
    assert 'VRAMGUARD_SOURCE = ""' in cell
    proc = subprocess.run([sys.executable, "-S", "-c", cell], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith(
        "RuntimeError: vramguard is not installed in this runtime: set VRAMGUARD_SOURCE at the top of this cell "
        "to the repository's URL (git+https://...) or to the path of a copy, then run the cell again."
    )
    bad = cell.replace('VRAMGUARD_SOURCE = ""', f'VRAMGUARD_SOURCE = "{tmp_path / "nowhere"}"')
    proc = subprocess.run([sys.executable, "-c", bad], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1
    assert f"RuntimeError: pip could not install vramguard from '{tmp_path / 'nowhere'}':" in proc.stderr
