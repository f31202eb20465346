"""`python -m vramguard dryrun` on input it cannot run: one line on
stderr, status 2, before anything starts (no PyTorch, no phantom needed)."""
import json
import subprocess
import sys

import pytest

from vramguard.phantom.dryrun import DryRunInputError, parse_allocators, parse_sweep


def dryrun(*args, cwd):
    return subprocess.run([sys.executable, "-m", "vramguard", "dryrun", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=60)


def check_refused(proc, said):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("vramguard: "), proc.stderr
    assert said in proc.stderr, proc.stderr
    assert proc.stdout == ""


@pytest.fixture
def script(tmp_path):
    (tmp_path / "train.py").write_text("print('never run')\n")
    return tmp_path


def test_an_unknown_gpu_names_the_presets(script):
    check_refused(dryrun("--gpu", "T5", "train.py", cwd=script), "unknown GPU 'T5': one of T4, L4")


def test_a_missing_script_is_named(tmp_path):
    check_refused(dryrun("--gpu", "T4", "nothere.py", "--batch", "8", cwd=tmp_path),
                  "nothere.py: No such file or directory")


def test_no_script_at_all(tmp_path):
    check_refused(dryrun("--gpu", "T4", cwd=tmp_path), "no script given")


def test_a_directory_is_not_a_script(tmp_path):
    (tmp_path / "models").mkdir()
    check_refused(dryrun("models", cwd=tmp_path), "models: is a directory, not a script")


def test_a_broken_notebook_is_refused(tmp_path):
    (tmp_path / "nb.ipynb").write_text("{not json")
    check_refused(dryrun("nb.ipynb", cwd=tmp_path), "nb.ipynb: not a Jupyter notebook")


@pytest.mark.parametrize("sweep, said", [
    ("BATCH", "expected NAME=V1,V2,..."),
    ("BATCH=", "expected NAME=V1,V2,..."),
    ("BATCH=1,x,4", "'x' is not a whole number above 0"),
    ("BATCH=0,1", "'0' is not a whole number above 0"),
    ("BATCH=4,2", "the values must increase"),
    ("1BATCH=1,2", "expected NAME=V1,V2,..."),
])
def test_bad_sweep_syntax(script, sweep, said):
    check_refused(dryrun("--sweep", sweep, "train.py", cwd=script), said)


def test_an_unknown_allocator(script):
    check_refused(dryrun("--allocator", "native,cudaMallocAsync", "train.py", cwd=script),
                  "unknown allocator 'cudamallocasync': choose from native, expandable, vramguard")


def test_min_memory_and_sweep_do_not_combine(script):
    check_refused(dryrun("--min-memory", "--sweep", "BATCH=1,2", "train.py", cwd=script),
                  "--min-memory and --sweep cannot be combined")


def test_a_bad_memory_size(script):
    check_refused(dryrun("--memory", "lots", "train.py", cwd=script), "--memory 'lots'")


def test_a_device_smaller_than_its_context(script):
    check_refused(dryrun("--memory", "100MiB", "train.py", cwd=script),
                  "leaves nothing beside the CUDA context")


def test_parsers():
    assert parse_sweep("BATCH=1,2,4,8,16") == ("BATCH", [1, 2, 4, 8, 16])
    assert parse_sweep(" seq_len = 128 , 256 ".replace(" = ", "=")) == ("seq_len", [128, 256])
    assert parse_allocators("vramguard, native,vramguard") == ("vramguard", "native")
    assert parse_allocators(["Expandable"]) == ("expandable",)
    with pytest.raises(DryRunInputError):
        parse_allocators("")


def test_install_kernel_refuses_an_unknown_gpu(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "vramguard", "install-kernel", "--gpu", "T5",
                           "--prefix", str(tmp_path)], capture_output=True, text=True, timeout=60)
    check_refused(proc, "unknown GPU 'T5'")
    proc = subprocess.run([sys.executable, "-m", "vramguard", "install-kernel", "--prefix", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    check_refused(proc, "--gpu is required")


def test_install_kernel_writes_and_removes_a_kernelspec(tmp_path):
    """Where the phantom's libraries cannot be built (no PyTorch here) the
    install says so in one line; where they can, kernel.json carries the
    phantom's variables."""
    proc = subprocess.run([sys.executable, "-m", "vramguard", "install-kernel", "--gpu", "t4",
                           "--prefix", str(tmp_path)], capture_output=True, text=True, timeout=60)
    spec_dir = tmp_path / "share" / "jupyter" / "kernels" / "vramguard-phantom-t4"
    if proc.returncode == 2:
        assert proc.stderr.startswith("vramguard: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert "phantom GPU" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (phantom T4)"
    assert spec["env"]["VG_FAKECUDA_PHANTOM"] == "1" and "libcudart" in spec["env"]["LD_PRELOAD"]
    assert spec["env"]["VG_FAKECUDA_MEM"] == "15828320256"
    assert spec["argv"][:3] == [sys.executable, "-m", "ipykernel_launcher"]
    proc = subprocess.run([sys.executable, "-m", "vramguard", "install-kernel", "--remove", "--gpu", "T4",
                           "--prefix", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not spec_dir.exists()


def test_out_naming_a_file_is_one_clear_line(script):
    (script / "results").write_text("not a directory")
    check_refused(dryrun("--out", "results", "train.py", cwd=script), "--out results: is a file, not a directory")


def test_a_missing_cwd_is_refused(script):
    check_refused(dryrun("--cwd", "nothere", "train.py", cwd=script), "--cwd nothere: No such directory")


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF", "PATH", "PYTHONPATH",
                                  "VG_FAKECUDA_MEM", "VRAMGUARD_BUDGET"])
def test_a_sweep_may_not_overwrite_the_dry_runs_environment(script, name):
    check_refused(dryrun("--sweep", f"{name}=1,2", "train.py", cwd=script),
                  f"{name} is a variable the dry run sets or needs")
    assert parse_sweep("path=1,2") == ("path", [1, 2])  # names are case-sensitive: only the real ones


def test_a_memory_too_large_says_memory_once(script):
    proc = dryrun("--memory", "1e999", "train.py", cwd=script)
    check_refused(proc, "--memory '1e999': is too large (more than 64 bits)")
    assert proc.stderr.count("memory") == 1, proc.stderr


@pytest.mark.parametrize("memory", ["0", "300MiB", "400MiB"])
def test_install_kernel_refuses_a_device_with_nothing_beside_its_context(tmp_path, memory):
    """Refused as dryrun refuses it, before the phantom is looked for."""
    proc = subprocess.run([sys.executable, "-m", "vramguard", "install-kernel", "--gpu", "T4", "--memory", memory,
                           "--prefix", str(tmp_path)], capture_output=True, text=True, timeout=60)
    check_refused(proc, "leaves nothing beside the CUDA context's 400.00 MiB")
    assert not (tmp_path / "share").exists()


def test_install_kernel_variants_are_kernels_of_their_own(tmp_path):
    """Another size or allocator is another kernel (named for them), so a
    second install does not replace the first; --remove with them removes
    that one, with --gpu alone every one of that card."""
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "vramguard", "install-kernel", *args, "--prefix", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)

    proc = cli("--gpu", "T4")
    if proc.returncode == 2 and "phantom GPU" in proc.stderr:
        pytest.skip("the phantom's libraries cannot be built here")
    assert proc.returncode == 0, proc.stderr
    for args in (("--memory", "8GiB"), ("--memory", "8GiB", "--allocator", "expandable"),
                 ("--memory", "15828320256")):  # the card's total: the default kernel
        proc = cli("--gpu", "T4", *args)
        assert proc.returncode == 0, proc.stderr
    kernels = tmp_path / "share" / "jupyter" / "kernels"
    names = sorted(p.name for p in kernels.iterdir())
    assert names == ["vramguard-phantom-t4", "vramguard-phantom-t4-8gib", "vramguard-phantom-t4-8gib-expandable"]
    spec = json.loads((kernels / "vramguard-phantom-t4-8gib-expandable" / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (phantom T4, 8.00 GiB, expandable)"
    assert spec["env"]["VG_FAKECUDA_MEM"] == str(8 << 30)
    assert spec["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert json.loads((kernels / "vramguard-phantom-t4" / "kernel.json").read_text())["env"]["VG_FAKECUDA_MEM"] \
        == "15828320256"
    proc = cli("--remove", "--gpu", "T4", "--memory", "8GiB")
    assert proc.returncode == 0 and proc.stdout.count("removed") == 1, proc.stdout + proc.stderr
    assert sorted(p.name for p in kernels.iterdir()) == ["vramguard-phantom-t4",
                                                         "vramguard-phantom-t4-8gib-expandable"]
    proc = cli("--remove", "--gpu", "T4")
    assert proc.returncode == 0 and proc.stdout.count("removed") == 2, proc.stdout + proc.stderr
    assert list(kernels.iterdir()) == []


def test_install_kernel_writes_kernel_json_whole_or_not_at_all(tmp_path, monkeypatch):
    """Without jupyter_client kernel.json is written by hand: a write that
    fails halfway keeps the kernelspec there was, and leaves no temporary."""
    from vramguard.phantom import kernel as _phantom_kernel

    monkeypatch.setattr(_phantom_kernel, "_manager", lambda: None)
    monkeypatch.setattr(_phantom_kernel, "_spec", lambda preset, memory, allocator: {"display_name": "first"})
    name, where = _phantom_kernel.install_kernel("T4", prefix=str(tmp_path))
    assert name == "vramguard-phantom-t4"
    monkeypatch.setattr(_phantom_kernel, "_spec", lambda preset, memory, allocator: {"a": 1, "b": object()})
    with pytest.raises(TypeError):
        _phantom_kernel.install_kernel("T4", prefix=str(tmp_path))
    import os

    assert os.listdir(where) == ["kernel.json"]
    with open(os.path.join(where, "kernel.json")) as f:
        assert json.load(f) == {"display_name": "first"}


# ------------------------------------------------------------------ notebooks (no PyTorch: the cells' text)


def notebook(tmp_path, *cells):
    nb = {"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": []} for c in cells],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    return path


def test_a_percent_or_bang_continuing_a_statement_is_python(tmp_path):
    from vramguard.phantom.child import notebook_cells

    code = ("x = (1\n    != 2)\ny = (7\n    % 3)\nz = 7 \\\n    % 4\n"
            "s = '''\n!not a shell line\n'''\n!ls\nfiles = !ls\n%matplotlib inline\n")
    cells, notes = notebook_cells(notebook(tmp_path, code))
    source = cells[0][1]
    namespace = {}
    exec(compile(source, "cell", "exec"), namespace)  # a SyntaxError before
    assert (namespace["x"], namespace["y"], namespace["z"], namespace["s"]) == (True, 1, 3, "\n!not a shell line\n")
    assert notes == ["cell 1, line 10: !ls", "cell 1, line 11: files = !ls", "cell 1, line 12: %matplotlib inline"]
    assert len(source.splitlines()) == len(code.splitlines())  # the line numbers kept


def test_timing_magics_keep_the_statement_they_time(tmp_path):
    from vramguard.phantom.child import notebook_cells

    code = ("%time out = (2,\n    3)\nfor i in range(2):\n    %timeit -n 10 -r1 w = i * 5\n"
            "%prun -s cumtime v = 7\n%time\n")
    cells, notes = notebook_cells(notebook(tmp_path, code))
    namespace = {}
    exec(compile(cells[0][1], "cell", "exec"), namespace)
    assert (namespace["out"], namespace["w"], namespace["v"]) == ((2, 3), 5, 7)
    assert notes == ["cell 1, line 6: %time"]


def test_writefile_a_appends(tmp_path, monkeypatch):
    from vramguard.phantom.child import run_notebook

    monkeypatch.chdir(tmp_path)
    path = notebook(tmp_path, "%%writefile out.txt\nfirst", "%%writefile -a out.txt\nsecond",
                    "%%writefile --append out.txt\nthird", "text = open('out.txt').read()")
    run_notebook(str(path))
    assert (tmp_path / "out.txt").read_text() == "first\nsecond\nthird\n"


def test_two_sweeps_are_refused_not_one_dropped(script):
    check_refused(dryrun("--sweep", "BATCH=1,2", "--sweep", "SEQ=128,256", "train.py", cwd=script),
                  "dryrun: --sweep given 2 times (BATCH=1,2, SEQ=128,256): one sweep at a time")


@pytest.mark.parametrize("sweep, placeholder, said", [
    ("batch=1,2", "{BATCH}", "--sweep batch=...: the arguments have {BATCH}, not {batch}"),
    ("BATCH=1,2", "--bs={Batch}", "--sweep BATCH=...: the arguments have {Batch}, not {BATCH}"),
])
def test_a_placeholder_in_another_case_is_refused(script, sweep, placeholder, said):
    check_refused(dryrun("--sweep", sweep, "train.py", "--bs", placeholder, cwd=script),
                  said + ": the name and the placeholder must match, case included")


def test_the_same_case_and_other_braces_pass_the_check():
    from vramguard.phantom.dryrun import _check_placeholders

    _check_placeholders(("BATCH", [1, 2]), ["--bs", "{BATCH}", "--cfg", "{SEQ}", "{}"])  # no error


def test_the_help_says_what_the_options_do():
    proc = subprocess.run([sys.executable, "-m", "vramguard", "dryrun", "--help"], capture_output=True, text=True,
                          timeout=60)
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0
    assert "cannot build Triton" not in text
    assert ("--no-compile turn torch.compile off (TORCH_COMPILE_DISABLE=1): eager mode's figures, for a script "
            "whose compilation fails on the phantom") in text
    assert ("--no-snapshot record no memory history (faster): then there is no recording to replay, so each "
            "allocator's need is not measured") in text
    assert "--allocators NAMES, --allocator NAMES" in text  # the Python API's name, and the old one
    assert "one --sweep at a time" in text


def test_allocators_is_the_option_and_allocator_still_works(script):
    for option in ("--allocators", "--allocator"):
        check_refused(dryrun(option, "native,cudaMallocAsync", "train.py", cwd=script),
                      "unknown allocator 'cudamallocasync'")
