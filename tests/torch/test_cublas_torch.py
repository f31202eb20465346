"""PyTorch's matmuls on the fake's cuBLAS and cuBLASLt stand-ins
(csrc/phantom/cublas*.c): they run and compute nothing, and they make the
allocations they make on a GPU. PyTorch's own cuBLAS workspaces go through
the allocator in use (PyTorch's, or vramguard's once installed), so
memory_allocated()'s peak and memory_reserved() show them; cuBLAS's default
workspace is device memory outside any allocator, 32 MiB per handle on the
fake's compute capability 9.0, as on a Hopper card.

Numbers: the fake is a 9.0 device, so PyTorch's per-call cuBLAS workspace
is 32 MiB (getChosenWorkspaceSize) and its cuBLASLt one 1 MiB
(CUBLASLT_WORKSPACE_SIZE's default); a 64x64 float32 tensor is 16 KiB.
"""
import re

import pytest

from fakegpu import MiB, run
from torchfeature import lacking

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

# After a backward, PyTorch's autograd thread may still be dropping its last
# graph task when the interpreter finalizes, and then std::terminate()s
# (pytorch/pytorch#38228; seen here with or without cuBLAS, one exit in
# two): scripts that run a backward leave without finalizing, their output
# printed.
LEAVE_AT_EXIT = """
import atexit, os
atexit.register(os._exit, 0)
"""

# The ops the phantom GPU must carry, each leaving its result's shape or type.
OPS = LEAVE_AT_EXIT + """
import torch.nn.functional as F
a = torch.randn(64, 64, device="cuda")
b = torch.randn(64, 64, device="cuda")
out["mm"] = list((a @ b).shape)
lin = torch.nn.Linear(64, 32).cuda()
lin(a).sum().backward()
out["linear_grads"] = [list(lin.weight.grad.shape), list(lin.bias.grad.shape)]
out["bmm"] = list(torch.bmm(torch.randn(4, 8, 16, device="cuda"),
                            torch.randn(4, 16, 5, device="cuda")).shape)
with torch.autocast("cuda", dtype=torch.bfloat16):
    y = F.linear(a, torch.randn(32, 64, device="cuda"), torch.randn(32, device="cuda"))
out["bf16_linear"] = [str(y.dtype), list(y.shape)]
out["addmm"] = list(torch.addmm(torch.randn(64, 64, device="cuda"), a, b).shape)
torch.cuda.synchronize()
out["unsupported"] = fake.vg_fakecuda_unsupported_calls()
"""

INSTALL = {"pytorch": "", "vramguard": "vramguard.install()"}


@pytest.mark.parametrize("setup", ["pytorch", "vramguard", "phantom"])
def test_matmuls_run(setup):
    """The brief's ops, with PyTorch's allocator, with vramguard's, and on a
    phantom (device memory without host pages: nothing may touch it)."""
    env = {"VG_FAKECUDA_PHANTOM": "1"} if setup == "phantom" else {}
    out = run(INSTALL.get(setup, ""), OPS, **env)
    assert out["mm"] == [64, 64]
    assert out["linear_grads"] == [[32, 64], [32]]
    assert out["bmm"] == [4, 8, 5]
    assert out["bf16_linear"] == ["torch.bfloat16", [64, 32]]
    assert out["addmm"] == [64, 64]
    assert out["unsupported"] == 0                     # no stub was reached
    assert "is not modelled" not in out["_stderr"]


def test_both_libraries_are_used():
    """float32 a @ b goes to cuBLAS, a Linear with bias to cuBLASLt (its
    fused bias epilogue): VG_FAKECUDA_TRACE names the computing calls."""
    out = run("""
        a = torch.randn(64, 64, device="cuda")
        a @ a
        torch.nn.Linear(64, 32).cuda()(a)
    """, VG_FAKECUDA_TRACE="1")
    trace = out["_stderr"]
    assert "vg_fakecuda: cublasCreate_v2" in trace
    assert re.search(r"^vg_fakecuda: cublas\w*[Gg]emm\w*$", trace, re.M)
    assert "vg_fakecuda: cublasLtMatmulAlgoGetHeuristic" in trace
    assert "vg_fakecuda: cublasLtMatmul\n" in trace


