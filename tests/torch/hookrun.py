"""Scripts for the hook tests (test_hooks.py, test_graph_pools.py,
test_oom_shim.py): each runs in a fresh interpreter with the real PyTorch
on the fake CUDA (two devices, 1 GiB and 512 MiB), with vramguard and the
fake's counters at hand, and reports `name=value` lines (Python literals)
through out()."""
import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from test_fakecuda_torch import preload

ROOT = Path(__file__).resolve().parents[2]
# The out-of-memory shim's cache for the tests that do not test it: built
# once, then reused by every script (a new torch gets a new file).
SHARED_CACHE = ROOT / "build" / "torch-test-cache"

PRELUDE = """
import ctypes, gc, sys, threading, warnings
import torch, vramguard
from vramguard import _core
fake = ctypes.CDLL(None)
if not hasattr(fake, "vg_fakecuda_reset"):
    sys.exit("the fake CUDA is not preloaded")
for name in ("bytes_in_use",):
    getattr(fake, "vg_fakecuda_" + name).restype = ctypes.c_longlong
fake.vg_fakecuda_calls.restype = ctypes.c_long
fake.vg_fakecuda_calls.argtypes = [ctypes.c_char_p]
MiB, GiB = 1 << 20, 1 << 30

def out(name, value):
    print("%s=%r" % (name, value), flush=True)

def calls(api):
    return fake.vg_fakecuda_calls(api.encode())

def pools():
    return [(p["device"], p["id"], p["use_count"], p["begun"], p["released"],
             p["stats"]["allocation.all.current"]) for p in _core.private_pools()]

def heap(device=0, key="allocation.all.current"):
    return vramguard.stats(device)[key]
"""


def run(code, cache=None, expect_rc=0, **env):
    """Runs PRELUDE + code; returns (the out() values as a dict, stderr)."""
    full_env = dict(os.environ, LD_PRELOAD=preload(), VG_FAKECUDA_DEVICES="2",
                    VG_FAKECUDA_MEM="1GiB,512MiB", PYTHONUNBUFFERED="1",
                    XDG_CACHE_HOME=str(cache or SHARED_CACHE))
    for name in list(full_env):   # the caller's settings are not the test's
        if name in ("PYTORCH_CUDA_ALLOC_CONF", "CXX") or name.startswith("VRAMGUARD_"):
            full_env.pop(name)
    full_env.update(env)
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                          capture_output=True, text=True, env=full_env, timeout=300)
    assert proc.returncode == expect_rc, "exit %d\n%s%s" % (proc.returncode, proc.stdout, proc.stderr)
    values = {}
    for line in proc.stdout.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.isidentifier():
            values[name] = ast.literal_eval(value)
    return values, proc.stderr
