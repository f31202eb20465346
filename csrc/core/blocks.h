/* Block bookkeeping, the hot half: block records from the free list, the
 * idle-segment list, free blocks in and out of their bins, a block split
 * when taken for an allocation (vg__block_take, vg__block_split) and
 * coalesced when freed (vg__block_make_free), with the counters each
 * changes. An allocation and a free of a cached block run all of it, so it
 * is inline (VG_HOT): the entry points in heap.c compile it into
 * themselves and the pair makes no call here. blocks.c has the cold half:
 * the slabs the records are cut from. */
#ifndef VG_BLOCKS_H
#define VG_BLOCKS_H

#include "heap_internal.h"
#include "addr_map.h"
#include "bins.h"
#include "check.h"
#include "stats.h"

/* ------------------------------------------------------------------ */
/* Block records                                                       */
/* ------------------------------------------------------------------ */

/* blocks.c. Metadata records come from slabs and go back to free lists,
 * so the hot path never calls malloc; the slabs are freed with the heap.
 * A slab of VG_BLOCK_SLAB records of `item_size` bytes, NULL when the
 * host says no. */
void *vg__slab_new(vg_heap *h, size_t item_size);
void vg__slabs_free(vg_heap *h);
/* Cut a slab of block records into the free list; false when the host
 * says no. Out of line: the hot path finds a record on the list. */
bool vg__block_record_refill(vg_heap *h);

/* A spare block record is at hand, so that the next split cannot fail
 * (the arena maps only the pages of the split-off block). */
static inline bool vg__block_record_ready(vg_heap *h)
{
    return h->spare_blocks || vg__block_record_refill(h);
}

/* A block record from the free list, NULL when it is empty and the host
 * has no memory for a slab. */
VG_HOT vg_block *vg__block_new(vg_heap *h)
{
    if (!h->spare_blocks && !vg__block_record_refill(h)) return NULL;
    vg_block *blk = h->spare_blocks;
    h->spare_blocks = blk->link.spare_next;
    /* The callers set the address, size, segment and links. */
    blk->prev = blk->next = NULL;
    blk->uses = NULL;
    blk->requested = 0;
    blk->freed_at = 0;
    blk->state = VG_BLOCK_FREE;
    return blk;
}

VG_HOT void vg__block_recycle(vg_heap *h, vg_block *blk)
{
    blk->link.spare_next = h->spare_blocks;
    h->spare_blocks = blk;
}

/* ------------------------------------------------------------------ */
/* Idle segments                                                       */
/* ------------------------------------------------------------------ */

VG_HOT void vg__idle_append(vg_heap *h, vg_segment *seg)
{
    seg->idle = true;
    seg->idle_next = NULL;
    seg->idle_prev = h->idle_tail;
    if (h->idle_tail) h->idle_tail->idle_next = seg;
    else h->idle_head = seg;
    h->idle_tail = seg;
}

VG_HOT void vg__idle_remove(vg_heap *h, vg_segment *seg)
{
    if (seg->idle_prev) seg->idle_prev->idle_next = seg->idle_next;
    else h->idle_head = seg->idle_next;
    if (seg->idle_next) seg->idle_next->idle_prev = seg->idle_prev;
    else h->idle_tail = seg->idle_prev;
    seg->idle = false;
    seg->idle_prev = seg->idle_next = NULL;
}

/* ------------------------------------------------------------------ */
/* Free blocks                                                         */
/* ------------------------------------------------------------------ */

VG_HOT void vg__bin_add(vg_heap *h, vg_block *blk)
{
    vg__bins_insert(h->bins[blk->seg->pool], blk);
    h->free_blocks++;
}

VG_HOT void vg__bin_drop(vg_heap *h, vg_block *blk)
{
    vg__bins_remove(h->bins[blk->seg->pool], blk);
    h->free_blocks--;
}

/* PyTorch's inactive_split: free blocks that share their segment with
 * others. Changed by net amounts where PyTorch's allocator changes it (a
 * block taken, a block freed), so that its totals mean the same. */
VG_HOT void vg__inactive_split_change(vg_heap *h, int pool, int64_t blocks, int64_t bytes)
{
    vg_stats *st = &h->stats;
    if (blocks > 0) vg__stat_add2(st->inactive_split, pool, blocks);
    else if (blocks < 0) vg__stat_sub2(st->inactive_split, pool, -blocks);
    if (bytes > 0) vg__stat_add2(st->inactive_split_bytes, pool, bytes);
    else if (bytes < 0) vg__stat_sub2(st->inactive_split_bytes, pool, -bytes);
}

/* The same for a block of `whole` bytes taken, `size` of them now live:
 * the net change, spelled out per case so that each is one or two adds. */
VG_HOT void vg__inactive_split_taken(vg_stats *st, int pool, bool was_split, int64_t whole,
                                     int64_t size)
{
    if (size < whole) { /* a remainder stays free beside it */
        if (was_split) {
            vg__stat_sub2(st->inactive_split_bytes, pool, size);
        } else {
            vg__stat_add2(st->inactive_split, pool, 1);
            vg__stat_add2(st->inactive_split_bytes, pool, whole - size);
        }
    } else if (was_split) {
        vg__stat_sub2(st->inactive_split, pool, 1);
        vg__stat_sub2(st->inactive_split_bytes, pool, whole);
    }
}

