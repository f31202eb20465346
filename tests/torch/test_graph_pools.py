"""CUDA graphs' private pools, through the real PyTorch on the fake CUDA.

The fake does not capture (cudaStreamBeginCapture is a stub that fails), so
what is tested here is what PyTorch does around a capture: the begin,
end and release hooks with the filters PyTorch builds, the routing of
allocations, the pools' lifetimes, and that nothing vramguard does during a
begin would break a capture (no event query, no event record, no cudaFree,
cudaMalloc in the relaxed capture mode). Capture and replay themselves are
in the GPU script (tests/gpu/test_cuda.py)."""
import pytest

from hookrun import run

pytestmark = pytest.mark.torch

MiB = 1 << 20

# The device heap's own figures, its pools apart (vramguard.stats() and
# torch's figures include them, as PyTorch's own allocator does).
OWN = """
        def own(key="allocation.all.current", device=0):
            return _core.device_heap(device).stats()[key]
"""


def test_begin_allocate_to_pool_routes_until_end():
    v, _ = run(OWN + """
        vramguard.install(patch_torch=False)
        x = torch.empty(1000, device="cuda")
        torch._C._cuda_beginAllocateToPool(0, (7, 0))    # filter: every stream
        out("captures", _core.captures_underway(0))
        y = torch.empty(1000, device="cuda")
        z = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        out("pools", pools())
        out("device_heap", own())
        torch._C._cuda_endAllocateToPool(0, (7, 0))
        out("captures_after", _core.captures_underway(0))
        w = torch.empty(1000, device="cuda")
        out("device_heap_after", own())
        del y
        w2 = torch.empty(1000, device="cuda")
        out("reused_by_device", w2.data_ptr() == w.data_ptr() + 4096)
        torch._C._cuda_releasePool(0, (7, 0))
        out("released", pools())
        out("reserved", _core.private_pools()[0]["stats"]["reserved_bytes.all.current"])
        del z
        out("gone", pools())
        out("invalid_frees", heap(0, "num_invalid_frees"))
    """)
    assert v["captures"] == 1
    assert v["pools"] == [(0, (7, 0), 1, 1, False, 2)]
    assert v["device_heap"] == 1
    assert v["captures_after"] == 0
    assert v["device_heap_after"] == 2
    assert v["reused_by_device"] is True     # y's freed block stayed the pool's
    # released with z live: y's idle 2 MiB segment went back, z's stays
    assert v["released"] == [(0, (7, 0), 0, 0, True, 1)]
    assert v["reserved"] == 6 * MiB
    assert v["gone"] == []
    assert v["invalid_frees"] == 0


def test_current_thread_to_pool_leaves_other_threads_alone():
    v, _ = run(OWN + """
        vramguard.install(patch_torch=False)
        x = torch.empty(10, device="cuda")
        torch._C._cuda_beginAllocateCurrentThreadToPool(0, (8, 0))  # as cudagraph trees do
        a = torch.empty(100, device="cuda")
        kept = {}
        t = threading.Thread(target=lambda: kept.setdefault("b", torch.empty(100, device="cuda")))
        t.start(); t.join()
        out("pools", pools())
        out("device_heap", own())
        torch._C._cuda_endAllocateToPool(0, (8, 0))
        torch._C._cuda_releasePool(0, (8, 0))
        del a
        out("gone", pools())
    """)
    assert v["pools"] == [(0, (8, 0), 1, 1, False, 1)]
    assert v["device_heap"] == 2                # x, and the other thread's b
    assert v["gone"] == []


