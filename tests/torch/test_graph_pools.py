"""CUDA graphs' private pools, through the real PyTorch on the fake CUDA.

The fake captures (csrc/phantom/rt_graph.c): torch.cuda.graph,
CUDAGraph and make_graphed_callables run on it, kernels recorded as nodes
and replays doing nothing, and it refuses what a driver refuses during a
capture (cudaMalloc, cudaFree, synchronizes and event queries in the global
mode), invalidating the capture as a GPU does. So a capture that ends well
here made none of the calls that break one. Tested: the begin, end and
release hooks with the filters PyTorch builds (directly and through real
captures), the routing of allocations, the pools' lifetimes, graphs sharing
a pool, a training step through make_graphed_callables, frees during a
capture deferred, and PyTorch's own allocator as the reference. What needs
the numbers kernels compute is in the GPU script (tests/gpu/test_graphs.py)."""
import pytest

from hookrun import run
from torchfeature import has, need_capture_inside_pool, need_private_pool_stats

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

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


WARM = """
        def warm_up(fn, *args):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    fn(*args)
            torch.cuda.current_stream().wait_stream(side)

        def nodes(g):                  # a keep_graph=True graph's, from the fake
            n = ctypes.c_size_t(0)
            assert fake.cudaGraphGetNodes(ctypes.c_void_p(g.raw_cuda_graph()), None, ctypes.byref(n)) == 0
            return n.value
"""


def test_graph_capture_reaches_the_hooks():
    need_capture_inside_pool()
    v, _ = run(OWN + WARM + """
        vramguard.install(patch_torch=False)
        side = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            g.capture_begin()           # begin hook, then cudaStreamBeginCapture
            out("capturing", torch.cuda.is_current_stream_capturing())
            out("captures", _core.captures_underway(0))
            y = torch.empty(1000, device="cuda")     # the filter: this capture's stream
            t = threading.Thread(target=lambda: out("other_thread", torch.cuda.is_current_stream_capturing()))
            t.start(); t.join()
            g.capture_end()
        out("pools", [(d, u, b, r, n) for d, _, u, b, r, n in pools()])
        out("pool_id_second", _core.private_pools()[0]["id"][1])
        out("device_heap", heap(0))
        out("captures_ended", _core.captures_underway(0))
        del g
        gc.collect()                    # ~CUDAGraph: release
        out("pools_after", pools())
        pool = torch.cuda.graph_pool_handle()
        g2 = torch.cuda.CUDAGraph()
        x = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        del x
        with torch.cuda.graph(g2, pool=pool, stream=side):   # empty_cache first
            out("reserved_at_graph_entry", heap(0, "reserved_bytes.all.current"))
        out("graph_pool", [p["id"] == tuple(pool) for p in _core.private_pools()])
    """)
    assert v["capturing"] is True
    assert v["captures"] == 1
    assert v["other_thread"] is False          # its current stream is the default one
    assert v["pools"] == [(0, 1, 0, False, 1)]  # y, in the graph's pool
    assert v["pool_id_second"] == 0             # PyTorch's own graph pool: (uuid, 0)
    assert v["device_heap"] == 1
    assert v["captures_ended"] == 0
    assert [p[2:] for p in v["pools_after"]] == [(0, 0, True, 1)]   # released, y still live
    assert v["reserved_at_graph_entry"] == 2 * MiB   # the 30 MiB idle segment released
    assert v["graph_pool"] == [False, True]          # y's pool, and the handle's


def test_capture_and_replay_use_a_private_pool():
    """tests/gpu/test_graphs.py's first test, less the values: what a
    capture allocates lands in the graph's pool (nothing on the device
    heap), a tensor freed during the capture keeps its block in the pool,
    replays launch the executable graph, and the pool goes with the graph
    and its last tensor."""
    need_capture_inside_pool()
    v, _ = run(OWN + WARM + """
        vramguard.install()
        static_in = torch.zeros(1 << 20, device="cuda")
        warm_up(lambda t: t * 2 + 1, static_in)
        # A first capture makes PyTorch's RNG state for graphs (kept for the process).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # "The CUDA Graph is empty"
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                pass
        gc.collect()
        before = own()
        used = fake.vg_fakecuda_bytes_in_use(0)
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(g):
            out("captures_during", _core.captures_underway(0))
            tmp = static_in * 2          # freed during the capture: the pool keeps its block
            static_out = tmp + 1
            del tmp
        out("captures", _core.captures_underway(0))
        out("pools", [(u, b, r, n) for _, _, u, b, r, n in pools()])
        out("pool_reserved", _core.private_pools()[0]["stats"]["reserved_bytes.all.current"])
        out("device_heap", own() - before)
        out("fake_grew", fake.vg_fakecuda_bytes_in_use(0) - used)
        out("nodes", nodes(g))
        launches = calls("cudaGraphLaunch")
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        out("replays", calls("cudaGraphLaunch") - launches)
        out("device_heap_after_replays", own() - before)
        del g
        gc.collect()
        out("released", [p["released"] for p in _core.private_pools()])   # static_out is live
        del static_out
        out("gone", pools())
        _core.device_heap(0).check()
    """)
    assert v["captures_during"] == 1
    assert v["captures"] == 0
    assert v["pools"] == [(1, 0, False, 1)]        # static_out
    assert v["pool_reserved"] == 8 * MiB            # tmp's and static_out's 4 MiB
    assert v["device_heap"] == 0
    assert v["fake_grew"] == 8 * MiB                # cudaMalloc during the capture (relaxed)
    assert v["nodes"] == 2                          # the two kernels
    assert v["replays"] == 3
    assert v["device_heap_after_replays"] == 0
    assert v["released"] == [True]
    assert v["gone"] == []


