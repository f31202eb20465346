/* vramguard: a caching allocator for GPU memory.
 *
 * One heap serves one device. It keeps the segments a device provider gave it,
 * splits them into blocks, caches freed blocks in size-class bins per stream,
 * and follows an empty-cache policy when the device or the budget says no.
 * Every decision it takes is counted in vg_stats.
 *
 * Thread safety: every vg_heap_* call takes the heap's lock once.
 */
#ifndef VRAMGUARD_H
#define VRAMGUARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Basic types                                                         */
/* ------------------------------------------------------------------ */

typedef uintptr_t vg_stream_t; /* opaque stream handle (cudaStream_t), 0 = default */
typedef uintptr_t vg_event_t;  /* opaque event handle owned by a provider */

enum vg_status {
    VG_OK = 0,
    VG_ERR_INVALID = 1,      /* pointer unknown to the heap, or already freed */
    VG_ERR_NOMEM = 2,        /* the device (or the host, for metadata) said no */
    VG_ERR_ARG = 3,          /* an argument out of range */
    VG_ERR_DEVICE = 4,       /* the provider failed for another reason */
};

/* Allocation granularity: every block size is a multiple of this. */
#define VG_ALIGN ((size_t)512)
/* Requests up to this size come from the small pool. */
#define VG_SMALL_REQUEST ((size_t)1 << 20)
/* Segment size of the small pool. */
#define VG_SMALL_SEGMENT ((size_t)2 << 20)
/* Providers hand out memory in multiples of this (cudaMalloc's page). */
#define VG_SEGMENT_GRANULE ((size_t)2 << 20)
/* Largest request a heap will consider; anything above is an OOM. */
#define VG_MAX_REQUEST ((size_t)1 << 47)

enum vg_pool { VG_POOL_SMALL = 0, VG_POOL_LARGE = 1, VG_POOL_COUNT = 2 };

/* ------------------------------------------------------------------ */
/* Device providers                                                    */
/* ------------------------------------------------------------------ */

typedef struct vg_device vg_device;

/* What a heap needs from a device. Every function is called with the
 * heap's lock held, so a provider need not lock for one heap. */
typedef struct vg_device_ops {
    const char *name;
    /* Reserve `size` bytes (a multiple of VG_SEGMENT_GRANULE). VG_OK and
     * *addr set, or VG_ERR_NOMEM when the device is full. */
    int (*reserve)(vg_device *dev, size_t size, uintptr_t *addr);
    void (*release)(vg_device *dev, uintptr_t addr, size_t size);
    int (*mem_info)(vg_device *dev, size_t *free_bytes, size_t *total_bytes);
    /* Wait for all work on the device; afterwards every event queries done. */
    void (*synchronize)(vg_device *dev);
    int (*event_record)(vg_device *dev, vg_stream_t stream, vg_event_t *ev);
    /* 1 when the work before the event has finished, 0 when not yet. */
    int (*event_query)(vg_device *dev, vg_event_t ev);
    void (*event_release)(vg_device *dev, vg_event_t ev);
    void (*destroy)(vg_device *dev);
} vg_device_ops;

struct vg_device {
    const vg_device_ops *ops;
    int index; /* device ordinal, for messages */
};

/* The simulated device: a capacity and a fake 64-bit address space with no
 * memory behind it, so an 80 GiB GPU can be simulated anywhere. */
vg_device *vg_sim_create(size_t capacity);
/* Refuse the nth reserve from now on (1 = the next one); 0 turns it off. */
void vg_sim_fail_nth(vg_device *dev, uint64_t nth);
/* Refuse each reserve with the given probability, from a seeded generator. */
void vg_sim_fail_random(vg_device *dev, double probability, uint64_t seed);
/* Mark all work queued so far on `stream` as finished. */
void vg_sim_complete_stream(vg_device *dev, vg_stream_t stream);
/* Bytes the sim has handed out and not got back. */
size_t vg_sim_used(const vg_device *dev);

/* The CUDA provider (device_cuda.c). The CUDA runtime is found at run
 * time; vg_cuda_load() returns NULL when it is usable, else why not. */