@pytest.mark.parametrize("allocator", ["pytorch", "vramguard"])
def test_workspaces_go_through_the_allocator(allocator):
    out = run(INSTALL[allocator], """
        a = torch.randn(64, 64, device="cuda")
        b = torch.randn(64, 64, device="cuda")
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        c = a @ b
        # A PyTorch that keeps its workspace bound to the handle after the
        # call (2.10; 2.15 only with TORCH_CUBLAS_WORKSPACE_CACHE=1): cleared,
        # it is the allocator's again, and what stays is the result
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        torch._C._cuda_clearCublasWorkspaces()
        out["held"] = held - torch.cuda.memory_allocated()
        out["mm_kept"] = torch.cuda.memory_allocated() - before
        out["mm_peak"] = torch.cuda.max_memory_allocated() - before
        out["reserved"] = torch.cuda.memory_reserved()
        # cuBLAS's own default workspace: on the device, in no allocator
        out["outside"] = fake.vg_fakecuda_bytes_in_use(0) - torch.cuda.memory_reserved()
        lin = torch.nn.Linear(64, 32).cuda()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y = lin(a)
        out["lt_kept"] = torch.cuda.memory_allocated() - before
        out["lt_peak"] = torch.cuda.max_memory_allocated() - before
    """)
    # The result stays; PyTorch's 32 MiB cuBLAS workspace lived for the call.
    assert out["mm_kept"] == 16 * 1024
    assert out["mm_peak"] == 16 * 1024 + 32 * MiB
    assert out["reserved"] >= 32 * MiB
    assert out["outside"] == 32 * MiB
    if out["held"]:
        # its cuBLAS workspace comes back for the Linear, in cuBLASLt's peak
        lacking("keeps its cuBLAS workspace bound to the handle after the call (2.15 does only "
                "with TORCH_CUBLAS_WORKSPACE_CACHE=1), so cuBLASLt's peak is not its own")
    # cuBLASLt's 1 MiB workspace, the same way.
    assert out["lt_kept"] == 64 * 32 * 4
    assert out["lt_peak"] == 64 * 32 * 4 + 1 * MiB


def test_workspace_settings_are_followed():
    """CUBLAS_WORKSPACE_CONFIG sizes PyTorch's workspace (:4096:2 is 8 MiB),
    and with TORCH_CUBLAS_WORKSPACE_CACHE=1 PyTorch keeps it bound to the
    handle, so it stays allocated; CUBLASLT_WORKSPACE_SIZE (KiB) sizes
    cuBLASLt's."""
    out = run("""
        a = torch.randn(64, 64, device="cuda")
        before = torch.cuda.memory_allocated()
        c = a @ a
        out["kept"] = torch.cuda.memory_allocated() - before
        lin = torch.nn.Linear(64, 32, bias=True).cuda()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        y = lin(a)
        out["lt_peak"] = torch.cuda.max_memory_allocated() - before
    """, CUBLAS_WORKSPACE_CONFIG=":4096:2", TORCH_CUBLAS_WORKSPACE_CACHE="1",
        TORCH_CUBLASLT_UNIFIED_WORKSPACE="0", CUBLASLT_WORKSPACE_SIZE="4096")
    assert out["kept"] == 16 * 1024 + 8 * MiB
    assert out["lt_peak"] == 64 * 32 * 4 + 4 * MiB


def test_a_full_device_refuses_the_cublas_handle():
    """cuBLAS needs device memory of its own: with 40 MiB left, PyTorch's
    32 MiB workspace fits and cuBLAS's default one does not, which a GPU
    reports as PyTorch's well-known CUBLAS_STATUS_ALLOC_FAILED when calling
    cublasCreate. Once memory is back, the same matmul runs."""
    out = run("""
        a = torch.randn(64, 64, device="cuda")
        free = torch.cuda.mem_get_info()[0]
        fill = torch.empty((free - 40 * MiB) // (2 * MiB) * (2 * MiB), dtype=torch.uint8,
                           device="cuda")
        out["error"] = error(lambda: a @ a)
        del fill
        torch.cuda.empty_cache()
        out["after"] = list((a @ a).shape)
    """, devices=1, mem="1GiB")
    if out["error"][0] == "OutOfMemoryError" and "Tried to allocate 32.00 MiB" in out["error"][1]:
        lacking("creates the cuBLAS handle before allocating its 32 MiB workspace, so the "
                "workspace, not cublasCreate, meets the full device")
    assert out["error"][0] in ("RuntimeError", "AcceleratorError")
    assert "CUBLAS_STATUS_ALLOC_FAILED" in out["error"][1]
    assert "cublasCreate" in out["error"][1]
    assert out["after"] == [64, 64]


def test_one_default_workspace_per_handle():
    """PyTorch keeps a cuBLAS handle per thread and device: autograd's
    backward runs on its own thread, so a second handle (and 32 MiB) appears
    with the first backward; a second device gets its own."""
    out = run(LEAVE_AT_EXIT, """
        lin = torch.nn.Linear(64, 64).cuda()
        x = torch.randn(8, 64, device="cuda")
        lin(x).sum().backward()
        out["dev0"] = fake.vg_fakecuda_bytes_in_use(0) - torch.cuda.memory_reserved(0)
        with torch.cuda.device(1):
            y = torch.randn(8, 8, device="cuda")
            y @ y
        out["dev1"] = fake.vg_fakecuda_bytes_in_use(1) - torch.cuda.memory_reserved(1)
    """)
    assert out["dev0"] == 2 * 32 * MiB
    assert out["dev1"] == 32 * MiB
