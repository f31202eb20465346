"""What a figure means for the user now: one "so what" line per figure that
people misread. The numbers come from a stats dict (Heap.stats(),
vramguard.stats()); nothing here is recomputed from the heap."""
from .._units import format_size

#: Below this share of the cached free bytes outside the largest free
#: block, the cache is as good as one piece.
_ONE_PIECE = 0.10


def _limit(stats):
    """(bytes, what they are) the cache may grow to: the budget, else the device."""
    budget = stats.get("budget_bytes", 0)
    if budget:
        return budget, "the budget"
    return stats.get("device_total_bytes", 0), "the device"


def non_releasable(stats, arena):
    """Cached bytes empty_cache() cannot give back: under segments the free
    blocks in segments that hold live blocks (inactive_split_bytes); under
    the arena the free bytes of pages that hold live blocks (a page is
    unmapped whole), the cached free bytes less the free whole pages."""
    if arena:
        return max(stats.get("fragmentation.free_bytes", 0) - stats.get("fragmentation.releasable_bytes", 0), 0)
    return stats.get("inactive_split_bytes.all.current", 0)


def fragmentation_so_what(stats):
    """One sentence: does the cache's free memory being in pieces matter
    right now, and what to do about it.

    One request can have the room left under the limit plus the cached free
    blocks that are whole segments (vramguard releases those before it
    reports an OOM). The pieces matter only when that is less than what is
    cached free: a request between the two would fail with the memory there.
    Free blocks between live tensors are `inactive_split_bytes` where the
    stats count them; where they do not, all free blocks are taken to be
    such (so the line says "may")."""
    free = stats.get("fragmentation.free_bytes", 0)
    largest = stats.get("fragmentation.largest_free_block", 0)
    if free == 0:
        return "So what: nothing is cached free, so there is nothing to be in pieces."
    if free - largest <= _ONE_PIECE * free:
        return f"So what: no harm; the free cache is nearly one block ({format_size(largest)} of {format_size(free)})."
    limit, what = _limit(stats)
    room = max(limit - stats.get("reserved_bytes.all.current", 0), 0)
    between = stats.get("inactive_split_bytes.all.current")
    whole = free - min(between, free) if between is not None else 0
    can_have = max(room + whole, largest)
    if can_have >= free:
        if not whole:
            return (f"So what: harmless now; {format_size(room)} of {what} is not reserved yet, more than the "
                    f"{format_size(free)} cached free, so the pieces matter only near the limit.")
        return (f"So what: harmless now; one request can still have {format_size(can_have)} ({format_size(room)} "
                f"not reserved yet under {what}, {format_size(whole)} in wholly free segments), more than the "
                f"{format_size(free)} cached free, so the pieces matter only near the limit.")
    known = between is not None
    return (
        f"So what: it {'matters' if known else 'may matter'} now; a request over {format_size(can_have)} "
        f"{'fails' if known else 'may fail'} although {format_size(free)} is cached free, in pieces between live "
        "tensors. empty_cache() does not help (vramguard releases wholly free segments before an OOM): create "
        "long-lived tensors (weights, optimizer state) first, and drop references to dead ones."
    )
