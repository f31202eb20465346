/* The heap's entry points: create and destroy, allocate and free. An
 * allocation takes the lock, finishes deferred frees that are done, finds
 * a block (the cache's best fit, or the out-of-memory ladder's answer:
 * ladder.c, arena.c), takes it, and reports a failure as an OOM or a
 * device error; a free gives the block back to its bins, or defers it
 * while other streams may still use it (deferred_free.c).
 *
 * The structures and their invariants are in heap_internal.h; vg_heap_check
 * (check.c) verifies them all, and debug builds assert the touched
 * segment's after every change. An alloc and free pair of a cached block
 * makes no call past the lock: what it runs is inline (blocks.h, bins.h,
 * addr_map.h, streams.h, stats.h).
 */
#include "heap_internal.h"
#include "arena.h"
#include "blocks.h"
#include "budget.h"
#include "check.h"
#include "deferred_free.h"
#include "ladder.h"
#include "recording.h"
#include "stats.h"
#include "streams.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Device errors                                                       */
/* ------------------------------------------------------------------ */

void vg__device_error(vg_heap *h)
{
    h->stats.num_device_errors++;
    h->device_error = *vg_device_last_error();
    h->device_failed = true;
}

/* ------------------------------------------------------------------ */
/* Create and destroy                                                  */
/* ------------------------------------------------------------------ */

vg_heap *vg_heap_create(vg_device *dev, const vg_heap_config *cfg)
{
    if (!dev || !dev->ops) return NULL;
    if (cfg && !vg_valid_fraction(cfg->gc_threshold)) return NULL;
    vg_heap *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    if (vg__map_init(&h->live, 1024) != VG_OK || vg__streams_init(&h->streams) != VG_OK) {
        vg__map_free(&h->live);
        free(h);
        return NULL;
    }
    vg_lock_init(&h->lock);
    pthread_mutex_init(&h->device_wait, NULL);
    h->dev = dev;
    h->policy = cfg && cfg->policy ? cfg->policy : vg_policy_named("vramguard");
    h->arena = h->policy->arena && vg__arena_usable(dev);
    for (int pool = 0; pool < VG_POOL_COUNT; pool++)
        h->split_min[pool] = h->arena ? VG_ALIGN : h->policy->split_min[pool];
    if (h->arena) h->page_shift = (unsigned)__builtin_ctzll((unsigned long long)dev->page_size);
    h->budget = cfg ? cfg->budget : 0;
    h->gc_threshold = cfg ? cfg->gc_threshold : 0.0;
    size_t free_bytes = 0, total = 0;
    if (dev->ops->mem_info(dev, &free_bytes, &total) == VG_OK) h->device_total = total;
    else vg__device_error(h);
    return h;
}

void vg_heap_destroy(vg_heap *h)
{
    if (!h) return;
    for (vg_block *blk = h->pending; blk; blk = blk->link.wait.next) vg__uses_recycle(h, blk);
    while (h->segments) {
        vg_segment *seg = h->segments;
        h->segments = seg->next;
        for (vg_block *blk = seg->head; blk; blk = blk->next) vg__uses_recycle(h, blk);
        if (seg->range) vg__arena_destroy_range(h, seg);
        else h->dev->ops->release(h->dev, seg->addr, seg->size);
        free(seg);
    }
    vg__slabs_free(h);
    vg__streams_destroy(&h->streams);
    vg__map_free(&h->live);
    vg__history_destroy(h->history);
    pthread_mutex_destroy(&h->device_wait);
    free(h);
}

/* ------------------------------------------------------------------ */
/* Allocation and free                                                 */
/* ------------------------------------------------------------------ */

/* What both kinds of failure report: the request and the heap's state. */
static void fill_failure(vg_heap *h, size_t size, size_t rounded, int status, vg_oom_info *oom)
{
    memset(oom, 0, sizeof *oom);
    oom->status = status;
    oom->requested = size;
    oom->rounded = rounded;
    oom->budget = h->budget;
    oom->device = h->dev->index;
    oom->allocated = (size_t)h->stats.allocated_bytes[VG_STAT_ALL].current;
    oom->reserved = vg__reserved(h);
}

/* A device error ends the allocation as itself: no OOM is counted. */
static void fill_device_error(vg_heap *h, size_t size, size_t rounded, vg_oom_info *oom)
{
    if (!oom) return;
    fill_failure(h, size, rounded, VG_ERR_DEVICE, oom);
    oom->device_error = h->device_error;
}

