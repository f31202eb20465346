/* vramguard's policy: how big a new segment is, when a block is split, and
 * what to do when no cached block fits.
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
 */
#include "heap_internal.h"

/* ------------------------------------------------------------------ */
/* Segment sizes                                                       */
/* ------------------------------------------------------------------ */

/* Requests below this share large segments of VG_LARGE_SHARED bytes, so
 * that 1-10 MiB tensors do not each pay up to 2 MiB of rounding. */
#define VG_LARGE_SHARED_BELOW ((size_t)10 << 20)
#define VG_LARGE_SHARED ((size_t)20 << 20)

size_t vg__round_to_granule(size_t bytes)
{
    return (bytes + VG_SEGMENT_GRANULE - 1) & ~(VG_SEGMENT_GRANULE - 1);
}

/* The smallest segment that can hold a block of `rounded` bytes. */
static size_t minimal_segment(int pool, size_t rounded)
{
    return pool == VG_POOL_SMALL ? VG_SMALL_SEGMENT : vg__round_to_granule(rounded);
}

static size_t default_segment_size(const vg_heap *h, int pool, size_t rounded)
{
    (void)h;
    if (pool == VG_POOL_SMALL) return VG_SMALL_SEGMENT;
    if (rounded < VG_LARGE_SHARED_BELOW) return VG_LARGE_SHARED;
    return vg__round_to_granule(rounded);
}

/* ------------------------------------------------------------------ */
/* The ladder                                                          */
/* ------------------------------------------------------------------ */

/* The amount reserved memory may reach before the gc threshold acts. */
static size_t gc_limit(const vg_heap *h)
{
    size_t ceiling = h->budget ? h->budget : h->device_total;
    return (size_t)((double)ceiling * h->gc_threshold);
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

static vg_block *default_grow(vg_heap *h, vg_stream_bins *sb, int pool, size_t rounded,
                              bool *budget_refused)
{
    vg_stats *st = &h->stats;
    vg__collect_before_growth(h, h->policy->segment_size(h, pool, rounded));
    vg_block *blk = reserve(h, sb, pool, rounded, budget_refused);
    if (blk) return blk;

    size_t want = shortfall(h, pool, rounded, *budget_refused);
    if (want && vg__release_idle(h, sb, want, &st->num_stream_releases)) {
        st->num_alloc_retries++;
        blk = reserve(h, sb, pool, rounded, budget_refused);
        if (blk) return blk;
    }

    st->num_sync_all_streams++;
    vg__synchronize(h);
    blk = vg__bins_best_fit(&sb->pool[pool], rounded, h->policy->scan_limit);
    if (blk) return blk;
    vg__release_idle(h, NULL, SIZE_MAX, &st->num_sync_releases);
    st->num_alloc_retries++;
    return reserve(h, sb, pool, rounded, budget_refused);
}

const vg_policy vg_policy_default = {
    .name = "vramguard",
    .split_min = {VG_ALIGN, VG_ALIGN},
    .scan_limit = 32,
    .segment_size = default_segment_size,
    .grow = default_grow,
};
