/* An emulation of PyTorch's native CUDA caching allocator (default
 * settings: no max_split_size, no expandable segments, no rounding to
 * powers of two), so that replays can compare vramguard with what users run
 * today on the same trace.
 *
 * What it copies:
 * - 512-byte rounding; requests up to 1 MiB in 2 MiB small segments;
 *   requests under 10 MiB in 20 MiB segments; larger ones in segments
 *   rounded up to 2 MiB;
 * - best fit per (stream, pool) over an ordered set of (size, address):
 *   the smallest block that fits, the lowest address among equals;
 * - a small-pool block is split when 512 bytes or more remain, a large-pool
 *   block only when more than 1 MiB remains;
 * - when the device or the memory fraction refuses a segment: synchronize,
 *   release every unsplit cached segment, retry once, else OOM. (Its
 *   release_available_cached_blocks step does nothing unless
 *   max_split_size is set, so it is left out.) Any other cudaMalloc error
 *   ends the allocation at once (its C10_CUDA_CHECK).
 */
#include "heap_internal.h"

#define TORCH_SMALL_SIZE ((size_t)1 << 20)
#define TORCH_MIN_LARGE_ALLOC ((size_t)10 << 20)
#define TORCH_LARGE_BUFFER ((size_t)20 << 20)

static size_t torch_segment_size(const vg_heap *h, int pool, size_t rounded)
{
    (void)h;
    if (pool == VG_POOL_SMALL) return VG_SMALL_SEGMENT;
    if (rounded < TORCH_MIN_LARGE_ALLOC) return TORCH_LARGE_BUFFER;
    return vg__round_to_granule(rounded);
}

static vg_block *try_reserve(vg_heap *h, vg_stream_bins *sb, int pool, size_t size,
                             bool *budget_refused)
{
    if (!vg__within_budget(h, size)) {
        h->stats.num_budget_refusals++;
        *budget_refused = true;
        return NULL;
    }
    *budget_refused = false;
    vg_segment *seg = vg__segment_create(h, sb, pool, size);
    return seg ? seg->head : NULL;
}

static bool never_keep_whole(const vg_heap *h, const vg_block *blk, size_t rounded)
{
    (void)h;
    (void)blk;
    (void)rounded;
    return false;
}

static vg_block *torch_grow(vg_heap *h, vg_stream_bins *sb, int pool, size_t rounded,
                            vg_block *oversize, bool *budget_refused)
{
    (void)oversize; /* never set: never_keep_whole */
    size_t size = torch_segment_size(h, pool, rounded);
    vg__collect_before_growth(h, size);
    vg_block *blk = try_reserve(h, sb, pool, size, budget_refused);
    if (blk || vg__device_failed(h)) return blk;
    h->stats.num_sync_all_streams++;
    vg__synchronize(h);
    if (vg__device_failed(h)) return NULL;
    vg__release_idle(h, NULL, SIZE_MAX, &h->stats.num_sync_releases);
    h->stats.num_alloc_retries++;
    return try_reserve(h, sb, pool, size, budget_refused);
}

const vg_policy vg_policy_torch = {
    .name = "torch",
    .split_min = {VG_ALIGN, TORCH_SMALL_SIZE + VG_ALIGN},
    .scan_limit = 0,
    .oversize_remainder = SIZE_MAX,
    .keep_whole = never_keep_whole,
    .segment_size = torch_segment_size,
    .grow = torch_grow,
};
