"""torch.OutOfMemoryError from vramguard, through the shim install() builds
against the installed torch (python/vramguard/torch/oom_shim.py), and the
RuntimeError it falls back on. Each test has a cache directory of its own
(XDG_CACHE_HOME), so that whether a build happens is the test's to say."""
import os
import subprocess
import sys
import textwrap

import pytest

from hookrun import PRELUDE, run
from test_fakecuda_torch import preload

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

OOM = """
vramguard.install()
shim = vramguard.torch.install.install_state["hooks"]["oom_shim"]
out("built", shim.built)
out("seconds", round(shim.seconds, 4))
out("reason", shim.reason)
x = torch.empty(1000, device="cuda")
try:
    torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")   # a real op, more than the 1 GiB
except torch.OutOfMemoryError as e:
    out("caught_as", "torch.OutOfMemoryError")
    out("is_runtime_error", isinstance(e, RuntimeError))
    out("args", len(e.args))
    out("head", str(e).splitlines()[0][:48])
    out("explained", "vramguard" in str(e))
    out("is_oom", vramguard.is_oom(e))
except RuntimeError as e:
    out("caught_as", "RuntimeError")
    out("head", str(e).splitlines()[0][:48])
y = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")   # the process goes on
out("allocated", heap(0, "allocated_bytes.all.current"))
"""


def files(cache):
    folder = cache / "vramguard"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_oom_is_torch_out_of_memory_error_and_the_shim_is_cached(tmp_path):
    first, _ = run(OOM, cache=tmp_path)
    assert first["built"] is True
    assert first["reason"] is None
    assert first["caught_as"] == "torch.OutOfMemoryError"
    assert first["is_runtime_error"] is True
    assert first["args"] == 1
    assert first["head"] == "CUDA out of memory. Tried to allocate 2.00 GiB. "
    assert first["explained"] is True
    assert first["is_oom"] is True
    assert first["allocated"] == 4096 + 100 * (1 << 20)
    (name,) = files(tmp_path)
    assert name.startswith("oom_shim-torch") and name.endswith(".so")
    # The second install loads the cached file and builds nothing: without
    # a compiler at all, it still gets torch.OutOfMemoryError.
    second, stderr = run(OOM, cache=tmp_path, CXX="/nonexistent")
    assert second["built"] is False
    assert second["caught_as"] == "torch.OutOfMemoryError"
    assert "RuntimeError, not torch.OutOfMemoryError" not in stderr
    assert files(tmp_path) == [name]
    print(f"shim: first install {first['seconds']} s (built), second {second['seconds']} s (cached)")


@pytest.mark.parametrize("how", ["CXX", "PATH"])
def test_no_compiler_falls_back_to_runtime_error(tmp_path, how):
    cache = tmp_path / "cache"
    if how == "CXX":
        env = {"CXX": "/nonexistent"}
        why = "CXX=/nonexistent is not a command on this machine"
    else:
        empty = tmp_path / "bin"
        empty.mkdir()
        env = {"PATH": str(empty)}
        why = "no C++ compiler (c++, g++ or clang++) on PATH"
    v, stderr = run(OOM, cache=cache, **env)
    assert v["built"] is False
    assert v["reason"] == why
    assert v["caught_as"] == "RuntimeError"
    assert v["head"] == "CUDA out of memory. Tried to allocate 2.00 GiB. "
    notes = [line for line in stderr.splitlines() if "vramguard: out-of-memory errors" in line]
    assert len(notes) == 1
    assert notes[0].endswith(f"RuntimeWarning: vramguard: out-of-memory errors will be RuntimeError, "
                             f"not torch.OutOfMemoryError: {why}. Set VRAMGUARD_OOM_ERROR=runtime "
                             f"to skip this step.")
    assert files(cache) == []


def test_failed_build_leaves_nothing_behind(tmp_path):
    v, stderr = run(OOM, cache=tmp_path, CXX="false")
    assert v["reason"] == "the C++ build failed (exit 1)"
    assert v["caught_as"] == "RuntimeError"
    assert files(tmp_path) == []


@pytest.mark.parametrize("how", ["env", "argument"])
def test_runtime_mode_skips_the_build(tmp_path, how):
    code = OOM.replace("vramguard.install()", "vramguard.install(oom_error='runtime')")
    if how == "env":
        v, stderr = run(OOM, cache=tmp_path, VRAMGUARD_OOM_ERROR="runtime")
    else:
        v, stderr = run(code, cache=tmp_path)
    assert v["built"] is False
    assert v["caught_as"] == "RuntimeError"
    assert "vramguard: out-of-memory errors" not in stderr   # asked for: no note
    assert files(tmp_path) == []


def test_bad_oom_error_value(tmp_path):
    v, _ = run("""
        for kwargs, env in (({"oom_error": "always"}, None), ({}, "sometimes")):
            import os
            if env:
                os.environ["VRAMGUARD_OOM_ERROR"] = env
            try:
                vramguard.install(**kwargs)
            except ValueError as e:
                out("error_" + (env or "arg"), str(e))
        out("installed", vramguard.is_installed())
    """, cache=tmp_path)
    assert v["error_arg"] == "oom_error (or VRAMGUARD_OOM_ERROR) must be 'auto' or 'runtime', got 'always'"
    assert v["error_sometimes"] == ("oom_error (or VRAMGUARD_OOM_ERROR) must be 'auto' or 'runtime', "
                                    "got 'sometimes'")
    assert v["installed"] is False


def test_concurrent_first_installs_share_one_file(tmp_path):
    """Two processes building at once: each renames a whole file into place,
    both load a complete shim, and no temporary file is left."""
    env = dict(os.environ, LD_PRELOAD=preload(), VG_FAKECUDA_DEVICES="2",
               VG_FAKECUDA_MEM="1GiB,512MiB", XDG_CACHE_HOME=str(tmp_path))
    env.pop("CXX", None)
    env.pop("VRAMGUARD_OOM_ERROR", None)
    script = PRELUDE + textwrap.dedent(OOM)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (stdout, stderr) in zip(procs, outputs):
        assert p.returncode == 0, stderr
        assert "caught_as='torch.OutOfMemoryError'" in stdout
    assert len(files(tmp_path)) == 1
