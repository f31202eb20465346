"""On a real GPU: CUDA graphs captured and replayed over vramguard's private
pools, capture-safe frees, the reduce-overhead refusal, and cuDNN's
workspace fallback on vramguard's torch.OutOfMemoryError, with the values
the kernels compute. The fake CUDA captures and replays too, without
values (tests/torch/test_graph_pools.py ports the rest of these checks)."""
import copy
import gc

import pytest

torch = pytest.importorskip("torch")
import vramguard  # noqa: E402
from vramguard import _core  # noqa: E402

MiB = 1 << 20


def pools():
    return _core.private_pools()


def warm_up(fn, *args):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)


def test_capture_and_replay_use_a_private_pool():
    static_in = torch.zeros(1 << 20, device="cuda")
    warm_up(lambda t: t * 2 + 1, static_in)
    gc.collect()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tmp = static_in * 2          # freed during the capture: the pool keeps its block
        static_out = tmp + 1
        del tmp
    assert _core.captures_underway(0) == 0
    (pool,) = pools()
    assert pool["begun"] == 0 and pool["use_count"] == 1
    assert pool["stats"]["allocation.all.current"] == 1      # static_out
    # What the capture made is the pool's, not the device heap's. (PyTorch
    # also makes allocations of its own there at a capture's begin, its RNG
    # state for graphs, whose number changes between versions: three more
    # at a second capture on 2.11 with a GPU, so they are not counted.)
    assert _core.device_heap(0).block_size(static_out.data_ptr()) == 0
    # memory allocated after the capture is never the pool's, so a replay
    # (which writes tmp's block) cannot touch it
    other = torch.full((1 << 20,), 7.0, device="cuda")
    for value in (1.0, 5.0):
        static_in.fill_(value)
        g.replay()
        torch.cuda.synchronize()
        assert torch.all(static_out == 2 * value + 1).item()
        assert torch.all(other == 7.0).item()
    del g
    gc.collect()
    assert [p["released"] for p in pools()] == [True]        # static_out is still live
    del static_out
    assert pools() == []
    vramguard._core.device_heap(0).check()


def test_graphs_sharing_a_pool():
    x = torch.ones(1 << 18, device="cuda")
    warm_up(lambda t: (t + 1) * 3, x)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        y1 = x + 1
    with torch.cuda.graph(g2, pool=g1.pool()):
        y2 = y1 * 3
    (pool,) = pools()
    assert pool["use_count"] == 2
    x.fill_(2.0)
    g1.replay()
    g2.replay()
    torch.cuda.synchronize()
    assert torch.all(y2 == 9.0).item()
    del g1, g2, y1, y2
    gc.collect()
    assert pools() == []


def test_make_graphed_callables_trains():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
    x = torch.randn(32, 256, device="cuda", requires_grad=True)
    # The eager reference from copies of the model and the input: a
    # parameter's AccumulateGrad node made by a pass on the default stream
    # stays with the parameter, and from PyTorch 2.11 a backward captured
    # on a side stream that reaches it invalidates the capture whatever the
    # allocator (tests/gpu/probe_accumulate_grad.py shows it under PyTorch's
    # own allocator).
    reference = copy.deepcopy(model)
    eager = reference(x.detach().clone().requires_grad_()).sum()
    eager.backward()
    eager = eager.detach()
    eager_grad = reference[0].weight.grad.clone()
    del reference
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    model.zero_grad(set_to_none=True)
    out = graphed(x).sum()
    out.backward()
    torch.cuda.synchronize()
    assert torch.allclose(out, eager, rtol=1e-4, atol=1e-4)
    assert torch.allclose(model[0].weight.grad, eager_grad, rtol=1e-4, atol=1e-4)
    assert pools()                                           # the graphs' pool, while they live


def test_a_free_during_capture_does_not_break_it():
    """A block used by another stream, freed during a capture: PyTorch's
    allocator would query an event there, which ends the capture with an
    error; vramguard's provider defers it until the capture is over."""
    side = torch.cuda.Stream()
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    x.record_stream(side)
    big = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    del big                                                   # an idle segment to release
    static = torch.zeros(1024, device="cuda")
    warm_up(lambda t: t + 1, static)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        del x                                                 # event record deferred
        torch.cuda.empty_cache()                              # cudaFree deferred
        y = static + 1                                        # events not queried
    g.replay()
    torch.cuda.synchronize()
    assert torch.all(y == 1.0).item()
    z = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")  # the deferred work is done now
    del z, g, y
    gc.collect()


def test_reduce_overhead_says_what_to_do():
    pytest.importorskip("triton")

    @torch.compile(mode="reduce-overhead")
    def f(t):
        return t * 2 + 1

    t = torch.ones(1024, device="cuda")
    with pytest.raises(vramguard.VramguardError) as err:
        for _ in range(4):   # warm-up, then recording, which reads the checkpoint state
            f(t)
    assert "mode='max-autotune-no-cudagraphs'" in str(err.value)


def test_cudnn_workspace_fallback_catches_vramguards_oom():
    """cuDNN asks for a workspace and, on c10::OutOfMemoryError, tries a
    smaller one: under a budget that leaves room for the output but not for
    the preferred workspace, the convolution still runs."""
    shim = vramguard.torch.install.install_state["hooks"]["oom_shim"]
    if shim.address is None:
        pytest.skip(f"no out-of-memory shim here: {shim.reason}")
    conv = torch.nn.Conv2d(64, 64, 5, padding=2).cuda()
    x = torch.randn(64, 64, 128, 128, device="cuda")
    with torch.no_grad():
        expected = conv(x)
    torch.cuda.synchronize()
    del expected
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    ooms = vramguard.stats(0)["num_ooms"]
    vramguard.install(budget=reserved + 300 * MiB)   # the output (256 MiB) and a little more
    try:
        with torch.no_grad():
            y = conv(x)
        torch.cuda.synchronize()
        assert y.shape == (64, 64, 128, 128)
        if vramguard.stats(0)["num_ooms"] == ooms:
            pytest.skip("cuDNN asked for no workspace larger than the budget left")
    finally:
        vramguard.install(budget=None)
