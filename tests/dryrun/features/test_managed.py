"""The dry run's lines on unified memory (python/vramguard/dryrun/features/managed.py),
from results as the children write them."""
from vramguard.dryrun.features import managed

MiB = 1 << 20
GiB = 1 << 30


def result(managed_bytes, runs, device=GiB, context=400 * MiB):
    out = {"device_bytes": device, "context_bytes": context}
    managed.summarize(out, runs)
    return out


def run(allocator="native", managed_bytes=0, reserved=0, fits=True, extensions=()):
    return {"allocator": allocator, "managed_bytes": managed_bytes, "managed_prefetched_bytes": managed_bytes,
            "peak_reserved_bytes": reserved, "fits": fits, "extensions": list(extensions)}


def test_summary_is_the_largest_run_and_none_without_figures():
    runs = [run(managed_bytes=3 * MiB), run("expandable", managed_bytes=5 * MiB)]
    assert result(0, runs)["managed_bytes"] == 5 * MiB
    assert result(0, [{"allocator": "native"}])["managed_bytes"] is None


def test_no_unified_memory_no_line():
    runs = [run()]
    r = result(0, runs)
    assert managed.note(r, runs) is None and managed.verdict(r, runs, "T4") is None


def test_the_note_names_paged_optimizer_state_only_with_bitsandbytes():
    plain = [run(managed_bytes=GiB)]
    assert managed.note(result(0, plain), plain) == (
        "Unified memory (cudaMallocManaged): 1.00 GiB, outside PyTorch's allocator (in no peak above); a card "
        "keeps it on the device while there is room and pages it out under pressure.")
    paged = [run(managed_bytes=GiB, extensions=["bitsandbytes"])]
    assert managed.note(result(0, paged), paged) == (
        "Paged optimizer state: 1.00 GiB of unified memory, outside PyTorch's allocator (in no peak above); a card "
        "keeps it on the device while there is room and pages it out under pressure.")


def test_paging_verdict_for_the_runs_over_the_device():
    # 1 GiB less a 400 MiB context: 624 MiB; 100 MiB of unified memory
    runs = [run(managed_bytes=100 * MiB, reserved=500 * MiB), run("expandable", 100 * MiB, 600 * MiB),
            run("vramguard", 100 * MiB, 530 * MiB), run("a", 100 * MiB, 900 * MiB, fits=False)]
    r = result(0, runs)
    assert managed.verdict(r, runs, "L4 of 1.00 GiB") == (
        "With expandable and vramguard, peak reserved plus the 100.00 MiB of unified memory exceeds the 624.00 MiB "
        "an L4 of 1.00 GiB leaves after its CUDA context: expect slower steps as the driver pages the unified "
        "memory out to host memory and back, not an out-of-memory error.")
    assert managed.verdict(r, runs[:1], "L4 of 1.00 GiB") is None  # 500 + 100 fits in 624
