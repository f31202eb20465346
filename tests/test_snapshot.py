"""vramguard.dump_snapshot on the simulated device: PyTorch's snapshot
format (segments with blocks, device_traces with PyTorch's action names),
read back by vramguard's own reader, written whole or not at all. PyTorch's
own reader reads the same files in tests/torch/test_snapshot_torch.py."""
import os
import pickle

import pytest

import vramguard
from vramguard import Heap, dump_snapshot, load_trace, record, snapshot
from vramguard.trace.format import ALLOC, FREE

MiB = 1 << 20
BASE = 1 << 40  # the simulated device's first address


def actions(snap, device=0):
    return [e["action"] for e in snap["device_traces"][device]]


def small_run():
    """1000 B and 3 MiB allocated, the 1000 B freed, then empty_cache():
    the small segment goes back, the 6 MiB large one stays."""
    heap = Heap("1GiB", policy="segments")
    with record(heap) as rec:
        a = heap.malloc(1000)
        heap.malloc(3 * MiB)
        heap.free(a)
        heap.empty_cache()
    return heap, rec


def test_heap_and_recording_in_pytorchs_layout():
    heap, rec = small_run()
    snap = snapshot(heap=heap, recording=rec)
    assert set(snap) == {"segments", "device_traces", "allocator_settings", "external_annotations"}
    assert actions(snap) == ["segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested",
                             "free_completed", "segment_free"]
    events = snap["device_traces"][0]
    assert [(e["addr"], e["size"]) for e in events] == [
        (BASE, 2 * MiB), (BASE, 1000), (BASE + 2 * MiB, 6 * MiB), (BASE + 2 * MiB, 3 * MiB),
        (BASE, 1000), (BASE, 1000), (BASE, 2 * MiB)]
    assert all(set(e) == {"action", "addr", "size", "stream", "time_us", "frames"} for e in events)
    assert all(e["frames"] == [] and e["stream"] == 0 for e in events)
    times = [e["time_us"] for e in events]
    assert times == sorted(times)
    [seg] = snap["segments"]
    assert seg == {
        "device": 0, "address": BASE + 2 * MiB, "total_size": 6 * MiB, "allocated_size": 3 * MiB,
        "active_size": 3 * MiB, "requested_size": 3 * MiB, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
        "blocks": [
            {"address": BASE + 2 * MiB, "size": 3 * MiB, "requested_size": 3 * MiB,
             "state": "active_allocated", "frames": []},
            {"address": BASE + 5 * MiB, "size": 3 * MiB, "requested_size": 0, "state": "inactive",
             "frames": []},
        ],
    }
    assert snap["allocator_settings"]["allocator"] == "vramguard"


def test_round_trip_through_load_trace(tmp_path):
    heap, rec = small_run()
    path = tmp_path / "memory.pickle"
    assert dump_snapshot(path, heap=heap, recording=rec) is None
    back = load_trace(path)
    assert list(back.kinds) == list(rec.trace.kinds) == [ALLOC, ALLOC, FREE, 3]
    assert list(back.sizes) == list(rec.trace.sizes) == [1000, 3 * MiB, 0, 0]
    assert back.peak_live() == rec.trace.peak_live() == 1000 + 3 * MiB
    assert back.meta["recorded_peak_reserved_bytes"] == 8 * MiB
    assert back.meta["event_label"] == "snapshot event"


def test_pending_free_block_and_segment_sums():
    heap = Heap("1GiB", policy="segments")
    a = heap.malloc(1000)
    heap.malloc(5000)
    heap.record_stream(a, 7)
    heap.free(a)  # stream 7 may still use it
    [seg] = snapshot(heap=heap)["segments"]
    assert [(b["state"], b["size"], b["requested_size"]) for b in seg["blocks"]] == [
        ("active_pending_free", 1024, 1000), ("active_allocated", 5120, 5000),
        ("inactive", 2 * MiB - 6144, 0)]
    assert (seg["allocated_size"], seg["active_size"], seg["requested_size"]) == (5120, 6144, 5000)
    assert seg["segment_type"] == "small"


