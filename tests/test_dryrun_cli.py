"""`python -m vramguard dryrun` on input it cannot run: one line on
stderr, status 2, before anything starts (no PyTorch, no phantom needed)."""
import json
import subprocess
import sys

import pytest

from vramguard.dryrun import DryRunInputError, parse_allocators, parse_sweep


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


def test_remedies_and_min_memory_do_not_combine(script):
    check_refused(dryrun("--remedies", "--min-memory", "train.py", cwd=script),
                  "--remedies and --min-memory cannot be combined: run --min-memory on its own")


def test_remedies_is_true_or_false():
    from vramguard.dryrun import DryRunInputError, dryrun as api

    with pytest.raises(DryRunInputError, match=r"^remedies= is True or False, got 'yes'$"):
        api("train.py", remedies="yes")


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
    from vramguard.dryrun.child.cells import notebook_cells

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
    from vramguard.dryrun.child.cells import notebook_cells

    code = ("%time out = (2,\n    3)\nfor i in range(2):\n    %timeit -n 10 -r1 w = i * 5\n"
            "%prun -s cumtime v = 7\n%time\n")
    cells, notes = notebook_cells(notebook(tmp_path, code))
    namespace = {}
    exec(compile(cells[0][1], "cell", "exec"), namespace)
    assert (namespace["out"], namespace["w"], namespace["v"]) == ((2, 3), 5, 7)
    assert notes == ["cell 1, line 6: %time"]


def test_writefile_a_appends(tmp_path, monkeypatch):
    from vramguard.dryrun.child.cells import run_notebook

    monkeypatch.chdir(tmp_path)
    path = notebook(tmp_path, "%%writefile out.txt\nfirst", "%%writefile -a out.txt\nsecond",
                    "%%writefile --append out.txt\nthird", "text = open('out.txt').read()")
    try:
        run_notebook(str(path))
    finally:
        # The dry run's child makes IPython's one shell, and its process ends with it; in
        # this process the shell would stay, and later tests would run "in IPython".
        ipython = __import__("sys").modules.get("IPython.core.interactiveshell")
        if ipython is not None:
            ipython.InteractiveShell.clear_instance()
    assert (tmp_path / "out.txt").read_text() == "first\nsecond\nthird\n"


# ------------------------------------------------------------------ safe to run: refused before anything runs


def _read_only(folder, cmd):
    """`cmd` run where `folder` cannot be written: its mode 0555, or, for
    root (whom modes do not stop), a read-only bind mount of it in a mount
    namespace of its own (unshare); None where neither can be had."""
    import os
    import shutil

    if os.geteuid() != 0:
        folder.chmod(0o555)
        return cmd
    if shutil.which("unshare") is None:
        return None
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        return None
    quoted = " ".join(f"'{a}'" for a in cmd)
    return ["unshare", "-rm", "sh", "-c",
            f"mount --bind '{folder}' '{folder}' && mount -o remount,ro,bind '{folder}' && exec {quoted}"]


def test_a_read_only_out_is_one_line_before_any_run(script):
    """The documented one-line form, said before the phantom is built or
    any run starts (not a raw errno once the first run has started)."""
    ro = script / "ro"
    ro.mkdir()
    cmd = _read_only(ro, [sys.executable, "-m", "vramguard", "dryrun", "--out", "ro", "train.py"])
    if cmd is None:
        pytest.skip("no way to make a read-only folder here (root, without unshare)")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=script, timeout=60)
    check_refused(proc, "vramguard: --out ro: cannot write there: the dry run makes a folder of its own in it "
                        "for its logs, figures and snapshots\n")
    assert list(ro.iterdir()) == []
    # a folder to be made under a read-only one: the one that is there is named
    cmd = _read_only(ro, [sys.executable, "-m", "vramguard", "dryrun", "--out", "ro/new/deeper", "train.py"])
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=script, timeout=60)
    check_refused(proc, f"vramguard: --out ro/new/deeper: cannot write there ({ro}, where it would be made)")


