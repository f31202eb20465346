"""The text table people print in a notebook cell, in the spirit of
torch.cuda.memory_summary(), read from a stats dict (Heap.stats(),
vramguard.stats())."""
import textwrap

from .advice import fragmentation_so_what, non_releasable
from .words import a, count
from .._core import BUDGET_NOTHING, format_size
from .._units import format_size_column

_WIDTH = 81

_ROWS = [
    ("Allocated memory", "allocated_bytes", True),
    ("Requested memory", "requested_bytes", True),
    ("Active memory", "active_bytes", True),
    ("Reserved memory", "reserved_bytes", True),
    # free blocks in partly used segments: cached, but empty_cache cannot release them
    ("Non-releasable memory", "inactive_split_bytes", True),
    ("Allocations", "allocation", False),
    ("Active allocations", "active", False),
    ("Segments", "segment", False),
    ("Non-releasable blocks", "inactive_split", False),
]

_POLICY = [
    ("cache hits", "num_cache_hits"),
    ("cache misses", "num_cache_misses"),
    ("splits", "num_splits"),
    ("merges", "num_merges"),
    ("device allocs", "num_device_alloc"),
    ("device frees", "num_device_free"),
    ("device refusals", "num_device_alloc_failed"),
    ("alloc retries", "num_alloc_retries"),
    ("OOMs", "num_ooms"),
    # of them, the arena's that skipped the ladder: no step could have fit
    ("at once", "num_oom_fast_fails"),
    ("device errors", "num_device_errors"),
    ("budget refusals", "num_budget_refusals"),
    ("shrunk segments", "num_shrunk_segments"),
    ("gc releases", "num_gc_releases"),
    ("stream releases", "num_stream_releases"),
    ("sync releases", "num_sync_releases"),
    ("empty_cache calls", "num_empty_cache"),
    ("deferred frees", "num_deferred_frees"),
    ("unmap batches cut short", "num_unmap_skips"),
    ("invalid frees", "num_invalid_frees"),
]


def summary_line(text=""):
    """One row of the table; a text wider than the table wraps onto rows of
    its own, indented, so that no row breaks out of the box."""
    if len(text) <= _WIDTH - 4:
        return "| " + text.ljust(_WIDTH - 4) + " |"
    indent = " " * (len(text) - len(text.lstrip(" "))) + "  "
    parts = textwrap.wrap(text, _WIDTH - 4, subsequent_indent=indent, drop_whitespace=True)
    return "\n".join("| " + part.ljust(_WIDTH - 4) + " |" for part in parts)


def _rule(char="-"):
    return "|" + char * (_WIDTH - 2) + "|"


def _cell(value, is_bytes):
    return format_size_column(max(value, 0)) if is_bytes else str(value)


# The arena speaks of mapped memory and ranges (reserved = mapped; a range is
# the address space of one stream and pool), and its free blocks are never
# stranded, so the non-releasable rows do not apply.
_ARENA_LABELS = {"reserved_bytes": "Mapped memory", "segment": "Ranges"}
_ARENA_SKIPPED = ("inactive_split_bytes", "inactive_split")


def _metric_rows(stats):
    arena = stats.get("arena", False)
    out = []
    header = f"{'Metric':<26}|{'Cur Usage':>11} |{'Peak Usage':>11} |{'Tot Alloc':>11} |{'Tot Freed':>11}"
    out.append(summary_line(header))
    out.append(_rule())
    for label, key, is_bytes in _ROWS:
        if arena and key in _ARENA_SKIPPED:
            continue
        label = _ARENA_LABELS.get(key, label) if arena else label
        for pool, name in (("all", label), ("large_pool", "      from large pool"), ("small_pool", "      from small pool")):
            values = [stats.get(f"{key}.{pool}.{part}", 0) for part in ("current", "peak", "allocated", "freed")]
            cells = "".join(f"{_cell(v, is_bytes):>11} |" for v in values)
            out.append(summary_line(f"{name:<26}|{cells[:-2]}"))
        out.append(_rule())
    return out


