"""What a new user met on a first try, each fixed: the demo naming one
device two ways, one word for two ratios, sizes that overflow their column,
one rule for sizes everywhere, first OOMs named by the snapshot's own event
index, readable reprs, GPU presets, and the trace shipped for trying things."""
import gzip
import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

import vramguard
from vramguard import Heap, Trace, TraceFormatError, format_summary, load_trace, min_budget, replay, save_trace
from vramguard.render.advice import fragmentation_so_what
from vramguard.report.demo import EXAMPLE_FILE, record_example, run_demo
from vramguard.report.replay_report import format_replay_report, replay_report
from vramguard.trace.format import _HEADER
from vramguard._units import format_size_column
from sample_traces import small_trace
from trace_paths import SHARED_TRACES

MiB, GiB = 1 << 20, 1 << 30
ROOT = Path(__file__).resolve().parents[1]
OPT125M = SHARED_TRACES / "opt125m_zo_finetune.snapshot.pickle"


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "vramguard", *args], capture_output=True, text=True, cwd=cwd)


def pieces_heap():
    """Twenty 30 MiB tensors, every other one freed: 300 MiB cached free in
    ten blocks of 30 MiB, 600 MiB reserved (segments: one per tensor)."""
    heap = Heap(GiB, policy="segments")
    ptrs = [heap.malloc(30 * MiB) for _ in range(20)]
    for p in ptrs[::2]:
        heap.free(p)
    return heap


# ---------------------------------------------------------------- the demo


def test_demo_header_and_table_title_name_the_same_device():
    lines = []
    run_demo(steps=1, out=lines.append)
    assert lines[0].endswith("on a simulated 14.35 GiB device (a T4's usable memory).")
    assert "vramguard memory summary (no budget on a 14.35 GiB device)" in lines[1]
    lines = []
    run_demo(capacity="15GiB", steps=1, out=lines.append)
    assert lines[0].endswith("on a simulated 15.00 GiB device.")
    assert "vramguard memory summary (no budget on a 15.00 GiB device)" in lines[1]


# ---------------------------------------------------------------- fragmentation


def test_summary_and_replay_name_their_two_ratios_apart():
    text = format_summary(pieces_heap().stats())
    assert "| Cached free: 300.00 MiB in 10 blocks, largest free block 30.00 MiB" in text
    assert "| Cached free in pieces (1 - largest free block / cached free):        90.0%    |" in text
    assert "| Reserved but not allocated (1 - allocated / reserved):               50.0%    |" in text
    assert "| So what: harmless now; " in text
    report = format_replay_report(replay_report(small_trace()))
    row = next(line for line in report.splitlines() if line.startswith("  peak reserved over peak live"))
    cells = dict(zip(("arena", "segments", "torch", "torch-expandable"), row.split()[5:]))
    assert (cells["arena"], cells["segments"], cells["torch"]) == ("+2.9%", "+4.9%", "+18.4%")
    assert "fragmentation" not in text.lower() and "fragmentation" not in report.lower()


BASE = {"fragmentation.free_bytes": 300 * MiB, "fragmentation.largest_free_block": 30 * MiB,
        "reserved_bytes.all.current": 600 * MiB, "device_total_bytes": GiB}


