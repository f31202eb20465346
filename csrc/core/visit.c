/* Visiting every segment and block in one hold of the lock, so that what
 * the visitors see (snapshots, the memory map) is one state of the heap.
 * They run under the lock: they copy, and build nothing that could wait
 * (lock.h says why). */
#include "heap_internal.h"

int vg_heap_visit(vg_heap *h, vg_segment_visitor on_segment, vg_block_visitor on_block, void *arg)
{
    int rc = 0;
    vg_lock_acquire(&h->lock);
    for (vg_segment *seg = h->segments; seg && !rc; seg = seg->next) {
        vg_segment_info si = {seg->addr, seg->size, seg->stream->key, seg->pool, 0, 0,
                              seg->range ? seg->range->mapped : seg->size, NULL, 0, 0};
        if (seg->range) {
            si.pages = seg->range->pages;
            si.page_words = seg->range->words;
            si.page_size = (size_t)1 << h->page_shift;
        }
        for (vg_block *blk = seg->head; blk; blk = blk->next) {
            si.blocks++;
            if (blk->state == VG_BLOCK_LIVE) si.allocated += blk->size;
        }
        if (on_segment) rc = on_segment(arg, &si);
        for (vg_block *blk = seg->head; blk && on_block && !rc; blk = blk->next) {
            vg_block_info bi = {blk->addr, blk->size, blk->requested, blk->state, blk->stack};
            rc = on_block(arg, &bi);
        }
    }
    vg_lock_release(&h->lock);
    return rc;
}
