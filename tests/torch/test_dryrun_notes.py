"""What a dry run says beside its peaks, on the real PyTorch on the phantom:
each allocator's need (a replay of its run's recording), sweeps that
measure nothing, a card this PyTorch has no kernels for, a thin margin,
another cuDNN mode in one row, side streams, GradScaler, and where an
out-of-memory came from. Each note is checked where it applies and where
it does not."""
import os
import textwrap
from pathlib import Path

import pytest

from test_dryrun import GiB, MiB, dryrun, report, write

pytestmark = pytest.mark.torch


# ------------------------------------------------------------------ the need


def test_the_need_is_the_smallest_device_not_peak_reserved(tmp_path):
    """30 MiB freed, then 40 MiB: the cache holds 70 MiB at the peak, but
    the smallest device is the context and 40 MiB, rounded up to 16 MiB
    (448 MiB): the replay of each run's recording says so, as the real
    search does."""
    write(tmp_path, "seq.py", """
        import torch
        MiB = 1 << 20
        a = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        del a
        b = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
    """)
    result, _ = dryrun(tmp_path, "--gpu", "T4", "--allocators", "native,vramguard", "--min-memory", "seq.py",
                       expect=0)
    assert result["native"]["peak_reserved_bytes"] == 70 * MiB  # the cache kept the 30 MiB
    for name, policy in (("native", "torch"), ("vramguard", "arena")):
        run = result[name]
        assert run["need_bytes"] == run["min_memory_bytes"] == 448 * MiB, run
        assert run["need_policy"] == policy and run["need_unmeasured"] is None
    text = report(result)
    assert "allocator       needs  peak allocated  peak reserved  fits  min memory  first OOM (request)" in text
    assert "native     448.00 MiB       40.00 MiB      70.00 MiB   yes  448.00 MiB  -" in text
    assert "vramguard  448.00 MiB       40.00 MiB      40.00 MiB   yes  448.00 MiB  -" in text
    assert ("Needs: native and vramguard 448.00 MiB. A need is the smallest device a run fits on (the CUDA "
            "context included, to 16 MiB), checked by runs: it fits a phantom of that size, and one of 16 MiB less "
            "does not (a replay of the run's own recorded allocations under its allocator's policy proposed it); "
            "peak reserved is what a cache with room keeps, not what it needs.") in text
    assert "The replay proposed another need" not in text  # one figure: the search's, which the replay agrees with
    assert "Need not measured" not in text
    # the RTX 3060 (12 GB) is the smallest preset that holds it, not the T4 asked about
    assert "Smallest device: 448.00 MiB with native and vramguard (the smallest preset that holds it: " \
           "RTX-3060)" in text


# Blocks of about 3 MiB, every other one freed, then 64 MiB (shared with test_needs_checked.py).
FRAGMENTS = """
    import torch
    MiB = 1 << 20
    keep = []
    for i in range(40):
        t = torch.empty(3 * MiB + 4096 * i, dtype=torch.uint8, device="cuda")
        if i % 2:
            keep.append(t)
    big = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
"""


def test_the_least_need_is_named_first(tmp_path):
    """Blocks of about 3 MiB, every other one freed, then 64 MiB: the
    allocators split and reuse the holes differently, so their needs
    differ; the line names the least first, then each other with its own."""
    write(tmp_path, "frag.py", FRAGMENTS)
    # the needs replayed, not checked (test_needs_checked.py checks them): the line's words are the subject
    result, _ = dryrun(tmp_path, "--memory", "2GiB", "--no-check-needs", "frag.py", expect=0)
    needs = {n: result[n]["need_bytes"] for n in ("native", "expandable", "vramguard")}
    assert all(needs.values()) and len(set(needs.values())) > 1, needs
    least = min(needs.values())
    leanest = [n for n, b in needs.items() if b == least]
    line = next(l for l in report(result).splitlines() if l.startswith("Needs: "))
    from vramguard._units import format_size

    assert line.startswith(f"Needs: {' and '.join(leanest)} {format_size(least)}"), line
    for name, need in needs.items():
        if need != least:
            assert f"{name} {format_size(need)}" in line and ", the least; " in line, line