def test_graph_capture_begin_reaches_the_hooks():
    v, _ = run(OWN + """
        vramguard.install(patch_torch=False)
        side = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            try:
                g.capture_begin()       # begin hook, then cudaStreamBeginCapture (a stub here)
            except RuntimeError as e:
                out("capture_begin", type(e).__name__)
            # PyTorch's graph filter asks cudaStreamGetCaptureInfo: no capture, not the pool's
            y = torch.empty(1000, device="cuda")
        out("captures", _core.captures_underway(0))
        out("pools", [(d, u, b, r, n) for d, _, u, b, r, n in pools()])
        out("pool_id_second", _core.private_pools()[0]["id"][1])
        out("device_heap", heap(0))
        del g
        gc.collect()                    # ~CUDAGraph: end, then release
        out("captures_after", _core.captures_underway(0))
        out("pools_after", pools())
        pool = torch.cuda.graph_pool_handle()
        g2 = torch.cuda.CUDAGraph()
        x = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        del x
        try:
            with torch.cuda.graph(g2, pool=pool, stream=side):   # empty_cache first: reset_fn
                pass
        except RuntimeError:
            pass
        out("reserved_at_graph_entry", heap(0, "reserved_bytes.all.current"))
        out("graph_pool", [p["id"] == tuple(pool) for p in _core.private_pools()])
    """)
    assert v["capture_begin"] == "AcceleratorError"
    assert v["captures"] == 1
    assert v["pools"] == [(0, 1, 1, False, 0)]
    assert v["pool_id_second"] == 0             # PyTorch's own graph pool: (uuid, 0)
    assert v["device_heap"] == 1
    assert v["captures_after"] == 0
    assert v["pools_after"] == []
    assert v["reserved_at_graph_entry"] == 2 * MiB   # the 30 MiB idle segment released
    assert v["graph_pool"] == [True]


def test_graphs_sharing_a_pool_count_its_uses():
    v, _ = run(OWN + """
        vramguard.install(patch_torch=False)
        pool = torch.cuda.graph_pool_handle()
        torch._C._cuda_beginAllocateToPool(0, pool)
        a = torch.empty(1000, device="cuda")
        torch._C._cuda_endAllocateToPool(0, pool)
        first = a.data_ptr()
        del a
        torch._C._cuda_beginAllocateToPool(0, pool)
        b = torch.empty(1000, device="cuda")
        torch._C._cuda_endAllocateToPool(0, pool)
        out("reused", b.data_ptr() == first)
        out("uses", _core.private_pools()[0]["use_count"])
        del b
        torch._C._cuda_releasePool(0, pool)
        out("one_left", [u for _, _, u, _, _, _ in pools()])
        torch._C._cuda_releasePool(0, pool)
        out("none_left", pools())
        try:
            torch._C._cuda_beginAllocateToPool(0, (0, 0))
        except RuntimeError as e:
            out("default_pool", str(e))
    """)
    assert v["reused"] is True
    assert v["uses"] == 2
    assert v["one_left"] == [1]
    assert v["none_left"] == []
    assert v["default_pool"].startswith(
        "vramguard: cannot allocate to private pool (0, 0) on device 0: begin of the default pool")


def test_nothing_during_a_begin_breaks_a_capture():
    """While a begin is active on a device, vramguard makes none of the
    calls that end a capture with an error: no cudaEventQuery or
    cudaEventRecord (a freed block used by another stream waits), no
    cudaFree (deferred), and its cudaMalloc runs in the relaxed capture
    mode. Afterwards the deferred work is done."""
    v, _ = run(OWN + """
        vramguard.install(patch_torch=False, arena=False)
        side = torch.cuda.Stream()
        x = torch.empty(1000, device="cuda")
        x.record_stream(side)
        big = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        del big                                       # an idle 30 MiB segment
        before = {api: calls(api) for api in ("cudaEventQuery", "cudaEventRecord", "cudaFree",
                                              "cudaThreadExchangeStreamCaptureMode", "cudaMalloc")}
        torch._C._cuda_beginAllocateToPool(0, (9, 0))
        del x                                         # used by `side`: waits for an event
        torch._C._cuda_emptyCache()                   # releases the 30 MiB: deferred
        p = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")   # the pool's cudaMalloc
        during = {api: calls(api) - n for api, n in before.items()}
        out("during", during)
        out("fake_used_during", fake.vg_fakecuda_bytes_in_use(0))
        out("reserved_during", own("reserved_bytes.all.current"))
        torch._C._cuda_endAllocateToPool(0, (9, 0))
        y = torch.empty(1000, device="cuda")          # records, queries, finds x's block free
        z = torch.empty(50 * MiB, dtype=torch.uint8, device="cuda")    # frees what was deferred
        out("after", {api: calls(api) - n for api, n in before.items()})
        out("fake_used_after", fake.vg_fakecuda_bytes_in_use(0))
        del p
        torch._C._cuda_releasePool(0, (9, 0))
        out("pools", pools())
    """)
    during = v["during"]
    assert during["cudaEventQuery"] == 0
    assert during["cudaEventRecord"] == 0
    assert during["cudaFree"] == 0
    assert during["cudaMalloc"] == 1
    assert during["cudaThreadExchangeStreamCaptureMode"] == 2    # to relaxed, and back
    assert v["fake_used_during"] == (2 + 30 + 100) * MiB
    assert v["reserved_during"] == 2 * MiB
    after = v["after"]
    assert after["cudaEventRecord"] == 1
    assert after["cudaEventQuery"] == 1
    assert after["cudaFree"] == 1
    assert v["fake_used_after"] == (2 + 100 + 50) * MiB
    assert v["pools"] == []


