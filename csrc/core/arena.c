/* The arena: one virtual range per (stream, pool), with pages of memory
 * mapped into it as blocks need them, so that free neighbours always merge
 * and reserved memory is only what is mapped. docs/design.md has the why.
 *
 * A range is a segment (heap_internal.h) whose blocks tile address space,
 * not memory: the heap splits, bins and merges them as any segment's, and
 * best fit runs over the whole range, mapped or not. What this file adds:
 *
 * - Pages (struct vg_range): a bitmap per range. When a block is about to
 *   become live, its missing pages are mapped, one map call per run of
 *   contiguous missing pages. reserved_bytes counts mapped bytes, and the
 *   budget and the gc threshold apply to them.
 * - The ladder (vg__arena_find_block): best fit, else a new range (only
 *   when none of the stream's ranges can hold the request); map, else
 *   unmap the requesting stream's free pages and retry, else synchronize,
 *   unmap every free page and retry, else OOM. Counted as the segments'
 *   ladder counts its steps, in the same counters. When the budget refused
 *   and its arithmetic shows that no step can succeed, the ladder goes
 *   straight to its last step's unmapping (one synchronize, not two, and
 *   no retry) and the OOM (num_oom_fast_fails).
 * - Unmapping: only pages wholly inside free blocks (a pending block's
 *   may still be in use by another stream), only under pressure (the
 *   ladder, the gc threshold, empty_cache, a lower budget), never while
 *   keep_segments holds (a CUDA graph replays into freed blocks). Mapped
 *   free pages are the cache: a steady loop maps nothing after its first
 *   step. Before a batch of unmaps the device is synchronized once, since
 *   work queued before a block's free may still use its pages; a block
 *   freed while that synchronize ran (the lock is released meanwhile) is
 *   not covered by it, so the batch leaves it mapped (its freed_at is past
 *   the epoch the synchronize began at) and unmaps the rest.
 * - Ranges wholly free and unmapped are released under the same pressure,
 *   so that a stream's record goes when its last range does.
 */
#include "arena.h"
#include "bins.h"
#include "blocks.h"
#include "budget.h"
#include "deferred_free.h"
#include "recording.h"
#include "segments.h"
#include "stats.h"

#include <stdlib.h>
#include <string.h>

/* Several times the device: the address space is free, and a range that
 * runs out would need a second one whose blocks cannot merge with it. */
#define RANGE_DEVICE_MULTIPLE 4
/* When the device does not say its size. */
#define RANGE_DEFAULT ((size_t)256 << 30)
/* The largest range: a block's size class must hold it (bins.h). */
#define RANGE_MAX VG_MAX_REQUEST

bool vg__arena_usable(const vg_device *dev)
{
    const vg_device_ops *ops = dev->ops;
    size_t page = dev->page_size;
    return page && (page & (page - 1)) == 0 && page <= VG_SEGMENT_GRANULE && ops->range_reserve &&
           ops->range_release && ops->map && ops->unmap;
}

/* ------------------------------------------------------------------ */
/* Pages                                                               */
/* ------------------------------------------------------------------ */

static inline size_t page_size(const vg_heap *h)
{
    return (size_t)1 << h->page_shift;
}

/* Pages [first, end) of the range that [addr, addr+size) touches. */
static inline void touched_pages(const vg_heap *h, const vg_segment *seg, uintptr_t addr,
                                 size_t size, size_t *first, size_t *end)
{
    *first = (addr - seg->addr) >> h->page_shift;
    *end = ((addr - seg->addr + size - 1) >> h->page_shift) + 1;
}

/* Pages [first, end) wholly inside [addr, addr+size); first >= end if none. */
static inline void whole_pages(const vg_heap *h, const vg_segment *seg, uintptr_t addr,
                               size_t size, size_t *first, size_t *end)
{
    size_t page = page_size(h);
    *first = (addr - seg->addr + page - 1) >> h->page_shift;
    *end = (addr - seg->addr + size) >> h->page_shift;
}

/* Bits [lo, hi) of a word, 0 <= lo < hi <= 64. */
static inline uint64_t word_mask(size_t lo, size_t hi)
{
    return (hi == 64 ? ~(uint64_t)0 : (((uint64_t)1 << hi) - 1)) & ~(((uint64_t)1 << lo) - 1);
}

