"""`python -m vramguard dryrun` and vramguard.dryrun() end to end: the real
PyTorch in children on the phantom GPU (csrc/phantom), once per allocator.

The scripts here allocate with torch.empty and elementwise ops, which the
phantom runs whatever the state of its cuBLAS and cuDNN; the model-based
cases (examples/) wait for matmul on the phantom and skip until then. Each
case keeps its runs few and small: a child costs about two seconds (its
PyTorch import), so the allocators a case does not need are left out and
the devices are small (--memory).
"""
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hookrun import SHARED_CACHE

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
GiB = 1 << 30
CONTEXT = 400 * MiB  # what a dry run's CUDA context holds by default


def _env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "VG_FAKECUDA_DEVICES") and not k.startswith("VRAMGUARD_")}
    env["XDG_CACHE_HOME"] = str(SHARED_CACHE)  # the out-of-memory shim and the phantom, built once
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python")] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    return env


def write(tmp_path, name, code):
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


def dryrun(tmp_path, *args, expect=None):
    """Runs the CLI with --json in tmp_path; returns (the object, stderr)."""
    cmd = [sys.executable, "-m", "vramguard", "dryrun", "--json", "--out", str(tmp_path / "out"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=300)
    if expect is not None:
        assert proc.returncode == expect, f"exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    assert proc.stdout.count("\n") == 1, proc.stdout + proc.stderr  # one JSON object, nothing else
    return json.loads(proc.stdout), proc.stderr


def report(result):
    from vramguard.dryrun import format_report

    return format_report(result)


# ------------------------------------------------------------------ the flow


@pytest.mark.torch_version
def test_a_script_end_to_end(tmp_path):
    """torch.empty and elementwise ops: the same peak allocated to the byte
    under the three allocators, the JSON's keys, the script's arguments and
    output passed through, a snapshot per run, the table."""
    write(tmp_path, "train.py", """
        import sys, torch
        MiB = 1 << 20
        n = int(sys.argv[2])
        w = torch.empty(n * MiB, dtype=torch.uint8, device="cuda")
        x = torch.zeros(3 * MiB + 100, device="cuda") + 1        # an elementwise op
        del x
        y = torch.empty(7 * MiB, dtype=torch.uint8, device="cuda")
        print("hello from the script", sys.argv[1:])
    """)
    result, stderr = dryrun(tmp_path, "--gpu", "T4", "--memory", "1GiB", "train.py", "--size", "96", expect=0)
    assert result["gpu"] == "T4" and result["torch"].startswith("2.")
    assert result["host_peak_rss_bytes"] > 0 and result["fits"] is True
    peaks = set()
    for name in ("native", "expandable", "vramguard"):
        run = result[name]
        assert run["fits"] is True and run["first_oom"] is None and run["exit_status"] == 0, run
        assert run["peak_reserved_bytes"] >= run["peak_allocated_bytes"] > 96 * MiB
        assert run["context_bytes"] == CONTEXT
        peaks.add(run["peak_allocated_bytes"])
        assert Path(run["snapshot"]).is_file()
        assert f"[{name}] hello from the script ['--size', '96']" in stderr
    assert len(peaks) == 1, peaks  # to the byte
    # 96 MiB + the zeros (12 MiB + 400 bytes, 512-rounded) + its +1 result
    assert peaks == {96 * MiB + 2 * (12 * MiB + 512)}
    with open(result["native"]["snapshot"], "rb") as f:
        snap = pickle.load(f)
    assert any(e["action"] == "alloc" for e in snap["device_traces"][0])
    text = report(result)
    assert "native" in text and "Fits on a T4 of 1.00 GiB with every allocator tried." in text
    assert "120.00 MiB" in text
    assert result["cwd"] == str(tmp_path)
    assert text.count(f"The script ran in {tmp_path} with real file I/O") == 1  # once, not per run
    assert "--cwd DIR runs it elsewhere" in text


def test_the_python_api_returns_a_result_with_html(tmp_path, monkeypatch):
    import io

    import vramguard

    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    write(tmp_path, "s.py", """
        import torch
        x = torch.empty(10 << 20, dtype=torch.uint8, device="cuda")
        print("printed")
    """)
    out, err = io.StringIO(), io.StringIO()
    result = vramguard.dryrun(str(tmp_path / "s.py"), gpu="T4", allocators="native", memory="1GiB",
                              out=str(tmp_path / "out"), stdout=out, stderr=err)
    assert isinstance(result, vramguard.DryRunResult)
    assert result.fits is True and result.native["peak_allocated_bytes"] == 10 * MiB
    assert result["native"] is result.native and "vramguard" not in result
    assert "[native] printed" in out.getvalue() and "native: running" in err.getvalue()
    html = result._repr_html_()
    assert "<table" in html and "10.00 MiB" in html and "FITS" in html
    assert str(result).startswith("vramguard dryrun: ")


@pytest.mark.torch_version
def test_a_notebook(tmp_path):
    """Code cells in order in an IPython shell: line and cell magics and
    shell lines run as IPython runs them; the out-of-memory named by cell
    and line. (Without IPython: test_dryrun_cli.)"""
    cells = [
        "%env VG_NOTEBOOK_CELL=one\nimport torch\nMiB = (1 <<\n    20)\n%time mib = MiB",
        "!echo shell line ran $VG_NOTEBOOK_CELL\nx = torch.empty(100 * MiB, dtype=torch.uint8, device='cuda')\n"
        "print('cell 2 ran')",
        "%%bash\necho bash cell ran",
        "def more():\n    return torch.empty(2 << 30, dtype=torch.uint8, device='cuda')\ny = more()",
    ]
    nb = {"cells": [{"cell_type": "markdown", "source": ["# a title"], "metadata": {}}]
          + [{"cell_type": "code", "source": c.splitlines(True), "metadata": {}, "outputs": [],
              "execution_count": None} for c in cells],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
    result, stderr = dryrun(tmp_path, "--memory", "1GiB", "--allocator", "native,vramguard", "--no-snapshot",
                            "nb.ipynb", expect=1)
    for name in ("native", "vramguard"):
        run = result[name]
        assert run["fits"] is False and run["peak_allocated_bytes"] == 100 * MiB
        assert run["first_oom"]["line"] == "nb.ipynb[cell 4]:2", run["first_oom"]
        assert run["first_oom"]["request_bytes"] == 2 * GiB
        assert f"[{name}] cell 2 ran" in stderr
        assert f"[{name}] shell line ran one\n" in stderr and f"[{name}] bash cell ran\n" in stderr
    assert "not run" not in stderr and "skipped" not in stderr


def test_a_sweep_keeps_the_largest_batch_that_fits(tmp_path):
    """64 MiB + BATCH x 200 MiB on a 1 GiB device whose context holds
    400 MiB: 624 MiB free, so BATCH=2 fits (464 MiB) and 3 (664 MiB) does
    not; 4 is never tried. The value goes into the arguments."""
    write(tmp_path, "sweep.py", """
        import os, sys, torch
        MiB = 1 << 20
        batch = int(sys.argv[2]) if len(sys.argv) > 2 else int(os.environ["BATCH"])
        print("batch", batch)
        w = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        act = torch.empty(batch * 200 * MiB, dtype=torch.uint8, device="cuda")
    """)
    result, stderr = dryrun(tmp_path, "--memory", "1GiB", "--allocator", "native,vramguard", "--no-snapshot",
                            "--sweep", "BATCH=2,3,4", "sweep.py", "--batch", "{BATCH}", expect=0)
    assert result["sweep"] == {"name": "BATCH", "values": [2, 3, 4]}
    for name in ("native", "vramguard"):
        run = result[name]
        assert run["largest_batch"] == 2 and run["fits"] is True
        assert run["largest_value"] == 2 and run["sweep_name"] == "BATCH"
        assert [s["value"] for s in run["sweep"]] == [2, 3]
        assert [s["fits"] for s in run["sweep"]] == [True, False]
        assert run["peak_allocated_bytes"] == 464 * MiB
        assert run["first_oom"]["line"] == "sweep.py:7" and run["first_oom"]["request_bytes"] == 600 * MiB
        assert run["first_oom"]["value"] == 3
        assert f"[{name} BATCH=3] batch 3" in stderr and "batch 4" not in stderr
    assert "largest BATCH" in report(result)


def test_a_sweep_sets_the_variable_when_no_argument_names_it(tmp_path):
    write(tmp_path, "sweep.py", """
        import os, torch
        act = torch.empty(int(os.environ["BATCH"]) * (300 << 20), dtype=torch.uint8, device="cuda")
    """)
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocator", "native", "--no-snapshot",
                       "--sweep", "BATCH=2,3", "sweep.py", expect=0)
    assert result["native"]["largest_batch"] == 2


def test_an_out_of_memory_names_the_line_and_the_request(tmp_path):
    write(tmp_path, "oom.py", """
        import torch
        GiB = 1 << 30

        def grow(n):
            return [torch.empty(GiB // 2, dtype=torch.uint8, device="cuda") for _ in range(n)]

        keep = grow(2)
        big = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    """)
    result, stderr = dryrun(tmp_path, "--memory", "2GiB", "--no-snapshot", "oom.py", expect=1)
    assert result["fits"] is False
    for name in ("native", "expandable", "vramguard"):
        run = result[name]
        assert run["fits"] is False and run["exit_status"] == 1 and run["error"] is None
        assert run["first_oom"]["line"] == "oom.py:9", run["first_oom"]
        assert run["first_oom"]["request_bytes"] == GiB
        assert "out of memory" in run["first_oom"]["message"].lower()
        assert run["peak_allocated_bytes"] == GiB
    text = report(result)
    assert "oom.py:9 (1.00 GiB)" in text
    assert "Does not fit on a T4 of 2.00 GiB with any allocator tried." in text


def test_a_crashing_script_passes_its_error_and_status_through(tmp_path):
    write(tmp_path, "crash.py", """
        import torch
        x = torch.empty(1 << 20, device="cuda")

        def step():
            raise ValueError("the data loader broke")

        step()
    """)
    result, stderr = dryrun(tmp_path, "--allocator", "native", "--no-snapshot", "crash.py", expect=3)
    run = result["native"]
    assert run["error"] == "ValueError: the data loader broke" and run["exit_status"] == 1
    assert run["fits"] is None and run["first_oom"] is None and run["peak_allocated_bytes"] == 4 * MiB
    assert "Traceback (most recent call last)" in stderr and 'crash.py", line 6, in step' in stderr
    assert "_dryrun_child" not in stderr and "runpy" not in stderr  # the runner's frames are left out
    assert run["error_at"] == "crash.py:6" and result["verdict"] == "script failed"
    assert "the script failed: ValueError: the data loader broke, at crash.py:6 (exit status 1)" in report(result)
    write(tmp_path, "exits.py", """
        import sys, torch
        x = torch.empty(1 << 20, device="cuda")
        sys.exit(3)
    """)
    result, _ = dryrun(tmp_path, "--allocator", "native", "--no-snapshot", "exits.py", expect=3)
    assert result["native"]["exit_status"] == 3 and result["native"]["fits"] is None


@pytest.mark.torch_version
def test_reading_device_values_and_extensions_add_notes(tmp_path):
    write(tmp_path, "reads.py", """
        import sys, types, torch
        sys.modules["flash_attn"] = types.ModuleType("flash_attn")   # as if the library were loaded
        x = torch.ones(4, device="cuda") * 3
        if x.sum().item() > 0:                 # zeros on a phantom: not taken
            y = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    """)
    result, _ = dryrun(tmp_path, "--allocator", "native", "--no-snapshot", "reads.py", expect=0)
    if result["native"]["d2h_reads"] is None:
        pytest.skip("this phantom counts no device-to-host reads (vg_fakecuda_d2h_reads)")
    assert result["native"]["d2h_reads"] >= 1 and result["d2h_reads"] >= 1
    assert result["native"]["peak_allocated_bytes"] < 1 << 20  # the branch a real run takes was not
    text = report(result)
    assert ("values read back from a phantom device are zeros; data-dependent shapes and control flow may "
            "differ from a real run") in text
    # a library loaded whose kernels never ran is not named (test_extension_launches.py)
    assert result["native"]["extensions"] == {} and "Custom CUDA extensions" not in text


def test_min_memory_of_a_known_sequence(tmp_path):
    """30 MiB, freed, then 40 MiB: PyTorch's cache holds 70 MiB at the
    peak, but on a smaller device its out-of-memory path frees the cached
    30 MiB and retries, so the smallest device is the context + 40 MiB,
    rounded up to 16 MiB: 448 MiB, for both allocators."""
    write(tmp_path, "seq.py", """
        import torch
        MiB = 1 << 20
        a = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        del a
        b = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
    """)
    result, stderr = dryrun(tmp_path, "--memory", "2GiB", "--allocator", "native,vramguard", "--no-snapshot",
                            "--min-memory", "seq.py", expect=0)
    assert result["native"]["peak_reserved_bytes"] == 70 * MiB
    for name in ("native", "vramguard"):
        assert result[name]["min_memory_bytes"] == 448 * MiB, (name, result[name])
    assert "Smallest device: 448.00 MiB" in report(result)


def test_a_sweep_stops_where_the_script_fails_otherwise(tmp_path):
    """A run that fails for a reason other than memory says nothing of the
    values above it: the sweep stops there, with that run's error and its
    status (not 'largest BATCH=2', exit 0)."""
    write(tmp_path, "sweep.py", """
        import os, sys, torch
        batch = int(os.environ["BATCH"])
        x = torch.empty(batch << 20, dtype=torch.uint8, device="cuda")
        if batch == 4:
            raise ValueError("no batch of 4")
        if batch == 8:
            sys.exit(3)
    """)
    result, stderr = dryrun(tmp_path, "--memory", "1GiB", "--allocator", "native", "--no-snapshot",
                            "--sweep", "BATCH=1,2,4,8,16", "sweep.py", expect=3)
    run = result["native"]
    assert run["fits"] is None and result["fits"] is None
    assert run["largest_batch"] is None and run["largest_value"] is None
    assert run["error"] == "ValueError: no batch of 4" and run["exit_status"] == 1
    assert run["failed_at"] == {"value": 4} and [s["value"] for s in run["sweep"]] == [4]
    text = report(result)
    assert "native: not known, the script failed at BATCH=4" in text
    assert "native: the script failed at BATCH=4: ValueError: no batch of 4, at sweep.py:6 (exit status 1)." in text
    # 4 fits (a larger device than it needs), then 8 exits 3: the status is that run's
    write(tmp_path, "sweep.py", (tmp_path / "sweep.py").read_text().replace("batch == 4", "batch == 5"))
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocator", "native", "--no-snapshot",
                       "--sweep", "BATCH=1,2,4,8,16", "sweep.py", expect=3)
    run = result["native"]
    assert [(s["value"], s["fits"]) for s in run["sweep"]] == [(4, True), (8, None)]
    assert run["fits"] is None and run["error"] == "SystemExit: 3" and run["exit_status"] == 3
    assert run["failed_at"] == {"value": 8} and run["largest_batch"] is None