const char *vg_cuda_load(void);
/* Which runtime was found (a path or soname), NULL if none. */
const char *vg_cuda_runtime_source(void);
int vg_cuda_device_count(void);
/* A provider for one device; NULL if the runtime is missing. */
vg_device *vg_cuda_create(int device);

/* ------------------------------------------------------------------ */
/* Policy                                                              */
/* ------------------------------------------------------------------ */

typedef struct vg_policy vg_policy;

/* vramguard's own policy: see policy.c. */
extern const vg_policy vg_policy_default;
/* An emulation of PyTorch's native caching allocator: see policy_torch.c. */
extern const vg_policy vg_policy_torch;

/* ------------------------------------------------------------------ */
/* Statistics                                                          */
/* ------------------------------------------------------------------ */

typedef struct vg_stat {
    int64_t current;
    int64_t peak;
    int64_t allocated; /* total ever added */
    int64_t freed;     /* total ever removed */
} vg_stat;

/* Per quantity: index 0 = all, 1 = small pool, 2 = large pool. */
enum { VG_STAT_ALL = 0, VG_STAT_SMALL = 1, VG_STAT_LARGE = 2, VG_STAT_TYPES = 3 };

typedef struct vg_stats {
    vg_stat requested_bytes[VG_STAT_TYPES]; /* as asked for */
    vg_stat allocated_bytes[VG_STAT_TYPES]; /* as rounded to blocks */
    vg_stat allocation[VG_STAT_TYPES];      /* live blocks */
    vg_stat active[VG_STAT_TYPES];          /* live + freed-but-in-use-by-a-stream */
    vg_stat active_bytes[VG_STAT_TYPES];
    vg_stat reserved_bytes[VG_STAT_TYPES];  /* held from the provider */
    vg_stat segment[VG_STAT_TYPES];

    /* Counters: each policy decision and each provider call. They stay
     * last in the struct, from num_device_alloc on (reset_accumulated). */
    uint64_t num_device_alloc;     /* provider reserve calls that succeeded */
    uint64_t num_device_free;      /* provider release calls */
    uint64_t num_device_alloc_failed; /* provider reserve calls refused */
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
} vg_stats;

typedef struct vg_fragmentation {
    uint64_t reserved_bytes;
    uint64_t allocated_bytes;
    uint64_t free_bytes;          /* reserved but not in a live block */
    uint64_t largest_free_block;
    uint64_t free_blocks;
    uint64_t pending_blocks;      /* freed, waiting for streams */
    double external;              /* 1 - largest_free / free_bytes */
    double unused;                /* 1 - allocated / reserved */
} vg_fragmentation;

/* Everything an OOM message needs, taken at the moment of failure. */
typedef struct vg_oom_info {
    size_t requested;
    size_t rounded;
    size_t budget;             /* 0 when none */
    size_t device_total;
    size_t device_free;
    size_t allocated;
    size_t reserved;
    size_t largest_free_block;
    size_t free_blocks;
    size_t free_bytes;         /* reserved - allocated */
    int device;
    int budget_refused;        /* the budget, not the device, said no */
} vg_oom_info;

/* ------------------------------------------------------------------ */
/* Heap                                                                */
/* ------------------------------------------------------------------ */

typedef struct vg_heap vg_heap;

typedef struct vg_heap_config {
    const vg_policy *policy; /* NULL = vg_policy_default */
    size_t budget;           /* 0 = the device's capacity */
    double gc_threshold;     /* fraction of the budget; 0 = off */
} vg_heap_config;

/* The heap does not own `dev`; destroy the heap first. NULL on bad input or
 * when the host is out of memory. */
vg_heap *vg_heap_create(vg_device *dev, const vg_heap_config *cfg);
/* Returns every segment to the device, live blocks included. */
void vg_heap_destroy(vg_heap *h);

/* Size 0 returns NULL and is not an error (counted in num_zero_allocs).
 * On failure returns NULL and, when `oom` is given, fills it. */