def test_what_pytorch_refuses_under_any_pluggable_allocator():
    v, _ = run(OWN + """
        vramguard.install(patch_torch=False)
        x = torch.empty(10, device="cuda")
        try:
            torch.cuda.MemPool()
        except RuntimeError as e:
            out("mempool", str(e))
        for name, args in (("_cuda_getCheckpointState", (0, (1, 0))),
                           ("_cuda_setCheckpointPoolState", (0, None, [], [])),
                           ("_cuda_checkPoolLiveAllocations", (0, (1, 0), set()))):
            try:
                getattr(torch._C, name)(*args)
            except vramguard.VramguardError as e:
                out(name, (isinstance(e, RuntimeError), str(e)))
    """)
    assert v["mempool"] == ("pluggable does not yet support createOrIncrefPool. If you need it, "
                            "please file an issue describing your use case.")
    # The pool check is what cudagraph trees call first on a real GPU (torch 2.11).
    for name in ("_cuda_getCheckpointState", "_cuda_setCheckpointPoolState", "_cuda_checkPoolLiveAllocations"):
        is_runtime_error, message = v[name]
        assert is_runtime_error
        assert message.startswith("vramguard: torch.compile(mode='reduce-overhead') records CUDA "
                                  f"graphs with cudagraph trees, which read PyTorch's native "
                                  f"allocator's pool and checkpoint state (torch._C.{name})")
        assert "mode='max-autotune-no-cudagraphs'" in message


# ----------------------------------------------------------------- the device's figures

# The same sequence under PyTorch's native allocator and under vramguard: a
# 10 MiB tensor, then a pool's 3 MiB and 4000 bytes, then the pool freed and
# released. Both allocators report the pool in the device's figures and
# under its id; the byte counts differ by the segment policy only.
FIGURES = """
        x = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
        torch._C._cuda_beginAllocateToPool(0, (7, 0))
        y = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        z = torch.empty(1000, device="cuda")
        torch._C._cuda_endAllocateToPool(0, (7, 0))
        s = torch.cuda.memory_stats()
        out("reserved", torch.cuda.memory_reserved())
        out("allocated", torch.cuda.memory_allocated())
        out("max_reserved", torch.cuda.max_memory_reserved())
        out("pool", {k[len("reserved_bytes_by_private_pools.7_0."):]: v for k, v in s.items()
                     if k.startswith("reserved_bytes_by_private_pools.")})
        out("nested_ids", list(torch.cuda.memory_stats_as_nested_dict()["reserved_bytes_by_private_pools"]))
        out("accelerator_pool_keys", [k for k in torch.accelerator.memory_stats() if k.startswith("reserved_bytes_by")])
        del y, z
        torch._C._cuda_releasePool(0, (7, 0))
        torch.cuda.empty_cache()
        s = torch.cuda.memory_stats()
        out("reserved_after", torch.cuda.memory_reserved())
        out("allocated_after", torch.cuda.memory_allocated())
        out("max_reserved_after", torch.cuda.max_memory_reserved())
        out("pool_after", {k[len("reserved_bytes_by_private_pools.7_0."):]: v for k, v in s.items()
                           if k.startswith("reserved_bytes_by_private_pools.7_0.all.")})
        torch.cuda.reset_peak_memory_stats()
        out("pool_after_reset", {k: v for k, v in torch.cuda.memory_stats().items()
                                       if k.startswith("reserved_bytes_by_private_pools.7_0.all.")})
        out("max_reserved_after_reset", torch.cuda.max_memory_reserved())
"""


