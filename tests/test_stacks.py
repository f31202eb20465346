"""Which line holds the memory: stacks recorded on the simulated device,
kept from PyTorch snapshots, saved in vgtrace files (and refused there when
malformed), named for people, and summed by line."""
import json
import pickle
import struct
import sys
import zlib

import pytest

import vramguard
from vramguard import Heap, StackTable, Trace, TraceFormatError, format_frame, load_trace, record, replay, save_trace
from vramguard import _core
from vramguard.trace.stacks import group_by_line, heap_by_line
from vramguard.trace.format import _HEADER, NO_STACK

MiB = 1 << 20
HERE = __file__


def line_here():
    """The line number of the caller's current line."""
    return sys._getframe(1).f_lineno


def make_two(heap):
    a = heap.malloc(MiB); line_a = line_here()
    b = heap.malloc(3 * MiB); line_b = line_here()
    return (a, line_a), (b, line_b)


# ------------------------------------------------------------ recording


def test_a_recording_with_stacks_names_the_allocating_lines_exactly():
    heap = Heap(1 << 30)
    with record(heap, stacks=True) as rec:
        ((a, line_a), (b, line_b)), call = make_two(heap), line_here()
        c = heap.malloc(5 * MiB); line_c = line_here()
        heap.free(a)
    t = rec.trace
    allocs = [op for op in range(len(t)) if t.kinds[op] == 1]
    assert [t.frames_of(op)[0] for op in allocs] == [
        (HERE, line_a, "make_two"), (HERE, line_b, "make_two"),
        (HERE, line_c, "test_a_recording_with_stacks_names_the_allocating_lines_exactly")]
    # the caller's line is the next frame of user code
    assert t.frames_of(allocs[0])[1] == (HERE, call, "test_a_recording_with_stacks_names_the_allocating_lines_exactly")
    assert t.site_of(allocs[1]) == f"test_stacks.py:{line_b} make_two"
    assert t.site_of(next(op for op in range(len(t)) if t.kinds[op] == 2)) is None  # a free has none
    assert t.meta["stacks_not_kept"] == 0
    heap.free(b), heap.free(c)


def test_stack_depth_bounds_the_frames_kept_and_vramguard_frames_are_skipped():
    heap = Heap(1 << 30)
    with record(heap, stacks=True, stack_depth=1) as rec:
        (a, line_a), (b, _) = make_two(heap)
    assert rec.trace.frames_of(0) == [(HERE, line_a, "make_two")]
    with pytest.raises(ValueError, match="stack_depth must be from 1 to 8 frames, got 9"):
        record(heap, stacks=True, stack_depth=9).start()
    assert not heap.history_take()[0]  # the refused start left the ring off
    heap.free(a), heap.free(b)


def test_a_recording_without_stacks_has_none():
    heap = Heap(1 << 30)
    with record(heap) as rec:
        heap.free(heap.malloc(MiB))
    assert not rec.trace.has_stacks and rec.trace.site_of(0) is None and rec.trace.frames_of(0) == []


def churn(heap, n):
    for _ in range(n):
        heap.free(heap.malloc(MiB))


def test_a_steady_loop_interns_its_stacks_once():
    heap = Heap(1 << 30)
    with record(heap, stacks=True) as rec:
        for n in (3, 1000):
            churn(heap, n)
            if n == 3:
                frames, stacks, _ = _core.stacks_table()
        assert _core.stacks_table()[:2] == (frames, stacks)  # no new frame, no new stack
    t = rec.trace
    assert t.counts()["alloc"] == 1003 and len(t.stacks) == 1


def test_live_blocks_are_summed_by_line_while_recording():
    heap = Heap(1 << 30)
    with record(heap, stacks=True) as rec:
        blocks = [heap.malloc(2 * MiB) for _ in range(3)]; line_a = line_here()
        big = heap.malloc(10 * MiB); line_b = line_here()
        heap.free(blocks.pop())
        assert heap_by_line(heap) == [(f"test_stacks.py:{line_b} test_live_blocks_are_summed_by_line_while_recording",
                                       10 * MiB, 1),
                                      (f"test_stacks.py:{line_a} <listcomp>" if sys.version_info < (3, 12)
                                       else f"test_stacks.py:{line_a} test_live_blocks_are_summed_by_line_while_recording",
                                       4 * MiB, 2)]
        assert heap_by_line(heap, top=1)[0][1] == 10 * MiB
    unrecorded = heap.malloc(MiB)  # no stack: left out
    assert sum(b for _, b, _ in heap_by_line(heap)) == 14 * MiB
    for p in blocks + [big, unrecorded]:
        heap.free(p)
    assert rec.trace.counts()["alloc"] == 4


