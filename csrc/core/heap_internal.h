/* Internal structures shared by the heap's files. Not installed. */
#ifndef VG_HEAP_INTERNAL_H
#define VG_HEAP_INTERNAL_H

#include "vramguard/heap.h"
#include "vramguard/history.h"
#include "vramguard/replay.h"
#include "lock.h"

#include <stdbool.h>

/* ------------------------------------------------------------------ */
/* Size classes (bins.c)                                               */
/* ------------------------------------------------------------------ */

/* Two levels: sizes (in VG_ALIGN units) below 2^VG_SUB_BITS map one to one
 * (linear classes); above, each power of two is split into 2^VG_SUB_BITS
 * linear sub-steps. */
#define VG_SUB_BITS 5
#define VG_SUBS (1u << VG_SUB_BITS)
#define VG_LEVELS 40 /* enough for VG_MAX_REQUEST in VG_ALIGN units */
#define VG_NBINS (VG_LEVELS * VG_SUBS)

typedef struct vg_block vg_block;
typedef struct vg_segment vg_segment;
typedef struct vg_stream_use vg_stream_use;

typedef struct vg_bins {
    uint64_t level_map;            /* bit L: some bin of level L is non-empty */
    uint32_t sub_map[VG_LEVELS];   /* bit S: bin L*VG_SUBS+S is non-empty */
    vg_block *head[VG_NBINS];
} vg_bins;

/* vg__bin_of_size, vg__bins_insert and vg__bins_remove are inline, in bins.h. */
size_t vg__bin_lower_bound(uint32_t bin);
/* Smallest free block of at least `size`, looking at no more than
 * `scan_limit` blocks per bin (0 = all of them). */
vg_block *vg__bins_best_fit(const vg_bins *b, size_t size, unsigned scan_limit);
/* Largest free block in the bins, NULL when empty. */
vg_block *vg__bins_largest(const vg_bins *b);

/* ------------------------------------------------------------------ */
/* Blocks and segments                                                 */
/* ------------------------------------------------------------------ */

/* A stream that used a block besides its own (record_stream); after the
 * block's free, the event recorded on that stream. A stream is known by
 * (device, handle): handle 0 is the default stream of every device. */
struct vg_stream_use {
    vg_stream_t stream;
    int device;
    vg_event_t event;
    bool has_event;
    vg_stream_use *next;
};

struct vg_block {
    uintptr_t addr;
    size_t size;
    size_t requested;           /* while live */
    vg_block *prev, *next;      /* address neighbours in the segment */
    vg_block *link_prev, *link_next; /* bin list, or the pending list */
    vg_segment *seg;
    vg_stream_use *uses;
    uint32_t bin;               /* size class: of its bin when free, for the
                                   histogram when live */
    uint8_t state;              /* enum vg_block_state */
};

typedef struct vg_stream_bins vg_stream_bins;

struct vg_segment {
    uintptr_t addr;
    size_t size;
    vg_stream_bins *owner;          /* the stream whose bins hold its blocks */
    int pool;
    vg_block *head;                 /* lowest-address block */
    vg_segment *prev, *next;        /* every segment of the heap */
    vg_segment *idle_prev, *idle_next; /* wholly free segments, oldest first */
    bool idle;
};

struct vg_stream_bins {
    vg_stream_t stream;
    vg_bins pool[VG_POOL_COUNT];
};

/* ------------------------------------------------------------------ */
/* Live-address map (addr_map.c): open addressing, linear probing      */
/* ------------------------------------------------------------------ */

typedef struct vg_addr_map {
    uintptr_t *keys;   /* 0 = empty slot */
    vg_block **vals;
    size_t mask;       /* capacity - 1 */
    size_t count;
} vg_addr_map;

int vg__map_init(vg_addr_map *m, size_t capacity);
void vg__map_free(vg_addr_map *m);
/* Double the capacity; VG_ERR_NOMEM if the host says no. */
int vg__map_grow(vg_addr_map *m);
/* vg__map_put, vg__map_get and vg__map_take are inline, in addr_map.h. */

/* ------------------------------------------------------------------ */
/* Policy                                                              */
/* ------------------------------------------------------------------ */

struct vg_policy {
    const char *name;
    /* Split a free block only when the remainder is at least this. */
    size_t split_min[VG_POOL_COUNT];
    /* How many blocks best fit may look at in one bin (0 = all). */
    unsigned scan_limit;
    /* Bytes to reserve for a new segment that must hold `rounded`. */
    size_t (*segment_size)(const vg_heap *h, int pool, size_t rounded);
    /* A cached block whose split would leave at least this much is asked
     * about with keep_whole before it is used (SIZE_MAX: never). */
    size_t oversize_remainder;
    /* Should `blk` stay whole rather than serve `rounded`? */
    bool (*keep_whole)(const vg_heap *h, const vg_block *blk, size_t rounded);
    /* Called when no cached block fits, or when the only one that fits is
     * `oversize` (kept whole if possible): grow, release, retry. Returns a
     * free block of at least `rounded` in the stream's bins, or NULL. */
    vg_block *(*grow)(vg_heap *h, vg_stream_bins *sb, int pool, size_t rounded,
                      vg_block *oversize, bool *budget_refused);
};

/* ------------------------------------------------------------------ */
/* Heap                                                                */
/* ------------------------------------------------------------------ */

