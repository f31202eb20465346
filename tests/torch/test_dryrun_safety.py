"""A dry run is safe to run on any script, anywhere: its files are new files
in a folder of its own (no planted link followed, no other run's file
overwritten or read), runs go one at a time unless each has a folder of its
own, SIGTERM ends every run's processes as Ctrl-C does, --timeout ends a run
and keeps its figures, the host memory reported is the whole run's, and a
notebook's cells run in an IPython shell (the shipped quickstart's GPU
cells included). The real PyTorch on the phantom GPU, as in test_dryrun.py.
"""
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_dryrun import GiB, MiB, ROOT, _env, _gone, dryrun, write

pytestmark = pytest.mark.torch


def _cli(*args):
    return [sys.executable, "-m", "vramguard", "dryrun", *args]


def _run_dir(result, out):
    """The folder the dry run made for itself in --out: new, and in it."""
    run_dir = Path(result["out_dir"])
    assert run_dir.parent == out and run_dir.name.startswith("dryrun-"), run_dir
    return run_dir


# ------------------------------------------------------------------ --out


def test_planted_links_and_earlier_files_in_out_are_left_alone(tmp_path):
    """--out holding links named as a run's files (to files of the user's)
    and an earlier run's files: none is written through or over; the run's
    files are new ones in a folder of its own, and its figures its own."""
    write(tmp_path, "one_gib.py", """
        import torch
        x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        print("one GiB")
    """)
    out = tmp_path / "out"
    out.mkdir()
    victims = {}
    for name in ("native.log", "native.json", "native.pickle", "native.json.tmp"):
        victim = tmp_path / f"precious-{name}"
        victim.write_text(f"mine: {name}\n")
        (out / name).symlink_to(victim)
        victims[victim] = victim.read_text()
    earlier = out / "dryrun-earlier"
    earlier.mkdir()
    (earlier / "native.json").write_text('{"peak_allocated_bytes": 12345}')
    result, _ = dryrun(tmp_path, "--allocator", "native", "one_gib.py", expect=0)
    for victim, text in victims.items():
        assert victim.read_text() == text and not victim.is_symlink()
    assert all((out / name).is_symlink() for name in ("native.log", "native.json", "native.pickle"))
    assert (earlier / "native.json").read_text() == '{"peak_allocated_bytes": 12345}'
    run_dir = _run_dir(result, out)
    assert result["native"]["peak_allocated_bytes"] == GiB
    # the run's own files, and those of the run that checked its need (1.39 GiB: the context and the
    # GiB; 16 MiB less cannot hold the GiB beside the context, so no run is needed to know it fails)
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "native.json", "native.log", "native.pickle", "native_1.39_GiB.json", "native_1.39_GiB.log"]
    assert result["native"]["need_bytes"] == GiB + 400 * MiB and result["native"]["need_checked"]
    assert not any(p.is_symlink() for p in run_dir.iterdir())
    assert (run_dir / "native.log").read_text() == "one GiB\n"
    assert result["native"]["log"] == str(run_dir / "native.log")