def test_runs_at_once_in_one_folder_are_refused(script):
    """--jobs 2 with the runs sharing the folder the script runs in (its
    file I/O is real): refused in one line; the Python API names its own
    arguments."""
    from vramguard.dryrun import dryrun as api_dryrun

    said = ("vramguard: --jobs 2 runs allocators at once, and a script's file I/O is real: give each run a folder "
            "of its own (--cwd runs/{allocator}, made when missing), or leave --jobs out to run one at a time\n")
    check_refused(dryrun("--jobs", "2", "train.py", cwd=script), said)
    check_refused(dryrun("--jobs", "2", "--cwd", ".", "train.py", cwd=script), said)
    with pytest.raises(DryRunInputError) as refused:
        api_dryrun(script / "train.py", jobs=3, allocators="native,vramguard")
    assert str(refused.value) == (
        "jobs=3 runs allocators at once, and a script's file I/O is real: give each run a folder of its own "
        "(cwd='runs/{allocator}', made when missing), or leave jobs= out to run one at a time")
    # one allocator: nothing runs at once, nothing to refuse (it goes on to want PyTorch, absent here)
    proc = dryrun("--jobs", "2", "--allocator", "native", "train.py", cwd=script)
    assert "--jobs" not in proc.stderr, proc.stderr


def test_a_per_allocator_cwd_needs_its_parent(script):
    check_refused(dryrun("--jobs", "2", "--cwd", "nothere/{allocator}", "train.py", cwd=script),
                  f"vramguard: --cwd nothere/{{allocator}}: No such directory ({script / 'nothere'})\n")


def test_one_run_at_a_time_by_default(monkeypatch):
    from vramguard.dryrun.checks import default_jobs
    from vramguard.dryrun.contract import ALLOCATORS

    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert default_jobs(ALLOCATORS) == 1


@pytest.mark.parametrize("value, said", [("0", "expected a number of seconds above 0, got '0'"),
                                          ("-1", "expected a number of seconds above 0, got '-1'"),
                                          ("soon", "expected a number of seconds, got 'soon'"),
                                          ("inf", "expected a number of seconds above 0, got 'inf'")])
def test_a_bad_timeout(script, value, said):
    check_refused(dryrun(f"--timeout={value}", "train.py", cwd=script),
                  f"vramguard: argument --timeout: {said} (see: python -m vramguard dryrun --help)\n")