def test_with_the_gil_the_frames_at_the_allocation_win_over_a_stack_set_aside():
    """A torch op sets its stack aside and allocates without the GIL
    (test_stacks_safety.py); an allocation made with the GIL (a Python
    callback inside an op) is named by its own frames. stacks_push and
    stacks_pop nest."""
    heap = Heap(1 << 30)
    with record(heap, stacks=True) as rec:
        before = _core.stacks_push()
        inner = _core.stacks_push()
        _core.stacks_pop(inner)
        p = heap.malloc(MiB); line = line_here()
        _core.stacks_pop(before)
    assert before == 0 and inner != 0
    assert rec.trace.frames_of(0)[0] == (HERE, line, "test_with_the_gil_the_frames_at_the_allocation_win_over_a_stack_set_aside")
    heap.free(p)


# ------------------------------------------------------------ names


@pytest.mark.parametrize("frame, text", [
    (("/content/train.py", 82, "step"), "train.py:82 step"),
    (("/content/train.py", 3, "<module>"), "train.py:3"),
    (("C:\\work\\train.py", 7, "f"), "train.py:7 f"),
    (("<ipython-input-3-5e5f2a8c9d1b>", 5, "step"), "cell [3], line 5 in step"),
    (("<ipython-input-12-ab>", 1, "<module>"), "cell [12], line 1"),
    (("/tmp/ipykernel_4242/2612345678.py", 5, "step"), "notebook cell, line 5 in step"),
    (("/tmp/ipykernel_4242/2612345678.py", 2, "<module>"), "notebook cell, line 2"),
])
def test_frames_are_named_as_people_find_them(frame, text):
    assert format_frame(*frame) == text


def test_by_line_groups_by_the_innermost_frame():
    table = StackTable()
    s1 = table.stack([table.frame("a.py", 1, "f"), table.frame("a.py", 9, "g")])
    s2 = table.stack([table.frame("a.py", 1, "f"), table.frame("a.py", 10, "h")])
    s3 = table.stack([table.frame("b.py", 2, "k")])
    assert group_by_line([(5, s1), (7, s2), (3, s3), (100, None)], table, 5) == [
        ("a.py:1 f", 12, 2), ("b.py:2 k", 3, 1)]


def test_by_line_sums_a_label_once_across_stacks_and_folders():
    """Blocks are summed by stack, then by line: two folders' train.py:5 f
    are one label, as a person reads them."""
    table = StackTable()
    here = table.frame("/a/train.py", 5, "f")
    there = table.frame("/b/train.py", 5, "f")
    other = table.frame("/a/model.py", 9, "g")
    stacks = [table.stack([here]), table.stack([here, other]), table.stack([there]), table.stack([other])]
    items = [(1 << i, stacks[i % 4]) for i in range(12)]
    assert group_by_line(items, table, 5) == [
        ("model.py:9 g", (1 << 3) + (1 << 7) + (1 << 11), 3),
        ("train.py:5 f", sum(1 << i for i in range(12) if i % 4 != 3), 9)]
    assert group_by_line(items, table, 1) == [("model.py:9 g", 2184, 3)]


# ------------------------------------------------------------ snapshots


def frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


TORCH = frame("/usr/lib/python3/site-packages/torch/nn/modules/linear.py", 125, "forward")


def snapshot_with_frames(tmp_path):
    events = [
        {"action": "segment_alloc", "addr": 0x10000000, "size": 20 * MiB, "stream": 0},
        {"action": "alloc", "addr": 0x10000000, "size": 2 * MiB, "stream": 0,
         "frames": [TORCH, frame("/content/train.py", 82, "step"), frame("/content/train.py", 120, "<module>")]},
        {"action": "alloc", "addr": 0x10200000, "size": 6 * MiB, "stream": 0,
         "frames": [frame("/content/train.py", 82, "step"), frame("/content/train.py", 121, "<module>")]},
        {"action": "free_completed", "addr": 0x10000000, "size": 2 * MiB, "stream": 0},
        {"action": "alloc", "addr": 0x10000000, "size": 2 * MiB, "stream": 0, "frames": []},
    ]
    segments = [{"device": 0, "address": 0x20000000, "total_size": 2 * MiB, "stream": 0, "blocks": [
        {"address": 0x20000000, "size": 2 * MiB, "requested_size": MiB, "state": "active_allocated",
         "frames": [frame("/content/model.py", 12, "__init__")]}]}]
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": segments, "device_traces": [events]}))
    return path


