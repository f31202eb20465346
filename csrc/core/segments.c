/* Segments: what the provider gives, reserved, adopted as one free block
 * and released whole when idle; and empty_cache, which releases every idle
 * one (the arena unmaps free pages instead: arena.c, vg__arena_trim). The
 * blocks a segment is split into are blocks.h's; when a segment is
 * reserved or released under pressure is the ladder's (ladder.c). */
#include "segments.h"
#include "arena.h"
#include "blocks.h"
#include "check.h"
#include "deferred_free.h"
#include "recording.h"
#include "stats.h"
#include "streams.h"

#include <stdlib.h>

size_t vg__round_to_granule(size_t bytes)
{
    return (bytes + VG_SEGMENT_GRANULE - 1) & ~(VG_SEGMENT_GRANULE - 1);
}

vg_segment *vg__segment_adopt(vg_heap *h, vg_stream_state *s, int pool, uintptr_t addr,
                              size_t size)
{
    vg_segment *seg = calloc(1, sizeof *seg);
    vg_block *blk = seg ? vg__block_new(h) : NULL;
    if (!blk) {
        free(seg);
        return NULL;
    }
    seg->addr = addr;
    seg->size = size;
    seg->stream = s;
    s->segments++;
    seg->pool = pool;
    seg->head = blk;
    seg->next = h->segments;
    if (h->segments) h->segments->prev = seg;
    h->segments = seg;

    blk->addr = addr;
    blk->size = size;
    blk->seg = seg;
    blk->state = VG_BLOCK_FREE;
    vg__bin_add(h, blk);
    vg__idle_append(h, seg);
    return seg;
}

vg_segment *vg__segment_create(vg_heap *h, vg_stream_state *s, int pool, size_t size)
{
    uintptr_t addr = 0;
    int rc = h->dev->ops->reserve(h->dev, size, &addr);
    vg_segment *seg = rc == VG_OK ? vg__segment_adopt(h, s, pool, addr, size) : NULL;
    if (!seg) {
        if (rc == VG_OK) h->dev->ops->release(h->dev, addr, size);
        else if (rc == VG_ERR_NOMEM) h->stats.num_device_alloc_failed++;
        else vg__device_error(h);
        return NULL;
    }
    h->stats.num_device_alloc++;
    vg__stat_add2(h->stats.reserved_bytes, pool, (int64_t)size);
    vg__stat_add2(h->stats.segment, pool, 1);
    VG_HISTORY(h, VG_EV_RESERVE, addr, size, 0, s->key);
    vg_assert_internal(!vg__check_segment(h, seg) && !vg__check_bin_counts(h));
    return seg;
}

void vg__segment_forget(vg_heap *h, vg_segment *seg)
{
    vg_assert_internal(seg->idle && !vg__check_segment(h, seg));
    vg__bin_drop(h, seg->head);
    vg__block_recycle(h, seg->head);
    vg__idle_remove(h, seg);
    if (seg->prev) seg->prev->next = seg->next;
    else h->segments = seg->next;
    if (seg->next) seg->next->prev = seg->prev;
    vg__stream_lost_segment(h, seg->stream);
    free(seg);
    vg_assert_internal(!vg__check_bin_counts(h));
}

void vg__segment_release(vg_heap *h, vg_segment *seg)
{
    if (seg->range) {
        vg__arena_release_range(h, seg);
        return;
    }
    if (h->dev->ops->release(h->dev, seg->addr, seg->size) != VG_OK) vg__device_error(h);
    h->stats.num_device_free++;
    vg__stat_sub2(h->stats.reserved_bytes, seg->pool, (int64_t)seg->size);
    vg__stat_sub2(h->stats.segment, seg->pool, 1);
    VG_HISTORY(h, VG_EV_RELEASE, seg->addr, seg->size, 0, seg->stream->key);
    vg__segment_forget(h, seg);
}

size_t vg__release_idle(vg_heap *h, const vg_stream_state *only, size_t target,
                        uint64_t *counter)
{
    size_t released = 0;
    if (h->keep_segments) return 0;
    vg_segment *seg = h->idle_head;
    while (seg && released < target) {
        vg_segment *next = seg->idle_next;
        if (!only || seg->stream == only) {
            released += seg->size;
            vg__segment_release(h, seg);
            if (counter) (*counter)++;
        }
        seg = next;
    }
    return released;
}

/* ------------------------------------------------------------------ */
/* empty_cache                                                         */
/* ------------------------------------------------------------------ */

size_t vg_heap_empty_cache(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    /* Deferred frees would otherwise keep their segments until later. */
    if (h->pending) vg__synchronize(h);
    h->stats.num_empty_cache++;
    uint64_t *counter = &h->stats.num_empty_cache_releases;
    size_t released = h->arena ? vg__arena_trim(h, SIZE_MAX, counter)
                               : vg__release_idle(h, NULL, SIZE_MAX, counter);
    VG_HISTORY(h, VG_EV_EMPTY_CACHE, 0, released, 0, 0);
    vg_lock_release(&h->lock);
    return released;
}
