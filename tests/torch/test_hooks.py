"""The pluggable allocator's hooks, set by install(), reached by C++ inside
the real PyTorch on the fake CUDA. Each script installs with
patch_torch=False, so that no Python patch stands between torch and
vramguard: what is seen here is the hook."""
import ctypes
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from hookrun import run
from test_fakecuda_torch import fakecuda_dir

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

MiB = 1 << 20

ALL_SETTERS = [
    "set_init_fn", "set_reset_fn", "set_memory_fraction_fn", "set_base_alloc_fn",
    "set_record_stream_fn", "set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn",
    "set_release_pool",
]


def test_every_hook_is_set_and_init_gets_the_device_count():
    v, _ = run("""
        vramguard.install(patch_torch=False)
        out("setters", vramguard.torch.install.install_state["hooks"]["hooks"])
        out("before_init", _core.torch_device_count())
        x = torch.empty(1000, device="cuda")   # CUDA's lazy init calls init_fn
        out("after_init", _core.torch_device_count())
        out("backend", torch.cuda.get_allocator_backend())
    """)
    assert v["setters"] == ALL_SETTERS
    assert v["before_init"] == -1
    assert v["after_init"] == 2
    assert v["backend"] == "pluggable"


def test_reset_fn_empties_every_device_from_cpp():
    v, _ = run("""
        vramguard.install(patch_torch=False)
        x = torch.empty(1000, device="cuda:0")
        y = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda:1")
        del x, y
        out("reserved", (heap(0, "reserved_bytes.all.current"), heap(1, "reserved_bytes.all.current")))
        out("fake_used", (fake.vg_fakecuda_bytes_in_use(0), fake.vg_fakecuda_bytes_in_use(1)))
        torch._C._cuda_emptyCache()             # C++ emptyCache -> reset_fn
        out("reserved_after", (heap(0, "reserved_bytes.all.current"), heap(1, "reserved_bytes.all.current")))
        out("fake_used_after", (fake.vg_fakecuda_bytes_in_use(0), fake.vg_fakecuda_bytes_in_use(1)))
        z = torch.empty(1000, device="cuda:0")
        del z
        torch.cuda.empty_cache()                # torch's own Python function, unpatched
        out("reserved_python", heap(0, "reserved_bytes.all.current"))
        out("empty_calls", heap(0, "num_empty_cache"))
    """)
    assert v["reserved"] == (2 * MiB, 30 * MiB)
    assert v["fake_used"] == (2 * MiB, 30 * MiB)
    assert v["reserved_after"] == (0, 0)
    assert v["fake_used_after"] == (0, 0)
    assert v["reserved_python"] == 0
    assert v["empty_calls"] == 2


def test_memory_fraction_fn_sets_the_device_budget():
    v, _ = run("""
        vramguard.install(patch_torch=False)
        torch._C._cuda_setMemoryFraction(0.25, 1)        # the C++ entry, no Python patch
        out("budget1", heap(1, "budget_bytes"))
        try:
            torch.empty(200 * MiB, dtype=torch.uint8, device="cuda:1")
        except RuntimeError as e:
            out("over_budget", str(e).splitlines()[0])
        torch.cuda.set_per_process_memory_fraction(0.5, 0)   # torch's own Python function
        out("budget0", heap(0, "budget_bytes"))
        torch._C._cuda_setMemoryFraction(0.0, 0)
        out("budget0_zero", heap(0, "budget_bytes"))
        try:
            torch.empty(1000, device="cuda:0")
        except RuntimeError as e:
            out("zero", str(e).splitlines()[0])
        for args in ((1.5, 0), (float("nan"), 0), (0.5, 2)):
            try:
                torch._C._cuda_setMemoryFraction(*args)
            except RuntimeError as e:
                out("refused_%d" % args[1], str(e))
        out("budget0_kept", heap(0, "budget_bytes"))
    """)
    assert v["budget1"] == 128 * MiB
    assert v["over_budget"].startswith("CUDA out of memory. Tried to allocate 200.00 MiB. GPU 1")
    assert v["budget0"] == 512 * MiB
    assert v["budget0_zero"] == 1
    assert v["zero"].startswith("CUDA out of memory. Tried to allocate 3.91 KiB. GPU 0")
    assert v["refused_0"] == "vramguard: invalid memory fraction nan: allowed range 0~1"
    assert v["refused_2"] == "vramguard: invalid device 2 for a memory fraction"
    assert v["budget0_kept"] == 1


def test_record_stream_fn_defers_the_free():
    v, _ = run("""
        vramguard.install(patch_torch=False)
        x = torch.empty(1000, device="cuda")
        side = torch.cuda.Stream()
        x.record_stream(torch.cuda.current_stream())   # its own stream: nothing to do
        x.record_stream(side)                          # C++ recordStream -> record_stream_fn
        x.record_stream(side)
        out("recorded", heap(0, "num_record_stream"))
        records = calls("cudaEventRecord")
        del x
        out("deferred", heap(0, "num_deferred_frees"))
        out("event_records", calls("cudaEventRecord") - records)
    """)
    assert v["recorded"] == 1
    assert v["deferred"] == 1
    assert v["event_records"] == 1


