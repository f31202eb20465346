"""A device error is a device error, not an out-of-memory; a stream belongs
to a device; the CUDA runtime found is the one torch loads, never a second.
Cases that need a fresh process (device heaps, the runtime) run in one."""
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import vramguard
import functools

import vramguard

# These tests are about the segments policy's own mechanics (segments
# reserved, split, coalesced, shrunk, released), not the default's.
Heap = functools.partial(vramguard.Heap, policy="segments")

MiB = 1 << 20
GiB = 1 << 30
ROOT = Path(__file__).resolve().parent.parent


def run(code, cwd=None):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_device_error_is_a_runtime_error_not_an_oom():
    heap = Heap(GiB)
    cached = heap.malloc(30 * MiB)
    heap.free(cached)
    heap.fail_device(1)
    with pytest.raises(RuntimeError) as info:
        heap.malloc(40 * MiB)
    exc = info.value
    assert not isinstance(exc, MemoryError)
    assert str(exc).startswith("Simulated device error: an illegal memory access was encountered\n")
    assert "out of memory" not in str(exc) and not vramguard.is_oom(exc)
    assert (exc.error_name, exc.error_code, exc.failed_call) == ("cudaErrorIllegalAddress", 700, "cudaMalloc")
    assert exc.requested_bytes == 40 * MiB and exc.device == 0
    s = heap.stats()
    assert (s["num_device_errors"], s["num_ooms"], s["num_alloc_retries"]) == (1, 0, 0)
    assert s["reserved_bytes.all.current"] == 30 * MiB  # nothing released for it
    assert "| So far: 1 device error " in vramguard.format_summary(s)
    assert "device errors 1" in vramguard.format_summary(s, verbose=True)
    p = heap.malloc(40 * MiB)  # one-shot: served now
    heap.free(p)
    heap.check()


def test_sticky_device_error_keeps_failing_until_cleared():
    heap = Heap(GiB)
    heap.fail_device(1, sticky=True)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="^Simulated device error: "):
            heap.malloc(8 * MiB)
    assert heap.stats()["num_device_errors"] == 3 and heap.stats()["num_ooms"] == 0
    heap.fail_device(0)
    heap.free(heap.malloc(8 * MiB))


def test_record_stream_of_another_devices_default_stream():
    out = run("""
        import vramguard
        core = vramguard._core
        core.simulate_devices(1 << 30)
        h = core.device_heap(0)
        p = h.malloc(1000)
        print("own", core.record_stream_any(p, 0), h.stats()["num_record_stream"])
        print("other", core.record_stream_any(p, 0, 1), h.stats()["num_record_stream"])
        h.free(p)
        q = h.malloc(1000); h.free(q)
        print("waits", q != p)
        h.complete_stream(0)        # device 0's default stream: not the one
        q = h.malloc(1000); h.free(q)
        print("still", q != p)
        h.complete_stream(0, 1)     # device 1's
        q = h.malloc(1000); h.free(q)
        print("reused", q == p)
        try:
            core.record_stream_any(p, 0, 64)
        except ValueError as e:
            print("bad", e)
        h.check()
    """)
    for line in ("own True 0", "other True 1", "waits True", "still True", "reused True",
                 "bad stream device must be in 0..63"):
        assert line in out, (line, out)


@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler to build a fake CUDA runtime")
def test_cuda_runtime_before_import_torch_finds_torchs_own(tmp_path):
    """A `torch` whose import loads its own libcudart.so.13 (here a fake,
    from a directory nothing else searches): cuda_runtime() called before
    `import torch` must find that one, and load no second runtime."""
    lib = tmp_path / "torch" / "lib" / "libcudart.so.13"
    lib.parent.mkdir(parents=True)
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-o", str(lib),
                    str(ROOT / "tests" / "c" / "fake_cudart.c")], check=True)
    (tmp_path / "torch" / "__init__.py").write_text(
        "import ctypes, os\n"
        "_cudart = ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'lib', 'libcudart.so.13'))\n"
    )
    out = run(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import vramguard
        print("torch before", "torch" in sys.modules)
        info = vramguard._core.cuda_runtime()
        print("torch after", "torch" in sys.modules)
        print("found", info["found"], info["device_count"])
        print("source", info["source"])
        maps = open("/proc/self/maps").read().split("\\n")
        print("runtimes", len({{line.split()[-1] for line in maps if "libcudart" in line}}))
    """)
    assert "torch before False" in out and "torch after True" in out
    assert "found True 2" in out
    assert f"source {lib} (already loaded)" in out
    assert "runtimes 1" in out
