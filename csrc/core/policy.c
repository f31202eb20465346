/* vramguard's policy: how big a new segment is, when a block is split, and
 * what to do when no cached block fits.
 *
 * Keeping big blocks whole: when the best cached fit is a whole idle
 * segment at least 4 MiB bigger than the segment this request would get,
 * and either four times its size or reserved memory is past half the
 * ceiling (the budget, or else the device), a right-sized segment is
 * reserved
 * instead (num_kept_whole), because the remainder of a split is stranded
 * until its neighbour is freed, and the big request that needs it comes
 * before that. If the budget refuses, and the big block is a whole idle
 * segment, it is released for a right-sized one (num_oversize_releases);
 * otherwise it is split after all (num_oversize_splits). Far from the
 * ceiling, a block less than four times too big is split: fresh segments
 * would only grow the footprint and the provider calls, as the replays of
 * real traces showed.
 *
 * The ladder, each step counted in vg_stats:
 *   0. gc threshold: before reserved memory grows past the threshold,
 *      release wholly free segments, least recently freed first
 *      (num_gc_releases);
 *   1. reserve a new segment; if the budget or the device would not take
 *      the usual segment size, try the smallest segment that holds the
 *      request (num_shrunk_segments, num_budget_refusals);
 *   2. release the idle segments of the requesting stream, just enough of
 *      them, and retry (num_stream_releases, num_alloc_retries);
 *   3. synchronize the device, which also finishes deferred frees (a cached
 *      block may fit now), release every idle segment, and retry
 *      (num_sync_all_streams, num_sync_releases, num_alloc_retries);
 *   4. give up: the caller fills the OOM record (num_ooms).
 * A device error (any failure but a lack of memory) stops the ladder at
 * the step that met it: releasing cache cannot cure it, and the caller
 * reports it as itself (num_device_errors).
 */
#include "heap_internal.h"

/* ------------------------------------------------------------------ */
/* Segment sizes                                                       */
/* ------------------------------------------------------------------ */

/* Large requests below this share segments with others of their size. */
#define VG_SHARED_BELOW ((size_t)20 << 20)

size_t vg__round_to_granule(size_t bytes)
{
    return (bytes + VG_SEGMENT_GRANULE - 1) & ~(VG_SEGMENT_GRANULE - 1);
}

/* The smallest segment that can hold a block of `rounded` bytes. */
static size_t minimal_segment(int pool, size_t rounded)
{
    return pool == VG_POOL_SMALL ? VG_SMALL_SEGMENT : vg__round_to_granule(rounded);
}

/* A segment for k blocks of `rounded` bytes, k chosen so that the granule
 * rounding wastes least. Tensors of one size come in groups (one per layer),
 * so the k slots fill up: 8 x 2.25 MiB = 18 MiB wastes nothing where a fixed
 * 20 MiB segment strands 2 MiB, and 9 x 1.1 MiB = 10 MiB wastes 1% where a
 * segment of its own would waste 45%. Ties go to the fewest slots. */
static size_t packed_segment(size_t rounded)
{
    size_t best = vg__round_to_granule(rounded);
    size_t best_waste = best - rounded;
    for (size_t k = 2; k * rounded <= VG_SHARED_BELOW && best_waste; k++) {
        size_t seg = vg__round_to_granule(k * rounded);
        size_t waste = seg - k * rounded;
        /* compare waste per byte held: waste/seg < best_waste/best */
        if ((unsigned __int128)waste * best < (unsigned __int128)best_waste * seg) {
            best = seg;
            best_waste = waste;
        }
    }
    return best;
}

static size_t default_segment_size(const vg_heap *h, int pool, size_t rounded)
{
    (void)h;
    if (pool == VG_POOL_SMALL) return VG_SMALL_SEGMENT;
    if (rounded < VG_SHARED_BELOW) return packed_segment(rounded);
    return vg__round_to_granule(rounded);
}

/* ------------------------------------------------------------------ */
/* The ladder                                                          */
/* ------------------------------------------------------------------ */

/* What reserved memory may not pass: the budget, or else the device. */
static size_t ceiling(const vg_heap *h)
{
    return h->budget ? h->budget : h->device_total;
}

/* The amount reserved memory may reach before the gc threshold acts. */
static size_t gc_limit(const vg_heap *h)
{
    return (size_t)((double)ceiling(h) * h->gc_threshold);
}

void vg__collect_before_growth(vg_heap *h, size_t growth)
{
    if (h->gc_threshold <= 0.0) return;
    size_t limit = gc_limit(h), reserved = vg__reserved(h);
    if (reserved + growth <= limit) return;
    vg__release_idle(h, NULL, reserved + growth - limit, &h->stats.num_gc_releases);
}

