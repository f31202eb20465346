"""The pluggable allocator's hooks, set by install(), reached by C++ inside
the real PyTorch on the fake CUDA. Each script installs with
patch_torch=False, so that no Python patch stands between torch and
vramguard: what is seen here is the hook."""
import ctypes

import pytest

from hookrun import run

pytestmark = pytest.mark.torch

MiB = 1 << 20

ALL_SETTERS = [
    "set_init_fn", "set_reset_fn", "set_memory_fraction_fn", "set_base_alloc_fn",
    "set_record_stream_fn", "set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn",
    "set_release_pool",
]


def test_every_hook_is_set_and_init_gets_the_device_count():
    v, _ = run("""
        vramguard.install(patch_torch=False)
        out("setters", vramguard._torch._state["hooks"]["hooks"])
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
