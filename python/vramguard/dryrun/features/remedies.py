"""dryrun --remedies: the standard remedies for an out-of-memory, each run on
the user's unchanged program (remedy_apply.py applies them in the child),
measured rather than estimated: what each one frees, the largest batch it
allows where a batch was swept, and its cost in work (work.py: FLOPs, not
time). Then the combinations the single remedies suggest, greedy, the one
that saves most first, until one fits or all are tried; then the cheapest
change that fits (fewest changes, least extra work) and the lines that
apply it.

The remedies run under one allocator (vramguard's, when the dry run has it):
the allocator rows compare the program as written. The figures of every
row are the runs' own; a remedy that could not be applied says why and
takes no part in the combinations.
"""
import importlib.util

from ..._core import format_size
from ..._presets import autocast_dtype
from ...render.text_table import text_table
from ...render.words import a, count
from ..contract import REMEDIES_ENV, WORK_ENV
from .base import Feature
from .remedy_patch import allocator_lines, patch_and_run, patch_lines

#: A phantom this many times the card's memory: where a setting that runs
#: out of memory on the card takes its steps whole, for its peaks and work.
LARGER = 8

#: The single remedies, in the order they are tried.
SINGLES = ("autocast", "checkpoint", "optimizer")


def settings(preset):
    """What each remedy means on this card and this machine: autocast's
    dtype (bf16 where the card has it: compute capability 8.0 and above;
    fp16 on a T4 or a V100), and the optimizer's replacement (bitsandbytes'
    8-bit Adam where it is installed, else PyTorch's fused Adam)."""
    bnb = importlib.util.find_spec("bitsandbytes") is not None
    return {"autocast": autocast_dtype(preset.compute_capability), "optimizer": "8bit" if bnb else "fused"}


def label(kinds, chosen):
    names = {"autocast": f"autocast {'bf16' if chosen['autocast'] == 'bfloat16' else 'fp16'}",
             "checkpoint": "checkpointing",
             "optimizer": "8-bit AdamW" if chosen["optimizer"] == "8bit" else "fused AdamW"}
    return " + ".join(names[k] for k in kinds)


def env_for(kinds, chosen, regions_only=False):
    """The remedies' environment for a run. regions_only: autocast in the
    program's own full-width regions only (remedy_apply's "@regions"), the
    change a program whose autocast runs in float32 needs."""
    def arg(k):
        return chosen[k] + ("@regions" if k == "autocast" and regions_only else "")

    spec = ",".join(f"{k}:{arg(k)}" if k in ("autocast", "optimizer") else k for k in kinds)
    return {REMEDIES_ENV: spec, WORK_ENV: "1"}


def work_of(run):
    """The work of one optimizer step of a run (work.py); for a program
    that takes no step (inference), of the whole run that ended; or None."""
    work = (run or {}).get("work") or {}
    if work.get("step_flops"):
        return work["step_flops"]
    if work.get("steps_marked") == 0 and run.get("fits"):
        return work.get("total_flops")
    return None


