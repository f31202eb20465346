"""Tests marked `segments` check what PyTorch's native allocator does with
cudaMalloc'd segments (the same memory_stats, base allocations, empty_cache
releases): their scripts install vramguard with the segments policy, as
VRAMGUARD_ARENA=0 asks, since the arena (the default) reserves by pages."""
import pytest


@pytest.fixture(autouse=True)
def _segments_policy(request, monkeypatch):
    if request.node.get_closest_marker("segments"):
        monkeypatch.setenv("VRAMGUARD_ARENA", "0")