def test_a_snapshots_frames_are_kept_interned(tmp_path):
    t = load_trace(snapshot_with_frames(tmp_path))
    # the block live at dump time is seeded first, with its own frames
    assert t.frames_of(0) == [("/content/model.py", 12, "__init__")]
    assert t.frames_of(1) == [("/content/train.py", 82, "step"), ("/content/train.py", 120, "<module>")]
    assert t.frames_of(2) == [("/content/train.py", 82, "step"), ("/content/train.py", 121, "<module>")]
    assert t.frames_of(4) == []  # an empty list of frames
    assert [t.site_of(op) for op in range(5)] == ["model.py:12 __init__", "train.py:82 step",
                                                  "train.py:82 step", None, None]
    # four frames, each once; three stacks
    assert len(t.stacks.frames) == 4 and len(t.stacks) == 3


def test_replay_names_the_holders_at_the_peak_and_at_the_first_oom(tmp_path):
    t = load_trace(snapshot_with_frames(tmp_path))
    fits = replay(t)
    assert fits.fits and fits.peak_at.by_line == ((8 * MiB, 2, "train.py:82 step"), (MiB, 1, "model.py:12 __init__"))
    assert fits.holders == "live at the peak: 9.00 MiB, of which 8.00 MiB from train.py:82 step"
    short = replay(t, budget="6MiB")
    assert not short.fits and short.by_line == ((2 * MiB, 1, "train.py:82 step"), (MiB, 1, "model.py:12 __init__"))
    assert "live at the first OOM: 3.00 MiB, of which 2.00 MiB from train.py:82 step" in repr(short)


# ------------------------------------------------------------ vgtrace


def test_stacks_survive_a_saved_trace(tmp_path):
    heap = Heap(1 << 30)
    with record(heap, stacks=True) as rec:
        (a, _), (b, _) = make_two(heap)
    t = rec.trace
    t.alloc(MiB, frames=[("/content/x.py", 4, "f")])
    save_trace(t, tmp_path / "r.vgtrace.gz")
    again = load_trace(tmp_path / "r.vgtrace.gz")
    assert [again.frames_of(op) for op in range(len(again))] == [t.frames_of(op) for op in range(len(t))]
    assert list(again.op_stacks) == list(t.op_stacks) and again.columns() == t.columns()
    assert again.site_of(2) == "x.py:4 f"
    heap.free(a), heap.free(b)


def test_trace_alloc_refuses_malformed_frames_and_writes_nothing():
    t = Trace()
    for frames in ([], [("a.py", -1, "f")], [("a.py", 1)], [("a.py", "1", "f")], [("a.py", 1, "f")] * 9,
                   [("a" * 5000, 1, "f")]):
        with pytest.raises(ValueError):
            t.alloc(MiB, frames=frames)
    assert len(t) == 0 and t.nids == 0


def rewrite(path, meta=None, stack_column=None, flags=None):
    """A copy of a saved vgtrace file with its metadata, stack column or
    flags replaced, the header's length and checksum made right again."""
    data = path.read_bytes()
    magic, version, old_flags, meta_len, n, nids, _ = _HEADER.unpack_from(data)
    body = data[_HEADER.size:]
    old_meta, columns = body[:meta_len], body[meta_len:]
    new_meta = json.dumps(meta).encode() if meta is not None else old_meta
    if stack_column is not None:
        columns = columns[:-4 * n] + struct.pack(f"<{n}I", *stack_column)
    body = new_meta + columns
    header = _HEADER.pack(magic, version, old_flags if flags is None else flags, len(new_meta), n, nids,
                          zlib.crc32(body))
    out = path.with_name("bad-" + path.name)
    out.write_bytes(header + body)
    return out