class Measure:
    """Runs a setting (a list of remedies) once, or as the dry run's sweep,
    under the remedies' allocator, and makes its row."""

    def __init__(self, runner, allocator, sweep_spec, chosen, baseline):
        self.runner, self.allocator, self.sweep_spec = runner, allocator, sweep_spec
        self.chosen, self.baseline = chosen, baseline
        self.target = max(sweep_spec[1]) if sweep_spec else None
        self._baseline = None  # its run at the reference arguments, steps whole
        # autocast where the program runs its own regions in float32: in those regions only
        self.regions_only = bool(program_of(baseline).get("full_width_autocast"))

    def row(self, kinds):
        name = label(kinds, self.chosen)
        env = env_for(kinds, self.chosen, self.regions_only)
        what = f"{self.allocator} {name}"
        if self.sweep_spec:
            largest, runs, failed = self.runner.sweep(self.allocator, *self.sweep_spec, extra_env=env, label=what)
            shown = failed or next((r for r in runs if r["sweep_value"] == largest), None)
            at_reference = [r for r in runs if r["sweep_value"] == self.sweep_spec[1][0]]
            row = self._row(kinds, name, shown or at_reference[0] if shown or at_reference else runs[0])
            row.update(largest_value=largest if failed is None else None,
                       fits=(largest == self.target) if failed is None else None,
                       accumulation=accumulation(self.target, largest) if failed is None else None)
        else:
            shown = self.runner.run(self.allocator, what, extra_env=env)
            at_reference = [shown]
            row = self._row(kinds, name, shown)
        if row["applied"] and row["fits"] is not None:
            full = self.reference(env, at_reference, what)
            row["work_flops"] = work_of(full)
            row["work_ratio"] = ratio(row["work_flops"], work_of(self.baseline_reference()))
            if shown is None or shown.get("fits") is False:  # its peaks where the steps ran whole
                self._peaks(row, full)
        return row

    def _peaks(self, row, run):
        """The row's peaks from its run on the larger phantom: its steps'
        where they ran whole; none, with the size, where they ran out even
        there; none at all where that run failed otherwise."""
        whole = run.get("fits") is True
        row.update(peak_allocated_bytes=run.get("peak_allocated_bytes") if whole else None,
                   peak_reserved_bytes=run.get("peak_reserved_bytes") if whole else None,
                   peaks_on_larger_phantom=run.get("device_bytes_asked") if run.get("fits") is not None else None)

    def _row(self, kinds, name, run):
        applied = ((run.get("remedies_seen") or {}).get("applied") or {})
        missing = {k: (applied.get(k) or {}).get("why") or "not applied" for k in kinds
                   if not (applied.get(k) or {}).get("applied")}
        return {"name": name, "remedies": list(kinds), "allocator": self.allocator,
                "peak_allocated_bytes": run.get("peak_allocated_bytes"),
                "peak_reserved_bytes": run.get("peak_reserved_bytes"), "peaks_on_larger_phantom": None,
                "fits": run.get("fits"), "error": run.get("error") if run.get("fits") is None else None,
                "applied": not missing, "why_not": missing or None,
                "how": {k: applied.get(k) for k in kinds if applied.get(k)},
                "work_flops": None, "work_ratio": None}

    def reference(self, env, runs, what):
        """A run at the reference arguments (the script's, or the sweep's
        smallest value) whose optimizer steps ran whole: one of `runs`, else
        one on a phantom large enough for them (an out-of-memory ends a run
        before its steps are whole), stopped after two steps."""
        for r in runs:
            if work_of(r) and r.get("fits"):
                return r
        args, value_env = (self.runner.with_value(self.sweep_spec[0], self.sweep_spec[1][0])
                           if self.sweep_spec else (None, {}))
        larger = self.runner.memory * LARGER
        r = self.runner.run(self.allocator, f"{what} (on a larger phantom)", memory=larger, args=args,
                            extra_env=dict(env, **value_env), snapshot=False, steps=min(self.runner.steps or 2, 2))
        r["device_bytes_asked"] = larger
        return r

    def baseline_reference(self):
        if self._baseline is None:
            if self.sweep_spec:
                first = self.sweep_spec[1][0]
                runs = [dict(e, work={"step_flops": e.get("work_flops")})
                        for e in self.baseline.get("sweep") or [] if e.get("value") == first]
            else:
                runs = [self.baseline]
            self._baseline = self.reference({}, runs, f"{self.allocator} as written")
        return self._baseline

    def as_written(self):
        """The program as written, under the remedies' allocator: the row
        the others are measured against."""
        base = self.baseline
        row = {"name": "as written", "remedies": [], "allocator": self.allocator, "as_written": True,
               "peak_allocated_bytes": base.get("peak_allocated_bytes"),
               "peak_reserved_bytes": base.get("peak_reserved_bytes"), "peaks_on_larger_phantom": None,
               "fits": base.get("fits"), "error": None, "applied": True, "why_not": None, "how": {},
               "work_flops": None, "work_ratio": 1.0}
        if self.sweep_spec:
            largest = base.get("largest_value")
            row.update(largest_value=largest, fits=largest == self.target,
                       accumulation=accumulation(self.target, largest))
        full = self.baseline_reference()
        row["work_flops"] = work_of(full)
        if base.get("fits") is False or (self.sweep_spec and not base.get("largest_value")):
            self._peaks(row, full)
        return row


def ratio(mine, theirs):
    if not mine or not theirs:
        return None
    return round(mine / theirs, 3)


