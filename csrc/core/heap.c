/* The heap: segments split into blocks, free blocks cached per stream,
 * split on allocation and coalesced on free. The structures and their
 * invariants are in heap_internal.h; vg_heap_check (check.c) verifies them
 * all, and debug builds assert the touched segment's after every change.
 * What happens when no cached block fits is in ladder.c.
 */
#include "heap_internal.h"
#include "addr_map.h"
#include "bins.h"
#include "streams.h"
#include "vramguard/history.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Record free lists                                                   */
/* ------------------------------------------------------------------ */

/* Metadata records come from slabs and go back to free lists, so the hot
 * path never calls malloc. Slabs are freed with the heap. */
static void *new_slab(vg_heap *h, size_t item_size)
{
    size_t header = (sizeof(vg_slab) + 15) & ~(size_t)15;
    vg_slab *slab = malloc(header + item_size * VG_BLOCK_SLAB);
    if (!slab) return NULL;
    slab->next = h->slabs;
    h->slabs = slab;
    return (char *)slab + header;
}

VG_HOT vg_block *new_block(vg_heap *h)
{
    if (!h->spare_blocks) {
        vg_block *items = new_slab(h, sizeof(vg_block));
        if (!items) return NULL;
        for (size_t i = 0; i < VG_BLOCK_SLAB; i++) {
            items[i].link.spare_next = h->spare_blocks;
            h->spare_blocks = &items[i];
        }
    }
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

VG_HOT void recycle_block(vg_heap *h, vg_block *blk)
{
    blk->link.spare_next = h->spare_blocks;
    h->spare_blocks = blk;
}

bool vg__block_record_refill(vg_heap *h)
{
    vg_block *blk = new_block(h);
    if (!blk) return false;
    recycle_block(h, blk);
    return true;
}

static vg_stream_use *new_use(vg_heap *h)
{
    if (!h->spare_uses) {
        vg_stream_use *items = new_slab(h, sizeof(vg_stream_use));
        if (!items) return NULL;
        for (size_t i = 0; i < VG_BLOCK_SLAB; i++) {
            items[i].next = h->spare_uses;
            h->spare_uses = &items[i];
        }
    }
    vg_stream_use *use = h->spare_uses;
    h->spare_uses = use->next;
    memset(use, 0, sizeof *use);
    return use;
}

static void recycle_uses(vg_heap *h, vg_block *blk)
{
    while (blk->uses) {
        vg_stream_use *use = blk->uses;
        blk->uses = use->next;
        if (use->has_event) h->dev->ops->event_release(h->dev, use->event);
        use->next = h->spare_uses;
        h->spare_uses = use;
    }
}

/* ------------------------------------------------------------------ */
/* Idle segments                                                       */
/* ------------------------------------------------------------------ */

VG_HOT void idle_append(vg_heap *h, vg_segment *seg)
{
    seg->idle = true;
    seg->idle_next = NULL;
    seg->idle_prev = h->idle_tail;
    if (h->idle_tail) h->idle_tail->idle_next = seg;
    else h->idle_head = seg;
    h->idle_tail = seg;
}

VG_HOT void idle_remove(vg_heap *h, vg_segment *seg)
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

VG_HOT void bin_add(vg_heap *h, vg_block *blk)
{
    vg__bins_insert(h->bins[blk->seg->pool], blk);
    h->free_blocks++;
}

VG_HOT void bin_drop(vg_heap *h, vg_block *blk)
{
    vg__bins_remove(h->bins[blk->seg->pool], blk);
    h->free_blocks--;
}

/* PyTorch's inactive_split: free blocks that share their segment with
 * others. Changed by net amounts where PyTorch's allocator changes it (a
 * block taken, a block freed), so that its totals mean the same. */
VG_HOT void inactive_split_change(vg_heap *h, int pool, int64_t blocks, int64_t bytes)
{
    vg_stats *st = &h->stats;
    if (blocks > 0) vg__stat_add2(st->inactive_split, pool, blocks);
    else if (blocks < 0) vg__stat_sub2(st->inactive_split, pool, -blocks);
    if (bytes > 0) vg__stat_add2(st->inactive_split_bytes, pool, bytes);
    else if (bytes < 0) vg__stat_sub2(st->inactive_split_bytes, pool, -bytes);
}

/* The same for a block of `whole` bytes taken, `size` of them now live:
 * the net change, spelled out per case so that each is one or two adds. */
VG_HOT void inactive_split_taken(vg_stats *st, int pool, bool was_split, int64_t whole,
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
VG_HOT void absorb(vg_heap *h, vg_block *left, vg_block *right)
{
    left->size += right->size;
    if (right->freed_at > left->freed_at) left->freed_at = right->freed_at;
    left->next = right->next;
    if (right->next) right->next->prev = left;
    recycle_block(h, right);
    h->stats.num_merges++;
}

/* A block nobody uses any more becomes free: coalesce, bin, and mark its
 * segment idle when it is whole again. */
VG_HOT void make_free(vg_heap *h, vg_block *blk)
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
        bin_drop(h, left);
        absorb(h, left, blk);
        blk = left;
    }
    if (blk->next && blk->next->state == VG_BLOCK_FREE) {
        split_blocks--;
        split_bytes -= (int64_t)blk->next->size;
        bin_drop(h, blk->next);
        absorb(h, blk, blk->next);
    }
    bin_add(h, blk);
    if (!blk->prev && !blk->next) {
        idle_append(h, blk->seg);
    } else {
        split_blocks++;
        split_bytes += (int64_t)blk->size;
    }
    /* A range's free blocks are not stranded: empty_cache unmaps their
     * whole pages, so they are not PyTorch's inactive_split. */
    if (!blk->seg->range) inactive_split_change(h, pool, split_blocks, split_bytes);
    vg_assert_internal(!vg__check_block(h, blk));
}

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
/* Segments                                                            */
/* ------------------------------------------------------------------ */