@pytest.fixture
def saved(tmp_path):
    t = Trace("t")
    a = t.alloc(MiB, frames=[("/c/a.py", 1, "f"), ("/c/a.py", 9, "g")])
    t.alloc(2 * MiB, frames=[("/c/b.py", 2, "h")])
    t.free(a)
    path = tmp_path / "t.vgtrace"
    save_trace(t, path)
    return path, json.loads(path.read_bytes()[_HEADER.size:_HEADER.size + _HEADER.unpack_from(path.read_bytes())[3]])


@pytest.mark.parametrize("change, message", [
    (lambda m: m["stack_table"]["frames"].__setitem__(0, ["/c/a.py", -3, "f"]),
     r"bad metadata: stack_table.frames\[0\]: a frame is \(filename, line, function\)"),
    (lambda m: m["stack_table"]["frames"].__setitem__(0, "a.py:1"),
     r"bad metadata: stack_table.frames\[0\] must be a \[filename, line, function\] list"),
    (lambda m: m["stack_table"]["frames"].__setitem__(0, ["x" * 5000, 1, "f"]),
     r"stack_table.frames\[0\]: a frame is"),
    (lambda m: m["stack_table"]["stacks"].__setitem__(0, [0, 7]),
     r"stack_table.stacks\[0\] must list 1 to 8 indices of frames \(0 to 2\)"),
    (lambda m: m["stack_table"]["stacks"].__setitem__(0, []), r"stack_table.stacks\[0\] must list"),
    (lambda m: m["stack_table"]["stacks"].__setitem__(0, [0] * 9), r"stack_table.stacks\[0\] must list"),
    (lambda m: m["stack_table"]["stacks"].append([2]), r"repeats a frame or a stack"),
    (lambda m: m.pop("stack_table"), r"'stack_table' must be an object with 'frames' and 'stacks' lists"),
    (lambda m: m.__setitem__("stack_table", {"frames": {}, "stacks": []}), r"'stack_table' must be an object"),
])
def test_a_malformed_stack_table_is_one_clear_error(saved, change, message):
    path, meta = saved
    change(meta)
    with pytest.raises(TraceFormatError, match=message):
        load_trace(rewrite(path, meta=meta))


def test_a_stack_column_out_of_the_table_or_on_a_free_is_refused(saved):
    path, _ = saved
    with pytest.raises(TraceFormatError, match=r"op 1: stack 2 is not in the stack table \(2 stacks\)"):
        load_trace(rewrite(path, stack_column=[0, 2, NO_STACK]))
    with pytest.raises(TraceFormatError, match=r"op 2: stack 0 .* or the op is not an allocation"):
        load_trace(rewrite(path, stack_column=[0, 1, 0]))
    assert load_trace(rewrite(path, stack_column=[NO_STACK, 1, NO_STACK])).site_of(0) is None


def test_a_stack_table_without_its_flag_is_refused(saved):
    path, meta = saved
    data = path.read_bytes()
    n = _HEADER.unpack_from(data)[4]
    meta_len = _HEADER.unpack_from(data)[3]
    # the flag cleared and the column dropped: the table alone is refused
    body = data[_HEADER.size:-4 * n]
    header = _HEADER.pack(b"VGTRACE\x00", 1, 0, meta_len, n, 2, zlib.crc32(body))
    (path.parent / "noflag.vgtrace").write_bytes(header + body)
    with pytest.raises(TraceFormatError, match="'stack_table' present but the stack column flag is not set"):
        load_trace(path.parent / "noflag.vgtrace")


def test_a_hostile_stack_table_costs_what_its_file_holds(tmp_path):
    """A table far larger than its ops is read at the cost of its bytes,
    and every entry checked: 100,000 frames in a small file."""
    t = Trace("t")
    t.alloc(MiB, frames=[("/c/a.py", 1, "f")])
    path = tmp_path / "t.vgtrace"
    save_trace(t, path)
    meta = {"name": "t", "stack_table": {"frames": [["a.py", i, "f"] for i in range(100_000)],
                                         "stacks": [[0]] + [[i] for i in range(1, 100_000)]}}
    loaded = load_trace(rewrite(path, meta=meta))
    assert len(loaded.stacks) == 100_000 and loaded.site_of(0) == "a.py:0 f"
    meta["stack_table"]["stacks"][-1] = [100_000]
    with pytest.raises(TraceFormatError, match=r"stack_table.stacks\[99999\] must list"):
        load_trace(rewrite(path, meta=meta))


