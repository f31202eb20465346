"""Traces: building, the file format (round trip, every kind of corruption),
PyTorch snapshots and lifetime logs, recording, replay and min_budget."""
import gzip
import json
import pickle
import struct
import subprocess
import sys
import zlib

import pytest

import vramguard
from vramguard import Heap, Trace, TraceFormatError, load_trace, min_budget, replay, save_trace
from vramguard.trace.format import _HEADER
from sample_traces import small_trace

MiB = 1 << 20


# ---------------------------------------------------------------- building


def test_builder_and_peak_live():
    t = small_trace()
    assert len(t) == 8 and t.nids == 3
    assert t.peak_live() == 3 * MiB + 100 * MiB  # a was freed before c
    assert t.counts() == {"alloc": 3, "free": 3, "empty_cache": 1, "synchronize": 1}
    with pytest.raises(ValueError, match="not live"):
        t.free(0)
    with pytest.raises(ValueError, match="positive int"):
        t.alloc(0)


# ---------------------------------------------------------------- file format


@pytest.mark.parametrize("name", ["t.vgtrace", "t.vgtrace.gz"])
def test_round_trip(tmp_path, name):
    t = small_trace()
    t.meta["note"] = "hello"
    path = tmp_path / name
    save_trace(t, path)
    if name.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"
    u = load_trace(path)
    assert u.name == "small" and u.meta["note"] == "hello"
    assert u.columns() == t.columns() and u.nids == t.nids


def write(path, data):
    path.write_bytes(data)
    return path


def valid_bytes():
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.vgtrace")
        save_trace(small_trace(), p)
        return open(p, "rb").read()


def with_crc(data):
    """Re-seal a modified file so that only the intended fault remains."""
    magic, version, flags, meta_len, n, nids, _ = _HEADER.unpack_from(data)
    return _HEADER.pack(magic, version, flags, meta_len, n, nids, zlib.crc32(data[_HEADER.size:])) + data[_HEADER.size:]


def test_truncated_file_names_the_offset(tmp_path):
    data = valid_bytes()
    p = write(tmp_path / "cut.vgtrace", data[:-5])
    with pytest.raises(TraceFormatError, match=r"cut.vgtrace: offset \d+: truncated") as err:
        load_trace(p)
    assert err.value.offset == len(data) - 5
    with pytest.raises(TraceFormatError, match="truncated header"):
        load_trace(write(tmp_path / "hdr.vgtrace", data[:20]))


def test_flipped_byte_fails_the_checksum(tmp_path):
    data = bytearray(valid_bytes())
    data[-3] ^= 0xFF
    with pytest.raises(TraceFormatError, match="checksum mismatch"):
        load_trace(write(tmp_path / "flip.vgtrace", bytes(data)))


def test_bad_version_and_trailing_bytes(tmp_path):
    data = bytearray(valid_bytes())
    struct.pack_into("<H", data, 8, 99)
    with pytest.raises(TraceFormatError, match="version 99"):
        load_trace(write(tmp_path / "v.vgtrace", bytes(data)))
    with pytest.raises(TraceFormatError, match="unexpected bytes"):
        load_trace(write(tmp_path / "x.vgtrace", valid_bytes() + b"junk"))


def test_bad_metadata_and_bad_ops_with_a_valid_checksum(tmp_path):
    data = bytearray(valid_bytes())
    meta_len = _HEADER.unpack_from(data)[3]
    data[_HEADER.size] = ord("[")  # JSON that is not an object, or not JSON at all
    with pytest.raises(TraceFormatError, match="bad metadata"):
        load_trace(write(tmp_path / "m.vgtrace", with_crc(bytes(data))))
    data = bytearray(valid_bytes())
    kinds_at = _HEADER.size + meta_len
    data[kinds_at] = 2  # the first op frees an id nobody allocated
    with pytest.raises(TraceFormatError, match="free of an id that is not live"):
        load_trace(write(tmp_path / "o.vgtrace", with_crc(bytes(data))))
    data[kinds_at] = 9
    with pytest.raises(TraceFormatError, match="unknown op kind"):
        load_trace(write(tmp_path / "k.vgtrace", with_crc(bytes(data))))


