"""vramguard.install() with the real PyTorch on the fake CUDA: before CUDA
is used, after (a clear error that says to restart), with another
pluggable allocator already in place, without a GPU, and its settings."""
import pytest

from fakegpu import GiB, MiB, run, summary_rows

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]


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
        out["summary"] = str(vramguard.summary())
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
    assert summary_rows(out["summary"])[0] == "vramguard memory summary, device 0 (budget 256.00 MiB on a 1.00 GiB device, gc threshold 75%)"


RESTART = ("Restart the runtime (in Colab: Runtime > Restart session), then call vramguard.install() first, "
           "before any tensor is put on the GPU and before any torch.cuda call that asks about the device "
           "(torch.cuda.is_available() and device_count() do not initialise CUDA and may come before it; "
           "docs/notebook.md lists the calls that do).")
LOOKED = ("CUDA is already initialised in this process, though no tensor was put on the GPU: a call such as "
          "torch.cuda.get_device_name(), get_device_properties(), mem_get_info(), get_device_capability(), "
          "current_device() or set_device() initialises it, and PyTorch cannot swap its allocator once CUDA "
          "is initialised. " + RESTART)


@pytest.mark.parametrize("call", ["torch.cuda.get_device_name()", "torch.cuda.get_device_properties(0)",
                                  "torch.cuda.mem_get_info()", "torch.cuda.init()"])
def test_install_after_a_call_that_only_looked_at_the_device_says_so(call):
    """What people run in a first cell to see their GPU initialises CUDA
    without making a tensor: the refusal says so, not "before any tensor"."""
    out = run(f"""
        torch.cuda.is_available(); torch.cuda.device_count()   # these do not initialise CUDA
        out["initialised_before"] = torch.cuda.is_initialized()
        {call}
        out["error"] = error(vramguard.install)
        out["installed"] = vramguard.is_installed()
    """)
    assert out["initialised_before"] is False
    assert out["error"] == ["VramguardError", LOOKED]
    assert out["installed"] is False


def test_install_after_cuda_use_says_restart():
    out = run("""
        x = torch.empty(1000, device="cuda")         # the native allocator in use
        out["after_one"] = error(vramguard.install, budget="1GiB")
        y = torch.empty(1000, device="cuda")
        out["after_two"] = error(vramguard.install)
        out["installed"] = vramguard.is_installed()
        out["native_still_works"] = torch.cuda.memory_allocated()
        out["backend"] = torch.cuda.get_allocator_backend()
    """)
    for key, made in (("after_one", "1 allocation"), ("after_two", "2 allocations")):
        assert out[key] == ["VramguardError",
                            f"PyTorch's CUDA allocator is already in use in this process: tensors were put on "
                            f"the GPU ({made} so far), and PyTorch cannot swap an allocator once it has been "
                            f"used. " + RESTART]
    assert out["installed"] is False
    assert out["native_still_works"] == 8192
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
    assert out["error"] == ("PyTorch refused to make vramguard its CUDA allocator (\"Can't swap an already "
                            "initialized allocator\"): another allocator was set in this process first "
                            "(torch.cuda.memory.change_current_allocator()). " + RESTART)
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


OVER = ("vramguard.install(): the budget of {budget} is larger than the device's {total} ({name}): the device is "
        "the limit, not the budget.")


@pytest.mark.parametrize("budget, mem, name, shown_budget, shown_total", [
    ("16gb", "15828320256", "Tesla T4", "14.90 GiB", "14.74 GiB"),        # a "16 GB" T4 has 14.74 GiB
    ("T4", "8GiB", "NVIDIA GeForce RTX 4060", "14.35 GiB", "8.00 GiB"),    # a preset larger than the card
])
def test_a_budget_larger_than_the_device_warns_once_cuda_starts(budget, mem, name, shown_budget, shown_total):
    """install() must not start CUDA, so the device's figure is read when
    PyTorch starts it (the first tensor); an install() after that checks at
    once. A budget within the device warns nothing."""
    out = run(f"""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            vramguard.install(budget={budget!r})
            out["at_install"] = [str(w.message) for w in caught]
            out["cuda_started"] = torch.cuda.is_initialized()
            x = torch.empty(1000, device="cuda")
            out["at_first_tensor"] = [(str(w.message), w.filename == "<string>") for w in caught]
            del caught[:]
            vramguard.install(budget="1GiB")
            out["within"] = [str(w.message) for w in caught]
            vramguard.install(budget={budget!r})
            out["again"] = [str(w.message) for w in caught]
    """, devices=1, mem=mem, VG_FAKECUDA_NAME=name)
    text = OVER.format(budget=shown_budget, total=shown_total, name=name)
    assert out["at_install"] == [] and out["cuda_started"] is False
    assert out["at_first_tensor"] == [[text, True]]      # pointing at the user's line
    assert out["within"] == []
    assert out["again"] == [text]


def test_a_bad_budget_is_raised_from_the_call_the_user_wrote():
    """The parsers' frames are not shown: the traceback is the user's line
    and install()'s, the message is the parser's, nothing chained."""
    out = run("""
        import traceback
        for budget in ("lots", 15, -1, True):
            try:
                vramguard.install(budget=budget)
            except (ValueError, TypeError) as e:
                frames = traceback.extract_tb(e.__traceback__)
                out[repr(budget)] = [type(e).__name__, str(e), [f.name for f in frames],
                                     e.__cause__ is None and e.__suppress_context__]
        def step(batch):
            pass
        vramguard.install()
        try:
            vramguard.find_max_batch(step, budget="lots", progress=False)
        except ValueError as e:
            out["find_max_batch"] = [f.name for f in traceback.extract_tb(e.__traceback__)]
    """, devices=1, mem="1GiB")
    assert out["'lots'"][0] == "ValueError" and out["'lots'"][1].startswith("cannot read 'lots' as a size")
    assert out["15"][1] == "a budget of 15 bytes is smaller than one 2 MiB segment: give a unit, e.g. '15GiB'"
    assert out["-1"][1] == "a budget must not be negative, got -1"
    assert out["True"][:2] == ["TypeError", "a budget must be an int or a string like '15GiB', not a bool"]
    for budget in ("'lots'", "15", "-1", "True"):
        assert out[budget][2] == ["<module>", "install"] and out[budget][3] is True
    assert out["find_max_batch"] == ["<module>", "find_max_batch"]


def test_which_calls_initialise_cuda():
    """The lists docs/notebook.md gives, checked with this PyTorch on the
    phantom: each call alone in a child forked before CUDA starts, then
    install() there."""
    from vramguard.torch.cuda_started import DO_NOT_INITIALISE, INITIALISE

    out = run(f"""
        import os
        def alone(call):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                eval(call)
                started = torch.cuda.is_initialized()
                verdict = "installed" if error(vramguard.install) is None else "refused"
                os.write(write, f"{{started}} {{verdict}}".encode())
                os._exit(0)
            os.close(write)
            os.waitpid(pid, 0)
            with os.fdopen(read) as answer:
                return answer.read().split()
        out["calls"] = {{call: alone(call) for call in {list(INITIALISE + DO_NOT_INITIALISE)!r}}}
        out["parent_started"] = torch.cuda.is_initialized()
    """, devices=1, mem="1GiB")
    assert out["parent_started"] is False
    assert out["calls"] == {**{call: ["True", "refused"] for call in INITIALISE},
                            **{call: ["False", "installed"] for call in DO_NOT_INITIALISE}}


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
