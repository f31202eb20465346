"""install(arena=...) with the real PyTorch on the fake CUDA, whose driver
has the virtual memory calls (cuMemAddressReserve, cuMemCreate, cuMemMap,
...): the arena maps 2 MiB pages as tensors need them, reserved equals
mapped, empty_cache unmaps, the memory holds bytes, an out-of-memory is
still PyTorch's error with vramguard's report; segments where the fake
says the device has no virtual memory; bad values refused.

The tests that need the arena's heap policy skip, saying so, in a build
that does not have it (stats()["allocator"] then names segments)."""
import pytest

from fakegpu import MiB, run, summary_rows

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

ARENA = "arena (virtual memory, 2 MiB pages)"
NO_ARENA_IN_BUILD = "segments (virtual memory not supported: the arena is not in this build)"

# The arena's counters in stats(): maps and unmaps of pages.
MAPS = "num_maps"
UNMAPS = "num_unmaps"

PAGE = 2 * MiB


def arena_run(*code, **env):
    out = run("""
        vramguard.install(arena=True)
        out["allocator"] = vramguard.stats(0)["allocator"]
        if out["allocator"] != %r:
            print(%r + json.dumps(out))
            raise SystemExit(0)
    """ % (ARENA, "@@fakegpu-out@@"), *code, **env)
    if out["allocator"] == NO_ARENA_IN_BUILD:
        pytest.skip("the arena's heap policy is not in this build")
    assert out["allocator"] == ARENA
    return out


def fake_calls(name):
    return f'fake.vg_fakecuda_calls(b"{name}")'


def test_tensors_are_mapped_pages_and_reserved_is_mapped():
    out = arena_run(f"""
        before = {fake_calls("cuMemMap")}
        a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
        out["maps"] = {fake_calls("cuMemMap")} - before
        out["reserved"] = torch.cuda.memory_reserved()
        out["allocated"] = torch.cuda.memory_allocated()
        out["in_use"] = fake.vg_fakecuda_bytes_in_use(0)
        out["stats_maps"] = vramguard.stats(0)[{MAPS!r}]
        del a, b
        out["reserved_after_del"] = torch.cuda.memory_reserved()
        out["allocated_after_del"] = torch.cuda.memory_allocated()
        out["mallocs"] = fake.vg_fakecuda_malloc_calls()
    """)
    # 3 + 5 MiB of blocks: whole 2 MiB pages behind them, one map per page
    assert out["allocated"] == 8 * MiB
    assert out["reserved"] == out["in_use"]          # reserved = mapped, to the byte
    assert out["reserved"] % PAGE == 0 and 8 * MiB <= out["reserved"] <= 10 * MiB
    assert out["maps"] == out["reserved"] // PAGE
    assert out["stats_maps"] >= 1
    assert out["allocated_after_del"] == 0
    assert out["reserved_after_del"] == out["reserved"]  # pages stay mapped, cached
    assert out["mallocs"] == 0                        # no cudaMalloc'd segment at all


def test_empty_cache_unmaps_every_free_page():
    out = arena_run(f"""
        x = torch.empty(20 * MiB, dtype=torch.uint8, device="cuda")
        keep = torch.empty(1 * MiB, dtype=torch.uint8, device="cuda")
        del x
        torch.cuda.empty_cache()
        out["reserved"] = torch.cuda.memory_reserved()
        out["in_use"] = fake.vg_fakecuda_bytes_in_use(0)
        out["unmaps"] = {fake_calls("cuMemUnmap")}
        out["stats_unmaps"] = vramguard.stats(0)[{UNMAPS!r}]
        del keep
        torch.cuda.empty_cache()
        out["reserved_none"] = torch.cuda.memory_reserved()
        out["in_use_none"] = fake.vg_fakecuda_bytes_in_use(0)
    """)
    assert out["reserved"] == out["in_use"] <= 2 * PAGE  # what `keep` still touches
    assert out["unmaps"] == out["stats_unmaps"] >= 1  # one cuMemUnmap per run of pages, however long
    assert out["reserved_none"] == 0 and out["in_use_none"] == 0


def test_a_tensors_memory_holds_its_bytes():
    out = arena_run("""
        src = torch.arange(3 * MiB // 4, dtype=torch.int32)   # 3 MiB: across a page boundary
        dev = src.to("cuda")
        out["same"] = bool(torch.equal(dev.cpu(), src))
        out["ptr_in_range"] = dev.data_ptr() % 512 == 0
    """)
    assert out["same"] is True
    assert out["ptr_in_range"] is True


def test_out_of_memory_under_a_budget_is_torchs_error_with_the_report():
    out = arena_run("""
        vramguard.install(budget="64MiB")
        keep = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            out["error"] = str(e)
        out["reserved"] = torch.cuda.memory_reserved()
        out["in_use"] = fake.vg_fakecuda_bytes_in_use(0)
    """)
    assert "out of memory" in out["error"] and "vramguard" in out["error"]
    assert out["reserved"] == out["in_use"] <= 64 * MiB


def test_segments_where_the_device_has_no_virtual_memory():
    out = run("""
        vramguard.install(arena=True)
        x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        out["allocator"] = vramguard.stats(0)["allocator"]
        out["summary"] = str(vramguard.summary(0))
        out["mallocs"] = fake.vg_fakecuda_malloc_calls()
        out["maps"] = fake.vg_fakecuda_calls(b"cuMemMap")
    """, VG_FAKECUDA_NO_VMM="1")
    why = "segments (virtual memory not supported: device 0 does not support virtual memory management)"
    assert out["allocator"] == why
    assert [row for row in summary_rows(out["summary"]) if "allocator:" in row] == ["allocator: " + why]
    assert out["mallocs"] >= 1 and out["maps"] == 0


def test_segments_when_turned_off_by_argument_or_environment():
    for kwargs, env in (("arena=False", {}), ("", {"VRAMGUARD_ARENA": "0"})):
        out = run(f"""
            vramguard.install({kwargs})
            x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
            out["allocator"] = vramguard.stats(0)["allocator"]
            out["maps"] = fake.vg_fakecuda_calls(b"cuMemMap")
        """, **env)
        assert out["allocator"] == "segments (the arena is turned off)"
        assert out["maps"] == 0


def test_bad_arena_values_are_refused():
    out = run("""
        out["refused"] = [error(vramguard.install, arena=v) for v in ("yes", 1, 0.5)]
        out["installed"] = vramguard.is_installed()
    """)
    assert out["refused"] == [
        ["ValueError", "arena must be True (the arena), False (segments) or None (the default), got 'yes'"],
        ["ValueError", "arena must be True (the arena), False (segments) or None (the default), got 1"],
        ["ValueError", "arena must be True (the arena), False (segments) or None (the default), got 0.5"],
    ]
    assert out["installed"] is False
    out = run("""
        out["refused"] = error(vramguard.install)
    """, VRAMGUARD_ARENA="yes")
    assert out["refused"] == ["ValueError", "VRAMGUARD_ARENA must be 1 (the arena) or 0 (segments), got 'yes'"]


def test_the_choice_cannot_change_once_heaps_exist():
    out = run("""
        vramguard.install(arena=False)
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        out["changed"] = error(vramguard.install, arena=True)
        out["same_again"] = error(vramguard.install, arena=False)
        out["allocator"] = vramguard.stats(0)["allocator"]
    """)
    assert out["changed"][0] == "VramguardError"
    assert out["changed"][1].startswith("arena=True cannot take effect: the device heaps exist already")
    assert out["same_again"] is None
    assert out["allocator"] == "segments (the arena is turned off)"