@pytest.mark.parametrize("stats, said", [
    ({}, "So what: nothing is cached free, so there is nothing to be in pieces."),
    (dict(BASE, **{"fragmentation.largest_free_block": 280 * MiB}),
     "So what: no harm; the free cache is nearly one block (280.00 MiB of 300.00 MiB)."),
    (BASE, "So what: harmless now; 424.00 MiB of the device is not reserved yet, more than the 300.00 MiB "
           "cached free, so the pieces matter only near the limit."),
    (dict(BASE, budget_bytes=610 * MiB, **{"inactive_split_bytes.all.current": 0}),
     "So what: harmless now; one request can still have 310.00 MiB (10.00 MiB not reserved yet under the "
     "budget, 300.00 MiB in wholly free segments), more than the 300.00 MiB cached free, so the pieces matter "
     "only near the limit."),
    (dict(BASE, budget_bytes=610 * MiB, **{"inactive_split_bytes.all.current": 200 * MiB}),
     "So what: it matters now; a request over 110.00 MiB fails although 300.00 MiB is cached free, in pieces "
     "between live tensors. empty_cache() does not help (vramguard releases wholly free segments before an "
     "OOM): create long-lived tensors (weights, optimizer state) first, and drop references to dead ones."),
    (dict(BASE, budget_bytes=610 * MiB),
     "So what: it may matter now; a request over 30.00 MiB may fail although 300.00 MiB is cached free, in "
     "pieces between live tensors. empty_cache() does not help (vramguard releases wholly free segments "
     "before an OOM): create long-lived tensors (weights, optimizer state) first, and drop references to "
     "dead ones."),
])
def test_fragmentation_so_what(stats, said):
    assert fragmentation_so_what(stats) == said


@pytest.mark.parametrize("budget, said", [
    ("5GiB", "So what: it fits; at its peak it reserved 106.00 MiB of 5.00 GiB, and needs at least 104.00 MiB."),
    ("50MiB", "So what: the tensors alone need 103.00 MiB at the peak, more than the budget: no allocator fits "
              "it; make less live at once (a smaller batch, lower precision, activation checkpointing)."),
    (None, "So what: it needs a budget of 104.00 MiB under the vramguard policy; the smallest GPU preset it "
           "fits is RTX-3060 (11.33 GiB usable)."),
])
def test_replay_so_what(budget, said):
    assert format_replay_report(replay_report(small_trace(), budget)).splitlines()[-1] == said


def test_replay_so_what_when_only_the_cache_overhead_does_not_fit():
    report = format_replay_report(replay_report(vramguard.example_trace(), "T4", "torch"))
    said = report.splitlines()[-1]
    assert said.startswith(
        "So what: the tensors fit (13.92 GiB at the peak) but the cache's overhead does not: the torch policy "
        "needs a budget of 15.01 GiB; the others: ")
    assert "segments 13.99 GiB" in said


# ---------------------------------------------------------------- columns


@pytest.mark.parametrize("mib, cell", [(999, "999.00 MiB"), (1000, "0.98 GiB"), (1010, "0.99 GiB"),
                                       (1023, "1.00 GiB")])
def test_sizes_from_1000_to_1023_mib_keep_their_column(mib, cell):
    heap = Heap(4 * GiB)
    heap.malloc(mib * MiB)
    lines = format_summary(heap.stats()).splitlines()
    row = next(line for line in lines if line.startswith("| Requested memory"))
    assert row.split("|")[2:4] == [f" {cell:>10} ", f" {cell:>10} "]
    assert all(len(line) == len(lines[0]) for line in lines)


def test_column_sizes_never_pass_ten_characters():
    for mib in range(990, 1025):
        for extra in (0, 1, MiB - 1):
            assert len(format_size_column(mib * MiB + extra)) <= 10
    assert format_size_column(1024) == "1.00 KiB"  # what fits stays as format_size() writes it
    assert format_size_column(1000 * 1024) == "0.98 MiB"
    assert format_size_column(15 << 40) == "15.00 TiB"
    assert format_size_column((1 << 64) - 1) == "16.00 EiB"


# ---------------------------------------------------------------- one size rule


HINT = "a budget of 15 bytes is smaller than one 2 MiB segment: give a unit, e.g. '15GiB'"


@pytest.mark.parametrize("make", [
    lambda: Heap(GiB, budget=15),
    lambda: Heap(GiB, budget="15"),
    lambda: setattr(Heap(GiB), "budget", 15),
    lambda: replay(small_trace(), budget=15),
    lambda: replay(small_trace(), budget="15"),
    lambda: vramguard.install(budget=15),  # read before PyTorch is looked for
    lambda: vramguard.install(budget="15"),
])
def test_a_bare_15_is_refused_everywhere_with_the_unit_hint(make):
    with pytest.raises(ValueError) as err:
        make()
    assert str(err.value) == HINT


