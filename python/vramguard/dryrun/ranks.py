"""A run of several ranks (dryrun --nproc, torchrun): one run's figures
from its ranks' records."""
from .contract import read_run

__all__ = ["RANK_KEYS", "ranks_result"]

RANK_KEYS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes", "fits", "first_oom",
             "error", "error_at", "exit_status", "used_gpu", "phantom_unsupported", "ended", "partial")


def ranks_result(paths):
    """One run's figures from its ranks' files (dryrun --nproc): the lowest
    rank's that wrote some, with the peaks the largest of any rank's, fits
    only when every rank fits (False when one ran out of memory), the
    first out-of-memory and error of the lowest rank that had one (its
    `rank` added), and `ranks`, each rank's own (`figures` False for a
    rank that wrote none: torchrun ends the others when one fails).
    OSError when no rank wrote any."""
    ranks = []
    for path in paths:
        try:
            rank = read_run(path).to_run()
        except (OSError, ValueError):
            rank = {"fits": None, "figures": False}
        if rank.get("partial") and rank.get("fits") is not False:
            rank["fits"] = None  # figures up to its last step: it did not reach its end
        ranks.append(rank)
    written = [r for r in ranks if r.get("figures", True)]
    if not written:
        raise OSError("no rank wrote its figures")
    result = dict(written[0])
    result.pop("partial", None)
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes", "host_peak_rss_bytes"):
        values = [r.get(key) for r in ranks if r.get(key) is not None]
        result[key] = max(values) if values else None
    fits = [r.get("fits") for r in ranks]
    result["fits"] = False if False in fits else None if None in fits else True
    for key in ("first_oom", "error"):
        first = next(((i, r) for i, r in enumerate(ranks) if r.get(key)), None)
        result[key] = dict(first[1][key], rank=first[0]) if first and key == "first_oom" else \
            first[1][key] if first else None
        if key == "error":
            result["error_at"] = first[1].get("error_at") if first else None
    result["used_gpu"] = any(r.get("used_gpu") for r in written)
    result["exit_status"] = next((r.get("exit_status") for r in ranks if r.get("exit_status")), 0)
    result["ranks"] = [dict({k: r.get(k) for k in RANK_KEYS}, rank=i, figures=r.get("figures", True))
                       for i, r in enumerate(ranks)]
    return result