def test_broken_gzip_and_garbage(tmp_path):
    with pytest.raises(TraceFormatError, match="broken gzip"):
        load_trace(write(tmp_path / "g.gz", gzip.compress(valid_bytes())[:-10]))
    with pytest.raises(TraceFormatError, match="not a lifetime log"):
        load_trace(write(tmp_path / "bin", b"\x00\xff\xfe garbage"))
    with pytest.raises(TraceFormatError, match="no buffers"):
        load_trace(write(tmp_path / "empty", b""))


# ---------------------------------------------------------------- snapshots


def snapshot(events, segments=()):
    return pickle.dumps({"segments": list(segments), "device_traces": [events], "allocator_settings": {}})


def ev(action, addr, size, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, "frames": []}


def test_snapshot_events_become_ops(tmp_path):
    events = [
        ev("segment_alloc", 0x1000_0000, 20 * MiB),
        ev("alloc", 0x1000_0000, 3 * MiB),
        ev("alloc", 0x1030_0000, 5 * MiB),
        ev("free_requested", 0x1000_0000, 3 * MiB),
        ev("free_completed", 0x1000_0000, 3 * MiB),
        ev("free_completed", 0x5000_0000, 7 * MiB),  # live before recording
        ev("segment_free", 0x6000_0000, 8 * MiB),     # a burst nobody grows after:
        ev("segment_free", 0x7000_0000, 8 * MiB),     # empty_cache()
        ev("alloc", 0x1000_0000, 1 * MiB),
    ]
    t = load_trace(write(tmp_path / "s.pickle", snapshot(events)))
    assert t.counts() == {"alloc": 4, "free": 2, "empty_cache": 1, "synchronize": 0}
    assert t.meta["seeded_allocations"] == 1 and t.meta["empty_cache_calls"] == 1
    assert t.kinds[0] == 1 and t.sizes[0] == 7 * MiB  # the seed comes first
    assert t.peak_live() == 7 * MiB + 3 * MiB + 5 * MiB
    # Reserved at dump time is 0 (no segments): the start was 16 MiB - 20 MiB + ... clamped at 0
    assert t.recorded_peak_reserved == 20 * MiB + max(0, 16 * MiB - 20 * MiB)


def test_snapshot_retry_burst_is_not_an_empty_cache(tmp_path):
    events = [
        ev("segment_alloc", 0x1000_0000, 20 * MiB),
        ev("segment_free", 0x1000_0000, 20 * MiB),
        ev("segment_alloc", 0x2000_0000, 40 * MiB),  # the new segment follows at once
        ev("alloc", 0x2000_0000, 40 * MiB),
    ]
    t = load_trace(write(tmp_path / "r.pickle", snapshot(events)))
    assert t.meta["empty_cache_calls"] == 0 and t.meta["native_release_retries"] == 1
    assert t.recorded_peak_reserved == 40 * MiB


def test_snapshot_seeds_blocks_live_all_along(tmp_path):
    seg = {"device": 0, "address": 0x9000_0000, "total_size": 4 * MiB, "stream": 0,
           "blocks": [{"size": 2 * MiB, "requested_size": 2 * MiB - 100, "state": "active_allocated"},
                      {"size": 2 * MiB, "state": "inactive"}]}
    t = load_trace(write(tmp_path / "d.pickle", snapshot([ev("alloc", 0x1, 512)], [seg])))
    assert t.meta["seeded_allocations"] == 1
    assert t.peak_live() == 2 * MiB - 100 + 512
    assert t.meta["recorded_reserved_start_bytes"] == 4 * MiB