def test_cli_refuses_a_bare_15_with_the_unit_hint(tmp_path):
    save_trace(small_trace(), tmp_path / "t.vgtrace")
    proc = run_cli("replay", "t.vgtrace", "--budget", "15", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"vramguard: {HINT}\n"


def test_sizes_are_read_the_same_way_everywhere():
    heap = Heap("1GiB", budget="512MiB")
    assert heap.capacity == GiB and heap.budget == 512 * MiB
    heap.budget = "T4"
    assert heap.budget == 15_407_775_744
    assert replay(small_trace(), budget="512MiB").budget == 512 * MiB
    with pytest.raises(ValueError) as err:
        Heap(GiB, budget="1KiB")
    assert str(err.value) == (
        "a budget of '1KiB' (1024 bytes) is smaller than one 2 MiB segment, the least any allocation reserves"
    )
    with pytest.raises(ValueError, match="cannot read 'lots' as a size"):
        Heap("lots")
    assert vramguard.torch.install.parse_budget_setting("T4") == (15_407_775_744, 0.0)


def test_min_budget_still_searches_below_one_segment():
    t = Trace("t")
    t.free(t.alloc(1000))
    assert min_budget(t, granularity=1) == 2 * MiB


# ---------------------------------------------------------------- the first OOM


def frames(line):
    return [{"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 116,
             "name": "forward"},
            {"filename": "/content/train.py", "line": line, "name": "step"}]


def ev(action, addr, size, line=None):
    e = {"action": action, "addr": addr, "size": size, "stream": 0}
    if line is not None:
        e["frames"] = frames(line)
    return e


def oom_snapshot(tmp_path):
    """Two 3 MiB tensors live, then a 10 MiB one: event 7 of the snapshot,
    op 2 of the trace (the segment and free_requested events make no op)."""
    events = [
        ev("segment_alloc", 0x10000000, 20 * MiB),       # 0
        ev("alloc", 0x10000000, 3 * MiB, line=10),        # 1: op 0
        ev("alloc", 0x10300000, 3 * MiB, line=11),        # 2: op 1
        ev("alloc", 0x10600000, MiB, line=12),            # 3: op 2
        ev("free_requested", 0x10600000, MiB),            # 4
        ev("free_completed", 0x10600000, MiB),            # 5: op 3
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0},  # 6
        ev("alloc", 0x10600000, 10 * MiB, line=42),       # 7: op 4
    ]
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [events]}))
    return path


def test_first_oom_is_named_by_the_snapshots_event_index_with_what_was_live(tmp_path):
    trace = load_trace(oom_snapshot(tmp_path))
    r = replay(trace, budget="8MiB")
    assert not r.fits and r.first_oom == 4
    oom = r.first_oom_at
    assert (oom.op, oom.event, oom.where, oom.site) == (4, 7, "snapshot event 7", "train.py:42 step")
    assert (oom.request_bytes, oom.live_bytes, oom.live_allocations) == (10 * MiB, 6 * MiB, 2)
    assert oom.largest_live == ((3 * MiB, "snapshot event 1, train.py:10 step"),
                                (3 * MiB, "snapshot event 2, train.py:11 step"))
    assert oom.by_line == ((3 * MiB, 1, "train.py:11 step"), (3 * MiB, 1, "train.py:10 step"))
    text = format_replay_report(replay_report(trace, "8MiB"))
    assert text.splitlines()[1:5] == [
        "Under an 8.00 MiB budget with the vramguard policy: DOES NOT FIT",
        "  first OOM at snapshot event 7, train.py:42 step: 10.00 MiB asked, 6.00 MiB live then in 2 allocations,"
        " most from:",
        "       3.00 MiB in 1 allocation  train.py:11 step",
        "       3.00 MiB in 1 allocation  train.py:10 step",
    ]
    assert "allocations failed" not in text  # a count inflated by carrying on past the first


