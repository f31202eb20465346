"""The real PyTorch on the fake CUDA (csrc/phantom): proof that the fake
carries PyTorch's own allocator, before vramguard is put in its place.

Run by `make check-torch` (PyTorch in .venv-torch, the fake preloaded);
`make check` leaves these out (marker `torch`). Each case runs in a fresh
interpreter, because the fake's devices are configured from the
environment when the process first touches CUDA: two devices, 1 GiB and
512 MiB, unless a case says otherwise. The numbers below follow from those
sizes and from PyTorch's caching rules (2 MiB segments for small blocks,
20 MiB ones for blocks of 1-10 MiB, 512-byte rounding).
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchfeature import lacking

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
GiB = 1 << 30

# Every script starts here: PyTorch, and the fake's knobs through ctypes
# (the fake is preloaded, so its symbols are in the global scope).
PRELUDE = """
import ctypes, sys, torch
fake = ctypes.CDLL(None)
if not hasattr(fake, "vg_fakecuda_reset"):
    sys.exit("the fake CUDA is not preloaded")
for name in ("capacity", "bytes_in_use", "peak_bytes"):
    getattr(fake, "vg_fakecuda_" + name).restype = ctypes.c_longlong
for name in ("calls", "malloc_calls", "free_calls", "live_allocations", "unsupported_calls"):
    getattr(fake, "vg_fakecuda_" + name).restype = ctypes.c_long
fake.vg_fakecuda_calls.argtypes = [ctypes.c_char_p]
fake.vg_fakecuda_fail_calls.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_long, ctypes.c_int]
fake.vg_fakecuda_fail_malloc.argtypes = [ctypes.c_long, ctypes.c_int]
fake.vg_fakecuda_last_unsupported.restype = ctypes.c_char_p
MiB, GiB = 1 << 20, 1 << 30
"""


def preload():
    """LD_PRELOAD for the fake: as given (make check-torch sets it), else
    the libraries `make fakecuda` built."""
    given = os.environ.get("LD_PRELOAD", "")
    if "libcudart" in given:
        return given
    listing = ROOT / "build" / "fakecuda" / "LD_PRELOAD"
    if not listing.is_file():
        pytest.fail("the fake CUDA is not built: make fakecuda TORCH_PYTHON=%s" % sys.executable)
    return listing.read_text().strip()


def fakecuda_dir():
    """The directory of the fake's build that preload() lists (each tier has
    its own: build/fakecuda, build/fakecuda-cu12)."""
    cudart = [p for p in preload().split() if "libcudart" in os.path.basename(p)]
    return Path(cudart[0]).parent


def run(code, **env):
    """Runs PRELUDE + code in a fresh interpreter on the fake; returns stdout.
    env: extra environment (VG_FAKECUDA_DEVICES and VG_FAKECUDA_MEM default
    to two devices of 1 GiB and 512 MiB)."""
    full_env = dict(os.environ, LD_PRELOAD=preload(), VG_FAKECUDA_DEVICES="2",
                    VG_FAKECUDA_MEM="1GiB,512MiB", PYTHONUNBUFFERED="1")
    full_env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    full_env.update(env)
    script = PRELUDE + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=full_env, timeout=300)
    assert proc.returncode == 0, "exit %d\n%s%s" % (proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def values(out):
    """The script's `key=value` lines as a dict of strings."""
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_devices_and_memory_info():
    v = values(run("""
        print("available=%s" % torch.cuda.is_available())
        print("count=%d" % torch.cuda.device_count())
        p0, p1 = torch.cuda.get_device_properties(0), torch.cuda.get_device_properties(1)
        print("total0=%d" % p0.total_memory)
        print("total1=%d" % p1.total_memory)
        print("name=%s" % p0.name)
        print("cc=%d.%d" % (p0.major, p0.minor))
        print("info0=%d,%d" % torch.cuda.mem_get_info(0))
        print("info1=%d,%d" % torch.cuda.mem_get_info(1))
    """))
    assert v["available"] == "True"
    assert v["count"] == "2"
    assert int(v["total0"]) == 1 * GiB
    assert int(v["total1"]) == 512 * MiB
    assert v["name"] == "vramguard fake GPU"
    assert v["cc"] == "9.0"
    assert v["info0"] == "%d,%d" % (GiB, GiB)
    assert v["info1"] == "%d,%d" % (512 * MiB, 512 * MiB)