void *vg_heap_alloc(vg_heap *h, size_t size, vg_stream_t stream, vg_oom_info *oom);
/* NULL is a no-op. An unknown pointer or a double free returns
 * VG_ERR_INVALID, is counted, and leaves the heap as it was. */
int vg_heap_free(vg_heap *h, void *ptr);
/* As vg_heap_free, but a pointer the heap does not know is left to the
 * caller to count (vg_heap_count_invalid_free): for callers that try
 * several heaps. */
int vg_heap_free_if_owned(vg_heap *h, void *ptr);
void vg_heap_count_invalid_free(vg_heap *h);
/* The block at `ptr` is also used by `stream`: on free it becomes reusable
 * only once the work queued on `stream` by then has finished. */
int vg_heap_record_stream(vg_heap *h, void *ptr, vg_stream_t stream);

/* Release every wholly free segment; returns the bytes released. */
size_t vg_heap_empty_cache(vg_heap *h);
/* Wait for the device, then finish every deferred free. */
void vg_heap_synchronize(vg_heap *h);
void vg_heap_reset_peaks(vg_heap *h);
/* Totals (allocated, freed) restart from the current values and every
 * counter from 0, as torch.cuda.reset_accumulated_memory_stats() does. */
void vg_heap_reset_accumulated(vg_heap *h);

/* 0 = no budget (the device's capacity rules). Lowering it releases idle
 * segments until reserved memory fits, as far as live blocks allow. */
int vg_heap_set_budget(vg_heap *h, size_t budget);
size_t vg_heap_budget(const vg_heap *h);
int vg_heap_set_gc_threshold(vg_heap *h, double fraction);
double vg_heap_gc_threshold(const vg_heap *h);

void vg_heap_stats(vg_heap *h, vg_stats *out);
void vg_heap_fragmentation(vg_heap *h, vg_fragmentation *out);
/* Live blocks per size class: fills up to `n` (class lower bound, count)
 * pairs with a non-zero count, smallest first; returns how many exist. */
size_t vg_heap_histogram(vg_heap *h, uint64_t *lower_bounds, uint64_t *counts, size_t n);
/* Size of the live block at ptr, 0 if none. */
size_t vg_heap_block_size(vg_heap *h, void *ptr);
vg_device *vg_heap_device(const vg_heap *h);
const char *vg_heap_policy_name(const vg_heap *h);

/* Walk every segment, block, bin and counter. Returns NULL when all
 * invariants hold, else a static description of the first one broken. */
const char *vg_heap_check(vg_heap *h);

/* Visiting segments and blocks, for reports. The callbacks run with the heap
 * locked: they must not call back into the heap. */
typedef struct vg_segment_info {
    uintptr_t addr;
    size_t size;
    vg_stream_t stream;
    int pool;
    size_t allocated;  /* bytes in live blocks */
    size_t blocks;
} vg_segment_info;

enum vg_block_state { VG_BLOCK_FREE = 0, VG_BLOCK_LIVE = 1, VG_BLOCK_PENDING = 2 };

typedef struct vg_block_info {
    uintptr_t addr;
    size_t size;
    size_t requested;  /* 0 unless live */
    int state;
} vg_block_info;

typedef int (*vg_segment_visitor)(void *arg, const vg_segment_info *seg);
typedef int (*vg_block_visitor)(void *arg, const vg_block_info *blk);
/* Stops early when a visitor returns non-zero, and returns that value. */
int vg_heap_visit(vg_heap *h, vg_segment_visitor on_segment, vg_block_visitor on_block, void *arg);

/* ------------------------------------------------------------------ */
/* Event trace (trace.c): a bounded ring, off until started            */
/* ------------------------------------------------------------------ */

enum vg_event_kind {
    VG_EV_ALLOC = 1,         /* addr, size = block, requested, stream */
    VG_EV_FREE = 2,          /* addr, size = block, requested, stream = owner */
    VG_EV_RESERVE = 3,       /* addr, size = segment */
    VG_EV_RELEASE = 4,       /* addr, size = segment */
    VG_EV_RECORD_STREAM = 5, /* addr, size = block, stream = the recorded one */
    VG_EV_EMPTY_CACHE = 6,   /* size = bytes released */
    VG_EV_OOM = 7,           /* size = rounded, requested */
};

