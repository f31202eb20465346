"""The cheapest change as a patch of the user's own script or notebook: a
unified diff that `patch -p1` applies in the folder the dry run ran in.
remedies.py applies it to a copy beside the program and dry-runs the copy;
the diff is printed only when that run fits, with that run's peaks. A
notebook is edited cell by cell (remedy_notebook.py), each cell a unit as a
script is one.

Each remedy is an edit at the place the program's own run recorded
(remedy_apply.py): the allocator and the imports at the script's top; the
checkpointing before the loop of the function that holds the model; the
optimizer at the line that builds it; autocast after the imports, or at the
program's own float32 region; a Trainer's changes as TrainingArguments'
keywords. What cannot be written so raises NoPatch with the reason, said in
the report instead of a diff."""
import ast
import difflib
import os
import tempfile

from ..._files import write_atomically
from .remedy_notebook import NotebookCells

__all__ = ["NoPatch", "allocator_lines", "patch_for", "patch_and_run"]

_LOOPS = (ast.For, ast.While, ast.AsyncFor)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef)
#: What bitsandbytes' AdamW8bit takes of torch's Adam's keywords (remedy_apply._adam_kwargs).
_BNB_KEYWORDS = ("lr", "betas", "eps", "weight_decay")
_TRAINER_OPTIM = {"8bit": "adamw_bnb_8bit", "fused": "adamw_torch_fused"}


class NoPatch(Exception):
    """The change cannot be written as a patch; the message says why."""


class _Edits:
    """Text edits of one file at (line, column) positions, applied from the
    last to the first so that each keeps its place."""

    def __init__(self, source):
        self.lines = source.splitlines(True)
        self.edits = []  # (line, col, end_line, end_col, text): 1-based lines, 0-based columns
        self.first = set()  # edits that go above any other at their place

    def insert_lines(self, before_line, indent, lines, first=False):
        if first:
            self.first.add(len(self.edits))
        self.edits.append((before_line, 0, before_line, 0, "".join(f"{indent}{line}\n" for line in lines)))

    def replace(self, node, text):
        self.edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, text))

    def insert_at(self, line, col, text):
        self.edits.append((line, col, line, col, text))

    def apply(self):
        lines = list(self.lines)
        # the last first; at one place, the one made last first too, so that they read in the order made
        order = sorted(range(len(self.edits)),
                       key=lambda i: (self.edits[i][0], self.edits[i][1], -1 if i in self.first else i), reverse=True)
        for line, col, end_line, end_col, text in (self.edits[i] for i in order):
            if line > len(lines):
                lines.append("")
            head = lines[line - 1][:col]
            tail = lines[end_line - 1][end_col:] if end_line <= len(lines) else ""
            lines[line - 1:end_line] = [head + text + tail]
        return "".join(lines)


class _Unit:
    """One file, or one notebook cell: its source, the tree of the Python
    that runs (a cell's IPython lines masked as `pass`), and its edits."""

    def __init__(self, name, source, runs=None, label=None):
        self.name, self.source = name, source
        self.label = label or name  # how a sentence names it: "the script", or the cell
        runs = source if runs is None else runs
        try:
            self.tree = ast.parse(runs, name)
        except SyntaxError as exc:
            raise NoPatch(f"{self.label} does not parse here ({exc.msg})") from None
        self.edits = _Edits(source)
        self.masked = {i for i, (line, ran) in enumerate(zip(source.splitlines(), runs.splitlines()), 1)
                       if line != ran}

    def check_unmasked(self):
        """NoPatch where an edit within a line falls on one IPython runs
        (a magic or a shell line), whose columns are not the Python's."""
        for line, col, end_line, end_col, _ in self.edits.edits:
            whole_lines = col == 0 and end_col == 0 and line == end_line
            if not whole_lines and self.masked.intersection(range(line, end_line + 1)):
                raise NoPatch(f"line {line} of {self.name} is an IPython line")


