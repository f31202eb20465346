"""Stacks recorded on the real PyTorch (fake CUDA): torch.empty calls made
in a script are named by the script's own lines, although PyTorch's ops
allocate without the GIL (the stack is set aside before the op runs)."""
import pytest

from hookrun import run

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

SCRIPT = """\
import torch, vramguard

def step(n):
    return torch.empty(n, device="cuda")

with vramguard.record(stacks=True) as rec:
    a = torch.empty(1 << 20, device="cuda")
    b = step(2 << 20)
    c = torch.zeros(3 << 20, device="cuda")
    held = vramguard.live_by_line()
out("sites", [rec.trace.site_of(op) for op in range(len(rec.trace)) if rec.trace.kinds[op] == 1])
out("frames", rec.trace.frames_of(1))
out("held", held)
out("summary", str(vramguard.summary()).splitlines()[-1])
"""


def test_torch_allocations_are_named_by_the_scripts_lines(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    v, _ = run(f"""
        import runpy
        vramguard.install(patch_torch=False)
        runpy.run_path({str(script)!r}, init_globals={{"out": out}})
    """)
    MiB = 1 << 20
    assert v["sites"] == ["train.py:7", "train.py:4 step", "train.py:9"]
    # then the -c script that ran it (runpy, of the standard library, is skipped)
    assert v["frames"][:2] == [(str(script), 4, "step"), (str(script), 8, "<module>")]
    assert v["frames"][2][0] == "<string>" and len(v["frames"]) == 3
    assert v["held"] == [("train.py:9", 12 * MiB, 1), ("train.py:4 step", 8 * MiB, 1), ("train.py:7", 4 * MiB, 1)]
    assert v["summary"] == "live at the peak of the last recording: 24.00 MiB, of which 12.00 MiB from train.py:9"


def test_without_the_torch_mode_an_op_gets_no_stack(tmp_path):
    """The allocator hook runs without the GIL and never takes it: with the
    mode left out, torch.empty's allocation has no stack."""
    script = tmp_path / "bare.py"
    script.write_text(SCRIPT.replace("import torch, vramguard",
                                     "import torch, vramguard\nvramguard.trace.record._enter_stack_mode = lambda: None"))
    v, _ = run(f"""
        import runpy
        vramguard.install(patch_torch=False)
        runpy.run_path({str(script)!r}, init_globals={{"out": out}})
    """)
    assert v["sites"] == [None, None, None] and v["held"] == []


def test_once_a_sub_interpreter_existed_an_op_without_the_mode_still_reads_no_frames(tmp_path):
    """A sub-interpreter turns PyGILState_Check into "held" for every
    thread for good; the allocator hook, which runs without the GIL, must
    still not walk frames (it crashed the process)."""
    script = tmp_path / "bare.py"
    script.write_text(SCRIPT.replace(
        "import torch, vramguard",
        "import torch, vramguard\n"
        "import _xxsubinterpreters as subs\n"
        "subs.destroy(subs.create())\n"
        "vramguard.trace.record._enter_stack_mode = lambda: None"))
    v, _ = run(f"""
        import runpy
        vramguard.install(patch_torch=False)
        runpy.run_path({str(script)!r}, init_globals={{"out": out}})
    """)
    assert v["sites"] == [None, None, None] and v["held"] == []