def test_empty_del_and_empty_cache():
    v = values(run("""
        x = torch.empty(1000, device="cuda")          # 4000 bytes -> a 4096-byte block
        print("allocated=%d" % torch.cuda.memory_allocated())
        print("reserved=%d" % torch.cuda.memory_reserved())
        print("fake_used=%d" % fake.vg_fakecuda_bytes_in_use(0))
        print("free=%d" % torch.cuda.mem_get_info()[0])
        del x
        print("allocated_after_del=%d" % torch.cuda.memory_allocated())
        print("fake_used_after_del=%d" % fake.vg_fakecuda_bytes_in_use(0))
        torch.cuda.empty_cache()
        print("fake_used_after_empty=%d" % fake.vg_fakecuda_bytes_in_use(0))
        print("mallocs=%d frees=%d" % (fake.vg_fakecuda_malloc_calls(), fake.vg_fakecuda_free_calls()))
    """))
    assert int(v["allocated"]) == 4096
    assert int(v["reserved"]) == 2 * MiB              # one small-pool segment
    assert int(v["fake_used"]) == 2 * MiB             # ... which is one cudaMalloc
    assert int(v["free"]) == 1 * GiB - 2 * MiB
    assert int(v["allocated_after_del"]) == 0
    assert int(v["fake_used_after_del"]) == 2 * MiB   # cached, not freed
    assert int(v["fake_used_after_empty"]) == 0
    assert v["mallocs"] == "1 frees=1"


def test_copies_round_trip_and_zeros():
    v = values(run("""
        a = torch.arange(1 << 20, dtype=torch.float32)       # 4 MiB
        b = a.cuda()
        print("round_trip=%s" % torch.equal(b.cpu(), a))
        c = b.to("cuda:1")                                    # device to device
        print("peer=%s" % torch.equal(c.cpu(), a))
        old = b.data_ptr()
        del b
        memsets = fake.vg_fakecuda_calls(b"cudaMemsetAsync")
        z = torch.zeros(1 << 20, device="cuda")              # b's block, b's bytes: a memset
        print("memset=%s" % (fake.vg_fakecuda_calls(b"cudaMemsetAsync") > memsets))
        print("reused=%s" % (z.data_ptr() == old))
        print("zeros=%s" % (z.cpu().abs().sum().item() == 0))
        h = torch.arange(8, dtype=torch.int64).pin_memory()
        print("pinned=%s" % h.is_pinned())
        d = h.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        print("pinned_round_trip=%s" % d.cpu().tolist())
    """))
    assert v["round_trip"] == "True"
    assert v["peer"] == "True"
    assert v["reused"] == "True"
    assert v["pinned"] == "True"
    assert v["pinned_round_trip"] == str(list(range(8)))
    if v["memset"] == "False":
        lacking("fills torch.zeros with a kernel, not cudaMemsetAsync, and the fake runs no kernels")
    assert v["zeros"] == "True"


def test_streams_and_events():
    v = values(run("""
        s = torch.cuda.Stream(priority=-1)
        a = torch.arange(10, dtype=torch.float32)
        with torch.cuda.stream(s):
            b = a.to("cuda", non_blocking=True)
            e = torch.cuda.Event(enable_timing=True)
            e.record()
        torch.cuda.current_stream().wait_stream(s)
        s.synchronize()
        print("stream_query=%s" % s.query())
        print("stream_values=%s" % torch.equal(b.cpu(), a))
        print("priority=%d" % s.priority)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        print("elapsed_ok=%s" % (0 <= ms < 1000))
        print("event_query=%s" % end.query())
        print("records=%d" % (fake.vg_fakecuda_calls(b"cudaEventRecord") +
                              fake.vg_fakecuda_calls(b"cudaEventRecordWithFlags")))
    """))
    assert v["stream_query"] == "True"
    assert v["stream_values"] == "True"
    assert v["priority"] == "-1"
    assert v["elapsed_ok"] == "True"
    assert v["event_query"] == "True"
    assert v["records"] == "4"  # e, start, end, and the one wait_stream records


