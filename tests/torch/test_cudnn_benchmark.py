"""cuDNN's benchmark mode under vramguard, with the real
torch.backends.cudnn: every way of turning it on is noticed (a warning)
and leaves it off, because it asks the pluggable allocator for cacheInfo,
which PyTorch refuses in the middle of a convolution; the getter says the
truth; PyTorch's own checks and frozen flags still hold."""
import pytest

from fakegpu import run

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]


def test_benchmark_stays_off_and_says_so():
    out = run("""
        cudnn = torch.backends.cudnn
        def attempt(fn):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn()
                state = [cudnn.benchmark, torch._C._get_cudnn_benchmark()]
            return state + [[str(w.message).split(".")[0] for w in caught]]
        cudnn.benchmark = True                                    # set before install, as scripts do
        out["before_install"] = cudnn.benchmark
        out["install"] = attempt(vramguard.install)
        out["property"] = attempt(lambda: setattr(cudnn, "benchmark", True))
        def with_flags():
            with cudnn.flags(enabled=True, benchmark=True):
                out["inside_flags"] = [cudnn.benchmark, torch._C._get_cudnn_benchmark()]
        out["flags"] = attempt(with_flags)
        out["set_flags"] = attempt(lambda: cudnn.set_flags(True, True))
        out["c_setter"] = attempt(lambda: torch._C._set_cudnn_benchmark(True))
        out["off"] = attempt(lambda: setattr(cudnn, "benchmark", False))
        out["not_a_bool"] = error(setattr, cudnn, "benchmark", 1)
        torch.backends.disable_global_flags()
        out["frozen"] = error(setattr, cudnn, "benchmark", False)
        x = torch.empty(8, device="cuda")                         # allocation unaffected
        out["allocated"] = torch.cuda.memory_allocated()
    """)
    assert out["before_install"] is True
    warning = "vramguard: torch"
    assert out["install"] == [False, False, [warning]]
    assert out["property"] == [False, False, [warning]]
    assert out["inside_flags"] == [False, False]
    assert out["flags"] == [False, False, [warning]]
    assert out["set_flags"] == [False, False, [warning]]
    assert out["c_setter"] == [False, False, [warning]]
    assert out["off"] == [False, False, []]
    assert out["not_a_bool"] == ["RuntimeError", "set_benchmark_cudnn expects a bool, but got int"]
    assert out["frozen"][0] == "RuntimeError" and "disable_global_flags" in out["frozen"][1]
    assert out["allocated"] == 512
