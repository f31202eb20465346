"""The phantom GPU's builder (csrc/phantom/build.py) and its first use from
the package (vramguard.phantom.gpu.preload()).

The builds need PyTorch's CUDA build with its nvidia runtime wheel, for the
headers: they run under $TORCH_PYTHON (as make's TORCH_PYTHON), else
.venv-torch (make check-torch's), else .venv-torch-cu12 (make
check-torch-cu12's, the one left when SPARE_DISK removed the first), each
once make's stamp says its libraries are in (make test installs a tier's
beside these tests: a half-installed one is not taken), else this
interpreter, and are skipped when none has it. The errors and the wheel need no PyTorch. Each build's
compiler is a wrapper that counts its runs, so that a cache hit can be
seen to run none.
"""
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import pytest

from vramguard.phantom import gpu as _phantom

ROOT = Path(__file__).resolve().parents[1]
PHANTOM = ROOT / "csrc" / "phantom"
BUILD_PY = PHANTOM / "build.py"


def _load_builder():
    spec = importlib.util.spec_from_file_location("phantom_build_under_test", BUILD_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


builder = _load_builder()


@lru_cache(maxsize=None)
def _torch_python():
    """A Python whose PyTorch has CUDA and its runtime wheel, or None."""
    tiers = [str(ROOT / venv / "bin" / "python") for venv in (".venv-torch", ".venv-torch-cu12")
             if (ROOT / venv / ".deps").exists()]  # pip has finished there
    for python in (os.environ.get("TORCH_PYTHON"), *tiers, sys.executable):
        if not python or not (shutil.which(python) or os.path.isfile(python)):
            continue
        probe = "import sys; sys.path.insert(0, %r); import build; build.find_cuda()" % str(PHANTOM)
        if subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0:
            return python
    return None


@pytest.fixture(scope="module")
def torch_python():
    python = _torch_python()
    if python is None and os.environ.get("TORCH_PYTHON"):  # named (make test-phantom-builder): must serve
        pytest.fail(f"TORCH_PYTHON={os.environ['TORCH_PYTHON']} has no PyTorch CUDA build with its runtime wheel")
    if python is None:
        pytest.skip("no Python with PyTorch's CUDA build and its nvidia runtime wheel "
                    "(set TORCH_PYTHON, or make check-torch's .venv-torch)")
    return python


def counting_cc(folder):
    """A C compiler that appends a line to folder/cc.log at each run."""
    folder.mkdir(parents=True, exist_ok=True)
    real = shutil.which("cc")
    if real is None:
        pytest.skip("no C compiler (cc)")
    script = folder / "cc"
    script.write_text('#!/bin/sh\necho run >> "%s"\nexec "%s" "$@"\n' % (folder / "cc.log", real))
    script.chmod(0o755)
    return script


def runs(cc):
    log = cc.parent / "cc.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def soname(path):
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    match = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", out)
    return match.group(1) if match else None


def table_pattern(lib):
    """A regular expression for the names a table entry's soname template
    ({major}, {cudnn.major}, {cudart_so}: 11.0 for CUDA 11) gives."""
    return r"\d+(?:\.0)?".join(re.escape(part) for part in re.split(r"\{[^}]*\}", lib.soname))


def check_preload(preload, folder):
    """LD_PRELOAD lists the table's libraries that were built (build.json),
    in the table's order, every one without a wheel of its own among them,
    built in `folder`, each with its name as soname."""
    paths = [Path(p) for p in preload.split()]
    built = json.loads((folder / "build.json").read_text())["libraries"]
    assert [p.name for p in paths] == built
    table = [lib for lib in builder.LIBRARIES if any(re.fullmatch(table_pattern(lib), n) for n in built)]
    assert len(table) == len(paths)
    assert all(lib in table for lib in builder.LIBRARIES if not lib.wheels)
    for lib, path in zip(table, paths):
        assert path.is_absolute() and path.parent == folder and path.is_file()
        assert re.fullmatch(table_pattern(lib), path.name)
        if shutil.which("readelf"):
            assert soname(path) == path.name
    return paths


def leftovers(folder):
    """Temporary directories of builds, beside `folder`'s builds."""
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name]


