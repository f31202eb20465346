"""Running a snippet with the real PyTorch on the fake CUDA (csrc/phantom),
in a fresh interpreter: an allocator cannot be swapped once used, and the
fake's devices are configured from the environment when CUDA starts.

    out = run('''
        vramguard.install(budget="64MiB")
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        out["allocated"] = torch.cuda.memory_allocated()
    ''')
    assert out["allocated"] == MiB

The snippet fills the dict `out`, which comes back as JSON. It starts with
torch, vramguard, `fake` (the fake's C knobs through ctypes: fail_malloc,
set_sticky_error, bytes_in_use, malloc_calls, ...), MiB and GiB, and two
helpers: error(fn, *args) -> None or [exception type name, first line of
its message], and heap(device=0) -> vramguard's stats of a device.
"""
import json
import os
import subprocess
import sys
import textwrap

from hookrun import SHARED_CACHE  # the out-of-memory shim, built once for every script
from summary_rows import summary_rows  # noqa: F401 (the tests read the summary's rows through here)
from test_fakecuda_torch import PRELUDE as FAKE_PRELUDE, preload

MiB = 1 << 20
GiB = 1 << 30
MARK = "@@fakegpu-out@@"

# The fake's knobs (test_fakecuda_torch.PRELUDE), then what every script here uses.
PRELUDE = FAKE_PRELUDE + """
import json, warnings
import vramguard
out = {}

def error(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except BaseException as e:
        lines = str(e).splitlines()
        return [type(e).__name__, lines[0] if lines else ""]
    return None

def heap(device=0):
    return vramguard._core.device_heap(device).stats()
"""

EPILOGUE = """
print(%r + json.dumps(out, default=repr))
""" % MARK


def run(*code, devices=2, mem="1GiB,512MiB", **env):
    """Runs PRELUDE + code + EPILOGUE on the fake in a fresh interpreter and
    returns `out`. code: one or more snippets, each dedented, run one after
    the other. devices, mem: the fake's VG_FAKECUDA_DEVICES and
    VG_FAKECUDA_MEM; env: more of the environment (a value of None removes
    the variable). VRAMGUARD_* and PYTORCH_CUDA_ALLOC_CONF are cleared
    unless given; the shim's cache is hookrun's."""
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith("VRAMGUARD_") and k != "PYTORCH_CUDA_ALLOC_CONF"}
    full_env.update(LD_PRELOAD=preload(), VG_FAKECUDA_DEVICES=str(devices), VG_FAKECUDA_MEM=mem,
                    PYTHONUNBUFFERED="1", PYTHONWARNINGS="default", XDG_CACHE_HOME=str(SHARED_CACHE))
    for key, value in env.items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    script = PRELUDE + "".join(textwrap.dedent(part) + "\n" for part in code) + EPILOGUE
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=full_env, timeout=300)
    assert proc.returncode == 0, "exit %d\n%s%s" % (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    assert lines, "no output\n%s%s" % (proc.stdout, proc.stderr)
    result = json.loads(lines[-1][len(MARK):])
    result["_stderr"] = proc.stderr
    return result