def test_no_snapshot_means_no_need_measured(tmp_path):
    write(tmp_path, "s.py", """
        import torch
        x = torch.empty(10 << 20, dtype=torch.uint8, device="cuda")
    """)
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native,expandable", "--no-snapshot", "s.py",
                       expect=0)
    for name in ("native", "expandable"):
        assert result[name]["need_bytes"] is None
        assert result[name]["need_unmeasured"] == "no recording (--no-snapshot)"
    text = report(result)
    assert "native      not measured" in text
    assert "Need not measured for native and expandable: no recording (--no-snapshot)." in text
    assert "Needs: " not in text
    assert text.splitlines()[-1] == f"Logs and figures (no memory snapshots): {result['out_dir']}"
    assert Path(result['out_dir']).parent == tmp_path / 'out'


def test_an_overflowed_history_means_no_need_measured(tmp_path):
    """PyTorch's history keeps 200,000 entries: 101,000 allocations and frees
    overflow it, and a recording without its start gives no need."""
    write(tmp_path, "many.py", """
        import torch
        for _ in range(101_000):
            x = torch.empty(512, device="cuda")
            del x
    """)
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native", "--quiet", "many.py", expect=0)
    assert result["native"]["need_bytes"] is None
    text = report(result)
    assert "Need not measured for native: PyTorch's memory history overflowed (its start was lost)." in text
    assert "Snapshots and logs (memory snapshots open at pytorch.org/memory_viz)" in text


def test_a_program_that_never_used_the_gpu_has_no_need(tmp_path):
    write(tmp_path, "cpu.py", "import torch\nprint(torch.ones(3).sum())\n")
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native", "cpu.py")
    assert result["native"]["need_bytes"] is None
    assert "Need not measured for native: the program never used the GPU." in report(result)


def test_an_out_of_memory_needs_more_than_the_device(tmp_path):
    """And --min-memory gives the figure above the card (not '-'): 1.2 GiB on a
    1 GiB device whose context holds 400 MiB needs 1,600 MiB. The OOM's
    traceback is in the log."""
    write(tmp_path, "big.py", """
        import torch
        x = torch.empty(1200 << 20, dtype=torch.uint8, device="cuda")
    """)
    result, stderr = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native", "--min-memory", "big.py",
                            expect=1)
    run = result["native"]
    assert run["need_bytes"] is None and run["need_above_device"] is True
    assert run["min_memory_bytes"] == 1600 * MiB
    text = report(result)
    assert "native     > 1.00 GiB         0 bytes        0 bytes    NO    1.56 GiB  big.py:3 (1.17 GiB)" in text
    assert "Smallest device: 1.56 GiB with native (the smallest preset that holds it: RTX-3060)" in text
    assert "Need not measured" not in text
    log = open(run["log"], encoding="utf-8").read()
    assert "Traceback (most recent call last)" in log and 'big.py", line 3, in <module>' in log
    assert "OutOfMemoryError" in log and "Traceback (most recent call last)" in stderr


# ------------------------------------------------------------------ sweeps


def test_a_sweep_that_changes_nothing_measures_nothing(tmp_path):
    """No {BATCH} in the arguments and a script that never reads BATCH:
    the same figures at every value, so no value is 'the largest'."""
    write(tmp_path, "fixed.py", """
        import torch
        x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    """)
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native", "--no-snapshot",
                       "--sweep", "BATCH=1,2,4", "fixed.py", expect=0)
    run = result["native"]
    assert run["sweep_measured_nothing"] is True and run["largest_value"] is None and run["fits"] is True
    assert [s["value"] for s in run["sweep"]] == [2, 4]
    text = report(result)
    assert "Largest BATCH that fits on a T4 of 1.00 GiB: native: not measured, the figures were the same at " \
           "every BATCH tried." in text
    assert ("The sweep measured nothing for native: peak allocated and reserved were the same at BATCH=2 and 4 "
            "(no argument has {BATCH}, so it was only set as the environment variable BATCH), so no value is "
            "the largest that fits.") in text
    assert "native: BATCH=" not in text
    assert "no effect" in text