typedef struct vg_trace_event {
    uint64_t time_ns;  /* CLOCK_MONOTONIC */
    uint64_t addr;
    uint64_t size;
    uint64_t requested;
    uint64_t stream;
    uint32_t kind;
    uint32_t reserved_;
} vg_trace_event;

/* Start recording into a fresh ring of `capacity` events (older events are
 * overwritten when it is full, and counted as dropped). */
int vg_heap_trace_start(vg_heap *h, size_t capacity);
/* Stop recording; the events stay until taken. */
void vg_heap_trace_stop(vg_heap *h);
int vg_heap_trace_active(vg_heap *h);
/* Move up to `max` of the oldest events into `out`; returns how many.
 * `dropped` (may be NULL) gets the number overwritten since the start. */
size_t vg_heap_trace_take(vg_heap *h, vg_trace_event *out, size_t max, uint64_t *dropped);

/* ------------------------------------------------------------------ */
/* Size classes (bins.c)                                               */
/* ------------------------------------------------------------------ */

/* Block size for a request: a multiple of VG_ALIGN, at least VG_ALIGN.
 * 0 when the request is 0 or above VG_MAX_REQUEST. */
size_t vg_round_size(size_t size);

/* ------------------------------------------------------------------ */
/* Replay (replay.c): drive a heap with a recorded allocation trace    */
/* ------------------------------------------------------------------ */

/* A trace is columnar: op kinds, allocation ids (dense, 0..nids-1), sizes
 * and streams, one entry per op. Frees name the id of their allocation. */
enum vg_op_kind {
    VG_OP_ALLOC = 1,       /* id, size (requested bytes), stream */
    VG_OP_FREE = 2,        /* id */
    VG_OP_EMPTY_CACHE = 3,
    VG_OP_SYNCHRONIZE = 4,
};

typedef struct vg_trace_ops {
    const uint8_t *kinds;
    const uint32_t *ids;
    const uint64_t *sizes;
    const uint64_t *streams;
    size_t n;
    size_t nids;
} vg_trace_ops;

/* One point of the memory curve: maxima over a window of ops. */
typedef struct vg_replay_sample {
    uint64_t op;               /* last op of the window */
    uint64_t requested;
    uint64_t allocated;
    uint64_t reserved;
} vg_replay_sample;

typedef struct vg_replay_result {
    uint64_t ops;
    uint64_t allocs, frees, ooms;
    int64_t first_oom;         /* op index, -1 if none */
    uint64_t peak_requested, peak_allocated, peak_reserved;
    uint64_t device_alloc, device_free, alloc_retries;
    uint64_t samples;          /* windows written to `samples` */
    double seconds;            /* the replay loop alone */
} vg_replay_result;

/* Check a trace before replaying it: ids in range, every free of a live id,
 * no id allocated twice while live. NULL when valid, else a static message
 * and *bad_op the op at fault. */
const char *vg_trace_validate(const vg_trace_ops *t, size_t *bad_op);
/* Peak of live requested bytes: the physical limit, whatever the policy. */
uint64_t vg_trace_peak_live(const vg_trace_ops *t);
/* Replay a validated trace through `h`. `samples` (may be NULL) gets up to
 * `nsamples` windows of `window` ops. VG_ERR_NOMEM if the host runs out. */
int vg_replay(vg_heap *h, const vg_trace_ops *t, vg_replay_sample *samples, size_t nsamples,
              size_t window, vg_replay_result *out);

/* ------------------------------------------------------------------ */
/* Messages (oom_message.c)                                            */
/* ------------------------------------------------------------------ */

/* "512 bytes", "1.50 KiB", "20.00 MiB", "14.75 GiB", as PyTorch writes them. */
void vg_format_size(uint64_t bytes, char *buf, size_t n);
/* PyTorch's OOM wording ("<device_kind> out of memory. Tried to allocate
 * ..."), then a line naming the most likely cause. Returns the length. */
size_t vg_format_oom(const vg_oom_info *oom, const char *device_kind, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
