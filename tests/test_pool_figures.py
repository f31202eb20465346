"""The device's figures with its CUDA-graph pools (vramguard._core.device_figures,
reset_device_peaks, reset_device_accumulated) and their torch shapes
(_torch_stats.flat, nested), without torch: pools themselves are made by
PyTorch's hooks, tested in tests/c/test_pools.c and tests/torch/test_graph_pools.py."""
import subprocess
import sys
import textwrap

import pytest

from vramguard import _core
from vramguard.torch import stats as _torch_stats

MiB = 1 << 20


def run(code):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


@pytest.mark.parametrize("call", [_core.device_figures, _core.reset_device_peaks,
                                  _core.reset_device_accumulated])
def test_bad_devices_are_refused(call):
    for bad in (-1, 64, 1 << 70):
        with pytest.raises((ValueError, OverflowError)):
            call(bad)
    for bad in (True, "0", None, 1.0):
        with pytest.raises(TypeError):
            call(bad)


def test_without_pools_the_figures_are_the_heaps():
    lines = run("""
        from vramguard import _core
        _core.simulate_devices(1 << 30)
        print(_core.device_figures(3))           # no heap: None
        _core.reset_device_peaks(3)              # nothing to do
        h = _core.device_heap(3)
        a = h.malloc(5 << 20)
        f = _core.device_figures(3)
        s = h.stats()
        print(all(f[k] == s[k] for k in f if k in s))
        print(f["private_pools"], f["private_pool_reserved_bytes"], f["reserved_bytes_by_private_pools"])
        print(f["allocated_bytes.all.current"], f["allocated_bytes.all.peak"])
        h.free(a)
        _core.reset_device_peaks(3)
        print(_core.device_figures(3)["allocated_bytes.all.peak"])
        _core.reset_device_accumulated(3)
        print(_core.device_figures(3)["num_device_alloc"])
    """)
    assert lines == ["None", "True", "0 0 {}", f"{5 * MiB} {5 * MiB}", "0", "0"]


def _pool_stats():
    arrays = {kind: {"current": 0, "peak": 6 * MiB, "allocated": 6 * MiB, "freed": 6 * MiB}
              for kind in ("all", "large_pool")}
    arrays["small_pool"] = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
    return {"reserved_bytes.all.current": 10 * MiB,
            "reserved_bytes_by_private_pools": {(7, 0): arrays}}


def test_flat_names_each_pool_as_pytorch_flattens_it():
    flat = _torch_stats.flat(_pool_stats())
    pool_keys = [k for k in flat if k.startswith("reserved_bytes_by_private_pools")]
    assert len(pool_keys) == 12
    assert flat["reserved_bytes_by_private_pools.7_0.all.peak"] == 6 * MiB
    assert flat["reserved_bytes_by_private_pools.7_0.small_pool.current"] == 0
    assert list(flat) == sorted(flat)
    assert not any(k.startswith("reserved_bytes_by") for k in _torch_stats.flat(_pool_stats(), private_pools=False))


def test_nested_keys_pools_by_id():
    tree = _torch_stats.nested(_pool_stats())
    assert tree["reserved_bytes_by_private_pools"][(7, 0)]["large_pool"]["freed"] == 6 * MiB
    assert tree["reserved_bytes"]["all"]["current"] == 10 * MiB
    assert _torch_stats.nested({})["reserved_bytes_by_private_pools"] == {}
