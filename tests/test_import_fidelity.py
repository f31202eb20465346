"""A snapshot replayed under the torch policy gives back the peak reserved
PyTorch recorded, once the memory live before recording began is seeded and
the program's empty_cache() calls (which a snapshot shows only as bursts of
segment frees) are replayed as such."""
import pickle
from array import array

import pytest

from vramguard import Trace, load_trace, replay
from vramguard.trace.format import ALLOC, EMPTY_CACHE, FREE, NO_EVENT
from trace_paths import SHARED_TRACES

MiB = 1 << 20
A, B, C, D, E = 0xA000_0000, 0xB000_0000, 0xC000_0000, 0xD000_0000, 0xE000_0000


def ev(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 0, "frames": []}


def segment(addr, size, state="active_allocated"):
    return {"device": 0, "address": addr, "total_size": size, "allocated_size": size, "stream": 0,
            "segment_type": "large", "blocks": [{"address": addr, "size": size, "requested_size": size,
                                                  "state": state, "frames": []}]}


def empty_cache_program():
    """What the native allocator recorded for: A (30 MiB) and B (40 MiB)
    allocated before recording began; B freed, C (50 MiB) allocated and
    freed, torch.cuda.empty_cache(), then D (80 MiB) and E (100 MiB).
    Reserved: 70 -> 120 -> 30 -> 110 -> 210 MiB."""
    events = [
        ev("free_requested", B, 40 * MiB), ev("free_completed", B, 40 * MiB),
        ev("segment_alloc", C, 50 * MiB), ev("alloc", C, 50 * MiB),
        ev("free_requested", C, 50 * MiB), ev("free_completed", C, 50 * MiB),
        ev("segment_free", B, 40 * MiB), ev("segment_free", C, 50 * MiB),  # empty_cache()
        ev("segment_alloc", D, 80 * MiB), ev("alloc", D, 80 * MiB),
        ev("segment_alloc", E, 100 * MiB), ev("alloc", E, 100 * MiB),
    ]
    segments = [segment(A, 30 * MiB), segment(D, 80 * MiB), segment(E, 100 * MiB)]
    return {"segments": segments, "device_traces": [events], "allocator_settings": {}}


def load(tmp_path, snap, name="s.pickle"):
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snap))
    return load_trace(path)


def without(trace, drop):
    """`trace` less the ops `drop(kind, id, event)` names, and each dropped
    allocation's free: the trace an importer without that feature made."""
    out, gone = Trace(trace.name), set()
    out.events = array("Q")
    for kind, ident, size, stream, event in zip(trace.kinds, trace.ids, trace.sizes, trace.streams, trace.events):
        if drop(kind, ident, event) or (kind == FREE and ident in gone):
            gone.add(ident)
            continue
        out._append(kind, ident, size, stream, event)
    out.nids = trace.nids
    return out


def test_torch_replay_reproduces_the_recorded_peak(tmp_path):
    t = load(tmp_path, empty_cache_program())
    assert t.recorded_peak_reserved == 210 * MiB
    assert t.meta["recorded_reserved_start_bytes"] == 70 * MiB
    assert t.meta["seeded_allocations"] == 2
    assert t.meta["empty_cache_calls"] == 1 and t.meta["native_release_retries"] == 0
    at = list(t.kinds).index(EMPTY_CACHE)
    assert t.events[at] == 6  # named by the burst's first event
    assert replay(t, policy="torch").peak_reserved_bytes == 210 * MiB
    # What each feature is worth: without the empty_cache() the freed 40 and
    # 50 MiB stay cached and D takes a new segment; without the seeds the
    # run starts 70 MiB low.
    no_empty_cache = without(t, lambda kind, ident, event: kind == EMPTY_CACHE)
    assert replay(no_empty_cache, policy="torch").peak_reserved_bytes == 300 * MiB
    no_seeds = without(t, lambda kind, ident, event: kind == ALLOC and event == NO_EVENT)
    assert replay(no_seeds, policy="torch").peak_reserved_bytes == 180 * MiB