def test_graphs_sharing_a_pool():
    v, _ = run(OWN + WARM + """
        vramguard.install()
        x = torch.ones(1 << 18, device="cuda")
        warm_up(lambda t: (t + 1) * 3, x)
        g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1):
            y1 = x + 1
        with torch.cuda.graph(g2, pool=g1.pool()):
            y2 = y1 * 3
        out("same_pool", g1.pool() == g2.pool())
        out("pools", [(u, b, r, n) for _, _, u, b, r, n in pools()])
        g1.replay()
        g2.replay()
        del g1
        gc.collect()
        out("one_graph_left", [(u, b, r, n) for _, _, u, b, r, n in pools()])
        del g2
        gc.collect()
        out("both_gone", [(u, b, r, n) for _, _, u, b, r, n in pools()])
        del y1, y2
        out("tensors_gone", pools())
    """)
    assert v["same_pool"] is True
    assert v["pools"] == [(2, 0, False, 2)]
    assert v["one_graph_left"] == [(1, 0, False, 2)]
    assert v["both_gone"] == [(0, 0, True, 2)]
    assert v["tensors_gone"] == []


def test_make_graphed_callables_trains():
    """An MLP (its Linear layers on the cuBLAS stand-in) made into graphs,
    forward and backward captured into one pool, then trained by replays."""
    v, _ = run(OWN + """
        vramguard.install()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 8)).cuda()
        x = torch.randn(32, 256, device="cuda", requires_grad=True)
        graphed = torch.cuda.make_graphed_callables(model, (x,))
        out("pools", [(u, b, r) for _, _, u, b, r, _ in pools()])
        out("captures", _core.captures_underway(0))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        launches = calls("cudaGraphLaunch")
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = graphed(x).sum()
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        out("replays", calls("cudaGraphLaunch") - launches)
        out("grads", [p.grad is not None and p.grad.shape == p.shape for p in model.parameters()])
        out("input_grad", x.grad is not None)
        out("pool_tensors", _core.private_pools()[0]["stats"]["allocation.all.current"] > 0)
        _core.device_heap(0).check()
    """)
    assert v["pools"] == [(2, 0, False)]       # the forward's and the backward's captures
    assert v["captures"] == 0
    assert v["replays"] == 6                    # forward and backward, three steps
    assert v["grads"] == [True] * 4
    assert v["input_grad"] is True
    assert v["pool_tensors"] is True


def test_a_free_during_capture_is_deferred():
    """A block used by another stream, freed during a capture, and an
    empty_cache there: vramguard records no event, queries none and frees
    nothing until the capture is over (the fake would have ended the
    capture with an error), then does the deferred work."""
    v, _ = run(OWN + WARM + """
        vramguard.install(arena=False)
        side = torch.cuda.Stream()
        x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        x.record_stream(side)
        static = torch.zeros(1024, device="cuda")
        warm_up(lambda t: t + 1, static)
        g = torch.cuda.CUDAGraph()
        apis = ("cudaEventQuery", "cudaEventRecord", "cudaFree", "cudaMalloc")
        with torch.cuda.graph(g):
            big = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
            before = {api: calls(api) for api in apis}
            del x                                   # event record deferred
            torch.cuda.empty_cache()                # cudaFree deferred
            y = static + 1                          # events not queried
            out("during", {api: calls(api) - n for api, n in before.items()})
        g.replay()
        used = fake.vg_fakecuda_bytes_in_use(0)
        z = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        out("after", {api: calls(api) - n for api, n in before.items()})
        out("x_block_reused", fake.vg_fakecuda_bytes_in_use(0) == used)
        del z, g, y, big
        gc.collect()
        out("pools", pools())
    """)
    # y's segment: the pool's cudaMalloc, in the relaxed mode
    assert v["during"] == {"cudaEventQuery": 0, "cudaEventRecord": 0, "cudaFree": 0, "cudaMalloc": 1}
    after = v["after"]
    assert after["cudaEventRecord"] == 1
    assert after["cudaEventQuery"] >= 1
    assert v["x_block_reused"] is True
    assert v["pools"] == []