/* Set or clear bits [first, end): the caller has grown the map to `end`.
 * A word at a time: an unmap under pressure covers hundreds of pages. */
static void mark_pages(vg_range *r, size_t first, size_t end, bool mapped)
{
    size_t i = first;
    while (i < end) {
        size_t w = i / 64, hi = end - w * 64 < 64 ? end - w * 64 : 64;
        uint64_t mask = word_mask(i % 64, hi);
        if (mapped) r->pages[w] |= mask;
        else r->pages[w] &= ~mask;
        i = w * 64 + hi;
    }
}

/* How many of pages [first, end) are unmapped: word at a time, since the
 * hot path asks it for every cached fit. */
static size_t missing_pages(const vg_range *r, size_t first, size_t end)
{
    size_t missing = 0, i = first;
    while (i < end) {
        size_t w = i / 64;
        if (w >= r->words) return missing + (end - i);
        size_t hi = end - w * 64 < 64 ? end - w * 64 : 64;
        missing += (size_t)__builtin_popcountll(~r->pages[w] & word_mask(i % 64, hi));
        i = w * 64 + hi;
    }
    return missing;
}

/* The first page in [i, end) that is mapped (`mapped`) or not, else end:
 * a word at a time, since a range's unmapped tail runs to four times the
 * device, the stats walk every free block under the heap lock, and the
 * ladder's unmapping walks the free blocks of every range. Pages past the
 * bitmap are unmapped. */
static size_t next_page(const vg_range *r, size_t i, size_t end, bool mapped)
{
    size_t limit = end < r->words * 64 ? end : r->words * 64;
    while (i < limit) {
        uint64_t bits = mapped ? r->pages[i / 64] : ~r->pages[i / 64];
        bits &= ~(uint64_t)0 << (i % 64);
        if (bits) {
            size_t found = (i & ~(size_t)63) + (size_t)__builtin_ctzll(bits);
            return found < limit ? found : end;
        }
        i = (i | 63) + 1;
    }
    /* i is end, or the bitmap's end, past which no page is mapped */
    return mapped || i >= end ? end : i;
}

/* Whether every page of [first, end) is mapped: what the hot path asks of
 * a cached fit, answered without counting (a cached block's pages are
 * mapped, and a small one's lie in one word of the bitmap). */
static inline bool all_mapped(const vg_range *r, size_t first, size_t end)
{
    size_t w = first / 64, last = (end - 1) / 64;
    if (last >= r->words) return false;
    if (w == last) {
        uint64_t width = end - first;
        uint64_t mask = (width == 64 ? ~(uint64_t)0 : ((uint64_t)1 << width) - 1) << (first % 64);
        return (~r->pages[w] & mask) == 0;
    }
    return missing_pages(r, first, end) == 0;
}

/* Room in the bitmap for pages below `end`, doubling. */
static int grow_pages(vg_range *r, size_t end)
{
    size_t need = (end + 63) / 64;
    if (need <= r->words) return VG_OK;
    size_t words = r->words ? r->words : 8;
    while (words < need) words *= 2;
    uint64_t *pages = realloc(r->pages, words * sizeof *pages);
    if (!pages) return VG_ERR_NOMEM;
    memset(pages + r->words, 0, (words - r->words) * sizeof *pages);
    r->pages = pages;
    r->words = words;
    return VG_OK;
}

bool vg__arena_pages_mapped(const vg_heap *h, const vg_segment *seg, uintptr_t addr, size_t size)
{
    size_t first, end;
    touched_pages(h, seg, addr, size, &first, &end);
    return missing_pages(seg->range, first, end) == 0;
}

size_t vg__arena_count_mapped(const vg_heap *h, const vg_segment *seg)
{
    const vg_range *r = seg->range;
    size_t pages = 0;
    for (size_t w = 0; w < r->words; w++) pages += (size_t)__builtin_popcountll(r->pages[w]);
    return pages << h->page_shift;
}

/* Map pages [first, end) of the range that are missing, one call per run.
 * A refusal leaves the runs mapped before it mapped (cached pages of a
 * free block: the heap stays consistent) and returns the provider's code. */
