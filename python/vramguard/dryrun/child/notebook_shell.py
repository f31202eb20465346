"""A notebook's code cells run in an IPython shell, as a kernel would run
them (a dry run of a .ipynb): get_ipython() is the shell, its magics and
`!` lines run as IPython runs them without a kernel (shell commands are
real, like the script's file I/O), display() prints, and hooks that fire
after each cell (vramguard.meter()) fire. Each cell is compiled under the
name the report gives its lines ("nb.ipynb[cell 3]"). A cell that fails
ends the run with its exception, as "Run all" stops there.

Needs IPython; without it the child runs the cells as plain Python
(child.run_notebook).
"""
import importlib.util
import json
import os
import shutil
import tempfile

from ..contract import DIR_ENV
from .cell_names import cell_name, cell_source

__all__ = ["available", "code_cells", "run_cells"]


def available():
    """Whether IPython can be imported here."""
    return importlib.util.find_spec("IPython") is not None


def code_cells(path):
    """[(name, source)] of the notebook's code cells, in order, numbered
    from 1 as child.notebook_cells numbers them."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    cells = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        cells.append((cell_name(path, len(cells) + 1), cell_source(cell)))
    return cells


def _shell(ipython_dir):
    """An InteractiveShell whose cells compile under the names given to
    it, with no history database and its profile in `ipython_dir` (not the
    user's ~/.ipython)."""
    from IPython.core.compilerop import CachingCompiler
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    class NamedCells(CachingCompiler):
        cell_name = None

        def get_code_name(self, raw_code, transformed_code, number):
            return self.cell_name or super().get_code_name(raw_code, transformed_code, number)

    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config, ipython_dir=ipython_dir, compiler_class=NamedCells)
    # The run reports a failed cell itself (the traceback from the cell's
    # frames, or the out-of-memory line): IPython's copy would be a second.
    shell.showtraceback = lambda *args, **kwargs: None
    # A cell's lines keep their numbers (IPython drops a cell's leading empty
    # lines, which would shift every line the report names).
    manager = shell.input_transformer_manager
    manager.cleanup_transforms = [t for t in manager.cleanup_transforms
                                  if getattr(t, "__name__", "") != "leading_empty_lines"]
    return shell


#: Cell magics whose body is the cell's Python, run once as the cell itself
#: (`pass` in the magic's line, so that every line keeps its number): under
#: IPython's own %%time the body compiles as "<timed exec>", and the report
#: would name that, not the cell. Only their timing and profile go.
_BODY_MAGICS = ("time", "timeit", "prun")


def cell_magic(source):
    """(the magic's name, its line) of a cell that starts with one, else (None, None)."""
    first = source.split("\n", 1)[0].strip()
    if not first.startswith("%%") or not first[2:].split():
        return None, None
    return first[2:].split()[0], first


def _capture_options(line):
    """(the variable or None, stdout, stderr, display) of a %%capture line."""
    words = line.split()[1:]
    names = [w for w in words if not w.startswith("--")]
    return (names[0] if names else None, "--no-stdout" not in words, "--no-stderr" not in words,
            "--no-display" not in words)


def _body(source, line):
    """The cell with its magic's line made `pass` (its number kept)."""
    rest = source.split("\n", 1)[1] if "\n" in source else ""
    return f"pass  # {line}\n" + rest


def _run_one(shell, source):
    """One cell; a body-of-Python magic runs its body as the cell, and
    %%capture's body runs inside IPython's own capture, its variable set."""
    magic, line = cell_magic(source)
    if magic in _BODY_MAGICS:
        return shell.run_cell(_body(source, line), store_history=True)
    if magic == "capture":
        from IPython.utils.capture import capture_output

        name, stdout, stderr, display = _capture_options(line)
        with capture_output(stdout, stderr, display) as captured:
            result = shell.run_cell(_body(source, line), store_history=True)
        if name:
            shell.user_ns[name] = captured
        return result
    return shell.run_cell(source, store_history=True)


def run_cells(path, namespace=None):
    """Runs the notebook's code cells in order in an IPython shell; the
    first that fails raises its exception (SystemExit, KeyboardInterrupt
    and the run's own stops included)."""
    where = os.environ.get(DIR_ENV)
    ipython_dir = tempfile.mkdtemp(prefix="ipython-", dir=where if where and os.path.isdir(where) else None)
    try:
        shell = _shell(ipython_dir)
        if namespace:
            shell.user_ns.update(namespace)
        for name, source in code_cells(path):
            shell.compile.cell_name = name
            result = _run_one(shell, source)
            error = result.error_before_exec or result.error_in_exec
            if error is not None:
                raise error
    finally:
        shutil.rmtree(ipython_dir, ignore_errors=True)
