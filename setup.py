"""Build of vramguard._core: one shared object, stable ABI (abi3, CPython 3.9+).

It holds the allocator core, the Python types, and the entry points PyTorch's
pluggable allocator calls. The build needs only a C and C++ compiler and
Python's headers: no CUDA toolkit (the runtime is found when first used) and
no PyTorch. VRAMGUARD_WERROR=1 turns warnings into errors (the test command
and CI set it).

The phantom GPU's sources (csrc/phantom: C, headers, generators, the
builder) travel in the package as vramguard/_phantom_src, built on the
user's machine on first use (vramguard.phantom.gpu), for the PyTorch there.
"""
import os
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

import glob

# Every layer of csrc/ goes into the one shared object: core, replays,
# device providers, the Python types, and the torch entry points.
SOURCES = sorted(
    glob.glob("csrc/core/*.c") + glob.glob("csrc/replay/*.c") + glob.glob("csrc/device/*.c")
    + glob.glob("csrc/python/*.c") + glob.glob("csrc/torch/*.cc")
)

WARNINGS = ["-Wall", "-Wextra"] + (["-Werror"] if os.environ.get("VRAMGUARD_WERROR") == "1" else [])
C_FLAGS = ["-std=c11", "-O2"] + WARNINGS
CXX_FLAGS = ["-std=c++17", "-O2"] + WARNINGS


def _jobs():
    """Compiles at once: VRAMGUARD_BUILD_JOBS, else the CPUs this process may use."""
    given = os.environ.get("VRAMGUARD_BUILD_JOBS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class build_ext_per_language(build_ext):
    """setuptools gives every source the same flags; C and C++ need their own.
    And it compiles one source at a time: here every CPU compiles (the
    sources are independent; the link waits for all of them)."""

    def build_extension(self, ext):
        compiler = self.compiler
        compile_one, compile_all = compiler._compile, compiler.compile

        def compile_with_language_flags(obj, src, ext_name, cc_args, extra_postargs, pp_opts):
            flags = CXX_FLAGS if src.endswith(".cc") else C_FLAGS
            compile_one(obj, src, ext_name, cc_args, list(extra_postargs) + flags, pp_opts)

        def compile_in_parallel(sources, output_dir=None, macros=None, include_dirs=None, debug=False,
                                extra_preargs=None, extra_postargs=None, depends=None):
            # distutils' CCompiler.compile, its loop over the objects run by a pool
            macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs)
            cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
            todo = [(obj, build[obj]) for obj in objects if obj in build]
            with ThreadPoolExecutor(max_workers=_jobs()) as pool:
                for done in [pool.submit(compiler._compile, obj, src, ext_name, cc_args, extra_postargs, pp_opts)
                             for obj, (src, ext_name) in todo]:
                    done.result()  # the first failure, as the serial loop would raise it
            return objects

        compiler._compile, compiler.compile = compile_with_language_flags, compile_in_parallel
        try:
            super().build_extension(ext)
        finally:
            compiler._compile, compiler.compile = compile_one, compile_all


# What vramguard.phantom.gpu needs to build the phantom: everything in
# csrc/phantom but the make rules and the C test (which the C tests' harness
# builds from a checkout).
PHANTOM_SRC = "csrc/phantom"
PHANTOM_FILES = sorted(
    p for p in glob.glob(PHANTOM_SRC + "/**/*", recursive=True)
    if os.path.isfile(p) and p.endswith((".c", ".h", ".py", ".map", ".md"))
    and not os.path.basename(p).startswith("test_") and "__pycache__" not in p
)


class build_py_with_phantom(build_py):
    """build_py, and csrc/phantom copied to vramguard/_phantom_src. Not in
    an editable install: there vramguard.phantom.gpu finds csrc/phantom itself."""

    def _phantom_outputs(self):
        target = os.path.join(self.build_lib, "vramguard", "_phantom_src")
        return [(p, os.path.join(target, os.path.relpath(p, PHANTOM_SRC))) for p in PHANTOM_FILES]

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        if not any(p.endswith("/build.py") for p in PHANTOM_FILES):
            raise SystemExit("setup.py: %s/build.py is missing: the phantom GPU cannot ship" % PHANTOM_SRC)
        for source, target in self._phantom_outputs():
            self.mkpath(os.path.dirname(target))
            self.copy_file(source, target, preserve_mode=False)

    def get_outputs(self, include_bytecode=1):
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        return outputs + [target for _, target in self._phantom_outputs()]


setup(
    ext_modules=[
        Extension(
            "vramguard._core",
            sources=SOURCES,
            include_dirs=["include", "csrc/core"],
            define_macros=[("Py_LIMITED_API", "0x03090000"), ("_GNU_SOURCE", None)],
            libraries=["dl", "pthread"],
            language="c++",  # link with the C++ driver: the entry points throw
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": build_ext_per_language, "build_py": build_py_with_phantom},
    # Tag the wheel abi3 so one wheel serves every CPython from 3.9 on.
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