static int map_pages(vg_heap *h, vg_segment *seg, size_t first, size_t end)
{
    vg_range *r = seg->range;
    if (grow_pages(r, end) != VG_OK) return VG_ERR_NOMEM;
    size_t i = next_page(r, first, end, false);
    while (i < end) {
        size_t run = next_page(r, i, end, true);
        size_t bytes = (run - i) << h->page_shift;
        int rc = h->dev->ops->map(h->dev, seg->addr + (i << h->page_shift), bytes);
        if (rc != VG_OK) return rc;
        mark_pages(r, i, run, true);
        r->mapped += bytes;
        vg__stat_add2(h->stats.reserved_bytes, seg->pool, (int64_t)bytes);
        h->stats.num_maps++;
        h->stats.num_mapped_pages += run - i;
        VG_HISTORY(h, VG_EV_MAP, seg->addr + (i << h->page_shift), bytes, 0, seg->stream->key);
        i = next_page(r, run, end, false);
    }
    return VG_OK;
}

/* Unmap the mapped pages of [first, end) up to `budget` bytes, one call
 * per run; returns the bytes unmapped. A failed unmap is a device error:
 * its pages stay mapped and counted. */
static size_t unmap_pages(vg_heap *h, vg_segment *seg, size_t first, size_t end, size_t budget,
                          uint64_t *counter)
{
    vg_range *r = seg->range;
    size_t done = 0;
    if (end > r->words * 64) end = r->words * 64;
    size_t i = next_page(r, first, end, true);
    while (i < end && done < budget) {
        size_t left = budget - done;
        size_t pages = (left >> h->page_shift) + ((left & (page_size(h) - 1)) != 0);
        size_t run = next_page(r, i, pages < end - i ? i + pages : end, false);
        size_t bytes = (run - i) << h->page_shift;
        int rc = h->dev->ops->unmap(h->dev, seg->addr + (i << h->page_shift), bytes);
        if (rc == VG_ERR_BUSY) {
            /* A capture began after the synchronize: the provider unmapped
             * nothing, and no more unmapping is asked for until it ends. */
            h->unmap_refused = true;
            return done;
        }
        if (rc != VG_OK) {
            vg__device_error(h);
            return done;
        }
        mark_pages(r, i, run, false);
        r->mapped -= bytes;
        vg__stat_sub2(h->stats.reserved_bytes, seg->pool, (int64_t)bytes);
        h->stats.num_unmaps++;
        h->stats.num_unmapped_pages += run - i;
        VG_HISTORY(h, VG_EV_UNMAP, seg->addr + (i << h->page_shift), bytes, 0, seg->stream->key);
        if (counter) (*counter)++;
        done += bytes;
        i = next_page(r, run, end, true);
    }
    return done;
}

/* ------------------------------------------------------------------ */
/* Ranges                                                              */
/* ------------------------------------------------------------------ */

static size_t range_size(const vg_heap *h, size_t rounded)
{
    size_t total = h->device_total ? h->device_total : RANGE_DEFAULT;
    size_t size = total > RANGE_MAX / RANGE_DEVICE_MULTIPLE ? RANGE_MAX : total * RANGE_DEVICE_MULTIPLE;
    if (size < rounded) size = rounded;
    return vg__round_to_granule(size);
}

/* Address space, halving the size while the device refuses it (a driver
 * may cap one reservation below four times the device), down to what the
 * request needs. */
static int reserve_space(vg_heap *h, size_t need, size_t *size, uintptr_t *addr)
{
    int rc = h->dev->ops->range_reserve(h->dev, *size, addr);
    while (rc == VG_ERR_NOMEM && *size / 2 >= need) {
        *size = vg__round_to_granule(*size / 2);
        rc = h->dev->ops->range_reserve(h->dev, *size, addr);
    }
    return rc;
}

/* A new range for the request's stream and pool: its one free block. */
static vg_block *new_range(vg_heap *h, vg_request *r)
{
    size_t size = range_size(h, r->rounded);
    vg_range *range = calloc(1, sizeof *range);
    if (!range) return NULL;
    uintptr_t addr = 0;
    int rc = reserve_space(h, vg__round_to_granule(r->rounded), &size, &addr);
    vg_segment *seg = rc == VG_OK ? vg__segment_adopt(h, r->stream, r->pool, addr, size) : NULL;
    if (!seg) {
        free(range);
        if (rc == VG_OK) h->dev->ops->range_release(h->dev, addr, size);
        else if (rc == VG_ERR_NOMEM) h->stats.num_device_alloc_failed++;
        else vg__device_error(h);
        return NULL;
    }
    seg->range = range;
    h->stats.num_range_reserves++;
    vg__stat_add2(h->stats.segment, r->pool, 1);
    return seg->head;
}