def _fragmentation_rows(stats):
    free = stats.get("fragmentation.free_bytes", 0)
    largest = stats.get("fragmentation.largest_free_block", 0)
    # Two different ratios, each named for what it measures: "fragmentation"
    # alone meant both and read as a contradiction.
    rows = [
        summary_line(
            f"Cached free: {format_size(free)} in {count(stats.get('fragmentation.free_blocks', 0), 'block')}, "
            f"largest free block {format_size(largest)}"
        ),
        summary_line(f"{'Cached free in pieces (1 - largest free block / cached free):':66}"
              f"{stats.get('fragmentation.external', 0.0):>8.1%}"),
        summary_line(f"{'Reserved but not allocated (1 - allocated / reserved):':66}"
              f"{stats.get('fragmentation.unused', 0.0):>8.1%}"),
    ]
    if stats.get("arena"):  # the table's non-releasable rows are the segments'
        rows.append(summary_line(f"Non-releasable (free bytes in pages with live tensors): "
                          f"{format_size(non_releasable(stats, True))}"))
    # What one request could have now, never the free address space (which
    # reads as memory beside an out-of-memory); the device is not asked, so
    # memory other processes hold on it is not counted.
    fits = stats.get("fragmentation.largest_allocatable")
    if fits is not None:
        rows.append(summary_line(f"Largest block that could be allocated now: {format_size(fits)}"))
        within = ("(within the budget and what the device has free, the cache released)"
                  if stats.get(DEVICE_ASKED) else
                  "(within the budget and the device's capacity, the cache released; less if other processes "
                  "use the device)")
        rows += [summary_line(text) for text in textwrap.wrap(within, _WIDTH - 4, initial_indent="  ",
                                                       subsequent_indent="  ")]
    so_what = textwrap.wrap(fragmentation_so_what(stats), _WIDTH - 4, subsequent_indent="  ")
    return rows + [summary_line(text) for text in so_what]


#: Set by with_device_room: the largest allocatable figure asked the device.
DEVICE_ASKED = "fragmentation.largest_allocatable_device_asked"


def with_device_room(stats, heap):
    """`stats` with the largest block that could be allocated now as the
    device heap computes it asking the device (the CUDA context and other
    processes take memory the budget does not know of); returns `heap`."""
    if heap is not None:
        stats["fragmentation.largest_allocatable"] = heap.largest_allocatable()
        stats[DEVICE_ASKED] = True
    return heap


def _arena_rows(stats, verbose):
    """Which memory the heap runs on; verbose: what the arena did, its
    provider calls, which cost tens of microseconds each on a GPU, and the
    synchronizations that unmapping needed (counters, not for a first read)."""
    if not stats.get("arena"):
        return [summary_line("Memory: segments (no virtual memory arena)")]
    page = format_size(stats.get("page_size", 0))
    rows = [summary_line(f"Memory: arena, {page} pages; {count(stats.get('num_range_reserves', 0), 'range')} reserved, "
                  f"{stats.get('num_range_releases', 0):,} released")]
    if verbose:
        rows.append(summary_line(f"maps {stats.get('num_maps', 0):,} ({count(stats.get('num_mapped_pages', 0), 'page')}), "
                          f"unmaps {stats.get('num_unmaps', 0):,} "
                          f"({count(stats.get('num_unmapped_pages', 0), 'page')}), "
                          f"syncs before unmapping {stats.get('num_unmap_syncs', 0):,}"))
    return rows


def _pool_rows(stats):
    """What CUDA graphs hold: counted in the figures above and in the
    budget, released only with their graphs."""
    held = stats.get("private_pool_reserved_bytes", 0)
    if not held:
        return []
    pools = stats.get("private_pools", 0)
    live = stats.get("private_pool_allocated_bytes", 0)
    text = (f"CUDA graph private pools: {pools:,} holding {format_size(held)} "
            f"({format_size(live)} in live tensors), included above; kept until their graphs "
            f"are released")
    return [summary_line(line) for line in textwrap.wrap(text, _WIDTH - 4, subsequent_indent="  ")]


