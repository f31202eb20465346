"""A dry run's verdict and exit status for what is not a fit or a misfit:
a program that never used the GPU, a script that failed (its own status,
the cause and its line in the summary, the figures up to there), a run
the phantom could not finish, a rank of several that ran out. Each case
through the CLI with --json, on the real PyTorch on the phantom GPU.
"""
import json
import pickle
import subprocess
import sys

import pytest

from test_dryrun import _env, write

pytestmark = pytest.mark.torch

MiB = 1 << 20
GiB = 1 << 30
NEVER_USED = ("The program never used the GPU: it allocated nothing on the phantom T4 and launched no "
              "kernel, so whether it fits is not known.")


def dryrun(tmp_path, *args, expect):
    """The CLI with --json in tmp_path: (the object, stderr), its status checked."""
    cmd = [sys.executable, "-m", "vramguard", "dryrun", "--json", "--quiet", "--out", str(tmp_path / "out"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=300)
    assert proc.returncode == expect, f"exit {proc.returncode}\n{proc.stdout}{proc.stderr[-4000:]}"
    result = json.loads(proc.stdout)
    assert result["exit_code"] == expect
    return result, proc.stderr


def report(result):
    from vramguard.dryrun import format_report

    return format_report(result)


# ------------------------------------------------------------------ never used the GPU


def test_an_empty_script_never_used_the_gpu_under_any_allocator(tmp_path):
    """All three allocators, snapshots on: vramguard's run starts CUDA for
    its install() and its recording, which is not the script's use."""
    write(tmp_path, "empty.py", "")
    result, _ = dryrun(tmp_path, "empty.py", expect=4)
    assert result["verdict"] == "never used the GPU" and result["fits"] is None
    for name in ("native", "expandable", "vramguard"):
        run = result[name]
        assert run["used_gpu"] is False and run["fits"] is None, (name, run)
        assert run["error"] is None and run["exit_status"] == 0
    assert result["vramguard"]["used_cuda"] is True  # CUDA started, by install(): still not a use
    text = report(result)
    assert "Fits" not in text and NEVER_USED in text, text
    assert "native      not measured         0 bytes        0 bytes     -  -" in text, text
    assert "Need not measured for native, expandable and vramguard: the program never used the GPU." in text


def test_a_script_that_exits_before_touching_cuda(tmp_path):
    """It asks for the device's name and exits 0: CUDA started, nothing
    allocated, no kernel. Exiting 2 there is the script's failure instead."""
    write(tmp_path, "early.py", """
        import sys, torch
        print(torch.cuda.get_device_name(0))
        sys.exit(int(sys.argv[1]))
    """)
    result, _ = dryrun(tmp_path, "--allocator", "native,vramguard", "early.py", "0", expect=4)
    assert result["native"]["used_cuda"] is True and result["native"]["used_gpu"] is False
    assert NEVER_USED in report(result) and "Fits" not in report(result)
    result, _ = dryrun(tmp_path, "--allocator", "native", "--no-snapshot", "early.py", "2", expect=3)
    run = result["native"]
    assert run["error"] == "SystemExit: 2" and run["exit_status"] == 2 and run["used_gpu"] is False
    text = report(result)
    assert "The script failed before its end (exit status 2): whether it fits is not known." in text
    assert "native: the script failed: SystemExit: 2, at early.py:4 (exit status 2)." in text


def test_a_notebook_without_code_cells(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": ["# only words"], "metadata": {}}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "words.ipynb").write_text(json.dumps(nb))
    result, _ = dryrun(tmp_path, "--allocator", "native,vramguard", "words.ipynb", expect=4)
    assert result["verdict"] == "never used the GPU"
    assert NEVER_USED in report(result)


# ------------------------------------------------------------------ the script failed


def test_a_failure_is_not_a_misfit(tmp_path):
    """Status 3 of the script's own, then an out-of-memory: 3 (the script
    failed) and 1 (does not fit), the script's status in the text and the
    JSON."""
    write(tmp_path, "fails.py", """
        import sys, torch
        x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        if sys.argv[1] == "exit":
            sys.exit(3)
        y = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    """)
    result, _ = dryrun(tmp_path, "--allocator", "native", "--memory", "2GiB", "fails.py", "exit", expect=3)
    run = result["native"]
    assert result["verdict"] == "script failed" and run["exit_status"] == 3
    assert run["peak_allocated_bytes"] == 64 * MiB and run["error_at"] == "fails.py:5"
    text = report(result)
    assert "The script failed before its end (exit status 3): whether it fits is not known." in text
    assert "native: the script failed: SystemExit: 3, at fails.py:5 (exit status 3)." in text
    result, _ = dryrun(tmp_path, "--allocator", "native", "--memory", "2GiB", "fails.py", "oom", expect=1)
    assert result["verdict"] == "does not fit" and result["native"]["exit_status"] == 1


@pytest.mark.parametrize("code, ended, status", [
    ("os._exit(3)", "os._exit(3)", 3),
    ("ctypes.CDLL(None).exit(1)", "exit(1) from C", 1),
])
def test_an_end_without_python_keeps_the_figures_and_the_snapshot(tmp_path, code, ended, status):
    """os._exit and a C-level exit() (bitsandbytes' way) after allocating:
    the figures up to there, the cause and the line, and the snapshot."""
    write(tmp_path, "ends.py", f"""
        import ctypes, os, torch
        x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        {code}
    """)
    result, _ = dryrun(tmp_path, "--allocator", "native,vramguard", "--memory", "2GiB", "ends.py", expect=3)
    for name in ("native", "vramguard"):
        run = result[name]
        assert run["peak_allocated_bytes"] == 256 * MiB and run["fits"] is None, (name, run)
        assert run["error"] == ended and run["ended"] == ended and run["error_at"] == "ends.py:4"
        assert run["exit_status"] == status
        with open(run["snapshot"], "rb") as f:
            assert pickle.load(f)["segments"]
    text = report(result)
    assert f"native: the script failed: {ended}, at ends.py:4 (exit status {status})." in text
    assert f"The script failed before its end (exit status {status})" in text
    assert "before its figures were written" not in text


def test_os_exit_0_at_the_end_is_the_scripts_end(tmp_path):
    write(tmp_path, "quick.py", """
        import os, torch
        x = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
        os._exit(0)
    """)
    result, _ = dryrun(tmp_path, "--allocator", "native", "--memory", "2GiB", "--no-snapshot", "quick.py",
                       expect=0)
    run = result["native"]
    assert run["fits"] is True and run["peak_allocated_bytes"] == 32 * MiB and run["ended"] == "os._exit(0)"
    assert ("native: the script ended itself with os._exit(0) at quick.py:4: the figures are up to there."
            in report(result))


def test_a_kill_leaves_the_figures_of_the_last_step(tmp_path):
    """SIGKILL, where nothing of the process runs: the figures written as
    the run went (after its optimizer step) are kept, marked partial."""
    write(tmp_path, "killed.py", """
        import os, signal, torch
        w = torch.nn.Parameter(torch.zeros(16 << 20, device="cuda"))
        opt = torch.optim.SGD([w], lr=0.1)
        w.grad = torch.ones_like(w)
        opt.step()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    result, _ = dryrun(tmp_path, "--allocator", "native", "--memory", "2GiB", "--no-snapshot", "killed.py",
                       expect=3)
    run = result["native"]
    assert run["partial"] is True and run["steps"] == 1 and run["exit_status"] == 137
    assert run["peak_allocated_bytes"] == 128 * MiB
    assert run["error"] == "killed by SIGKILL after the figures of its last step were written"
    assert ("native: the script failed: killed by SIGKILL after the figures of its last step were written "
            "(exit status 137).") in report(result)


# ------------------------------------------------------------------ the phantom's failure


def test_a_failure_in_the_phantom_is_the_phantoms(tmp_path):
    """CUDA IPC (torch.multiprocessing's), which the phantom does not model:
    the phantom's failure, its own status; run one after another, the next
    allocator is not run. Two calls: the script catches the first."""
    write(tmp_path, "ipc.py", """
        import torch
        x = torch.ones(1 << 20, device="cuda")
        try:
            x.untyped_storage()._share_cuda_()
        except RuntimeError:
            pass
        x.untyped_storage()._share_cuda_()
    """)
    result, _ = dryrun(tmp_path, "--allocator", "native,vramguard", "--jobs", "1", "--no-snapshot", "ipc.py",
                       expect=5)
    native, vramguard = result["native"], result["vramguard"]
    assert result["verdict"] == "phantom failed"
    assert native["phantom_unsupported"] == {"calls": 2, "last": "cudaIpcGetMemHandle", "caused_failure": True}
    assert native["error_at"] == "ipc.py:8" and native["exit_status"] == 1
    assert vramguard["not_run"] is True and vramguard["fits"] is None
    text = report(result)
    assert ("The phantom GPU could not run the program (it does not model cudaIpcGetMemHandle): whether it "
            "fits is not known.") in text
    assert "native: the run failed in the phantom: " in text and ", at ipc.py:8 (exit status 1)." in text
    assert ("That failure is the phantom's, not the script's: the phantom GPU does not model "
            "cudaIpcGetMemHandle (2 unsupported calls in the run), which returned the error.") in text
    assert ("vramguard: not run: the native run failed in the phantom at ipc.py:8 (cudaIpcGetMemHandle is "
            "not modelled), a line no allocator's run gets past on a phantom.") in text


# ------------------------------------------------------------------ ranks


def test_the_rank_that_ran_out_is_named_with_its_figures(tmp_path):
    """Two ranks; rank 1 runs out, torchrun ends rank 0 (SIGTERM): which
    rank, where, its figures, and what the other left. Rank 1 runs out only
    once rank 0 has allocated (on a busy machine rank 0 could otherwise be
    ended before its first tensor)."""
    write(tmp_path, "ranks.py", """
        import os, time, torch
        rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(rank)
        x = torch.empty((1 + rank) << 28, dtype=torch.uint8, device="cuda")
        open(f"allocated-{rank}", "w").close()
        while rank == 1 and not os.path.exists("allocated-0"): time.sleep(0.05)
        if rank == 1:
            y = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
        time.sleep(60)
    """)
    result, _ = dryrun(tmp_path, "--allocator", "native", "--memory", "4GiB", "--nproc", "2", "--no-snapshot",
                       "ranks.py", expect=1)
    run = result["native"]
    assert run["fits"] is False and run["first_oom"]["rank"] == 1 and run["first_oom"]["line"] == "ranks.py:9"
    rank0, rank1 = run["ranks"]
    assert rank1["peak_allocated_bytes"] == 512 * MiB and rank1["fits"] is False
    assert rank0["peak_allocated_bytes"] == 256 * MiB and rank0["ended"] == "SIGTERM"
    assert ("native: rank 0 ended by SIGTERM at ranks.py:10 (torchrun ends the other ranks when one fails), "
            "peak allocated 256.00 MiB, reserved 256.00 MiB; rank 1 ran out of memory at ranks.py:9 "
            "(request 8.00 GiB), peak allocated 512.00 MiB, reserved 512.00 MiB.") in report(result)
    assert "before its figures were written" not in report(result)
