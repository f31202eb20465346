"""vramguard.install() and the torch.cuda functions it patches, against a
stand-in for torch (tests/fake_torch.py) and simulated devices: everything
but the GPU itself. Each case runs in a fresh interpreter, because device
heaps and the installed allocator last as long as the process."""
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def run(code):
    script = "import sys\nsys.path.insert(0, %r)\n" % str(TESTS) + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_without_torch_install_says_so():
    out = run("""
        sys.modules["torch"] = None   # import torch fails
        import vramguard
        try:
            vramguard.install()
        except vramguard.VramguardError as e:
            print(e)
    """)
    assert "PyTorch is not installed" in out


def test_cpu_build_and_no_gpu_are_told_apart():
    out = run("""
        import fake_torch, vramguard
        fake_torch.install_fake(available=False, cuda=None)
        try:
            vramguard.install()
        except vramguard.VramguardError as e:
            print("A", e)
        fake_torch.install_fake(available=False, cuda="13.0")
        try:
            vramguard.install()
        except vramguard.VramguardError as e:
            print("B", e)
    """)
    assert "A this PyTorch (2.11.0+fake) is built without CUDA" in out
    assert "B PyTorch sees no CUDA GPU" in out


def test_after_cuda_is_initialised_install_says_restart():
    out = run("""
        import fake_torch, vramguard
        vramguard._core.simulate_devices(16 << 30)
        fake_torch.install_fake(initialized=True)
        try:
            vramguard.install()
        except vramguard.VramguardError as e:
            print("A", e)
        fake_torch.install_fake(swap_error=True)
        try:
            vramguard.install()
        except vramguard.VramguardError as e:
            print("B", e, "| cause:", e.__cause__)
        print(vramguard.is_installed())
    """)
    assert "A PyTorch's CUDA allocator is already in use" in out and "Restart the runtime" in out
    assert "B PyTorch's CUDA allocator is already in use" in out and "Can't swap" in out
    assert out.strip().endswith("False")


def test_bad_settings_are_refused_before_anything_changes():
    out = run("""
        import fake_torch, vramguard
        vramguard._core.simulate_devices(16 << 30)
        fake_torch.install_fake()
        for budget in ("-1GiB", 1.5, "0%", "lots", 0, "1"):
            try:
                vramguard.install(budget=budget)
            except (ValueError, TypeError) as e:
                print("refused", repr(budget))
        for gc in (0, 1.5, "half"):
            try:
                vramguard.install(gc_threshold=gc)
            except ValueError as e:
                print("refused gc", repr(gc))
        print("installed", vramguard.is_installed())
    """)
    assert out.count("refused") == 9 and "installed False" in out


def test_install_patches_torch_and_reads_the_same_heaps():
    out = run("""
        import warnings
        import fake_torch, vramguard
        MiB = 1 << 20
        vramguard._core.simulate_devices(16 << 30)
        torch, state = fake_torch.install_fake()
        torch.backends.cudnn.benchmark = True
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            vramguard.install(budget="1GiB", gc_threshold=0.9)
            torch.backends.cudnn.benchmark = True   # later, as training scripts do
        print("benchmark", torch.backends.cudnn.benchmark, len(caught), "cacheInfo" in str(caught[0].message))
        alloc = state["allocator"]
        assert alloc.path == vramguard._core.__file__
        p = alloc.malloc(100 * MiB, 0, None)
        q = alloc.malloc(1000, 0, None)
        print("null for 0", alloc.malloc(0, 0, None))
        print("allocated", torch.cuda.memory_allocated() == 100 * MiB + 1024)
        print("reserved", torch.cuda.memory_reserved(0) == 100 * MiB + 2 * MiB)
        s = torch.cuda.memory_stats("cuda:0")
        print("stats", s["allocated_bytes.all.current"], s["budget_bytes"] == 1 << 30, list(s) == sorted(s))
        print("nested", torch.cuda.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["current"])
        print("summary", "vramguard memory summary, device 0" in torch.cuda.memory_summary())
        alloc.free(p, 100 * MiB, 0, None)
        print("peak", torch.cuda.max_memory_allocated() == 100 * MiB + 1024)
        torch.cuda.reset_peak_memory_stats()
        print("peak after reset", torch.cuda.max_memory_allocated() == 1024)
        torch.cuda.empty_cache()
        print("after empty_cache", torch.cuda.memory_reserved() == 2 * MiB)
        torch.cuda.set_per_process_memory_fraction(0.5)
        print("fraction budget", vramguard.stats()["budget_bytes"] == 8 << 30)
        torch.cuda.reset_accumulated_memory_stats()
        print("accumulated", vramguard.stats()["allocated_bytes.all.allocated"], vramguard.stats()["num_device_alloc"])
        r = alloc.malloc(5 * MiB, 0, None)
        torch.Tensor(r).record_stream(type("S", (), {"cuda_stream": 77})())
        alloc.free(r, 5 * MiB, 0, None)
        print("deferred", vramguard.stats()["num_deferred_frees"])
        vramguard.install(budget="2GiB")   # again: new settings, same allocator
        print("budget now", vramguard.stats()["budget_bytes"] == 2 << 30, state["allocator"] is alloc)
        alloc.free(0xdead000, 512, 0, None)  # never raises
        print("invalid", vramguard.stats()["num_invalid_frees"])
        with vramguard.record() as rec:
            alloc.free(alloc.malloc(3 * MiB, 0, None), 3 * MiB, 0, None)
        print("recorded", rec.trace.counts()["alloc"])
        print(vramguard.summary().splitlines()[1].strip())
        alloc.free(q, 1000, 0, None)
        vramguard._core.device_heap(0).check()
    """)
    expected = [
        "benchmark False 1 True", "null for 0 None", "allocated True", "reserved True",
        f"stats {100 * (1 << 20) + 1024} True True", f"nested {100 * (1 << 20) + 1024}", "summary True",
        "peak True", "peak after reset True", "after empty_cache True", "fraction budget True",
        "accumulated 0 0", "deferred 1", "budget now True True", "invalid 1", "recorded 1",
    ]
    for line in expected:
        assert line in out, (line, out)
    assert "vramguard memory summary, device 0 (budget 2.00 GiB" in out


def test_settings_from_the_environment():
    out = run("""
        import os
        os.environ["VRAMGUARD_BUDGET"] = "80%"
        os.environ["VRAMGUARD_GC_THRESHOLD"] = "0.75"
        import fake_torch, vramguard
        vramguard._core.simulate_devices(10 << 30)
        torch, state = fake_torch.install_fake()
        vramguard.install()
        s = vramguard.stats(0)
        print(s["budget_bytes"] == 8 << 30, s["gc_threshold"])
    """)
    assert "True 0.75" in out


def test_stats_before_install_and_is_oom():
    out = run("""
        import vramguard
        try:
            vramguard.stats()
        except vramguard.VramguardError as e:
            print(e)
        print(vramguard.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB.")),
              vramguard.is_oom(RuntimeError("shape mismatch")))
    """)
    assert "call vramguard.install() first" in out and "True False" in out


def test_entry_points_are_exported_from_the_module_python_imports():
    import ctypes

    import vramguard._core as core

    lib = ctypes.CDLL(core.__file__)
    assert lib.vramguard_torch_malloc and lib.vramguard_torch_free