def test_cli_json_carries_the_first_oom(tmp_path):
    oom_snapshot(tmp_path)
    proc = run_cli("replay", "oom.pickle", "--budget", "8MiB", "--json", cwd=tmp_path)
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert (out["first_oom_op"], out["first_oom_event"], out["first_oom_where"], out["first_oom_site"]) == (
        4, 7, "snapshot event 7", "train.py:42 step")
    assert (out["live_at_first_oom_bytes"], out["source_events"], out["event_label"]) == (6 * MiB, 8, "snapshot event")


def test_event_indices_and_their_label_survive_a_saved_trace(tmp_path):
    trace = load_trace(oom_snapshot(tmp_path))
    assert list(trace.events) == [1, 2, 3, 5, 7]
    save_trace(trace, tmp_path / "t.vgtrace")
    data = (tmp_path / "t.vgtrace").read_bytes()
    assert _HEADER.unpack_from(data)[2] == 3  # the event-column and stack-column flags
    again = load_trace(tmp_path / "t.vgtrace")
    assert list(again.events) == [1, 2, 3, 5, 7] and again.event_name(4) == "snapshot event 7, train.py:42 step"
    assert again.columns() == trace.columns()
    bad = bytearray(data)
    bad[10] = 7  # a flag this vramguard does not know
    (tmp_path / "bad.vgtrace").write_bytes(bytes(bad))
    with pytest.raises(TraceFormatError, match="offset 10: unknown flags 0x7"):
        load_trace(tmp_path / "bad.vgtrace")
    plain = small_trace()
    save_trace(plain, tmp_path / "plain.vgtrace")
    assert load_trace(tmp_path / "plain.vgtrace").events is None and plain.event_name(3) == "op 3"


def test_lifetime_logs_name_ops_by_the_logs_own_op_index(tmp_path):
    (tmp_path / "l.log").write_text("0 5 1048576\n3 -1 4194304\n7 9 8388608\n")
    trace = load_trace(tmp_path / "l.log")
    r = replay(trace, budget="8MiB")
    assert r.first_oom_at.where == "log op 7" and r.first_oom_at.live_bytes == 4 * MiB


@pytest.mark.shared
@pytest.mark.skipif(not OPT125M.is_file(), reason=f"the real traces are not in {SHARED_TRACES}")
def test_first_oom_on_a_real_snapshot_is_the_event_memory_viz_shows():
    trace = load_trace(OPT125M)
    oom = replay(trace, budget="1.5GiB").first_oom_at
    assert (oom.op, oom.event, oom.request_bytes) == (7562, 11203, 154435584)
    assert (oom.live_bytes, oom.live_allocations, oom.site) == (
        1474793348, 400, "adam_forward.py:268 update_K_param_paramwise")
    with open(OPT125M, "rb") as f:
        event = pickle.load(f)["device_traces"][0][11203]
    assert event["action"] == "alloc" and event["size"] == oom.request_bytes
    assert trace.meta["source_events"] == 23105


# ---------------------------------------------------------------- reprs


def test_replay_result_repr_reads_in_gib_and_mib():
    r = replay(small_trace(), budget="5GiB")
    assert repr(r) == ("ReplayResult('small', policy='vramguard', budget 5.00 GiB: FITS; peak live 103.00 MiB, "
                       "peak reserved 106.00 MiB (+2.9% over live), 8 ops)")
    assert str(5 * GiB) not in repr(r)
    r = replay(small_trace(), budget="50MiB")
    assert repr(r) == ("ReplayResult('small', policy='vramguard', budget 50.00 MiB: DOES NOT FIT; peak live "
                       "103.00 MiB, first OOM at op 3 (100.00 MiB asked, 3.00 MiB live), 8 ops)")
    r = replay(small_trace(), budget="T4")
    assert repr(r).startswith("ReplayResult('small', policy='vramguard', budget T4 (14.35 GiB usable): FITS")