def test_second_device():
    v = values(run("""
        x = torch.empty(256, 1024, device="cuda:1")          # 1 MiB
        print("device=%s" % x.device)
        print("allocated1=%d" % torch.cuda.memory_allocated(1))
        print("allocated0=%d" % torch.cuda.memory_allocated(0))
        print("fake_used1=%d" % fake.vg_fakecuda_bytes_in_use(1))
        print("info1=%d,%d" % torch.cuda.mem_get_info(1))
    """))
    assert v["device"] == "cuda:1"
    assert int(v["allocated1"]) == 1 * MiB
    assert int(v["allocated0"]) == 0
    assert int(v["fake_used1"]) == 2 * MiB           # a 1 MiB block is small: a 2 MiB segment
    assert v["info1"] == "%d,%d" % (510 * MiB, 512 * MiB)


def test_memory_summary():
    out = run("""
        x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")  # 3 MiB in a 20 MiB segment
        print(torch.cuda.memory_summary())
        print("reserved=%d" % torch.cuda.memory_reserved())
    """)
    assert "PyTorch CUDA memory summary, device ID 0" in out
    assert "Allocated memory" in out and "3072 KiB" in out
    assert int(values(out)["reserved"]) == 20 * MiB


def test_native_oom():
    v = values(run("""
        keep = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(GiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            print("message=%s" % str(e).splitlines()[0])
        print("ooms=%d" % torch.cuda.memory_stats()["num_ooms"])
        print("fake_used=%d" % fake.vg_fakecuda_bytes_in_use(0))
        small = torch.empty(MiB, dtype=torch.uint8, device="cuda")   # still works
        print("after=%d" % torch.cuda.memory_allocated())
    """))
    assert v["message"].startswith("CUDA out of memory. Tried to allocate 1024.00 MiB. "
                                   "GPU 0 has a total capacity of 1024.00 MiB of which 924.00 MiB is free.")
    assert v["ooms"] == "1"
    assert int(v["fake_used"]) == 100 * MiB
    assert int(v["after"]) == 101 * MiB


def test_injected_malloc_failures_oom_versus_other_errors():
    """What vramguard must tell apart: cudaErrorMemoryAllocation is an
    out-of-memory; any other code is an error of its own."""
    v = values(run("""
        # cudaErrorMemoryAllocation on every cudaMalloc: PyTorch frees its
        # cache, retries, and gives up with an out-of-memory error.
        assert fake.vg_fakecuda_fail_calls(b"cudaMalloc", 1, -1, 2) == 0
        try:
            torch.empty(MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            print("first=oom")
        print("oom_mallocs=%d" % fake.vg_fakecuda_malloc_calls())
        fake.vg_fakecuda_reset()
        # cudaErrorIllegalAddress, once: not an out-of-memory, raised as itself.
        assert fake.vg_fakecuda_fail_malloc(1, 700) == 0
        try:
            torch.empty(MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            print("second=oom")
        except RuntimeError as e:
            print("second=%s: %s" % (type(e).__name__, str(e).splitlines()[0]))
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")  # the faults were one-shot
        print("mallocs=%d" % fake.vg_fakecuda_malloc_calls())
    """))
    assert v["first"] == "oom"
    assert v["oom_mallocs"] == "2"
    assert v["second"] == "AcceleratorError: CUDA error: an illegal memory access was encountered"
    assert v["mallocs"] == "2"  # the failing one, and the one after it


def test_kernels_run_nothing_and_succeed():
    """A launch succeeds and computes nothing: what a kernel would write
    stays as the memory held (here the zeros of torch.zeros); the launch is
    counted, and no stub was reached."""
    v = values(run("""
        x = torch.zeros(4, device="cuda")
        y = x + 1
        torch.cuda.synchronize()
        print("y=%s" % y.cpu().tolist())
        print("launches=%d" % (fake.vg_fakecuda_calls(b"__cudaLaunchKernel")
                               + fake.vg_fakecuda_calls(b"cudaLaunchKernel")))
        print("unsupported=%d" % fake.vg_fakecuda_unsupported_calls())
        print("reads=%d" % fake.vg_fakecuda_d2h_reads())
    """))
    assert v["y"] == "[0.0, 0.0, 0.0, 0.0]"     # computed by no one
    assert int(v["launches"]) >= 1
    assert v["unsupported"] == "0"
    assert v["reads"] == "0"                     # not a phantom: copies are real