def _policy_rows(stats):
    items = [f"{label} {stats[key]}" for label, key in _POLICY if key in stats]
    rows, current = [], ""
    for item in items:
        candidate = f"{current}, {item}" if current else item
        if len(candidate) + 1 > _WIDTH - 4:  # room for the trailing comma
            rows.append(summary_line(current + ","))
            current = item
        else:
            current = candidate
    if current:
        rows.append(summary_line(current))
    return rows


#: What went wrong so far, said in the default form when it happened: a
#: user needs these; the other counters (verbose=True) describe the policy.
_INCIDENTS = [
    ("out-of-memory error", "num_ooms"),
    ("device error", "num_device_errors"),
    ("invalid free", "num_invalid_frees"),
]


#: Of num_ooms, those vramguard's own searches raised (find_max_batch's
#: tries; torch/search_ooms.py), where the caller knows them.
SEARCH_OOMS = "num_search_ooms"


def _searched_words(searched, n):
    if searched == n:
        return "a find_max_batch try" if n == 1 else "all find_max_batch's tries"
    return "of which 1 was a find_max_batch try" if searched == 1 else \
        f"of which {searched:,} were find_max_batch's tries"


def _incidents(stats):
    """"2 out-of-memory errors, 1 invalid free", or "" when none happened;
    the errors find_max_batch's tries raised are said as such."""
    out = []
    for word, key in _INCIDENTS:
        n = stats.get(key)
        if not n:
            continue
        text = count(n, word)
        searched = min(stats.get(SEARCH_OOMS, 0), n) if key == "num_ooms" else 0
        if searched:
            text += f" ({_searched_words(searched, n)})"
        out.append(text)
    return ", ".join(out)


def _subtitle(stats):
    budget = stats.get("budget_bytes", 0)
    if budget == BUDGET_NOTHING:
        subtitle = "budget 0 bytes (a memory fraction of 0)"
    else:
        subtitle = f"budget {format_size(budget)}" if budget else "no budget"
    if stats.get("device_total_bytes"):  # the device a report's header names too
        subtitle += f" on {a(format_size(stats['device_total_bytes']) + ' device')}"
    if stats.get("gc_threshold"):
        subtitle += f", gc threshold {stats['gc_threshold']:.0%}"
    return subtitle


def is_empty(stats):
    """Nothing allocated and nothing reserved now (graph pools count in both)."""
    return not stats.get("allocated_bytes.all.current") and not stats.get("reserved_bytes.all.current")


def _empty_line(stats, title):
    """The whole summary of a device that holds nothing: one line, with the
    peaks when something was held earlier, and what went wrong if anything."""
    held = "mapped" if stats.get("arena") else "reserved"
    text = f"{title} ({_subtitle(stats)}): nothing allocated, nothing {held}"
    peak_reserved = stats.get("reserved_bytes.all.peak", 0)
    if peak_reserved:
        text += (f"; peak allocated {format_size(stats.get('allocated_bytes.all.peak', 0))}, "
                 f"peak {held} {format_size(peak_reserved)}")
    incidents = _incidents(stats)
    return text + (f"; so far {incidents}" if incidents else "")


def format_summary(stats, title="vramguard memory summary", verbose=False):
    """A text table of current, peak, total allocated and total freed for each
    quantity (all, large pool, small pool), then fragmentation and what went
    wrong so far (out-of-memory errors, device errors, invalid frees). `stats`
    is a dict as returned by Heap.stats().

    verbose=True adds every policy counter (cache hits, splits, device calls,
    releases...; the stats dict's num_* keys) and shows the table even for a
    device that holds nothing, which otherwise gets one line."""
    if not verbose and is_empty(stats):
        return _empty_line(stats, title)
    out = [_rule("="), summary_line(f"{title} ({_subtitle(stats)})".center(_WIDTH - 4)), _rule()]
    out += _metric_rows(stats)
    out += _fragmentation_rows(stats)
    incidents = [summary_line(f"So far: {_incidents(stats)}")] if _incidents(stats) else []
    sections = [_arena_rows(stats, verbose), _pool_rows(stats), _policy_rows(stats) if verbose else incidents]
    for rows in filter(None, sections):
        out.append(_rule())
        out += rows
    out.append(_rule("="))
    return "\n".join(out)
