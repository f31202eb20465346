"""A snapshot PyTorch's own allocator writes (the real torch, native
allocator, on the fake CUDA device), read back by vramguard: the
empty_cache() call and the release-and-retry a full device forced show in
it only as bursts of segment frees, and the import tells them apart, so
that the torch policy replays the run to the peak PyTorch reserved."""
import pytest

import vramguard
from vramguard.report.replay_report import format_replay_report, replay_report
from fakegpu import MiB, run

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

PROGRAM = """
dev = "cuda"
pre = torch.empty(30 * MiB, dtype=torch.uint8, device=dev)       # live all along
gone = torch.empty(40 * MiB, dtype=torch.uint8, device=dev)      # freed while recording
torch.cuda.memory._record_memory_history(max_entries=100_000)
del gone
c = torch.empty(50 * MiB, dtype=torch.uint8, device=dev)
del c
torch.cuda.empty_cache()
d = torch.empty(80 * MiB, dtype=torch.uint8, device=dev)
e = torch.empty(100 * MiB, dtype=torch.uint8, device=dev)
big = [torch.empty(200 * MiB, dtype=torch.uint8, device=dev) for _ in range(3)]
del big  # 600 MiB cached: the next request finds the 1 GiB device full
f = torch.empty(700 * MiB, dtype=torch.uint8, device=dev)
out["max_reserved"] = torch.cuda.max_memory_reserved()
torch.cuda.memory._dump_snapshot(PATH)
out["actions"] = [e["action"] for e in torch.cuda.memory._snapshot()["device_traces"][0]]
"""


def test_native_snapshot_of_empty_cache_and_a_forced_release(tmp_path):
    path = tmp_path / "native.pickle"
    out = run(f"PATH = {str(path)!r}\n" + PROGRAM, devices=1, mem="1GiB")
    # What PyTorch wrote: no entry names empty_cache(); both releases are
    # bursts of segment_free, each followed by a new segment.
    assert "empty_cache" not in out["actions"]
    assert out["actions"][6:9] == ["segment_free", "segment_free", "segment_alloc"]
    assert out["actions"][24:28] == ["segment_free"] * 3 + ["segment_alloc"]
    t = vramguard.load_trace(path)
    assert (t.meta["seeded_allocations"], t.meta["empty_cache_calls"], t.meta["native_release_retries"]) == (2, 1, 1)
    assert t.recorded_peak_reserved == out["max_reserved"] == 910 * MiB
    assert t.meta["recorded_reserved_start_bytes"] == 70 * MiB
    # Under the recording device's memory the torch policy releases where
    # PyTorch did, and peaks where it did; with room to spare it keeps the
    # 600 MiB cached.
    on_the_device = vramguard.replay(t, "1GiB", policy="torch")
    assert (on_the_device.peak_reserved_bytes, on_the_device.alloc_retries) == (910 * MiB, 1)
    assert vramguard.replay(t, policy="torch").peak_reserved_bytes == 1510 * MiB
    text = format_replay_report(replay_report(t, "1GiB", "torch"))
    assert ("Peak reserved when recorded (by the native allocator): 910.00 MiB; the torch policy replays it under "
            "this budget to 910.00 MiB (+0.0%)") in text