def test_two_dry_runs_with_one_out_each_report_their_own(tmp_path):
    """Two dry runs at once with the same --out: the one whose script ends
    with os._exit (its figures written as it ends) reports its own, not the
    other's, which the other wrote meanwhile, and neither log holds the
    other's lines."""
    write(tmp_path, "quick.py", """
        import os, time, torch
        x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        print("quick here", flush=True)
        time.sleep(6)   # the other run ends and writes its figures meanwhile
        os._exit(0)
    """)
    write(tmp_path, "slow.py", """
        import torch
        x = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
        print("slow here")
    """)
    out = tmp_path / "out"
    procs = [subprocess.Popen(_cli("--json", "--out", str(out), "--allocator", "native", "--no-snapshot", script),
                              cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for script in ("quick.py", "slow.py")]
    outputs = [p.communicate(timeout=300) for p in procs]
    quick, slow = (json.loads(stdout) for stdout, _ in outputs)
    assert slow["native"]["peak_allocated_bytes"] == 3 * GiB and slow["native"]["fits"] is True
    assert quick["native"]["peak_allocated_bytes"] == GiB and quick["native"]["ended"] == "os._exit(0)"
    quick_dir, slow_dir = _run_dir(quick, out), _run_dir(slow, out)
    assert quick_dir != slow_dir
    assert (quick_dir / "native.log").read_text() == "quick here\n"
    assert (slow_dir / "native.log").read_text() == "slow here\n"


# ------------------------------------------------------------------ runs at once


CHECKPOINT = """
    import torch
    model = torch.nn.Linear(256, 256).cuda()
    for i in range(40):
        torch.save({"i": i, "model": model.state_dict()}, "ckpt.pt")
        state = torch.load("ckpt.pt", map_location="cuda")   # a half-written file by another run fails here
        assert state["i"] == i, (state["i"], i)
    print("checkpoints ok")
"""


def test_runs_at_once_each_get_a_folder_of_their_own(tmp_path):
    """A script that saves and reloads a checkpoint: refused at --jobs 2 in
    one folder; with --cwd runs/{allocator} each run has its own folder
    (made in runs/), and every run passes."""
    write(tmp_path, "ckpt.py", CHECKPOINT)
    proc = subprocess.run(_cli("--jobs", "2", "--no-snapshot", "ckpt.py"), cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("vramguard: --jobs 2 runs allocators at once"), proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "ckpt.pt").exists()
    (tmp_path / "runs").mkdir()
    result, stderr = dryrun(tmp_path, "--jobs", "2", "--no-snapshot", "--cwd", "runs/{allocator}", "ckpt.py",
                            expect=0)
    for allocator in ("native", "expandable", "vramguard"):
        run = result[allocator]
        assert run["fits"] is True and run["exit_status"] == 0, (allocator, run.get("error"), stderr)
        assert (tmp_path / "runs" / allocator / "ckpt.pt").is_file()
        assert Path(run["log"]).read_text() == "checkpoints ok\n"
    assert not (tmp_path / "ckpt.pt").exists()
    assert result["cwd"] == str(tmp_path / "runs" / "{allocator}")
    from vramguard.dryrun import format_report

    assert (f"The script ran in {tmp_path / 'runs' / '{allocator}'} (--cwd: a folder per allocator) with real "
            "file I/O") in format_report(result)


# ------------------------------------------------------------------ SIGTERM, --timeout


def test_sigterm_ends_the_run_and_the_scripts_own_child(tmp_path):
    """SIGTERM (timeout, kill, a cancelled CI job) as Ctrl-C: exit 143 with
    a message, where the logs are, and nothing left running, the script's
    own subprocess included (by pid)."""
    write(tmp_path, "slow.py", """
        import os, subprocess, time, torch
        x = torch.empty(1 << 20, device="cuda")
        p = subprocess.Popen(["sleep", "120"])
        print("pids", os.getpid(), p.pid, flush=True)
        time.sleep(120)
    """)
    out = tmp_path / "out"
    proc = subprocess.Popen(_cli("--no-snapshot", "--allocator", "native", "--out", str(out), "slow.py"),
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("[native] pids"), line + proc.stderr.read()
        pids = [int(p) for p in line.split()[2:]]
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert time.monotonic() - started < 10
    assert err.endswith("vramguard: terminated (SIGTERM)\n") and "Traceback" not in err, err
    (run_dir,) = out.iterdir()
    assert f"vramguard dryrun: the logs so far are in {run_dir}\n" in err, err
    assert (run_dir / "native.log").read_text().startswith("pids ")
    assert sorted(p.name for p in run_dir.iterdir()) == ["native.log"]  # its empty files folder removed
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), pids


def test_ctrl_c_shows_the_figures_of_the_runs_that_ended(tmp_path):
    """Ctrl-C in the second run: the first run's row, as the table gives
    it, then where the logs are."""
    write(tmp_path, "second_waits.py", """
        import os, time, torch
        x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        if os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):   # expandable's run
            print("waiting", flush=True)
            time.sleep(60)
    """)
    out = tmp_path / "out"
    proc = subprocess.Popen(_cli("--no-snapshot", "--allocator", "native,expandable", "--out", str(out),
                                 "second_waits.py"),
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        assert line == "[expandable] waiting\n", line + proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    (run_dir,) = out.iterdir()
    assert err.endswith(
        "vramguard dryrun: stopped before expandable ended; the figures of the runs that ended:\n"
        "allocator         needs  peak allocated  peak reserved  fits  first OOM (request)\n"
        "---------  ------------  --------------  -------------  ----  -------------------\n"
        "native     not measured        1.00 GiB       1.00 GiB   yes  -\n"
        f"vramguard dryrun: the logs so far are in {run_dir}\n"
        "vramguard: interrupted\n"), err


def test_a_run_past_its_timeout_is_ended_with_its_figures_so_far(tmp_path):
    """A loop with no optimizer step for --steps: --timeout ends it, its
    figures up to then kept (its 512 MiB, its snapshot), reported as timed
    out with status 124; the script's own subprocess goes with it."""
    write(tmp_path, "forever.py", """
        import os, subprocess, time, torch
        x = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        p = subprocess.Popen(["sleep", "120"])
        print("pids", os.getpid(), p.pid, flush=True)
        while True:
            time.sleep(0.05)
    """)
    started = time.monotonic()
    result, stderr = dryrun(tmp_path, "--allocator", "native", "--timeout", "12", "forever.py")
    assert time.monotonic() - started < 60
    run = result["native"]
    assert run["timed_out"] is True and run["exit_status"] == 124
    assert run["fits"] is None and run["peak_allocated_bytes"] == 512 * MiB
    assert run["error"] == "timed out after 12 s (--timeout): its figures are those up to then"
    assert run["snapshot"] and Path(run["snapshot"]).is_file()
    assert "vramguard dryrun: native: timed out, peak allocated 512.00 MiB" in stderr
    pids = [int(p) for p in Path(run["log"]).read_text().split()[1:3]]
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), pids


def test_a_run_that_ends_within_its_timeout_is_not_timed_out(tmp_path):
    write(tmp_path, "quick.py", """
        import torch
        x = torch.empty(1 << 20, device="cuda")
    """)
    result, _ = dryrun(tmp_path, "--allocator", "native", "--no-snapshot", "--timeout", "120", "quick.py", expect=0)
    assert result["native"]["fits"] is True and "timed_out" not in result["native"]


# ------------------------------------------------------------------ host memory


def test_the_host_peak_is_the_whole_runs_snapshot_included(tmp_path):
    """100,000 live tensors: writing their snapshot is the run's costliest
    step. The peak RSS reported is the whole run's: what the kernel counted
    for the run's largest process (RUSAGE_CHILDREN of a process whose only
    descendants are the dry run's), within 1%."""
    write(tmp_path, "many.py", """
        import torch
        keep = [torch.empty(512, device="cuda") for _ in range(100_000)]
    """)
    measure = write(tmp_path, "measure.py", """
        import json, resource, subprocess, sys
        proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
        print(json.dumps({"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
                          "maxrss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
    """)
    proc = subprocess.run([sys.executable, str(measure)] + _cli("--json", "--quiet", "--allocator", "native",
                                                                "--out", str(tmp_path / "out"), "many.py"),
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    measured = json.loads(proc.stdout)
    assert measured["rc"] == 0, measured["stderr"]
    result = json.loads(measured["stdout"])
    assert Path(result["native"]["snapshot"]).stat().st_size > 10 * MiB
    reported = result["host_peak_rss_bytes"]
    assert abs(reported - measured["maxrss"]) <= 0.01 * measured["maxrss"], (reported, measured["maxrss"])


# ------------------------------------------------------------------ notebooks


def _notebook(path, cells):
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": c}
                    for c in cells],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))
    return path


