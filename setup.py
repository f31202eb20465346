"""Build of vramguard._core: one shared object, stable ABI (abi3, CPython 3.9+).

The build needs only a C compiler and Python's headers: no CUDA toolkit, no
PyTorch. VRAMGUARD_WERROR=1 turns warnings into errors (the test command and
CI set it).
"""
import os

from setuptools import Extension, setup

CORE = [
    "bins.c", "addr_map.c", "heap.c", "policy.c", "policy_torch.c", "stats.c",
    "check.c", "trace.c", "device_sim.c", "oom_message.c", "replay.c",
]
PYTHON = ["pymodule.c", "py_heap.c", "py_convert.c", "py_replay.c"]

warnings = ["-Wall", "-Wextra"]
if os.environ.get("VRAMGUARD_WERROR") == "1":
    warnings.append("-Werror")


setup(
    ext_modules=[
        Extension(
            "vramguard._core",
            sources=[os.path.join("csrc", f) for f in CORE + PYTHON],
            include_dirs=["csrc"],
            define_macros=[("Py_LIMITED_API", "0x03090000"), ("_GNU_SOURCE", None)],
            extra_compile_args=["-std=c11", "-O2"] + warnings,
            py_limited_api=True,
        )
    ],
    # Tag the wheel abi3 so one wheel serves every CPython from 3.9 on.
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
