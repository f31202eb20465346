"""A dry run's input, checked before anything runs: the script, the
allocators, the sweep, the folders, the jobs and the timeout. Each bad
value gets one line (DryRunInputError) naming the argument as the caller
spelled it (a flag on the command line, a keyword in Python)."""
import json
import os
import re
import sys

from .._presets import find_preset, preset_names
from ..phantom import argnames
from ..phantom.settings import DryRunInputError
from .contract import ALLOCATORS

__all__ = ["CWD_PER_RUN", "DryRunInputError", "check_cwd", "check_gpu", "check_jobs", "check_out",
           "check_placeholders", "check_platform", "check_script", "check_timeout", "default_jobs",
           "make_cwds", "parse_allocators", "parse_sweep"]

#: --cwd's placeholder for a folder per allocator (runs at once need one each).
CWD_PER_RUN = "{allocator}"


_SWEEP = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.+)$")


#: Variables the dry run sets or its runs need: a --sweep of one of them
#: would undo the phantom (or the allocator) it set.
_RESERVED_ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTORCH_CUDA_ALLOC_CONF", "PATH", "PYTHONPATH",
                 "PYTHONUNBUFFERED", "TRITON_LIBCUDA_PATH", "TORCH_COMPILE_DISABLE", "TORCHINDUCTOR_CACHE_DIR",
                 "TORCHINDUCTOR_AUTOGRAD_CACHE")


_RESERVED_PREFIXES = ("VG_FAKECUDA_", "VRAMGUARD_")


def parse_allocators(value):
    """('native', ...) from "native,vramguard" or a sequence of names."""
    names = value.split(",") if isinstance(value, str) else list(value or ())
    names = [n.strip().lower() for n in names if n and n.strip()]
    if not names:
        raise DryRunInputError(f"no allocator named: choose from {', '.join(ALLOCATORS)}")
    for name in names:
        if name not in ALLOCATORS:
            raise DryRunInputError(f"unknown allocator {name!r}: choose from {', '.join(ALLOCATORS)}")
    return tuple(dict.fromkeys(names))


def parse_sweep(text):
    """("BATCH", [1, 2, 4]) from "BATCH=1,2,4": a name, then whole numbers
    in increasing order."""
    if isinstance(text, (tuple, list)) and len(text) == 2:
        name, values = text
        text = f"{name}={','.join(str(v) for v in values)}"
    match = _SWEEP.match(str(text).strip())
    if not match:
        raise DryRunInputError(f"{argnames.given('sweep', text)}: expected NAME=V1,V2,... (e.g. BATCH=1,2,4,8)")
    name, raw = match.groups()
    if name in _RESERVED_ENV or name.startswith(_RESERVED_PREFIXES):
        raise DryRunInputError(f"{argnames.given('sweep', text)}: {name} is a variable the dry run sets or needs: "
                               "sweep another name (e.g. BATCH)")
    values = []
    for part in raw.split(","):
        part = part.strip()
        if not re.fullmatch(r"[0-9]+", part) or int(part) < 1:
            raise DryRunInputError(f"{argnames.given('sweep', text)}: {part!r} is not a whole number above 0")
        values.append(int(part))
    if any(b <= a for a, b in zip(values, values[1:])):
        raise DryRunInputError(f"{argnames.given('sweep', text)}: the values must increase")
    return name, values


def check_script(script):
    if not isinstance(script, (str, os.PathLike)) or not os.fspath(script):
        raise DryRunInputError("no script given")
    path = os.fspath(script)
    if not os.path.exists(path):
        raise DryRunInputError(f"{path}: No such file or directory")
    if os.path.isdir(path):
        raise DryRunInputError(f"{path}: is a directory, not a script")
    if not os.path.isfile(path):
        raise DryRunInputError(f"{path}: not a regular file")
    if path.endswith(".ipynb"):
        try:
            with open(path, encoding="utf-8") as f:
                nb = json.load(f)
            if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
                raise ValueError("no cells")
        except (ValueError, UnicodeDecodeError) as exc:
            raise DryRunInputError(f"{path}: not a Jupyter notebook ({exc})") from None
    return path


def check_gpu(gpu):
    preset = find_preset(gpu)
    if preset is None:
        raise DryRunInputError(f"unknown GPU {gpu!r}: one of {preset_names()}")
    return preset


