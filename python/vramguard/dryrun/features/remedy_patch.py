"""The cheapest change as a patch of the user's own script: a unified diff
that `patch -p1` applies in the folder the dry run ran in. remedies.py
applies it to a copy beside the script and dry-runs the copy; the diff is
printed only when that run fits, with that run's peaks.

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


def _before_the_loop(tree, line):
    """The statement a change to the model goes before: the outermost loop
    around `line` in its function (the training loop), else the statement
    at `line` itself."""
    chain = _chain(tree, line)
    if not chain:
        raise NoPatch(f"no statement of the script holds line {line}")
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


def _model_site(program, script):
    site = next(iter(program.get("model_sites") or []), None)
    if site is None:
        raise NoPatch("no frame of the script held the model it trains")
    if os.path.abspath(site["file"]) != os.path.abspath(script):
        raise NoPatch(f"the model is held in {site['file']}, not in the script")
    return site


def _checkpoint(edits, tree, row, program, script):
    how = (row.get("how") or {}).get("checkpoint") or {}
    site = _model_site(program, script)
    anchor = _before_the_loop(tree, site["line"])
    indent = " " * anchor.col_offset
    if how.get("how") == "huggingface":
        lines = [f"{site['name']}.{how.get('method') or 'gradient_checkpointing_enable'}()"]
    else:
        sites = how.get("block_sites") or []
        if not sites or any("<locals>" in s["name"] for s in sites):
            raise NoPatch("its block class is not one the script can name")
        lines = ["from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing"]
        lines += [f"from {s['module']} import {s['name']}" for s in sites if s["module"]]
        classes = ", ".join(s["name"] for s in sites)
        kinds = classes if len(sites) == 1 else f"({classes})"
        lines.append(f"apply_activation_checkpointing({site['name']}, check_fn=lambda m: isinstance(m, {kinds}))")
    edits.insert_lines(anchor.lineno, indent, lines)


def _optimizer(edits, tree, row, program, chosen, script, source_lines):
    site = program.get("optimizer_site")
    if not site:
        raise NoPatch("the script built no torch.optim.Adam or AdamW that the run saw")
    if os.path.abspath(site["file"]) != os.path.abspath(script):
        raise NoPatch(f"the optimizer is built in {site['file']}, not in the script")
    calls = _calls_at(tree, site["line"], (site["class"],))
    if not calls:
        raise NoPatch(f"no {site['class']}(...) call at line {site['line']} of the script")
    call = calls[0]
    if chosen.get("optimizer") == "fused":
        for kw in call.keywords:
            if kw.arg == "foreach":
                edits.replace(kw.value, "False")
        _set_keyword(edits, call, "fused", "True")
        return []
    edits.replace(call.func, f"bnb.optim.{site['class']}8bit")
    for kw in call.keywords:
        if kw.arg not in _BNB_KEYWORDS:
            _drop_keyword(edits, source_lines, call, kw)
    return ["import bitsandbytes as bnb"]


def _autocast(edits, tree, program, chosen, torch):
    half = chosen.get("autocast") or "float16"
    region = program.get("full_width_autocast")
    if region:
        line = int((region.get("made_at") or region["line"]).rsplit(":", 1)[1])
        calls = _calls_at(tree, line, ("autocast",))
        if not calls:
            raise NoPatch(f"no autocast(...) call at line {line} of the script, where its region was built")
        call = calls[0]
        if len(call.args) >= 2:
            edits.replace(call.args[1], f"{torch or 'torch'}.{half}")
        else:
            _set_keyword(edits, call, "dtype", f"{torch or 'torch'}.{half}")
        return []
    name = torch or "torch"
    edits.insert_lines(_after_imports_line(tree), "", [
        f'{name}.set_autocast_enabled("cuda", True); {name}.set_autocast_dtype("cuda", {name}.{half}); '
        f"{name}.set_autocast_cache_enabled(False)  # the program's CUDA work under autocast"])
    return [] if torch else ["import torch"]


def _trainer(edits, tree, row, chosen, acc):
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and (getattr(n.func, "id", None) or getattr(n.func, "attr", None)) == "TrainingArguments"]
    if len(calls) != 1:
        raise NoPatch(f"the script has {len(calls)} TrainingArguments(...) calls, not one")
    call = calls[0]
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


def patch_for(row, remedies, script, cwd):
    """(the patched source, the unified diff, the script's path in it) of
    the row's change to `script`; NoPatch where it cannot be written."""
    if script.endswith(".ipynb"):
        raise NoPatch("a notebook's cells are not written as a patch")
    with open(script, encoding="utf-8") as f:
        source = f.read()
    try:
        tree = ast.parse(source, script)
    except SyntaxError as exc:
        raise NoPatch(f"the script does not parse here ({exc.msg})") from None
    program, chosen = remedies.get("program") or {}, remedies.get("settings") or {}
    acc = row.get("accumulation")
    edits = _Edits(source)
    top = allocator_lines(row["allocator"])
    if program.get("trainer"):
        _trainer(edits, tree, row, chosen, acc)
    else:
        if acc and acc["steps"] > 1:
            raise NoPatch("its gradient accumulation changes the training loop, which is not written as a patch")
        for kind in row["remedies"]:
            if kind == "checkpoint":
                _checkpoint(edits, tree, row, program, script)
            elif kind == "optimizer":
                top += _optimizer(edits, tree, row, program, chosen, script, source.splitlines(True))
            elif kind == "autocast":
                top += _autocast(edits, tree, program, chosen, _torch_name(tree))
    if top:
        edits.insert_lines(_top_insertion_line(tree), "", list(dict.fromkeys(top)), first=True)
    patched = edits.apply()
    rel = os.path.relpath(os.path.abspath(script), cwd)
    if rel.startswith(".."):
        raise NoPatch(f"the script is outside the folder the dry run ran in ({cwd})")
    diff = "".join(difflib.unified_diff(source.splitlines(True), patched.splitlines(True), f"a/{rel}", f"b/{rel}"))
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
    fd, copy = tempfile.mkstemp(prefix=".vramguard-patched-", suffix=".py", dir=folder)
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
