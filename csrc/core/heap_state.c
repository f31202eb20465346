/* The heap's state for an out-of-memory report, copied in one hold of the
 * lock so that its figures agree with each other: the counters, the
 * fragmentation, the idle segments, and the live blocks by power of two
 * (exact bytes: the size-class histogram counts blocks only). The walk is
 * O(blocks); it runs on the failure path, never on the hot path. */
#include "stats.h"
#include "vramguard/report.h"

#include <string.h>

static unsigned log2_class(size_t size)
{
    unsigned k = 0;
    while (k + 1 < VG_LIVE_CLASSES && (size >> (k + 1)) != 0) k++;
    return k;
}

static void walk_segments(const vg_heap *h, vg_heap_state *out)
{
    for (const vg_segment *seg = h->segments; seg; seg = seg->next) {
        out->segments++;
        if (seg->idle) {
            out->idle_segments++;
            /* memory, not address space: a range holds only what is mapped */
            out->idle_segment_bytes += seg->range ? seg->range->mapped : seg->size;
        }
        for (const vg_block *blk = seg->head; blk; blk = blk->next) {
            if (blk->state != VG_BLOCK_LIVE) continue;
            unsigned k = log2_class(blk->size);
            out->live_blocks[k]++;
            out->live_bytes[k] += blk->size;
        }
    }
}

void vg_heap_state_copy(vg_heap *h, vg_heap_state *out)
{
    memset(out, 0, sizeof *out);
    vg_lock_acquire(&h->lock);
    vg__stats_copy(h, &out->stats);
    vg__fragmentation_locked(h, &out->frag);
    walk_segments(h, out);
    vg_lock_release(&h->lock);
}