def test_the_summary_line_names_the_holders_at_the_recordings_peak():
    from vramguard.report.summary import holders_line

    heap = Heap(1 << 30)
    assert holders_line(heap) is None
    with record(heap, stacks=True):
        (a, _), (b, line_b) = make_two(heap)
        assert holders_line(heap) == f"live now: 4.00 MiB, of which 3.00 MiB from test_stacks.py:{line_b} make_two"
        heap.free(b)
    assert holders_line(heap) == (f"live at the peak of the last recording: 4.00 MiB, of which 3.00 MiB "
                                  f"from test_stacks.py:{line_b} make_two")
    heap.free(a)


def test_a_snapshot_of_a_recording_with_stacks_carries_its_frames_and_reads_back(tmp_path):
    heap = Heap(1 << 30)
    with record(heap, stacks=True) as rec:
        (a, line_a), (b, line_b) = make_two(heap)
    snap = vramguard.snapshot(heap=heap, recording=rec)
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert [e["frames"][0] for e in allocs] == [{"filename": HERE, "line": line_a, "name": "make_two"},
                                                {"filename": HERE, "line": line_b, "name": "make_two"}]
    blocks = [blk for seg in snap["segments"] for blk in seg["blocks"] if blk["state"] == "active_allocated"]
    assert sorted(blk["frames"][0]["line"] for blk in blocks) == [line_a, line_b]
    vramguard.dump_snapshot(tmp_path / "s.pickle", heap=heap, recording=rec)
    back = load_trace(tmp_path / "s.pickle")
    assert [back.site_of(op) for op in range(len(back))] == [
        f"test_stacks.py:{line_a} make_two", f"test_stacks.py:{line_b} make_two"]
    heap.free(a), heap.free(b)


# ------------------------------------------------------------ stack_depth


def test_a_nested_recording_at_another_depth_is_refused_and_the_outer_keeps_its_own():
    outer_heap, inner_heap = Heap(1 << 30), Heap(1 << 30)
    with record(outer_heap, stacks=True, stack_depth=2) as outer:
        with pytest.raises(ValueError, match="stack_depth=2 is running; this one asks for stack_depth=1"):
            record(inner_heap, stacks=True, stack_depth=1).start()
        assert not inner_heap.history_take()[0]  # refused before its ring started
        with record(inner_heap, stacks=True, stack_depth=2):  # the same depth runs alongside
            pass
        (a, line_a), _ = make_two(outer_heap); call = line_here()
    frames = outer.trace.frames_of(0)
    assert len(frames) == 2 and frames[0] == (HERE, line_a, "make_two") and frames[1][1] == call
    # once the outer one stops, another depth is free to run
    with record(inner_heap, stacks=True, stack_depth=1):
        pass


@pytest.mark.parametrize("depth, error, said", [
    (True, TypeError, "stack_depth must be an int"),
    (2.0, TypeError, "stack_depth must be an int"),
])
def test_a_depth_that_is_not_an_int_is_refused(depth, error, said):
    with pytest.raises(error, match=said):
        record(Heap(1 << 30), stacks=True, stack_depth=depth)


def test_stack_depth_without_stacks_is_refused():
    with pytest.raises(ValueError, match="stack_depth=3 is only used with stacks=True"):
        record(Heap(1 << 30), stack_depth=3)
    with pytest.raises(ValueError, match="only used with stacks=True"):
        vramguard.start_recording(Heap(1 << 30), stack_depth=3)


def test_a_trace_dumped_keeps_its_stacks_in_frames(tmp_path):
    heap = Heap(1 << 30)
    with record(heap, stacks=True) as rec:
        (a, line_a), (b, line_b) = make_two(heap)
    from vramguard import dump_snapshot

    dump_snapshot(tmp_path / "t.pickle", trace=rec.trace)
    snap = pickle.loads((tmp_path / "t.pickle").read_bytes())
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert [e["frames"][0] for e in allocs] == [
        {"filename": HERE, "line": line_a, "name": "make_two"},
        {"filename": HERE, "line": line_b, "name": "make_two"}]
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sorted(b["frames"][0]["line"] for b in live) == [line_a, line_b]
    back = load_trace(tmp_path / "t.pickle")
    assert [back.frames_of(op)[0][1:] for op in range(len(back)) if back.kinds[op] == 1] == [
        (line_a, "make_two"), (line_b, "make_two")]
    heap.free(a), heap.free(b)