typedef struct vg_history vg_history;

/* history.c: the recording ring. */
void vg__history_note(vg_history *r, uint32_t kind, uintptr_t addr, size_t size,
                      size_t requested, vg_stream_t stream);
void vg__history_destroy(vg_history *r);

/* One branch when not recording, stopped recordings included. */
#define VG_HISTORY(h, kind, addr, size, requested, stream)                       \
    do {                                                                         \
        if ((h)->recording) vg__history_note((h)->history, (kind), (addr), (size), \
                                             (requested), (stream));             \
    } while (0)

#define VG_BLOCK_SLAB 256

/* The vg_stat arrays of vg_stats that keep totals (allocated, freed). */
#define VG_TOTALED_STATS 7

typedef struct vg_slab {
    struct vg_slab *next;
} vg_slab;

struct vg_heap {
    vg_lock lock;
    vg_device *dev;
    const vg_policy *policy;
    size_t budget;         /* 0 = none */
    double gc_threshold;   /* 0 = off */
    size_t device_total;

    vg_stream_bins **streams;
    size_t nstreams, streams_cap;
    vg_stream_bins *last_stream; /* the stream of the previous call */

    vg_addr_map live;
    vg_block *spare_blocks;      /* free list of block records */
    vg_stream_use *spare_uses;
    vg_slab *slabs;              /* everything the free lists were cut from */

    vg_segment *segments;
    vg_segment *idle_head, *idle_tail;
    vg_block *pending;           /* freed blocks waiting for other streams */
    size_t free_blocks;

    vg_stats stats;
    /* Each totaled stat's current at the last reset_accumulated, so that
     * allocated - freed == current - base always holds (stats.c). */
    int64_t totals_base[VG_TOTALED_STATS][VG_STAT_TYPES];
    uint64_t live_per_bin[VG_NBINS];
    vg_history *history;         /* the ring, kept after a stop until taken */
    bool recording;              /* recording into it now */
    /* A CUDA graph may use its memory: no segment is released, idle or not
     * (vg_heap_set_keep_segments). */
    bool keep_segments;

    /* A provider call failed for another reason than memory since the
     * current allocation began: the ladder stops at once, since nothing it
     * could release would help, and the error is reported as itself. */
    bool device_failed;
    vg_device_error device_error; /* the last one, for the report */
};

/* heap.c: the operations the policies build on. */
vg_segment *vg__segment_create(vg_heap *h, vg_stream_bins *sb, int pool, size_t size);
void vg__segment_release(vg_heap *h, vg_segment *seg);
/* Release wholly free segments, oldest first, until `target` bytes are
 * released (SIZE_MAX = all); only those of `only` when it is not NULL.
 * Returns the bytes released. */
size_t vg__release_idle(vg_heap *h, const vg_stream_bins *only, size_t target,
                        uint64_t *counter);
/* Finish deferred frees whose events have completed. */
void vg__process_pending(vg_heap *h);
/* Wait for the device and finish every deferred free. */
void vg__synchronize(vg_heap *h);
/* A provider call returned VG_ERR_DEVICE: count it (num_device_errors),
 * keep the provider's words, and set device_failed. */
void vg__device_error(vg_heap *h);
static inline bool vg__device_failed(const vg_heap *h)
{
    return h->device_failed;
}
/* Can `bytes` more be reserved without passing the budget or the device? */
bool vg__within_budget(const vg_heap *h, size_t bytes);
size_t vg__reserved(const vg_heap *h);

/* policy.c: pieces both policies use. */
size_t vg__round_to_granule(size_t bytes);
/* gc threshold: release idle segments, oldest first, so that growing by
 * `growth` stays under the threshold. */
void vg__collect_before_growth(vg_heap *h, size_t growth);

/* stats.c, with the heap locked. */
void vg__fragmentation_locked(vg_heap *h, vg_fragmentation *out);
/* allocated - freed == current - (current at the last reset), every stat. */
bool vg__totals_consistent(vg_heap *h);

/* ------------------------------------------------------------------ */
/* Stats helpers (hot path, so inline)                                 */
/* ------------------------------------------------------------------ */

/* Totals only grow: 2^63 bytes of churn is reachable (131,072 segments of
 * 128 TiB), so they wrap, as unsigned numbers do, rather than overflow. */
static inline int64_t vg__total_add(int64_t total, int64_t v)
{
    return (int64_t)((uint64_t)total + (uint64_t)v);
}

static inline void vg__stat_add(vg_stat *s, int64_t v)
{
    s->current += v;
    s->allocated = vg__total_add(s->allocated, v);
    if (s->current > s->peak) s->peak = s->current;
}

static inline void vg__stat_sub(vg_stat *s, int64_t v)
{
    s->current -= v;
    s->freed = vg__total_add(s->freed, v);
}

/* Add to the all-pools entry and the pool's own. */
static inline void vg__stat_add2(vg_stat *s, int pool, int64_t v)
{
    vg__stat_add(&s[VG_STAT_ALL], v);
    vg__stat_add(&s[1 + pool], v);
}

static inline void vg__stat_sub2(vg_stat *s, int pool, int64_t v)
{
    vg__stat_sub(&s[VG_STAT_ALL], v);
    vg__stat_sub(&s[1 + pool], v);
}

#endif
