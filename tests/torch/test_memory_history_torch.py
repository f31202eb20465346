"""torch.cuda.memory's history functions under vramguard, called as
PyTorch's docs and tutorials call them: they run on vramguard's recording
(trace/memory_history.py) instead of raising PyTorch's "CUDAPluggableAllocator
does not yet support recordHistory", and the pickle _dump_snapshot writes is
read by torch.cuda._memory_viz."""
import pytest

from hookrun import run

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

SCRIPT = """\
import torch

def make(n):
    return torch.empty(n, dtype=torch.uint8, device="cuda")

torch.cuda.memory._record_memory_history(max_entries=100000)
a = make(3 * MiB)
b = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
del a
torch.cuda.memory._dump_snapshot(PATH)
torch.cuda.memory._record_memory_history(enabled=None)
"""


def test_the_tutorials_calls_write_a_snapshot_memory_viz_reads(tmp_path):
    script = tmp_path / "profile.py"
    script.write_text(SCRIPT)
    dump = tmp_path / "memory.pickle"
    v, _ = run(f"""
        import pickle, runpy
        from torch.cuda import _memory_viz
        vramguard.install()
        runpy.run_path({str(script)!r}, init_globals={{"MiB": MiB, "PATH": {str(dump)!r}}})
        with open({str(dump)!r}, "rb") as f:
            snap = pickle.load(f)
        out("keys", sorted(snap))
        out("trace", [(e["action"], e["size"], [(f["filename"].rsplit("/", 1)[-1], f["line"], f["name"])
                                                 for f in e["frames"] if f["filename"] == {str(script)!r}])
                      for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_requested")])
        out("blocks", [(b["size"], b["state"]) for s in snap["segments"] for b in s["blocks"]])
        out("trace_plot", "<html" in _memory_viz.trace_plot(snap).lower())
        out("segment_plot", "<html" in _memory_viz.segment_plot(snap).lower())
        out("flamegraph", sorted(_memory_viz.segments(snap, format_flamegraph=lambda text: text).splitlines()))
        out("after_stop", torch.cuda.memory._snapshot()["device_traces"])
        out("segments_now", [(b["size"], b["state"]) for s in torch.cuda.memory_snapshot() for b in s["blocks"]])
    """)
    MiB = 1 << 20
    assert v["keys"] == ["allocator_settings", "device_traces", "external_annotations", "segments"]
    assert v["trace"] == [("alloc", 3 * MiB, [("profile.py", 4, "make"), ("profile.py", 7, "<module>")]),
                          ("alloc", 5 * MiB, [("profile.py", 8, "<module>")]),
                          ("free_requested", 3 * MiB, [])]
    assert (5 * MiB, "active_allocated") in v["blocks"] and (3 * MiB, "inactive") in v["blocks"]
    assert v["trace_plot"] is True and v["segment_plot"] is True
    # the live block, named by its line, in the flame graph's text (stream;segment;frames size)
    live = [line for line in v["flamegraph"] if line.endswith(f" {5 * MiB}")]
    assert len(live) == 1 and "profile.py:8:<module>" in live[0], v["flamegraph"]
    assert v["after_stop"] == [[]]  # enabled=None drops the history, as PyTorch's does
    assert (5 * MiB, "active_allocated") in v["segments_now"]


def test_each_argument_maps_onto_the_recording(tmp_path):
    v, _ = run("""
        vramguard.install()
        memory = torch.cuda.memory
        def actions():
            return [(e["action"], e["size"]) for e in memory._snapshot()["device_traces"][0]
                    if e["action"] != "segment_map"]
        memory._record_memory_history("state")
        a = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        snap = memory._snapshot()
        out("state", (snap["device_traces"], [len(b.get("frames", [])) > 0 for s in snap["segments"]
                                             for b in s["blocks"] if b["state"] == "active_allocated"]))
        memory._record_memory_history("all", clear_history=True, skip_actions=["free_requested"])
        b = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda"); del b
        out("skip", actions())
        memory._record_memory_history(enabled=None)
        memory._record_memory_history(max_entries=2, context=None)
        for n in (1, 2, 3):
            c = torch.empty(n * MiB, dtype=torch.uint8, device="cuda"); del c
        out("last_two", actions())
        out("no_frames", all(not e["frames"] for e in memory._snapshot()["device_traces"][0]))
        memory._record_memory_history(enabled=None)
        memory._record_memory_history(True, trace_alloc_max_entries=100, trace_alloc_record_context=True)
        d = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        out("legacy", actions())
        memory._record_memory_history(False)
        out("legacy_off", memory._snapshot()["device_traces"])
        errors = []
        for kwargs in ({"enabled": "some"}, {"stacks": "cpp"}, {"context": "x"}, {"max_entries": 0},
                       {"skip_actions": ["allocate"]}, {"record_pinned_host_memory": True}):
            try:
                memory._record_memory_history(**kwargs)
            except (ValueError, RuntimeError) as exc:
                errors.append(str(exc).split(",")[0].split(":")[0 if "vramguard" not in str(exc) else 1].strip())
        out("errors", errors)
        out("pool", memory.memory_snapshot(mempool_id=(9, 9)))
        own = vramguard.start_recording()  # the program's own (a dry run's) serves, and is not stopped
        memory._record_memory_history()
        e = torch.empty(6 * MiB, dtype=torch.uint8, device="cuda")
        out("own", actions())
        memory._record_memory_history(enabled=None)
        trace = vramguard.stop_recording() if own._running else None
        # its trace: what it recorded, after the blocks live as it began (a and d), seeded
        out("own_running", trace is not None and (len(trace) - trace.meta["seeded_allocations"],
                                                   trace.meta["seeded_allocations"]) == (1, 2))
    """)
    MiB = 1 << 20
    assert v["state"] == ([[]], [True])
    assert v["skip"] == [("alloc", 2 * MiB), ("free_completed", 2 * MiB)]
    assert v["last_two"] == [("free_requested", 3 * MiB), ("free_completed", 3 * MiB)]
    assert v["no_frames"] is True
    assert v["legacy"] == [("alloc", 4 * MiB)]
    assert v["legacy_off"] == [[]]
    assert v["errors"] == ["enabled must be None", "stacks must be 'python' or 'all'", "context must be None",
                           "max_entries must be an int >= 1", "skip_actions", "record_pinned_host_memory=True"]
    assert v["pool"] == []
    assert v["own"] == [("alloc", 6 * MiB)] and v["own_running"] is True