def test_burst_that_a_full_device_forced_is_a_retry(tmp_path):
    """A burst followed by a new segment that, without the release, would
    have passed the most the device ever held: PyTorch's own release and
    retry, which a replayed policy does by itself under a budget."""
    snap = empty_cache_program()
    events = snap["device_traces"][0]
    del events[10:]  # no E: 120 MiB is the most held, and 120 + 80 passes it
    snap["segments"] = snap["segments"][:2]
    t = load(tmp_path, snap)
    assert t.meta["empty_cache_calls"] == 0 and t.meta["native_release_retries"] == 1
    assert t.recorded_peak_reserved == 120 * MiB
    # With room to spare the torch policy keeps what PyTorch released; under
    # the 120 MiB the device had, it releases there too.
    assert replay(t, policy="torch").peak_reserved_bytes == 200 * MiB
    assert replay(t, "120MiB", policy="torch").peak_reserved_bytes == 120 * MiB
    from vramguard.report.replay_report import format_replay_report, replay_report

    assert ("  (the recording device was full once: PyTorch released its cache and retried; a replay does so "
            "only under a budget)") in format_replay_report(replay_report(t)).splitlines()


def test_burst_before_an_oom_is_a_retry(tmp_path):
    snap = empty_cache_program()
    events = snap["device_traces"][0]
    events.insert(8, {"action": "oom", "device_free": 0, "size": 500 * MiB, "stream": 0, "time_us": 0})
    t = load(tmp_path, snap)
    assert t.meta["empty_cache_calls"] == 0 and t.meta["native_release_retries"] == 1


def test_unmap_bursts_count_as_well(tmp_path):
    """Expandable segments give memory back by unmapping pages."""
    snap = empty_cache_program()
    events = snap["device_traces"][0]
    for i in (6, 7):
        events[i]["action"] = "segment_unmap"
    t = load(tmp_path, snap)
    assert t.meta["empty_cache_calls"] == 1
    assert replay(t, policy="torch").peak_reserved_bytes == 210 * MiB


def test_hostile_segment_sizes_are_one_error(tmp_path):
    from vramguard import TraceFormatError

    snap = empty_cache_program()
    snap["device_traces"][0][6]["size"] = -1
    with pytest.raises(TraceFormatError, match=r"device_traces\[0\]\[6\]: 'size' must be an int"):
        load(tmp_path, snap)


@pytest.mark.shared
@pytest.mark.skipif(not (SHARED_TRACES / "opt125m_zo_finetune.snapshot.pickle").is_file(),
                    reason=f"the real traces are not in {SHARED_TRACES}")
def test_real_snapshot_replays_to_its_recorded_peak():
    t = load_trace(SHARED_TRACES / "opt125m_zo_finetune.snapshot.pickle")
    assert replay(t, policy="torch").peak_reserved_bytes == t.recorded_peak_reserved == 1_897_922_560


def test_the_look_for_the_most_held_reads_no_more_than_the_cap(tmp_path, monkeypatch):
    """A pickle can name one event a million times for a few bytes each: the
    pass that finds the most the device held stops where the cap on records
    stops the reader, and the reader refuses the file."""
    from vramguard import TraceFormatError
    from vramguard.trace import importer as _import

    grow = ev("segment_alloc", A, 20 * MiB)
    path = tmp_path / "many.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[grow] * 1_000_000]}))
    looked = []
    real = _import._Fields.u64

    def counted(self, record, key, where, default=0):
        looked.append(where)
        return real(self, record, key, where, default)

    monkeypatch.setattr(_import._Fields, "u64", counted)
    with pytest.raises(TraceFormatError, match="names records"):
        load_trace(path, max_expansion=1)
    cap = max(_import.MIN_ALLOWANCE, path.stat().st_size) // _import.OP_BYTES
    # Up to the cap, each event's size is read by the look, and its address,
    # size and stream by the reader: 4 reads, not 4 million.
    assert cap < 100_000 and len(looked) <= 4 * (cap + 1)


def test_the_report_sets_the_recorded_peak_beside_its_replay(tmp_path):
    from vramguard.report.replay_report import format_replay_report, replay_report

    r = replay_report(load(tmp_path, empty_cache_program()))
    assert r["recorded_policy"] == "torch" and r["recorded_peak_reserved_bytes"] == 210 * MiB
    assert ("Peak reserved when recorded (by the native allocator): 210.00 MiB; the torch policy replays it "
            "to 210.00 MiB (+0.0%)") in format_replay_report(r).splitlines()
    snap = empty_cache_program()
    snap["allocator_settings"] = {"expandable_segments": True}
    assert replay_report(load(tmp_path, snap, "x.pickle"))["recorded_policy"] == "torch-expandable"
