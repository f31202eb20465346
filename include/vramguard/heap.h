/* vramguard: a caching allocator for GPU memory.
 *
 * One heap serves one device. It keeps the segments a device provider gave it,
 * splits them into blocks, caches freed blocks in size-class bins per stream,
 * and follows an empty-cache policy when the device or the budget says no.
 * Every decision it takes is counted in vg_stats.
 *
 * Thread safety: every vg_heap_* call that reads or changes the heap takes
 * the heap's lock once (vg_heap_device and vg_heap_policy_name read what
 * never changes after vg_heap_create; create and destroy are the caller's
 * to order). No lock holder ever runs Python or waits for the GIL, so the
 * calls may be made with the GIL held.
 */
#ifndef VRAMGUARD_HEAP_H
#define VRAMGUARD_HEAP_H

#include "vramguard/common.h"
#include "vramguard/device.h"
#include "vramguard/oom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Policy                                                             */
/* ------------------------------------------------------------------ */

typedef struct vg_policy vg_policy;

/* vramguard's segments policy: see policy.c. */
extern const vg_policy vg_policy_default;
/* The arena: one virtual range per (stream, pool), pages mapped as blocks
 * need them (csrc/core/arena.c); segments where the device has no virtual
 * memory (page_size 0). */
extern const vg_policy vg_policy_arena;
/* An emulation of PyTorch's native caching allocator: see
 * csrc/replay/policy_torch.c. */
extern const vg_policy vg_policy_torch;
/* A policy by name: "arena", "segments", "torch", or "vramguard" (the
 * recommended one); NULL for any other name. */
const vg_policy *vg_policy_named(const char *name);
/* What "vramguard" names. */
const char *vg_policy_recommended(void);

/* ------------------------------------------------------------------ */
/* Statistics                                                         */
/* ------------------------------------------------------------------ */

typedef struct vg_stat {
    int64_t current;
    int64_t peak;
    int64_t allocated; /* total added (since the last vg_heap_reset_accumulated) */
    int64_t freed;     /* total removed (likewise) */
} vg_stat;

/* Per quantity: index 0 = all, 1 = small pool, 2 = large pool. */
enum { VG_STAT_ALL = 0, VG_STAT_SMALL = 1, VG_STAT_LARGE = 2, VG_STAT_TYPES = 3 };

/* The vg_stat arrays of vg_stats (those that keep totals), in their order:
 * X(name) for each, one list for the core and the Python extension. */
#define VG_TOTALED_STAT_LIST(X) \
    X(requested_bytes)          \
    X(allocated_bytes)          \
    X(allocation)               \
    X(active)                   \
    X(active_bytes)             \
    X(reserved_bytes)           \
    X(segment)                  \
    X(inactive_split)           \
    X(inactive_split_bytes)