def accumulation(target, largest):
    """The accumulation steps that make up the target batch at the largest
    batch that fits: {"batch", "steps", "effective"}; None when nothing fits."""
    if not largest:
        return None
    steps = -(-target // largest)
    return {"batch": largest, "steps": steps, "effective": largest * steps}


def _saving_key(row):
    """What a remedy buys, larger first: the largest value where swept, then
    the lower peak reserved."""
    reserved = row.get("peak_reserved_bytes")
    return (row.get("largest_value") or 0, -(reserved if reserved is not None else float("inf")))


def allocator_of(result):
    """The allocator the remedies run under: vramguard's, when the dry run has it."""
    allocators = result["allocators"]
    return "vramguard" if "vramguard" in allocators else allocators[0]


def measure(runner, result, preset, sweep_spec, unmeasured=None, device=None):
    """Every row, the cheapest that fits and its code: result["remedies"].
    unmeasured: why the program as written leaves nothing to measure;
    device: the card's words in the sentences ("T4", "T4 of 1.00 GiB")."""
    allocator = allocator_of(result)
    baseline = result[allocator]
    if unmeasured:
        return {"measured": False, "why": unmeasured, "allocator": allocator, "rows": []}
    chosen = settings(preset)
    m = Measure(runner, allocator, sweep_spec, chosen, baseline)
    program = program_of(baseline)
    rows = [m.as_written()]
    for kind in SINGLES:
        skipped = _skip(kind, program, chosen)
        rows.append(_skipped_row(kind, chosen, allocator, skipped) if skipped else m.row([kind]))
    if not any(r.get("fits") for r in rows):
        useful = sorted((r for r in rows if r.get("applied") and r.get("fits") is not None and r["remedies"]),
                        key=_saving_key, reverse=True)
        for n in range(2, len(useful) + 1):
            kinds = [k for r in useful[:n] for k in r["remedies"]]
            rows.append(m.row(kinds))
            if rows[-1].get("fits"):
                break
    out = {"measured": True, "allocator": allocator, "settings": chosen, "rows": rows, "program": program,
           "device": device or result["gpu"],
           "target": m.target, "sweep_name": sweep_spec[0] if sweep_spec else None,
           "sweep_values": list(sweep_spec[1]) if sweep_spec else None}
    out.update(choose(result, out))
    best = best_row(result, out)
    if best is not None and best["remedies"]:
        runner.say("writing the cheapest change as a patch, and running it")
        out["patch"] = patch_and_run(runner, result, out, best, sweep_spec)
    return out


def program_of(run):
    seen = run.get("remedies_seen") or {}
    models = seen.get("models") or []
    return {"trainer": bool(seen.get("trainer")),
            "huggingface": any(m.get("huggingface") for m in models),
            "checkpointing": any(m.get("checkpointing") for m in models),
            "autocast_regions": seen.get("program_autocast_regions") or 0,
            "autocast_off_regions": seen.get("program_autocast_off_regions") or 0,
            "full_width_autocast": seen.get("program_full_width_autocast"),
            "optimizers": seen.get("optimizer_classes") or run.get("optimizers") or [],
            "models": [m.get("class") for m in models],
            "model_sites": [m.get("site") for m in models if m.get("site")],
            "optimizer_site": seen.get("optimizer_site")}


def _skip(kind, program, chosen):
    """Why a remedy is not run at all (what the program as written already
    does), or None."""
    if kind == "autocast" and program.get("autocast_regions"):
        return "the program already runs under autocast, and its own regions keep their dtype"
    if kind == "autocast" and program.get("autocast_off_regions"):
        return ("the program turns autocast off in its own region (torch.autocast(..., enabled=False)), "
                "which a default cannot reach: enable it there")
    if kind == "checkpoint" and program["checkpointing"]:
        return "the program already turns activation checkpointing on"
    if kind == "optimizer":
        others = [o for o in program["optimizers"] if o not in ("Adam", "AdamW")]
        if program["optimizers"] and others and len(others) == len(program["optimizers"]):
            return f"the program's optimizer is {', '.join(others)}, not torch.optim.Adam or AdamW"
        if not program["optimizers"]:
            return "the program built no optimizer"
    return None


def _skipped_row(kind, chosen, allocator, why):
    return {"name": label([kind], chosen), "remedies": [kind], "allocator": allocator,
            "peak_allocated_bytes": None, "peak_reserved_bytes": None, "fits": None, "error": None,
            "applied": False, "why_not": {kind: why}, "how": {}, "work_flops": None, "work_ratio": None,
            "skipped": True}


# ---------------------------------------------------------------- the choice


def _as_written(result, remedies):
    """Whether the program as written fits (the sweep's largest value where
    swept): with PyTorch's default allocator where it was run, else with the
    remedies' own; and the words for that allocator."""
    name = "native" if result.get("native") else remedies["allocator"]
    run = result.get(name) or {}
    fits = (run.get("largest_value") == remedies["target"]) if result.get("sweep") else bool(run.get("fits"))
    words = ("PyTorch's default allocator" if name == "native"
             else f"the {name} allocator (PyTorch's default was not run)")
    return fits, words


def _steps(row):
    acc = row.get("accumulation")
    return acc["steps"] if acc else 1


def _changes(row):
    """What a user changes: each remedy, another allocator, accumulation."""
    return len(row["remedies"]) + (row["allocator"] != "native" and not row["remedies"]) + (_steps(row) > 1)


def _candidates(result, remedies):
    """Every setting that reaches the goal: the program as written under an
    allocator, or a row of remedies, that fits; with a sweep, that fits a
    value (its accumulation making up the largest value asked for)."""
    sweep, target = result.get("sweep"), remedies["target"]
    out = []
    for name in ("native", "expandable", "vramguard"):
        run = result.get(name)
        if not run or (not sweep and (name == "native" or not run.get("fits"))):
            continue
        if sweep and not run.get("largest_value"):
            continue
        what = "gradient accumulation" if name == "native" else f"{name} allocator"
        out.append({"name": what, "remedies": [], "allocator": name, "work_ratio": 1.0,
                    "peak_reserved_bytes": run.get("peak_reserved_bytes"),
                    "accumulation": accumulation(target, run["largest_value"]) if sweep else None})
    for r in remedies["rows"]:
        if r.get("as_written") or not r.get("applied"):
            continue
        if (sweep and r.get("largest_value")) or (not sweep and r.get("fits")):
            out.append(r)
    return out


def choose(result, remedies):
    """{"cheapest": the row's name or None, "sentence", "code": lines}."""
    sweep = result.get("sweep")
    fits, allocator = _as_written(result, remedies)
    if fits:
        what = (f"{sweep['name']}={max(sweep['values'])} fits" if sweep else "it fits")
        return {"cheapest": None, "code": [],
                "sentence": f"As written {what} with {allocator}: nothing needs changing; "
                            "the rows say what each remedy would free."}
    best = best_row(result, remedies)
    if best is None:
        return {"cheapest": None, "code": [], "sentence": _nothing_fits(result, remedies)}
    cost = best.get("work_ratio")
    work = (f", {cost:.2f}x the work" if cost and abs(cost - 1) >= 0.005 else ", no extra work" if cost else "")
    under = (f" (measured with the {best['allocator']} allocator, which the code installs too)"
             if best["remedies"] and best["allocator"] != "native" else "")
    goal, how = "fits", best["name"]
    if sweep:
        name, acc = sweep["name"], best["accumulation"]
        goal = f"makes up {name}={remedies['target']}"
        if acc["steps"] > 1:
            how += (f", {name}={acc['batch']} over {acc['steps']} accumulation steps"
                    + (f" (an effective {acc['effective']})" if acc["effective"] != remedies["target"] else ""))
    return {"cheapest": best["name"], "code": code_for(best, remedies),
            "sentence": f"Cheapest change that {goal}: {how} ({count(_changes(best), 'change')}{work}){under}."}


def best_row(result, remedies):
    """The cheapest setting that reaches the goal, or None: fewest changes,
    then least work, then no accumulation (fewer, larger batches), then the
    lower peak. None too where the program as written fits."""
    if _as_written(result, remedies)[0]:
        return None
    fitting = _candidates(result, remedies)
    if not fitting:
        return None
    return min(fitting, key=lambda r: (_changes(r), round(r.get("work_ratio") or 1.0, 2), _steps(r),
                                       r.get("peak_reserved_bytes") or 0))


def _nothing_fits(result, remedies):
    gpu = a(remedies.get("device") or result["gpu"])
    tried = [r for r in remedies["rows"] if r.get("applied")]
    if not tried:
        return f"No remedy could be applied to this program (the rows say why): nothing tried fits on {gpu}."
    if remedies.get("sweep_name"):
        return f"No remedy tried fits even the smallest {remedies['sweep_name']} on {gpu}."
    low = min(tried, key=lambda r: r.get("peak_reserved_bytes") or 0)
    return (f"Nothing tried fits on {gpu}: the lowest peak, {low['name']}, still reserves "
            f"{format_size(low.get('peak_reserved_bytes') or 0)}; a smaller batch or a larger card is needed.")


def code_for(row, remedies):
    """The lines a user adds for the row's change."""
    program, chosen = remedies.get("program") or {}, remedies.get("settings") or {}
    lines = allocator_lines(row["allocator"])
    for kind in row["remedies"]:
        lines += _remedy_code(kind, row, program, chosen)
    acc = row.get("accumulation")
    if acc and acc["steps"] > 1:
        name = remedies.get("sweep_name") or "batch"
        if program.get("trainer"):
            lines.append(f"TrainingArguments(..., per_device_train_batch_size={acc['batch']}, "
                         f"gradient_accumulation_steps={acc['steps']})")
        else:
            lines.append(f"# {name}={acc['batch']}: the loss divided by {acc['steps']}, backward() every batch, "
                         f"optimizer.step() and zero_grad() every {acc['steps']} batches")
    return lines


def _remedy_code(kind, row, program, chosen):
    trainer = program.get("trainer")
    if kind == "autocast":
        half = chosen.get("autocast") == "float16"
        if trainer:
            return [f"TrainingArguments(..., {'fp16' if half else 'bf16'}=True)"]
        dtype = "torch.float16" if half else "torch.bfloat16"
        region = program.get("full_width_autocast")
        if region:  # the program's own region, in float32: its dtype is the change
            lines = [f'torch.autocast("cuda", dtype={dtype})  # at {region.get("made_at") or region["line"]}, in '
                     f'place of its dtype {region["dtype"]}']
        else:
            lines = [f'with torch.autocast("cuda", dtype={dtype}):  # around the forward pass and the loss']
        if half:
            lines.append('scaler = torch.amp.GradScaler("cuda")  # fp16: scaler.scale(loss).backward(); '
                         "scaler.step(optimizer); scaler.update()")
        return lines
    if kind == "checkpoint":
        how = (row.get("how") or {}).get("checkpoint") or {}
        if trainer:
            return ["TrainingArguments(..., gradient_checkpointing=True)"]
        if how.get("how") == "huggingface":
            return [f"model.{how.get('method') or 'gradient_checkpointing_enable'}()  # before training"]
        sites = how.get("block_sites") or [{"module": None, "name": how.get("block_class") or "Block"}]
        names = ", ".join(site["name"] for site in sites)
        return (["from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing"]
                + [f"from {site['module']} import {site['name']}" for site in sites if site["module"]]
                + [f"apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, "
                   f"{names if len(sites) == 1 else '(' + names + ')'}))"])
    original = ((row.get("how") or {}).get("optimizer") or {}).get("from") or "AdamW"  # Adam or AdamW
    if chosen.get("optimizer") == "8bit":
        if trainer:
            return ['TrainingArguments(..., optim="adamw_bnb_8bit")']
        return ["import bitsandbytes as bnb",
                f"optimizer = bnb.optim.{original}8bit(model.parameters(), lr=...)  # instead of torch.optim.{original}"]
    if trainer:
        return ['TrainingArguments(..., optim="adamw_torch_fused")']
    return [f"optimizer = torch.optim.{original}(model.parameters(), lr=..., fused=True)"]


# ---------------------------------------------------------------- the report


def work_note(result):
    """What the work column counts, and what it did not see."""
    runs = [r for r in (result.get(a) for a in result.get("allocators", [])) if r]
    unseen = ["elementwise and normalization operators (no formula)"]
    if any(((r.get("work") or {}).get("operator_count_stopped_at_compile")) for r in runs):
        unseen.insert(0, "the attention and convolutions inside compiled code")
    kernels = sorted({name for r in runs for name in (r.get("extensions") or {})})
    if kernels:
        unseen.insert(0, f"the custom kernels of {', '.join(kernels)}")
    return ("Work: floating-point operations of one optimizer step (of the whole run for a program that takes "
            "none) relative to the program as written, a count "
            "of work, not a time: matrix products from the cuBLAS calls (exact), attention and convolutions from "
            f"PyTorch's operator formulas; not counted: {'; '.join(unseen)}.")


def _cell(value):
    return format_size(value) if value is not None else "-"


def _peak_cell(row, key):
    value = row.get(key)
    if value is None:
        larger = row.get("peaks_on_larger_phantom")
        return f"> {format_size(larger)}" if larger else "-"
    return format_size(value) + ("*" if row.get("peaks_on_larger_phantom") else "")


def _fits_cell(row):
    if row.get("skipped"):
        return "-"
    return {True: "yes", False: "no", None: "failed"}[row.get("fits")]


def table_lines(result):
    remedies = result.get("remedies")
    if not remedies:
        return []
    if not remedies.get("measured"):
        return [f"Remedies: not measured: {remedies['why']}."]
    sweep = remedies.get("sweep_name")
    headers = ["Remedy", "Peak allocated", "Peak reserved", f"Fits {sweep}={remedies['target']}" if sweep else "Fits"]
    if sweep:
        headers += [f"Largest {sweep}", "Accumulation"]
    headers += ["Work"]
    rows = []
    for r in remedies["rows"]:
        cells = [r["name"], _peak_cell(r, "peak_allocated_bytes"), _peak_cell(r, "peak_reserved_bytes"),
                 _fits_cell(r)]
        if sweep:
            acc = r.get("accumulation")
            cells += [str(r["largest_value"]) if r.get("largest_value") else "-",
                      f"{acc['batch']} x {acc['steps']}" if acc and acc["steps"] > 1 else "-"]
        cells.append(f"{r['work_ratio']:.2f}x" if r.get("work_ratio") else "-")
        rows.append(cells)
    lines = [f"Remedies, each run on the unchanged program with the {remedies['allocator']} allocator:"]
    lines += text_table(headers, rows)
    larger = [r for r in remedies["rows"] if r.get("peaks_on_larger_phantom")]
    if larger:
        size = format_size(larger[0]["peaks_on_larger_phantom"])
        at = f" at {sweep}={remedies['sweep_values'][0]}" if sweep else ""
        lines.append(f"* out of memory on the card: the peak of its steps on a larger phantom ({size}){at}.")
    region = (remedies.get("program") or {}).get("full_width_autocast")
    for r in remedies["rows"]:
        if region and "autocast" in r.get("remedies", ()) and not r.get("why_not"):
            dtype = ((r.get("how") or {}).get("autocast") or {}).get("dtype") or "the card's 16-bit dtype"
            lines.append(f"{r['name']}: the program's own autocast region at {region['line']} runs in "
                         f"{region['dtype']}, which is no mixed precision: this row ran it in {dtype}.")
        for why in (r.get("why_not") or {}).values():
            lines.append(f"{r['name']}: not applied: {why}.")
        if r.get("error") and not r.get("why_not"):
            lines.append(f"{r['name']}: the run failed: {r['error']}")
    lines.append(remedies["sentence"])
    lines += [f"    {line}" for line in remedies.get("code") or []]
    lines += patch_lines(remedies, result.get("cwd"))
    lines.append(work_note(result))
    return lines


class _Remedies(Feature):
    """The watch on what the program does (remedy_apply) in every run of
    --remedies, the remedies a run applies, and the report's table. The
    remedies' own runs are made by measure(), after the others."""
    name = "remedies"

    def install(self, run):
        import os

        from . import remedy_apply
        from ..child.frames import is_user_file, show_file

        if not os.environ.get(WORK_ENV):
            return None
        return remedy_apply.install(run.torch, os.environ.get(REMEDIES_ENV, ""), is_user_file, show_file)

    def figures(self, seen, run):
        return {"remedies_seen": seen.figures() if seen is not None else None}

    def tables(self, result):
        return table_lines(result)


FEATURE = _Remedies()
