"""A notebook as remedy_patch.py edits it: its code cells, each parsed as
Python with IPython's lines masked (as the dry run's child runs them), and
the notebook's file written back with changed cells only, in the layout it
was read in, so that a unified diff of the file holds only the changed
lines and `patch -p1` applies it.

A layout is known when re-writing the unchanged notebook gives its file
back byte for byte (Jupyter's: sorted keys, an indent of 1, no ASCII
escapes); a notebook in any other layout is not written as a patch, since
the diff would rewrite the whole file."""
import itertools
import json

from ..child.cell_names import cell_name, cell_source
from ..child.cells import notebook_cells

__all__ = ["NotebookCells"]

# json.dumps options, Jupyter's (nbformat's writer) first.
_LAYOUTS = [dict(indent=indent, sort_keys=sort_keys, ensure_ascii=ascii_only, separators=separators)
            for indent, sort_keys, ascii_only, separators in itertools.product(
                (1, 2, 0, 4), (True, False), (False, True), ((",", ": "), None))]


class NotebookCells:
    """The code cells of the notebook at `path`: cells() gives (name, the
    cell's source, the source the child runs: IPython lines as `pass`, the
    line numbers kept); write(changed) gives the file's text with those
    cells' sources replaced. ValueError says why it cannot be written."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            self.text = f.read()
        try:
            self.notebook = json.loads(self.text)
        except ValueError as exc:
            raise ValueError(f"the notebook is not JSON ({exc})") from None
        self.path = path
        self.end = "\n" if self.text.endswith("\n") else ""
        self.layout = next((layout for layout in _LAYOUTS
                            if self._dumps(self.notebook, layout, self.end) == self.text), None)
        self.code = [c for c in self.notebook.get("cells", []) if c.get("cell_type") == "code"]
        run = {name: source for name, source, action in notebook_cells(path)[0] if action is None}
        self._cells = []
        for number, cell in enumerate(self.code, 1):
            name = cell_name(path, number)
            if name in run:  # a %%writefile or a skipped %% cell runs no Python of its own
                self._cells.append((name, cell_source(cell), run[name]))

    @staticmethod
    def _dumps(notebook, layout, end):
        return json.dumps(notebook, **layout) + end

    def cells(self):
        return list(self._cells)

    def write(self, changed):
        """The notebook's text with each cell named in `changed` given its
        new source, kept as a list of lines where it was one."""
        if self.layout is None:
            raise ValueError("its file is not in a layout this writer reproduces (Jupyter's, or json.dumps'), "
                             "so a patch would rewrite all of it")
        for number, cell in enumerate(self.code, 1):
            source = changed.get(cell_name(self.path, number))
            if source is not None:
                cell["source"] = source.splitlines(True) if isinstance(cell.get("source"), list) else source
        return self._dumps(self.notebook, self.layout, self.end)
