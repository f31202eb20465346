"""Hostile and mistaken input: each case gets one clear error, costs no more
than its input's size allows, and leaves nothing half-written. Cases that
used to crash the interpreter run in a fresh one."""
import gzip
import math
import pickle
import struct
import subprocess
import sys
import textwrap
import tracemalloc
import zlib
from pathlib import Path

import pytest

import vramguard
from vramguard import Heap, Trace, TraceFormatError, load_trace, min_budget, parse_size, replay, save_trace
from vramguard import _core
from vramguard.trace.format import _HEADER, MAGIC

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
TESTS = Path(__file__).resolve().parent


def run_python(code, timeout=120):
    script = "import sys\nsys.path.insert(0, %r)\n" % str(TESTS) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)


def write(path, data):
    path.write_bytes(data)
    return path


def ev(action, addr, size, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, "frames": []}


def snapshot(events, segments=(), protocol=4):
    return pickle.dumps({"segments": list(segments), "device_traces": [events], "allocator_settings": {}},
                        protocol=protocol)


MARKER = 0x7EADBEEF


def with_deep_tuple(data, depth):
    """`data` (protocol 2: no frames to keep consistent) with the int MARKER
    replaced by a tuple nested `depth` deep, written as opcodes (pickle.dumps
    itself would recurse that deep)."""
    token = b"J" + struct.pack("<i", MARKER)
    assert data.count(token) == 1
    return data.replace(token, b"K\x00" + b"\x85" * depth)


# ---------------------------------------------------------------- field types


