"""What PyTorch itself refuses under any pluggable allocator, vramguard's
included, measured with the real PyTorch on the fake CUDA: the exact
errors users see (docs/pytorch.md and the README list them). install()
runs with patch_torch=False here, to show the bare pluggable allocator.
(MemPool and reduce-overhead's checkpoint state: test_graph_pools.py.)"""
import pytest

from fakegpu import MiB, run
from torchfeature import has

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

UNSUPPORTED = "CUDAPluggableAllocator does not yet support {}. If you need it, please file an issue " \
              "describing your use case."


def test_what_the_pluggable_allocator_refuses():
    out = run("""
        vramguard.install(patch_torch=False)
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        import torch.multiprocessing.reductions as reductions
        calls = {
            "memory_stats": lambda: torch.cuda.memory_stats(),
            "memory_allocated": lambda: torch.cuda.memory_allocated(),
            "reset_peak_memory_stats": lambda: torch.cuda.reset_peak_memory_stats(),
            "get_per_process_memory_fraction": lambda: torch.cuda.get_per_process_memory_fraction(),
            "memory_snapshot": lambda: torch.cuda.memory_snapshot(),
            "_record_memory_history": lambda: torch.cuda.memory._record_memory_history(),
            "ipc": lambda: reductions.reduce_tensor(x),
            "oom_observer": lambda: torch._C._cuda_attach_out_of_memory_observer(lambda *a: None),
        }
        out["errors"] = {name: error(call) for name, call in calls.items()}
        if hasattr(torch.accelerator, "memory_allocated"):   # PyTorch 2.9 on
            out["accelerator_allocated"] = torch.accelerator.memory_allocated()   # silently the unused native one
        p = torch.cuda.caching_allocator_alloc(1000)                         # these go through vramguard
        out["raw_alloc"] = heap()["allocated_bytes.all.current"]
        torch.cuda.caching_allocator_delete(p)
        out["backend"] = torch.cuda.get_allocator_backend()
        out["host_stats"] = isinstance(torch.cuda.host_memory_stats(), dict)
    """)
    e = out["errors"]
    assert e["memory_stats"] == ["RuntimeError", UNSUPPORTED.format("getDeviceStats")]
    assert e["memory_allocated"] == ["RuntimeError", UNSUPPORTED.format("getDeviceStats")]
    assert e["reset_peak_memory_stats"] == ["RuntimeError", UNSUPPORTED.format("resetPeakStats")]
    assert e["get_per_process_memory_fraction"] == ["RuntimeError", UNSUPPORTED.format("getMemoryFraction")]
    assert e["memory_snapshot"] == ["RuntimeError", UNSUPPORTED.format("snapshot")]
    assert e["_record_memory_history"] == ["RuntimeError", UNSUPPORTED.format("recordHistory")]
    assert e["ipc"] == ["RuntimeError", UNSUPPORTED.format("shareIPcHandle")]      # sic
    assert e["oom_observer"] == ["RuntimeError", UNSUPPORTED.format("attachOutOfMemoryObserver")]
    if has("torch.accelerator.memory_allocated"):
        assert out["accelerator_allocated"] == 0
    assert out["raw_alloc"] == MiB + 1024
    assert out["backend"] == "pluggable"
    assert out["host_stats"] is True
