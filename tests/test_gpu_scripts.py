"""The GPU scripts' shared build step (tests/gpu/build.sh), without a GPU:
a failed build falls back to a carried extension, or stops and says why."""
import subprocess
from pathlib import Path

import pytest

BUILD_SH = Path(__file__).resolve().parent / "gpu" / "build.sh"


def vg_build(cwd, py, *log):
    script = f'. "{BUILD_SH}"; vg_build {" ".join(log)}'
    return subprocess.run(["bash", "-c", script], cwd=cwd, env={"PY": py, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)


@pytest.mark.parametrize("log", [(), ("build.log",)])
def test_a_failed_build_uses_the_carried_extension(tmp_path, log):
    so = tmp_path / "python" / "vramguard" / "_core.abi3.so"
    so.parent.mkdir(parents=True)
    so.write_bytes(b"carried")
    r = vg_build(tmp_path, "false", *log)
    assert r.returncode == 0 and "using the carried python/vramguard/_core.abi3.so" in r.stdout
    assert so.read_bytes() == b"carried"


def test_a_failed_build_with_nothing_carried_stops(tmp_path):
    r = vg_build(tmp_path, "false", "build.log")
    assert r.returncode == 1 and "no python/vramguard/_core.abi3.so was carried" in r.stderr


def test_a_build_that_works_says_nothing_more(tmp_path):
    r = vg_build(tmp_path, "true", "build.log")
    assert r.returncode == 0 and r.stdout == "" and (tmp_path / "build.log").exists()
