"""The dry-run command an out-of-memory report ends with: the one that
measures the standard remedies (autocast, checkpointing, an 8-bit
optimizer, their combinations) on this very program, on a phantom of this
card, without a GPU (python -m vramguard dryrun --remedies).

The program is the script being run (sys.argv, its arguments kept) or the
notebook, whole: a notebook's cells depend on the ones before. Where
neither is known, the command names a placeholder and says so.
"""
import os
import shlex
import sys

from .._presets import PRESETS


def card_flags(device_name, device_total):
    """--gpu for the card's preset (matched by the name CUDA gives), else
    --memory with the card's total."""
    for preset in PRESETS.values():
        if device_name and preset.cuda_name == device_name:
            return ["--gpu", preset.name]
    return ["--memory", str(int(device_total))] if device_total else ["--gpu", "T4"]


def _notebook_path():
    """The running notebook's path where the front end says it: VS Code
    (__vsc_ipynb_file__), Jupyter Server 2 (JPY_SESSION_NAME); else None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None:
        return None
    path = shell.user_ns.get("__vsc_ipynb_file__") or os.environ.get("JPY_SESSION_NAME")
    return path if path and path.endswith(".ipynb") else ""


def program():
    """("script", [path, args...]) or ("notebook", [path]), with "" for a
    path not known; ("unknown", []) outside both."""
    notebook = _notebook_path()
    if notebook is not None:
        return "notebook", [notebook]
    argv = list(sys.argv)
    if argv and argv[0].endswith(".py") and os.path.isfile(argv[0]):
        return "script", argv
    return "unknown", []


def command_line(device_name, device_total):
    """The report's line: the command, or a command with a placeholder."""
    kind, words = program()
    flags = ["python", "-m", "vramguard", "dryrun"] + card_flags(device_name, device_total) + ["--remedies"]
    if kind == "script":
        return f"Measure the remedies on this script, without a GPU: {shlex.join(flags + words)}"
    if kind == "notebook" and words[0]:
        return (f"Measure the remedies on this notebook, without a GPU (the whole notebook: its cells depend on "
                f"the ones before): {shlex.join(flags + words)}")
    if kind == "notebook":
        return ("Measure the remedies on this notebook, without a GPU (the whole notebook: its cells depend on "
                f"the ones before): {shlex.join(flags)} NOTEBOOK.ipynb")
    return f"Measure the remedies on the program, without a GPU: {shlex.join(flags)} SCRIPT.py ARGS..."