def test_min_memory_stops_where_the_script_fails_otherwise(tmp_path):
    """On a smaller device the script exits 5 (not an out-of-memory): the
    search stops there, and the status is that run's (not 'the whole card
    is the smallest', exit 0)."""
    write(tmp_path, "picky.py", """
        import sys, torch
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        if torch.cuda.get_device_properties(0).total_memory < (2 << 30):
            print("this device is too small for my liking")
            sys.exit(5)
    """)
    result, stderr = dryrun(tmp_path, "--memory", "2GiB", "--allocator", "native", "--no-snapshot",
                            "--min-memory", "picky.py", expect=3)
    run = result["native"]
    assert run["fits"] is None and run["min_memory_bytes"] is None
    assert run["error"] == "SystemExit: 5" and run["exit_status"] == 5
    assert run["failed_at"]["memory_bytes"] < 2 << 30
    text = report(result)
    assert "Smallest device: not known: the search stopped where the script failed" in text
    assert "(--min-memory): SystemExit: 5, at picky.py:6 (exit status 5)." in text


@pytest.mark.parametrize("code, error, at", [
    ("os._exit(130)", "os._exit(130)", "ends.py:4"),
    ("raise KeyboardInterrupt", "KeyboardInterrupt", "ends.py:4"),
])
def test_a_script_that_ends_itself_is_not_a_ctrl_c(tmp_path, code, error, at):
    """Only the dry run's own cancellation is an interruption: a script's
    status 130 or KeyboardInterrupt is its failure, reported with its
    status; the dry run's is "the script failed"."""
    write(tmp_path, "ends.py", f"""
        import os, torch
        x = torch.empty(1 << 20, device="cuda")
        {code}
    """)
    result, stderr = dryrun(tmp_path, "--allocator", "native", "--no-snapshot", "ends.py", expect=3)
    assert "vramguard: interrupted" not in stderr
    run = result["native"]
    assert run["fits"] is None and run["error"] == error and run["error_at"] == at
    assert run["exit_status"] == 130 and run["peak_allocated_bytes"] == 4 * MiB
    text = report(result)
    assert "The script failed before its end (exit status 130): whether it fits is not known." in text
    where = f", at {at}" if at else ""
    assert f"native: the script failed: {error}{where} (exit status 130)." in text


