"""On a real GPU, with vramguard installed as PyTorch's allocator: tensors
on two streams with record_stream, torch.cuda.* agreeing with the heap,
empty_cache giving memory back to the device, and OOMs that explain
themselves and leave the process usable."""
import warnings

import pytest

torch = pytest.importorskip("torch")
import vramguard  # noqa: E402

MiB = 1 << 20


def heap_stats():
    return vramguard.stats(torch.cuda.current_device())


def test_installed_and_numbers_agree():
    assert vramguard.is_installed()
    base = torch.cuda.memory_allocated()
    x = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_allocated() - base == 10 * MiB
    assert torch.cuda.memory_allocated() == heap_stats()["allocated_bytes.all.current"]
    assert torch.cuda.memory_reserved() == heap_stats()["reserved_bytes.all.current"]
    assert torch.cuda.max_memory_allocated() >= torch.cuda.memory_allocated()
    s = torch.cuda.memory_stats()
    assert s["allocated_bytes.all.current"] == torch.cuda.memory_allocated()
    assert "vramguard memory summary" in torch.cuda.memory_summary()
    del x
    assert torch.cuda.memory_allocated() == base
    vramguard._core.device_heap(0).check()


def test_many_sizes_values_survive():
    tensors = [torch.full((n,), float(i), device="cuda") for i, n in enumerate([1, 7, 128, 4097, 1 << 18, 3 << 20])]
    for i, t in enumerate(tensors):
        assert torch.all(t == float(i)).item()
    del tensors
    vramguard._core.device_heap(0).check()


def test_two_streams_with_record_stream():
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    deferred = heap_stats()["num_deferred_frees"]
    with torch.cuda.stream(s1):
        x = torch.randn(4096, 4096, device="cuda")
    s2.wait_stream(s1)
    with torch.cuda.stream(s2):
        y = (x @ x).sum()  # long work on s2 that reads x
        x.record_stream(s2)
    del x  # freed on s1's heap, but s2 may still read it
    with torch.cuda.stream(s1):
        z = torch.zeros(4096, 4096, device="cuda")  # must not get x's block while s2 runs
    torch.cuda.synchronize()
    assert torch.isfinite(y).item() and torch.all(z == 0).item()
    assert heap_stats()["num_deferred_frees"] == deferred + 1
    vramguard._core.device_heap(0).check()


def test_empty_cache_returns_memory_to_the_device():
    x = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    del x
    free_before, _ = torch.cuda.mem_get_info()
    reserved_before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    free_after, _ = torch.cuda.mem_get_info()
    released = reserved_before - torch.cuda.memory_reserved()
    assert released >= 512 * MiB
    assert free_after - free_before >= released - 2 * MiB  # the driver agrees


def step(batch, width=1024):
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)).cuda()
    x = torch.randn(batch, width, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    return loss.item()


def test_oom_explains_itself_and_the_process_goes_on():
    vramguard.install(budget="2GiB")
    try:
        # PyTorch's cuBLAS and cuBLASLt workspaces come with the first
        # matmul and stay for the process (32 + 1 MiB on an H200, torch
        # 2.11): there before the count starts.
        step(64)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        for _ in range(100):
            with pytest.raises(RuntimeError) as err:
                torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
            e = err.value
            assert len(e.args) == 1
            assert e.args[0].startswith("CUDA out of memory. Tried to allocate 3.00 GiB.")
            assert "GPU 0 has a total capacity of" in e.args[0]
            assert "vramguard's budget is 2.00 GiB" in e.args[0]
            assert "\nvramguard: " in e.args[0]
            assert vramguard.is_oom(e)
            # accelerate's and Lightning's tests for an OOM
            assert "CUDA out of memory." in e.args[0]
            assert "CUDA" in e.args[0] and "out of memory" in e.args[0]
            step(64)
            torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == base
        assert heap_stats()["num_ooms"] >= 100
    finally:
        vramguard.install(budget=None)


def test_batch_size_finders_recognise_the_oom():
    accelerate = pytest.importorskip("accelerate")
    vramguard.install(budget="1GiB")
    try:
        with pytest.raises(RuntimeError) as err:
            torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        assert accelerate.utils.memory.should_reduce_batch_size(err.value)
    finally:
        vramguard.install(budget=None)


def test_cudnn_benchmark_is_kept_off_and_convolutions_run():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.cudnn.benchmark = True
    assert torch.backends.cudnn.benchmark is False
    conv = torch.nn.Conv2d(3, 16, 3).cuda()
    out = conv(torch.randn(8, 3, 64, 64, device="cuda"))
    assert out.shape == (8, 16, 62, 62)


def test_set_per_process_memory_fraction_sets_the_budget():
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction(0.5)
    try:
        assert abs(heap_stats()["budget_bytes"] - total // 2) <= 1
    finally:
        vramguard.install(budget=None)