def test_oom_event_carries_device_free_instead_of_addr():
    heap = Heap("1GiB", budget="8MiB", policy="segments")
    with record(heap) as rec:
        heap.malloc(3 * MiB)  # a 6 MiB segment
        with pytest.raises(MemoryError):
            heap.malloc(20 * MiB)
    snap = snapshot(heap=heap, recording=rec)
    [oom] = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
    assert "addr" not in oom
    assert (oom["size"], oom["device_free"]) == (20 * MiB, 2 * MiB)


def test_running_recording_is_dumped_and_stop_still_gets_every_event(tmp_path):
    heap = Heap("1GiB", policy="segments")
    vramguard.start_recording(heap)
    a = heap.malloc(1000)
    dump_snapshot(tmp_path / "mid.pickle", heap=heap)
    heap.free(a)
    dump_snapshot(tmp_path / "end.pickle", heap=heap)
    trace = vramguard.stop_recording(heap)
    mid = pickle.loads((tmp_path / "mid.pickle").read_bytes())
    end = pickle.loads((tmp_path / "end.pickle").read_bytes())
    assert actions(mid) == ["segment_alloc", "alloc"]
    assert actions(end) == ["segment_alloc", "alloc", "free_requested", "free_completed"]
    assert list(trace.kinds) == [ALLOC, FREE] and list(trace.sizes) == [1000, 0]
    # a block live at the mid dump, from the recorded alloc: not seeded again
    assert list(load_trace(tmp_path / "mid.pickle").kinds) == [ALLOC]


def test_no_recording_gives_segments_and_empty_traces():
    heap = Heap("1GiB", policy="segments")
    heap.malloc(1000)
    snap = snapshot(heap=heap, device=2)
    assert snap["device_traces"] == [[], [], []]
    assert [s["device"] for s in snap["segments"]] == [2]


def test_trace_dump_round_trips_ops_sizes_and_peak(tmp_path):
    trace = vramguard.example_trace()
    path = tmp_path / "example.pickle"
    dump_snapshot(path, trace=trace)
    back = load_trace(path)
    assert list(back.kinds) == list(trace.kinds)
    assert list(back.sizes) == list(trace.sizes)
    assert list(back.streams) == list(trace.streams)
    assert back.peak_live() == trace.peak_live() == 14_951_404_548
    snap = pickle.loads(path.read_bytes())
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    counts = trace.counts()
    assert len(live) == counts["alloc"] - counts["free"] == 584  # live at the trace's end stays live
    assert actions(snap).count("alloc") == 1238


def test_empty_cache_that_releases_a_segment_round_trips():
    trace = vramguard.Trace()
    trace.alloc(1000)               # keeps the small segment
    big = trace.alloc(3 * MiB)
    trace.free(big)
    trace.empty_cache()             # releases the large one: a segment_free
    trace.alloc(2000)               # from the small segment: no new one
    snap = snapshot(trace=trace)
    assert actions(snap)[-2:] == ["segment_free", "alloc"]
    back = vramguard.trace.importer.trace_from_snapshot(snap)
    assert list(back.kinds) == list(trace.kinds)
    assert list(back.sizes) == list(trace.sizes)


def test_what_pytorchs_format_cannot_say():
    """PyTorch's traces have no empty_cache action, only the segment_free
    events it causes: one that released nothing leaves no trace, and one
    whose release a new segment follows reads as PyTorch's own
    release-and-retry. Allocations, frees and the peak come back the same."""
    trace = vramguard.Trace()
    a = trace.alloc(1000)
    trace.empty_cache()             # releases nothing
    trace.free(a)
    trace.empty_cache()             # releases the small segment ...
    trace.alloc(5000)               # ... and this needs a new one
    back = vramguard.trace.importer.trace_from_snapshot(snapshot(trace=trace))
    assert list(back.kinds) == [ALLOC, FREE, ALLOC]
    assert list(back.sizes) == [1000, 0, 5000]
    assert back.peak_live() == trace.peak_live() == 5000


