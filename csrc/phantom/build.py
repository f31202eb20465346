"""Builds the phantom GPU's libraries (csrc/phantom/README.md): the fake CUDA
runtime, driver and NVML, for the CUDA major of an installed PyTorch, with
nothing but a C compiler, nm and the headers of the `nvidia` runtime wheel
PyTorch depends on.

One builder for the Makefile and the package:

    python csrc/phantom/build.py --out build/fakecuda   # make fakecuda runs this
    python csrc/phantom/build.py                        # the per-user cache; prints LD_PRELOAD

and, imported, `build(out)` and `build_cached(cache_root)`, which is what
vramguard.phantom.gpu.preload() calls on first use (from the package's copy of
this directory, vramguard/_phantom_src, or from the repository's).

The libraries are one table, LIBRARIES: a soname, hand-written sources, the
steps that generate the rest (stubs and version scripts that follow the real
library, run as `python <script> <args>`), and what each links against. A
new library is one entry.

A build is keyed by a hash of everything it reads (the table's sources, the
headers, the generators, this file, the compiler's identity, the flags, the
CUDA headers and runtime it follows): an output whose build.json carries
the same key is reused and no compiler runs. A build happens in a temporary
directory beside the output, renamed into place when complete, under a file
lock: an interrupted build leaves nothing, and concurrent first uses make
one build and share it.

Runs on Python 3.9+ with the standard library only; Linux only.
"""
import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple, Tuple

SRC = Path(__file__).resolve().parent
FORMAT = 1  # bump when the layout of an output directory changes

CFLAGS = ["-O2", "-g", "-fPIC", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror",
          "-Wshadow", "-Wstrict-prototypes", "-Wmissing-prototypes"]
GENERATED_CFLAGS = ["-Wno-missing-prototypes"]  # generated stubs declare as they define


class BuildError(Exception):
    """The phantom cannot be built here; str() is one line that says why.
    `log` holds a failed command's full output, when there was one."""

    def __init__(self, message, log=""):
        super().__init__(message)
        self.log = log