typedef struct vg_stats {
    vg_stat requested_bytes[VG_STAT_TYPES]; /* as asked for */
    vg_stat allocated_bytes[VG_STAT_TYPES]; /* as rounded to blocks */
    vg_stat allocation[VG_STAT_TYPES];      /* live blocks */
    vg_stat active[VG_STAT_TYPES];          /* live + freed-but-in-use-by-a-stream */
    vg_stat active_bytes[VG_STAT_TYPES];
    vg_stat reserved_bytes[VG_STAT_TYPES];  /* held from the provider */
    vg_stat segment[VG_STAT_TYPES];
    /* Free blocks in segments that also hold other blocks: memory that
     * empty_cache cannot give back (PyTorch's inactive_split). */
    vg_stat inactive_split[VG_STAT_TYPES];
    vg_stat inactive_split_bytes[VG_STAT_TYPES];

    /* vg_heap_reset_peaks calls so far (kept by reset_accumulated): how a
     * reader that keeps its own peaks over this heap's knows they were
     * reset, whatever the peaks did since. */
    uint64_t peak_resets;

    /* Counters: each policy decision and each provider call. They stay
     * last in the struct, from num_device_alloc on (reset_accumulated). */
    uint64_t num_device_alloc;     /* provider reserve calls that succeeded */
    uint64_t num_device_free;      /* provider release calls */
    uint64_t num_device_alloc_failed; /* provider reserve calls refused for lack of memory */
    uint64_t num_cache_hits;       /* allocations served from cached blocks */
    uint64_t num_cache_misses;     /* allocations that needed a new segment */
    uint64_t num_splits;
    uint64_t num_merges;
    uint64_t num_alloc_retries;    /* release-and-retry steps taken */
    uint64_t num_ooms;
    uint64_t num_budget_refusals;  /* growth refused because of the budget */
    uint64_t num_gc_releases;      /* segments released by the gc threshold */
    uint64_t num_stream_releases;  /* segments released by retry step 1 */
    uint64_t num_sync_all_streams; /* retry step 2 synchronizations */
    uint64_t num_sync_releases;    /* segments released by retry step 2 */
    uint64_t num_empty_cache;      /* vg_heap_empty_cache calls */
    uint64_t num_empty_cache_releases;
    uint64_t num_shrunk_segments;  /* segments made smaller to fit the budget */
    uint64_t num_budget_releases;  /* segments released when the budget was lowered */
    uint64_t num_kept_whole;       /* fresh segments reserved to keep a big cached block whole */
    uint64_t num_oversize_releases; /* big idle segments swapped for right-sized ones */
    uint64_t num_oversize_splits;  /* big cached blocks split after all */
    uint64_t num_invalid_frees;    /* unknown pointer or double free */
    uint64_t num_record_stream;
    uint64_t num_deferred_frees;   /* frees that waited for other streams */
    uint64_t num_zero_allocs;      /* size-0 requests (answered with NULL) */
    uint64_t num_device_errors;    /* provider calls failed for another reason than memory */
    /* The arena (zero with segments): map and unmap calls, and the pages
     * they covered; synchronizations made before unmapping (one per batch:
     * the device may still use freed pages); batches that left blocks
     * mapped because they were freed while that synchronize ran, or that
     * unmapped nothing because it failed or a capture skipped it; ranges
     * reserved and released
     * (their number now is segment[].current). */
    uint64_t num_maps;
    uint64_t num_mapped_pages;
    uint64_t num_unmaps;
    uint64_t num_unmapped_pages;
    uint64_t num_unmap_syncs;
    uint64_t num_unmap_skips;
    uint64_t num_range_reserves;
    uint64_t num_range_releases;
    /* Unmap batches stopped because the provider answered VG_ERR_BUSY (a
     * capture began after the synchronize): the pages stay mapped. */
    uint64_t num_unmaps_refused;
    /* Allocations the arena answered OOM at once, the budget having
     * refused their pages: the live bytes and the request's, or what
     * would stay mapped after unmapping every page the ladder may unmap
     * plus what the request lacks, pass the ceiling, so no step of the
     * ladder could succeed (each also counts in num_ooms). */
    uint64_t num_oom_fast_fails;
} vg_stats;
/* vg_stats has num_oom_fast_fails (for code built against older heads). */
#define VG_STATS_HAVE_LADDER_SHORTCUTS 1

typedef struct vg_fragmentation {
    uint64_t reserved_bytes;      /* with the arena: mapped bytes */
    uint64_t allocated_bytes;
    uint64_t free_bytes;          /* reserved but not in a live block */
    /* The largest request the reserved memory serves without a new
     * segment or a map: the largest free block, and with the arena, its
     * largest mapped stretch. */
    uint64_t largest_free_block;
    /* The pieces free_bytes is in: free blocks, and with the arena, the
     * mapped stretches of free blocks (an unmapped stretch holds none). */
    uint64_t free_blocks;
    uint64_t pending_blocks;      /* freed, waiting for streams */
    double external;              /* 1 - largest_free / free_bytes */
    double unused;                /* 1 - allocated / reserved */
    /* The arena (0 with segments): the largest free stretch of address
     * space, mapped or not, the largest request that needs no new range.
     * Address space, not memory: reports never show it beside memory. */
    uint64_t largest_free_range;
    /* What releasing the cache would give back: wholly free segments, and
     * with the arena, the whole mapped pages of free blocks. */
    uint64_t releasable_bytes;
    /* The largest request that could be allocated now within the ceiling
     * (the budget, else the device's total, less what shares it): the
     * largest free block, or new memory of the room under the ceiling once
     * the cache is released, in whole 2 MiB granules. The device's free
     * memory is not asked here (another process may hold some): an OOM's
     * figure (vg_oom_info) is capped by it. */
    uint64_t largest_allocatable;
} vg_fragmentation;

/* ------------------------------------------------------------------ */
/* Heap                                                               */
/* ------------------------------------------------------------------ */

typedef struct vg_heap vg_heap;

typedef struct vg_heap_config {
    /* NULL = the recommended policy ("vramguard", vg_policy_recommended):
     * a heap made without a choice gets what the measurements favour, as
     * Heap(), replay() and install() do. */
    const vg_policy *policy;
    size_t budget;           /* 0 = the device's capacity */
    double gc_threshold;     /* fraction of the budget; 0 = off (vg_valid_fraction) */
} vg_heap_config;