static void fill_oom(vg_heap *h, size_t size, size_t rounded, bool budget_refused,
                     vg_oom_info *oom)
{
    h->stats.num_ooms++;
    VG_HISTORY(h, VG_EV_OOM, 0, rounded, size, 0);
    if (!oom) return;
    vg_fragmentation frag;
    fill_failure(h, size, rounded, VG_ERR_NOMEM, oom);
    vg__fragmentation_locked(h, &frag);
    size_t free_bytes = 0, total = 0;
    if (h->dev->ops->mem_info(h->dev, &free_bytes, &total) == VG_OK) {
        oom->device_total = total;
        oom->device_free = free_bytes;
    } else {
        vg__device_error(h);
    }
    oom->largest_free_block = frag.largest_free_block;
    {
        size_t ceiling = vg__ceiling(h), reserved = vg__reserved(h);
        uint64_t room = ceiling > reserved ? ceiling - reserved : 0;
        if (oom->device_total && room > oom->device_free) room = oom->device_free;
        oom->largest_allocatable = (size_t)vg__largest_allocatable(&frag, room);
    }
    oom->free_blocks = frag.free_blocks;
    oom->free_bytes = frag.free_bytes;
    oom->budget_refused = budget_refused;
    if (h->arena) {
        oom->arena = 1;
        oom->ranges = (size_t)h->stats.segment[VG_STAT_ALL].current;
        oom->largest_free_range = frag.largest_free_range;
        oom->unmapped_bytes = h->stats.num_unmapped_pages << h->page_shift;
    }
}

/* A cached block, or the out-of-memory ladder's answer (ladder.c), taken
 * for the request; NULL when there is none. */
VG_HOT vg_block *alloc_block(vg_heap *h, vg_request *r, size_t size, vg_stream_t stream)
{
    r->stream = vg__stream_pin(h, stream);
    if (!r->stream) return NULL;
    r->pool = r->rounded <= VG_SMALL_REQUEST ? VG_POOL_SMALL : VG_POOL_LARGE;
    bool found = h->arena ? vg__arena_find_block(h, r) : vg__find_block(h, r);
    vg_block *blk = found ? vg__block_take(h, r->block, r->rounded, size) : NULL;
    vg__stream_unpin(h, r->stream);
    /* Once per allocation that succeeds, whichever step found its block. */
    if (blk) {
        if (r->fresh) h->stats.num_cache_misses++;
        else h->stats.num_cache_hits++;
    }
    return blk;
}

void *vg_heap_alloc(vg_heap *h, size_t size, vg_stream_t stream, vg_oom_info *oom)
{
    uint32_t stack = vg__history_stack(h);
    vg_lock_acquire(&h->lock);
    if (size == 0) {
        h->stats.num_zero_allocs++;
        vg_lock_release(&h->lock);
        return NULL;
    }
    h->device_failed = false;
    if (h->pending) vg__process_pending(h);
    vg_request r = {.rounded = vg__round(size)};
    vg_block *blk = r.rounded ? alloc_block(h, &r, size, stream) : NULL;
    if (!blk) {
        if (h->device_failed) fill_device_error(h, size, r.rounded, oom);
        else fill_oom(h, size, r.rounded, r.budget_refused, oom);
        vg_assert_internal(!vg__check_totals(h));
        vg_lock_release(&h->lock);
        return NULL;
    }
    blk->stack = stack;
    if (h->recording) vg__history_note(h->history, VG_EV_ALLOC, blk->addr, blk->size, size, stream, stack);
    if (h->stats.allocated_bytes[VG_STAT_ALL].current > h->interval_peak) /* peaks.c */
        h->interval_peak = h->stats.allocated_bytes[VG_STAT_ALL].current;
    vg_assert_internal(!vg__check_totals(h));
    vg_lock_release(&h->lock);
    return (void *)blk->addr;
}

void vg_heap_count_invalid_free(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    h->stats.num_invalid_frees++;
    vg_lock_release(&h->lock);
}

/* Both frees, under one taking of the lock; an unknown pointer is counted
 * in num_invalid_frees when `count_invalid`. */
VG_HOT int free_locked(vg_heap *h, void *ptr, bool count_invalid)
{
    vg_block *blk = vg__map_take(&h->live, (uintptr_t)ptr);
    if (!blk) {
        if (count_invalid) h->stats.num_invalid_frees++;
        return VG_ERR_INVALID;
    }
    int pool = blk->seg->pool;
    vg_stats *st = &h->stats;
    h->free_epoch++;
    h->live_per_bin[blk->bin]--;
    vg__stat_sub2(st->requested_bytes, pool, (int64_t)blk->requested);
    vg__stat_sub2(st->allocated_bytes, pool, (int64_t)blk->size);
    vg__stat_sub2(st->allocation, pool, 1);
    VG_HISTORY(h, VG_EV_FREE, blk->addr, blk->size, blk->requested, blk->seg->stream->key);
    if (blk->uses) vg__defer_free(h, blk);
    else vg__block_make_free(h, blk);
    vg_assert_internal(!vg__check_totals(h));
    return VG_OK;
}

int vg_heap_free(vg_heap *h, void *ptr)
{
    if (!ptr) return VG_OK;
    vg_lock_acquire(&h->lock);
    int rc = free_locked(h, ptr, true);
    vg_lock_release(&h->lock);
    return rc;
}

int vg_heap_free_if_owned(vg_heap *h, void *ptr)
{
    if (!ptr) return VG_OK;
    vg_lock_acquire(&h->lock);
    int rc = free_locked(h, ptr, false);
    vg_lock_release(&h->lock);
    return rc;
}
