"""vramguard.install() with the real PyTorch on the fake CUDA: before CUDA
is used, after (a clear error that says to restart), with another
pluggable allocator already in place, without a GPU, and its settings."""
import pytest

from fakegpu import GiB, MiB, run

pytestmark = pytest.mark.torch


def test_install_before_cuda_use_with_settings_from_the_environment():
    out = run("""
        refused = []
        for budget in ("-1GiB", 1.5, "0%", "lots", 0, "1"):
            if error(vramguard.install, budget=budget):
                refused.append(repr(budget))
        for gc in (0, 1.5, "half"):
            if error(vramguard.install, gc_threshold=gc):
                refused.append("gc " + repr(gc))
        out["refused"] = refused
        out["installed_after_refusals"] = vramguard.is_installed()
        vramguard.install()                       # VRAMGUARD_BUDGET=80%, VRAMGUARD_GC_THRESHOLD=0.75
        out["installed"] = vramguard.is_installed()
        out["cuda_started_by_install"] = torch.cuda.is_initialized()
        out["backend"] = torch.cuda.get_allocator_backend()
        x = torch.empty(1000, device="cuda")
        out["allocated"] = torch.cuda.memory_allocated()
        out["budget"] = heap(0)["budget_bytes"]
        out["gc"] = heap(0)["gc_threshold"]
        vramguard.install(budget="256MiB")        # again: new settings for the same heaps
        out["budget_again"] = heap(0)["budget_bytes"]
        out["summary_title"] = vramguard.summary().splitlines()[1].strip(" |")
    """, VRAMGUARD_BUDGET="80%", VRAMGUARD_GC_THRESHOLD="0.75")
    assert out["refused"] == ["'-1GiB'", "1.5", "'0%'", "'lots'", "0", "'1'", "gc 0", "gc 1.5", "gc 'half'"]
    assert out["installed_after_refusals"] is False
    assert out["installed"] is True
    assert out["cuda_started_by_install"] is False
    assert out["backend"] == "pluggable"
    assert out["allocated"] == 4096
    assert out["budget"] == int(0.8 * GiB)
    assert out["gc"] == 0.75
    assert out["budget_again"] == 256 * MiB
    assert out["summary_title"] == "vramguard memory summary, device 0 (budget 256.00 MiB on a 1.00 GiB device, gc threshold 75%)"


def test_install_after_cuda_use_says_restart():
    out = run("""
        torch.cuda.init()                            # CUDA started, nothing allocated
        e = error(vramguard.install)
        out["after_init"] = e
        x = torch.empty(1000, device="cuda")         # the native allocator in use
        out["after_use"] = error(vramguard.install, budget="1GiB")
        out["installed"] = vramguard.is_installed()
        out["native_still_works"] = torch.cuda.memory_allocated()
        out["backend"] = torch.cuda.get_allocator_backend()
    """)
    for key in ("after_init", "after_use"):
        kind, message = out[key]
        assert kind == "VramguardError"
        assert message.startswith("PyTorch's CUDA allocator is already in use in this process")
        assert "Restart the runtime (in Colab: Runtime > Restart session)" in message
    assert out["installed"] is False
    assert out["native_still_works"] == 4096
    assert out["backend"] == "native"


def test_install_after_another_pluggable_allocator():
    out = run("""
        import vramguard._core as core
        other = torch.cuda.memory.CUDAPluggableAllocator(core.__file__, "vramguard_torch_malloc",
                                                         "vramguard_torch_free")
        torch.cuda.memory.change_current_allocator(other)
        try:
            vramguard.install()
        except vramguard.VramguardError as e:
            out["error"] = str(e).splitlines()[0]
            out["cause"] = str(e.__cause__).splitlines()[0]
        out["installed"] = vramguard.is_installed()
    """)
    assert out["error"].startswith("PyTorch's CUDA allocator is already in use")
    assert out["cause"] == "Can't swap an already initialized allocator"
    assert out["installed"] is False


def test_no_gpu_and_a_cpu_build_are_told_apart():
    out = run("""
        out["no_gpu"] = error(vramguard.install)
        torch.version.cuda = None                    # what a CPU build of PyTorch says
        out["cpu_build"] = error(vramguard.install)
        out["installed"] = vramguard.is_installed()
    """, devices=0)
    assert out["no_gpu"] == ["VramguardError", "PyTorch sees no CUDA GPU (torch.cuda.is_available() is False). "
                             "In Colab, choose a GPU under Runtime > Change runtime type; elsewhere check the "
                             "driver and CUDA_VISIBLE_DEVICES."]
    assert out["cpu_build"][0] == "VramguardError"
    assert out["cpu_build"][1].startswith("this PyTorch (2.") and "is built without CUDA" in out["cpu_build"][1]
    assert out["installed"] is False


def test_summary_of_an_empty_device_is_one_line_and_verbose_has_the_counters():
    out = run("""
        vramguard.install()
        torch.cuda.init()
        out["empty"] = str(vramguard.summary())
        out["empty_html"] = vramguard.summary()._repr_html_()
        out["empty_verbose"] = str(vramguard.summary(verbose=True)).splitlines()
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        out["one"] = str(vramguard.summary()).splitlines()
        out["one_verbose"] = str(vramguard.summary(verbose=True)).splitlines()
        out["torch_full"] = torch.cuda.memory_summary().splitlines()
        out["torch_short"] = torch.cuda.memory_summary(abbreviated=True).splitlines()
        del x
        torch.cuda.empty_cache()
        out["after"] = str(vramguard.summary())
    """, devices=1, mem="8GiB")
    allocator = "allocator: arena (virtual memory, 2 MiB pages)"
    head = "vramguard memory summary, device 0 (no budget on an 8.00 GiB device)"
    assert out["empty"] == f"{head}: nothing allocated, nothing mapped; {allocator}"
    assert out["empty_html"] == f"<pre>{head}: nothing allocated, nothing mapped; {allocator}</pre>"
    assert out["empty_verbose"][1].strip(" |") == head and len(out["empty_verbose"]) > 40
    assert out["empty_verbose"][-2].strip(" |") == allocator
    assert any(line.startswith("| cache hits 0, ") for line in out["empty_verbose"])
    # one tensor: the table, without the policy's counters unless asked
    assert out["one"][1].strip(" |") == head and out["one"][-2].strip(" |") == allocator
    assert not any("cache hits" in line for line in out["one"])
    assert "| Memory: arena, 2.00 MiB pages; 1 range reserved, 0 released" in "\n".join(out["one"])
    assert out["one_verbose"][:len(out["one"]) - 2] == out["one"][:-2]
    assert any(line.startswith("| cache hits ") for line in out["one_verbose"])
    # torch.cuda.memory_summary() is the whole table, as PyTorch's own; abbreviated=True the short one
    assert any(line.startswith("| cache hits ") for line in out["torch_full"])
    assert not any("cache hits" in line for line in out["torch_short"])
    assert out["after"] == (f"{head}: nothing allocated, nothing mapped; peak allocated 1.00 MiB, "
                            f"peak mapped 2.00 MiB; {allocator}")