size_t vg__reserved(const vg_heap *h)
{
    return (size_t)h->stats.reserved_bytes[VG_STAT_ALL].current;
}

static size_t reserved_elsewhere(const vg_heap *h)
{
    return h->reserved_elsewhere ? h->reserved_elsewhere(h->reserved_elsewhere_ctx) : 0;
}

size_t vg__ceiling(const vg_heap *h)
{
    size_t limit = h->budget ? h->budget : h->device_total;
    size_t others = reserved_elsewhere(h);
    return others < limit ? limit - others : 0;
}

size_t vg__round_to_granule(size_t bytes)
{
    return (bytes + VG_SEGMENT_GRANULE - 1) & ~(VG_SEGMENT_GRANULE - 1);
}

bool vg__within_budget(const vg_heap *h, size_t bytes)
{
    if (!h->budget) return true;
    size_t reserved = vg__reserved(h) + reserved_elsewhere(h);
    return bytes <= h->budget && reserved <= h->budget - bytes;
}

vg_segment *vg__segment_adopt(vg_heap *h, vg_stream_state *s, int pool, uintptr_t addr,
                              size_t size)
{
    vg_segment *seg = calloc(1, sizeof *seg);
    vg_block *blk = seg ? new_block(h) : NULL;
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
    bin_add(h, blk);
    idle_append(h, seg);
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
    bin_drop(h, seg->head);
    recycle_block(h, seg->head);
    idle_remove(h, seg);
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
/* Deferred frees (record_stream)                                      */
/* ------------------------------------------------------------------ */

static void pending_append(vg_heap *h, vg_block *blk)
{
    blk->link.wait.next = NULL;
    blk->link.wait.prev = h->pending_tail;
    if (h->pending_tail) h->pending_tail->link.wait.next = blk;
    else h->pending = blk;
    h->pending_tail = blk;
}

static void pending_remove(vg_heap *h, vg_block *blk)
{
    if (blk->link.wait.prev) blk->link.wait.prev->link.wait.next = blk->link.wait.next;
    else h->pending = blk->link.wait.next;
    if (blk->link.wait.next) blk->link.wait.next->link.wait.prev = blk->link.wait.prev;
    else h->pending_tail = blk->link.wait.prev;
    blk->link.wait.prev = blk->link.wait.next = NULL;
}

/* The streams found busy in one pass over the pending list. Events on a
 * stream complete in the order they were recorded, and the list is in that
 * order: once one event of a stream is not finished, no later one is, and
 * it is not queried. Full, it only stops saving queries. */
#define BUSY_STREAMS 16
typedef struct busy_streams {
    int n;
    struct { vg_stream_t stream; int device; } at[BUSY_STREAMS];
} busy_streams;

static bool known_busy(const busy_streams *b, const vg_stream_use *use)
{
    for (int i = 0; i < b->n; i++)
        if (b->at[i].stream == use->stream && b->at[i].device == use->device) return true;
    return false;
}

/* A use without an event is not known to be finished until a synchronize
 * begun after the free has succeeded: not after one that failed, nor one
 * the provider skipped (VG_ERR_BUSY, during a capture). */
static bool use_finished(vg_heap *h, const vg_stream_use *use, busy_streams *busy)
{
    if (!use->has_event) return h->syncs_done > use->syncs_before;
    if (known_busy(busy, use)) return false;
    if (h->dev->ops->event_query(h->dev, use->event)) return true;
    if (busy->n < BUSY_STREAMS) {
        busy->at[busy->n].stream = use->stream;
        busy->at[busy->n].device = use->device;
        busy->n++;
    }
    return false;
}

static bool uses_finished(vg_heap *h, const vg_block *blk, busy_streams *busy)
{
    for (const vg_stream_use *use = blk->uses; use; use = use->next)
        if (!use_finished(h, use, busy)) return false;
    return true;
}

void vg__process_pending(vg_heap *h)
{
    busy_streams busy;
    busy.n = 0;
    vg_block *blk = h->pending;
    while (blk) {
        vg_block *next = blk->link.wait.next;
        if (uses_finished(h, blk, &busy)) {
            pending_remove(h, blk);
            recycle_uses(h, blk);
            make_free(h, blk);
        }
        blk = next;
    }
}

/* The wait itself, with the heap's lock released so that the heap's other
 * callers (a free, a stats read, another allocation) are not held up for
 * the device. */
static int wait_for_device(vg_heap *h, vg_device_error *error)
{
    uint64_t begun = ++h->syncs_begun;
    h->device_waiters++;
    vg_lock_release(&h->lock);
    pthread_mutex_lock(&h->device_wait);
    int rc = h->dev->ops->synchronize(h->dev);
    /* The provider's words, this thread's, copied before it next calls. */
    if (rc != VG_OK) *error = *vg_device_last_error();
    pthread_mutex_unlock(&h->device_wait);
    vg_lock_acquire(&h->lock);
    h->device_waiters--;
    if (rc == VG_OK && begun > h->syncs_done) h->syncs_done = begun;
    return rc;
}

void vg__synchronize(vg_heap *h)
{
    vg_device_error error;
    int rc = wait_for_device(h, &error);
    /* device_failed is the current allocation's: another one may have set
     * it while the lock was released; this caller's was false (the ladder
     * stops at an error before it synchronizes). */
    h->device_failed = false;
    /* Skipped (a capture underway) is no error: nothing was waited for,
     * and nothing without an event is freed on its strength. */
    if (rc != VG_OK && rc != VG_ERR_BUSY) {
        /* vg__device_error, with the words copied at the wait. */
        h->stats.num_device_errors++;
        h->device_error = error;
        h->device_failed = true;
    }
    vg__process_pending(h);
}

/* Record an event on every other stream that used the block. If one cannot
 * be recorded, waiting for the whole device is the safe answer. */
static void defer_free(vg_heap *h, vg_block *blk)
{
    bool recorded = true;
    for (vg_stream_use *use = blk->uses; use; use = use->next) {
        int rc = h->dev->ops->event_record(h->dev, use->device, use->stream, &use->event);
        if (rc == VG_OK) use->has_event = true;
        else recorded = false;
        use->syncs_before = h->syncs_begun;
        if (rc == VG_ERR_DEVICE) vg__device_error(h);
    }
    blk->state = VG_BLOCK_PENDING;
    pending_append(h, blk);
    h->stats.num_deferred_frees++;
    if (!recorded) vg__synchronize(h);
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
    for (vg_block *blk = h->pending; blk; blk = blk->link.wait.next) recycle_uses(h, blk);
    while (h->segments) {
        vg_segment *seg = h->segments;
        h->segments = seg->next;
        for (vg_block *blk = seg->head; blk; blk = blk->next) recycle_uses(h, blk);
        if (seg->range) vg__arena_destroy_range(h, seg);
        else h->dev->ops->release(h->dev, seg->addr, seg->size);
        free(seg);
    }
    while (h->slabs) {
        vg_slab *slab = h->slabs;
        h->slabs = slab->next;
        free(slab);
    }
    vg__streams_destroy(&h->streams);
    vg__map_free(&h->live);
    vg__history_destroy(h->history);
    pthread_mutex_destroy(&h->device_wait);
    free(h);
}

/* ------------------------------------------------------------------ */
/* Allocation                                                          */
/* ------------------------------------------------------------------ */

/* Split when the remainder is worth keeping (the policy says how much). */
VG_HOT int split(vg_heap *h, vg_block *blk, size_t size)
{
    vg_block *rest = new_block(h);
    if (!rest) return VG_ERR_NOMEM;
    rest->addr = blk->addr + size;
    rest->size = blk->size - size;
    rest->seg = blk->seg;
    rest->state = VG_BLOCK_FREE;
    rest->freed_at = blk->freed_at; /* blk is still free here: take() splits first */
    rest->prev = blk;
    rest->next = blk->next;
    if (blk->next) blk->next->prev = rest;
    blk->next = rest;
    blk->size = size;
    bin_add(h, rest);
    h->stats.num_splits++;
    return VG_OK;
}

VG_HOT vg_block *take(vg_heap *h, vg_block *blk, size_t rounded, size_t requested)
{
    /* First the only step that can fail, so failing leaves nothing to undo.
     * The block keeps its address through the split below. */
    if (vg__map_put(&h->live, blk->addr, blk) != VG_OK) return NULL;
    vg_segment *seg = blk->seg;
    int pool = seg->pool;
    bool was_split = blk->prev || blk->next;
    size_t whole = blk->size;
    bin_drop(h, blk);
    if (seg->idle) idle_remove(h, seg);
    /* A failed split (no memory for a record) only costs the remainder. */
    if (blk->size - rounded >= h->split_min[pool]) split(h, blk, rounded);
    int64_t size = (int64_t)blk->size;
    vg_stats *st = &h->stats;
    /* Not for a range: see make_free. */
    if (!seg->range) inactive_split_taken(st, pool, was_split, (int64_t)whole, size);
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
    vg_block *blk = found ? take(h, r->block, r->rounded, size) : NULL;
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
    if (blk->uses) defer_free(h, blk);
    else make_free(h, blk);
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

int vg_heap_record_stream(vg_heap *h, void *ptr, vg_stream_t stream)
{
    return vg_heap_record_device_stream(h, ptr, h->dev->index, stream);
}

int vg_heap_record_device_stream(vg_heap *h, void *ptr, int device, vg_stream_t stream)
{
    if (device < 0 || device >= VG_MAX_DEVICES) return VG_ERR_ARG;
    vg_lock_acquire(&h->lock);
    int rc = VG_OK;
    vg_block *blk = vg__map_get(&h->live, (uintptr_t)ptr);
    if (!blk) {
        rc = VG_ERR_INVALID;
    } else if (device != h->dev->index || stream != blk->seg->stream->key) {
        vg_stream_use *use = blk->uses;
        while (use && (use->stream != stream || use->device != device)) use = use->next;
        if (!use) {
            use = new_use(h);
            if (!use) {
                rc = VG_ERR_NOMEM;
            } else {
                use->stream = stream;
                use->device = device;
                use->next = blk->uses;
                blk->uses = use;
                h->stats.num_record_stream++;
                VG_HISTORY(h, VG_EV_RECORD_STREAM, blk->addr, blk->size, 0, stream);
            }
        }
    }
    vg_lock_release(&h->lock);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Cache control and settings                                          */
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

void vg_heap_synchronize(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    vg__synchronize(h);
    vg_lock_release(&h->lock);
}

void vg_heap_wait_for_calls(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    vg_lock_release(&h->lock);
    pthread_mutex_lock(&h->device_wait);
    pthread_mutex_unlock(&h->device_wait);
}

int vg_heap_set_budget(vg_heap *h, size_t budget)
{
    vg_lock_acquire(&h->lock);
    h->budget = budget;
    size_t reserved = vg__reserved(h), limit = vg__ceiling(h);
    if (budget && reserved > limit) {
        if (h->arena) vg__arena_trim(h, reserved - limit, &h->stats.num_budget_releases);
        else vg__release_idle(h, NULL, reserved - limit, &h->stats.num_budget_releases);
    }
    vg_lock_release(&h->lock);
    return VG_OK;
}

void vg_heap_share_budget(vg_heap *h, size_t (*reserved_elsewhere_fn)(void *ctx), void *ctx)
{
    vg_lock_acquire(&h->lock);
    h->reserved_elsewhere = reserved_elsewhere_fn;
    h->reserved_elsewhere_ctx = ctx;
    vg_lock_release(&h->lock);
}

void vg_heap_set_keep_segments(vg_heap *h, int keep)
{
    vg_lock_acquire(&h->lock);
    h->keep_segments = keep != 0;
    vg_lock_release(&h->lock);
}

size_t vg_heap_budget(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    size_t budget = h->budget;
    vg_lock_release(&h->lock);
    return budget;
}

int vg_heap_set_gc_threshold(vg_heap *h, double fraction)
{
    if (!vg_valid_fraction(fraction)) return VG_ERR_ARG;
    vg_lock_acquire(&h->lock);
    h->gc_threshold = fraction;
    vg_lock_release(&h->lock);
    return VG_OK;
}

double vg_heap_gc_threshold(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    double fraction = h->gc_threshold;
    vg_lock_release(&h->lock);
    return fraction;
}

size_t vg_heap_device_total(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    size_t total = h->device_total;
    vg_lock_release(&h->lock);
    return total;
}

size_t vg_heap_block_size(vg_heap *h, void *ptr)
{
    vg_lock_acquire(&h->lock);
    vg_block *blk = vg__map_get(&h->live, (uintptr_t)ptr);
    size_t size = blk ? blk->size : 0;
    vg_lock_release(&h->lock);
    return size;
}

vg_device *vg_heap_device(const vg_heap *h)
{
    return h->dev;
}

const char *vg_heap_policy_name(const vg_heap *h)
{
    return h->policy->name;
}

int vg_heap_uses_arena(const vg_heap *h)
{
    return h->arena;
}

/* ------------------------------------------------------------------ */
/* Visiting                                                            */
/* ------------------------------------------------------------------ */

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