@pytest.mark.torch_version
def test_the_users_allocator_settings_and_preloads_are_kept(tmp_path):
    write(tmp_path, "env.py", """
        import os, torch
        x = torch.empty(1 << 20, device="cuda")
        print("conf", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
        print("preload", os.environ["LD_PRELOAD"].split()[0].rsplit("/", 1)[-1], os.environ["LD_PRELOAD"].split()[-1])
    """)
    env = dict(_env(), PYTORCH_CUDA_ALLOC_CONF="expandable_segments:False,max_split_size_mb:128",
               LD_PRELOAD="libm.so.6")
    cmd = [sys.executable, "-m", "vramguard", "dryrun", "--json", "--no-snapshot", "--out", str(tmp_path / "out"),
           "--allocator", "native,expandable", "env.py"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert "[native] conf expandable_segments:False,max_split_size_mb:128" in proc.stderr
    assert "[expandable] conf max_split_size_mb:128,expandable_segments:True" in proc.stderr
    assert proc.stderr.count(" libm.so.6\n") == 2 and "[native] preload libm.so.6" not in proc.stderr
    assert result["user_alloc_conf"] == "expandable_segments:False,max_split_size_mb:128"
    assert result["expandable"]["alloc_conf_set"] == "max_split_size_mb:128,expandable_segments:True"
    text = report(result)
    assert ("Your PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False,max_split_size_mb:128 was applied: "
            "native ran with expandable_segments:False,max_split_size_mb:128; expandable ran with "
            "max_split_size_mb:128,expandable_segments:True.") in text
    assert "sets PYTORCH_CUDA_ALLOC_CONF itself" not in text


def test_cwd_runs_the_script_elsewhere(tmp_path):
    write(tmp_path, "save.py", """
        import torch
        torch.save(torch.ones(4, device="cuda"), "ckpt.pt")
    """)
    (tmp_path / "ckpt.pt").write_text("the real checkpoint")
    (tmp_path / "scratch").mkdir()
    result, _ = dryrun(tmp_path, "--allocator", "native", "--no-snapshot", "--cwd", "scratch", "save.py", expect=0)
    assert (tmp_path / "ckpt.pt").read_text() == "the real checkpoint"
    assert (tmp_path / "scratch" / "ckpt.pt").is_file()
    assert result["cwd"] == str(tmp_path / "scratch")
    assert f"The script ran in {tmp_path / 'scratch'} (--cwd) with real file I/O" in report(result)


def test_no_directory_is_left_when_the_phantom_cannot_be_had(tmp_path):
    """The phantom's environment comes first: where it cannot be built
    (here an unwritable cache) neither --out nor a temporary directory is
    made."""
    write(tmp_path, "s.py", "import torch\n")
    (tmp_path / "not-a-dir").write_text("")
    (tmp_path / "tmp").mkdir()
    env = dict(_env(), XDG_CACHE_HOME=str(tmp_path / "not-a-dir"), TMPDIR=str(tmp_path / "tmp"))
    for out in (["--out", "out"], []):
        proc = subprocess.run([sys.executable, "-m", "vramguard", "dryrun", *out, "s.py"], capture_output=True,
                              text=True, cwd=tmp_path, env=env, timeout=300)
        assert proc.returncode == 2 and "phantom GPU" in proc.stderr, proc.stderr
        assert not (tmp_path / "out").exists() and list((tmp_path / "tmp").iterdir()) == []


def test_a_temporary_directory_goes_when_the_dry_run_fails_before_any_run(tmp_path, monkeypatch):
    import tempfile

    import vramguard
    from vramguard.dryrun.runner import Runner

    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    write(tmp_path, "s.py", "import torch\n")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Runner, "run", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        vramguard.dryrun(str(tmp_path / "s.py"), allocators="native")
    assert list((tmp_path / "tmp").iterdir()) == []


def _gone(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next(line for line in f if line.startswith("State:"))
    except (FileNotFoundError, StopIteration):
        return True
    return "Z" in state.split()[1]  # a zombie left to init: dead


def test_ctrl_c_ends_the_run_and_its_children(tmp_path):
    write(tmp_path, "slow.py", """
        import os, subprocess, time, torch
        x = torch.empty(1 << 20, device="cuda")
        p = subprocess.Popen(["sleep", "60"])
        print("pids", os.getpid(), p.pid, flush=True)
        time.sleep(60)
    """)
    cmd = [sys.executable, "-m", "vramguard", "dryrun", "--no-snapshot", "--allocator", "native", "slow.py"]
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=dict(_env(), TMPDIR=str(tmp_path / "tmp")), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        assert line.startswith("[native] pids"), line + proc.stderr.read()
        pids = [int(p) for p in line.split()[2:]]
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert time.monotonic() - started < 10
    assert "vramguard: interrupted" in err and "Traceback" not in err
    # the temporary directory the report would have named is named here
    kept = list((tmp_path / "tmp").iterdir())
    assert len(kept) == 1 and f"the logs so far are in {kept[0]}" in err, err
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), pids


# ------------------------------------------------------------------ models (they need matmul)

_preload = []


def phantom_preload():
    """The phantom's libraries, built once into the tests' cache (as a dry
    run builds them on first use)."""
    if not _preload:
        code = "from vramguard.phantom.gpu import preload; print(preload())"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=600)
        assert proc.returncode == 0, proc.stderr
        _preload.append(proc.stdout.strip())
    return _preload[0]