def check_out(out):
    """--out: a directory, or a path where one can be made, that this user
    can write (the dry run makes a folder of its own in it): said before
    anything runs. access(2) answers for a read-only file system even to
    root."""
    if out is None:
        return None
    path = os.path.abspath(os.fspath(out))
    said = argnames.given("out", os.fspath(out), quote=False)
    if os.path.exists(path) and not os.path.isdir(path):
        raise DryRunInputError(f"{said}: is a file, not a directory")
    existing = path
    while not os.path.exists(existing):  # the folder nearest to it that is there, where it would be made
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == path else f" ({existing}, where it would be made)"
        raise DryRunInputError(f"{said}: cannot write there{where}: the dry run makes a folder of its own "
                               "in it for its logs, figures and snapshots")
    return path


def check_cwd(cwd, allocators):
    """--cwd: an existing directory, where the script runs; with
    {allocator} in it, a folder per allocator (made when missing, once the
    dry run starts, see make_cwds), whose parent must exist."""
    if cwd is None:
        return None
    path = os.path.abspath(os.fspath(cwd))
    said = argnames.given("cwd", os.fspath(cwd), quote=False)
    for folder in sorted({path.replace(CWD_PER_RUN, a) for a in allocators}):
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise DryRunInputError(f"{said}: {folder} is a file, not a directory")
        if not os.path.isdir(folder if CWD_PER_RUN not in path else os.path.dirname(folder)):
            raise DryRunInputError(f"{said}: No such directory" + (
                f" ({os.path.dirname(folder)})" if CWD_PER_RUN in path else ""))
    return path


def make_cwds(cwd, allocators):
    """The folders of a per-allocator --cwd, made where missing."""
    if cwd is None or CWD_PER_RUN not in cwd:
        return
    for allocator in allocators:
        folder = cwd.replace(CWD_PER_RUN, allocator)
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise DryRunInputError(f"{argnames.given('cwd', cwd, quote=False)}: {folder}: "
                                   f"{exc.strerror or exc}") from None


def check_jobs(jobs, allocators, cwd):
    """Runs at once share nothing but the folder they run in, where their
    file I/O is real (a checkpoint one saves, another loads): so runs at
    once are refused in one folder. One run at a time is the default."""
    if jobs is None:
        return default_jobs(allocators)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise DryRunInputError(f"{argnames.name('jobs')} must be a whole number above 0, got {jobs!r}")
    if min(jobs, len(allocators)) > 1 and (cwd is None or CWD_PER_RUN not in cwd):
        example = argnames.given("cwd", "runs/" + CWD_PER_RUN, quote=False)
        raise DryRunInputError(
            f"{argnames.given('jobs', jobs)} runs allocators at once, and a script's file I/O is real: "
            f"give each run a folder of its own ({example}, made when missing), or leave "
            f"{argnames.name('jobs')} out to run one at a time")
    return jobs


def check_timeout(timeout):
    """--timeout: seconds, above 0, or None (no limit)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise DryRunInputError(f"{argnames.name('timeout')} must be a number of seconds above 0, "
                               f"got {timeout!r}")
    return timeout


def check_platform():
    """A dry run needs Linux: the phantom stands in for the CUDA libraries
    of PyTorch's Linux wheels (LD_PRELOAD), which macOS and Windows lack."""
    if not sys.platform.startswith("linux"):
        raise DryRunInputError(
            f"a dry run needs Linux and PyTorch's CUDA build (pip's Linux wheels), and this is {sys.platform}: "
            "run it in a Linux container or a Colab CPU runtime (docs/would-it-fit.md, 'Where it runs')")


def check_placeholders(sweep_spec, args):
    """A placeholder in the arguments that names the swept variable in
    another case ({BATCH} for --sweep batch=...) would pass on as it is."""
    name = sweep_spec[0]
    for arg in args:
        for found in re.findall(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", str(arg)):
            if found != name and found.lower() == name.lower():
                raise DryRunInputError(f"--sweep {name}=...: the arguments have {{{found}}}, not {{{name}}}: "
                                       "the name and the placeholder must match, case included")


def default_jobs(allocators):
    """Allocators run at once unless asked: one. Runs at once would share
    the folder the script runs in, whose file I/O is real (one run loading
    the checkpoint another is writing); --jobs N with a --cwd per
    allocator asks for more."""
    return 1
