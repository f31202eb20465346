"""vramguard.dump_snapshot with the real PyTorch on the fake CUDA: the pickle
is read by PyTorch's own reader (torch.cuda._memory_viz, what
pytorch.org/memory_viz is built on) and by vramguard.load_trace; and the
history functions PyTorch refuses under a pluggable allocator say what
replaces them."""
import base64
import json
import pickle
import re

import pytest

from fakegpu import MiB, run
from torchfeature import has

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

from vramguard import load_trace
from vramguard.trace.format import ALLOC, FREE

#: Three tensors, one freed, recorded from the start; dumped with two live.
WORKLOAD = """
    vramguard.install(budget="256MiB", arena=ARENA)
    vramguard.start_recording()
    x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    y = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    z = torch.empty(1000, dtype=torch.uint8, device="cuda")
    del x
    vramguard.dump_snapshot(PATH)
    trace = vramguard.stop_recording()
    out["kinds"] = list(trace.kinds)
    out["sizes"] = list(trace.sizes)
    out["peak"] = trace.peak_live()
    out["segments"] = len(vramguard._core.device_heap(0).segments())
    stats = vramguard.stats()
    out["reserved"] = stats["reserved_bytes.all.current"]
    out["allocated"] = stats["allocated_bytes.all.current"]
"""


@pytest.fixture(scope="module")
def _memory_viz():
    """PyTorch's reader, imported only in the torch tier."""
    from torch.cuda import _memory_viz

    return _memory_viz


@pytest.fixture(scope="module", params=[True, False], ids=["arena", "segments"])
def dumped(request, tmp_path_factory):
    """The workload's dump under each policy: the arena writes its mapped
    runs as PyTorch writes expandable segments, segments as cudaMalloc'd."""
    path = tmp_path_factory.mktemp("snap") / "memory.pickle"
    out = run(f"PATH = {str(path)!r}; ARENA = {request.param!r}", WORKLOAD)
    out["arena"] = request.param
    with open(path, "rb") as f:
        return path, pickle.load(f), out


def test_segments_and_blocks_match_the_heap(dumped):
    _, snap, out = dumped
    assert len(snap["segments"]) == out["segments"] == 2  # a small segment and a large one
    assert sum(s["total_size"] for s in snap["segments"]) == out["reserved"]
    assert sum(s["allocated_size"] for s in snap["segments"]) == out["allocated"]
    live = sorted(b["requested_size"] for s in snap["segments"] for b in s["blocks"]
                  if b["state"] == "active_allocated")
    assert live == [1000, 3 * MiB]
    assert {s["device"] for s in snap["segments"]} == {0}


def test_pytorchs_text_readers(dumped, _memory_viz):
    _, snap, out = dumped
    stats = _memory_viz.segsum(snap)
    assert f"segments: {out['segments']}\n" in stats
    assert "Segment size mismatch" not in stats
    text = _memory_viz.trace(snap)
    entries = snap["device_traces"][0]
    assert f"{len(entries)} entries" in text
    assert len(re.findall(r"^\w+ = seg_\d+\[|^\w+ = \w+\[", text, re.M)) == 3  # three allocations
    assert [e["action"] for e in entries].count("alloc") == 3
    assert [e["action"] for e in entries].count("free_completed") == 1
    # the two segments: cudaMalloc'd, or (arena) their first pages mapped
    made = "segment_map" if out["arena"] else "segment_alloc"
    assert [e["action"] for e in entries].count(made) == 2
    assert len(re.findall(r"= cudaMalloc\(", text)) == (0 if out["arena"] else 2)


def test_pytorchs_flamegraph_readers(dumped, _memory_viz):
    _, snap, _ = dumped
    lines = _memory_viz.memory(snap, format_flamegraph=lambda text: text).splitlines()
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == sum(s["total_size"] for s in snap["segments"])
    active = [line for line in lines if ";active_allocated;" in line]
    assert sorted(int(line.rsplit(" ", 1)[1]) for line in active if "<gaps>" not in line) == [1000, 3 * MiB]
    seg_lines = _memory_viz.segments(snap, format_flamegraph=lambda text: text).splitlines()
    assert len({line.split(";")[1] for line in seg_lines}) == 2  # one prefix per segment


def test_pytorchs_html_plots_carry_the_snapshot(dumped, _memory_viz):
    _, snap, _ = dumped
    for plot in (_memory_viz.trace_plot, _memory_viz.segment_plot):
        html = plot(snap)
        files = json.loads(re.search(r"const local_files = (\[.*\])", html).group(1))
        assert pickle.loads(base64.b64decode(files[0]["base64"])) == snap
    if has("torch.cuda._memory_viz.filter_alloc_free_pairs"):   # PyTorch 2.9 on
        filtered = _memory_viz.filter_alloc_free_pairs(pickle.loads(pickle.dumps(snap)))
        kept = [e["action"] for e in filtered["device_traces"][0]]
        assert kept.count("alloc") == 2  # the freed allocation's pair is filtered out


def test_vramguards_reader_round_trips_it(dumped):
    path, _, out = dumped
    back = load_trace(path)
    assert list(back.kinds) == out["kinds"] == [ALLOC, ALLOC, ALLOC, FREE]
    assert list(back.sizes) == out["sizes"] == [MiB, 3 * MiB, 1000, 0]
    assert back.peak_live() == out["peak"] == 4 * MiB + 1000


def test_pytorchs_history_functions_run_on_vramguards_recording(tmp_path):
    """PyTorch refuses them under a pluggable allocator; installed with
    patch_torch, they stand on vramguard's recording (test_memory_history_torch.py
    has each argument), and vramguard's reader reads the pickle."""
    path = tmp_path / "native.pickle"
    run(f"PATH = {str(path)!r}", """
        vramguard.install()
        torch.cuda.memory._record_memory_history()
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        torch.cuda.memory._dump_snapshot(PATH)
        torch.cuda.memory._record_memory_history(None)
    """)
    back = load_trace(path)
    assert list(back.kinds) == [ALLOC] and list(back.sizes) == [MiB]


@pytest.mark.parametrize("arena", [True, False], ids=["arena", "segments"])
def test_graph_pools_segments_are_in_the_snapshot(tmp_path, _memory_viz, arena):
    """A CUDA graph's private pool holds memory of the device: its segments
    are written with the device heap's, under the pool's id, as PyTorch
    writes them, so that the segments add up to memory_reserved()."""
    path = tmp_path / "pools.pickle"
    out = run(f"PATH = {str(path)!r}; ARENA = {arena!r}", """
        vramguard.install(arena=ARENA)
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        torch._C._cuda_beginAllocateToPool(0, (7, 0))
        y = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
        torch._C._cuda_endAllocateToPool(0, (7, 0))
        vramguard.dump_snapshot(PATH)
        out["reserved"] = torch.cuda.memory_reserved()
        out["allocated"] = torch.cuda.memory_allocated()
    """)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    pools = sorted({tuple(s["segment_pool_id"]) for s in snap["segments"]})
    assert pools == [(0, 0), (7, 0)]
    in_pool = [s for s in snap["segments"] if tuple(s["segment_pool_id"]) == (7, 0)]
    assert [b["requested_size"] for s in in_pool for b in s["blocks"] if b["state"] == "active_allocated"] \
        == [5 * MiB]
    assert sum(s["total_size"] for s in snap["segments"]) == out["reserved"]
    assert sum(s["allocated_size"] for s in snap["segments"]) == out["allocated"]
    assert f"segments: {len(snap['segments'])}\n" in _memory_viz.segsum(snap)