@pytest.fixture(autouse=True, scope="module")
def built_phantom():
    phantom_preload()  # its build, once, outside any one case's time


def matmul_works():
    """Whether the phantom has its cuBLAS stand-in (built with it: matmuls run)."""
    return "libcublas" in phantom_preload()


@pytest.fixture
def needs_matmul():
    if not matmul_works():
        pytest.skip("the phantom has no cuBLAS yet: matmuls fail (CUBLAS_STATUS_NOT_INITIALIZED)")


def test_the_mlp_example(tmp_path, needs_matmul):
    result, stderr = dryrun(tmp_path, "--no-snapshot", "--allocator", "native,vramguard", "--steps", "2",
                            str(ROOT / "examples" / "train_mlp.py"), "--batch", "64", "--hidden", "1024",
                            expect=0)
    for name in ("native", "vramguard"):
        run = result[name]
        assert run["fits"] is True and run["steps"] == 2 and run["peak_allocated_bytes"] > 50 * MiB
        assert "vramguard dryrun: step 2" in stderr
    # the same tensors; PyTorch's allocator hands out a large block whole when
    # what splitting it would leave is 1 MiB or less, so its blocks can be larger
    native, ours = result["native"]["peak_allocated_bytes"], result["vramguard"]["peak_allocated_bytes"]
    assert 0 <= native - ours <= 2 * MiB, (native, ours)
    assert "values read back from a phantom device are zeros" in report(result)  # loss.item()