@pytest.fixture(scope="module")
def cache(torch_python, tmp_path_factory):
    """One cold build into a fresh per-user cache (build.py with no --out,
    which prints LD_PRELOAD), with a counting compiler."""
    home = tmp_path_factory.mktemp("phantom-cache")
    cc = counting_cc(home / "bin")
    env = dict(os.environ, XDG_CACHE_HOME=str(home / "xdg"), CC=str(cc))
    started = time.perf_counter()
    proc = subprocess.run([torch_python, str(BUILD_PY)], env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr
    return SimpleNamespace(python=torch_python, env=env, cc=cc, root=home / "xdg" / "vramguard" / "phantom",
                           preload=proc.stdout.strip(), stderr=proc.stderr, seconds=seconds, cold_runs=runs(cc))


def test_cold_build_into_the_cache(cache):
    (folder,) = [p for p in cache.root.iterdir() if p.is_dir()]
    assert re.fullmatch(r"[0-9][\w.+-]*-cu\d+-[0-9a-f]{16}", folder.name), folder.name
    paths = check_preload(cache.preload, folder)
    assert (folder / "LD_PRELOAD").read_text().strip() == cache.preload
    assert paths[0].name.startswith("libcudart.so.") and folder.name.split("-cu")[1].startswith(
        paths[0].name.split(".so.")[1].split(".")[0] + "-")
    assert not (folder / "obj").exists() and not leftovers(cache.root)
    assert cache.cold_runs > len(builder.LIBRARIES)
    assert "building" in cache.stderr


def test_second_build_is_a_cache_hit(cache):
    proc = subprocess.run([cache.python, str(BUILD_PY)], env=cache.env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == cache.preload
    assert runs(cache.cc) == cache.cold_runs  # no compiler, no preprocessor
    assert "up to date" in proc.stderr


def test_preload_builds_once_and_leaves_torch_unimported(cache):
    """vramguard.phantom.gpu.preload() in the PyTorch's interpreter: the
    cache's build, found without a compiler run and without importing
    torch (which would load the real CUDA runtime first)."""
    code = ("import sys; from vramguard.phantom import gpu; print(gpu.preload()); "
            "print('torch' in sys.modules)")
    env = dict(cache.env, PYTHONPATH=str(ROOT / "python"))
    proc = subprocess.run([cache.python, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "No module named 'vramguard._core'" in proc.stderr:
        pytest.skip("vramguard's extension is not built in python/ (setup.py build_ext --inplace)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == [cache.preload, "False"]
    assert runs(cache.cc) == cache.cold_runs
    assert "building" not in proc.stderr


def test_concurrent_builds_make_one_good_build(torch_python, tmp_path):
    cc = counting_cc(tmp_path / "bin")
    out = tmp_path / "builds" / "fakecuda"
    cmd = [torch_python, str(BUILD_PY), "--out", str(out), "--cc", str(cc)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert sum("built in" in err for _, err in results) == 1, results  # the other waited, then found it
    preload = (out / "LD_PRELOAD").read_text().strip()
    check_preload(preload, out)
    assert not leftovers(out.parent)
    built_once = runs(cc)
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    assert runs(cc) == built_once


def test_killed_build_leaves_nothing(torch_python, tmp_path):
    """A build killed midway leaves no output (it was never renamed into
    place); the next build clears its temporary directory and completes."""
    cc = counting_cc(tmp_path / "bin")
    out = tmp_path / "builds" / "fakecuda"
    cmd = [torch_python, str(BUILD_PY), "--out", str(out), "--cc", str(cc)]
    # The killed compilers' temporary files go to the test's folder, not the machine's /tmp.
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, TMPDIR=str(tmp_path / "tmp")))
    deadline = time.monotonic() + 120
    while runs(cc) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    assert leftovers(out.parent)  # what the kill left
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    check_preload((out / "LD_PRELOAD").read_text().strip(), out)
    assert not leftovers(out.parent)


# ---- errors: one line each, no PyTorch needed ------------------------------

def fake_torch(folder, cuda):
    """A `torch` package that is only a version.py."""
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "__init__.py").write_text("")
    (folder / "torch" / "version.py").write_text(
        "__version__ = '9.9.0'\ncuda = %s\n" % ("None" if cuda is None else repr(cuda)))
    return folder


def run_builder(tmp_path, **env):
    """build.py --out under this interpreter, without site-packages (-S):
    no PyTorch unless PYTHONPATH brings one. `env`: more variables, None
    to remove one; returns build.py's one line of error."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VG_FAKECUDA_", "PYTHON"))}
    base.update(env)
    base = {k: v for k, v in base.items() if v is not None}
    proc = subprocess.run([sys.executable, "-S", str(BUILD_PY), "--out", str(tmp_path / "out")],
                          env=base, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_no_torch_is_one_line(tmp_path):
    line = run_builder(tmp_path)
    assert not (tmp_path / "out").exists()
    assert line == "build.py: PyTorch is not installed for %s: the phantom GPU runs the PyTorch of " \
                   "the Python that builds it" % sys.executable


def test_torch_without_cuda_is_one_line(tmp_path):
    line = run_builder(tmp_path, PYTHONPATH=str(fake_torch(tmp_path / "site", None)))
    assert line.startswith("build.py: PyTorch 9.9.0 is built without CUDA: the phantom GPU needs PyTorch's CUDA build")


def test_no_runtime_wheel_is_one_line(tmp_path):
    line = run_builder(tmp_path, PYTHONPATH=str(fake_torch(tmp_path / "site", "13.0")))
    assert line.startswith("build.py: no CUDA 13 runtime wheel with headers under")
    assert line.endswith("(pip install nvidia-cuda-runtime)")


def c10_cuda(torch_site, needs):
    """torch/lib/libc10_cuda.so under `torch_site`: a real shared library
    built here that needs `needs` (libraries beside it, built empty), as
    pip's PyTorch 1.13 (none of libcudart: its runtime is linked in) or 2.x
    (libcudart.so.N) has it."""
    lib = torch_site / "torch" / "lib"
    lib.mkdir(parents=True)
    (lib / "c10.c").write_text("int c10_cuda_marker(void) { return 1; }\n")
    for name in needs:
        subprocess.run(["cc", "-shared", "-o", str(lib / name), "-Wl,-soname," + name, str(lib / "c10.c")],
                       check=True)
    link = ["-L" + str(lib)] + ["-l:" + n for n in needs]
    subprocess.run(["cc", "-shared", "-o", str(lib / "libc10_cuda.so"), str(lib / "c10.c"), "-Wl,--no-as-needed"]
                   + link, check=True)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a stand-in libc10_cuda.so")
def test_a_torch_with_the_runtime_linked_in_is_one_line(tmp_path):
    """pip's PyTorch 1.13.1: libc10_cuda.so needs no libcudart, the runtime is
    linked into it, and the phantom cannot stand in for it: one line, which
    names the library, before any build (no output folder)."""
    site = fake_torch(tmp_path / "site", "11.7")
    c10_cuda(site, ["libc10.so"])
    line = run_builder(tmp_path, PYTHONPATH=str(site))
    lib = site / "torch" / "lib" / "libc10_cuda.so"
    assert line == ("build.py: PyTorch 9.9.0 has CUDA's runtime linked into %s (it loads no libcudart): the "
                    "phantom GPU stands in for the runtime's shared library, so it cannot run this PyTorch; "
                    "pip's PyTorch 2.0 and later load the shared one" % lib)
    assert not (tmp_path / "out").exists()


def damaged(lib, kind):
    """`lib` (a real shared library built here) made into a file that
    _needed() must not read a conclusion from."""
    data = bytearray(lib.read_bytes())
    if kind == "32-bit ELF":
        data[4] = 1  # EI_CLASS: ELFCLASS32
    elif kind == "big-endian ELF":
        data[5] = 2  # EI_DATA: ELFDATA2MSB
    elif kind == "section table past the end":
        data[0x28:0x30] = (len(data) + 1).to_bytes(8, "little")  # e_shoff
    elif kind == "huge section sizes":
        data[0x28:0x30] = (2**64 - 64).to_bytes(8, "little")
    elif kind == "truncated":
        data = data[: len(data) // 2]
    lib.write_bytes(bytes(data))


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build libraries for the test")
def test_the_needed_entries_are_read_from_a_real_library(tmp_path):
    site = tmp_path / "site"
    c10_cuda(site, ["libc10.so", "libcudart.so.11.0"])
    assert builder._needed(site / "torch" / "lib" / "libc10_cuda.so") == ["libc10.so", "libcudart.so.11.0", "libc.so.6"]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build libraries for the test")
@pytest.mark.parametrize("kind", ["32-bit ELF", "big-endian ELF", "section table past the end",
                                  "huge section sizes", "truncated"])
def test_a_damaged_library_gives_no_needed_entries(tmp_path, kind):
    site = tmp_path / "site"
    c10_cuda(site, ["libc10.so"])
    lib = site / "torch" / "lib" / "libc10_cuda.so"
    damaged(lib, kind)
    assert builder._needed(lib) is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build an object file")
def test_an_object_file_has_no_dynamic_section_and_no_needed_entries(tmp_path):
    (tmp_path / "x.c").write_text("int x(void) { return 1; }\n")
    subprocess.run(["cc", "-c", "-o", str(tmp_path / "x.o"), str(tmp_path / "x.c")], check=True)
    assert builder._needed(tmp_path / "x.o") is None


def test_files_that_are_not_elf_give_no_needed_entries(tmp_path):
    (tmp_path / "text").write_text("not a library\n")
    (tmp_path / "empty").write_bytes(b"")
    assert builder._needed(tmp_path / "text") is None
    assert builder._needed(tmp_path / "empty") is None
    assert builder._needed(tmp_path / "missing") is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a stand-in libc10_cuda.so")
@pytest.mark.parametrize("c10", ["needs libcudart", "not ELF", "damaged ELF", "no dynamic section"])
def test_a_torch_that_loads_the_shared_runtime_goes_on(tmp_path, c10):
    """A libc10_cuda.so that needs libcudart.so.11.0 (pip's 2.0), or one from
    which nothing can be concluded (not ELF, a damaged ELF, an object file): the
    builder goes on to look for the runtime's wheel."""
    site = fake_torch(tmp_path / "site", "11.7")
    lib = site / "torch" / "lib" / "libc10_cuda.so"
    if c10 == "needs libcudart":
        c10_cuda(site, ["libc10.so", "libcudart.so.11.0"])
    elif c10 == "damaged ELF":
        c10_cuda(site, ["libc10.so"])
        damaged(lib, "section table past the end")
    else:
        lib.parent.mkdir()
        if c10 == "not ELF":
            lib.write_text("not a library\n")
        else:
            (tmp_path / "x.c").write_text("int x(void) { return 1; }\n")
            subprocess.run(["cc", "-c", "-o", str(lib), str(tmp_path / "x.c")], check=True)
    line = run_builder(tmp_path, PYTHONPATH=str(site))
    assert line.startswith("build.py: no CUDA 11 runtime wheel with headers under"), line


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a stand-in libc10_cuda.so")
def test_a_linked_in_runtime_is_refused_with_another_runtime_named_too(tmp_path):
    """VG_FAKECUDA_INCLUDE and VG_FAKECUDA_CUDART name another runtime, but this
    PyTorch would never load it: the same one line."""
    site = fake_torch(tmp_path / "site", "11.7")
    c10_cuda(site, ["libc10.so"])
    env = dict(dummy_runtime(tmp_path / "cuda"), PYTHONPATH=str(site))
    line = run_builder(tmp_path, **env)
    assert line.startswith("build.py: PyTorch 9.9.0 has CUDA's runtime linked into "), line


def test_a_torch_for_cuda_10_is_one_line(tmp_path):
    """pip's PyTorch 1.4 to 1.6 load a CUDA 10 runtime of their own, and no pip
    wheel carries CUDA 10's headers: one line that says so, with no pip
    command to try (there is no nvidia-cuda-runtime-cu10)."""
    site = fake_torch(tmp_path / "site", "10.2")
    line = run_builder(tmp_path, PYTHONPATH=str(site))
    assert line == ("build.py: PyTorch 9.9.0 is built for CUDA 10, whose runtime has no pip wheel (NVIDIA's start "
                    "at nvidia-cuda-runtime-cu11): the phantom GPU is built from such a wheel's headers, so it "
                    "cannot run this PyTorch; pip's PyTorch 2.0 and later can")
    assert not (tmp_path / "out").exists()


def dummy_runtime(folder):
    """VG_FAKECUDA_INCLUDE and VG_FAKECUDA_CUDART naming files that pass
    find_cuda()'s checks, so that the compiler is looked for next."""
    (folder / "include").mkdir(parents=True)
    (folder / "include" / "cuda_runtime_api.h").write_text("")
    (folder / "libcudart.so.13").write_text("")
    return {"VG_FAKECUDA_INCLUDE": str(folder / "include"), "VG_FAKECUDA_CUDART": str(folder / "libcudart.so.13")}


def test_no_compiler_is_one_line(tmp_path):
    empty = tmp_path / "empty-path"
    empty.mkdir()
    env = dict(dummy_runtime(tmp_path / "cuda"), PATH=str(empty), CC=None)
    line = run_builder(tmp_path, **env)
    assert line == "build.py: the phantom GPU needs a C compiler (cc): apt-get install gcc"
    line = run_builder(tmp_path, **dict(env, CC="no-such-compiler -O2"))
    assert line == "build.py: the phantom GPU needs a C compiler: no-such-compiler -O2 is not a command here (CC)"


def test_a_wrong_wheel_directory_is_one_line(tmp_path):
    env = dict(dummy_runtime(tmp_path / "cuda"), VG_FAKECUDA_CUBLAS=str(tmp_path / "nowhere"))
    line = run_builder(tmp_path, **env)
    assert line == ("build.py: VG_FAKECUDA_CUBLAS=%s has no lib/libcublas.so.13, lib/libcublasLt.so.13 and "
                    "include/cublas_api.h, include/cublasLt.h" % (tmp_path / "nowhere"))


def test_a_library_without_its_wheel_is_left_out():
    """No cuBLAS, cuDNN or NCCL wheel: their stand-ins are left out (PyTorch then
    loads nothing of theirs or the real ones), the rest is built, and
    cuda.mk's CUBLAS_ and CUDNN_ variables are empty, so that make skips
    their C tests."""
    cuda = builder.Cuda(Path("/inc"), Path("/lib/libcudart.so.13"), "13", "9.9.0", (),
                        {w.name: None for w in builder.WHEELS})
    said = []
    ctx = builder._names(cuda)
    libs = [builder.replace(lib, soname=builder._format(lib.soname, ctx),
                            needs=tuple(builder._format(n, ctx) for n in lib.needs)) for lib in builder.LIBRARIES]
    kept = builder._present(libs, cuda, said.append)
    assert [lib.soname for lib in kept] == [lib.soname for lib in libs if not lib.wheels]
    assert builder.sonames(cuda) == [lib.soname for lib in kept]
    assert "  left out libcublas.so.13: no cublas wheel" in said
    assert "  left out libcudnn.so.N: no cudnn wheel" in said
    assert "  left out libnccl.so.N: no nccl wheel" in said
    assert "CUBLAS_LIB := \n" in builder._make_vars(cuda) and "CUDNN_MAJOR := \n" in builder._make_vars(cuda)


def test_refuses_what_it_cannot_own(tmp_path):
    """An --out that is something else is not replaced, and a path that
    LD_PRELOAD cannot carry is refused before any build."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc)")
    env = dummy_runtime(tmp_path / "cuda")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    line = run_builder(tmp_path, **env)
    assert line == "build.py: %s is not a build of the phantom GPU: not replacing it" % (tmp_path / "out")
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    spaced = tmp_path / "a b"
    spaced.mkdir()
    line = run_builder(spaced, **env)
    assert line.startswith("build.py: LD_PRELOAD cannot name files under ")


def test_preload_without_a_compiler_raises_one_line(tmp_path, monkeypatch):
    empty = tmp_path / "empty-path"
    empty.mkdir()
    for name, value in dummy_runtime(tmp_path / "cuda").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with pytest.raises(_phantom.PhantomUnavailable) as info:
        _phantom.preload()
    assert str(info.value) == "the phantom GPU needs a C compiler (cc): apt-get install gcc"
    assert not (tmp_path / "xdg").exists()


def test_preload_without_torch_raises_one_line(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("torch", "nvidia")
                        else real(name, *a))
    for name in ("VG_FAKECUDA_INCLUDE", "VG_FAKECUDA_CUDART"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with pytest.raises(_phantom.PhantomUnavailable) as info:
        _phantom.preload()
    message = str(info.value)
    assert "\n" not in message and message.startswith("PyTorch is not installed for ")


# ---- the wheel -------------------------------------------------------------

SKIP_COPY = {".git", "build", "dist", ".pytest_cache", "__pycache__", "shared"}  # and every .venv*


def _wheel_tools():
    """Why `pip wheel --no-build-isolation` cannot run here, or None.
    Asked of another process: importing setuptools here would put its
    distutils in this one."""
    probe = ("import importlib.util as u, sys\n"
             "try:\n"
             "    import setuptools\n"  # first: finding pip turns setuptools' distutils off
             "except ImportError:\n"
             "    sys.exit('setuptools is not installed')\n"
             "u.find_spec('pip') or sys.exit('pip is not installed')\n"
             "try:\n"
             "    import setuptools.command.bdist_wheel\n"
             "except ImportError:\n"
             "    u.find_spec('wheel') or sys.exit('neither wheel nor a setuptools with bdist_wheel is installed')\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return "%s (%s)" % ((proc.stderr.strip().splitlines() or ["the probe failed"])[-1], sys.executable)
    return None


def test_wheel_carries_the_phantom_sources(tmp_path):
    why = _wheel_tools()
    if why:
        pytest.skip("cannot build a wheel offline: " + why)
    tree = tmp_path / "tree"
    shutil.copytree(ROOT, tree, ignore=lambda d, names: [n for n in names if n in SKIP_COPY or n.startswith(
        ".venv") or n.endswith((".so", ".o", ".egg-info"))])  # every venv: a tier's is GBs
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist")], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("vramguard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n[len("vramguard/_phantom_src/"):] for n in names if n.startswith("vramguard/_phantom_src/")}
    needed = set(builder._files(PHANTOM)) | {"gen_fakecuda.py", "build.py", "shim/crt/host_defines.h"}
    assert needed <= shipped, sorted(needed - shipped)
    assert "test_fakecuda.c" not in shipped and "fakecuda.mk" not in shipped

    # Installed from the wheel, the package builds from its own copy: the
    # same key as the checkout's, so a cache of the checkout's build serves.
    python = _torch_python()
    if python is None:
        return
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("from vramguard.phantom import gpu; b = gpu._builder(); print(b.__file__); "
            "print(b.cache_key(b.find_cuda(), b.compiler()))")
    proc = subprocess.run([python, "-c", code], env=dict(os.environ, PYTHONPATH=str(site)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    where, key = proc.stdout.split()
    assert Path(where) == site / "vramguard" / "_phantom_src" / "build.py"
    proc = subprocess.run([python, "-c", "import sys; sys.path.insert(0, %r); import build; "
                           "print(build.cache_key(build.find_cuda(), build.compiler()))" % str(PHANTOM)],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == [key]


# ---- the driver's legacy names, and CUDA 11 ----------------------------------

def exported(path):
    out = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True)
    return {line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line.strip()}


def test_the_driver_exports_the_legacy_names_beside_their_successors(cache):
    """PyTorch 2.6 dlsyms cuStreamWriteValue32 by its bare name; the real
    driver exports it beside cuStreamWriteValue32_v2, and so does the fake."""
    if not shutil.which("nm"):
        pytest.skip("no nm")
    (folder,) = [p for p in cache.root.iterdir() if p.is_dir()]
    names = exported(folder / "libcuda.so.1")
    assert {"cuStreamWriteValue32", "cuStreamWriteValue32_v2", "cuMemAlloc", "cuMemAlloc_v2",
            "cuCtxCreate", "cuGetProcAddress"} <= names
    assert not [n for n in names if n.endswith(("_ptsz", "_ptds"))]  # the per-thread variants: none, as before


CUDA11 = os.environ.get("VG_TEST_CUDA11_RUNTIME")  # nvidia-cuda-runtime-cu11, unpacked (make test-phantom-builder)

CUDA11_CALLS = r"""
import ctypes, sys
rt = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
drv = ctypes.CDLL(sys.argv[2])
n = ctypes.c_int(-1)
assert rt.cudaGetDeviceCount(ctypes.byref(n)) == 0 and n.value >= 1, n.value
fn = ctypes.c_void_p()
# CUDA 11's entry point query has no status argument; a name it lacks is an error
assert rt.cudaGetDriverEntryPoint(b"cuMemAlloc", ctypes.byref(fn), ctypes.c_ulonglong(0)) == 0
assert fn.value == ctypes.cast(drv.cuMemAlloc_v2, ctypes.c_void_p).value
assert rt.cudaGetDriverEntryPoint(b"cuNoSuchThing", ctypes.byref(fn), ctypes.c_ulonglong(0)) != 0
# CUDA 11's capture info is the status and id alone
status, cid = ctypes.c_int(-1), ctypes.c_ulonglong(0)
assert rt.cudaStreamGetCaptureInfo(None, ctypes.byref(status), ctypes.byref(cid)) == 0 and status.value == 0
print("ok")
"""


@pytest.mark.skipif(not CUDA11, reason="no CUDA 11 runtime wheel unpacked (VG_TEST_CUDA11_RUNTIME, set by "
                                       "make test-phantom-builder)")
def test_a_cuda_11_runtime_builds_under_its_own_names_and_signatures(tmp_path):
    """PyTorch 1.13 to 2.0 (CUDA 11.7): the runtime is libcudart.so.11.0,
    with CUDA 11's signatures where 12 changed them."""
    root = Path(CUDA11)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VG_FAKECUDA_", "PYTHON"))}
    env.update(VG_FAKECUDA_INCLUDE=str(root / "include"), VG_FAKECUDA_CUDART=str(root / "lib" / "libcudart.so.11.0"))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-S", str(BUILD_PY), "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    names = [Path(p).name for p in (out / "LD_PRELOAD").read_text().split()]
    assert names[:3] == ["libcudart.so.11.0", "libcuda.so.1", "libnvidia-ml.so.1"]
    if shutil.which("readelf"):
        assert soname(out / "libcudart.so.11.0") == "libcudart.so.11.0"
        versions = subprocess.run(["readelf", "-V", str(out / "libcudart.so.11.0")], capture_output=True,
                                  text=True, check=True).stdout
        assert "Name: libcudart.so.11.0" in versions
    if shutil.which("nm"):
        assert exported(out / "libcudart.so.11.0") == exported(root / "lib" / "libcudart.so.11.0") | {
            n for n in exported(out / "libcudart.so.11.0") if n.startswith("vg_fakecuda_kernel_")}
    run = subprocess.run([sys.executable, "-c", CUDA11_CALLS, str(out / "libcudart.so.11.0"),
                          str(out / "libcuda.so.1")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


CUDNN8 = os.environ.get("VG_TEST_CUDNN8")  # a cuDNN 8 wheel's nvidia/cudnn (PyTorch 2.0's), where one is installed

CUDNN8_CALLS = r"""
import ctypes, sys
dnn = ctypes.CDLL(sys.argv[1])
assert dnn.cudnnGetVersion() // 1000 == 8, dnn.cudnnGetVersion()
dnn.cudnnGetErrorString.restype = ctypes.c_char_p
assert dnn.cudnnGetErrorString(3) == b"CUDNN_STATUS_BAD_PARAM"
for check in ("Ops", "Cnn", "Adv"):  # cuDNN 8's sub-libraries, an inference and a training one each
    for kind in ("Infer", "Train"):
        assert getattr(dnn, "cudnn%s%sVersionCheck" % (check, kind))() == 0
# a bad parameter of any kind is the plain status: cuDNN 8 has no detailed ones
assert dnn.cudnnBackendCreateDescriptor(0, None) == 3
print("ok")
"""


@pytest.mark.skipif(not (CUDNN8 and CUDA11), reason="no cuDNN 8 wheel (VG_TEST_CUDNN8: PyTorch 2.0's nvidia/cudnn, "
                                                    "700 MB, where one is installed) and CUDA 11 runtime")
def test_a_cudnn_8_builds_with_its_own_names(tmp_path):
    """PyTorch 2.0's cuDNN 8: the stand-in builds against its headers, exports
    what the real libcudnn.so.8 exports (its sub-libraries' version checks,
    none of cuDNN 9's), and answers cuDNN 8's statuses."""
    root = Path(CUDA11)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VG_FAKECUDA_", "PYTHON"))}
    env.update(VG_FAKECUDA_INCLUDE=str(root / "include"), VG_FAKECUDA_CUDART=str(root / "lib" / "libcudart.so.11.0"),
               VG_FAKECUDA_CUDNN=CUDNN8)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-S", str(BUILD_PY), "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "libcudnn.so.8" in [Path(p).name for p in (out / "LD_PRELOAD").read_text().split()]
    if shutil.which("nm"):
        real = exported(Path(CUDNN8) / "lib" / "libcudnn.so.8")
        assert exported(out / "libcudnn.so.8") - {n for n in exported(out / "libcudnn.so.8")
                                                   if n.startswith("vg_phantom_cudnn_")} == real
    run = subprocess.run([sys.executable, "-c", CUDNN8_CALLS, str(out / "libcudnn.so.8")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
