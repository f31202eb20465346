/* The interval peak: the heap's one resettable maximum of allocated bytes,
 * beside the stats' own peaks (which reset_peaks owns). The alloc path
 * keeps it with one compare (heap.c, after a block is taken); frees cannot
 * raise it. A reader that keeps several counters (Python's regions) takes
 * it at each of their boundaries and folds it into every counter open
 * then, so one field serves any number of nested counters. */
#include "stats.h"
#include "vramguard/report.h"

void vg_heap_take_interval(vg_heap *h, vg_interval *out)
{
    vg_lock_acquire(&h->lock);
    const vg_stat *allocated = &h->stats.allocated_bytes[VG_STAT_ALL];
    out->current = allocated->current;
    out->allocated_total = vg__stat_allocated_total(h->stats.allocated_bytes);
    /* The interval began at some current no higher than its peak. */
    out->peak = h->interval_peak > allocated->current ? h->interval_peak : allocated->current;
    h->interval_peak = allocated->current;
    vg_lock_release(&h->lock);
}