def test_usage_errors_point_at_the_help_that_lists_the_options(script):
    """The dry run's usage errors point at `dryrun --help`, which lists its
    options; the top level's at the top level's help."""
    check_refused(dryrun("--jobs", "x", "train.py", cwd=script),
                  "vramguard: argument --jobs: expected a positive integer, got 'x' "
                  "(see: python -m vramguard dryrun --help)\n")
    proc = subprocess.run([sys.executable, "-m", "vramguard", "nosuch"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.endswith("(see: python -m vramguard --help)\n"), proc.stderr
    helped = subprocess.run([sys.executable, "-m", "vramguard", "dryrun", "--help"], capture_output=True,
                            text=True, timeout=60, env=dict(__import__("os").environ, COLUMNS="200"))
    assert helped.returncode == 0
    text = " ".join(helped.stdout.split())
    for option in ("--timeout SECONDS", "--jobs JOBS", "--out OUT", "--cwd CWD", "--nproc NPROC"):
        assert option in text, option
    assert "a run's stdin is /dev/null (input piped to the dry run is not passed on)" in text
    assert "124 a run past --timeout, 130 Ctrl-C, 143 SIGTERM" in text


@pytest.mark.parametrize("kwargs, cli, api", [
    ({"nproc": 0}, ["--nproc", "17"], "nproc= must be a whole number from 1 to 16, got 0"),
    ({"steps": 0}, None, "steps= must be a whole number above 0, got 0"),
    ({"timeout": -1}, None, "timeout= must be a number of seconds above 0, got -1"),
    ({"memory": "lots"}, ["--memory", "lots"], "memory='lots': "),
    ({"sweep": "BATCH"}, ["--sweep", "BATCH"], "sweep='BATCH': expected NAME=V1,V2,..."),
    ({"min_memory": True, "sweep": "B=1,2"}, ["--min-memory", "--sweep", "B=1,2"],
     "min_memory= and sweep= cannot be combined: run min_memory= on one value"),
    ({"cwd": "nothere"}, ["--cwd", "nothere"], "cwd='nothere': No such directory"),
])
def test_the_python_api_names_its_arguments_and_the_cli_its_flags(script, kwargs, cli, api):
    from vramguard.dryrun import dryrun as api_dryrun

    with pytest.raises(DryRunInputError) as refused:
        api_dryrun(script / "train.py", **kwargs)
    assert str(refused.value).startswith(api), str(refused.value)
    assert "--" not in str(refused.value)
    if cli is not None:
        proc = dryrun(*cli, "train.py", cwd=script)
        assert proc.returncode == 2 and " --" + cli[0].lstrip("-") in " " + proc.stderr, proc.stderr
        assert "=" not in proc.stderr.split(":")[1], proc.stderr  # the flag, not the keyword


def test_a_platform_without_the_phantom_says_so_in_one_line(script, monkeypatch):
    from vramguard.dryrun import dryrun as api_dryrun

    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(DryRunInputError) as refused:
        api_dryrun(script / "train.py")
    assert str(refused.value) == (
        "a dry run needs Linux and PyTorch's CUDA build (pip's Linux wheels), and this is darwin: run it in a "
        "Linux container or a Colab CPU runtime (docs/would-it-fit.md, 'Where it runs')")


def test_without_ipython_a_notebooks_cells_run_as_plain_python(tmp_path, monkeypatch, capsys):
    """Where IPython is not installed the cells run as plain Python, and the
    run says what that leaves out."""
    from vramguard.dryrun.child import cells as child, notebook_shell

    monkeypatch.setattr(notebook_shell, "available", lambda: False)
    monkeypatch.chdir(tmp_path)
    nb = {"cells": [{"cell_type": "code", "source": "x = 1\n!ls\nprint('x is', x)", "metadata": {},
                     "outputs": [], "execution_count": None}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
    child.run_notebook(str(tmp_path / "nb.ipynb"))
    out, err = capsys.readouterr()
    assert out == "x is 1\n"
    assert err == ("vramguard dryrun: IPython is not installed in this Python: the notebook's cells run as plain "
                   "Python, where get_ipython() is not defined, and its magics and shell lines are not run: "
                   "cell 1, line 2: !ls\n")
    (tmp_path / "nb.ipynb").write_text(json.dumps(dict(nb, cells=[dict(nb["cells"][0], source="print(2)")])))
    child.run_notebook(str(tmp_path / "nb.ipynb"))
    out, err = capsys.readouterr()
    assert (out, err) == ("2\n", "vramguard dryrun: IPython is not installed in this Python: the notebook's cells "
                                  "run as plain Python, where get_ipython() is not defined\n")
# ------------------------------------------------------------------ verdicts and exit codes


def test_help_lists_every_exit_code_of_the_dry_run():
    from vramguard.dryrun import contract as d

    proc = subprocess.run([sys.executable, "-m", "vramguard", "dryrun", "--help"], capture_output=True,
                          text=True, timeout=60)
    said = " ".join(proc.stdout.split())
    for code, meaning in [(d.EXIT_FITS, "it fits"), (d.EXIT_DOES_NOT_FIT, "it does not fit"), (2, "bad input"),
                          (d.EXIT_SCRIPT_FAILED, "the script failed for another reason (its own exit status "
                                                 "is in the report and the JSON)"),
                          (d.EXIT_NEVER_USED_GPU, "the program never used the GPU"),
                          (d.EXIT_PHANTOM_FAILED, "the phantom GPU could not run it"), (130, "Ctrl-C")]:
        assert f"{code} {meaning}" in said, (code, said)


def _run(name, **figures):
    run = {"allocator": name, "peak_allocated_bytes": 1 << 20, "peak_reserved_bytes": 2 << 20, "fits": True,
           "first_oom": None, "error": None, "exit_status": 0, "used_gpu": True}
    run.update(figures)
    return run


def _result(*runs):
    from vramguard.dryrun import DryRunResult

    result = DryRunResult(gpu="T4", device_bytes=15828320256, context_bytes=400 << 20, script="s.py",
                          allocators=[r["allocator"] for r in runs])
    for r in runs:
        result[r["allocator"]] = r
    return result


@pytest.mark.parametrize("runs, code, head", [
    ([_run("native"), _run("vramguard")], 0, "Fits on a T4 with every allocator tried."),
    ([_run("native", fits=False, first_oom={"line": "s.py:3", "request_bytes": 1 << 30})], 1,
     "Does not fit on a T4 with any allocator tried."),
    ([_run("native", fits=None, used_gpu=False)], 4,
     "The program never used the GPU: it allocated nothing on the phantom T4 and launched no kernel, "
     "so whether it fits is not known."),
    ([_run("native", fits=None, error="SystemExit: 3", error_at="s.py:4", exit_status=3)], 3,
     "The script failed before its end (exit status 3): whether it fits is not known."),
    ([_run("native", fits=None, error="ValueError: x", exit_status=1),
      _run("vramguard", fits=None, error="SystemExit: 3", exit_status=3)], 3,
     "The script failed before its end (exit statuses 1 and 3): whether it fits is not known."),
    ([_run("native", fits=None, error="RuntimeError: CUDA error: operation not supported", exit_status=1,
           phantom_unsupported={"calls": 1, "last": "cudaMallocManaged", "caused_failure": True})], 5,
     "The phantom GPU could not run the program (it does not model cudaMallocManaged): whether it fits is "
     "not known."),
    # the deciding run is vramguard's: native's failure is said, not the verdict
    ([_run("native", fits=None, error="ValueError: x", exit_status=1), _run("vramguard")], 0,
     "Fits on a T4 with vramguard. With native the script failed before its end (below)."),
    ([_run("native", fits=None, used_gpu=False), _run("vramguard", fits=None, used_gpu=False)], 4,
     "The program never used the GPU"),
])
def test_each_verdict_has_its_own_exit_code(runs, code, head):
    from vramguard.dryrun import VERDICTS, exit_status, format_report

    result = _result(*runs)
    assert exit_status(result) == code and code in VERDICTS
    text = format_report(result)
    assert head in text, text
    if code == 4:
        assert "Fits" not in text and "yes" not in text


@pytest.mark.parametrize("calls, said", [(1, "1 unsupported call in the run"), (3, "3 unsupported calls in the run")])
def test_the_phantoms_failure_names_its_call_and_counts(calls, said):
    from vramguard.dryrun import format_report

    gap = {"calls": calls, "last": "cudaIpcGetMemHandle", "caused_failure": True}
    text = format_report(_result(_run("native", fits=None, error="AcceleratorError: CUDA error: operation not "
                                      "supported", error_at="s.py:8", exit_status=1, phantom_unsupported=gap)))
    assert ("native: the run failed in the phantom: AcceleratorError: CUDA error: operation not supported, at "
            "s.py:8 (exit status 1).") in text
    assert ("That failure is the phantom's, not the script's: the phantom GPU does not model "
            f"cudaIpcGetMemHandle ({said}), which returned the error.") in text


def test_unsupported_calls_the_script_got_past_are_not_the_cause():
    """A stub's error the script caught, then its own failure: the script's."""
    from vramguard.dryrun import exit_status, format_report

    gap = {"calls": 1, "last": "cudaIpcGetMemHandle", "caused_failure": False}
    result = _result(_run("native", fits=None, error="ValueError: bad", exit_status=1, phantom_unsupported=gap))
    assert exit_status(result) == 3
    assert "phantom" not in format_report(result).split("\n", 1)[1]


def test_min_memory_of_a_program_that_never_used_the_gpu_is_not_a_failure():
    from vramguard.dryrun import format_report

    result = _result(_run("native", fits=None, used_gpu=False, min_memory_bytes=None))
    result["min_memory"] = True
    text = format_report(result)
    assert "Smallest device: not known: the program never used the GPU." in text
    assert "failed" not in text and "none found" not in text


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
    from vramguard.dryrun.checks import check_placeholders as _check_placeholders

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
    # the Python API's name, and the old one (Python 3.13's argparse names the metavar once)
    assert ("--allocators NAMES, --allocator NAMES" in text or "--allocators, --allocator NAMES" in text)
    assert "one --sweep at a time" in text


def test_allocators_is_the_option_and_allocator_still_works(script):
    for option in ("--allocators", "--allocator"):
        check_refused(dryrun(option, "native,cudaMallocAsync", "train.py", cwd=script),
                      "unknown allocator 'cudamallocasync'")


@pytest.mark.parametrize("gpu, device, said", [
    ("RTX-3060", 12587106304, "(the RTX-3060 asked about is the smallest preset that holds it)"),
    ("T4", 15828320256, "(the smallest preset that holds it: RTX-3060)"),
])
def test_the_smallest_preset_is_named_or_said_to_be_the_one_asked_about(gpu, device, said):
    from vramguard.dryrun import format_report

    result = _result(_run("native", min_memory_bytes=448 << 20))
    result.update(gpu=gpu, device_bytes=device, min_memory=True)
    assert f"Smallest device: 448.00 MiB with native {said}, exact to 16 MiB" in format_report(result)