# ---- the table -------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """A generator run before a library is linked: `python <script> <args>`,
    `script` in this directory. Each argument is a template (str.format):

        {src} {gen}      this directory; where generated files go
        {cuda_inc}       the runtime wheel's include directory
        {cudart}         the real libcudart.so.N
        {major}          its CUDA major
        {cudart_so}      its soname's version: 11.0 for CUDA 11, else the major
        {cc}             the C compiler command, one string
        {W.include}      the include directory of the wheel named W in WHEELS
        {W.lib[libfoo]}  its real libfoo.so.N
        {objects}        (an argument by itself) the library's compiled
                         hand-written objects, one argument each

    `compile`: the C files it writes into {gen}, compiled into the library."""
    script: str
    args: Tuple[str, ...]
    compile: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Library:
    """One library: `soname` (a template, {major}), its hand-written
    `sources` (names of .c files here, without .c), the `steps` that
    generate the rest, its `version_script` (a template: {src} or {gen}),
    the sonames it `needs` (built first, linked, found beside it through
    $ORIGIN), system `libs`, the `wheels` it follows besides the runtime's
    (names in WHEELS: without one of them, or without a library it needs,
    it is left out of the build), and `cflags` of its own (for its sources,
    hand-written and generated)."""
    soname: str
    sources: Tuple[str, ...]
    version_script: str
    steps: Tuple[Step, ...] = ()
    needs: Tuple[str, ...] = ()
    libs: Tuple[str, ...] = ()
    wheels: Tuple[str, ...] = ()
    cflags: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Wheel:
    """An nvidia wheel that libraries follow besides the runtime's: found
    beside PyTorch's (a directory nvidia/`dirs`/ whose lib/ has each of
    `libs` and whose include/ has each of `headers`), or where $`env` says
    (an unpacked wheel's nvidia/... directory, or one of its libraries;
    there a missing file is an error). Its libraries are .so.<the CUDA
    major>, or with `own_major` .so.<its own> (cuDNN's 9). Its include
    directory is searched by every compile; in the table it is {NAME.include},
    {NAME.lib[libfoo]}, {NAME.major}; cuda.mk names them NAME_INC,
    FOO_LIB, NAME_MAJOR (CUBLAS_INC, CUBLASLT_LIB, CUDNN_MAJOR), empty
    when the wheel is not there."""
    name: str
    libs: Tuple[str, ...]
    headers: Tuple[str, ...]
    env: str
    dirs: str = "*"
    own_major: bool = False


WHEELS = (
    Wheel("cublas", libs=("libcublas", "libcublasLt"), headers=("cublas_api.h", "cublasLt.h"),
          env="VG_FAKECUDA_CUBLAS"),
    Wheel("cudnn", libs=("libcudnn",), headers=("cudnn.h",), env="VG_FAKECUDA_CUDNN",
          dirs="cudnn", own_major=True),
    Wheel("nccl", libs=("libnccl",), headers=("nccl.h",), env="VG_FAKECUDA_NCCL", dirs="nccl", own_major=True),
)


CORE = ("core_devices", "core_attrs", "core_memory", "core_knobs", "core_errors", "core_exit", "core_work")

# In LD_PRELOAD's order; each is built after the libraries it needs.
LIBRARIES = (
    # The runtime: stubs and version script follow the real libcudart.so.N.
    # It sits on the fake driver, found beside it ($ORIGIN) when preloaded.
    Library(
        soname="libcudart.so.{cudart_so}",
        sources=("rt_errors", "rt_device", "rt_memory", "rt_stream", "rt_graph", "rt_module", "rt_fatbin", "rt_launch"),
        steps=(Step("gen_fakecuda.py", ("runtime", "--cudart", "{cudart}", "--stubs", "{gen}/rt_stubs_gen.c",
                                        "--map", "{gen}/libcudart.map", "{objects}"),
                    compile=("rt_stubs_gen.c",)),),
        version_script="{gen}/libcudart.map",
        needs=("libcuda.so.1",),
        libs=("-lpthread",),
    ),
    # The driver, which owns the fake device: its stubs, version script and
    # cuGetProcAddress table follow cuda.h; the error names both headers.
    Library(
        soname="libcuda.so.1",
        sources=CORE + ("drv_device", "drv_context", "drv_memory", "drv_vmm", "drv_module", "drv_entry",
                                "drv_legacy"),
        steps=(Step("gen_fakecuda.py", ("errors", "--include", "{cuda_inc}", "--out", "{gen}/errors_gen.c"),
                    compile=("errors_gen.c",)),
               Step("gen_fakecuda.py", ("driver", "--include", "{cuda_inc}", "--cc", "{cc}",
                                        "--stubs", "{gen}/drv_stubs_gen.c", "--procs", "{gen}/procs_gen.c",
                                        "--map", "{gen}/libcuda.map", "{objects}"),
                    compile=("procs_gen.c", "drv_stubs_gen.c"))),
        version_script="{gen}/libcuda.map",
        libs=("-lpthread", "-ldl"),
    ),
    # NVML: without it PyTorch's expandable segments crash (see nvml.c).
    Library(
        soname="libnvidia-ml.so.1",
        sources=("nvml",),
        version_script="{src}/libnvidia-ml.map",
        needs=("libcuda.so.1",),
    ),
    # cuBLAS and cuBLASLt (README.md, "cuBLAS"), when PyTorch has the cuBLAS
    # wheel: stubs and version scripts follow the real libraries, cuBLASLt's
    # attribute sizes follow cublasLt.h. Both sit on the fake runtime and
    # driver.
    Library(
        soname="libcublas.so.{major}",
        sources=("cublas", "cublas_blas", "cublas_common"),
        wheels=("cublas",),
        steps=(Step("gen_cublas.py", ("library", "--real", "{cublas.lib[libcublas]}",
                                      "--stubs", "{gen}/cublas_stubs_gen.c", "--map", "{gen}/libcublas.map",
                                      "{objects}"),
                    compile=("cublas_stubs_gen.c",)),),
        version_script="{gen}/libcublas.map",
        needs=("libcudart.so.{cudart_so}", "libcuda.so.1"),
    ),
    Library(
        soname="libcublasLt.so.{major}",
        sources=("cublaslt", "cublas_common"),
        wheels=("cublas",),
        steps=(Step("gen_cublas.py", ("attrs", "--include", "{cublas.include}", "--out", "{gen}/cublaslt_attrs_gen.c"),
                    compile=("cublaslt_attrs_gen.c",)),
               Step("gen_cublas.py", ("library", "--real", "{cublas.lib[libcublasLt]}",
                                      "--stubs", "{gen}/cublaslt_stubs_gen.c", "--map", "{gen}/libcublasLt.map",
                                      "{objects}"),
                    compile=("cublaslt_stubs_gen.c",))),
        version_script="{gen}/libcublasLt.map",
        needs=("libcudart.so.{cudart_so}", "libcuda.so.1"),
    ),
    # cuDNN (README.md, "cuDNN"), when PyTorch has the cuDNN wheel, at its
    # own major: stubs, version script and status names follow the real
    # library and cudnn_graph.h. cuDNN 9 marks deprecated the legacy API
    # PyTorch still calls.
    Library(
        soname="libcudnn.so.{cudnn.major}",
        sources=("cudnn_handle", "cudnn_legacy_desc", "cudnn_legacy_ops", "cudnn_backend", "cudnn_execute",
                 "cudnn_rnn"),
        wheels=("cudnn",),
        cflags=("-Wno-deprecated-declarations",),
        steps=(Step("gen_fakecuda.py", ("cudnn", "--lib", "{cudnn.lib[libcudnn]}", "--include", "{cudnn.include}",
                                        "--stubs", "{gen}/cudnn_stubs_gen.c", "--status", "{gen}/cudnn_status_gen.c",
                                        "--map", "{gen}/libcudnn.map", "{objects}"),
                    compile=("cudnn_stubs_gen.c", "cudnn_status_gen.c")),),
        version_script="{gen}/libcudnn.map",
        needs=("libcuda.so.1",),
        libs=("-lpthread",),
    ),
    # NCCL (README.md, "NCCL"), when PyTorch has the NCCL wheel, at its own
    # major: communicators and collectives that complete at once and move
    # nothing. Stubs and version script follow the real library and its
    # headers; it sits on the fake runtime (ncclMemAlloc is cudaMalloc) and
    # driver.
    Library(
        soname="libnccl.so.{nccl.major}",
        sources=("nccl_comm", "nccl_coll"),
        wheels=("nccl",),
        steps=(Step("nccl_gen.py", ("library", "--real", "{nccl.lib[libnccl]}", "--include", "{nccl.include}",
                                    "--stubs", "{gen}/nccl_stubs_gen.c", "--map", "{gen}/libnccl.map",
                                    "{objects}"),
                    compile=("nccl_stubs_gen.c",)),),
        version_script="{gen}/libnccl.map",
        needs=("libcudart.so.{cudart_so}", "libcuda.so.1"),
        libs=("-lpthread",),
    ),
)


# ---- what to build for -----------------------------------------------------

class Found(NamedTuple):
    """A wheel of WHEELS, found: its `include` directory, `lib` (each
    library's name -> its libNAME.so.N) and `major` (that N)."""
    include: Path
    lib: dict
    major: str


class _Missing:
    """What a wheel that is not there formats as, in a left-out library's
    name."""
    include, lib, major = "", {}, "N"


class Cuda(NamedTuple):
    """The CUDA runtime a PyTorch uses: `include` (its headers), `cudart`
    (the real libcudart.so.N), `major`; `torch` is PyTorch's version ("" when
    VG_FAKECUDA_INCLUDE/VG_FAKECUDA_CUDART name the runtime and no PyTorch
    is installed); `roots`: the nvidia package's directories; `wheels`:
    each name of WHEELS -> a Found, or None."""
    include: Path
    cudart: Path
    major: str
    torch: str
    roots: Tuple[Path, ...]
    wheels: dict = {}


def _torch_version_py():
    """torch/version.py of the PyTorch this interpreter would import, or
    None. A directory named torch without an __init__.py (a namespace
    package: a project's tests/torch/ on sys.path) is not PyTorch."""
    spec = importlib.util.find_spec("torch")  # does not import torch
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "version.py"


def torch_versions():
    """(PyTorch's version, its CUDA major or None) for this interpreter,
    read from torch/version.py: importing torch takes seconds and loads the
    real CUDA runtime, which a process to be preloaded must not have done."""
    version_py = _torch_version_py()
    if version_py is None:
        raise BuildError("PyTorch is not installed for %s: the phantom GPU runs the PyTorch of the "
                         "Python that builds it" % sys.executable)
    try:
        text = version_py.read_text()
    except OSError as exc:
        raise BuildError("cannot read PyTorch's version (%s)" % exc) from None
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
    cuda = re.search(r"^cuda\b[^=]*=\s*['\"](\d+)\.", text, re.M)
    return (version.group(1) if version else "unknown"), (cuda.group(1) if cuda else None)


def _needed(path):
    """The DT_NEEDED names of the 64-bit little-endian ELF file at `path`, or
    None where it is not one, has no dynamic section, or cannot be read (then
    nothing is concluded). Every offset and size is checked against the file's
    length before it is read: a damaged file costs no more than its size."""
    try:
        with open(path, "rb") as f:
            length = os.fstat(f.fileno()).st_size

            def read(offset, size):
                if offset < 0 or size < 0 or offset + size > length:
                    raise ValueError("outside the file")
                f.seek(offset)
                return f.read(size)

            head = read(0, 64)
            if head[:4] != b"\x7fELF" or head[4:6] != b"\x02\x01":
                return None
            shoff, = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
            table = read(shoff, shentsize * shnum)
            # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, ...
            sections = [struct.unpack_from("<IIQQQQI", table, i * shentsize) for i in range(shnum)]
            for _, kind, _, _, offset, size, link in sections:
                if kind != 6:  # SHT_DYNAMIC
                    continue
                dynamic = read(offset, size)
                strings = read(sections[link][4], sections[link][5])
                needed = []
                for at in range(0, len(dynamic) - 15, 16):
                    tag, value = struct.unpack_from("<qQ", dynamic, at)
                    if tag == 0:  # DT_NULL
                        break
                    if tag == 1:  # DT_NEEDED
                        needed.append(strings[value:strings.index(b"\0", value)].decode("ascii", "replace"))
                return needed
    except (OSError, struct.error, ValueError, IndexError):
        return None
    return None


def _runtime_linked_in(torch):
    """A BuildError where this PyTorch carries CUDA's runtime linked into
    libc10_cuda.so (pip's 1.12 and 1.13): that runtime reaches the driver
    through tables no public header describes, and its functions are not
    exported, so no stand-in for libcudart.so can answer them. None where the
    library needs a libcudart (the shared one, or a private copy, about which
    nothing is concluded here), or cannot be read."""
    lib = _torch_version_py().parent / "lib" / "libc10_cuda.so"
    needed = _needed(lib) if lib.is_file() else None
    if needed is None or any(n.startswith("libcudart") for n in needed):
        return None
    return BuildError("PyTorch %s has CUDA's runtime linked into %s (it loads no libcudart): the phantom GPU "
                      "stands in for the runtime's shared library, so it cannot run this PyTorch; pip's "
                      "PyTorch 2.0 and later load the shared one" % (torch, lib))


def _nvidia_roots():
    spec = importlib.util.find_spec("nvidia")
    return tuple(Path(p) for p in spec.submodule_search_locations) if spec and spec.submodule_search_locations else ()


def find_cuda(environ=None):
    """The CUDA runtime the installed PyTorch uses: pip's nvidia wheels
    beside it (nvidia/cu13 for CUDA 13, nvidia/cuda_runtime for CUDA 12).
    VG_FAKECUDA_INCLUDE and VG_FAKECUDA_CUDART, set together, name another
    runtime instead (another wheel's, unpacked anywhere)."""
    env = os.environ if environ is None else environ
    inc, lib = env.get("VG_FAKECUDA_INCLUDE"), env.get("VG_FAKECUDA_CUDART")
    roots = _nvidia_roots()
    if inc or lib:
        if not (inc and lib):
            raise BuildError("set VG_FAKECUDA_INCLUDE and VG_FAKECUDA_CUDART together")
        inc, lib = Path(inc), Path(lib)
        torch = torch_versions()[0] if _torch_version_py() else ""
        linked_in = _runtime_linked_in(torch) if torch else None
        if linked_in is not None:  # another runtime named: this PyTorch would still not load it
            raise linked_in
    else:
        torch, major = torch_versions()
        if major is None:
            raise BuildError("PyTorch %s is built without CUDA: the phantom GPU needs PyTorch's CUDA build "
                             "(its nvidia wheels carry the headers it is built from)" % torch)
        linked_in = _runtime_linked_in(torch)
        if linked_in is not None:
            raise linked_in
        if int(major) < 11:  # pip's PyTorch 1.4 to 1.12 are CUDA 10's (1.12's is refused above)
            raise BuildError("PyTorch %s is built for CUDA %s, whose runtime has no pip wheel (NVIDIA's start at "
                             "nvidia-cuda-runtime-cu11): the phantom GPU is built from such a wheel's headers, so "
                             "it cannot run this PyTorch; pip's PyTorch 2.0 and later can" % (torch, major))
        for root in roots:
            # CUDA 11's runtime is libcudart.so.11.0, 12's and 13's .so.12 and .so.13
            found = [p for p in sorted(root.glob("*/lib/libcudart.so.%s*" % major))
                     if re.fullmatch(r"libcudart\.so\.%s(\.0)?" % major, p.name)
                     and (p.parent.parent / "include" / "cuda_runtime_api.h").is_file()
                     and (p.parent.parent / "include" / "cuda.h").is_file()]
            if found:
                inc, lib = found[0].parent.parent / "include", found[0]
                break
        else:
            wheel = "nvidia-cuda-runtime" + ("-cu%s" % major if int(major) <= 12 else "")
            raise BuildError("no CUDA %s runtime wheel with headers under %s, which PyTorch %s needs "
                             "(pip install %s)" % (major, ", ".join(map(str, roots)) or "site-packages/nvidia",
                                                   torch, wheel))
    match = re.fullmatch(r"libcudart\.so\.(\d+)(\.0)?", lib.name)
    if not match or not lib.is_file():
        raise BuildError("%s is not a libcudart.so.N" % lib)
    if not (inc / "cuda_runtime_api.h").is_file():
        raise BuildError("%s has no cuda_runtime_api.h" % inc)
    major = match.group(1)
    wheels = {w.name: find_wheel(w, major, roots, env) for w in WHEELS}
    return Cuda(inc.resolve(), lib.resolve(), major, torch, roots, wheels)


def _wheel_in(wheel, root, major):
    """The wheel in `root` (lib/, include/), for CUDA `major`, or None."""
    if wheel.own_major:  # the first library's, which the others share
        found = sorted(p.name for p in (root / "lib").glob(wheel.libs[0] + ".so.*")
                       if re.fullmatch(re.escape(wheel.libs[0]) + r"\.so\.\d+", p.name))
        if not found:
            return None
        major = found[-1].rsplit(".", 1)[1]
    libs = {n: root / "lib" / ("%s.so.%s" % (n, major)) for n in wheel.libs}
    if all(p.is_file() for p in libs.values()) and all((root / "include" / h).is_file() for h in wheel.headers):
        return Found((root / "include").resolve(), {n: str(p.resolve()) for n, p in libs.items()}, major)
    return None


def find_wheel(wheel, major, roots, environ=None):
    """A Wheel of WHEELS for CUDA `major`: a Found, or None."""
    env = os.environ if environ is None else environ
    given = env.get(wheel.env)
    if given:
        root = Path(given)
        if root.is_file():  # one of its libraries: lib/ of the wheel
            root = root.parent.parent
        found = _wheel_in(wheel, root, major)
        if found is None:
            raise BuildError("%s=%s has no %s and include/%s" % (
                wheel.env, given, ", ".join("lib/%s.so.%s" % (n, "M" if wheel.own_major else major)
                                            for n in wheel.libs), ", include/".join(wheel.headers)))
        return found
    for root in roots:
        for lib in sorted(root.glob("%s/lib/%s.so.*" % (wheel.dirs, wheel.libs[0]))):
            found = _wheel_in(wheel, lib.parent.parent, major)
            if found:
                return found
    return None


def compiler(cc=None):
    """The C compiler command as a list: `cc` (a string, words allowed),
    else $CC, else cc."""
    given = cc if cc is not None else os.environ.get("CC")
    if given is None:  # cc, else the usual names
        words = [next((n for n in ("cc", "gcc", "clang") if shutil.which(n)), "cc")]
    else:
        words = shlex.split(given)
    path = shutil.which(words[0]) if words else None
    if path is None:
        if given is None:
            raise BuildError("the phantom GPU needs a C compiler (cc): apt-get install gcc")
        raise BuildError("the phantom GPU needs a C compiler: %s is not a command here (CC)" % given)
    if shutil.which("nm") is None:
        raise BuildError("the phantom GPU needs nm (binutils): apt-get install binutils")
    return [path] + words[1:]


# ---- the key ---------------------------------------------------------------

def _files(src):
    """Everything a build reads from `src`, relative paths: the table's
    sources and version scripts, every header, every script (the
    generators import each other)."""
    names = {p.name for p in src.glob("*.py")}
    for lib in LIBRARIES:
        names.update(s + ".c" for s in lib.sources)
        if lib.version_script.startswith("{src}/"):
            names.add(lib.version_script[len("{src}/"):])
    names.update(str(p.relative_to(src)) for p in src.rglob("*.h"))
    return sorted(names)


def _identity(path):
    st = os.stat(path)
    return "%s %d %d" % (os.path.realpath(path), st.st_size, st.st_mtime_ns)


def cache_key(cuda, cc, cflags=(), src=SRC):
    """A hash of what the output depends on: the sources, the compiler (its
    file, not its output: a cache hit runs nothing), the flags, and the CUDA
    headers and libraries it follows."""
    h = hashlib.sha256()

    def add(*parts):
        for part in parts:
            h.update(str(part).encode() + b"\0")

    add("format", FORMAT, "cc", *cc, _identity(cc[0]), "cflags", *CFLAGS, *cflags)
    add("cuda", cuda.major, cuda.include, _identity(cuda.cudart))
    for header in ("cuda.h", "cuda_runtime_api.h", "driver_types.h"):
        if (cuda.include / header).is_file():
            add(header, _identity(cuda.include / header))
    for wheel in WHEELS:
        found = cuda.wheels.get(wheel.name)
        add("wheel", wheel.name, "absent" if found is None else found.include)
        if found is not None:
            add(*(_identity(found.lib[n]) for n in wheel.libs))
            add(*(_identity(found.include / h) for h in wheel.headers))
    for name in _files(src):
        add(name, hashlib.sha256((src / name).read_bytes()).hexdigest())
    return h.hexdigest()


# ---- building --------------------------------------------------------------

class Result(NamedTuple):
    """A build's output: the directory, LD_PRELOAD's value (absolute paths,
    spaces between), whether it was `built` now (False: reused), the
    seconds it took, the key."""
    out: Path
    preload: str
    built: bool
    seconds: float
    key: str


def _run(cmd, what, cwd=None):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        text = (proc.stderr + proc.stdout).strip()
        lines = text.splitlines()
        first = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "exit %d" % proc.returncode)
        raise BuildError("%s failed: %s" % (what, first.strip()), log=" ".join(shlex.quote(str(c)) for c in cmd) + "\n" + text)
    return proc.stdout


def _order(libraries):
    """Sonames in build order: each after what it needs."""
    by_name, done = {}, []
    for lib in libraries:
        by_name[lib.soname] = lib

    def visit(name, path=()):
        if name in done:
            return
        if name not in by_name or name in path:
            raise BuildError("library table: %s needs %s, which is %s" % (
                path[-1] if path else "?", name, "a cycle" if name in path else "not in the table"))
        for need in by_name[name].needs:
            visit(need, path + (name,))
        done.append(name)

    for lib in libraries:
        visit(lib.soname)
    return [by_name[n] for n in done]


def _wheel_names(cuda):
    """Each wheel's name -> its Found, or _Missing: for str.format."""
    return {w.name: cuda.wheels.get(w.name) or _Missing() for w in WHEELS}


def cudart_so(cuda):
    """The runtime's soname version, as the real one has it: 11.0 for CUDA
    11, the major alone from CUDA 12 on."""
    return cuda.cudart.name.split(".so.", 1)[1]


def _names(cuda):
    """What the table's templates name for `cuda`: {major}, {cudart_so}, each wheel's."""
    return dict(_wheel_names(cuda), major=cuda.major, cudart_so=cudart_so(cuda))


def sonames(cuda):
    """The sonames of the table's libraries whose wheels `cuda` has."""
    ctx = _names(cuda)
    return [_format(lib.soname, ctx) for lib in LIBRARIES if all(cuda.wheels.get(w) for w in lib.wheels)]


def _present(libraries, cuda, log):
    """The libraries whose wheels are there, and whose needs are."""
    kept, names = [], set()
    for lib in _order(libraries):
        missing = [w for w in lib.wheels if cuda.wheels.get(w) is None]
        if missing or not all(n in names for n in lib.needs):
            log("  left out %s: %s" % (lib.soname, "no %s wheel" % ", ".join(missing) if missing
                                       else "it needs %s" % ", ".join(n for n in lib.needs if n not in names)))
            continue
        kept.append(lib)
        names.add(lib.soname)
    return [lib for lib in libraries if lib.soname in names]


def _format(template, ctx):
    return template.format(**ctx)


def _build_into(work, cuda, cc, cflags, src, jobs, log):
    """Builds every library of the table into `work`; returns the sonames
    in LD_PRELOAD's order."""
    obj, gen = work / "obj", work / "gen"
    obj.mkdir()
    gen.mkdir()
    base = {"src": str(src), "gen": str(gen), "cuda_inc": str(cuda.include), "cudart": str(cuda.cudart),
            "cc": " ".join(shlex.quote(w) for w in cc)}
    base.update(_names(cuda))
    libraries = _present([replace(lib, soname=_format(lib.soname, base), needs=tuple(_format(n, base) for n in lib.needs))
                          for lib in LIBRARIES], cuda, log)
    inc = []
    for d in [cuda.include] + [f.include for f in cuda.wheels.values() if f is not None]:
        if str(d) not in inc:
            inc += ["-I", str(d)]
    inc += ["-I", src / "shim", "-I", src, "-I", gen]
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))

    def compile_all(sources):
        """Compiles (path, object, flags) in parallel."""
        futures = [pool.submit(_run, cc + CFLAGS + extra + list(cflags) + inc + ["-c", s, "-o", o],
                               "compiling %s" % Path(s).name) for s, o, extra in sources]
        for f in futures:
            f.result()

    with pool:
        # Every hand-written source first, in parallel: none depends on a
        # step. A source two libraries share has the first one's flags.
        flags = {}
        for lib in libraries:
            for source in lib.sources:
                flags.setdefault(source, list(lib.cflags))
        compile_all([(src / (s + ".c"), obj / (s + ".o"), flags[s]) for s in sorted(flags)])
        for lib in _order(libraries):
            objects = [str(obj / (s + ".o")) for s in lib.sources]
            made = []
            for step in lib.steps:
                args = []
                for a in step.args:
                    args += objects if a == "{objects}" else [_format(a, base)]
                out = _run([sys.executable, src / step.script] + args, "%s %s" % (step.script, step.args[0]), cwd=work)
                for line in out.splitlines():
                    log("  " + line)
                made += [(gen / c, obj / (Path(c).stem + ".o"), GENERATED_CFLAGS + list(lib.cflags))
                         for c in step.compile]
            compile_all(made)
            link = cc + list(cflags) + ["-shared", "-o", work / lib.soname, "-Wl,-soname," + lib.soname,
                                        "-Wl,--version-script=" + _format(lib.version_script, base),
                                        "-Wl,--no-undefined"]
            if lib.needs:
                link += ["-Wl,-rpath,$ORIGIN"]
            link += objects + [str(o) for _, o, _ in made]
            link += ["-L", work] + ["-l:" + n for n in lib.needs] + list(lib.libs)
            _run(link, "linking %s" % lib.soname)
            log("  linked %s" % lib.soname)
    shutil.rmtree(obj)
    return [lib.soname for lib in libraries]


