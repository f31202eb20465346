/* vramguard's policy: the decisions the heap asks for (heap_internal.h,
 * struct vg_policy) when it allocates: which segment to reserve, when to
 * split a block or keep it whole, and what to release first. The ladder
 * that asks them, in order, is in ladder.c.
 *
 * Which segment: 2 MiB in the small pool; a large request under 20 MiB gets
 * a segment for k blocks of its size, k chosen so that the granule rounding
 * wastes least; a larger one its size rounded to the granule. When the
 * budget or the device refuses that, the smallest segment that holds the
 * request (the fallback).
 *
 * Split or keep: a small block is split when 512 bytes would remain, a
 * large one when more than 1 MiB would (no large request could use less).
 *
 * Keeping big blocks whole: when the best cached fit is a whole idle
 * segment at least 4 MiB bigger than the segment this request would get,
 * and reserved memory is past half the ceiling (the budget, or else the
 * device), a right-sized segment is reserved instead, because the
 * remainder of a split is stranded until its neighbour is freed, and the
 * big request that needs it comes before that. If no segment can be
 * reserved beside it, the big idle segment is released for a right-sized
 * one when that fits under the ceiling; otherwise it is split after all.
 * Far from the ceiling the block is split, however big: a fresh segment
 * beside an idle one only grows the footprint (the model zoo's runs).
 *
 * What to release first: the requesting stream's idle segments, just
 * enough for the budget to take the smallest segment that holds the
 * request, or all of them when the device refused (nobody knows how much
 * it lacks). After the synchronize that follows, look at the cache again
 * (a deferred free may have finished) before everything idle is released.
 */
#include "heap_internal.h"
#include "budget.h"
#include "segments.h"

#include <string.h>

/* ------------------------------------------------------------------ */
/* Segment sizes                                                       */
/* ------------------------------------------------------------------ */

/* Large requests below this share segments with others of their size. */
#define VG_SHARED_BELOW ((size_t)20 << 20)

/* The smallest segment that can hold a block of `rounded` bytes. */
static size_t minimal_segment(const vg_heap *h, int pool, size_t rounded)
{
    (void)h;
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
/* Keeping big blocks whole                                            */
/* ------------------------------------------------------------------ */

/* A block is asked about only when a split would leave at least this. */
#define VG_OVERSIZE_REMAINDER ((size_t)4 << 20)

/* Half the ceiling: the split that strands a big block comes thousands of
 * ops before the peak it breaks (about 55% of the budget in the OPT-125m
 * trace); at 70% it came too late there. */
#define VG_KEEP_WHOLE_PRESSURE 0.5

/* Only a whole idle segment bigger than the one this request would get
 * counts: a partly used segment is being shared as it was meant to be. */
static bool default_keep_whole(const vg_heap *h, const vg_block *blk, size_t rounded)
{
    if (!blk->seg->idle) return false;
    size_t own = default_segment_size(h, blk->seg->pool, rounded);
    if (blk->size < own + VG_OVERSIZE_REMAINDER) return false;
    /* Kept whole far from the ceiling too, a block four times too big saved
     * a segment in one trace (OPT-125m: 1,812 MiB reserved without a budget,
     * 1,886 without the rule) but cost one in most of the zoo's training
     * runs, where the big idle segment was never asked for whole again
     * (GPT-2 generation 1,598 MiB against 1,140, Llama 22,626 against
     * 21,528, PyTorch's own 1,168 and 22,028), and below the pressure it
     * gained no smallest budget anywhere (bench/zoo.py, replays). */
    return (double)(vg__reserved(h) + own) > VG_KEEP_WHOLE_PRESSURE * (double)vg__ceiling(h);
}

/* Swap the kept block's idle segment for a right-sized one if the
 * right-sized one then fits under the ceiling; else split it after all. */
static bool default_swap_kept_whole(const vg_heap *h, const vg_block *blk, size_t rounded)
{
    const vg_segment *seg = blk->seg;
    size_t need = minimal_segment(h, seg->pool, rounded);
    return seg->idle && vg__reserved(h) - seg->size + need <= vg__ceiling(h);
}

/* ------------------------------------------------------------------ */
/* What to release first                                               */
/* ------------------------------------------------------------------ */

/* How many bytes must be released before the smallest segment for
 * `rounded` fits under the budget; when the device refused, nobody knows:
 * all of them. */
static size_t default_stream_release(const vg_heap *h, int pool, size_t rounded,
                                     bool budget_refused)
{
    if (!budget_refused || !h->budget) return SIZE_MAX;
    size_t need = minimal_segment(h, pool, rounded), reserved = vg__reserved(h);
    size_t limit = vg__ceiling(h); /* the budget, less what the heaps sharing it hold */
    return reserved + need > limit ? reserved + need - limit : 0;
}

/* The segments policy's decisions, which the arena shares: where the
 * device has no virtual memory the arena falls back to segments and must
 * decide there exactly as the segments policy does, so the two tables
 * differ only in their name and the arena flag.
 *
 * A large block keeps a remainder of 1 MiB or less: no large request could
 * use it, and not splitting saves a split and a merge per use (the replays
 * of real traces need the same memory either way). */
#define VG_SEGMENT_DECISIONS                                     \
    .split_min = {VG_ALIGN, VG_SMALL_REQUEST + VG_ALIGN},        \
    .segment_size = default_segment_size,                        \
    .fallback_segment_size = minimal_segment,                    \
    .keep_whole_from = VG_OVERSIZE_REMAINDER,                    \
    .keep_whole = default_keep_whole,                            \
    .swap_kept_whole = default_swap_kept_whole,                  \
    .stream_release = default_stream_release,                    \
    .refit_after_sync = true

const vg_policy vg_policy_default = {
    .name = "segments",
    VG_SEGMENT_DECISIONS,
};

/* The arena (arena.c) where the device has virtual memory; where it has
 * not, the segments policy's decisions, as they are. */
const vg_policy vg_policy_arena = {
    .name = "arena",
    VG_SEGMENT_DECISIONS,
    .arena = true,
};

/* ------------------------------------------------------------------ */
/* Names                                                               */
/* ------------------------------------------------------------------ */

/* What "vramguard" means: the policy the measurements favour (docs/design.md,
 * the arena section). The one place to change it. */
#define VG_RECOMMENDED_POLICY vg_policy_arena

const vg_policy *vg_policy_named(const char *name)
{
    if (!name) return NULL;
    if (!strcmp(name, "vramguard")) return &VG_RECOMMENDED_POLICY;
    if (!strcmp(name, "segments")) return &vg_policy_default;
    if (!strcmp(name, "arena")) return &vg_policy_arena;
    if (!strcmp(name, "torch")) return &vg_policy_torch;
    return NULL;
}

const char *vg_policy_recommended(void)
{
    return VG_RECOMMENDED_POLICY.name;
}