void vg__arena_release_range(vg_heap *h, vg_segment *seg)
{
    vg_range *range = seg->range;
    vg_assert_internal(seg->idle && range->mapped == 0);
    if (h->dev->ops->range_release(h->dev, seg->addr, seg->size) != VG_OK) vg__device_error(h);
    h->stats.num_range_releases++;
    vg__stat_sub2(h->stats.segment, seg->pool, 1);
    vg__segment_forget(h, seg);
    free(range->pages);
    free(range);
}

void vg__arena_destroy_range(vg_heap *h, vg_segment *seg)
{
    vg_range *r = seg->range;
    size_t end = r->words * 64;
    for (size_t i = next_page(r, 0, end, true); i < end;) {
        size_t run = next_page(r, i, end, false);
        h->dev->ops->unmap(h->dev, seg->addr + (i << h->page_shift), (run - i) << h->page_shift);
        i = next_page(r, run, end, true);
    }
    h->dev->ops->range_release(h->dev, seg->addr, seg->size);
    free(r->pages);
    free(r);
}

/* Release the idle unmapped ranges of `only` (every stream: NULL), but the
 * one holding `keep`. */
static void release_empty_ranges(vg_heap *h, const vg_stream_state *only, const vg_block *keep)
{
    vg_segment *seg = h->idle_head;
    while (seg) {
        vg_segment *next = seg->idle_next;
        if (!seg->range->mapped && (!only || seg->stream == only) && (!keep || keep->seg != seg))
            vg__arena_release_range(h, seg);
        seg = next;
    }
}

/* ------------------------------------------------------------------ */
/* Unmapping under pressure                                            */
/* ------------------------------------------------------------------ */

/* The pages a request's block will touch once live, which unmapping must
 * spare (it would map them again at once). */
typedef struct spared {
    const vg_segment *seg;
    size_t first, end;
} spared;

/* What a batch of unmaps may take: pages wholly inside blocks free since
 * before its synchronize began (freed_at <= freed_by), but those spared. */
typedef struct unmap_scope {
    const vg_stream_state *only; /* NULL: every stream */
    const spared *keep;
    uint64_t freed_by;
    bool skipped; /* out: a block freed later had mapped pages */
} unmap_scope;

/* Unmap the mapped pages wholly inside free blocks of `seg` that `sc`
 * allows, up to `target` bytes. With `dry`, only count them. */
static size_t unmap_free_pages(vg_heap *h, vg_segment *seg, unmap_scope *sc, size_t target,
                               uint64_t *counter, bool dry)
{
    const spared *keep = sc->keep;
    size_t done = 0;
    for (vg_block *blk = seg->head; blk && done < target; blk = blk->next) {
        if (blk->state != VG_BLOCK_FREE) continue;
        size_t first, end;
        whole_pages(h, seg, blk->addr, blk->size, &first, &end);
        if (first >= end) continue;
        if (blk->freed_at > sc->freed_by) {
            sc->skipped |= missing_pages(seg->range, first, end) < end - first;
            continue;
        }
        size_t cut_first = end, cut_end = end; /* the spared pages inside */
        if (keep && keep->seg == seg && keep->first < end && keep->end > first) {
            cut_first = keep->first > first ? keep->first : first;
            cut_end = keep->end < end ? keep->end : end;
        }
        if (dry) {
            done += (cut_first - first - missing_pages(seg->range, first, cut_first)) << h->page_shift;
            if (cut_end < end)
                done += (end - cut_end - missing_pages(seg->range, cut_end, end)) << h->page_shift;
            continue;
        }
        done += unmap_pages(h, seg, first, cut_first, target - done, counter);
        if (cut_end < end && done < target)
            done += unmap_pages(h, seg, cut_end, end, target - done, counter);
        if (h->device_failed || h->unmap_refused) break;
    }
    return done;
}

