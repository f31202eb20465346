"""torch.cuda's statistics count the private pools of CUDA graphs, as
PyTorch's own allocator does: memory a graph holds is the device's, and
memory_reserved() must agree with what the device has handed out."""
import pytest

from fakegpu import MiB, run
from torchfeature import has

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]


def test_a_private_pool_counts_in_the_device_statistics():
    out = run("""
        vramguard.install(arena=False)
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        torch._C._cuda_beginAllocateToPool(0, (7, 0))
        y = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
        torch._C._cuda_endAllocateToPool(0, (7, 0))
        s = torch.cuda.memory_stats()
        out["allocated"] = torch.cuda.memory_allocated()
        out["reserved"] = torch.cuda.memory_reserved()
        out["device_in_use"] = fake.vg_fakecuda_bytes_in_use(0)
        out["segments"] = s["segment.all.current"]
        out["by_pool"] = {k: v for k, v in s.items() if k.startswith("reserved_bytes_by_private_pools.")}
        nested = torch.cuda.memory_stats_as_nested_dict()["reserved_bytes_by_private_pools"]
        out["nested"] = {"_".join(map(str, k)): v["all"]["current"] for k, v in nested.items()}
        if hasattr(torch.accelerator, "memory_stats"):   # PyTorch 2.9 on
            out["accelerator_pool_keys"] = [k for k in torch.accelerator.memory_stats(0) if "by_private_pools" in k]
            out["accelerator_reserved"] = torch.accelerator.memory_reserved(0)
        out["summary_has_pool"] = "6.00 MiB" in torch.cuda.memory_summary()
        torch.cuda.reset_peak_memory_stats()
        out["peak_after_reset"] = torch.cuda.max_memory_allocated()
        del y
        torch._C._cuda_releasePool(0, (7, 0))
        out["after_release"] = [torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
                                fake.vg_fakecuda_bytes_in_use(0)]
        after = torch.cuda.memory_stats()
        out["current_after_release"] = {k: v for k, v in after.items()
                                        if k.startswith("reserved_bytes_by_private_pools.") and k.endswith(".current")}
    """)
    # segments: 2 MiB for x; the pool's 5 MiB block in a 10 MiB segment
    assert out["allocated"] == 6 * MiB
    assert out["reserved"] == out["device_in_use"] == 12 * MiB
    assert out["segments"] == 2
    assert out["by_pool"] == {
        f"reserved_bytes_by_private_pools.7_0.{pool}.{metric}": value
        for pool, value in (("all", 10 * MiB), ("large_pool", 10 * MiB), ("small_pool", 0))
        for metric, value in (("allocated", value), ("current", value), ("freed", 0), ("peak", value))}
    assert out["nested"] == {"7_0": 10 * MiB}
    if has("torch.accelerator.memory_stats"):
        assert out["accelerator_pool_keys"] == []
        assert out["accelerator_reserved"] == 12 * MiB
    assert out["summary_has_pool"]
    assert out["peak_after_reset"] == 6 * MiB
    assert out["after_release"] == [MiB, 2 * MiB, 2 * MiB]
    # as PyTorch's allocator, the released pool's entry stays, at 0
    assert out["current_after_release"] == {
        f"reserved_bytes_by_private_pools.7_0.{pool}.current": 0 for pool in ("all", "large_pool", "small_pool")}