def test_pickles_that_are_not_snapshots(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(TraceFormatError, match="only plain data is read"):
        load_trace(write(tmp_path / "evil.pickle", pickle.dumps(Evil())))
    with pytest.raises(TraceFormatError, match="no 'device_traces'"):
        load_trace(write(tmp_path / "list.pickle", pickle.dumps([1, 2, 3])))
    with pytest.raises(TraceFormatError, match="holds no events"):
        load_trace(write(tmp_path / "none.pickle", snapshot([])))
    with pytest.raises(TraceFormatError, match="not a readable snapshot"):
        load_trace(write(tmp_path / "cut.pickle", snapshot([ev("alloc", 1, 512)])[:-7]))


# ---------------------------------------------------------------- lifetimes


def test_lifetime_log(tmp_path):
    p = write(tmp_path / "l.log", b"# op ids\n0 2 1000\n1 2 2000\n2 -1 4000\n")
    t = load_trace(p)
    assert t.nids == 3
    # At op 2 the new buffer is allocated before the two inputs are freed.
    assert t.peak_live() == 7000
    assert list(t.kinds) == [1, 1, 1, 2, 2]


@pytest.mark.parametrize(
    "text, what",
    [(b"0 1\n", "line 1: expected 3 fields"), (b"0 1 2\n3 x 4\n", "line 2: fields must be integers"),
     (b"5 2 100\n", r"freed \(op 2\) before allocated"), (b"0 1 0\n", "size > 0")],
)
def test_bad_lifetime_lines(tmp_path, text, what):
    with pytest.raises(TraceFormatError, match=what):
        load_trace(write(tmp_path / "bad.log", text))


# ---------------------------------------------------------------- replay


def test_replay_exact_numbers():
    r = replay(small_trace())
    assert r.fits and r.ooms == 0 and r.first_oom == -1
    assert r.peak_requested_bytes == 103 * MiB
    # the arena (the default): one 2 MiB page for 1000 bytes, two for 3 MiB
    # on stream 1's own range, fifty for 100 MiB; ranges are not counted as
    # device allocations
    assert r.peak_reserved_bytes == 2 * MiB + 4 * MiB + 100 * MiB
    assert r.device_alloc == 0 and r.device_free == 0
    s = replay(small_trace(), policy="segments")
    # small segment 2 MiB + packed 6 MiB (for 3 MiB) + 100 MiB; empty_cache
    # then releases the idle small segment before the big one is freed.
    assert s.peak_reserved_bytes == 2 * MiB + 6 * MiB + 100 * MiB
    assert s.device_alloc == 3 and s.device_free == 1
    assert r.curve and r.curve[-1][0] == len(small_trace()) - 1
    assert max(c[3] for c in r.curve) == r.peak_reserved_bytes


def test_replay_counts_ooms_and_goes_on():
    r = replay(small_trace(), budget="50MiB")
    assert not r.fits and r.ooms == 1 and r.first_oom == 3
    assert r.peak_reserved_bytes <= 50 * MiB


def test_min_budget_packs_same_size_tensors():
    t = Trace("thirty")
    ids = [t.alloc(3 * MiB) for _ in range(30)]
    for i in ids:
        t.free(i)
    assert t.peak_live() == 90 * MiB
    # vramguard: 6 MiB segments of two each; torch: 20 MiB segments of six.
    assert min_budget(t, "vramguard") == 90 * MiB
    assert min_budget(t, "torch") == 100 * MiB


def test_min_budget_of_an_empty_trace_is_zero():
    assert min_budget(Trace("empty")) == 0


def test_min_budget_bad_input():
    with pytest.raises(ValueError):
        min_budget(small_trace(), granularity=0)
    with pytest.raises(ValueError):
        replay(small_trace(), budget=0)
    with pytest.raises(ValueError, match="unknown policy"):
        replay(small_trace(), policy="fastest")


def test_heap_replay_rejects_inconsistent_columns():
    t = small_trace()
    kinds, ids, sizes, streams = t.columns()
    with pytest.raises(ValueError, match="columns disagree"):
        Heap(1 << 40).replay(kinds, ids[:-4], sizes, streams, t.nids)
    with pytest.raises(ValueError, match="out of range"):
        Heap(1 << 40).replay(kinds, ids, sizes, streams, 1)


# ---------------------------------------------------------------- recording


def test_recording_replays_to_the_same_peak():
    heap = Heap(1 << 40)
    before = heap.malloc(5 * MiB)  # live before recording
    with vramguard.record(heap) as rec:
        ptrs = [heap.malloc(s) for s in (1000, 3 * MiB, 30 * MiB, 3 * MiB, 700)]
        heap.free(before)
        for p in ptrs[1:3]:
            heap.free(p)
        heap.empty_cache()
        with pytest.raises(MemoryError):
            heap.malloc(1 << 50)
    t = rec.trace
    assert t.meta["seeded_allocations"] == 1 and t.meta["recorded_ooms"] == 1
    assert t.counts()["alloc"] == 6 and t.counts()["empty_cache"] == 1
    assert t.meta["recorded_reserved_start_bytes"] == 6 * MiB  # 5 MiB: three 2 MiB pages
    r = replay(t)
    assert r.peak_reserved_bytes == heap.stats()["reserved_bytes.all.peak"]


def test_what_was_live_before_recording_is_in_the_trace():
    """Weights made before recording and never freed hold memory through
    the whole trace: seeded at its start, so its peak is the heap's live
    peak; a block live at the start and freed in it is seeded once; one
    allocated after the start is not seeded."""
    heap = Heap(1 << 40)
    weights = heap.malloc(100 * MiB)            # live before, never freed
    batch = heap.malloc(10 * MiB)               # live before, freed inside
    heap.reset_peaks()
    with vramguard.record(heap) as rec:
        heap.free(batch)
        x = heap.malloc(50 * MiB)
        heap.free(x)
        y = heap.malloc(30 * MiB)
    t = rec.trace
    assert t.meta["seeded_allocations"] == 2 and t.meta["recorded_live_start_bytes"] == 110 * MiB
    assert t.counts()["alloc"] == 4                        # the two seeded, x and y
    assert t.peak_live() == 150 * MiB == heap.stats()["requested_bytes.all.peak"]
    heap.free(y)
    heap.free(weights)


def test_start_and_stop_recording():
    heap = Heap(1 << 40)
    vramguard.start_recording(heap)
    heap.free(heap.malloc(1 << 20))
    t = vramguard.stop_recording(heap)
    assert t.counts()["alloc"] == 1
    with pytest.raises(RuntimeError, match="no recording"):
        vramguard.stop_recording(heap)


# ---------------------------------------------------------------- command line


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "vramguard", *args], capture_output=True, text=True)


