"""Skipping a test where the installed PyTorch lacks what it calls.

The tier runs on two PyTorch versions (tests/torch-requirements.txt and
tests/torch-cu12-requirements.txt). A test that calls something only the
newer one has starts with

    need("torch.accelerator.memory_stats")

which skips it, naming what is missing, where that PyTorch does not have it.
It asks PyTorch itself, by the dotted name (attributes, and submodules
imported as found), never its version string, so a backport or a removal is
followed as it is. The answer comes from a fresh interpreter (importing torch
here would load its CUDA libraries into pytest's process), once per name.
"""
import functools
import json
import subprocess
import sys

import pytest

PROBE = r"""
import importlib, json, sys
import torch
name = sys.argv[1]
parts = name.split(".")
obj, path, found = torch, "torch", parts[0] == "torch"
for part in parts[1:]:
    if not found:
        break
    path += "." + part
    if hasattr(obj, part):
        obj = getattr(obj, part)
        continue
    try:
        obj = importlib.import_module(path)
    except ImportError:
        found = False
print(json.dumps({"found": found, "version": torch.__version__}))
"""


@functools.lru_cache(maxsize=None)
def probe(name):
    """(whether the installed PyTorch has `name`, its version)."""
    proc = subprocess.run([sys.executable, "-c", PROBE, name], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, "probing %s: exit %d\n%s" % (name, proc.returncode, proc.stderr)
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    return answer["found"], answer["version"]


def has(name):
    """Whether the installed PyTorch has `name` (a dotted name from torch)."""
    return probe(name)[0]


def need(*names):
    """Skips the calling test unless the installed PyTorch has every name."""
    for name in names:
        found, version = probe(name)
        if not found:
            pytest.skip("PyTorch %s has no %s" % (version, name))


def version():
    """The installed PyTorch's version."""
    return probe("torch")[1]


def lacking(what):
    """Skips the calling test: the installed PyTorch does not do `what`,
    which the test has just observed (for a behaviour no name shows)."""
    pytest.skip("PyTorch %s %s" % (version(), what))


CAPTURE_PROBE = r"""
import json
import torch
x = torch.empty(1, device="cuda")
before = torch.cuda.memory_stats()["allocation.all.current"]
g, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
with torch.cuda.stream(side):
    g.capture_begin()
    y = torch.empty(1000, device="cuda")         # the one allocation in the graph's pool
    g.capture_end()
stats = torch.cuda.memory_stats()
print(json.dumps({"outside": stats["allocation.all.current"] - before - 1,
                  "pool_keys": any(k.startswith("reserved_bytes_by_private_pools") for k in stats)}))
"""


@functools.lru_cache(maxsize=None)
def capture_probe():
    """What an empty graph capture does under PyTorch's own allocator, on
    the fake (preloaded as the tier's tests are): how many allocations of
    PyTorch's own it leaves outside the graph's pool while the graph lives,
    and whether memory_stats() reports private pools."""
    import os
    from test_fakecuda_torch import preload
    env = dict(os.environ, LD_PRELOAD=preload(), VG_FAKECUDA_DEVICES="1", VG_FAKECUDA_MEM="1GiB")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    proc = subprocess.run([sys.executable, "-c", CAPTURE_PROBE], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, "capture probe: exit %d\n%s" % (proc.returncode, proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def need_capture_inside_pool():
    """Skips the calling test where PyTorch's capture allocates tensors of
    its own outside the graph's pool (the test counts the device heap)."""
    outside = capture_probe()["outside"]
    if outside:
        lacking("keeps %d allocation(s) of its own outside a CUDA graph's pool while the graph "
                "lives (made at capture begin); the test counts the device heap exactly" % outside)


def need_private_pool_stats():
    """Skips the calling test where PyTorch's own memory_stats() has no
    reserved_bytes_by_private_pools keys."""
    if not capture_probe()["pool_keys"]:
        lacking("has no reserved_bytes_by_private_pools keys in its own allocator's memory_stats()")