/* The heap does not own `dev`; destroy the heap first. NULL on bad input (a
 * gc threshold that is not a vg_valid_fraction) or when the host is out of
 * memory. */
vg_heap *vg_heap_create(vg_device *dev, const vg_heap_config *cfg);
/* Returns every segment to the device, live blocks included. */
void vg_heap_destroy(vg_heap *h);

/* Size 0 returns NULL and is not an error (counted in num_zero_allocs).
 * On failure returns NULL and, when `oom` is given, fills it; its status
 * says why: VG_ERR_NOMEM after the whole release-and-retry ladder
 * (num_ooms), or VG_ERR_DEVICE at the first device error, with nothing
 * released or retried (num_device_errors). */
void *vg_heap_alloc(vg_heap *h, size_t size, vg_stream_t stream, vg_oom_info *oom);
/* NULL is a no-op. An unknown pointer or a double free returns
 * VG_ERR_INVALID, is counted, and leaves the heap as it was. */
int vg_heap_free(vg_heap *h, void *ptr);
/* As vg_heap_free, but a pointer the heap does not know is left to the
 * caller to count (vg_heap_count_invalid_free): for callers that try
 * several heaps. */
int vg_heap_free_if_owned(vg_heap *h, void *ptr);
void vg_heap_count_invalid_free(vg_heap *h);
/* The block at `ptr` is also used by `stream` of the heap's own device: on
 * free it becomes reusable only once the work queued on `stream` by then
 * has finished. */
int vg_heap_record_stream(vg_heap *h, void *ptr, vg_stream_t stream);
/* The same for a stream of any device (`device` >= 0): a stream belongs to
 * one device, and handle 0 is the default stream of every device. */
int vg_heap_record_device_stream(vg_heap *h, void *ptr, int device, vg_stream_t stream);

/* Release every wholly free segment; returns the bytes released. */
size_t vg_heap_empty_cache(vg_heap *h);
/* Wait for the device, then finish every deferred free. No call on the
 * heap waits for the device with the heap's lock held: other threads may
 * use the heap meanwhile. */
void vg_heap_synchronize(vg_heap *h);
/* Returns once every call on `h` that began before it has finished,
 * including one waiting for the device with the lock released (the
 * registry, before a capture begins). */
void vg_heap_wait_for_calls(vg_heap *h);
void vg_heap_reset_peaks(vg_heap *h);
/* Every peak of the totaled stats back to `saved`'s (a vg_heap_stats copy
 * taken earlier), or to its current value where that is higher: the
 * peaks as they would be had what ran since not reached higher ones (a
 * search that tries sizes until one fails, then frees them). Not a reset:
 * peak_resets is left as it is. */
void vg_heap_restore_peaks(vg_heap *h, const vg_stats *saved);
/* Totals (allocated, freed) and every counter restart from 0, as
 * torch.cuda.reset_accumulated_memory_stats() does: afterwards allocated -
 * freed is the change of current since the reset. */
void vg_heap_reset_accumulated(vg_heap *h);

/* While `keep` is set no segment is released, however idle: neither the
 * gc threshold, the out-of-memory ladder, a lower budget nor empty_cache
 * gives memory back. For a CUDA graph's private pool, whose freed blocks
 * the graph still writes to when replayed; they are reused only by the
 * allocations of that pool. */
void vg_heap_set_keep_segments(vg_heap *h, int keep);

/* The budget that allows nothing new: what a memory fraction of 0 asks
 * (torch.cuda.set_per_process_memory_fraction(0)), since 0 is "none".
 * Reports print it as a fraction of 0, not as a budget of 1 byte. */
#define VG_BUDGET_NOTHING ((size_t)1)

/* 0 = no budget (the device's capacity rules). Lowering it releases idle
 * segments until reserved memory fits, as far as live blocks allow. */
int vg_heap_set_budget(vg_heap *h, size_t budget);
size_t vg_heap_budget(vg_heap *h);
/* The budget is shared with other heaps (a device's heap and its CUDA-graph
 * pools): `reserved_elsewhere(ctx)` says what they reserve now, and it
 * counts against this heap's budget and ceiling. It is called with this
 * heap's lock held, only when memory would grow (never for a cached block):
 * it must take no heap lock. NULL: the budget is this heap's alone. */