static size_t unmap_in_scope(vg_heap *h, unmap_scope *sc, size_t target, uint64_t *counter,
                             bool dry)
{
    size_t done = 0;
    for (vg_segment *seg = h->segments; seg && done < target && !h->device_failed && !h->unmap_refused;
         seg = seg->next)
        if (!sc->only || seg->stream == sc->only)
            done += unmap_free_pages(h, seg, sc, target - done, counter, dry);
    return done;
}

/* Synchronize so that no work on the device uses the pages of blocks free
 * when it began; sets the epoch of those frees. False when that cannot be
 * known: the synchronize failed or was skipped (a capture underway). */
static bool synchronize_for_unmap(vg_heap *h, uint64_t *freed_by)
{
    uint64_t begun = h->syncs_begun + 1;
    *freed_by = h->free_epoch;
    h->stats.num_unmap_syncs++;
    vg__synchronize(h);
    return !h->device_failed && h->syncs_done >= begun;
}

/* ------------------------------------------------------------------ */
/* Placing a request                                                   */
/* ------------------------------------------------------------------ */

/* Stopped: a device error since this allocation began. */
static inline bool stopped(const vg_heap *h)
{
    return h->device_failed;
}

/* The live part of `blk` for `rounded` bytes, as vg__block_take will cut it. */
static inline size_t live_size(const vg_heap *h, const vg_block *blk, int pool, size_t rounded)
{
    return blk->size - rounded >= h->split_min[pool] ? rounded : blk->size;
}

static vg_block *best_fit(vg_heap *h, vg_request *r)
{
    return vg__bins_best_fit(h->bins[r->pool], r->stream, r->pool, r->rounded);
}

static void spare_for(vg_heap *h, vg_request *r, spared *keep)
{
    vg_block *blk = best_fit(h, r);
    keep->seg = blk ? blk->seg : NULL;
    keep->first = keep->end = 0;
    if (blk) touched_pages(h, blk->seg, blk->addr, live_size(h, blk, r->pool, r->rounded),
                           &keep->first, &keep->end);
}

/* Unmap free pages of `only` (all streams: NULL), up to `target` bytes,
 * then release the ranges left empty. Synchronizes first, once, and only
 * if there is something to unmap, or always with `must_sync` (the ladder's
 * last step, which waits for deferred frees too, and the stream's step
 * when the ladder's own walk has found pages to unmap). The request's fit is
 * spared: it is looked for after the synchronize, which may have finished
 * deferred frees. */
static size_t unmap_for(vg_heap *h, vg_request *r, const vg_stream_state *only, size_t target,
                        uint64_t *counter, bool must_sync)
{
    if (h->keep_segments) {
        if (must_sync) vg__synchronize(h);
        return 0;
    }
    spared keep = {0};
    unmap_scope sc = {only, r ? &keep : NULL, UINT64_MAX, false};
    if (r) spare_for(h, r, &keep);
    if (!must_sync && !unmap_in_scope(h, &sc, 1, NULL, true)) return 0;
    if (!synchronize_for_unmap(h, &sc.freed_by)) {
        h->stats.num_unmap_skips++;
        return 0;
    }
    if (r) spare_for(h, r, &keep);
    h->unmap_refused = false;
    size_t done = unmap_in_scope(h, &sc, target, counter, false);
    if (sc.skipped) h->stats.num_unmap_skips++;
    if (h->unmap_refused) {
        /* Capturing: leave the ranges too, and let the caller go on as
         * if there had been nothing to unmap. */
        h->stats.num_unmaps_refused++;
        return done;
    }
    release_empty_ranges(h, only, keep.seg ? keep.seg->head : NULL);
    return done;
}

size_t vg__arena_trim(vg_heap *h, size_t target, uint64_t *counter)
{
    /* Not an allocation: an error an earlier one met does not stop this. */
    h->device_failed = false;
    return unmap_for(h, NULL, NULL, target, counter, false);
}

/* The gc threshold: before mapped memory grows past a fraction of the
 * ceiling, unmap free pages. */
