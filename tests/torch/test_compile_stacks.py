"""Stack recording under torch.compile: the vramguard run of a dry run
records stacks through a torch function mode, which must leave Dynamo's
graph whole (no graph break), so that every allocator's row measures the
same compiled program; and an out-of-memory inside the compiled code names
the user's line that called it, not a file Inductor generated."""
import pytest

from test_dryrun import built_phantom, dryrun, needs_matmul, write  # noqa: F401  (fixtures too)

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

MiB = 1 << 20

GPT = """
    import os, sys, torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch._dynamo.utils as dynamo_utils

    class Block(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                       for t in self.qkv(self.ln1(x)).split(C, dim=2))
            att = (q @ k.transpose(-2, -1)) * (C // self.heads) ** -0.5
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril().logical_not()
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    batch = int(sys.argv[1])
    model = nn.Sequential(Block(128, 4)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    compiled = torch.compile(model)
    x = torch.randn(batch, 64, 128, device="cuda")

    def step():
        opt.zero_grad()
        compiled(x).square().mean().backward()
        opt.step()

    for _ in range(3):
        step()                               # the first compiles (and autotunes, its cache empty)
    print("graph breaks:", sum(dynamo_utils.counters["graph_break"].values()))
"""


@pytest.fixture
def gpt(tmp_path, monkeypatch, needs_matmul):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    return write(tmp_path, "gpt.py", GPT)


def test_stacks_leave_the_compiled_graph_whole(tmp_path, gpt):
    """The same peak allocated to the byte under PyTorch's allocator and
    vramguard, and with vramguard's stacks off (--no-snapshot), and no graph
    break with them on (before: one per torch call in the vramguard run,
    whose row then measured eager code). Each run compiles from an empty
    cache, so each autotunes alike (before: the first run's autotuning
    warmed the cache for the others, and only its row held the benchmarks'
    buffers). Expandable segments is left out: it records as the native run
    does (PyTorch's own history, no torch function mode), and each row
    compiles anew."""
    # the needs unchecked: a check's runs each compile again from an empty cache, and needs are not this test's
    allocators = ("native", "vramguard")
    result, stderr = dryrun(tmp_path, "--allocator", ",".join(allocators), "--no-check-needs", str(gpt), "8",
                            expect=0)
    bare, bare_err = dryrun(tmp_path, "--allocator", "vramguard", "--no-snapshot", str(gpt), "8", expect=0)
    assert all(result[name]["compiled"]["torch_compile"] for name in allocators)
    for name in allocators:
        assert f"[{name}] graph breaks: 0" in stderr, stderr
    assert "[vramguard] graph breaks: 0" in bare_err, bare_err
    peaks = {name: result[name]["peak_allocated_bytes"] for name in allocators}
    peaks["vramguard without stacks"] = bare["vramguard"]["peak_allocated_bytes"]
    assert len(set(peaks.values())) == 1 and peaks["native"] > 4 * MiB, peaks


def test_an_out_of_memory_in_compiled_code_names_the_users_line(tmp_path, gpt):
    """The allocation that fails is made by Inductor's generated code (in
    its cache folder); the report names the line of gpt.py that ran the model."""
    result, stderr = dryrun(tmp_path, "--memory", "1GiB", "--allocator", "native,vramguard", str(gpt), "2048",
                            expect=1)
    for name in ("native", "vramguard"):
        assert result[name]["first_oom"]["line"] == "gpt.py:33", (name, result[name]["first_oom"])


def test_torch_compile_takes_the_stack_mode_off_the_mode_stack():
    """Once the program calls torch.compile, the recording's torch function
    mode leaves the stack (a script's own mode stays, in its place): Dynamo
    traces every mode on it into its graphs, and with this one nanoGPT's
    compiled forward failed in its evaluation (`b, t = idx.size()` unpacked a
    torch.device). Run in a child: the mode stack is the process's."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch
        from torch.overrides import TorchFunctionMode
        from vramguard.trace import record

        class Mine(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        def names():
            return [type(m).__name__ for m in torch.overrides._get_current_function_mode_stack()]

        ours = record._enter_stack_mode()
        mine = Mine()
        mine.__enter__()
        before = names()
        model = torch.compile(torch.nn.Linear(4, 4), backend="eager")
        after = names()
        model(torch.ones(2, 4))
        again = record._enter_stack_mode()   # a recording started later enters none
        print(before, after, again, ours not in record._active_modes)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "['StackAside', 'Mine'] ['Mine'] None True"