def test_phantom_device_memory_costs_no_host_memory():
    """On a phantom a 6 GiB tensor, filled, copied and written from the
    host, leaves the process's resident memory where it was; what is read
    back is zeros, counted; the device reports the preset's properties and
    its context's memory."""
    v = values(run("""
        import resource
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        x = torch.ones(3 << 29, device="cuda")          # 6 GiB, a memset-like fill
        y = x.clone()                                   # 6 GiB more, a device-to-device copy
        x[:1 << 20].copy_(torch.full((1 << 20,), 2.0).pin_memory())   # host to device, dropped
        print("grown_mib=%d" % ((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10))
        print("allocated=%d" % torch.cuda.memory_allocated())
        print("read=%s" % y[:2].tolist())
        print("reads=%d" % fake.vg_fakecuda_d2h_reads())
        p = torch.cuda.get_device_properties(0)
        print("props=%s|%d.%d|%d|%d" % (p.name, p.major, p.minor, p.multi_processor_count, p.total_memory))
        free, total = torch.cuda.mem_get_info()
        print("held=%d" % (total - free - torch.cuda.memory_reserved()))
    """, VG_FAKECUDA_PHANTOM="1", VG_FAKECUDA_DEVICES="1", VG_FAKECUDA_MEM="16GiB",
        VG_FAKECUDA_NAME="Tesla T4", VG_FAKECUDA_CC="7.5", VG_FAKECUDA_SMS="40",
        VG_FAKECUDA_CONTEXT="400MiB"))
    assert int(v["grown_mib"]) < 512
    assert v["allocated"] == str(12 << 30)
    assert v["read"] == "[0.0, 0.0]"
    assert v["reads"] == "1"
    assert v["props"] == "Tesla T4|7.5|40|%d" % (16 << 30)
    assert v["held"] == str(400 << 20)


def test_sticky_error():
    v = values(run("""
        x = torch.zeros(4, device="cuda")
        fake.vg_fakecuda_set_sticky_error(700)
        try:
            torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")    # needs a new segment
        except torch.OutOfMemoryError:
            print("error=oom")
        except RuntimeError as e:
            print("error=%s" % str(e).splitlines()[0])
        print("count=%d" % torch.cuda.device_count())                   # queries still answer
        fake.vg_fakecuda_reset()
    """))
    assert v["error"] == "CUDA error: an illegal memory access was encountered"
    assert v["count"] == "2"


def test_expandable_segments():
    v = values(run("""
        a = torch.arange(25 * MiB // 4, dtype=torch.float32)          # 25 MiB
        b = a.cuda()
        print("round_trip=%s" % torch.equal(b.cpu(), a))
        print("reserved=%d" % torch.cuda.memory_reserved())
        print("fake_used=%d" % fake.vg_fakecuda_bytes_in_use(0))
        print("vmm_maps=%d" % fake.vg_fakecuda_calls(b"cuMemMap"))
        del b
        torch.cuda.empty_cache()
        print("fake_used_after=%d" % fake.vg_fakecuda_bytes_in_use(0))
        try:
            torch.empty(GiB + 1, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            print("oom=yes")
    """, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"))
    assert v["round_trip"] == "True"
    assert int(v["reserved"]) == 40 * MiB            # two 20 MiB pages of the segment
    assert int(v["fake_used"]) == 40 * MiB
    assert int(v["vmm_maps"]) >= 1
    assert int(v["fake_used_after"]) == 0
    assert v["oom"] == "yes"


def test_no_device():
    v = values(run("""
        print("available=%s count=%d" % (torch.cuda.is_available(), torch.cuda.device_count()))
    """, VG_FAKECUDA_DEVICES="0"))
    assert v["available"] == "False count=0"


@pytest.mark.parametrize("gpu", ["T4", "A100-40GB"])
def test_a_presets_phantom_reports_its_cards_l2_and_inductor_flushes_that_much(gpu):
    """The L2 size a phantom of a preset reports is the card's (deviceQuery's,
    _presets.py), in the properties PyTorch reads and in the size of the
    buffer Inductor's benchmarks allocate to flush the cache: device memory
    a compiled program's peak can hold (on a T4 4 MiB, not an H100's 50)."""
    from vramguard import PRESETS
    from vramguard.phantom import gpu as phantom

    env = {k: v for k, v in phantom.environ(gpu).items() if k != "LD_PRELOAD"}
    v = values(run("""
        from torch._inductor.runtime.benchmarking import benchmarker
        print("l2=%d" % torch.cuda.get_device_properties(0).L2_cache_size)
        print("flush=%d" % benchmarker.L2_cache_size)
    """, **env))
    want = PRESETS[gpu].l2_cache_bytes
    assert int(v["l2"]) == want and int(v["flush"]) == want