def test_write_is_atomic(tmp_path, monkeypatch):
    heap, rec = small_run()
    path = tmp_path / "memory.pickle"
    path.write_bytes(b"the previous snapshot")

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        dump_snapshot(path, heap=heap, recording=rec)
    assert path.read_bytes() == b"the previous snapshot"
    assert sorted(os.listdir(tmp_path)) == ["memory.pickle"]  # no temporary file left


def test_unwritable_place_leaves_nothing(tmp_path):
    heap, rec = small_run()
    with pytest.raises(FileNotFoundError):
        dump_snapshot(tmp_path / "missing" / "memory.pickle", heap=heap, recording=rec)
    assert os.listdir(tmp_path) == []


def test_bad_arguments():
    heap = Heap("1GiB", policy="segments")
    with pytest.raises(ValueError, match="not both"):
        snapshot(heap=heap, trace=vramguard.example_trace())
    with pytest.raises(ValueError, match="device index"):
        snapshot(heap=heap, device=-1)
    with pytest.raises(ValueError, match="device index"):
        snapshot(heap=heap, device="cuda:0")


def test_a_recording_alone_names_its_heap():
    heap, rec = small_run()
    assert snapshot(recording=rec) == snapshot(heap=heap, recording=rec)
    with pytest.raises(ValueError, match="never started"):
        snapshot(recording=record())


def test_installed_allocator_needed_without_a_heap(tmp_path):
    if vramguard.is_installed():
        pytest.skip("the allocator is installed in this process")
    with pytest.raises(vramguard.VramguardError, match="install"):
        dump_snapshot(tmp_path / "memory.pickle")
    assert not (tmp_path / "memory.pickle").exists()


def test_frames_plug_in_per_event_and_reach_the_blocks():
    """Where a recording's stacks come in: frames_of(event) per event; a
    live block gets its allocation's frames; vramguard's reader names the line."""
    from vramguard.trace import snapshot as _snapshot
    from vramguard.trace.record import EV_ALLOC

    heap = Heap("1GiB", policy="segments")
    with record(heap) as rec:
        heap.malloc(1000)
        heap.free(heap.malloc(5000))
    data, _ = rec.events()

    def frames_of(event):
        if event[5] != EV_ALLOC:
            return []
        return [{"filename": "/content/train.py", "line": event[3], "name": "step"}]

    entries = _snapshot.trace_entries(data, frames_of=frames_of)
    segments = _snapshot.segment_entries(heap.segments(), 0, _snapshot._alloc_frames(entries))
    blocks = segments[0]["blocks"]
    assert [b["frames"] for b in blocks] == [
        [{"filename": "/content/train.py", "line": 1000, "name": "step"}], []]  # the freed one merged
    back = vramguard.trace.importer.trace_from_snapshot({"segments": segments, "device_traces": [entries]})
    assert [back.site_of(op) for op in range(len(back))] == ["train.py:1000 step", "train.py:5000 step", None]


@pytest.mark.parametrize("where", ["dir", "dir/", "."])
def test_a_directory_path_is_one_error_naming_it(tmp_path, monkeypatch, where):
    heap, rec = small_run()
    (tmp_path / "dir").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(IsADirectoryError, match=f"is a directory.*'{where}'"):
        dump_snapshot(where, heap=heap, recording=rec)
    assert sorted(os.listdir(tmp_path)) == ["dir"] and os.listdir(tmp_path / "dir") == []


def test_an_empty_path_is_refused_and_writes_nothing(tmp_path, monkeypatch):
    heap, rec = small_run()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(IsADirectoryError, match="''"):
        dump_snapshot("", heap=heap, recording=rec)
    assert os.listdir(tmp_path) == []


def test_a_missing_directory_is_named_by_the_path_not_the_temporary_file(tmp_path):
    heap, rec = small_run()
    path = tmp_path / "missing" / "memory.pickle"
    with pytest.raises(FileNotFoundError) as caught:
        dump_snapshot(path, heap=heap, recording=rec)
    assert caught.value.filename == str(path)


def test_a_replaced_file_keeps_its_permission_bits(tmp_path):
    heap, rec = small_run()
    path = tmp_path / "memory.pickle"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    dump_snapshot(path, heap=heap, recording=rec)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert actions(pickle.loads(path.read_bytes()))[0] == "segment_alloc"