static void collect_garbage(vg_heap *h, vg_request *r, size_t growth)
{
    if (h->gc_threshold <= 0.0) return;
    size_t limit = (size_t)((double)vg__ceiling(h) * h->gc_threshold);
    size_t reserved = vg__reserved(h);
    if (reserved + growth <= limit) return;
    unmap_for(h, r, NULL, reserved + growth - limit, &h->stats.num_gc_releases, false);
}

/* Best fit (or a new range), with its missing pages mapped. */
static bool place(vg_heap *h, vg_request *r, bool gc)
{
    vg_block *blk = best_fit(h, r);
    if (!blk) blk = new_range(h, r);
    if (!blk) return false;
    vg_segment *seg = blk->seg;
    size_t first, end;
    touched_pages(h, seg, blk->addr, live_size(h, blk, r->pool, r->rounded), &first, &end);
    size_t missing = all_mapped(seg->range, first, end)
                         ? 0 : missing_pages(seg->range, first, end) << h->page_shift;
    r->missing = missing;
    /* vg__block_take splits the block where these pages end: a split that failed
     * for want of a record would leave a live block over unmapped pages. */
    if (!vg__block_record_ready(h)) return false;
    if (!missing) {
        r->block = blk;
        return true;
    }
    /* Unmapping synchronizes with the lock released: look again after. */
    uint64_t syncs = h->syncs_begun;
    if (gc) collect_garbage(h, r, missing);
    if (h->syncs_begun != syncs) return !stopped(h) && place(h, r, false);
    r->budget_refused = !vg__within_budget(h, missing);
    if (r->budget_refused) {
        h->stats.num_budget_refusals++;
        return false;
    }
    int rc = map_pages(h, seg, first, end);
    if (rc == VG_OK) {
        r->block = blk;
        r->fresh = true;
        return true;
    }
    if (rc == VG_ERR_NOMEM) h->stats.num_device_alloc_failed++;
    else vg__device_error(h);
    return false;
}

/* What the requesting stream must give back: under the budget, what the
 * budget lacks; when the device refused, nobody knows: all of it. */
static size_t stream_target(const vg_heap *h, const vg_request *r)
{
    if (!r->budget_refused || !h->budget) return SIZE_MAX;
    size_t reserved = vg__reserved(h), limit = vg__ceiling(h); /* shared budget: less the others' */
    return reserved + r->missing > limit ? reserved + r->missing - limit : 0;
}

/* The mapped pages the ladder could unmap for `r` now: wholly inside free
 * blocks, the request's own fit spared; of every stream, and of its own.
 * One walk over the blocks, as the stream step's look before it
 * synchronizes would make. */
typedef struct unmappable {
    size_t all, own;
} unmappable;

static unmappable count_unmappable(vg_heap *h, vg_request *r)
{
    unmappable u = {0, 0};
    if (h->keep_segments) return u;
    spared keep;
    spare_for(h, r, &keep);
    unmap_scope sc = {NULL, &keep, UINT64_MAX, false};
    for (vg_segment *seg = h->segments; seg; seg = seg->next) {
        size_t bytes = unmap_free_pages(h, seg, &sc, SIZE_MAX, NULL, true);
        u.all += bytes;
        if (seg->stream == r->stream) u.own += bytes;
    }
    return u;
}

/* The budget refused the request's pages: can any step of the ladder make
 * room? Whatever it does, the request's block and every live block must
 * be mapped, so when their bytes alone pass the ceiling nothing can
 * (a bound that needs no walk). Else, with no deferred free waiting (a
 * synchronize could finish one, freeing its pages), the steps can at most
 * unmap every unmappable page, the fit's spared, and the fit then needs
 * its missing pages: when that passes the ceiling too, no step can
 * succeed, and the ladder would synchronize twice, unmap in two batches
 * and retry twice to reach the same OOM. The arithmetic is the one
 * place() makes after those steps, on the heap as it is now, the lock
 * held; only the first step's device wait, during which other threads
 * could free memory, is saved. */
static bool no_step_can_fit(vg_heap *h, vg_request *r, unmappable *u)
{
    size_t ceiling = vg__ceiling(h);
    size_t live = (size_t)h->stats.allocated_bytes[VG_STAT_ALL].current;
    if (r->rounded > ceiling || live > ceiling - r->rounded) return true;
    *u = count_unmappable(h, r);
    if (h->pending) return false;
    size_t kept = vg__reserved(h) - u->all; /* mapped after every unmap */
    return kept > ceiling || r->missing > ceiling - kept;
}