@pytest.mark.torch_version
def test_the_gpt2_example(tmp_path, needs_matmul):
    pytest.importorskip("transformers")
    result, stderr = dryrun(tmp_path, "--no-snapshot", "--allocator", "vramguard",
                            str(ROOT / "examples" / "train_gpt2.py"), "--batch", "2", "--seq", "128",
                            "--layers", "2", "--embd", "192", "--steps", "2", expect=0)
    run = result["vramguard"]
    assert run["fits"] is True and run["steps"] == 2 and run["peak_allocated_bytes"] > 10 * MiB
    assert run["compiled"]["torch_compile"] is False


def test_a_caught_out_of_memory_still_counts(tmp_path):
    """The script catches the error and goes on: the run does not fit, and
    PyTorch's memory history names the line (vramguard's records no stack
    for the failure, so its line is unknown)."""
    write(tmp_path, "caught.py", """
        import torch
        try:
            x = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            print("caught it")
        y = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    """)
    result, stderr = dryrun(tmp_path, "--memory", "2GiB", "--allocator", "native,vramguard", "caught.py",
                            expect=1)
    for name in ("native", "vramguard"):
        run = result[name]
        assert run["fits"] is False and run["exit_status"] == 0 and f"[{name}] caught it" in stderr
        assert run["first_oom"]["caught"] is True and run["first_oom"]["request_bytes"] == 3 << 30
    assert result["native"]["first_oom"]["line"] == "caught.py:4"
    assert "caught.py:4 (3.00 GiB) caught" in report(result)