def test_base_alloc_fn_gives_the_segment():
    v, _ = run("""
        vramguard.install(patch_torch=False, arena=False)
        lib = ctypes.CDLL(_core.__file__)
        base_alloc = lib.vramguard_torch_base_alloc    # the function torch was given
        base_alloc.restype = ctypes.c_void_p
        base_alloc.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")   # the same 6 MiB segment
        size = ctypes.c_size_t(1)
        out("base_is_a", base_alloc(b.data_ptr() + 100, ctypes.byref(size)) == a.data_ptr())
        out("size", size.value)
        stranger = 0x7000_0000
        out("stranger", base_alloc(stranger, ctypes.byref(size)) == stranger and size.value == 0)
    """)
    assert v["base_is_a"] is True
    assert v["size"] == 6 * MiB
    assert v["stranger"] is True


# PyTorch's own getBaseAllocation, as C++ inside PyTorch calls it (no
# Python binding reaches it), with its exception caught: 0 and the base, or
# 1 and the exception's message.
BASE_PROBE = r"""
#include <c10/cuda/CUDACachingAllocator.h>
#include <cstdio>
#include <exception>

extern "C" int base_allocation(void *ptr, void **base, size_t *size, char *message, size_t n)
{
    try {
        *base = c10::cuda::CUDACachingAllocator::getBaseAllocation(ptr, size);
        return 0;
    } catch (const std::exception &e) {
        std::snprintf(message, n, "%s", e.what());
        return 1;
    }
}
"""

PROBE_CALL = """
        import os
        probe = ctypes.CDLL(os.environ["VG_TEST_BASE_PROBE"])
        probe.base_allocation.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                          ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]
        def base_allocation(ptr):
            base, size, message = ctypes.c_void_p(), ctypes.c_size_t(1), ctypes.create_string_buffer(1024)
            rc = probe.base_allocation(ptr, ctypes.byref(base), ctypes.byref(size), message, 1024)
            return rc, base.value, size.value, message.value.decode()
"""


@pytest.fixture(scope="module")
def base_probe(tmp_path_factory):
    """BASE_PROBE built against the installed torch and the CUDA headers the
    fake was built with."""
    torch_dir = Path(importlib.util.find_spec("torch").origin).parent
    cuda_mk = (fakecuda_dir() / "cuda.mk").read_text()
    cuda_inc = re.search(r"^CUDA_INC := (.*)$", cuda_mk, re.M).group(1)
    work = tmp_path_factory.mktemp("base_probe")
    source, library = work / "base_probe.cc", work / "base_probe.so"
    source.write_text(BASE_PROBE)
    subprocess.run(["c++", "-std=c++20", "-O1", "-fPIC", "-shared", "-I", str(torch_dir / "include"),
                    "-I", cuda_inc, str(source), "-o", str(library), "-L", str(torch_dir / "lib"),
                    "-lc10_cuda", "-lc10", "-Wl,-rpath," + str(torch_dir / "lib")],
                   check=True, capture_output=True, timeout=300)
    return str(library)


ARENA_REFUSAL = (
    "vramguard: the CUDA memory at {ptr} lies in vramguard's arena on GPU {device}, virtual memory "
    "mapped page by page (cuMemMap, as PyTorch's expandable segments), which has no base "
    "allocation that CUDA IPC (cudaIpcGetMemHandle) can share with another process. To share CUDA "
    "tensors between processes, allocate them with segments: vramguard.install(arena=False), or "
    "VRAMGUARD_ARENA=0 in the environment, in the process that allocates them."
)


def test_base_allocation_through_pytorch_is_the_segment(base_probe):
    v, _ = run(PROBE_CALL + """
        vramguard.install(patch_torch=False, arena=False)
        a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")   # the same 6 MiB segment
        rc, base, size, message = base_allocation(b.data_ptr() + 100)
        out("answer", (rc, base == a.data_ptr(), size, message))
    """, VG_TEST_BASE_PROBE=base_probe)
    assert v["answer"] == (0, True, 6 * MiB, "")


def test_base_allocation_of_an_arena_block_is_refused_in_words(base_probe):
    v, _ = run(PROBE_CALL + """
        vramguard.install(patch_torch=False)                          # the arena: the default
        x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda:1")
        out("arena", vramguard.stats(1)["reserved_bytes.all.current"])
        out("ptr", "%#x" % (x.data_ptr() + 100))
        out("answer", base_allocation(x.data_ptr() + 100))
        out("live", heap(1))                                          # the heap is as it was
        del x
        out("after", heap(1))
    """, VG_TEST_BASE_PROBE=base_probe)
    assert v["arena"] == 4 * MiB                                      # two 2 MiB pages mapped
    assert v["answer"] == (1, None, 1, ARENA_REFUSAL.format(ptr=v["ptr"], device=1))
    assert v["live"] == 1
    assert v["after"] == 0