bool vg__arena_find_block(vg_heap *h, vg_request *r)
{
    if (place(h, r, true)) return true;
    if (stopped(h)) return false;
    size_t want = stream_target(h, r);
    /* Under the budget: fail at once when no step can succeed, and skip
     * the stream's step when it has nothing to unmap (what its own look
     * would find, with the walk already made). A stale refusal (a capture
     * refused the last batch) skips it as before. */
    unmappable u = {SIZE_MAX, SIZE_MAX};
    if (r->budget_refused && h->budget) {
        if (no_step_can_fit(h, r, &u)) {
            /* Leave the heap as the ladder's last step would have: every
             * free page unmapped (the fit's spared) and the empty ranges
             * released, after one synchronize (always when a deferred free
             * waits, which it finishes), so that the OOM's report and
             * what the caller sees after it are the same; the first
             * step's synchronize and unmaps, and both retries, are saved. */
            h->stats.num_oom_fast_fails++;
            unmap_for(h, r, NULL, SIZE_MAX, &h->stats.num_sync_releases, h->pending != NULL);
            return false;
        }
        if (!u.own || h->unmap_refused) want = 0;
    }
    bool known = u.own != SIZE_MAX; /* the walk found some: no second look */
    if (want && unmap_for(h, r, r->stream, want, &h->stats.num_stream_releases, known)) {
        h->stats.num_alloc_retries++;
        if (place(h, r, false)) return true;
    }
    if (stopped(h)) return false;
    h->stats.num_sync_all_streams++;
    unmap_for(h, r, NULL, SIZE_MAX, &h->stats.num_sync_releases, true);
    if (stopped(h)) return false;
    h->stats.num_alloc_retries++;
    return place(h, r, false);
}

/* ------------------------------------------------------------------ */
/* Reports                                                             */
/* ------------------------------------------------------------------ */

/* The stretches of a free block whose pages are all mapped: each is one
 * piece of cached memory. Returns how many; *longest, the longest. */
static uint64_t mapped_pieces(const vg_heap *h, const vg_segment *seg, const vg_block *blk,
                              uint64_t *longest)
{
    size_t first, end;
    touched_pages(h, seg, blk->addr, blk->size, &first, &end);
    uint64_t pieces = 0;
    *longest = 0;
    for (size_t i = next_page(seg->range, first, end, true); i < end;) {
        size_t run = next_page(seg->range, i, end, false);
        uintptr_t lo = seg->addr + (i << h->page_shift), hi = seg->addr + (run << h->page_shift);
        if (lo < blk->addr) lo = blk->addr;
        if (hi > blk->addr + blk->size) hi = blk->addr + blk->size;
        if (hi - lo > *longest) *longest = hi - lo;
        pieces++;
        i = next_page(seg->range, run, end, true);
    }
    return pieces;
}

void vg__arena_free_pieces(const vg_heap *h, uint64_t *pieces, uint64_t *stretch, uint64_t *range)
{
    *pieces = *stretch = *range = 0;
    for (const vg_segment *seg = h->segments; seg; seg = seg->next) {
        if (!seg->range) continue;
        for (const vg_block *blk = seg->head; blk; blk = blk->next) {
            if (blk->state != VG_BLOCK_FREE) continue;
            if (blk->size > *range) *range = blk->size;
            uint64_t longest;
            *pieces += mapped_pieces(h, seg, blk, &longest);
            if (longest > *stretch) *stretch = longest;
        }
    }
}

uint64_t vg__arena_releasable(const vg_heap *h)
{
    uint64_t bytes = 0;
    for (const vg_segment *seg = h->segments; seg; seg = seg->next) {
        if (!seg->range) continue;
        for (const vg_block *blk = seg->head; blk; blk = blk->next) {
            if (blk->state != VG_BLOCK_FREE) continue;
            size_t first, end;
            whole_pages(h, seg, blk->addr, blk->size, &first, &end);
            if (first < end)
                bytes += (uint64_t)(end - first - missing_pages(seg->range, first, end)) << h->page_shift;
        }
    }
    return bytes;
}
