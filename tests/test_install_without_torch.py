"""What needs no PyTorch: install() without it, the API before install(),
is_oom(), and the entry points PyTorch will look up. Everything else about
install() runs against the real PyTorch in tests/torch (make check-torch)."""
import ctypes
import subprocess
import sys
import textwrap


def run(code):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_without_torch_install_says_so():
    out = run("""
        import sys
        sys.modules["torch"] = None   # import torch fails, installed or not
        import vramguard
        try:
            vramguard.install()
        except vramguard.VramguardError as e:
            print(e)
        print(vramguard.is_installed())
    """)
    assert out.startswith("PyTorch is not installed: vramguard.install() replaces PyTorch's CUDA allocator.")
    assert out.strip().endswith("False")


def test_the_api_before_install_and_is_oom():
    import vramguard

    for call in (vramguard.stats, vramguard.summary, vramguard.empty_cache, vramguard.reset_peaks):
        try:
            call()
        except vramguard.VramguardError as e:
            assert str(e) == "vramguard is not installed: call vramguard.install() first"
        else:
            raise AssertionError(call)
    assert vramguard.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB."))
    assert not vramguard.is_oom(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not vramguard.is_oom(ValueError("out of memory"))


def test_entry_points_are_exported_from_the_module_python_imports():
    import vramguard._core as core

    lib = ctypes.CDLL(core.__file__)
    assert lib.vramguard_torch_malloc and lib.vramguard_torch_free