def test_a_symlink_has_its_target_written(tmp_path):
    heap, rec = small_run()
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "memory.pickle"
    target.write_bytes(b"old")
    link = tmp_path / "link.pickle"
    link.symlink_to(target)
    dump_snapshot(link, heap=heap, recording=rec)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert pickle.loads(target.read_bytes())["device_traces"][0][0]["action"] == "segment_alloc"
    assert sorted(os.listdir(tmp_path / "real")) == ["memory.pickle"]


def test_the_temporary_file_is_synced_before_the_rename(tmp_path, monkeypatch):
    heap, rec = small_run()
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    dump_snapshot(tmp_path / "memory.pickle", heap=heap, recording=rec)
    assert calls == ["fsync", "replace"]


@pytest.mark.parametrize("kwargs, named", [
    ({"heap": "no"}, "heap must be a vramguard.Heap"),
    ({"recording": 5}, "recording must be a vramguard.record"),
    ({"trace": 3}, "trace must be a vramguard.Trace"),
])
def test_arguments_of_the_wrong_type_are_named(tmp_path, kwargs, named):
    with pytest.raises(TypeError, match=named):
        dump_snapshot(tmp_path / "memory.pickle", **kwargs)
    with pytest.raises(TypeError, match=named):
        snapshot(**kwargs)
    assert os.listdir(tmp_path) == []


def test_a_recording_of_another_heap_is_refused():
    _heap_b, rec_b = small_run()
    with pytest.raises(ValueError, match="another heap"):
        snapshot(heap=Heap("1GiB"), recording=rec_b)


def test_a_running_with_record_counts_as_the_heaps_recording(tmp_path):
    heap = Heap("1GiB", policy="segments")  # a segment_alloc, as PyTorch's default writes
    with record(heap) as rec:
        a = heap.malloc(1000)
        assert actions(snapshot(heap=heap)) == ["segment_alloc", "alloc"]
        dump_snapshot(tmp_path / "mid.pickle", heap=heap)
        heap.free(a)
    assert actions(pickle.loads((tmp_path / "mid.pickle").read_bytes())) == ["segment_alloc", "alloc"]
    assert list(rec.trace.kinds) == [ALLOC, FREE]  # the dumps took nothing from the trace
    assert snapshot(heap=heap)["device_traces"] == [[]]  # stopped: no longer the heap's


def test_an_overflowed_recording_warns_and_its_dump_says_so(tmp_path):
    heap = Heap("1GiB")
    rec = record(heap, capacity=4).start()
    for _ in range(5):
        heap.free(heap.malloc(1000))  # 11 events: a segment's, then 5 allocs and 5 frees
    dump_snapshot(tmp_path / "memory.pickle", heap=heap)
    with pytest.warns(RuntimeWarning, match=r"dropped its 7 oldest events.*capacity=4"):
        trace = rec.stop()
    assert trace.meta["dropped_events"] == 7
    snap = pickle.loads((tmp_path / "memory.pickle").read_bytes())
    assert snap["vramguard_dropped_events"] == [7]
    assert load_trace(tmp_path / "memory.pickle").meta["dropped_events"] == 7
    dump_snapshot(tmp_path / "trace.pickle", trace=trace)
    assert load_trace(tmp_path / "trace.pickle").meta["dropped_events"] == 7


def test_a_full_recording_writes_no_drop_key_and_reads_back_zero(tmp_path):
    heap, rec = small_run()
    dump_snapshot(tmp_path / "memory.pickle", heap=heap, recording=rec)
    assert "vramguard_dropped_events" not in pickle.loads((tmp_path / "memory.pickle").read_bytes())
    assert load_trace(tmp_path / "memory.pickle").meta["dropped_events"] == 0


