"""The torch.cuda and torch.accelerator functions install() replaces, with
the real PyTorch on two fake devices (1 GiB and 512 MiB): every device
argument, before and after CUDA starts, byte-exact figures, PyTorch's own
argument errors, record_stream and empty_cache."""
import pytest

from fakegpu import GiB, MiB, run
from torchfeature import need

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

# The statistics install() replaces, and PyTorch's wrappers over them.
CUDA_READERS = ["memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                "memory_cached", "max_memory_cached"]
CUDA_RESETS = ["reset_peak_memory_stats", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
               "reset_max_memory_cached"]
ACCELERATOR_READERS = ["memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"]
ACCELERATOR_RESETS = ["reset_peak_memory_stats", "reset_accumulated_memory_stats"]

DEVICES = """
DEVICES = {"None": None, "0": 0, "'cuda'": "cuda", "device('cuda')": torch.device("cuda"),
           "'cuda:1'": "cuda:1", "device('cuda', 1)": torch.device("cuda", 1)}
"""


def test_statistics_before_cuda_starts_return_zeros_and_start_nothing():
    need("torch.accelerator.memory_stats", "torch.accelerator.empty_cache")
    out = run(DEVICES, """
        warnings.simplefilter("ignore", FutureWarning)   # memory_cached & co. are deprecated
        vramguard.install()
        seen = {}
        for label, device in DEVICES.items():
            for name in %r + %r:
                seen["cuda." + name + "(" + label + ")"] = getattr(torch.cuda, name)(device)
            seen["cuda.memory_stats(" + label + ")"] = dict(torch.cuda.memory_stats(device))
            seen["cuda.memory_stats_as_nested_dict(" + label + ")"] = torch.cuda.memory_stats_as_nested_dict(device)
            seen["cuda.summary_has_zero(" + label + ")"] = "0 bytes" in torch.cuda.memory_summary(device)
            for name in %r + %r:
                seen["accelerator." + name + "(" + label + ")"] = getattr(torch.accelerator, name)(device)
            seen["accelerator.memory_stats(" + label + ")"] = dict(torch.accelerator.memory_stats(device))
        torch.cuda.empty_cache()
        torch.accelerator.empty_cache()
        out["seen"] = seen
        out["initialized"] = torch.cuda.is_initialized()
        out["heaps"] = vramguard._core.existing_devices()
        out["set_device_calls"] = fake.vg_fakecuda_calls(b"cudaSetDevice")
        out["contexts"] = fake.vg_fakecuda_calls(b"cuDevicePrimaryCtxRetain")
    """ % (CUDA_READERS, CUDA_RESETS, ACCELERATOR_READERS, ACCELERATOR_RESETS))
    for call, value in out["seen"].items():
        if "summary" in call:
            assert value is True, call
        elif "reset" in call:
            assert value is None, call
        elif "memory_stats" in call:
            assert value == {}, call
        else:
            assert value == 0, call
    assert len(out["seen"]) == 6 * 20
    assert out["initialized"] is False
    assert out["heaps"] == []
    assert out["set_device_calls"] == 0
    assert out["contexts"] == 0


def test_every_device_argument_reads_its_own_device():
    need("torch.accelerator.memory_stats", "torch.accelerator.get_memory_info")
    out = run(DEVICES, """
        warnings.simplefilter("ignore", FutureWarning)
        vramguard.install()
        a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda:0")
        b = torch.empty(5000, dtype=torch.uint8, device="cuda:1")
        for d in (0, 1):                                     # the cache the resets below use
            del_me = torch.empty(MiB, dtype=torch.uint8, device=d); del del_me
            vramguard.reset_peaks(d)
        truth = {d: heap(d) for d in (0, 1)}
        got = {}
        for label, device in DEVICES.items():
            row = {name: getattr(torch.cuda, name)(device) for name in %r}
            row["memory_stats"] = torch.cuda.memory_stats(device)["allocated_bytes.all.current"]
            row["nested"] = torch.cuda.memory_stats_as_nested_dict(device)["reserved_bytes"]["all"]["current"]
            row["summary_device"] = torch.cuda.memory_summary(device).splitlines()[1].split("device ")[1][0]
            row["mem_get_info"] = torch.cuda.mem_get_info(device)
            # PyTorch's own refuse a device without an index (ValueError) here
            row["fraction_before"] = error(torch.cuda.get_per_process_memory_fraction, device) or \
                torch.cuda.get_per_process_memory_fraction(device)
            row["set_fraction"] = error(torch.cuda.set_per_process_memory_fraction, 0.25, device)
            row["budgets"] = [heap(0)["budget_bytes"], heap(1)["budget_bytes"]]
            row["fraction"] = error(torch.cuda.get_per_process_memory_fraction, device) or \
                torch.cuda.get_per_process_memory_fraction(device)
            vramguard.install(budget=None)                 # back to no budget anywhere
            row["acc"] = [getattr(torch.accelerator, name)(device) for name in %r]
            row["acc_stats"] = torch.accelerator.memory_stats(device)["requested_bytes.all.current"]
            row["acc_info"] = torch.accelerator.get_memory_info(device)
            resets = []
            for name in %r:
                for d in (0, 1):                             # a peak above current, a total above 0
                    del_me = torch.empty(MiB, dtype=torch.uint8, device=d); del del_me
                before = [heap(d) for d in (0, 1)]
                getattr(torch.cuda, name)(device)
                after = [heap(d) for d in (0, 1)]
                resets.append([d for d in (0, 1) if after[d]["allocated_bytes.all.peak"] < before[d]["allocated_bytes.all.peak"]
                               or after[d]["allocated_bytes.all.freed"] < before[d]["allocated_bytes.all.freed"]])
            row["resets"] = resets
            for d in (0, 1):
                vramguard.reset_peaks(d)
            got[label] = row
        torch.cuda.set_device(1)                             # the current device is now 1
        got["None after set_device(1)"] = torch.cuda.memory_allocated(None)
        got["'cuda' after set_device(1)"] = torch.cuda.memory_allocated("cuda")
        got["accelerator None after set_device(1)"] = torch.accelerator.memory_allocated()
        out["got"] = got
        out["truth"] = truth
        out["fake_free"] = [fake.vg_fakecuda_capacity(d) - fake.vg_fakecuda_bytes_in_use(d) for d in (0, 1)]
    """ % (CUDA_READERS, ACCELERATOR_READERS, CUDA_RESETS))
    truth = out["truth"]
    sizes = {0: (3 * MiB, GiB), 1: (5120, 512 * MiB)}
    for label, row in out["got"].items():
        if "set_device" in label:
            assert row == 5120, label
            continue
        d = 1 if "1" in label else 0
        allocated, total = sizes[d]
        reserved = truth[str(d)]["reserved_bytes.all.current"]
        assert row["memory_allocated"] == row["max_memory_allocated"] == allocated, label
        assert row["memory_reserved"] == row["max_memory_reserved"] == reserved, label
        assert row["memory_cached"] == row["max_memory_cached"] == reserved, label
        assert row["memory_stats"] == allocated and row["nested"] == reserved, label
        assert row["summary_device"] == str(d), label
        assert row["mem_get_info"] == [out["fake_free"][d], total], label
        if label in ("'cuda'", "device('cuda')"):
            refused = ["ValueError", "Expected a torch.device with a specified index or an integer, but got:cuda"]
            assert row["fraction_before"] == row["set_fraction"] == row["fraction"] == refused, label
            assert row["budgets"] == [0, 0], label
        else:
            assert row["fraction_before"] == 1.0 and row["fraction"] == 0.25, label
            assert row["set_fraction"] is None, label
            assert row["budgets"] == [GiB // 4 if d == 0 else 0, 128 * MiB if d == 1 else 0], label
        assert row["acc"] == [allocated, allocated, reserved, reserved], label
        assert row["acc_stats"] == (3 * MiB if d == 0 else 5000), label
        assert row["acc_info"] == [out["fake_free"][d], total], label
        assert row["resets"] == [[d]] * 4, label
    assert truth["0"]["allocated_bytes.all.current"] == 3 * MiB
    assert truth["1"]["requested_bytes.all.current"] == 5000


BYTE_EXACT = """
sizes = [1, 511, 512, 513, 1000, 4096, MiB - 1, MiB, MiB + 1, 3 * MiB + 5, 25 * MiB, 25 * MiB + 512]
rows = []
for n in sizes:
    before = torch.cuda.memory_allocated()
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    grown = torch.cuda.memory_allocated() - before
    requested = torch.cuda.memory_stats()["requested_bytes.all.current"]
    rows.append([n, grown, requested, t.untyped_storage().nbytes()])
    del t
    rows[-1].append(torch.cuda.memory_allocated())
out["rows"] = rows
kept = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
out["all"] = torch.cuda.memory_allocated()
out["peak"] = torch.cuda.max_memory_allocated()
del kept
out["after"] = torch.cuda.memory_allocated()
"""


def test_tensors_and_memory_allocated_agree_to_the_byte():
    """The bytes each tensor adds to memory_allocated(), as the native
    allocator counts them: 512-byte rounding, and a large block keeps a
    remainder of 1 MiB or less (25 MiB is a 26 MiB block): the segments
    policy, which splits cudaMalloc'd segments by the native rules."""
    native = run(BYTE_EXACT)
    patched = run("vramguard.install(arena=False)", BYTE_EXACT, "vramguard._core.device_heap(0).check()")
    assert patched["rows"] == native["rows"]
    for n, grown, requested, nbytes, after_del in patched["rows"]:
        assert requested == nbytes == n and after_del == 0
        assert grown == (26 * MiB if n >= 25 * MiB else max(512, -(-n // 512) * 512)), n
    assert patched["all"] == patched["peak"] == native["all"]
    assert patched["after"] == 0


# The same calls with wrong arguments, with and without vramguard: the
# errors must be PyTorch's own, type and text.
WRONG_ARGUMENTS = """
cpu_tensor = torch.empty(4)
x = torch.empty(4, device="cuda")
calls = {
    "fraction(1)": lambda: torch.cuda.set_per_process_memory_fraction(1),
    "fraction(True)": lambda: torch.cuda.set_per_process_memory_fraction(True),
    "fraction(1.5)": lambda: torch.cuda.set_per_process_memory_fraction(1.5),
    "fraction(-0.1)": lambda: torch.cuda.set_per_process_memory_fraction(-0.1),
    "fraction('half')": lambda: torch.cuda.set_per_process_memory_fraction("half"),
    "fraction(0.5, 'cpu')": lambda: torch.cuda.set_per_process_memory_fraction(0.5, "cpu"),
    "get_fraction('cpu')": lambda: torch.cuda.get_per_process_memory_fraction("cpu"),
    "cpu.record_stream": lambda: cpu_tensor.record_stream(torch.cuda.current_stream()),
    "record_stream(3)": lambda: x.record_stream(3),
    "record_stream(None)": lambda: x.record_stream(None),
    "record_stream(cpu stream)": lambda: x.record_stream(torch.Stream("cpu")),
    "memory_stats('cpu')": lambda: torch.cuda.memory_stats("cpu"),
    "memory_allocated('cpu')": lambda: torch.cuda.memory_allocated("cpu"),
    "nested('cpu')": lambda: torch.cuda.memory_stats_as_nested_dict("cpu"),
    "reset_peak('cpu')": lambda: torch.cuda.reset_peak_memory_stats("cpu"),
    "reset_accumulated('cpu')": lambda: torch.cuda.reset_accumulated_memory_stats("cpu"),
    "summary('cpu')": lambda: torch.cuda.memory_summary("cpu"),
    "mem_get_info('cpu')": lambda: torch.cuda.mem_get_info("cpu"),
    "cudnn benchmark = 1": lambda: setattr(torch.backends.cudnn, "benchmark", 1),
    "cudnn _set_cudnn_benchmark(1)": lambda: torch._C._set_cudnn_benchmark(1),
}
if hasattr(torch.accelerator, "get_memory_info"):   # PyTorch 2.9 on
    calls.update({
        "accelerator.memory_stats('cpu')": lambda: torch.accelerator.memory_stats("cpu"),
        "accelerator.memory_allocated('cpu')": lambda: torch.accelerator.memory_allocated("cpu"),
        "accelerator.get_memory_info('cpu')": lambda: torch.accelerator.get_memory_info("cpu"),
    })
out["errors"] = {name: error(call) for name, call in calls.items()}
# A device that does not exist: the same type (the native text prints the
# index as a character).
out["bad_index"] = {name: (error(call) or [None])[0] for name, call in {
    "memory_stats(5)": lambda: torch.cuda.memory_stats(5),
    "memory_allocated(5)": lambda: torch.cuda.memory_allocated(5),
    "mem_get_info(5)": lambda: torch.cuda.mem_get_info(5),
    "fraction(0.5, 5)": lambda: torch.cuda.set_per_process_memory_fraction(0.5, 5),
}.items()}
"""


def test_wrong_arguments_raise_what_pytorch_raises():
    native = run(WRONG_ARGUMENTS)
    patched = run("vramguard.install()", WRONG_ARGUMENTS)
    assert patched["errors"] == native["errors"]
    assert all(native["errors"].values())                  # each one is an error
    assert native["errors"]["fraction(1)"] == ["TypeError", "Invalid type for fraction argument, must be `float`"]
    assert native["errors"]["fraction(True)"][0] == "TypeError"
    assert native["errors"]["cpu.record_stream"][0] == "NotImplementedError"
    assert patched["bad_index"] == native["bad_index"]
    assert native["bad_index"]["memory_stats(5)"] == "RuntimeError"


def test_record_stream_on_a_side_stream_defers_the_free():
    out = run("""
        vramguard.install()
        side = torch.cuda.Stream()
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        address = x.data_ptr()
        records = fake.vg_fakecuda_calls(b"cudaEventRecord") + fake.vg_fakecuda_calls(b"cudaEventRecordWithFlags")
        x.record_stream(side)
        x.record_stream(side)                                  # the same stream again: one use
        out["uses"] = heap()["num_record_stream"]
        del x
        out["deferred"] = heap()["num_deferred_frees"]
        out["pending"] = heap()["fragmentation.pending_blocks"]
        out["active_while_pending"] = torch.cuda.memory_stats()["active_bytes.all.current"]
        out["allocated_while_pending"] = torch.cuda.memory_allocated()
        out["events"] = (fake.vg_fakecuda_calls(b"cudaEventRecord") + fake.vg_fakecuda_calls(b"cudaEventRecordWithFlags")
                         - records)
        y = torch.empty(MiB, dtype=torch.uint8, device="cuda")  # the fake's events are complete: reused
        out["reused"] = y.data_ptr() == address
        out["pending_after"] = heap()["fragmentation.pending_blocks"]
        generic = torch.Stream("cuda")                          # a torch.Stream, not a torch.cuda.Stream
        y.record_stream(generic)
        out["uses_after"] = heap()["num_record_stream"]
        z = torch.empty(10, device="cuda")
        z.record_stream(torch.cuda.Stream(device=1))             # a stream of another device
        del z
        out["deferred_after"] = heap()["num_deferred_frees"]
        vramguard._core.device_heap(0).check()
    """)
    assert out["uses"] == 1
    assert out["deferred"] == 1 and out["pending"] == 1
    assert out["active_while_pending"] == MiB and out["allocated_while_pending"] == 0
    assert out["events"] == 1
    assert out["reused"] is True and out["pending_after"] == 0
    assert out["uses_after"] == 2
    assert out["deferred_after"] == 2


#: Per policy: what 3 MiB on device 0 and 1 MiB on device 1 keep cached
#: (segments: a 6 MiB segment and a 2 MiB one; arena: 2 MiB pages), and
#: the name of the counter an empty_cache's releases go to.
POLICIES = {"arena=False": ([6 * MiB, 2 * MiB], "num_device_free"),
            "arena=True": ([4 * MiB, 2 * MiB], "num_unmaps")}


@pytest.mark.parametrize("policy", POLICIES)
def test_empty_cache_from_python_and_from_torch_accelerator(policy):
    need("torch.accelerator.empty_cache")
    cached, released = POLICIES[policy]
    out = run(f"vramguard.install({policy})", f"RELEASED = {released!r}", """
        x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        y = torch.empty(MiB, dtype=torch.uint8, device="cuda:1")
        del x, y
        out["cached"] = [fake.vg_fakecuda_bytes_in_use(0), fake.vg_fakecuda_bytes_in_use(1)]
        torch.cuda.empty_cache()                                 # every device, as PyTorch's does
        out["after_cuda"] = [fake.vg_fakecuda_bytes_in_use(0), fake.vg_fakecuda_bytes_in_use(1)]
        out["reserved"] = [torch.cuda.memory_reserved(0), torch.cuda.memory_reserved(1)]
        z = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        del z
        torch.accelerator.empty_cache()
        out["after_accelerator"] = fake.vg_fakecuda_bytes_in_use(0)
        out["calls"] = heap(0)["num_empty_cache"]
        out["frees"] = [heap(0)[RELEASED], heap(1)[RELEASED]]
    """)
    assert out["cached"] == cached
    assert out["after_cuda"] == [0, 0]
    assert out["reserved"] == [0, 0]
    assert out["after_accelerator"] == 0
    assert out["calls"] == 2
    assert out["frees"] == [2, 1]


@pytest.mark.parametrize("policy", POLICIES)
def test_empty_cache_from_cpp(policy):
    """torch._C._cuda_emptyCache is what C++ callers reach (torch.cuda.graph,
    cuDNN after benchmarking, MemPool): the pluggable allocator's reset hook
    takes it to vramguard."""
    out = run(f"vramguard.install({policy})", """
        x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        del x
        out["cached"] = fake.vg_fakecuda_bytes_in_use(0)
        torch._C._cuda_emptyCache()
        out["after"] = fake.vg_fakecuda_bytes_in_use(0)
    """)
    assert out["cached"] == POLICIES[policy][0][0]
    assert out["after"] == 0