def test_trace_meta_repr_is_short():
    t = small_trace()
    t.meta.update(source="pytorch-snapshot", recorded_reserved_curve=[(i, i) for i in range(1000)],
                  allocator_settings={f"key{i}": i for i in range(20)})
    assert repr(t.meta) == ("{'source': 'pytorch-snapshot', 'recorded_reserved_curve': <1,000 entries>, "
                            "'allocator_settings': {<20 entries>}}")
    assert t.meta["recorded_reserved_curve"][999] == (999, 999)  # still the whole list
    t.meta = {"a": 1}
    assert repr(t.meta) == "{'a': 1}"
    assert repr(t) == "<Trace 'small': 8 ops, 3 allocations>"


# ---------------------------------------------------------------- presets


def test_presets_total_and_usable_bytes():
    expected = {  # name: (total bytes as CUDA reports them, usable = total - 400 MiB, whole 2 MiB)
        "T4": (15_828_320_256, 15_407_775_744), "L4": (23_583_784_960, 23_163_043_840),
        "A100-40GB": (42_298_834_944, 41_878_028_288), "A100-80GB": (84_987_740_160, 84_567_654_400),
        "V100-16GB": (16_945_512_448, 16_525_557_760), "H100-80GB": (85_028_896_768, 84_607_500_288),
        "RTX-3090": (25_327_697_920, 24_907_874_304), "RTX-4090": (25_386_352_640, 24_966_594_560),
        "RTX-3060": (12_587_106_304, 12_167_675_904), "RTX-4060-Ti-16GB": (16_857_038_848, 16_437_477_376),
        "L40S": (47_576_711_168, 47_156_559_872),
        "H200": (150_109_880_320, 149_556_297_728),  # measured, with its context's 552,402,944 bytes
    }
    assert {n: (p.total_bytes, p.usable_bytes) for n, p in vramguard.PRESETS.items()} == expected
    assert str(vramguard.PRESETS["T4"]) == "T4: 14.35 GiB usable of 14.74 GiB (15,828,320,256 bytes)"
    assert {n: (p.cuda_name, p.compute_capability, p.sm_count) for n, p in vramguard.PRESETS.items()} == {
        "T4": ("Tesla T4", (7, 5), 40), "L4": ("NVIDIA L4", (8, 9), 58),
        "A100-40GB": ("NVIDIA A100-SXM4-40GB", (8, 0), 108), "A100-80GB": ("NVIDIA A100-SXM4-80GB", (8, 0), 108),
        "V100-16GB": ("Tesla V100-SXM2-16GB", (7, 0), 80), "H100-80GB": ("NVIDIA H100 80GB HBM3", (9, 0), 132),
        "RTX-3090": ("NVIDIA GeForce RTX 3090", (8, 6), 82), "RTX-4090": ("NVIDIA GeForce RTX 4090", (8, 9), 128),
        "RTX-3060": ("NVIDIA GeForce RTX 3060", (8, 6), 28),
        "RTX-4060-Ti-16GB": ("NVIDIA GeForce RTX 4060 Ti", (8, 9), 34),
        "L40S": ("NVIDIA L40S", (8, 9), 142), "H200": ("NVIDIA H200", (9, 0), 132),
    }
    # deviceQuery's "L2 Cache Size" of each card (_presets._L2_SOURCES says where each was read)
    assert {n: p.l2_cache_bytes >> 10 for n, p in vramguard.PRESETS.items()} == {  # KiB
        "T4": 4096, "L4": 49152, "A100-40GB": 40960, "A100-80GB": 40960, "V100-16GB": 6144,
        "H100-80GB": 51200, "RTX-3090": 6144, "RTX-4090": 73728, "RTX-3060": 2304, "RTX-4060-Ti-16GB": 32768,
        "L40S": 98304, "H200": 61440,
    }
    from vramguard._presets import _L2_SOURCES
    assert set(_L2_SOURCES) == set(vramguard.PRESETS)  # every preset's L2 says where it was read
    for name in ("rtx 4060 ti 16gb", "RTX_4060_TI_16GB", "Rtx-4060-Ti-16GB"):
        assert vramguard.parse_size(name) == vramguard.PRESETS["RTX-4060-Ti-16GB"].usable_bytes
    for name in ("t4", " T4 ", "a100_40gb", "a100 40GB", "rtx 3090", "RTX_4090", "l40s", "h200", "rtx 3060"):
        assert vramguard.parse_size(name) == vramguard.PRESETS[name.strip().upper().replace("_", "-")
                                                                .replace(" ", "-")].usable_bytes
    with pytest.raises(ValueError, match=r"or a GPU preset \(T4, L4, A100-40GB, A100-80GB, V100-16GB, H100-80GB, "
                                         r"RTX-3090, RTX-4090, RTX-3060, RTX-4060-Ti-16GB, L40S, H200\)"):
        vramguard.parse_size("A100")