/* Fold `right` into `left`; both are address neighbours. */
VG_HOT void vg__block_absorb(vg_heap *h, vg_block *left, vg_block *right)
{
    left->size += right->size;
    if (right->freed_at > left->freed_at) left->freed_at = right->freed_at;
    left->next = right->next;
    if (right->next) right->next->prev = left;
    vg__block_recycle(h, right);
    h->stats.num_merges++;
}

/* A block nobody uses any more becomes free: coalesce, bin, and mark its
 * segment idle when it is whole again. */
VG_HOT void vg__block_make_free(vg_heap *h, vg_block *blk)
{
    int pool = blk->seg->pool;
    vg__stat_sub2(h->stats.active, pool, 1);
    vg__stat_sub2(h->stats.active_bytes, pool, (int64_t)blk->size);
    blk->state = VG_BLOCK_FREE;
    blk->requested = 0;
    blk->freed_at = h->free_epoch;
    int64_t split_blocks = 0, split_bytes = 0; /* free neighbours were split blocks */
    if (blk->prev && blk->prev->state == VG_BLOCK_FREE) {
        vg_block *left = blk->prev;
        split_blocks--;
        split_bytes -= (int64_t)left->size;
        vg__bin_drop(h, left);
        vg__block_absorb(h, left, blk);
        blk = left;
    }
    if (blk->next && blk->next->state == VG_BLOCK_FREE) {
        split_blocks--;
        split_bytes -= (int64_t)blk->next->size;
        vg__bin_drop(h, blk->next);
        vg__block_absorb(h, blk, blk->next);
    }
    vg__bin_add(h, blk);
    if (!blk->prev && !blk->next) {
        vg__idle_append(h, blk->seg);
    } else {
        split_blocks++;
        split_bytes += (int64_t)blk->size;
    }
    /* A range's free blocks are not stranded: empty_cache unmaps their
     * whole pages, so they are not PyTorch's inactive_split. */
    if (!blk->seg->range) vg__inactive_split_change(h, pool, split_blocks, split_bytes);
    vg_assert_internal(!vg__check_block(h, blk));
}

/* ------------------------------------------------------------------ */
/* A free block taken for an allocation                                */
/* ------------------------------------------------------------------ */

/* Cut `blk` at `size`: the remainder becomes a free block of its own, in
 * its bin. Called when the remainder is worth keeping (h->split_min: the
 * policy's, or any remainder in the arena); VG_ERR_NOMEM when no record is
 * at hand, and `blk` is left whole. */
VG_HOT int vg__block_split(vg_heap *h, vg_block *blk, size_t size)
{
    vg_block *rest = vg__block_new(h);
    if (!rest) return VG_ERR_NOMEM;
    rest->addr = blk->addr + size;
    rest->size = blk->size - size;
    rest->seg = blk->seg;
    rest->state = VG_BLOCK_FREE;
    rest->freed_at = blk->freed_at; /* blk is still free here: vg__block_take splits first */
    rest->prev = blk;
    rest->next = blk->next;
    if (blk->next) blk->next->prev = rest;
    blk->next = rest;
    blk->size = size;
    vg__bin_add(h, rest);
    h->stats.num_splits++;
    return VG_OK;
}

/* A free block becomes live for an allocation of `requested` bytes
 * (`rounded`, aligned): out of its bin and the idle list, split when the
 * remainder is worth keeping, in the live-address map, counted. NULL when
 * the map cannot grow, with nothing changed. */
VG_HOT vg_block *vg__block_take(vg_heap *h, vg_block *blk, size_t rounded, size_t requested)
{
    /* First the only step that can fail, so failing leaves nothing to undo.
     * The block keeps its address through the split below. */
    if (vg__map_put(&h->live, blk->addr, blk) != VG_OK) return NULL;
    vg_segment *seg = blk->seg;
    int pool = seg->pool;
    bool was_split = blk->prev || blk->next;
    size_t whole = blk->size;
    vg__bin_drop(h, blk);
    if (seg->idle) vg__idle_remove(h, seg);
    /* A failed split (no memory for a record) only costs the remainder. */
    if (blk->size - rounded >= h->split_min[pool]) vg__block_split(h, blk, rounded);
    int64_t size = (int64_t)blk->size;
    vg_stats *st = &h->stats;
    /* Not for a range: see vg__block_make_free. */
    if (!seg->range) vg__inactive_split_taken(st, pool, was_split, (int64_t)whole, size);
    blk->state = VG_BLOCK_LIVE;
    blk->requested = requested;
    blk->bin = vg__bin_of_size((size_t)size);
    h->live_per_bin[blk->bin]++;
    vg__stat_add2(st->requested_bytes, pool, (int64_t)requested);
    vg__stat_add2(st->allocated_bytes, pool, size);
    vg__stat_add2(st->allocation, pool, 1);
    vg__stat_add2(st->active, pool, 1);
    vg__stat_add2(st->active_bytes, pool, size);
    vg_assert_internal(!vg__check_block(h, blk) && (!blk->next || !vg__check_block(h, blk->next)));
    return blk;
}

#endif