class _Program:
    """The units a patch edits: the script, or the notebook's code cells.
    unit(file) is the one a recorded site's file names."""

    def __init__(self, units, kind, cwd):
        self.units, self.kind, self.cwd = units, kind, cwd

    def unit(self, file, what):
        """The unit `file` names: a cell's name, or a path (relative ones,
        as the report shows them, from the folder the run ran in)."""
        for unit in self.units:
            if self.kind == "notebook":
                same = unit.name == file
            else:
                same = os.path.abspath(unit.name) == os.path.abspath(os.path.join(self.cwd, file))
            if same:
                return unit
        raise NoPatch(f"{what} in {file}, not in the {self.kind}")

    def top(self):
        """(the unit, the line) where the allocator's lines and the imports
        go: the script's top; a notebook's first cell that imports, before
        its first import (after any `pip install` lines of that cell)."""
        if self.kind != "notebook":
            return self.units[0], _top_insertion_line(self.units[0].tree)
        for unit in self.units:
            imports = [n for n in unit.tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
            if imports:
                return unit, imports[0].lineno
        raise NoPatch("no cell of the notebook imports anything, to put the change's imports before")

    def torch(self):
        """(the unit, the name) of the first top-level `import torch`, or (None, None)."""
        for unit in self.units:
            name = _torch_name(unit.tree)
            if name:
                return unit, name
        return None, None


def _top_insertion_line(tree):
    """The line before which the script's first statements go: after its
    docstring and `from __future__` imports."""
    for node in tree.body:
        is_doc = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(
            node.value.value, str)
        if not is_doc and not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            return node.lineno
    return (tree.body[-1].end_lineno + 1) if tree.body else 1


def _torch_name(tree):
    """The name the script's top level binds torch to, or None."""
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch":
                    return alias.asname or "torch"
    return None


def _after_imports_line(tree):
    """The line after the script's last top-level import."""
    last = None
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            last = node
        elif last is not None:
            break
    return (last.end_lineno + 1) if last is not None else _top_insertion_line(tree)


def _chain(tree, line):
    """The statements containing `line`, outermost first, from the innermost
    function that contains it (or the module)."""
    chain, body = [], tree.body
    while True:
        inside = [n for n in body if isinstance(n, ast.stmt) and n.lineno <= line <= n.end_lineno]
        if not inside:
            return chain
        node = inside[0]
        if isinstance(node, _SCOPES):
            chain = []  # a function: its own statements are the scope
        elif isinstance(node, ast.ClassDef):
            return chain
        else:
            chain.append(node)
        body = [child for field in ("body", "orelse", "finalbody", "handlers") for child in getattr(node, field, [])]
        body = [b for h in body for b in (h.body if isinstance(h, ast.ExceptHandler) else [h])]


def _before_the_loop(unit, line):
    """The statement a change to the model goes before: the outermost loop
    around `line` in its function (the training loop), else the statement
    at `line` itself."""
    chain = _chain(unit.tree, line)
    if not chain:
        raise NoPatch(f"no statement of {unit.label} holds line {line}")
    loops = [n for n in chain if isinstance(n, _LOOPS)]
    return loops[0] if loops else chain[-1]


def _calls_at(tree, line, names):
    """The calls spanning `line` whose function's last name is one of `names`, innermost first."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.lineno <= line <= node.end_lineno:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in names:
                found.append(node)
    return sorted(found, key=lambda n: (n.end_lineno - n.lineno, n.end_col_offset - n.col_offset))


def _set_keyword(edits, call, name, value):
    """`name=value` in the call: its value replaced where given, else added last."""
    for kw in call.keywords:
        if kw.arg == name:
            edits.replace(kw.value, value)
            return
    given = bool(call.args or call.keywords)
    edits.insert_at(call.end_lineno, call.end_col_offset - 1, (", " if given else "") + f"{name}={value}")


def _drop_keyword(edits, source_lines, call, kw):
    """Removes `kw` (and the comma before it) from a call written on one line."""
    if kw.value.end_lineno != kw.value.lineno or call.lineno != call.end_lineno:
        raise NoPatch(f"the optimizer's {kw.arg}= spans lines; remove it by hand")
    line = source_lines[kw.value.lineno - 1]
    start = line.rfind(",", 0, kw.value.col_offset)
    start = line.rfind(kw.arg, 0, kw.value.col_offset) if start < 0 else start
    edits.edits.append((kw.value.lineno, start, kw.value.lineno, kw.value.end_col_offset, ""))


def _model_site(program, units):
    site = next(iter(program.get("model_sites") or []), None)
    if site is None:
        raise NoPatch(f"no frame of the {units.kind} held the model it trains")
    return site, units.unit(site["file"], "the model is held")


def _checkpoint(units, row, program):
    how = (row.get("how") or {}).get("checkpoint") or {}
    site, unit = _model_site(program, units)
    anchor = _before_the_loop(unit, site["line"])
    indent = " " * anchor.col_offset
    if how.get("how") == "huggingface":
        lines = [f"{site['name']}.{how.get('method') or 'gradient_checkpointing_enable'}()"]
    else:
        sites = how.get("block_sites") or []
        if not sites or any("<locals>" in s["name"] for s in sites):
            raise NoPatch(f"its block class is not one the {units.kind} can name")
        lines = ["from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing"]
        lines += [f"from {s['module']} import {s['name']}" for s in sites if s["module"]]
        classes = ", ".join(s["name"] for s in sites)
        kinds = classes if len(sites) == 1 else f"({classes})"
        lines.append(f"apply_activation_checkpointing({site['name']}, check_fn=lambda m: isinstance(m, {kinds}))")
    unit.edits.insert_lines(anchor.lineno, indent, lines)


def _optimizer(units, program, chosen):
    site = program.get("optimizer_site")
    if not site:
        raise NoPatch(f"the {units.kind} built no torch.optim.Adam or AdamW that the run saw")
    unit = units.unit(site["file"], "the optimizer is built")
    calls = _calls_at(unit.tree, site["line"], (site["class"],))
    if not calls:
        raise NoPatch(f"no {site['class']}(...) call at line {site['line']} of {unit.label}")
    call, edits = calls[0], unit.edits
    if chosen.get("optimizer") == "fused":
        for kw in call.keywords:
            if kw.arg == "foreach":
                edits.replace(kw.value, "False")
        _set_keyword(edits, call, "fused", "True")
        return []
    edits.replace(call.func, f"bnb.optim.{site['class']}8bit")
    for kw in call.keywords:
        if kw.arg not in _BNB_KEYWORDS:
            _drop_keyword(edits, unit.source.splitlines(True), call, kw)
    return ["import bitsandbytes as bnb"]


def _autocast(units, program, chosen):
    half = chosen.get("autocast") or "float16"
    region = program.get("full_width_autocast")
    torch_unit, torch = units.torch()
    if region:
        file, line = (region.get("made_at") or region["line"]).rsplit(":", 1)
        unit = units.unit(file, "its autocast region is built")
        calls = _calls_at(unit.tree, int(line), ("autocast",))
        if not calls:
            raise NoPatch(f"no autocast(...) call at line {line} of {unit.label}, "
                          "where its region was built")
        call = calls[0]
        if len(call.args) >= 2:
            unit.edits.replace(call.args[1], f"{torch or 'torch'}.{half}")
        else:
            _set_keyword(unit.edits, call, "dtype", f"{torch or 'torch'}.{half}")
        return []
    name = torch or "torch"
    unit = torch_unit or units.top()[0]
    unit.edits.insert_lines(_after_imports_line(unit.tree), "", [
        f'{name}.set_autocast_enabled("cuda", True); {name}.set_autocast_dtype("cuda", {name}.{half}); '
        f"{name}.set_autocast_cache_enabled(False)  # the program's CUDA work under autocast"])
    return [] if torch else ["import torch"]


def _trainer(units, row, chosen, acc):
    calls = [(unit, n) for unit in units.units for n in ast.walk(unit.tree) if isinstance(n, ast.Call)
             and (getattr(n.func, "id", None) or getattr(n.func, "attr", None)) == "TrainingArguments"]
    if len(calls) != 1:
        raise NoPatch(f"the {units.kind} has {len(calls)} TrainingArguments(...) calls, not one")
    unit, call = calls[0]
    edits = unit.edits
    for kind in row["remedies"]:
        if kind == "checkpoint":
            _set_keyword(edits, call, "gradient_checkpointing", "True")
        elif kind == "autocast":
            _set_keyword(edits, call, "bf16" if chosen.get("autocast") == "bfloat16" else "fp16", "True")
        elif kind == "optimizer":
            _set_keyword(edits, call, "optim", repr(_TRAINER_OPTIM[chosen.get("optimizer")]))
    if acc and acc["steps"] > 1:
        _set_keyword(edits, call, "per_device_train_batch_size", str(acc["batch"]))
        _set_keyword(edits, call, "gradient_accumulation_steps", str(acc["steps"]))


def allocator_lines(allocator):
    """The lines that put a program under `allocator`: printed as the
    cheapest change's code (remedies.code_for) and written at the script's top."""
    if allocator == "vramguard":
        return ["import vramguard; vramguard.install()  # before the first CUDA call"]
    if allocator == "expandable":
        return ['import os; os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # before importing torch']
    return []


def _units(script, cwd):
    """(the _Program of `script`'s units, the notebook's cells or None)."""
    if script.endswith(".ipynb"):
        try:
            cells = NotebookCells(script)
        except ValueError as exc:
            raise NoPatch(str(exc)) from None
        return _Program([_Unit(name, source, runs) for name, source, runs in cells.cells()], "notebook", cwd), cells
    with open(script, encoding="utf-8") as f:
        source = f.read()
    return _Program([_Unit(os.path.abspath(script), source, label="the script")], "script", cwd), None


def patch_for(row, remedies, script, cwd):
    """(the patched text, the unified diff, the program's path in it) of
    the row's change to `script` (a script or a notebook); NoPatch where it
    cannot be written."""
    units, cells = _units(script, cwd)
    program, chosen = remedies.get("program") or {}, remedies.get("settings") or {}
    acc = row.get("accumulation")
    top = allocator_lines(row["allocator"])
    if program.get("trainer"):
        _trainer(units, row, chosen, acc)
    else:
        if acc and acc["steps"] > 1:
            raise NoPatch("its gradient accumulation changes the training loop, which is not written as a patch")
        for kind in row["remedies"]:
            if kind == "checkpoint":
                _checkpoint(units, row, program)
            elif kind == "optimizer":
                top += _optimizer(units, program, chosen)
            elif kind == "autocast":
                top += _autocast(units, program, chosen)
    if top:
        unit, line = units.top()
        unit.edits.insert_lines(line, "", list(dict.fromkeys(top)), first=True)
    for unit in units.units:
        unit.check_unmasked()
    changed = {unit.name: unit.edits.apply() for unit in units.units if unit.edits.edits}
    original = cells.text if cells else units.units[0].source
    try:
        patched = cells.write(changed) if cells else changed.get(units.units[0].name, original)
    except ValueError as exc:
        raise NoPatch(str(exc)) from None
    rel = os.path.relpath(os.path.abspath(script), cwd)
    if rel.startswith(".."):
        raise NoPatch(f"the {units.kind} is outside the folder the dry run ran in ({cwd})")
    diff = "".join(difflib.unified_diff(original.splitlines(True), patched.splitlines(True), f"a/{rel}", f"b/{rel}"))
    return patched, diff, rel


def patch_and_run(runner, result, remedies, row, sweep_spec):
    """The row's change as a patch, applied to a copy of the script beside
    it (so that its imports resolve as the script's) and dry-run as the user
    would run it (the patch installs any allocator it needs), at the sweep's
    largest value where swept: {"written": True, "diff", "file", "path" (the
    .patch in the dry run's folder), "fits", the run's peaks, its error}, or
    {"written": False, "why"}. The copy is removed after its run."""
    script = result["script"]
    try:
        patched, diff, rel = patch_for(row, remedies, script, result["cwd"])
    except NoPatch as exc:
        return {"written": False, "why": str(exc)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:  # the dry run's figures stand
        return {"written": False, "why": f"writing it failed here ({type(exc).__name__}: {exc})"}
    folder = os.path.dirname(os.path.abspath(script))
    fd, copy = tempfile.mkstemp(prefix=".vramguard-patched-", suffix=os.path.splitext(script)[1] or ".py",
                                dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(patched)
        args, env = runner.with_value(sweep_spec[0], max(sweep_spec[1])) if sweep_spec else (None, {})
        run = runner.run("native", f"the patched {rel}", args=args, extra_env=env, snapshot=False, script=copy)
    finally:
        try:
            os.unlink(copy)
        except FileNotFoundError:
            pass
    path = os.path.join(runner.out_dir, "cheapest.patch")
    write_atomically(path, diff)
    return {"written": True, "diff": diff, "file": rel, "path": path, "fits": run.get("fits"),
            "peak_allocated_bytes": run.get("peak_allocated_bytes"),
            "peak_reserved_bytes": run.get("peak_reserved_bytes"), "error": run.get("error")}


def patch_lines(remedies, cwd):
    """The report's lines on the patch: the diff where its run fit, else why not."""
    from ..._core import format_size

    patch = remedies.get("patch")
    if not patch:
        return []
    if not patch["written"]:
        return [f"Not written as a patch: {patch['why']}."]
    peaks = (f"peak allocated {format_size(patch['peak_allocated_bytes'] or 0)}, "
             f"reserved {format_size(patch['peak_reserved_bytes'] or 0)}")
    if patch["fits"] is not True:
        how = "ran out of memory" if patch["fits"] is False else f"failed ({patch['error']})"
        return [f"Written as a patch of {patch['file']} ({patch['path']}), the change was run on a copy, which "
                f"{how}, {peaks}: not shown, since it is not the row's program."]
    return ([f"As a patch of {patch['file']}, run on a copy: it fits, {peaks}. In {cwd}: "
             f"patch -p1 < {patch['path']}"] + [f"    {line}" for line in patch["diff"].splitlines()])