@pytest.mark.parametrize("value, said", [
    ("7", "vramguard_dropped_events: must be a list"),
    (["7"], r"vramguard_dropped_events\[0\]: 'count' must be an int"),
    ([-1], r"vramguard_dropped_events\[0\]: 'count' must be an int"),
])
def test_a_bad_dropped_count_is_one_clear_error(tmp_path, value, said):
    heap, rec = small_run()
    snap = snapshot(heap=heap, recording=rec)
    snap["vramguard_dropped_events"] = value
    (tmp_path / "bad.pickle").write_bytes(pickle.dumps(snap))
    with pytest.raises(vramguard.TraceFormatError, match=said):
        load_trace(tmp_path / "bad.pickle")


# ---------------------------------------------------------------- the arena


def test_arena_range_is_one_expandable_segment_per_mapped_run():
    """As PyTorch reports an expandable segment: one segment per contiguous
    mapped run of pages, total_size that run's bytes, free blocks cut to it."""
    heap = Heap("1GiB")  # the default: the arena
    a = heap.malloc(3 * MiB)           # pages 0, 1
    c = heap.malloc(5 * MiB)           # pages 1 to 3
    d = heap.malloc(4 * MiB)           # pages 4, 5
    heap.free(c)
    heap.empty_cache()                 # unmaps pages 2, 3 (page 1 is shared with a)
    (large,) = [s for s in heap.segments() if s["pool"] == "large"]
    assert large["mapped_runs"] == [(0, 4 * MiB), (8 * MiB, 4 * MiB)]
    segs = [s for s in snapshot(heap=heap)["segments"] if s["segment_type"] == "large"]
    base = large["address"]
    assert [(s["address"] - base, s["total_size"], s["is_expandable"]) for s in segs] == [
        (0, 4 * MiB, True), (8 * MiB, 4 * MiB, True)]
    assert [(b["address"] - base, b["size"], b["state"]) for b in segs[0]["blocks"]] == [
        (0, 3 * MiB, "active_allocated"), (3 * MiB, MiB, "inactive")]
    assert [(b["address"] - base, b["size"], b["state"]) for b in segs[1]["blocks"]] == [
        (8 * MiB, 4 * MiB, "active_allocated")]
    assert [(s["allocated_size"], s["requested_size"]) for s in segs] == [(3 * MiB, 3 * MiB), (4 * MiB, 4 * MiB)]
    heap.free(a)
    heap.free(d)


def test_segments_have_no_mapped_runs():
    heap = Heap("1GiB", policy="segments")
    heap.malloc(1000)
    (seg,) = heap.segments()
    assert seg["mapped_runs"] is None
    (entry,) = snapshot(heap=heap)["segments"]
    assert entry["is_expandable"] is False and entry["total_size"] == 2 * MiB


def test_arena_recording_has_its_maps_and_unmaps():
    """The arena's pages mapped and unmapped are recorded: the recording's
    reserved curve, and PyTorch's segment_map / segment_unmap actions."""
    heap = Heap("1GiB")
    with record(heap) as rec:
        a = heap.malloc(3 * MiB)       # maps pages 0, 1
        b = heap.malloc(5 * MiB)       # maps pages 2, 3 (page 1 is a's)
        heap.free(b)
        heap.empty_cache()             # unmaps pages 2, 3
        heap.free(a)
    assert rec.trace.meta["recorded_peak_reserved_bytes"] == 8 * MiB
    assert rec.trace.meta["recorded_reserved_start_bytes"] == 0
    snap = snapshot(heap=heap, recording=rec)
    events = [(e["action"], e.get("size")) for e in snap["device_traces"][0]]
    assert events == [("segment_map", 4 * MiB), ("alloc", 3 * MiB), ("segment_map", 4 * MiB),
                      ("alloc", 5 * MiB), ("free_requested", 5 * MiB), ("free_completed", 5 * MiB),
                      ("segment_unmap", 4 * MiB), ("free_requested", 3 * MiB), ("free_completed", 3 * MiB)]
    (large,) = [s for s in heap.segments() if s["pool"] == "large"]
    maps = [e["addr"] - large["address"] for e in snap["device_traces"][0] if e["action"].startswith("segment_")]
    assert maps == [0, 4 * MiB, 4 * MiB]
    assert rec.trace.counts()["alloc"] == 2
