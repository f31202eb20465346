"""The report's lines after the table and the verdict: the needs, a
small margin, a card PyTorch has no kernels for, and the notes on what
made a run differ from the card's (the features' among them)."""
from .._core import format_size
from ..render.words import a, and_list, count, plural
from .checks import CWD_PER_RUN
from .contract import GRANULE, runs_of
from .features import FEATURES
from .outcome import PHANTOM_GAPS, phantom_failed
from .table import size_text
from .verdict import card_name

__all__ = ["card_lines", "feature_lines", "margin_lines", "need_lines", "note_lines"]


READS_NOTE = ("values read back from a phantom device are zeros; data-dependent shapes and control "
              "flow may differ from a real run")


def _ranked(needs):
    """"native and vramguard 448.00 MiB, the least; expandable 460.00 MiB"."""
    least = min(needs.values())
    leanest = [n for n, b in needs.items() if b == least]
    others = "; ".join(f"{n} {format_size(b)}" for n, b in sorted(needs.items(), key=lambda i: i[1]) if b != least)
    return f"{and_list(leanest)} {format_size(least)}" + (f", the least; {others}" if others else "")


def _by_value(result, runs, needs):
    """[(the sweep's value or None, {allocator: need})]: needs are ranked
    only among runs of one program, so a sweep's at each value apart, the
    largest value first."""
    if not result.get("sweep"):
        return [(None, needs)]
    groups = {}
    for n, b in needs.items():
        groups.setdefault(runs[n].get("measured_at"), {})[n] = b
    return sorted(groups.items(), key=lambda g: -(g[0] or 0))


def _how_measured(runs, needs):
    checked = [n for n in needs if runs[n].get("need_checked")]
    how = (f"A need is the smallest device a run fits on (the CUDA context included, to {GRANULE >> 20} MiB)")
    if len(checked) == len(needs):
        how += (", checked by runs: it fits a phantom of that size, and one of 16 MiB less does not (a replay of "
                "the run's own recorded allocations under its allocator's policy proposed it)")
    elif not checked:
        how += (", as a replay of the run's own recorded allocations under its allocator's policy finds it, "
                "not checked by runs")
    else:
        how += (f": runs on phantoms checked it for {and_list(checked)}; for "
                f"{and_list([n for n in needs if n not in checked])} it is a replay's of the run's recording, "
                "not checked by runs")
    return how + "; peak reserved is what a cache with room keeps, not what it needs."


def need_lines(result):
    """Which allocator needs the least device memory (the needs column),
    how the needs were found, where runs found another need than the
    replay proposed, and why a need was not measured."""
    runs = runs_of(result)
    needs = {n: r["need_bytes"] for n, r in runs.items() if r.get("need_bytes")}
    lines = []
    if needs:
        groups = _by_value(result, runs, needs)
        if groups[0][0] is None:
            head = f"Needs: {_ranked(needs)}."
        else:
            name = result["sweep"]["name"]
            head = " ".join(f"{'Needs at' if i == 0 else 'At'} {name}={value}: {_ranked(group)}."
                            for i, (value, group) in enumerate(groups))
        lines.append(f"{head} {_how_measured(runs, needs)}")
        off = [(n, runs[n]["need_replayed_bytes"], b) for n, b in needs.items()
               if runs[n].get("need_checked") and runs[n].get("need_replayed_bytes")
               and runs[n]["need_replayed_bytes"] != b]
        if off:
            lines.append("The replay proposed another need than the runs found: " + "; ".join(
                f"{n} {format_size(replayed)} (runs: {format_size(found)})" for n, replayed, found in off) + ".")
    why = {}
    for n, r in runs.items():
        if not r.get("need_bytes") and not r.get("need_above_device") and r.get("need_unmeasured"):
            why.setdefault(r["need_unmeasured"], []).append(n)
    for reason, names in why.items():
        lines.append(f"Need not measured for {and_list(names)}: {reason}.")
    return lines


#: A margin under this share of the memory beside the context (or under
#: SMALL_MARGIN_BYTES) is said: another driver or library can take it.
SMALL_MARGIN_SHARE = 0.02


SMALL_MARGIN_BYTES = 256 << 20


def _spare(result, run):
    """What a run leaves free on the device, at least: the device less what
    it held at the run's peak (the run never held more, so it fits that
    much), or less its need where runs checked the need (it fits there),
    whichever leaves more. A cache with room holds more than it needs; a
    need is rounded up to 16 MiB."""
    device = int(result["device_bytes"])
    bounds = [device - int(run.get("device_peak_bytes") or device)]
    if run.get("need_bytes") and run.get("need_checked"):
        bounds.append(device - int(run["need_bytes"]))
    return max(0, max(bounds))


