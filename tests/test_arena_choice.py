"""Arena or segments for the device heaps (vramguard._core.use_arena,
device_backing; install(arena=...) is tested with the real torch in
tests/torch/test_arena_torch.py), on simulated devices, each case in a
fresh interpreter since the registry's heaps live as long as the process."""
import subprocess
import sys
import textwrap

import pytest

from vramguard import _core
from vramguard.torch import install as _torch


def run(code, **env):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env or None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def test_bad_modes_are_refused():
    for bad in (1, 0, "1", 2.0, "arena"):
        with pytest.raises(TypeError, match="arena must be None, True or False, not "):
            _core.use_arena(bad)


def test_each_heap_says_what_it_runs_on():
    lines = run("""
        from vramguard import _core
        _core.simulate_devices(1 << 30)
        print(_core.arena_default())
        print(_core.device_backing(0))           # no heap yet
        _core.use_arena(False)
        _core.device_heap(0)
        print(_core.device_backing(0))
        _core.use_arena(None)
        _core.device_heap(1)
        print(_core.device_backing(1))
        print(_core.device_backing(0))           # kept what it was created with
        print(_core.device_backing(64))
    """)
    assert lines[0] == "True"
    assert lines[1] == "None"
    assert lines[2] == "segments (the arena is turned off)"
    # the simulated device's pages, where the arena is in this build
    assert lines[3] in ("arena (virtual memory, 2 MiB pages)",
                        "segments (virtual memory not supported: the simulated device has no pages)")
    assert lines[4] == "segments (the arena is turned off)"
    assert lines[5] == "None"


def test_install_reads_the_environment_and_refuses_bad_values(monkeypatch):
    monkeypatch.delenv(_torch.ENV_ARENA, raising=False)
    assert _torch._parse_arena(None) is None
    assert _torch._parse_arena(True) is True and _torch._parse_arena(False) is False
    for text, want in (("1", True), ("0", False), ("", None)):
        monkeypatch.setenv(_torch.ENV_ARENA, text)
        assert _torch._parse_arena(None) is want
    assert _torch._parse_arena(False) is False           # the argument wins
    for text in ("yes", "true", " 1", "2"):
        monkeypatch.setenv(_torch.ENV_ARENA, text)
        with pytest.raises(ValueError, match=f"^VRAMGUARD_ARENA must be 1 \\(the arena\\) or 0 "
                                             f"\\(segments\\), got {text!r}$"):
            _torch._parse_arena(None)
    for bad in (1, "1", 0.0):
        with pytest.raises(ValueError, match="^arena must be True \\(the arena\\), False \\(segments\\) "
                                             "or None \\(the default\\), got "):
            _torch._parse_arena(bad)
