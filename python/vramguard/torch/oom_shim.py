"""torch.OutOfMemoryError from vramguard's allocator.

PyTorch raises torch.OutOfMemoryError (a RuntimeError subclass) when an
allocator throws the C++ type c10::OutOfMemoryError, and cuDNN catches that
type to retry with a smaller workspace. vramguard's wheel cannot throw it:
the type comes from the installed torch's headers and libc10, which change
with the torch version, while the wheel is built once for every CPython
(abi3) without torch. So install() builds a one-function shim against the
torch in use, the first time, with the machine's C++ compiler (Colab has
one), caches it per torch and vramguard version, and hands its function to
_core's malloc entry point, which calls it instead of throwing
std::runtime_error.

Without a compiler or torch's headers, or with VRAMGUARD_OOM_ERROR=runtime
(install(oom_error="runtime")), out-of-memory errors stay RuntimeError with
the same message, which is what batch-size finders look for; a one-line
warning says why when the build was wanted and could not be done.

The cache: $XDG_CACHE_HOME/vramguard, else ~/.cache/vramguard. A build is
written under a temporary name and renamed into place, so a process never
loads a half-written file, two processes building at once both succeed, and
a failed build leaves nothing behind.
"""
import collections
import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
import warnings

from .._files import commit_file

ENV_MODE = "VRAMGUARD_OOM_ERROR"
MODES = ("auto", "runtime")
SYMBOL = "vramguard_throw_oom"
BUILD_TIMEOUT_S = 300

SOURCE = r"""// vramguard's out-of-memory shim: built at install() against the torch in
// use (python/vramguard/_oom_shim.py). Called by vramguard._core's malloc
// entry point after the C heap has returned, on PyTorch's call stack.
#include <c10/util/Exception.h>
#include <cstdint>
#include <string>

extern "C" [[noreturn]] void vramguard_throw_oom(const char *message)
{
    throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                std::string(message));
}
"""

# What install() got: `address` of the thrower (None: RuntimeError stays),
# the shim's `path`, whether it was `built` now and in how many `seconds`,
# and `reason` when there is no shim.
Shim = collections.namedtuple("Shim", "address path built seconds reason")


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "vramguard")


def compiler():
    """The C++ compiler command, or (None, why not). CXX wins when set."""
    given = os.environ.get("CXX")
    if given:
        words = shlex.split(given)
        if words and shutil.which(words[0]):
            return [shutil.which(words[0])] + words[1:], None
        return None, f"CXX={given} is not a command on this machine"
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            return [path], None
    return None, "no C++ compiler (c++, g++ or clang++) on PATH"


def _torch_dirs(torch):
    """torch/include and torch/lib of the installed torch ("" for a torch
    module that is not a file: nothing to build against)."""
    where = getattr(torch, "__file__", None)
    if not where:
        return "", ""
    root = os.path.dirname(os.path.abspath(where))
    return os.path.join(root, "include"), os.path.join(root, "lib")


def _abi(torch):
    return int(bool(getattr(getattr(torch, "_C", None), "_GLIBCXX_USE_CXX11_ABI", True)))


def shim_name(torch, vramguard_version):
    """One file per torch build, vramguard version and shim source."""
    include, _ = _torch_dirs(torch)
    torch_version = str(getattr(torch, "__version__", "unknown"))
    git = str(getattr(getattr(torch, "version", None), "git_version", ""))
    key = "\n".join([SOURCE, torch_version, git, str(_abi(torch)), include, vramguard_version])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    version = "".join(c if c.isalnum() or c in ".+-" else "_" for c in torch_version)
    return f"oom_shim-torch{version}-vg{vramguard_version}-{digest}.so"


def _command(cxx, torch, source, output):
    include, lib = _torch_dirs(torch)
    return cxx + ["-std=c++17", "-O2", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={_abi(torch)}",
                  "-I", include, source, "-o", output, "-L", lib, "-lc10", f"-Wl,-rpath,{lib}"]


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def build(torch, path):
    """Compiles the shim into `path`, atomically; returns None, or why not."""
    cxx, why = compiler()
    if cxx is None:
        return why
    include, _ = _torch_dirs(torch)
    if not os.path.isfile(os.path.join(include, "c10", "util", "Exception.h")):
        return f"PyTorch's C++ headers are not installed ({include})"
    folder = os.path.dirname(path)
    fd, source = tempfile.mkstemp(prefix=".oom_shim-", suffix=".cc", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(SOURCE)
    fd, output = tempfile.mkstemp(prefix=".oom_shim-", suffix=".so.tmp", dir=folder)
    os.close(fd)
    try:
        proc = subprocess.run(_command(cxx, torch, source, output), capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            return f"the C++ build failed ({lines[-1] if lines else 'exit %d' % proc.returncode})"
        commit_file(output, path)
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the C++ build failed ({exc})"
    finally:
        _unlink(source)
        _unlink(output)


def _writable_cache():
    folder = cache_dir()
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return None
    return folder if os.access(folder, os.W_OK) else None


def _load(path):
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return ctypes.cast(getattr(lib, SYMBOL), ctypes.c_void_p).value


def load(torch, vramguard_version, mode=None):
    """The shim for this torch, built if need be: a Shim. A build that
    cannot be done gives address None and a one-line warning."""
    if mode is None:
        mode = os.environ.get(ENV_MODE) or "auto"
    if mode not in MODES:
        raise ValueError(f"oom_error must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "runtime":
        return Shim(None, None, False, 0.0, f"{ENV_MODE}=runtime or oom_error='runtime'")
    if not _torch_dirs(torch)[0]:  # a module standing in for torch: nothing to say
        return Shim(None, None, False, 0.0, "torch is not an installed package")
    name = shim_name(torch, vramguard_version)
    folder = _writable_cache()
    scratch = None
    if folder is None:  # no cache: build for this process only
        folder = scratch = tempfile.mkdtemp(prefix="vramguard-")
    path = os.path.join(folder, name)
    started = time.perf_counter()
    built = False
    why = None
    try:
        if not os.path.isfile(path):
            why = build(torch, path)
            built = why is None
        if why is None:
            try:
                return Shim(_load(path), path, built, time.perf_counter() - started, None)
            except (OSError, AttributeError) as exc:
                why = f"the shim {path} does not load ({exc})"
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)  # a loaded file stays mapped
    warnings.warn(
        f"vramguard: out-of-memory errors will be RuntimeError, not torch.OutOfMemoryError: {why}. "
        f"Set {ENV_MODE}=runtime to skip this step.",
        RuntimeWarning,
        stacklevel=4,
    )
    return Shim(None, None, False, time.perf_counter() - started, why)
