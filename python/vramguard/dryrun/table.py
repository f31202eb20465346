"""The dry run's table, one row per allocator: the model the text report,
the HTML table and a cut-short dry run's table are drawn from."""
from .._core import format_size
from .contract import runs_of
from .outcome import never_used_gpu

__all__ = ["columns", "size_text"]


def size_text(nbytes):
    return "-" if nbytes is None else format_size(int(nbytes))


def _fits_word(fits, unused=False):
    """yes, NO, error; "-" for a run that never used the GPU (no verdict)."""
    return "-" if unused else {True: "yes", False: "NO", None: "error"}[fits]


def _oom_text(run, sweep_name=None):
    oom = run.get("first_oom")
    if not oom:
        error = run.get("error")
        return "-" if error is None else (error if len(error) <= 48 else error[:47] + "...")
    where = oom.get("line") or "unknown line"
    if oom.get("inner_line"):  # the user's line called a library (a Trainer) that asked for it
        where += f" via {oom['inner_line']}"
    request = oom.get("request_bytes")
    text = f"{where} ({size_text(request)})" if request else where
    if oom.get("value") is not None:
        text += f" at {sweep_name}={oom['value']}"
    return text + (" caught" if oom.get("caught") else "")


def _need_text(run, device):
    """The needs column: the smallest device the run fits on ("~" where only
    the replay says so, unchecked by runs), "> the device" for a run that ran
    out of memory on it, else not measured."""
    if run.get("need_bytes"):
        return ("" if run.get("need_checked") else "~") + format_size(int(run["need_bytes"]))
    if run.get("need_above_device"):
        return f"> {format_size(int(device))}"
    return "not measured"


def columns(result):
    headers = ["allocator", "needs", "peak allocated", "peak reserved", "fits", "first OOM (request)"]
    sweep = result.get("sweep")
    if result.get("min_memory"):
        headers.insert(5, "min memory")
    if sweep:
        headers.insert(5, f"largest {sweep['name']}")
    rows = []
    for name, run in runs_of(result).items():
        row = [name, _need_text(run, result["device_bytes"]), size_text(run.get("peak_allocated_bytes")),
               size_text(run.get("peak_reserved_bytes")), _fits_word(run.get("fits"), never_used_gpu(run)),
               _oom_text(run, sweep and sweep["name"])]
        if result.get("min_memory"):
            above = run.get("min_memory_above_bytes")
            row.insert(5, f"> {format_size(above)}" if above else size_text(run.get("min_memory_bytes")))
        if sweep:
            largest = run.get("largest_batch")
            row.insert(5, "unknown" if run.get("fits") is None
                       else "no effect" if run.get("sweep_measured_nothing")
                       else "none" if largest is None else str(largest))
        rows.append(row)
    return headers, rows