def test_a_sweep_whose_largest_value_fits_says_it_was_the_largest_tried(tmp_path):
    write(tmp_path, "grows.py", """
        import sys, torch
        x = torch.empty(int(sys.argv[2]) << 20, dtype=torch.uint8, device="cuda")
    """)
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native", "--no-snapshot",
                       "--sweep", "BATCH=1,2,4", "grows.py", "--mib", "{BATCH}", expect=0)
    run = result["native"]
    assert run["largest_value"] == 4 and not run.get("sweep_measured_nothing")
    text = report(result)
    assert "Largest BATCH that fits on a T4 of 1.00 GiB: native: BATCH=4 (the largest tried)." in text
    assert "The sweep measured nothing" not in text
    # one that does not reach the largest value says nothing of it
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native", "--no-snapshot",
                       "--sweep", "BATCH=100,300,700", "grows.py", "--mib", "{BATCH}", expect=0)
    assert result["native"]["largest_value"] == 300
    assert "native: BATCH=300." in report(result)


# ------------------------------------------------------------------ the card, the margin


def test_a_card_this_pytorch_has_no_kernels_for_is_said_before_the_verdict(tmp_path):
    import torch

    arch = torch.cuda.get_arch_list()
    if not arch or "sm_70" in arch:
        pytest.skip(f"this PyTorch has kernels for the V100 ({arch})")
    write(tmp_path, "s.py", """
        import torch
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    """)
    result, stderr = dryrun(tmp_path, "--gpu", "V100-16GB", "--allocators", "native,vramguard", "--no-snapshot",
                            "s.py", expect=0)
    assert result["native"]["card_arch"] == {"capability": "7.0", "arch_list": arch, "runs": False}
    lines = report(result).splitlines()
    said = (f"This PyTorch ({torch.__version__}) has no kernels for a V100-16GB (compute capability 7.0; it was "
            f"built for {', '.join(arch)}): on the card its first CUDA kernel fails. A phantom runs every "
            "kernel, so the figures below are those of the program, which needs a PyTorch built for the card "
            "to run there.")
    assert lines[1] == said  # before the table and the verdict
    assert "compute capability (CC) 7.0" not in stderr and "not compatible with" not in stderr  # said once
    result, _ = dryrun(tmp_path, "--gpu", "T4", "--allocators", "native", "--no-snapshot", "s.py", expect=0)
    assert result["native"]["card_arch"]["runs"] is True
    assert "has no kernels for" not in report(result)


def test_a_thin_margin_is_said(tmp_path):
    """1 GiB, 400 MiB of it the context's: 500 MiB leaves 124 MiB (under
    256 MiB); 100 MiB leaves 524 MiB, nothing to say."""
    write(tmp_path, "s.py", """
        import sys, torch
        x = torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device="cuda")
    """)
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native,vramguard", "--no-snapshot",
                       "s.py", "500", expect=0)
    # no recording, so no need: what the device held at the peak bounds what is left from below
    assert ("native fits, with at least 124.00 MiB to spare; vramguard fits, with at least 124.00 MiB to spare "
            "(of the 624.00 MiB "
            "beside the CUDA context, under 2% or 256.00 MiB): another driver, CUDA version or library on the "
            "card can take that much.") in report(result)
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native", "--no-snapshot", "s.py", "100",
                       expect=0)
    assert "to spare" not in report(result)


# ------------------------------------------------------------------ another program per row


