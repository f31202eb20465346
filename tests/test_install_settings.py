"""install()'s settings read before PyTorch is touched: what a user typed
wrong, or a launcher put in VRAMGUARD_*, is one ValueError naming it, and
nothing is installed. (Settings kept across install() calls need a device:
tests/torch/test_install_settings_torch.py.)"""
import subprocess
import sys
import textwrap

import pytest


def install_error(call, **env):
    """The error install() raises in a fresh interpreter whose `import torch`
    fails, so that only the settings' checks can answer."""
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None
        import vramguard
        try:
            vramguard.{call}
        except Exception as e:
            print(type(e).__name__ + ": " + str(e))
        print("installed", vramguard.is_installed())
    """)
    full_env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("VRAMGUARD_")}
    full_env.update(env)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "installed False"
    return lines[0]


@pytest.mark.parametrize("budget", ["%", " %", "lots%"])
def test_a_percentage_without_a_number_says_what_a_percentage_is(budget):
    assert install_error(f"install(budget={budget!r})") == (
        f"ValueError: a budget given as a percentage must be a number followed by %, e.g. '80%', got {budget!r}")


@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_not_a_gc_threshold(value):
    assert install_error(f"install(gc_threshold={value})") == (
        f"ValueError: gc_threshold must be a fraction in (0, 1], got {value}")


@pytest.mark.parametrize("name, value, said", [
    ("VRAMGUARD_BUDGET", "garbage", "VRAMGUARD_BUDGET='garbage': cannot read 'garbage' as a size"),
    ("VRAMGUARD_BUDGET", "-1", "VRAMGUARD_BUDGET='-1': cannot read '-1' as a size"),
    ("VRAMGUARD_BUDGET", "200%", "VRAMGUARD_BUDGET='200%': a budget given as a fraction of the device must be"),
    ("VRAMGUARD_BUDGET", "%", "VRAMGUARD_BUDGET='%': a budget given as a percentage must be a number"),
    ("VRAMGUARD_BUDGET", "1e400", "VRAMGUARD_BUDGET='1e400': budget '1e400' is too large"),
    ("VRAMGUARD_GC_THRESHOLD", "2", "VRAMGUARD_GC_THRESHOLD='2': gc_threshold must be a fraction in (0, 1]"),
    ("VRAMGUARD_GC_THRESHOLD", "half", "VRAMGUARD_GC_THRESHOLD='half': gc_threshold must be a fraction"),
    ("VRAMGUARD_PATCH_TORCH", "yes", "VRAMGUARD_PATCH_TORCH must be 1 (patch torch.cuda's statistics) or 0"),
    ("VRAMGUARD_PATCH_TORCH", "false", "VRAMGUARD_PATCH_TORCH must be 1"),
])
def test_a_bad_environment_variable_is_named(name, value, said):
    line = install_error("install()", **{name: value})
    assert line.startswith("ValueError: " + said), line


def test_an_argument_is_not_blamed_on_the_variable():
    line = install_error("install(budget='lots')", VRAMGUARD_BUDGET="1GiB")
    assert line.startswith("ValueError: cannot read 'lots' as a size"), line
