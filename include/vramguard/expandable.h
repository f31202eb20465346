/* vramguard: an emulation of PyTorch's CUDA caching allocator with
 * PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, for replays only
 * (csrc/replay/torch_expandable.c): what PyTorch with expandable segments
 * would map, unmap and reserve for a trace, so that it can be set beside
 * vramguard's own policies on the same trace. Nothing here touches a
 * device. */
#ifndef VRAMGUARD_EXPANDABLE_H
#define VRAMGUARD_EXPANDABLE_H

#include "vramguard/replay.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PyTorch's page sizes: kLargeBuffer (20 MiB, the large pool's physical
 * allocation unit) and kSmallBuffer (2 MiB, the small pool's). */
#define VG_EXPANDABLE_LARGE_PAGE ((uint64_t)20 << 20)
#define VG_EXPANDABLE_SMALL_PAGE ((uint64_t)VG_SMALL_SEGMENT)
/* The device memory assumed when neither a budget nor device_total is given:
 * large enough never to be the limit (as vramguard.replay's device). */
#define VG_EXPANDABLE_UNLIMITED ((uint64_t)1 << 50)

typedef struct vg_expandable_config {
    /* Mapped bytes (all pools, all streams) may not pass this: a page that
     * would is refused as cuMemCreate refuses it when the device is full.
     * 0 = no budget. */
    uint64_t budget;
    /* The device's total memory: each segment reserves 9/8 of it as virtual
     * address space, as PyTorch does. 0 = the budget, or
     * VG_EXPANDABLE_UNLIMITED without one. */
    uint64_t device_total;
    /* Page sizes, multiples of 2 MiB; 0 = PyTorch's (20 MiB, 2 MiB). */
    uint64_t large_page, small_page;
} vg_expandable_config;

typedef struct vg_expandable_result {
    /* ops, allocs, frees, ooms, first_oom, peaks (reserved = mapped bytes),
     * samples, seconds; device_alloc and device_free count map and unmap
     * calls as PyTorch's num_device_alloc / num_device_free do, and
     * alloc_retries the allocations retried after a release. */
    vg_replay_result replay;
    uint64_t map_calls, map_pages;     /* map_block calls; pages created and mapped */
    uint64_t unmap_calls, unmap_pages; /* unmap_block calls that unmapped; pages */
    uint64_t stream_syncs;             /* cudaStreamSynchronize before each unmap */
    uint64_t device_syncs;             /* release_cached_blocks' synchronize_and_free_events */
    uint64_t segments_created;         /* virtual ranges reserved */
    uint64_t peak_segments;            /* most held at once */
} vg_expandable_result;

/* Replay a validated trace (vg_trace_validate) through the emulation.
 * `samples` (may be NULL) gets up to `nsamples` windows of `window` ops,
 * as vg_replay's. VG_ERR_ARG for a page size that is not a positive
 * multiple of 2 MiB, VG_ERR_NOMEM if the host runs out; *out is then
 * zeroed, first_oom -1. Memory is O(ids + blocks); an op costs a few
 * treap descents (PyTorch's scan of a stream's unmapped ranges is answered
 * from per-range maxima), plus get_free_block's walk past blocks followed
 * by unmapped ranges, and for a release the blocks it unmaps. */
int vg_expandable_replay(const vg_trace_ops *t, const vg_expandable_config *config,
                         vg_replay_sample *samples, size_t nsamples, size_t window,
                         vg_expandable_result *out);

#ifdef __cplusplus
}
#endif
#endif
