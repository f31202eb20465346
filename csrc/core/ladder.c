/* The out-of-memory ladder: how the heap finds a block for an allocation,
 * from the cache to giving up, in one place. Each step asks the policy
 * (policy.c; PyTorch's in ../replay/policy_torch.c) for its decision,
 * carries it out, and counts what it did in vg_stats. As PyTorch's own
 * malloc, the sequence reads as one chain (vg__find_block):
 *
 *   get_free_block                    best cached fit; a fit
 *                                     the policy keeps whole goes on to
 *   || reserve_beside_kept_whole      a fresh segment beside it
 *                                     (num_kept_whole), else its segment
 *                                     swapped for a right-sized one
 *                                     (num_oversize_releases), else split
 *                                     after all (num_oversize_splits)
 *   || collect_and_reserve            the gc threshold releases idle
 *                                     segments, oldest first, so that the
 *                                     growth stays under it
 *                                     (num_gc_releases); reserve the usual
 *                                     segment, else the policy's smaller
 *                                     fallback (num_budget_refusals,
 *                                     num_shrunk_segments)
 *   || release_stream_and_retry       release as much of the requesting
 *                                     stream's idle segments as the policy
 *                                     asks (num_stream_releases), reserve
 *                                     again (num_alloc_retries)
 *   || synchronize_release_all_and_retry
 *                                     wait for the device, which finishes
 *                                     deferred frees (num_sync_all_streams);
 *                                     a cached fit if the policy looks
 *                                     again; release every idle segment
 *                                     (num_sync_releases), reserve again
 *                                     (num_alloc_retries)
 *
 * and when every step fails, the caller writes the OOM record (num_ooms).
 * The caller also counts each allocation that succeeds once, in one
 * place: num_cache_misses when its block is a segment reserved for it
 * (r->fresh), num_cache_hits otherwise (a cached fit, found at once, split
 * after all, or found again after the synchronize).
 * A step answers true with r->block set: a free block of at least
 * r->rounded bytes in r->stream's bins.
 *
 * A device error (any provider failure but a lack of memory) stops the
 * ladder where it is met: releasing cache cannot cure it, so every later
 * step answers false at once (stopped), no fallback segment is tried, and
 * the caller reports the error as itself (num_device_errors), not as an
 * OOM.
 */
#include "ladder.h"
#include "bins.h"
#include "budget.h"
#include "deferred_free.h"
#include "segments.h"

/* ------------------------------------------------------------------ */
/* Reserving                                                           */
/* ------------------------------------------------------------------ */

/* A device error since this allocation began. */
static inline bool stopped(const vg_heap *h)
{
    return h->device_failed;
}

/* One segment of `size`, if the budget allows and the device gives it. */
static bool try_segment(vg_heap *h, vg_request *r, size_t size)
{
    r->budget_refused = !vg__within_budget(h, size);
    if (r->budget_refused) {
        h->stats.num_budget_refusals++;
        return false;
    }
    vg_segment *seg = vg__segment_create(h, r->stream, r->pool, size);
    if (!seg) return false;
    r->block = seg->head;
    r->fresh = true;
    return true;
}

/* The policy's usual segment, else its smaller fallback. */
static bool reserve(vg_heap *h, vg_request *r)
{
    const vg_policy *p = h->policy;
    size_t usual = p->segment_size(h, r->pool, r->rounded);
    if (try_segment(h, r, usual)) return true;
    if (stopped(h)) return false;
    size_t fallback = p->fallback_segment_size ? p->fallback_segment_size(h, r->pool, r->rounded) : 0;
    if (!fallback || fallback >= usual || !try_segment(h, r, fallback)) return false;
    h->stats.num_shrunk_segments++;
    return true;
}

/* The gc threshold: before reserved memory grows past a fraction of the
 * ceiling, release idle segments, least recently freed first. */
static void collect_garbage(vg_heap *h, size_t growth)
{
    if (h->gc_threshold <= 0.0) return;
    size_t limit = (size_t)((double)vg__ceiling(h) * h->gc_threshold);
    size_t reserved = vg__reserved(h);
    if (reserved + growth <= limit) return;
    vg__release_idle(h, NULL, reserved + growth - limit, &h->stats.num_gc_releases);
}

/* ------------------------------------------------------------------ */
/* The steps                                                           */
/* ------------------------------------------------------------------ */

static bool get_free_block(vg_heap *h, vg_request *r)
{
    const vg_policy *p = h->policy;
    vg_block *blk = vg__bins_best_fit(h->bins[r->pool], r->stream, r->pool, r->rounded);
    if (!blk) return false;
    if (blk->size - r->rounded >= p->keep_whole_from && p->keep_whole(h, blk, r->rounded)) {
        r->kept_whole = blk;
        return false;
    }
    r->block = blk;
    return true;
}

/* The gc threshold is not consulted here: it could release the very
 * segment that is the fallback. */
static bool reserve_beside_kept_whole(vg_heap *h, vg_request *r)
{
    vg_block *kept = r->kept_whole;
    if (!kept) return false;
    r->kept_whole = NULL;
    if (reserve(h, r)) {
        h->stats.num_kept_whole++;
        return true;
    }
    if (stopped(h)) return false;
    /* A heap that keeps its segments (a CUDA graph's pool) never swaps. */
    if (!h->keep_segments && h->policy->swap_kept_whole(h, kept, r->rounded)) {
        vg__segment_release(h, kept->seg);
        h->stats.num_oversize_releases++;
        return reserve(h, r);
    }
    h->stats.num_oversize_splits++;
    r->block = kept;
    return true;
}

static bool collect_and_reserve(vg_heap *h, vg_request *r)
{
    if (stopped(h)) return false;
    collect_garbage(h, h->policy->segment_size(h, r->pool, r->rounded));
    return reserve(h, r);
}

static bool release_stream_and_retry(vg_heap *h, vg_request *r)
{
    if (stopped(h)) return false;
    const vg_policy *p = h->policy;
    size_t want = p->stream_release ? p->stream_release(h, r->pool, r->rounded, r->budget_refused) : 0;
    if (!want || !vg__release_idle(h, r->stream, want, &h->stats.num_stream_releases)) return false;
    h->stats.num_alloc_retries++;
    return reserve(h, r);
}

static bool synchronize_release_all_and_retry(vg_heap *h, vg_request *r)
{
    if (stopped(h)) return false;
    h->stats.num_sync_all_streams++;
    vg__synchronize(h);
    if (stopped(h)) return false;
    if (h->policy->refit_after_sync) {
        r->block = vg__bins_best_fit(h->bins[r->pool], r->stream, r->pool, r->rounded);
        if (r->block) return true;
    }
    vg__release_idle(h, NULL, SIZE_MAX, &h->stats.num_sync_releases);
    h->stats.num_alloc_retries++;
    return reserve(h, r);
}

bool vg__find_block(vg_heap *h, vg_request *r)
{
    return get_free_block(h, r)
        || reserve_beside_kept_whole(h, r)
        || collect_and_reserve(h, r)
        || release_stream_and_retry(h, r)
        || synchronize_release_all_and_retry(h, r);
}