def test_addr_nested_200000_deep_is_refused_not_a_segfault(tmp_path):
    p = write(tmp_path / "deep.pickle", with_deep_tuple(snapshot([ev("alloc", MARKER, 512)], protocol=2), 200_000))
    proc = run_python(f"""
        import vramguard
        try:
            vramguard.load_trace({str(p)!r})
        except vramguard.TraceFormatError as e:
            print("refused:", e)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and "nested too deep" in proc.stdout


def test_dict_key_nested_200000_deep_is_refused_before_unpickling(tmp_path):
    data = pickle.dumps({"device_traces": [[ev("alloc", 1, 512)]], "segments": [], MARKER: 1}, protocol=2)
    p = write(tmp_path / "key.pickle", with_deep_tuple(data, 200_000))
    proc = run_python(f"""
        import vramguard
        try:
            vramguard.load_trace({str(p)!r})
        except vramguard.TraceFormatError as e:
            print("refused at", e.offset)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused at" in proc.stdout


def test_memo_key_past_the_pickle_is_refused_before_the_unpickler_sizes_for_it(tmp_path):
    # LONG_BINPUT 2**26: CPython's unpickler makes its memo array 2**27
    # pointers long (1 GiB) for these 5 bytes. Found by fuzzing.
    data = snapshot([ev("alloc", 1, 512)], protocol=2)
    assert data[:2] == b"\x80\x02" and data[2:3] == b"}"
    data = data[:3] + b"r" + struct.pack("<I", 1 << 26) + data[3:]
    tracemalloc.start()
    with pytest.raises(TraceFormatError, match=r"offset 3: .*memo key larger than the pickle"):
        load_trace(write(tmp_path / "memo.pickle", data))
    assert tracemalloc.get_traced_memory()[1] < 16 * MiB
    tracemalloc.stop()


def test_shallow_tuples_still_read(tmp_path):
    # The pre-check refuses depth, not tuples: a tuple-valued field is then
    # refused by its type, with the field named.
    p = write(tmp_path / "t.pickle", with_deep_tuple(snapshot([ev("alloc", MARKER, 512)], protocol=2), 50))
    with pytest.raises(TraceFormatError, match=r"device_traces\[0\]\[0\]: 'addr' must be an int"):
        load_trace(p)


@pytest.mark.parametrize(
    "field, value, what",
    [
        ("addr", (1, 2), "'addr' must be an int from 0 to 2\\*\\*64-1, not a tuple"),
        ("addr", "0x10", "'addr' must be an int .*not a str"),
        ("addr", True, "'addr' must be an int .*not a bool"),
        ("addr", -1, "'addr' must be an int .*not -1"),
        ("addr", 1 << 64, "'addr' must be an int .*not an int of 65 bits"),
        ("size", 512.0, "'size' must be an int .*not a float"),
        ("size", None, "'size' must be an int .*not a NoneType"),
        ("stream", [0], "'stream' must be an int .*not a list"),
        ("action", 7, "'action' must be a str, not 7"),
    ],
)
def test_every_event_field_is_type_checked(tmp_path, field, value, what):
    bad = ev("alloc", 0x1000, 512)
    bad[field] = value
    p = write(tmp_path / "f.pickle", snapshot([ev("alloc", 0x2000, 512), bad]))
    with pytest.raises(TraceFormatError, match=r"device_traces\[0\]\[1\]: " + what):
        load_trace(p)


@pytest.mark.parametrize(
    "segment, what",
    [
        ({"address": "x", "blocks": []}, r"segments\[0\]: 'address' must be an int"),
        ({"address": 0, "total_size": 1.5, "blocks": []}, r"segments\[0\]: 'total_size' must be an int"),
        ({"address": 0, "device": "0", "blocks": []}, r"segments\[0\]: 'device' must be an int"),
        ({"address": 0, "blocks": {"size": 1}}, r"segments\[0\].blocks: must be a list, not a dict"),
        ({"address": 0, "blocks": [7]}, r"segments\[0\].blocks\[0\]: must be a dict, not 7"),
        ({"address": 0, "blocks": [{"size": 512, "state": 1}]}, r"blocks\[0\]: 'state' must be a str"),
        ({"address": 0, "blocks": [{"size": 512, "state": "active_allocated", "requested_size": "9"}]},
         r"blocks\[0\]: 'requested_size' must be an int"),
    ],
)
def test_every_segment_field_is_type_checked(tmp_path, segment, what):
    p = write(tmp_path / "s.pickle", snapshot([ev("alloc", 1, 512)], [segment]))
    with pytest.raises(TraceFormatError, match=what):
        load_trace(p)


def test_snapshot_layout_is_type_checked(tmp_path):
    data = pickle.dumps({"device_traces": [[ev("alloc", 1, 512)], "events"], "segments": []})
    with pytest.raises(TraceFormatError, match=r"device_traces\[1\]: must be a list, not a str"):
        load_trace(write(tmp_path / "a.pickle", data))
    data = pickle.dumps({"device_traces": [[ev("alloc", 1, 512), ["not", "a", "dict"]]], "segments": []})
    with pytest.raises(TraceFormatError, match=r"device_traces\[0\]\[1\]: must be a dict, not a list"):
        load_trace(write(tmp_path / "b.pickle", data))
    data = pickle.dumps({"device_traces": [[ev("alloc", 1, 512)]], "segments": "none"})
    with pytest.raises(TraceFormatError, match=r"segments: must be a list, not a str"):
        load_trace(write(tmp_path / "c.pickle", data))


def test_allocator_settings_keep_only_plain_values(tmp_path):
    nest = []
    for _ in range(30):  # 2**30 leaves if saving expanded it
        nest = [nest, nest]
    settings = {"max_split_size": -1, "expandable_segments": False, "roundup_power2_divisions": {1: 0, "2": 4},
                "deep": nest, 5: "int key", "x" * 3: object.__name__ * 500}
    data = pickle.dumps({"device_traces": [[ev("alloc", 1, 512)]], "segments": [], "allocator_settings": settings})
    t = load_trace(write(tmp_path / "s.pickle", data))
    kept = t.meta["allocator_settings"]
    assert kept["max_split_size"] == -1 and kept["expandable_segments"] is False
    assert kept["roundup_power2_divisions"] == {"1": 0, "2": 4}
    assert "deep" not in kept and kept["5"] == "int key" and len(kept["xxx"]) == 1000
    save_trace(t, tmp_path / "s.vgtrace")  # cheap: nothing left to expand


# ---------------------------------------------------------------- what reading costs


def compressible_trace_bytes(pairs):
    """A valid .vgtrace of `pairs` alloc/free pairs of one id: 42 bytes per
    pair that gzip packs a thousandfold."""
    meta = b'{"name": "pairs"}'
    n = 2 * pairs
    body = (meta + bytes([1, 2]) * pairs + b"\0" * (4 * n)
            + (struct.pack("<Q", 4096) + b"\0" * 8) * pairs + b"\0" * (8 * n))
    return _HEADER.pack(MAGIC, 1, 0, len(meta), n, 1, zlib.crc32(body)) + body


def test_gzip_that_inflates_past_the_cap_is_refused_early(tmp_path, monkeypatch):
    monkeypatch.delenv("VRAMGUARD_MAX_EXPANSION", raising=False)
    raw = compressible_trace_bytes(500_000)  # 21 MB
    p = write(tmp_path / "pairs.vgtrace.gz", gzip.compress(raw, 9))
    size = p.stat().st_size
    assert len(raw) > 128 * size  # more than the default allows
    tracemalloc.start()
    with pytest.raises(TraceFormatError, match=r"decompresses to more than 128 times the file's") as err:
        load_trace(p)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "max_expansion=N" in str(err.value) and "VRAMGUARD_MAX_EXPANSION=N" in str(err.value)
    # Streamed: it stopped at the cap (1 MiB at least, 128 times the file)
    # plus a chunk, instead of holding 21 MB.
    assert peak < max(1 << 20, 128 * size) + 4 * MiB
    # A file its owner vouches for: raise the cap, by keyword or environment.
    t = load_trace(p, max_expansion=2000)
    assert len(t) == 1_000_000 and t.peak_live() == 4096
    monkeypatch.setenv("VRAMGUARD_MAX_EXPANSION", "2000")
    assert len(load_trace(p)) == 1_000_000
    monkeypatch.setenv("VRAMGUARD_MAX_EXPANSION", "lots")
    with pytest.raises(ValueError, match="VRAMGUARD_MAX_EXPANSION must be a positive integer"):
        load_trace(p)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_an_endless_file_is_read_within_bounds():
    with pytest.raises(TraceFormatError, match="reads as more than 128 times the file's 0 bytes"):
        load_trace("/dev/zero")


def shared_record_pickle(n):
    """A snapshot whose segments list names one segment `n` times, whose
    blocks list names one live block `n` times: n * n allocations live at
    dump time, from a pickle of a few bytes per reference."""
    block = {"size": 512, "requested_size": 512, "state": "active_allocated"}
    segment = {"device": 0, "address": 0, "total_size": 512 * n, "stream": 0, "blocks": [block] * n}
    return pickle.dumps({"segments": [segment] * n, "device_traces": [[ev("alloc", 1, 512)]],
                         "allocator_settings": {}}, protocol=4)


def test_pickle_naming_records_many_times_is_refused(tmp_path):
    data = shared_record_pickle(500)
    assert len(data) < 4 * KiB  # 250,000 blocks from 4 KB
    p = write(tmp_path / "dag.pickle", data)
    with pytest.raises(TraceFormatError, match=r"names records whose ops would take more than 128 times") as err:
        load_trace(p)
    assert "max_expansion=N" in str(err.value)
    assert load_trace(p, max_expansion=10_000).meta["seeded_allocations"] == 500 * 500


def test_blocks_shared_between_segments_are_charged_too(tmp_path):
    blocks = [{"size": 512, "state": "inactive"}] * 2000
    segs = [{"device": 0, "address": 0, "total_size": 0, "blocks": blocks} for _ in range(2000)]
    p = write(tmp_path / "segs.pickle", snapshot([ev("alloc", 1, 512)], segs))
    with pytest.raises(TraceFormatError, match="names records"):
        load_trace(p)


def test_real_traces_fit_the_default_cap(tmp_path):
    from trace_paths import real_traces

    paths = real_traces()
    if not paths:
        pytest.skip("real traces not present (../shared/traces)")
    for path in paths:
        t = load_trace(path)
        gz = write(tmp_path / (path.name + ".gz"), gzip.compress(path.read_bytes()))
        assert load_trace(gz).columns() == t.columns()


def test_header_counts_the_file_cannot_hold(tmp_path):
    meta = b"{}"
    body = meta + bytes([1, 2]) + b"\0" * 8 + struct.pack("<Q", MiB) + b"\0" * 8 + b"\0" * 16
    data = _HEADER.pack(MAGIC, 1, 0, len(meta), 2, 2**32 - 1, zlib.crc32(body)) + body
    assert len(data) == 76
    with pytest.raises(TraceFormatError, match=r"offset 24: header claims 4,294,967,295 allocation ids for 2 ops"):
        load_trace(write(tmp_path / "ids.vgtrace", data))


def vgtrace_with_meta(meta):
    body = meta + bytes([1, 2]) + b"\0" * 8 + struct.pack("<Q", 512) + b"\0" * 8 + b"\0" * 16
    return _HEADER.pack(MAGIC, 1, 0, len(meta), 2, 1, zlib.crc32(body)) + body


@pytest.mark.parametrize(
    "meta, what",
    [
        (b"[" * 100_000 + b"]" * 100_000, "bad metadata: maximum recursion depth"),
        (b'{"recorded_peak_reserved_bytes": "lots"}', "bad metadata: 'recorded_peak_reserved_bytes' must be an int .*not a str"),
        (b'{"recorded_peak_reserved_bytes": -5}', "bad metadata: 'recorded_peak_reserved_bytes' must be an int .*not -5"),
        (b'{"name": [[[]]]}', "bad metadata: 'name' must be a str, not a list"),
    ],
)
def test_metadata_vramguard_reads_is_type_checked(tmp_path, meta, what):
    with pytest.raises(TraceFormatError, match=r"offset 32: " + what):
        load_trace(write(tmp_path / "m.vgtrace", vgtrace_with_meta(meta)))


def test_core_refuses_more_ids_than_ops():
    t = Trace("x")
    t.free(t.alloc(MiB))
    kinds, ids, sizes, streams = t.columns()
    with pytest.raises(ValueError, match="invalid trace: more allocation ids than ops"):
        _core.trace_peak_live(kinds, ids, sizes, 2**32 - 1)
    with pytest.raises(ValueError, match="invalid trace: more allocation ids than ops"):
        Heap(GiB).replay(kinds, ids, sizes, streams, 3)
    with pytest.raises(ValueError, match="nids is too large"):  # not 1, modulo 2**64
        _core.trace_peak_live(kinds, ids, sizes, 2**64 + 1)
    assert _core.trace_peak_live(kinds, ids, sizes, 1) == MiB


# ---------------------------------------------------------------- recordings


def test_a_second_recording_is_refused_and_the_first_keeps_everything():
    h = Heap(GiB)
    with vramguard.record(h) as outer:
        h.free(h.malloc(MiB))
        with pytest.raises(RuntimeError, match="recordings do not nest"):
            with vramguard.record(h):
                pass
        with pytest.raises(RuntimeError, match="recordings do not nest"):
            vramguard.start_recording(h)
        h.free(h.malloc(2 * MiB))
    assert outer.trace.counts()["alloc"] == 2 and outer.trace.counts()["free"] == 2
    assert outer.trace.meta["dropped_events"] == 0
    with vramguard.record(h) as again:  # one after the other is fine
        h.free(h.malloc(MiB))
    assert again.trace.counts()["alloc"] == 1


def test_events_not_taken_are_not_thrown_away():
    h = Heap(GiB, policy="segments")
    h.history_start(16)
    h.free(h.malloc(MiB))
    h.history_stop()
    with pytest.raises(RuntimeError, match="not yet taken"):
        h.history_start(16)
    data, dropped = h.history_take()
    assert len(data) == 3 * 48 and dropped == 0  # reserve, alloc, free
    h.history_start(16)


# ---------------------------------------------------------------- addresses


def test_simulated_addresses_never_alias_a_live_block():
    h = Heap(1 << 56, page_size=0)  # no virtual memory: segments have the whole space
    keep = h.malloc(MiB)
    seen = 0
    with pytest.raises(MemoryError) as err:
        for _ in range(1 << 17):  # a wrapping counter comes back to `keep`
            p = h.malloc(1 << 47)
            assert p != keep and p != 0
            h.free(p)
            h.empty_cache()
            seen += 1
    assert (1 << 17) - 3 < seen < 1 << 17  # the space ran out instead
    assert err.value.rounded_bytes == 1 << 47 and err.value.budget_refused is False
    assert err.value.device_free < 1 << 47  # what is left of the address space
    h.check()
    assert h.block_size(keep) == MiB
    h.free(keep)
    h.check()


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "make",
    [
        lambda: Heap(True),
        lambda: Heap(GiB, budget=True),
        lambda: Heap(GiB, gc_threshold=True),
        lambda: Heap(GiB).malloc(True),
        lambda: Trace("t").alloc(True),
        lambda: Trace("t").alloc(512, stream=False),
        lambda: parse_size(True),
    ],
)
def test_true_is_not_a_size(make):
    with pytest.raises(TypeError, match="bool"):
        make()


