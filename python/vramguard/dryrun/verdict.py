"""The report's verdict: fits, does not fit, failed, or never used the
GPU, per allocator; the ranks that did not fit; the smallest device."""
from .._core import format_size
from .._presets import PRESETS
from ..render.words import a, and_list
from .contract import GRANULE, runs_of
from .outcome import never_used_gpu, phantom_cause, phantom_failed, statuses
from .table import size_text

__all__ = ["card_name", "verdict_lines"]


def card_name(result):
    """The card, and its size where --memory changed it."""
    preset = PRESETS.get(result["gpu"])
    if preset is not None and preset.total_bytes == result["device_bytes"]:
        return result["gpu"]
    return f"{result['gpu']} of {format_size(result['device_bytes'])}"


def verdict_lines(result):
    runs = runs_of(result)
    gpu = card_name(result)
    sweep = result.get("sweep")
    fit = [n for n, r in runs.items() if r.get("fits")]
    oom = [n for n, r in runs.items() if r.get("fits") is False]
    unused = [n for n, r in runs.items() if never_used_gpu(r)]
    failed = [n for n, r in runs.items() if r.get("fits") is None and n not in unused]
    if sweep:
        lines = []
        for n, r in runs.items():
            value = (r.get("failed_at") or {}).get("value")
            if n in unused:
                lines.append(f"{n}: not known, the program never used the GPU")
            elif r.get("fits") is None:
                lines.append(f"{n}: not known, the script failed"
                             + (f" at {sweep['name']}={value}" if value is not None else ""))
            elif r.get("sweep_measured_nothing"):
                lines.append(f"{n}: not measured, the figures were the same at every {sweep['name']} tried")
            elif r.get("largest_batch") is not None:
                last = r["largest_batch"] == sweep["values"][-1]  # what lies above it was never tried
                lines.append(f"{n}: {sweep['name']}={r['largest_batch']}" + (" (the largest tried)" if last else ""))
            else:
                lines.append(f"{n}: no {sweep['name']} fits")
        head = f"Largest {sweep['name']} that fits on {a(gpu)}: " + "; ".join(lines) + "."
    elif len(fit) == len(runs):
        head = f"Fits on {a(gpu)} with {'every allocator tried' if len(runs) > 1 else fit[0]}."
    elif fit:
        head = f"Fits on {a(gpu)} with {and_list(fit)}" + (f"; not with {and_list(oom)}" if oom else "") + "."
    elif oom and not failed and not unused:
        head = f"Does not fit on {a(gpu)} with any allocator tried."
    elif oom:
        head = f"Does not fit on {a(gpu)} with {and_list(oom)}."
    elif failed and all(phantom_failed(runs[n]) for n in failed):
        head = (f"The phantom GPU could not run the program ({phantom_cause(runs[failed[0]])}): "
                "whether it fits is not known.")
    elif failed:
        head = (f"The script failed before its end ({statuses(runs[n] for n in failed)}): "
                "whether it fits is not known.")
    else:
        head = (f"The program never used the GPU: it allocated nothing on the phantom {gpu} and "
                "launched no kernel, so whether it fits is not known.")
    if failed and (fit or oom):
        head += f" With {and_list(failed)} the script failed before its end (below)."
    if unused and (fit or oom or failed):
        head += f" With {and_list(unused)} the program never used the GPU."
    out = [head]
    out += _rank_lines(runs)
    if result.get("min_memory"):
        sizes = {n: r.get("min_memory_bytes") for n, r in runs.items() if r.get("min_memory_bytes")}
        if sizes:
            least = min(sizes.values())
            best = and_list([n for n, size in sizes.items() if size == least])
            smallest = [p.name for p in sorted(PRESETS.values(), key=lambda p: p.total_bytes)
                        if p.total_bytes >= least]
            card = ("" if not smallest
                    else f" (the {result['gpu']} asked about is the smallest preset that holds it)"
                    if smallest[0] == result["gpu"] and card_name(result) == result["gpu"]
                    else f" (the smallest preset that holds it: {smallest[0]})")
            out.append(f"Smallest device: {format_size(least)} with {best}{card}, "
                       f"exact to {GRANULE >> 20} MiB, the CUDA context's "
                       f"{format_size(result.get('context_bytes', 0))} included.")
        elif unused and len(unused) == len(runs):
            out.append("Smallest device: not known: the program never used the GPU.")
        elif any(r.get("fits") is None and n not in unused for n, r in runs.items()):
            out.append("Smallest device: not known: the search stopped where the script failed (below).")
        elif any(r.get("min_memory_above_bytes") for r in runs.values()):
            above = max(r.get("min_memory_above_bytes") or 0 for r in runs.values())
            out.append(f"Smallest device: none found: it did not fit even {a(format_size(above) + ' device')}.")
        else:
            out.append("Smallest device: none found (it does not fit the full device).")
    return out


def _rank_lines(runs):
    """Per run of several ranks (--nproc) whose ranks did not all fit: the
    rank that ran out or failed, where, with its figures, and what the
    others left (torchrun ends every rank when one fails)."""
    lines = []
    for name, run in runs.items():
        ranks = run.get("ranks") or []
        if all(k.get("fits") for k in ranks):
            continue
        said = []
        for k in ranks:
            figures = (f"peak allocated {size_text(k.get('peak_allocated_bytes'))}, "
                       f"reserved {size_text(k.get('peak_reserved_bytes'))}")
            if not k.get("figures", True):
                said.append(f"rank {k['rank']} left no figures")
            elif k.get("first_oom"):
                oom = k["first_oom"]
                request = f" (request {size_text(oom['request_bytes'])})" if oom.get("request_bytes") else ""
                said.append(f"rank {k['rank']} ran out of memory at {oom.get('line') or 'an unknown line'}"
                            f"{request}, {figures}")
            elif k.get("error"):
                at = f" at {k['error_at']}" if k.get("error_at") else ""
                # ended by SIGTERM where another rank ran out or failed first: torchrun's doing
                cause = any(j is not k and (j.get("first_oom") or j.get("error") and j.get("ended") != "SIGTERM")
                            for j in ranks)
                why = (" (torchrun ends the other ranks when one fails)"
                       if k.get("ended") == "SIGTERM" and cause else "")
                said.append(f"rank {k['rank']} ended by {k['error']}{at}{why}, {figures}")
        if said:
            lines.append(f"{name}: " + "; ".join(said) + ".")
    return lines