def _pool_figures_hold(v, pool):
    """What both allocators show: the pool's bytes in the device's figures
    and under its id; gone, current 0 with its peak kept until reset."""
    assert v["pool"]["all.current"] == pool
    assert v["pool"]["all.peak"] == pool
    assert v["nested_ids"] == [(7, 0)]
    assert v["accelerator_pool_keys"] == []
    assert v["allocated"] == 10 * MiB + 3 * MiB + 4096
    assert v["reserved"] == v["max_reserved"] == 10 * MiB + pool
    assert v["reserved_after"] == 10 * MiB
    assert v["allocated_after"] == 10 * MiB
    assert v["max_reserved_after"] == 10 * MiB + pool
    assert v["pool_after"] == {"all.allocated": pool, "all.current": 0, "all.freed": pool,
                               "all.peak": pool}
    assert v["pool_after_reset"]["reserved_bytes_by_private_pools.7_0.all.peak"] == 0
    assert v["max_reserved_after_reset"] == 10 * MiB


def test_native_allocator_counts_private_pools_in_the_device():
    """The reference: PyTorch's own allocator on the fake (a 20 MiB segment
    for 3 MiB, and a 2 MiB one for the small tensor)."""
    v, _ = run(FIGURES)
    _pool_figures_hold(v, 22 * MiB)


def test_device_figures_include_private_pools():
    """vramguard reports what the native allocator reports: the pool's 6 MiB
    segment (two 3 MiB blocks) and 2 MiB small one in memory_reserved(), the
    peaks, and reserved_bytes_by_private_pools; released, the pool drops out
    of the current figures."""
    v, _ = run("""
        vramguard.install()
""" + FIGURES + """
        out("stats_pools", vramguard.stats(0)["private_pools"])
        out("summary", str(vramguard.summary(0)))
    """)
    _pool_figures_hold(v, 8 * MiB)
    assert v["stats_pools"] == 0


def test_summary_names_what_graph_pools_hold():
    v, _ = run("""
        vramguard.install()
        x = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
        torch._C._cuda_beginAllocateToPool(0, (7, 0))
        y = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        torch._C._cuda_endAllocateToPool(0, (7, 0))
        st = vramguard.stats(0)
        out("figures", (st["private_pools"], st["private_pool_reserved_bytes"],
                        st["private_pool_allocated_bytes"], st["reserved_bytes.all.current"]))
        out("summary", str(vramguard.summary(0)))
    """)
    assert v["figures"] == (1, 6 * MiB, 3 * MiB, 16 * MiB)
    assert ("CUDA graph private pools: 1 holding 6.00 MiB (3.00 MiB in live tensors), included "
            "above; kept until their graphs are released") in " ".join(
                line.strip("| ") for line in v["summary"].splitlines())


def test_budget_counts_private_pools():
    """install(budget=...) is one budget for the device, its graph pools
    included: with 40 MiB on the device heap and 20 MiB in a pool under
    64 MiB, the pool's next 8 MiB is refused, and so is the heap's next
    6 MiB; 4 MiB still fits. Each OOM says what the pools hold."""
    v, _ = run(OWN + """
        vramguard.install(budget="64MiB")
        a = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        torch._C._cuda_beginAllocateToPool(0, (7, 0))
        g = torch.empty(20 * MiB, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            out("pool_oom", str(e))
        torch._C._cuda_endAllocateToPool(0, (7, 0))
        try:
            torch.empty(6 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            out("heap_oom", str(e))
        b = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        out("reserved", torch.cuda.memory_reserved())
        out("own_reserved", own("reserved_bytes.all.current"))
        out("free_total", torch.cuda.mem_get_info())
        del g
        torch._C._cuda_releasePool(0, (7, 0))
        c = torch.empty(20 * MiB, dtype=torch.uint8, device="cuda")   # the pool's 20 MiB, back
        out("reserved_after", torch.cuda.memory_reserved())
    """)
    assert ("Of the allocated memory 60.00 MiB is allocated by PyTorch, with 20.00 MiB allocated "
            "in private pools (e.g., CUDA Graphs), and 0 bytes is reserved by PyTorch but "
            "unallocated.") in v["pool_oom"]
    assert "CUDA graph private pools hold 20.00 MiB (1 pool" in v["pool_oom"]
    assert "refused in its graph's pool" in v["pool_oom"]
    assert "with 20.00 MiB allocated in private pools" in v["heap_oom"]
    assert "refused in its graph's pool" not in v["heap_oom"]
    assert v["reserved"] == 64 * MiB
    assert v["own_reserved"] == 44 * MiB
    assert v["free_total"][0] == 0            # mem_get_info: the budget, pools included
    assert v["reserved_after"] == 64 * MiB
