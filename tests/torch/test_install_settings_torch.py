"""install() called again: a setting left out keeps what the earlier call
set (a notebook re-runs its cells; install(gc_threshold=...) must not drop
the budget a first install(budget=...) set), a setting given replaces it,
and None turns it off."""
import pytest

from fakegpu import GiB, MiB, run

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]


def test_a_later_install_keeps_what_it_leaves_out():
    out = run("""
        vramguard.install(budget="64MiB", gc_threshold=0.5)
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        vramguard.install(gc_threshold=0.9)
        out["after_gc"] = [heap(0)["budget_bytes"], heap(0)["gc_threshold"]]
        vramguard.install()
        out["after_bare"] = [heap(0)["budget_bytes"], heap(0)["gc_threshold"]]
        out["refused"] = error(torch.empty, 100 * MiB, dtype=torch.uint8, device="cuda")[0]
        vramguard.install(budget="50%")
        out["after_fraction"] = [heap(0)["budget_bytes"], heap(0)["gc_threshold"]]
        vramguard.install(gc_threshold=0.25)
        out["fraction_kept"] = [heap(0)["budget_bytes"], heap(0)["gc_threshold"], heap(1)["budget_bytes"]]
        vramguard.install(budget=None)
        out["none_turns_off"] = [heap(0)["budget_bytes"], heap(0)["gc_threshold"]]
    """)
    assert out["after_gc"] == [64 * MiB, 0.9]
    assert out["after_bare"] == [64 * MiB, 0.9]
    assert out["refused"] == "OutOfMemoryError"
    assert out["after_fraction"] == [GiB // 2, 0.9]
    assert out["fraction_kept"] == [GiB // 2, 0.25, 256 * MiB]
    assert out["none_turns_off"] == [0, 0.25]


def test_the_environment_still_wins_over_what_was_kept():
    out = run("""
        vramguard.install(budget="64MiB")
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        import os
        os.environ["VRAMGUARD_BUDGET"] = "128MiB"
        vramguard.install()
        out["budget"] = heap(0)["budget_bytes"]
    """)
    assert out["budget"] == 128 * MiB
