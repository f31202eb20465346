"""Out-of-memory and device errors through real torch ops, budgets, and
what the batch-size finders of accelerate and Lightning make of them, with
the real PyTorch on the fake CUDA (two devices: 1 GiB and 512 MiB)."""
import pytest

from fakegpu import GiB, MiB, run
from torchfeature import has

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

DETECTORS = """
from accelerate.utils.memory import should_reduce_batch_size
from lightning.pytorch.utilities.memory import is_oom_error, is_cuda_out_of_memory

def judged(e):
    return {"type": type(e).__name__, "runtime_error": isinstance(e, RuntimeError), "args": len(e.args),
            "head": str(e).splitlines()[0], "is_oom": vramguard.is_oom(e),
            "accelerate": should_reduce_batch_size(e), "lightning": is_oom_error(e),
            "lightning_cuda": is_cuda_out_of_memory(e)}
"""


def test_oom_under_a_budget_through_a_torch_op():
    out = run(DETECTORS, """
        vramguard.install(budget="64MiB")
        keep = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
        mallocs = fake.vg_fakecuda_malloc_calls()
        try:
            torch.zeros(100 * MiB, dtype=torch.uint8, device="cuda")
        except Exception as e:
            out["oom"] = judged(e)
            out["text"] = str(e)
        out["device_calls_for_it"] = fake.vg_fakecuda_malloc_calls() - mallocs   # the budget said no first
        out["allocated_after"] = torch.cuda.memory_allocated()
        out["reserved_after"] = torch.cuda.memory_reserved()
        s = heap()
        out["counters"] = [s["num_ooms"], s["num_budget_refusals"] > 0, s["num_device_errors"]]
        more = torch.zeros(40 * MiB, dtype=torch.uint8, device="cuda")           # the process goes on
        out["values_ok"] = more[:8].cpu().tolist() == [0] * 8
        del keep, more
        out["allocated_end"] = torch.cuda.memory_allocated()
        import lightning.pytorch.utilities.memory as lmem
        lmem.garbage_collection_cuda()                                           # Lightning's clean-up
        out["reserved_end"] = torch.cuda.memory_reserved()
        vramguard._core.device_heap(0).check()
    """)
    oom = out["oom"]
    assert oom["type"] == "OutOfMemoryError"             # through the shim (test_oom_shim.py: without)
    assert oom["runtime_error"] and oom["args"] == 1
    assert oom["head"] == ("CUDA out of memory. Tried to allocate 100.00 MiB. GPU 0 has a total capacity of "
                           "1.00 GiB of which 1008.00 MiB is free. Of the allocated memory 16.00 MiB is "
                           "allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. "
                           "vramguard's budget is 64.00 MiB. vramguard's arena: 16.00 MiB mapped in 1 range, "
                           "0 bytes unmapped so far; the largest block that could be allocated now is "
                           "48.00 MiB.")  # the budget less 16 MiB
    assert oom["is_oom"] and oom["accelerate"] and oom["lightning"] and oom["lightning_cuda"]
    assert "\nvramguard: " in out["text"]
    assert out["device_calls_for_it"] == 0
    assert out["allocated_after"] == 16 * MiB and out["reserved_after"] == 16 * MiB
    assert out["counters"] == [1, True, 0]
    assert out["values_ok"] is True
    assert out["allocated_end"] == 0 and out["reserved_end"] == 0


def test_oom_of_the_device_itself():
    out = run(DETECTORS, """
        vramguard.install()
        try:
            torch.empty(600 * MiB, dtype=torch.uint8, device="cuda:1")   # the device has 512 MiB
        except Exception as e:
            out["oom"] = judged(e)
        s = heap(1)
        out["counters"] = {k: s[k] for k in ("num_ooms", "num_device_alloc_failed", "num_device_errors")}
        out["fake_used"] = fake.vg_fakecuda_bytes_in_use(1)
        x = torch.empty(500 * MiB, dtype=torch.uint8, device="cuda:1")
        out["then"] = torch.cuda.memory_allocated(1)
    """)
    assert out["oom"]["head"].startswith("CUDA out of memory. Tried to allocate 600.00 MiB. GPU 1 has a total "
                                         "capacity of 512.00 MiB of which 512.00 MiB is free.")
    assert out["oom"]["is_oom"] and out["oom"]["accelerate"] and out["oom"]["lightning"]
    assert out["counters"]["num_ooms"] == 1 and out["counters"]["num_device_errors"] == 0
    assert out["counters"]["num_device_alloc_failed"] >= 1
    assert out["fake_used"] == 0
    assert out["then"] == 500 * MiB