def _make_vars(cuda):
    """cuda.mk: what make's C tests are built with. A wheel that is not
    there has its variables empty."""
    lines = ["CUDA_INC := %s" % cuda.include, "CUDART_LIB := %s" % cuda.cudart, "CUDA_MAJOR := %s" % cuda.major]
    for wheel in WHEELS:
        found = cuda.wheels.get(wheel.name)
        lines.append("%s_INC := %s" % (wheel.name.upper(), found.include if found else ""))
        lines.append("%s_MAJOR := %s" % (wheel.name.upper(), found.major if found else ""))
        lines += ["%s_LIB := %s" % (n[3:].upper() if n.startswith("lib") else n.upper(), found.lib[n] if found else "")
                  for n in wheel.libs]
    return "\n".join(lines) + "\n"


def _umask():
    """The process's umask, read without setting it (os.umask would, for
    every thread of the process, for a moment)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


@contextlib.contextmanager
def _locked(path):
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.stderr.write("vramguard: waiting for another build of the phantom GPU (%s)\n" % path)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _current(out, key):
    """The preload of a complete build of `key` at `out`, else None."""
    try:
        manifest = json.loads((out / "build.json").read_text())
        preload = (out / "LD_PRELOAD").read_text().strip()
    except (OSError, ValueError):
        return None
    if manifest.get("key") != key or not all(os.path.isfile(p) for p in preload.split()):
        return None
    return preload


def _ours(out):
    """Whether the directory `out` may be replaced: empty, or a build (this
    builder's, or the make rules' before it, which wrote cuda.mk)."""
    return out.is_dir() and (not any(out.iterdir()) or any((out / n).exists() for n in ("build.json", "cuda.mk")))


def _quiet(_line):
    pass


def build(out, cuda=None, cc=None, cflags=(), src=SRC, jobs=None, log=None, announce=None):
    """Builds the libraries into the directory `out` unless it holds this
    very build already (its key); returns a Result. `cuda`: a Cuda (default
    find_cuda()); `cc`: the compiler command, a string (default $CC, else
    cc); `cflags`: more flags for every compile and link; `log`: a function
    given progress lines; `announce(out)`: called once when a build starts.
    Raises BuildError."""
    started = time.perf_counter()
    log = log or _quiet
    cuda = cuda or find_cuda()
    cc = compiler(cc)
    cflags = tuple(cflags)
    src = Path(src).resolve()
    out = Path(out).absolute()
    key = cache_key(cuda, cc, cflags, src)
    preload = _current(out, key)
    if preload:
        return Result(out, preload, False, time.perf_counter() - started, key)
    if re.search(r"[\s:]", str(out)):
        raise BuildError("LD_PRELOAD cannot name files under %s (a space or colon in the path)" % out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent / (".%s.lock" % out.name)):
        preload = _current(out, key)  # built by whoever held the lock
        if preload:
            return Result(out, preload, False, time.perf_counter() - started, key)
        for stale in out.parent.glob(".%s.tmp-*" % out.name):  # killed builds (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        if out.exists() and not _ours(out):
            raise BuildError("%s is not a build of the phantom GPU: not replacing it" % out)
        if announce:
            announce(out)
        work = Path(tempfile.mkdtemp(prefix=".%s.tmp-" % out.name, dir=out.parent))
        work.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would outlive the rename
        try:
            sonames = _build_into(work, cuda, cc, cflags, src, jobs or len(os.sched_getaffinity(0)), log)
            preload = " ".join(str(out / n) for n in sonames)
            (work / "LD_PRELOAD").write_text(preload + "\n")
            # Triton links its kernel launcher with -lcuda from TRITON_LIBCUDA_PATH
            # (vramguard.phantom.gpu.environ): the linker's name for the driver.
            (work / "libcuda.so").symlink_to("libcuda.so.1")
            # and the development names a driver and a CUDA toolkit install (Colab has both),
            # found on the phantom's LD_LIBRARY_PATH: bitsandbytes before 0.40 loads them by
            # these names with ctypes
            runtime = next(n for n in sonames if n.startswith("libcudart.so."))
            (work / "libcudart.so").symlink_to(runtime)
            (work / "cuda.mk").write_text(_make_vars(cuda))
            seconds = time.perf_counter() - started
            (work / "build.json").write_text(json.dumps({
                "key": key, "torch": cuda.torch, "cuda_major": cuda.major, "cuda_include": str(cuda.include),
                "cudart": str(cuda.cudart), "cc": cc, "cflags": CFLAGS + list(cflags), "libraries": sonames,
                "seconds": round(seconds, 2)}, indent=1) + "\n")
            if out.exists():  # another key's build: out of the way, then gone
                old = Path(tempfile.mkdtemp(prefix=".%s.tmp-old-" % out.name, dir=out.parent))
                os.replace(out, old / "old")
                os.replace(work, out)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(work, out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return Result(out, preload, True, time.perf_counter() - started, key)


def cache_name(cuda, key):
    """<torch version>-cu<major>-<16 hex digits of the key>."""
    torch = "".join(c if c.isalnum() or c in ".+-" else "_" for c in cuda.torch or "notorch")
    return "%s-cu%s-%s" % (torch, cuda.major, key[:16])


def build_cached(cache_root, cuda=None, cc=None, cflags=(), src=SRC, jobs=None, log=None, announce=None):
    """build() into cache_root/<cache_name>: one directory per PyTorch,
    CUDA major and key, never replaced, so that processes preloading one
    keep it."""
    cuda = cuda or find_cuda()
    key = cache_key(cuda, compiler(cc), tuple(cflags), Path(src).resolve())
    return build(Path(cache_root) / cache_name(cuda, key), cuda, cc, cflags, src, jobs, log, announce)


def default_cache_root():
    """${XDG_CACHE_HOME:-~/.cache}/vramguard/phantom, as vramguard's other
    builds (vramguard/torch/oom_shim.py)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vramguard" / "phantom"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--out", help="the output directory (default: the per-user cache, %s/<torch>-cu<N>-<key>)"
                        % default_cache_root())
    parser.add_argument("--cc", help="the C compiler command (default: $CC, else cc)")
    parser.add_argument("--cflags", default="", help="more flags for every compile and link")
    parser.add_argument("-j", "--jobs", type=int, help="compiles at once (default: the CPUs)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)

    def log(line):
        if not args.quiet:
            sys.stderr.write(line + "\n")

    def announce(out):
        log("build.py: building %s for CUDA %s (%s) into %s" % (
            ", ".join(sonames(cuda)), cuda.major,
            "PyTorch %s" % cuda.torch if cuda.torch else cuda.cudart, out))

    try:
        cuda = find_cuda()
        kwargs = dict(cuda=cuda, cc=args.cc, cflags=shlex.split(args.cflags), jobs=args.jobs, log=log,
                      announce=announce)
        result = build(args.out, **kwargs) if args.out else build_cached(default_cache_root(), **kwargs)
    except BuildError as exc:
        if exc.log:
            sys.stderr.write(exc.log.rstrip() + "\n")
        sys.exit("build.py: %s" % exc)
    except OSError as exc:
        sys.exit("build.py: %s" % exc)
    if result.built:
        log("build.py: built in %.1f s: %s" % (result.seconds, result.out))
    else:
        log("build.py: up to date: %s" % result.out)
    if not args.out:
        print(result.preload)


if __name__ == "__main__":
    main()
