"""The names users have today keep working: every public name of the
package (its __all__ and the other public attributes it had when the
modules were flat), vramguard.integrations, and the command line's
subcommands. The list is written down here, not read from the package:
a name that disappears fails this test instead of silently leaving the
list."""
import importlib
import subprocess
import sys

import pytest

import vramguard

# vramguard.__all__ as it was before the modules went into subpackages.
ALL = [
    "VramguardError", "empty_cache", "install", "is_installed", "is_oom", "reset_peaks", "stats",
    "summary",
    "BatchSearch", "Recovered", "find_max_batch", "meter", "recover",
    "FirstOOM", "GpuPreset", "Heap", "LiveSet", "PRESETS", "ReplayResult", "Trace", "TraceFormatError",
    "example_trace", "format_size", "format_summary", "live_at_peak", "load_trace", "min_budget", "parse_budget",
    "parse_size", "plot", "record", "replay", "round_size", "save_trace", "start_recording", "stop_recording",
    "dump_snapshot", "snapshot",
    "MAX_STACK_DEPTH", "StackTable", "format_frame", "live_by_line",
    "LeakWarning", "OOMReport", "last_oom", "leak_check", "regions", "reset_regions", "step", "track",
    "available_policies", "DryRunResult", "dryrun",
]

# Public attributes of the package that are not in __all__.
OTHERS = ["integrations", "__version__"]

INTEGRATIONS = ["FIGURES", "PREFIX", "step_figures", "HFCallback", "LightningCallback"]

SUBCOMMANDS = ["demo", "replay", "dryrun", "install-kernel"]


def test_all_is_unchanged():
    assert sorted(vramguard.__all__) == sorted(ALL)
    assert len(vramguard.__all__) == len(set(vramguard.__all__))


@pytest.mark.parametrize("name", ALL + OTHERS)
def test_every_public_name_imports_from_the_package(name):
    namespace = {}
    exec(f"from vramguard import {name}", namespace)
    assert namespace[name] is getattr(vramguard, name)


def test_star_import_gives_all():
    namespace = {}
    exec("from vramguard import *", namespace)
    assert set(ALL) <= set(namespace)


def test_no_public_name_was_added_or_lost():
    """The package's public attributes: __all__, the subpackages (the
    layers), integrations and the command line's module."""
    layers = {"cli", "notebook", "phantom", "render", "report", "torch", "trace", "integrations"}
    public = {name for name in dir(vramguard) if not name.startswith("_")}
    assert public - layers == set(ALL)


def test_version():
    assert vramguard.__version__ == "0.1.0"


@pytest.mark.parametrize("name", INTEGRATIONS)
def test_integrations(name):
    """Each name resolves; a callback whose library is not installed says
    so with an ImportError when asked for (as before)."""
    module = importlib.import_module("vramguard.integrations")
    try:
        getattr(module, name)
    except ImportError as exc:
        assert name in str(exc)


def test_the_extension_keeps_its_name():
    from vramguard import _core

    assert _core.__name__ == "vramguard._core"
    assert vramguard.Heap is _core.Heap


def test_the_command_line_has_its_subcommands():
    out = subprocess.run([sys.executable, "-m", "vramguard", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    for command in SUBCOMMANDS:
        assert command in out.stdout
    for command in SUBCOMMANDS:
        sub = subprocess.run([sys.executable, "-m", "vramguard", command, "--help"], capture_output=True,
                             text=True, timeout=120)
        assert sub.returncode == 0, (command, sub.stderr)
        assert sub.stdout.startswith("usage: vramguard " + command)


def test_the_console_script_entry_point():
    from vramguard import __main__ as dunder_main
    from vramguard import cli

    assert dunder_main.main is cli.main