def test_record_stream_during_a_capture_asks_the_runtime_nothing():
    """record_stream looks up the stream's device (cudaStreamGetDevice) but
    not while a graph is captured: autograd's thread calls it in a captured
    backward (make_graphed_callables), and on a GPU the capture ended with
    an error under vramguard alone. The current device stands in then."""
    v, _ = run(OWN + WARM + """
        vramguard.install()
        side = torch.cuda.Stream()
        static = torch.zeros(1024, device="cuda")
        warm_up(lambda t: t + 1, static)
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        n = calls("cudaStreamGetDevice")
        x.record_stream(side)
        out("outside", calls("cudaStreamGetDevice") - n)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = static + 1
            n = calls("cudaStreamGetDevice")
            y.record_stream(side)
            out("during", calls("cudaStreamGetDevice") - n)
        g.replay()
        torch.cuda.synchronize()
        out("uses", vramguard.stats(0)["num_record_stream"])
        del x, y, g
        gc.collect()
        out("pools", pools())
        _core.device_heap(0).check()
    """)
    assert v["outside"] == 1
    assert v["during"] == 0
    assert v["uses"] >= 1
    assert v["pools"] == []


def test_a_synchronize_during_capture_fails_as_on_a_gpu():
    """What the fake refuses, PyTorch reports as a GPU's error; the capture
    ends, the pool is left to the graph, and nothing stays underway."""
    v, _ = run(OWN + """
        vramguard.install()
        x = torch.ones(1024, device="cuda")
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                y = x * 2
                torch.cuda.synchronize()
        except torch.AcceleratorError as e:
            out("error", str(e).splitlines()[0])
            out("cause", str(e.__context__).splitlines()[0])
        out("capturing", torch.cuda.is_current_stream_capturing())
        out("captures", _core.captures_underway(0))
        out("pools_begun", sum(p["begun"] for p in _core.private_pools()))
        z = torch.empty(1000, device="cuda")
        out("device_heap", own())
    """)
    assert v["cause"] == "CUDA error: cudaErrorStreamCaptureUnsupported"
    assert v["error"] == "CUDA error: cudaErrorStreamCaptureInvalidated"   # at the capture's end
    assert v["capturing"] is False
    # PyTorch before 2.15 ends allocation to the pool only after a capture's
    # end succeeds: install() ends it when capture_end raises (graphs.py).
    assert v["captures"] == 0
    assert v["pools_begun"] == 0


@pytest.mark.parametrize("allocator", ["native", "vramguard"])
def test_graph_pools_in_memory_stats(allocator):
    """The reference: PyTorch's own allocator captures on the fake too, and
    both report a real graph's pool under its id in memory_stats() and
    drop it from the current figures once graph and tensors are gone."""
    need_capture_inside_pool()
    if allocator == "native":
        need_private_pool_stats()
    v, _ = run(("        vramguard.install()\n" if allocator == "vramguard" else "") + """
        x = torch.ones(1 << 18, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2
            z = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        pool = "%d_%d" % g.pool()
        s = torch.cuda.memory_stats()
        out("pool_ids", sorted({k.split(".")[1] for k in s if k.startswith("reserved_bytes_by_private_pools.")}))
        out("pool", pool)
        out("pool_current", s["reserved_bytes_by_private_pools.%s.all.current" % pool])
        out("allocated", torch.cuda.memory_allocated() - x.numel() * 4)
        g.replay()
        del g, y, z
        gc.collect()
        torch.cuda.empty_cache()
        s = torch.cuda.memory_stats()
        out("pool_after", s.get("reserved_bytes_by_private_pools.%s.all.current" % pool))
        out("reserved_after", torch.cuda.memory_reserved())
    """)
    assert v["pool_ids"] == [v["pool"]] == ["1_0"]      # the graph's own pool: (uuid, 0)
    assert v["allocated"] == 4 * MiB                     # y and z
    # native: a 2 MiB small segment for y, a 20 MiB one for z; vramguard's segment policy differs
    assert v["pool_current"] == {"native": 22 * MiB, "vramguard": 8 * MiB}[allocator]
    assert v["pool_after"] == 0
    assert v["reserved_after"] == 2 * MiB               # x's segment


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
        if hasattr(torch.accelerator, "memory_stats"):   # PyTorch 2.9 on
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
    if has("torch.accelerator.memory_stats"):
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
    need_private_pool_stats()
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