/* Step 1: the usual segment, else the smallest that will do. */
static vg_block *reserve(vg_heap *h, vg_stream_bins *sb, int pool, size_t rounded,
                         bool *budget_refused)
{
    size_t usual = h->policy->segment_size(h, pool, rounded);
    size_t minimal = minimal_segment(pool, rounded);
    size_t sizes[2] = {usual, minimal};
    for (int i = 0; i < (minimal < usual ? 2 : 1); i++) {
        if (!vg__within_budget(h, sizes[i])) {
            h->stats.num_budget_refusals++;
            *budget_refused = true;
            continue;
        }
        vg_segment *seg = vg__segment_create(h, sb, pool, sizes[i]);
        if (seg) {
            h->stats.num_shrunk_segments += (uint64_t)i;
            *budget_refused = false;
            return seg->head;
        }
        if (vg__device_failed(h)) return NULL;
    }
    return NULL;
}

/* How many bytes must be released before `rounded` can be reserved under
 * the budget; when the device refused, nobody knows: release all. */
static size_t shortfall(const vg_heap *h, int pool, size_t rounded, bool budget_refused)
{
    if (!budget_refused || !h->budget) return SIZE_MAX;
    size_t need = minimal_segment(pool, rounded), reserved = vg__reserved(h);
    return reserved + need > h->budget ? reserved + need - h->budget : 0;
}

#define VG_OVERSIZE_REMAINDER ((size_t)4 << 20)

/* Only a whole idle segment bigger than the one this request would get
 * counts: a partly used segment is being shared as it was meant to be. */
/* Half the ceiling: the split that strands a big block comes thousands of
 * ops before the peak it breaks (about 55% of the budget in the OPT-125m
 * trace); at 70% it came too late there. */
#define VG_KEEP_WHOLE_PRESSURE 0.5

static bool default_keep_whole(const vg_heap *h, const vg_block *blk, size_t rounded)
{
    if (!blk->seg->idle) return false;
    size_t own = default_segment_size(h, blk->seg->pool, rounded);
    if (blk->size < own + VG_OVERSIZE_REMAINDER) return false;
    /* Four times what the request needs: split, it would strand most of a
     * segment made for a much bigger tensor, whatever the pressure (the
     * OPT-125m trace: a 148 MiB segment split for 8 MiB cost a whole
     * extra segment without a budget too). */
    if (blk->size >= 4 * own) return true;
    return (double)(vg__reserved(h) + own) > VG_KEEP_WHOLE_PRESSURE * (double)ceiling(h);
}

/* A big cached block fits but should stay whole. The gc step is skipped
 * here: it could release the very segment that is the fallback. */
static vg_block *grow_beside_oversize(vg_heap *h, vg_stream_bins *sb, int pool, size_t rounded,
                                      vg_block *oversize, bool *budget_refused)
{
    vg_block *fresh = reserve(h, sb, pool, rounded, budget_refused);
    if (fresh) {
        h->stats.num_kept_whole++;
        return fresh;
    }
    if (vg__device_failed(h)) return NULL;
    vg_segment *seg = oversize->seg;
    size_t need = minimal_segment(pool, rounded);
    if (seg->idle && !h->keep_segments && vg__reserved(h) - seg->size + need <= ceiling(h)) {
        vg__segment_release(h, seg);
        h->stats.num_oversize_releases++;
        return reserve(h, sb, pool, rounded, budget_refused);
    }
    h->stats.num_oversize_splits++;
    return oversize;
}

static vg_block *default_grow(vg_heap *h, vg_stream_bins *sb, int pool, size_t rounded,
                              vg_block *oversize, bool *budget_refused)
{
    vg_stats *st = &h->stats;
    if (oversize) {
        vg_block *blk = grow_beside_oversize(h, sb, pool, rounded, oversize, budget_refused);
        if (blk || vg__device_failed(h)) return blk;
    }
    vg__collect_before_growth(h, h->policy->segment_size(h, pool, rounded));
    vg_block *blk = reserve(h, sb, pool, rounded, budget_refused);
    if (blk || vg__device_failed(h)) return blk;

    size_t want = shortfall(h, pool, rounded, *budget_refused);
    if (want && vg__release_idle(h, sb, want, &st->num_stream_releases)) {
        st->num_alloc_retries++;
        blk = reserve(h, sb, pool, rounded, budget_refused);
        if (blk || vg__device_failed(h)) return blk;
    }

    st->num_sync_all_streams++;
    vg__synchronize(h);
    if (vg__device_failed(h)) return NULL;
    blk = vg__bins_best_fit(&sb->pool[pool], rounded, h->policy->scan_limit);
    if (blk) return blk;
    vg__release_idle(h, NULL, SIZE_MAX, &st->num_sync_releases);
    st->num_alloc_retries++;
    return reserve(h, sb, pool, rounded, budget_refused);
}

const vg_policy vg_policy_default = {
    .name = "vramguard",
    /* A large block keeps a remainder of 1 MiB or less: no large request
     * could use it, and not splitting saves a split and a merge per use
     * (the replays of real traces need the same memory either way). */
    .split_min = {VG_ALIGN, VG_SMALL_REQUEST + VG_ALIGN},
    .scan_limit = 0,
    .oversize_remainder = VG_OVERSIZE_REMAINDER,
    .keep_whole = default_keep_whole,
    .segment_size = default_segment_size,
    .grow = default_grow,
};