PLAIN = """
import torch
x = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
"""


def test_cudnn_benchmark_side_streams_and_grad_scaler_are_said(tmp_path):
    write(tmp_path, "busy.py", """
        import torch
        torch.backends.cudnn.benchmark = True
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            x = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
        scaler = torch.amp.GradScaler("cuda")
    """)
    result, stderr = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native,vramguard", "--no-snapshot",
                            "busy.py", expect=0)
    assert result["vramguard"]["cudnn_benchmark_kept_off"] >= 1 and result["native"]["cudnn_benchmark_kept_off"] == 0
    assert result["native"]["side_streams"] is True and result["native"]["grad_scalers"] == 1
    text = report(result)
    assert ("The script turns cuDNN's benchmark mode on (torch.backends.cudnn.benchmark), which vramguard keeps "
            "off (PyTorch's pluggable allocators cannot answer its cacheInfo query): the vramguard row measured "
            "convolutions without it, another cuDNN mode than the native row.") in text
    assert ("The program used CUDA side streams (torch.cuda.Stream, or a library's, such as NCCL's): on a phantom "
            "queued work is done at once, so memory a card holds until work queued on another stream has run "
            "(record_stream, a collective's buffers) is not in these figures.") in text
    assert ("GradScaler was used: on a phantom its scale reads 0 (scaler.get_scale(), a logged or saved scale) "
            "and no step is ever skipped for an inf or NaN gradient.") in text
    # vramguard alone: its figures are without benchmark mode, no other row to differ from
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "vramguard", "--no-snapshot", "busy.py",
                       expect=0)
    assert ("which vramguard keeps off: the figures are those of convolutions without it.") in report(result)
    # none of it where the script does none of it
    write(tmp_path, "plain.py", PLAIN)
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native,vramguard", "--no-snapshot",
                       "plain.py", expect=0)
    text = report(result)
    assert "benchmark mode" not in text and "side streams" not in text and "GradScaler" not in text
    assert result["native"]["side_streams"] is False and result["native"]["grad_scalers"] == 0


def test_a_disabled_grad_scaler_is_not_said(tmp_path):
    write(tmp_path, "off.py", PLAIN + "scaler = torch.amp.GradScaler('cuda', enabled=False)\n")
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native", "--no-snapshot", "off.py",
                       expect=0)
    assert result["native"]["grad_scalers"] == 0 and "GradScaler" not in report(result)


# ------------------------------------------------------------------ where it ran out


def test_an_out_of_memory_inside_a_library_names_its_frame_too(tmp_path):
    """A Trainer-style script: its own line is `trainer.train()`, the
    memory was asked for in a library's model code; both are named."""
    lib = tmp_path / "site-packages" / "fakelib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(textwrap.dedent("""
        import torch

        def forward():
            return torch.empty(4 << 30, dtype=torch.uint8, device="cuda")

        class Trainer:
            def train(self):
                return forward()
    """))
    write(tmp_path, "train.py", """
        import sys
        sys.path.insert(0, sys.argv[1])
        from fakelib import Trainer
        Trainer().train()
    """)
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native", "--no-snapshot", "train.py",
                       str(tmp_path / "site-packages"), expect=1)
    oom = result["native"]["first_oom"]
    assert oom["line"] == "train.py:5" and oom["inner_line"] == os.path.join("fakelib", "__init__.py") + ":5"
    assert "train.py:5 via fakelib/__init__.py:5 (4.00 GiB)" in report(result)
    # the user's own line innermost: nothing more to name
    write(tmp_path, "own.py", """
        import torch
        x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    """)
    result, _ = dryrun(tmp_path, "--memory", "1GiB", "--allocators", "native", "--no-snapshot", "own.py",
                       expect=1)
    assert result["native"]["first_oom"]["inner_line"] is None
    assert "own.py:3 (4.00 GiB)" in report(result) and " via " not in report(result)