def margin_lines(result):
    usable = int(result["device_bytes"]) - int(result.get("context_bytes") or 0)
    small = max(usable * SMALL_MARGIN_SHARE, SMALL_MARGIN_BYTES)
    tight = []
    for n, r in runs_of(result).items():
        if r.get("fits") and (r.get("need_checked") or r.get("device_peak_bytes")):
            spare = _spare(result, r)
            if spare < small:
                tight.append(f"{n} fits, with at least {format_size(spare)} to spare")
    if not tight:
        return []
    return ["; ".join(tight) + f" (of the {format_size(usable)} beside the CUDA context, under "
            f"{SMALL_MARGIN_SHARE:.0%} or {format_size(SMALL_MARGIN_BYTES)}): another driver, CUDA version or "
            "library on the card can take that much."]


def card_lines(result):
    """That this PyTorch has no kernels for the card, before any verdict."""
    arch = next((r.get("card_arch") for r in runs_of(result).values() if r.get("card_arch")), None)
    if not arch or arch.get("runs"):
        return []
    return [f"This PyTorch ({result.get('torch') or 'installed'}) has no kernels for {a(result['gpu'])} "
            f"(compute capability {arch['capability']}; it was built for {', '.join(arch['arch_list'])}): on "
            "the card its first CUDA kernel fails. A phantom runs every kernel, so the figures below are those "
            "of the program, which needs a PyTorch built for the card to run there."]


def note_lines(result):
    runs = runs_of(result).values()
    notes = []
    reads = [r.get("d2h_reads") for r in runs if r.get("d2h_reads") is not None]
    if reads and max(reads) > 0:
        notes.append(f"The program read device values back {count(max(reads), 'time')}: {READS_NOTE}.")
    adjusted = [r.get("ddp_adjusted") or 0 for r in runs]
    if adjusted and max(adjusted) > 0:
        notes.append(f"DistributedDataParallel reads device values back at its start and after its first "
                     f"step (zeros here): the dry run gave its {count(max(adjusted), 'DDP module')} init_sync=False "
                     f"and find_unused_parameters=True, the same gradient buckets in their first order.")
    if result.get("no_compile"):
        notes.append("torch.compile was turned off (--no-compile): the figures are eager mode's, usually "
                     "more than a compiled model's (no fusion).")
    elif any((r.get("compiled") or {}).get("torch_compile") for r in runs):
        failed = any(r.get("error") for r in runs)
        notes.append("torch.compile was used: its Triton kernels were built on this CPU for the card's "
                     "architecture and launched as no-ops"
                     + ("; it failed here: run again with --no-compile for eager mode's figures "
                        "(an upper bound, usually)." if failed
                        else ", so the figures are the compiled program's (autotuning, which times "
                             "kernels, chose blindly)."))
    took_over = [r["allocator"] for r in runs if r.get("script_installed_vramguard")]
    if took_over:
        notes.append(f"The script calls vramguard.install() itself: the {and_list(took_over)} "
                     f"run{'s' if len(took_over) > 1 else ''} ran under vramguard too.")
    expected = {"expandable": "expandable_segments:True"}
    own = sorted({r.get("alloc_conf") for r in runs
                  if r.get("alloc_conf") and r.get("alloc_conf") != r.get("alloc_conf_set",
                                                                           expected.get(r["allocator"]))})
    if own:
        notes.append(f"The script sets PYTORCH_CUDA_ALLOC_CONF itself ({'; '.join(own)}): the runs used its "
                     "setting where it was made before CUDA started.")
    for r in runs:
        if r.get("ranks"):
            notes.append(f"{r['allocator']}, per rank (peak allocated / reserved): " + "; ".join(
                f"rank {k['rank']} {size_text(k.get('peak_allocated_bytes'))} / {size_text(k.get('peak_reserved_bytes'))}"
                for k in r["ranks"]) + ".")
    stopped = [r for r in runs if r.get("stopped_at_steps")]
    if stopped:
        notes.append(f"Each run stopped after {result.get('steps')} optimizer steps (--steps).")
    user = result.get("user_alloc_conf")
    given = [(r["allocator"], r.get("alloc_conf_set")) for r in runs if r.get("alloc_conf_set")]
    if user and given:
        notes.append(f"Your PYTORCH_CUDA_ALLOC_CONF={user} was applied: "
                     + "; ".join(f"{n} ran with {conf}" for n, conf in given)
                     + (" (not in vramguard's run: its allocator replaces PyTorch's)."
                        if any(r["allocator"] == "vramguard" for r in runs) else "."))
    for r in runs:
        if r.get("not_run"):
            notes.append(f"{r['allocator']}: {r['error']}.")
        elif r.get("error") and not r.get("ranks"):  # a run of ranks: _rank_lines says which and where
            failed_at = r.get("failed_at") or {}
            at = (f" at {r.get('sweep_name') or (result.get('sweep') or {}).get('name')}={failed_at['value']}"
                  if "value" in failed_at
                  else f" on a device of {format_size(failed_at['memory_bytes'])} (--min-memory)"
                  if "memory_bytes" in failed_at else "")
            whose = "the run failed in the phantom" if phantom_failed(r) else "the script failed"
            where = f", at {r['error_at']}" if r.get("error_at") else ""
            notes.append(f"{r['allocator']}: {whose}{at}: {r['error']}{where} "
                         f"(exit status {r.get('exit_status')}).")
        elif r.get("ended") and not r.get("error"):  # os._exit(0): the script's own end, its figures up to there
            notes.append(f"{r['allocator']}: the script ended itself with {r['ended']}"
                         + (f" at {r['ended_at']}" if r.get("ended_at") else "") + ": the figures are up to there.")
    gaps = sorted({(r["phantom_unsupported"]["last"], r["phantom_unsupported"]["calls"]) for r in runs
                   if phantom_failed(r) and not r.get("not_run") and (r.get("phantom_unsupported") or {}).get("last")})
    for call, calls in gaps:
        notes.append(f"That failure is the phantom's, not the script's: the phantom GPU does not model "
                     f"{call} ({count(calls, 'unsupported call')} in the run), which returned the error.")
    missing = sorted({lib for r in runs for key, lib in PHANTOM_GAPS if key in (r.get("error") or "")})
    if missing:
        notes.append(f"That failure is the phantom's, not the script's: this build of the phantom GPU has no "
                     f"stand-in for {and_list(missing)}.")
    for feature in FEATURES:
        notes += feature.notes(result, runs)
    notes += _program_notes(result)
    if result.get("cwd"):
        per_run = " (--cwd: a folder per allocator)" if CWD_PER_RUN in result["cwd"] else " (--cwd)"
        notes.append(f"The script ran in {result['cwd']}{per_run if result.get('cwd_given') else ''} "
                     "with real file I/O: files it writes (a torch.save checkpoint holds zeros on a phantom) "
                     "overwrite real ones" + ("." if result.get("cwd_given") else "; --cwd DIR runs it elsewhere."))
    return notes