def test_cli_replay_json_and_exit_status(tmp_path):
    p = tmp_path / "t.vgtrace"
    save_trace(small_trace(), p)
    proc = run_cli("replay", str(p), "--json")
    assert proc.returncode == 0
    out = json.loads(proc.stdout)
    for key in ("peak_requested_bytes", "peak_reserved_bytes", "min_budget_bytes", "torch_peak_reserved_bytes",
                "torch_min_budget_bytes", "recorded_peak_reserved_bytes", "fits", "ooms", "events",
                "events_per_second"):
        assert key in out, key
    assert out["recorded_peak_reserved_bytes"] is None and out["events"] == 8
    proc = run_cli("replay", str(p), "--budget", "50MiB", "--policy", "torch")
    assert proc.returncode == 1
    assert "DOES NOT FIT" in proc.stdout and "first OOM at op 3" in proc.stdout
    proc = run_cli("replay", str(tmp_path / "missing.vgtrace"))
    assert proc.returncode == 2 and "No such file" in proc.stderr


def test_snapshot_with_wrong_field_types(tmp_path):
    events = [ev("alloc", 0x1000, "lots")]
    with pytest.raises(TraceFormatError, match="unexpected snapshot structure"):
        load_trace(write(tmp_path / "types.pickle", snapshot(events)))
    seg = {"address": 0, "total_size": "x", "blocks": [{"size": 512, "state": "active_allocated"}]}
    with pytest.raises(TraceFormatError, match="unexpected snapshot structure"):
        load_trace(write(tmp_path / "seg.pickle", snapshot([ev("alloc", 1, 512)], [seg])))


def test_random_corruption_only_ever_raises_trace_format_error(tmp_path):
    """Seeded fuzzing of every format: flipped bytes, truncations, insertions."""
    import random

    rng = random.Random(20261121)
    p = tmp_path / "base.vgtrace"
    save_trace(small_trace(), p)
    bases = [p.read_bytes(), gzip.compress(p.read_bytes()),
             snapshot([ev("segment_alloc", 0, 20 * MiB), ev("alloc", 0, 512), ev("free_completed", 0, 512)]),
             b"0 3 100\n1 2 200\n2 -1 300\n"]
    target = tmp_path / "fuzzed"
    for base in bases:
        for _ in range(300):
            data = bytearray(base)
            roll = rng.random()
            if roll < 0.4:
                for _ in range(rng.randint(1, 4)):
                    data[rng.randrange(len(data))] = rng.randrange(256)
            elif roll < 0.7:
                del data[rng.randrange(len(data)):]
            else:
                at = rng.randrange(len(data) + 1)
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            target.write_bytes(bytes(data))
            try:
                load_trace(target)
            except TraceFormatError:
                pass
