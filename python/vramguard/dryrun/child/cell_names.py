"""How a notebook's code cells are named and read, one rule for the
child's two ways of running them (cells.py, notebook_shell.py) and for the
patch of a notebook (features/remedy_notebook.py)."""
import os

__all__ = ["cell_name", "cell_source"]


def cell_name(path, number):
    """The file name code cell `number` (from 1) runs under: its frames',
    so that the report and the program's recorded sites name its cell."""
    return f"{os.path.basename(path)}[cell {number}]"


def cell_source(cell):
    """A notebook cell's source as one string (nbformat allows a list of lines)."""
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)