def test_device_errors_are_not_ooms_and_are_not_retried():
    out = run(DETECTORS, """
        vramguard.install(arena=False)   # the cudaMalloc path: the arena's maps have their own test
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        def attempt(key, size):
            before = {k: heap()[k] for k in ("num_device_errors", "num_ooms", "num_alloc_retries",
                                              "num_sync_all_streams", "num_device_alloc")}
            mallocs = fake.vg_fakecuda_malloc_calls()
            try:
                torch.empty(size, dtype=torch.uint8, device="cuda")        # needs a new segment
            except Exception as e:
                out[key] = judged(e)
            out[key + "_mallocs"] = fake.vg_fakecuda_malloc_calls() - mallocs
            out[key + "_counters"] = {k: heap()[k] - v for k, v in before.items()}
        assert fake.vg_fakecuda_fail_malloc(1, 700) == 0                  # cudaErrorIllegalAddress, once
        attempt("once", 64 * MiB)
        y = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")         # a one-shot fault: fine now
        out["after_once"] = torch.cuda.memory_allocated()
        del y
        fake.vg_fakecuda_set_sticky_error(700)                              # like a faulting kernel
        attempt("sticky", 100 * MiB)                                        # more than is cached
        fake.vg_fakecuda_set_sticky_error(0)
        z = torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
        out["after_sticky"] = torch.cuda.memory_allocated()
    """)
    for key in ("once", "sticky"):
        e = out[key]
        assert e["head"] == "CUDA error: an illegal memory access was encountered", key
        assert e["runtime_error"] and e["args"] == 1, key
        assert not (e["is_oom"] or e["accelerate"] or e["lightning"]), key
        assert out[key + "_counters"] == {"num_device_errors": 1, "num_ooms": 0, "num_alloc_retries": 0,
                                          "num_sync_all_streams": 0, "num_device_alloc": 0}, key
    assert out["once_mallocs"] == 1              # the one that failed, no second try
    assert out["sticky_mallocs"] <= 1            # the sticky error may stop it before cudaMalloc
    assert out["after_once"] == 65 * MiB
    assert out["after_sticky"] == 129 * MiB


def test_budgets_mem_get_info_and_accelerate_planning():
    out = run("""
        from accelerate.utils import get_max_memory
        vramguard.install(budget="64MiB")
        out["info_before_use"] = [torch.cuda.mem_get_info(0), torch.cuda.mem_get_info(1)]
        keep = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
        out["info"] = torch.cuda.mem_get_info()
        out["accelerator_info"] = (torch.accelerator.get_memory_info(0)   # PyTorch 2.9 on
                                   if hasattr(torch.accelerator, "get_memory_info") else None)
        out["planned"] = {str(k): v for k, v in get_max_memory().items() if k != "cpu"}
        out["reserved"] = [torch.cuda.memory_reserved(0), torch.cuda.memory_reserved(1)]
        # growing past the budget is refused; reserved memory never passes it
        tensors, refused = [], 0
        for _ in range(10):
            try:
                tensors.append(torch.empty(10 * MiB, dtype=torch.uint8, device="cuda"))
            except RuntimeError:
                refused += 1
        out["fitted"] = [len(tensors), refused, torch.cuda.max_memory_reserved(0)]
        out["info_full"] = [torch.cuda.mem_get_info(), torch.cuda.memory_reserved(0)]
        del tensors
        # a fraction of the device, through PyTorch's own function
        torch.cuda.set_per_process_memory_fraction(0.25)
        out["fraction"] = [heap()["budget_bytes"], torch.cuda.get_per_process_memory_fraction(),
                           torch.cuda.mem_get_info(), torch.cuda.memory_reserved()]
        torch.cuda.set_per_process_memory_fraction(0.0)            # nothing new at all
        out["fraction_zero"] = [torch.cuda.get_per_process_memory_fraction(), torch.cuda.mem_get_info()[0],
                                error(torch.empty, 1000, device="cuda")[0]]
        vramguard.install(budget=None)
        out["unbounded"] = [torch.cuda.mem_get_info(), torch.cuda.get_per_process_memory_fraction()]
        out["fake_free"] = fake.vg_fakecuda_capacity(0) - fake.vg_fakecuda_bytes_in_use(0)
    """)
    assert out["info_before_use"] == [[64 * MiB, 64 * MiB], [64 * MiB, 64 * MiB]]
    assert out["info"] == [48 * MiB, 64 * MiB]                 # 16 MiB reserved of 64
    if has("torch.accelerator.get_memory_info"):
        assert out["accelerator_info"] == [48 * MiB, 64 * MiB]
    # accelerate puts an 8-byte tensor on each device first: a 2 MiB segment
    assert out["planned"] == {"0": 46 * MiB, "1": 62 * MiB}
    assert out["reserved"] == [18 * MiB, 2 * MiB]
    assert out["fitted"][0] + out["fitted"][1] == 10 and out["fitted"][1] > 0
    assert out["fitted"][2] <= 64 * MiB
    info, reserved = out["info_full"]
    assert info == [64 * MiB - reserved, 64 * MiB]
    budget, fraction, info, reserved = out["fraction"]
    assert budget == 256 * MiB and fraction == 0.25
    assert info == [256 * MiB - reserved, 256 * MiB]          # cached memory counts as used
    assert out["fraction_zero"] == [0.0, 0, "OutOfMemoryError"]
    assert out["unbounded"] == [[out["fake_free"], GiB], 1.0]


def test_accelerates_batch_size_finder_settles_under_the_budget():
    out = run("""
        from accelerate.utils import find_executable_batch_size
        vramguard.install(budget="64MiB")
        tried = []

        @find_executable_batch_size(starting_batch_size=100)
        def train(batch_size):
            tried.append(batch_size)
            x = torch.empty(batch_size * MiB, dtype=torch.uint8, device="cuda")
            return batch_size

        out["result"] = train()
        out["tried"] = tried
        out["ooms"] = heap()["num_ooms"]
        out["empty_cache_calls"] = heap()["num_empty_cache"]
    """)
    assert out["tried"] == [100, 90, 81, 72, 64]       # accelerate 1.15 shrinks by 10% per OOM
    assert out["result"] == 64
    assert out["ooms"] == 4
    assert out["empty_cache_calls"] >= 4
