"""A notebook's code cells as the child runs them: in an IPython shell
where IPython is installed (notebook_shell.py), else as plain Python with
IPython's magics and shell lines left out (said), `%%writefile` cells
written, and `%time`-like magics keeping the statement they time."""
import json
import linecache
import re

from .cell_names import cell_name, cell_source
from .log import say

__all__ = ["notebook_cells", "run_notebook"]


_RUN_BODY = {"time", "capture", "timeit", "prun"}  # cell magics whose body is Python to run


#: Line magics whose argument is a statement (after their options): the statement is kept.
_WRAPS = {"time": "", "timeit": "nrp", "prun": "DTls"}  # the options that take a value


_SHELL_ASSIGN = re.compile(r"^[A-Za-z_][\w, ]*=\s*[!%]")


class _Lines:
    """Where a line of Python starts: at a new statement, or inside one
    (open brackets, a string over several lines, a backslash continuation).
    Fed one line at a time; its own small scanner, so that it reads lines
    that are not Python (the magics) as tokenize would not."""

    def __init__(self):
        self.depth = 0
        self.quote = None  # the open string's delimiter
        self.continued = False

    @property
    def at_statement(self):
        return self.depth == 0 and self.quote is None and not self.continued

    def feed(self, line):
        i, n, comment = 0, len(line), False
        while i < n:
            c = line[i]
            if self.quote is not None:
                if c == "\\":
                    i += 2
                    continue
                if line.startswith(self.quote, i):
                    i += len(self.quote)
                    self.quote = None
                    continue
                i += 1
                continue
            if c == "#":
                comment = True
                break
            if c in "'\"":
                self.quote = c * 3 if line.startswith(c * 3, i) else c
                i += len(self.quote)
                continue
            if c in "([{":
                self.depth += 1
            elif c in ")]}":
                self.depth = max(0, self.depth - 1)
            i += 1
        ends_in_backslash = not comment and line.endswith("\\")
        if self.quote is not None and len(self.quote) == 1 and not ends_in_backslash:
            self.quote = None  # a one-line string does not go on past its line
        self.continued = ends_in_backslash and self.quote is None


def _wrapped_statement(stripped):
    """The statement of `%time STMT`, `%timeit -n1 STMT`, `%prun -s cumtime
    STMT`, or None for any other line magic."""
    head, _, rest = stripped[1:].partition(" ")
    takes_value = _WRAPS.get(head)
    if takes_value is None:
        return None
    rest = rest.strip()
    while rest.startswith("-"):
        option, _, after = rest.partition(" ")
        after = after.lstrip()
        if len(option) == 2 and option[1] in takes_value:  # "-n 10": its value is the next word
            after = after.partition(" ")[2].lstrip()
        rest = after
    return rest


def _writefile(first):
    """(the target, its mode) of a `%%writefile [-a|--append] FILE` line."""
    words = first.split()[1:]
    append = any(w in ("-a", "--append") for w in words)
    names = [w for w in words if w not in ("-a", "--append")]
    if not names:
        return None
    target = " ".join(names)
    if len(target) >= 2 and target[0] == target[-1] and target[0] in "'\"":
        target = target[1:-1]
    return target, "a" if append else "w"


def notebook_cells(path):
    """[(filename, source, action)] of the notebook's code cells, in order,
    and the notes saying what was left out. IPython's line magics and shell
    escapes become `pass` (the line numbers kept), but only where a
    statement starts: a `%` or `!` that opens a line inside brackets or
    after a backslash (`    % b)`, `    != y)`) is Python. `%time`,
    `%timeit` and `%prun` keep the statement they time; `%%writefile`
    cells are actions (the file written, or appended to with -a)."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    cells, notes = [], []
    number = 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        number += 1
        source = cell_source(cell)
        name = cell_name(path, number)
        lines = source.splitlines()
        first = lines[0].strip() if lines else ""
        if first.startswith("%%"):
            magic = first[2:].split()[0] if first[2:].split() else ""
            if magic == "writefile" and _writefile(first):
                target, mode = _writefile(first)
                cells.append((name, None, ("writefile", target, "\n".join(lines[1:]) + "\n", mode)))
                continue
            if magic not in _RUN_BODY:
                notes.append(f"cell {number}: %%{magic} cell skipped")
                continue
            lines[0] = f"pass  # %%{magic}"
        out = []
        state = _Lines()
        for i, line in enumerate(lines):
            stripped = line.lstrip()
            indent = line[: len(line) - len(stripped)]
            if state.at_statement and (stripped.startswith(("%", "!")) or _SHELL_ASSIGN.match(stripped)):
                statement = _wrapped_statement(stripped) if stripped.startswith("%") else None
                if statement:
                    out.append(indent + statement)
                    state.feed(statement)
                    continue
                out.append(f"{indent}pass  # IPython: {stripped}")
                notes.append(f"cell {number}, line {i + 1}: {stripped[:60]}")
                continue
            out.append(line)
            state.feed(line)
        cells.append((name, "\n".join(out) + "\n", None))
    return cells, notes


def _display(*objs, **kwargs):
    """IPython's display() outside IPython: each object's repr, printed."""
    for obj in objs:
        print(repr(obj))


def run_notebook(path):
    """The notebook's code cells, in order: in an IPython shell where
    IPython is installed (notebook_shell), else as plain Python, without
    get_ipython() and with the magics and shell lines left out (said)."""
    from . import notebook_shell

    if notebook_shell.available():
        notebook_shell.run_cells(path)
        return
    cells, notes = notebook_cells(path)
    say("IPython is not installed in this Python: the notebook's cells run as plain Python, "
         "where get_ipython() is not defined" + (", and its magics and shell lines are not run: "
                                                  + "; ".join(notes) if notes else ""))
    namespace = {"__name__": "__main__", "__builtins__": __builtins__, "display": _display}
    for name, source, action in cells:
        if action is not None:
            _, target, text, mode = action
            with open(target, mode, encoding="utf-8") as f:
                f.write(text)
            continue
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        exec(compile(source, name, "exec"), namespace)
