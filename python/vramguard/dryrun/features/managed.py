"""Unified memory in a dry run: what cudaMallocManaged handed out (the
paged optimizers of bitsandbytes keep their state there), which the phantom
counts apart from device memory (vg_fakecuda_managed_peak_bytes). It is
outside PyTorch's allocator, so it is in no peak of the table; on a card the
driver keeps it on the device while there is room and pages it out to host
memory under pressure: never an out-of-memory error, slower steps."""
from ..._core import format_size
from ...render.words import a
from .base import Feature


def summarize(result, runs):
    """The dry run's figures, from its runs': the largest (one program, the
    same under every allocator)."""
    for key in ("managed_bytes", "managed_prefetched_bytes"):
        values = [r.get(key) for r in runs if r.get(key) is not None]
        result[key] = max(values) if values else None


def _what(runs):
    paged = any("bitsandbytes" in (r.get("extensions") or []) for r in runs)
    return "Paged optimizer state" if paged else "Unified memory (cudaMallocManaged)"


def note(result, runs):
    """The report's line on unified memory, or None when the program took none."""
    managed = result.get("managed_bytes")
    if not managed:
        return None
    size = format_size(managed)
    amount = f"{size} of unified memory" if _what(runs) == "Paged optimizer state" else size
    return (f"{_what(runs)}: {amount}, outside PyTorch's allocator (in no peak above); a card keeps it "
            "on the device while there is room and pages it out under pressure.")


def verdict(result, runs, device_name):
    """What to expect where PyTorch's peak reserved memory and the unified
    memory together exceed the device: None when they do not."""
    managed = result.get("managed_bytes")
    room = result["device_bytes"] - (result.get("context_bytes") or 0)
    if not managed:
        return None
    over = [r["allocator"] for r in runs
            if r.get("fits") and (r.get("peak_reserved_bytes") or 0) + managed > room]
    if not over:
        return None
    names = over[0] if len(over) == 1 else ", ".join(over[:-1]) + " and " + over[-1]
    return (f"With {names}, peak reserved plus the {format_size(managed)} of unified memory exceeds the "
            f"{format_size(room)} {a(device_name)} leaves after its CUDA context: expect slower steps as the "
            "driver pages the unified memory out to host memory and back, not an out-of-memory error.")


class _Managed(Feature):
    name = "managed"

    def figures(self, state, run):
        import ctypes

        device = run.opts.rank or 0
        return {"managed_bytes": run.counter("vg_fakecuda_managed_peak_bytes", ctypes.c_longlong, device),
                "managed_prefetched_bytes": run.counter("vg_fakecuda_prefetched_peak_bytes", ctypes.c_longlong,
                                                        device)}

    def summarize(self, result, runs):
        summarize(result, runs)

    def verdict_lines(self, result, runs, card):
        return [line for line in (verdict(result, runs, card), note(result, runs)) if line]


FEATURE = _Managed()