def feature_lines(result):
    """The features' lines right after the verdict (features/)."""
    runs = list(runs_of(result).values())
    return [line for feature in FEATURES for line in feature.verdict_lines(result, runs, card_name(result))]


def _program_notes(result):
    """What made a row another program than the card would run, or hid
    something from every row: cuDNN's benchmark mode kept off, side
    streams, GradScaler's scale, a sweep that changed nothing."""
    runs = runs_of(result)
    notes = []
    kept_off = [n for n, r in runs.items() if r.get("cudnn_benchmark_kept_off")]
    others = [n for n in runs if n not in kept_off]
    if kept_off and others:
        notes.append(f"The script turns cuDNN's benchmark mode on (torch.backends.cudnn.benchmark), which "
                     f"vramguard keeps off (PyTorch's pluggable allocators cannot answer its cacheInfo query): "
                     f"the {and_list(kept_off)} row measured convolutions without it, another cuDNN mode than "
                     f"the {and_list(others)} {plural(len(others), 'row')}.")
    elif kept_off:
        notes.append("The script turns cuDNN's benchmark mode on (torch.backends.cudnn.benchmark), which "
                     "vramguard keeps off: the figures are those of convolutions without it.")
    if any(r.get("side_streams") for r in runs.values()):
        notes.append("The program used CUDA side streams (torch.cuda.Stream, or a library's, such as NCCL's): "
                     "on a phantom queued work is done at once, so memory a card holds until work queued on "
                     "another stream has run (record_stream, a collective's buffers) is not in these figures.")
    if any(r.get("grad_scalers") for r in runs.values()):
        notes.append("GradScaler was used: on a phantom its scale reads 0 (scaler.get_scale(), a logged or saved "
                     "scale) and no step is ever skipped for an inf or NaN gradient.")
    sweep = result.get("sweep")
    same = [n for n, r in runs.items() if r.get("sweep_measured_nothing")]
    if sweep and same:
        token = "{" + sweep["name"] + "}"
        how = (f"it replaced {token} in the arguments" if any(token in arg for arg in result.get("args", []))
               else f"no argument has {token}, so it was only set as the environment variable {sweep['name']}")
        tried = sorted({s["value"] for n in same for s in runs[n].get("sweep") or []})
        notes.append(f"The sweep measured nothing for {and_list(same)}: peak allocated and reserved were the same at "
                     f"{sweep['name']}={and_list([str(v) for v in tried])} ({how}), so no value is the largest "
                     "that fits.")
    return notes
