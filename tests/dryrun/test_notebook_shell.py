"""A notebook's cells in the dry run's IPython shell
(python/vramguard/dryrun/child/notebook_shell.py): a cell under a cell
magic whose body is Python (%%time, %%timeit, %%prun, %%capture) is named
by its cell and its own line numbers in a traceback, as every other cell is,
not by IPython's "<timed exec>"."""
import json
import traceback

import pytest

pytest.importorskip("IPython")

from vramguard.dryrun.child import notebook_shell  # noqa: E402


@pytest.fixture(autouse=True)
def _no_shell_left():
    """The shell is the process's IPython singleton: the child's alone in a
    dry run, here gone after each test, so that no other test of this
    process finds itself in IPython."""
    yield
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.clear_instance()


def _notebook(tmp_path, *sources):
    cells = [{"cell_type": "code", "source": s, "metadata": {}, "outputs": [], "execution_count": None}
             for s in sources]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def _where(exc):
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return frame.filename, frame.lineno


@pytest.mark.parametrize("magic", ["%%time", "%%timeit -n1 -r1", "%%prun -q", "%%capture out"])
def test_a_cell_under_a_cell_magic_is_named_by_its_cell(tmp_path, magic):
    path = _notebook(tmp_path, "x = 1", f"{magic}\ny = 2\nraise ValueError('at line 3')")
    with pytest.raises(ValueError) as raised:
        notebook_shell.run_cells(str(path))
    assert _where(raised.value) == ("nb.ipynb[cell 2]", 3)


def test_capture_keeps_what_the_cell_printed_in_its_variable(tmp_path, capsys):
    path = _notebook(tmp_path, "%%capture out\nprint('hidden')", "print('shown:', out.stdout.strip())")
    notebook_shell.run_cells(str(path))
    assert capsys.readouterr().out == "shown: hidden\n"


def test_capture_options_are_read():
    assert notebook_shell._capture_options("%%capture --no-stderr cap") == ("cap", True, False, True)
    assert notebook_shell._capture_options("%%capture") == (None, True, True, True)


def test_a_cell_magic_that_is_not_python_is_run_by_ipython(tmp_path):
    path = _notebook(tmp_path, "%%writefile out.txt\nhello", "print(open('out.txt').read().strip())")
    import os

    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        notebook_shell.run_cells(str(path))
    finally:
        os.chdir(here)
    assert (tmp_path / "out.txt").read_text() == "hello\n"