void vg_heap_share_budget(vg_heap *h, size_t (*reserved_elsewhere)(void *ctx), void *ctx);
/* VG_ERR_ARG unless vg_valid_fraction(fraction). */
int vg_heap_set_gc_threshold(vg_heap *h, double fraction);
double vg_heap_gc_threshold(vg_heap *h);
/* The device's total memory, as it said when the heap was created (0 if it
 * could not say): for budget fractions and reports, without calling the
 * provider outside the lock. */
size_t vg_heap_device_total(vg_heap *h);

void vg_heap_stats(vg_heap *h, vg_stats *out);
void vg_heap_fragmentation(vg_heap *h, vg_fragmentation *out);
/* The largest request the heap could serve now, its cache released: as
 * vg_fragmentation's largest_allocatable, with the room under the budget
 * also capped by what the device says is free (the CUDA context, other
 * processes), as an out-of-memory report computes it. Asks the device,
 * outside the lock: for reports, not for the allocation path. */
uint64_t vg_heap_largest_allocatable(vg_heap *h);
/* How many size classes there are: a histogram of this many pairs holds
 * every class. (35 levels of 32 classes, from VG_ALIGN up to VG_MAX_REQUEST:
 * the levels are defined in csrc/core/heap_internal.h; the core derives its bins from this number and
 * asserts that they reach VG_MAX_REQUEST.) */
#define VG_SIZE_CLASSES 1120
/* Live blocks per size class: fills up to `n` (class lower bound, count)
 * pairs with a non-zero count, smallest first, in one pass under the lock;
 * returns how many it wrote (n when there were more: pass VG_SIZE_CLASSES
 * to get them all). */
size_t vg_heap_histogram(vg_heap *h, uint64_t *lower_bounds, uint64_t *counts, size_t n);
/* Size of the live block at ptr, 0 if none. */
size_t vg_heap_block_size(vg_heap *h, void *ptr);
/* The segment that holds the address `ptr` (the start of a live block, or
 * any byte of a segment): its base and size. VG_ERR_INVALID when no
 * segment of the heap holds it. */
int vg_heap_segment_of(vg_heap *h, const void *ptr, uintptr_t *base, size_t *size);
vg_device *vg_heap_device(const vg_heap *h);
const char *vg_heap_policy_name(const vg_heap *h);
/* 1 when the heap runs the arena (its policy asks for it and the device
 * has virtual memory), 0 when it uses segments. */
int vg_heap_uses_arena(const vg_heap *h);

/* Walk every segment, block, bin and counter. Returns NULL when all
 * invariants hold, else a static description of the first one broken. */
const char *vg_heap_check(vg_heap *h);

/* Visiting segments and blocks, for reports. The callbacks run with the heap
 * locked: they must not call back into the heap, nor run Python or wait for
 * anything that may itself wait for this heap. Copy what is needed, and
 * build reports after the walk. */
typedef struct vg_segment_info {
    uintptr_t addr;
    size_t size;
    vg_stream_t stream;
    int pool;
    size_t allocated;  /* bytes in live blocks */
    size_t blocks;
    size_t mapped;     /* bytes with memory behind them: size, or a range's mapped bytes */
    /* An arena range's page bitmap (bit i: page i from addr is mapped,
     * `page_words` words, pages past them unmapped) and its page size;
     * NULL and 0 for a segment. Valid only during the callback: copy it. */
    const uint64_t *pages;
    size_t page_words;
    size_t page_size;
} vg_segment_info;

enum vg_block_state { VG_BLOCK_FREE = 0, VG_BLOCK_LIVE = 1, VG_BLOCK_PENDING = 2 };

typedef struct vg_block_info {
    uintptr_t addr;
    size_t size;
    size_t requested;  /* 0 unless live */
    int state;
    uint32_t stack;    /* live: the recording's stack id of its allocation (history.h), 0 = none */
} vg_block_info;

typedef int (*vg_segment_visitor)(void *arg, const vg_segment_info *seg);
typedef int (*vg_block_visitor)(void *arg, const vg_block_info *blk);
/* Stops early when a visitor returns non-zero, and returns that value. */
int vg_heap_visit(vg_heap *h, vg_segment_visitor on_segment, vg_block_visitor on_block, void *arg);

/* ------------------------------------------------------------------ */
/* Size classes (bins.c)                                              */
/* ------------------------------------------------------------------ */

/* Block size for a request: a multiple of VG_ALIGN, at least VG_ALIGN.
 * 0 when the request is 0 or above VG_MAX_REQUEST. */
size_t vg_round_size(size_t size);

#ifdef __cplusplus
}
#endif
#endif