def test_a_notebooks_cells_run_in_an_ipython_shell(tmp_path):
    """get_ipython() is the shell, line magics run, display() prints, and
    an out-of-memory still names its cell and line."""
    _notebook(tmp_path / "nb.ipynb", [
        "ip = get_ipython()\nprint('shell:', type(ip).__name__)",
        "%time total = sum(range(10))\nprint('total', total)",
        "import torch\nx = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')\ndisplay('shown')",
        "\ny = torch.empty(64 << 30, dtype=torch.uint8, device='cuda')",
    ])
    result, stderr = dryrun(tmp_path, "--allocator", "native", "--quiet", "nb.ipynb")
    run = result["native"]
    log = Path(run["log"]).read_text()
    assert "shell: InteractiveShell\n" in log and "total 45\n" in log and "'shown'\n" in log, log
    assert "NameError" not in log
    assert run["fits"] is False and run["peak_allocated_bytes"] == 256 * MiB
    assert run["first_oom"]["line"] == "nb.ipynb[cell 4]:2"


def test_the_quickstart_runs_its_gpu_cells(tmp_path):
    """The shipped quickstart, dry-run: its GPU cells run (meter() works in
    the shell; in vramguard's run, its own recording takes over from the
    dry run's, which says so), and its memory.pickle goes to each run's own
    folder, not to the folder the dry run was started in."""
    # the needs unchecked: each check runs the notebook twice more per allocator, and needs are not this test's
    result, stderr = dryrun(tmp_path, "--allocator", "native,vramguard", "--quiet", "--no-check-needs",
                            str(ROOT / "notebooks" / "quickstart.ipynb"))
    for name in ("native", "vramguard"):
        run = result[name]
        log = Path(run["log"]).read_text()
        assert "No GPU here" not in log and "skipped: needs a GPU" not in log, log
        assert "allocator: arena (virtual memory, 2 MiB pages)\n" in log, log
        assert "this cell: " in log  # meter(): a line after each cell
        assert "leak: " in log and "vramguard recovered" in log
        assert run["exit_status"] == 0, run.get("error")
        files = Path(run["log"]).with_suffix(".files")
        assert (files / "memory.pickle").stat().st_size > 0
        assert f"now drag {files / 'memory.pickle'} onto https://pytorch.org/memory_viz\n" in log
    assert not (tmp_path / "memory.pickle").exists()
    assert ("vramguard dryrun: the script records the GPU's memory itself: the dry run's own recording stopped "
            "there, so its snapshot covers the run up to that point\n") in Path(result["vramguard"]["log"]).read_text()
    assert Path(result["vramguard"]["snapshot"]).stat().st_size > 0