def test_bool_budget_setter():
    h = Heap(GiB)
    with pytest.raises(TypeError, match="bool"):
        h.budget = True
    assert h.budget is None


@pytest.mark.parametrize("value", [math.nan, -0.5, 1.5, 10**400, math.inf])
def test_fractions_out_of_range_are_one_value_error(value):
    with pytest.raises(ValueError, match=r"gc_threshold must be a fraction in \(0, 1\]"):
        Heap(GiB, gc_threshold=value)
    with pytest.raises(ValueError, match=r"budget_fraction must be a fraction in \(0, 1\]"):
        _core.configure_devices(budget_fraction=value)
    with pytest.raises(ValueError, match=r"gc_threshold must be a fraction in \(0, 1\]"):
        _core.configure_devices(gc_threshold=value)
    with pytest.raises(ValueError, match=r"budget_fraction must be a fraction in \(0, 1\]"):
        _core.set_device_budget(0, budget_fraction=value)


@pytest.mark.parametrize("budget", [2**64 + 2**31, 2**64, 10**30])
def test_device_budgets_are_never_taken_modulo_2_64(budget):
    with pytest.raises(ValueError, match="budget is too large \\(more than 64 bits\\)"):
        _core.configure_devices(budget=budget)
    with pytest.raises(ValueError, match="budget is too large"):
        _core.set_device_budget(0, budget=budget)
    with pytest.raises(TypeError, match="bool"):
        _core.configure_devices(budget=True)