def test_docs_presets_table_matches_the_code():
    rows = re.findall(r"^\| `([\w-]+)` \| ([\d,]+) \| ([\d,]+) \|", (ROOT / "docs" / "notebook.md").read_text(), re.M)
    table = {name: (int(total.replace(",", "")), int(usable.replace(",", ""))) for name, total, usable in rows}
    assert table == {n: (p.total_bytes, p.usable_bytes) for n, p in vramguard.PRESETS.items()}


def test_cli_takes_presets(tmp_path):
    path = ROOT / "python" / "vramguard" / "data" / EXAMPLE_FILE
    proc = run_cli("replay", str(path), "--budget", "T4", "--policy", "torch")
    assert proc.returncode == 1
    assert "Under a T4 (14.35 GiB usable) budget with the torch policy: DOES NOT FIT" in proc.stdout
    assert run_cli("replay", str(path), "--budget", "L4", "--policy", "torch").returncode == 0


# ---------------------------------------------------------------- the shipped trace


def test_the_shipped_trace_is_what_its_recipe_records(tmp_path):
    shipped = ROOT / "python" / "vramguard" / "data" / EXAMPLE_FILE
    record_example(tmp_path / EXAMPLE_FILE)
    assert gzip.decompress((tmp_path / EXAMPLE_FILE).read_bytes()) == gzip.decompress(shipped.read_bytes())


def test_the_shipped_trace_fits_a_t4_under_vramguard_only():
    t = vramguard.example_trace()
    assert (len(t), t.nids, t.peak_live()) == (1892, 1238, 14_951_404_548)
    # the arena: 1.2 MiB over the tensors' peak; segments 68.9 MiB, torch 1.09 GiB
    assert (min_budget(t), min_budget(t, "torch")) == (14_952_693_760, 16_120_807_424)
    assert min_budget(t, "segments") == 15_023_996_928
    assert replay(t, "T4").fits and not replay(t, "T4", "torch").fits
    assert replay(t, "L4", "torch").fits


def test_the_line_of_an_allocation_costs_a_bounded_look_at_its_frames(tmp_path):
    torch_frame = {"filename": "/x/torch/nn/functional.py", "line": 1, "name": "linear"}
    user_frame = {"filename": "/content/train.py", "line": 9, "name": "step"}
    long_path = {"filename": "/" + "d" * 100_000 + "/model.py", "line": 3, "name": "n" * 1000}
    events = [
        dict(ev("alloc", 0x1000, MiB), frames=[torch_frame] * 64 + [user_frame]),  # past the 64 looked at
        dict(ev("alloc", 0x200000, MiB), frames=[torch_frame] * 63 + [user_frame]),
        dict(ev("alloc", 0x400000, MiB), frames=[long_path]),
        dict(ev("alloc", 0x600000, MiB), frames=[{"filename": 7}, "junk", user_frame]),
        dict(ev("alloc", 0x800000, MiB), frames="not a list"),
    ]
    (tmp_path / "f.pickle").write_bytes(pickle.dumps({"segments": [], "device_traces": [events]}))
    trace = load_trace(tmp_path / "f.pickle")
    assert [trace.site_of(op) for op in range(5)] == [
        "functional.py:1 linear", "train.py:9 step", "model.py:3 " + "n" * 200, "train.py:9 step", None]
