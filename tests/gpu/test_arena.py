"""On a real GPU, with the device heap on the arena (the CUDA driver's
virtual memory calls; run.sh runs this file with VRAMGUARD_ARENA=1): pages
mapped as tensors need them, reserved equal to what the driver handed out,
empty_cache unmapping, values intact across page boundaries, and a CUDA
graph captured into a private pool while the device heap maps pages for
another stream. What the fake CUDA cannot show (tests/torch/test_arena_torch.py
has the rest). Skips where the heap runs on segments, saying why."""
import gc

import pytest

torch = pytest.importorskip("torch")
import vramguard  # noqa: E402
from vramguard import _core  # noqa: E402

MiB = 1 << 20
PAGE = 2 * MiB
MAPS, UNMAPS = "num_maps", "num_unmaps"


@pytest.fixture(autouse=True)
def on_the_arena():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    allocator = vramguard.stats(0)["allocator"]
    if not allocator.startswith("arena"):
        pytest.skip(f"the device heap runs on {allocator}")


def counters():
    s = vramguard.stats(0)
    return s[MAPS], s[UNMAPS], s["reserved_bytes.all.current"]


def driver_used():
    free, total = torch.cuda.mem_get_info(0)
    return total - free


def test_maps_pages_on_demand_and_empty_cache_unmaps_them():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    maps0, unmaps0, reserved0 = counters()
    used0 = driver_used()
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    maps1, _, reserved1 = counters()
    assert maps1 > maps0
    assert reserved1 - reserved0 >= 64 * MiB and (reserved1 - reserved0) % PAGE == 0
    # what the driver handed out is what vramguard says it reserved
    assert abs((driver_used() - used0) - (reserved1 - reserved0)) <= PAGE
    del x
    torch.cuda.empty_cache()
    _, unmaps2, reserved2 = counters()
    assert unmaps2 > unmaps0
    assert reserved2 == reserved0
    assert abs(driver_used() - used0) <= PAGE
    _core.device_heap(0).check()


def test_values_across_page_boundaries():
    n = (3 * PAGE + 12345) // 4
    src = torch.arange(n, dtype=torch.int32)
    dev = src.to("cuda")
    assert torch.equal(dev.cpu(), src)
    twice = dev * 2                    # a kernel writes across the pages
    assert torch.equal(twice.cpu(), src * 2)
    del dev, twice
    _core.device_heap(0).check()


def test_a_steady_loop_maps_nothing_after_its_first_step():
    def step():
        a = torch.randn(4096, 1024, device="cuda")
        b = a @ a.T
        return b.sum().item()

    step()
    maps0, unmaps0, _ = counters()
    for _ in range(10):
        step()
    maps1, unmaps1, _ = counters()
    assert (maps1, unmaps1) == (maps0, unmaps0)


def test_graph_capture_into_a_private_pool_while_the_arena_maps():
    static_in = torch.zeros(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            static_in * 2 + 1
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    other = torch.cuda.Stream()
    maps0, _, _ = counters()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tmp = static_in * 2
        static_out = tmp + 1
        del tmp
        # Not the capturing stream: the device heap's, which maps new pages
        # (in the relaxed capture mode) without breaking the capture.
        with torch.cuda.stream(other):
            outside = torch.empty(96 * MiB, dtype=torch.uint8, device="cuda")
    maps1, _, _ = counters()
    assert maps1 > maps0
    for value in (1.0, 5.0):
        static_in.fill_(value)
        g.replay()
        torch.cuda.synchronize()
        assert torch.all(static_out == 2 * value + 1).item()
    del g, static_out, outside
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    _core.device_heap(0).check()