@pytest.mark.parametrize("text", ["18446744075857035264", "18446744073709551616", "1e400", "1e400GiB", "99999999TiB"])
def test_sizes_past_64_bits_are_value_errors(text):
    with pytest.raises(ValueError, match="too large \\(more than 64 bits\\)"):
        parse_size(text)


def test_parse_size_reads_digits_exactly():
    assert parse_size("18446744073709551615") == 2**64 - 1
    assert parse_size("9007199254740993") == 2**53 + 1  # a float would say 2**53
    assert parse_size("1.5KiB") == 1536


def test_budget_from_the_environment_past_64_bits():
    proc = run_python("""
        import os, sys
        sys.modules["torch"] = None   # the budget is refused before torch is looked for
        import vramguard
        for value in ("18446744075857035264", "1e400"):
            os.environ["VRAMGUARD_BUDGET"] = value
            try:
                vramguard.install()
            except ValueError as e:
                print("refused:", e)
        print("installed:", vramguard.is_installed())
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("refused:") == 2 and "more than 64 bits" in proc.stdout
    assert "installed: False" in proc.stdout


# ---------------------------------------------------------------- replay


def test_min_budget_granularity_must_be_a_whole_number_of_bytes():
    t = Trace("t")
    t.free(t.alloc(3 * MiB))
    for bad in (1.5, True, "2MiB"):
        with pytest.raises(TypeError, match="granularity must be an int"):
            min_budget(t, granularity=bad)
    for bad in (0, -4096, 1 << 60):
        with pytest.raises(ValueError, match="granularity must be from 1"):
            min_budget(t, granularity=bad)
    assert min_budget(t, granularity=1) == min_budget(t, granularity=4096) == 4 * MiB


def test_min_budget_of_a_trace_larger_than_the_simulated_device():
    t = Trace("huge")
    for _ in range(16):
        t.alloc(1 << 47)  # 2 PiB live, over the 1 PiB device of a replay
    with pytest.raises(ValueError, match="more than the 1125899906842624-byte device"):
        min_budget(t)


def test_a_refused_alloc_leaves_the_trace_whole(tmp_path):
    t = Trace("t")
    a = t.alloc(MiB)
    for size, stream, error in ((10, -1, ValueError), (10, 2**64, ValueError), (10, 1.0, TypeError),
                                (0, 0, ValueError), ((1 << 47) + 1, 0, ValueError), (10, "s", TypeError)):
        with pytest.raises(error):
            t.alloc(size, stream=stream)
    t.free(a)
    assert len(t.kinds) == len(t.ids) == len(t.sizes) == len(t.streams) == 2 and t.nids == 1
    assert replay(t).fits
    save_trace(t, tmp_path / "t.vgtrace")
    assert load_trace(tmp_path / "t.vgtrace").columns() == t.columns()


def test_replay_refuses_a_device_heap():
    proc = run_python("""
        import vramguard
        from vramguard import _core
        _core.simulate_devices(1 << 30)
        h = _core.device_heap(0)
        t = vramguard.Trace("t")
        t.free(t.alloc(1024))
        try:
            h.replay(*t.columns(), t.nids)
        except RuntimeError as e:
            print("refused:", e)
        print("untouched:", h.stats()["num_device_alloc"])
    """)
    assert proc.returncode == 0, proc.stderr
    assert "refused: replay needs a heap of its own" in proc.stdout and "untouched: 0" in proc.stdout


# ---------------------------------------------------------------- messages and totals


def test_error_messages_show_the_address():
    h = Heap(GiB)
    with pytest.raises(ValueError, match=r"^free\(0x1234\): not a live block"):
        h.free(0x1234)
    with pytest.raises(ValueError, match=r"^record_stream\(0xdeadbeef000\): not a live block"):
        h.record_stream(0xDEADBEEF000, 7)


def test_reset_accumulated_zeroes_totals_as_pytorch_does():
    h = Heap(GiB)
    a, b = h.malloc(1000), h.malloc(3 * MiB)
    h.free(a)
    h.reset_accumulated()
    s = h.stats()
    assert s["allocated_bytes.all.current"] == 3 * MiB
    assert s["allocated_bytes.all.allocated"] == 0 and s["allocated_bytes.all.freed"] == 0
    assert s["allocation.all.allocated"] == 0 and s["segment.all.allocated"] == 0
    assert s["num_device_alloc"] == 0
    h.check()
    h.free(b)
    s = h.stats()
    assert s["allocated_bytes.all.allocated"] == 0 and s["allocated_bytes.all.freed"] == 3 * MiB
    assert s["allocation.all.freed"] == 1
    h.check()


# ---------------------------------------------------------------- command line


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "vramguard", *args], capture_output=True, text=True, cwd=cwd)


def cli_inputs(tmp_path):
    save_trace(Trace("empty"), tmp_path / "empty.vgtrace")
    t = Trace("small")
    t.free(t.alloc(1000))
    save_trace(t, tmp_path / "small.vgtrace")
    (tmp_path / "digits20.log").write_text("0 1 123456789012345678901\n")
    (tmp_path / "two48.log").write_text(f"0 1 {1 << 48}\n")
    (tmp_path / "dag.pickle").write_bytes(shared_record_pickle(500))
    (tmp_path / "ids.vgtrace").write_bytes(_HEADER.pack(MAGIC, 1, 0, 0, 0, 7, zlib.crc32(b"")))


@pytest.mark.parametrize(
    "args, said",
    [
        (["replay", "empty.vgtrace"], "holds no allocations"),
        (["replay", "small.vgtrace", "--budget", "1e400"], "budget '1e400' is too large"),
        (["replay", "small.vgtrace", "--budget", "0"], "budget must be positive"),
        (["replay", "small.vgtrace", "--budget", "lots"], "cannot read 'lots' as a size"),
        (["replay", "digits20.log"], "line 1: a buffer of 123456789012345678901 bytes is larger than any heap serves"),
        (["replay", "two48.log"], "line 1: a buffer of 281474976710656 bytes is larger than any heap serves"),
        (["replay", "dag.pickle"], "VRAMGUARD_MAX_EXPANSION=N"),
        (["replay", "ids.vgtrace"], "header claims 7 allocation ids for 0 ops"),
        (["replay", "missing.vgtrace"], "No such file"),
        (["replay", "small.vgtrace", "--policy", "fastest"], "invalid choice"),
        (["replay"], "the following arguments are required: trace"),
        (["demo", "--capacity", "1e400"], "capacity '1e400' is too large"),
        (["demo", "--capacity", "1KiB", "--steps", "1"], "too small for the demo's model"),
        (["demo", "--steps", "-1"], "expected a positive integer"),
    ],
)
def test_cli_bad_input_is_one_line_and_status_2(tmp_path, args, said):
    cli_inputs(tmp_path)
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("vramguard: "), proc.stderr
    assert said in proc.stderr


def test_cli_does_not_fit_keeps_status_1(tmp_path):
    t = Trace("big")
    t.free(t.alloc(3 * MiB))
    save_trace(t, tmp_path / "big.vgtrace")
    proc = run_cli("replay", "big.vgtrace", "--budget", "2MiB", cwd=tmp_path)
    assert proc.returncode == 1 and "DOES NOT FIT" in proc.stdout and proc.stderr == ""


# ------------------------------------------------------------------ policy names


@pytest.mark.parametrize("call", ["replay", "min_budget"])
def test_an_unknown_replay_policy_lists_every_policy_a_replay_takes(call):
    trace = vramguard.Trace("t")
    trace.free(trace.alloc(1 << 20))
    fn = getattr(vramguard, call)
    expected = "unknown policy 'fastest': use one of vramguard, arena, segments, torch, torch-expandable"
    with pytest.raises(ValueError) as error:
        fn(trace, policy="fastest")
    assert str(error.value) == expected
    with pytest.raises(ValueError, match="use one of vramguard, arena, segments, torch, torch-expandable"):
        fn(vramguard.Trace("empty"), policy="fastest")  # checked before any work
    with pytest.raises(TypeError) as error:
        fn(trace, policy=None)
    assert str(error.value) == ("policy must be a str, one of vramguard, arena, segments, torch, "
                                "torch-expandable; got NoneType")


def test_a_heap_policy_that_is_unknown_or_not_a_str():
    with pytest.raises(ValueError) as error:
        vramguard.Heap(1 << 30, policy="torch-expandable")
    assert "'arena', 'segments' or 'torch'; vramguard.replay() and min_budget() also take " \
           "'torch-expandable'" in str(error.value)
    assert str(error.value).startswith("unknown policy 'torch-expandable': a Heap takes 'vramguard'")
    with pytest.raises(TypeError) as error:
        vramguard.Heap(1 << 30, policy=None)
    assert str(error.value) == "policy must be a str ('vramguard', 'arena', 'segments' or 'torch'), not NoneType"
    with pytest.raises(ValueError, match=r"unknown policy 'a\\x00b'"):
        vramguard.Heap(1 << 30, policy="a\0b")
    assert vramguard.Heap(1 << 30).policy == vramguard.Heap(1 << 30, policy="vramguard").policy