def test_a_phantom_jupyter_kernel(tmp_path):
    """install-kernel writes a kernelspec whose kernel runs on the phantom:
    the card's name and total, the context's share taken; --remove."""
    pytest.importorskip("ipykernel")
    manager = pytest.importorskip("jupyter_client.manager")
    prefix = tmp_path / "prefix"
    cli = [sys.executable, "-m", "vramguard", "install-kernel", "--gpu", "T4", "--prefix", str(prefix)]
    proc = subprocess.run(cli, capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    env = dict(_env(), JUPYTER_PATH=str(prefix / "share" / "jupyter"))
    old = dict(os.environ)
    os.environ.update(env)
    try:
        km, kc = manager.start_new_kernel(kernel_name="vramguard-phantom-t4")
    finally:
        os.environ.clear()
        os.environ.update(old)
    out = []

    def hook(msg):
        if msg["msg_type"] in ("stream", "error"):
            out.append(msg["content"].get("text") or msg["content"].get("evalue"))

    try:
        kc.execute_interactive("import torch; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); "
                               "print(torch.cuda.get_device_name(0), *torch.cuda.mem_get_info())",
                               output_hook=hook, timeout=120)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    total = 15_828_320_256
    assert out == [f"Tesla T4 {total - CONTEXT - GiB} {total}\n"], out
    proc = subprocess.run(cli + ["--remove"], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 0 and "removed" in proc.stdout, proc.stderr
    assert not (prefix / "share" / "jupyter" / "kernels" / "vramguard-phantom-t4").exists()


@pytest.mark.torch_version
def test_a_script_that_installs_vramguard_itself(tmp_path):
    """The native run's memory history waits for CUDA to start, so the
    script's own vramguard.install() still works there, and the report says
    that run was vramguard's."""
    write(tmp_path, "own.py", """
        import torch, vramguard
        vramguard.install()
        x = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
        print(vramguard.summary().splitlines()[0])
    """)
    result, stderr = dryrun(tmp_path, "--memory", "1GiB", "--allocator", "native", "--no-check-needs", "own.py",
                            expect=0)
    run = result["native"]
    assert run["fits"] is True and run["peak_allocated_bytes"] == 100 * MiB
    assert run["script_installed_vramguard"] is True
    assert "the native run ran under vramguard too" in report(result)


def test_the_driver_and_runtime_are_found_by_their_development_names(tmp_path, monkeypatch):
    """As on a machine with a driver and a toolkit, ctypes finds libcuda.so
    and libcudart.so by name (bitsandbytes before 0.40 does), the same
    libraries as the preloaded ones, the user's LD_LIBRARY_PATH after the
    phantom's; the deprecated capability query answers the preset's."""
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/users-own-libs")
    write(tmp_path, "probe.py", """
        import ctypes, os
        cuda, cudart = ctypes.CDLL("libcuda.so"), ctypes.CDLL("libcudart.so")
        major, minor, version = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        assert cuda.cuInit(0) == 0
        assert cuda.cuDeviceComputeCapability(ctypes.byref(major), ctypes.byref(minor), 0) == 0
        assert cudart.cudaRuntimeGetVersion(ctypes.byref(version)) == 0
        same = cuda._handle == ctypes.CDLL("libcuda.so.1")._handle
        with open("found.txt", "w") as f:
            f.write(f"{major.value}.{minor.value} {same} {os.environ['LD_LIBRARY_PATH'].split(':')[1:]}")
    """)
    # the probe allocates nothing: the dry run's "never used the GPU" (exit 4)
    dryrun(tmp_path, "--no-snapshot", "--gpu", "T4", "--allocator", "native", "probe.py", expect=4)
    assert (tmp_path / "found.txt").read_text() == "7.5 True ['/opt/users-own-libs']"


#: A compiled training loop; its activations are large enough to set the
#: peak (at batch 128 the optimizer's step sets it, the same in both modes, torch 2.10).
COMPILED_LOOP = """
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    step_model = torch.compile(model)
    x = torch.randn(4096, 512, device="cuda")
    for _ in range(2):
        opt.zero_grad()
        step_model(x).square().mean().backward()
        opt.step()
"""


@pytest.mark.torch_version
def test_torch_compile_builds_its_kernels_on_the_cpu(tmp_path, needs_matmul):
    """A compiled training loop runs on a phantom T4: Triton finds the
    phantom driver (TRITON_LIBCUDA_PATH), builds its kernels with its own
    ptxas for sm_75, and they launch as no-ops; the report says so. The
    compiled program's peak is not eager mode's (--no-compile)."""
    pytest.importorskip("triton")
    script = write(tmp_path, "compiled.py", COMPILED_LOOP)
    compiled, _ = dryrun(tmp_path, "--no-snapshot", "--allocator", "native", str(script), expect=0)
    eager, _ = dryrun(tmp_path, "--no-snapshot", "--allocator", "native", "--no-compile", str(script), expect=0)
    run = compiled["native"]
    assert run["fits"] is True and run["error"] is None
    assert run["compiled"]["torch_compile"] is True
    assert "its Triton kernels were built on this CPU" in report(compiled)
    assert eager["native"]["compiled"]["torch_compile"] is False
    assert eager["native"]["peak_allocated_bytes"] != run["peak_allocated_bytes"]


def test_runs_share_the_compiled_code_and_allocate_as_a_cold_compile(tmp_path, needs_matmul):
    """The second allocator's run loads the code the first one generated
    (features/compile_cache.py), saves nothing of its own, and under the
    same allocator as a cold compile (expandable against native: the same
    requests) reaches the same peak allocated to the byte."""
    pytest.importorskip("triton")
    script = write(tmp_path, "compiled.py", COMPILED_LOOP)
    shared, _ = dryrun(tmp_path, "--no-snapshot", "--allocator", "native,expandable", str(script), expect=0)
    cold, _ = dryrun(tmp_path, "--no-snapshot", "--allocator", "expandable", str(script), expect=0)
    first, second = shared["native"]["compile_cache"], shared["expandable"]["compile_cache"]
    assert first["hits"] == 0 and first["saved"] >= 1 and first["not_saved"] == 0
    assert second["hits"] == first["saved"] and second["compiled"] == 0
    assert cold["expandable"]["compile_cache"]["hits"] == 0
    assert shared["expandable"]["peak_allocated_bytes"] == cold["expandable"]["peak_allocated_bytes"]
    assert "runs loaded the code an earlier run had generated" in report(shared)
