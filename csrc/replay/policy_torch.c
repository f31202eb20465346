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
 *   ends the allocation at once (its C10_CUDA_CHECK), as the ladder does.
 *
 * As decisions (heap_internal.h, struct vg_policy): no fallback segment, no
 * block kept whole, nothing released before the synchronize, and no second
 * look at the cache after it. The ladder is the heap's (ladder.c).
 */
#include "heap_internal.h"
#include "segments.h"

/* PyTorch's kMinLargeAlloc and kLargeBuffer; kSmallSize is VG_SMALL_REQUEST,
 * kSmallBuffer VG_SMALL_SEGMENT, kRoundLarge VG_SEGMENT_GRANULE. */
#define TORCH_MIN_LARGE_ALLOC ((size_t)10 << 20)
#define TORCH_LARGE_BUFFER ((size_t)20 << 20)

static size_t torch_segment_size(const vg_heap *h, int pool, size_t rounded)
{
    (void)h;
    if (pool == VG_POOL_SMALL) return VG_SMALL_SEGMENT;
    if (rounded < TORCH_MIN_LARGE_ALLOC) return TORCH_LARGE_BUFFER;
    return vg__round_to_granule(rounded);
}

const vg_policy vg_policy_torch = {
    .name = "torch",
    .split_min = {VG_ALIGN, VG_SMALL_REQUEST + VG_ALIGN},
    .segment_size = torch_segment_size,
    .fallback_segment_size = NULL,
    .keep_whole_from = SIZE_MAX,
    .keep_whole = NULL,
    .swap_kept_whole = NULL,
    .stream_release = NULL,
    .refit_after_sync = false,
};
