/* Internal structures shared by the heap's files. Not installed.
 *
 * Each structure states its invariants next to it, as equations. check.c
 * (vg_heap_check) verifies every one of them over the whole heap; builds
 * with VG_DEBUG (the C tests and the sanitizer builds) also assert, with
 * vg_assert_internal (debug.h), those an operation touches as it runs.
 *
 * Only the structures are here, and vg__device_error, through which every
 * file that calls the provider reports. The functions each file offers
 * the others are declared in a header named after it (segments.h for
 * segments.c, ladder.h for ladder.c, ...; history.c's in recording.h), so
 * that a file's includes list what it builds on. */
#ifndef VG_HEAP_INTERNAL_H
#define VG_HEAP_INTERNAL_H

#include "vramguard/heap.h"
#include "vramguard/history.h"
#include "vramguard/replay.h"
#include "debug.h"
#include "lock.h"

#include <pthread.h>
#include <stdbool.h>

/* The hot path's helpers (an alloc+free pair of a cached block): inlined
 * whatever the compiler's size heuristics say, so that the pair makes only
 * the calls it must (a call costs a dozen instructions of its own). */
#define VG_HOT static inline __attribute__((always_inline))

typedef struct vg_block vg_block;
typedef struct vg_segment vg_segment;
typedef struct vg_stream_state vg_stream_state;
typedef struct vg_stream_use vg_stream_use;
typedef struct vg_range vg_range;

/* ------------------------------------------------------------------ */
/* Size classes (bins.c)                                               */
/* ------------------------------------------------------------------ */

/* Two levels: sizes (in VG_ALIGN units) below 2^VG_SUB_BITS map one to one
 * (linear classes); above, each power of two is split into 2^VG_SUB_BITS
 * linear sub-steps. The number of classes is public (heap.h, for histogram
 * buffers); the levels it makes must reach VG_MAX_REQUEST, the largest a
 * block can be (a segment holds one request at most that big, or several
 * smaller ones): level L holds sizes below 2^(L + VG_SUB_BITS) units. */
#define VG_SUB_BITS 5
#define VG_SUBS (1u << VG_SUB_BITS)
#define VG_NBINS VG_SIZE_CLASSES
#define VG_LEVELS (VG_NBINS / VG_SUBS)
_Static_assert(VG_LEVELS * VG_SUBS == VG_NBINS, "whole levels");
_Static_assert(VG_LEVELS + VG_SUB_BITS > VG_MAX_REQUEST_SHIFT - VG_ALIGN_SHIFT,
               "the classes reach VG_MAX_REQUEST");
_Static_assert(VG_LEVELS <= 64 && VG_SUBS <= 32, "a class map holds a level in a bit, a step in a bit");

/* The classes in which one stream has free blocks, for one pool.
 *   bit S of sub_map[L] == (class L*VG_SUBS+S holds a block of the stream)
 *   bit L of level_map  == (sub_map[L] != 0) */
typedef struct vg_class_map {
    uint64_t level_map;
    uint32_t sub_map[VG_LEVELS];
} vg_class_map;

/* One size class of one pool: the free blocks of every stream whose size
 * falls in the class, in a red-black tree ordered by (stream, size,
 * address), so that one stream's blocks are contiguous and the best fit
 * for a stream is the first of its blocks at or above a size: the order of
 * PyTorch's per-pool set.
 *   first == the least block in the tree (NULL when empty)
 *   count == the number of blocks in the tree */
typedef struct vg_bin {
    vg_block *root;
    vg_block *first;
    size_t count;
} vg_bin;

/* ------------------------------------------------------------------ */
/* Blocks, segments, streams                                           */
/* ------------------------------------------------------------------ */

/* A stream that used a block besides its own (record_stream); after the
 * block's free, the event recorded on that stream. A stream is known by
 * (device, handle): handle 0 is the default stream of every device. */
struct vg_stream_use {
    vg_stream_t stream;
    int device;
    vg_event_t event;
    bool has_event;
    /* No event (its record failed): finished only once a synchronize begun
     * after the free has returned VG_OK, that is once the heap's
     * syncs_done passes this (its syncs_begun at the free). */
    uint64_t syncs_before;
    vg_stream_use *next;
};

/* A block: a piece of a segment, free, live or pending.
 *   addr + size == (next ? next->addr : seg->addr + seg->size)
 *   prev ? prev->next == this : seg->head == this && addr == seg->addr
 *     (so the blocks tile their segment: their sizes sum to seg->size)
 *   state == FREE  =>  in the tree of bins[seg->pool][bin], owner == seg->stream,
 *                      bin == vg__bin_of_size(size), uses == NULL,
 *                      neither neighbour is free
 *   state == LIVE  =>  in the live-address map, 0 < requested <= size,
 *                      bin == vg__bin_of_size(size)
 *   state == PENDING => on the pending list, not in the map */
struct vg_block {
    uintptr_t addr;
    size_t size;
    size_t requested;           /* while live */
    vg_block *prev, *next;      /* address neighbours in the segment */
    union {
        struct { vg_block *left, *right, *parent; } tree; /* free */
        struct { vg_block *prev, *next; } wait;           /* pending */
        vg_block *spare_next;                             /* unused record */
    } link;
    vg_segment *seg;
    vg_stream_state *owner;     /* free: its stream, the first part of its tree key */
    vg_stream_use *uses;
    uint32_t bin;               /* size class: of its tree when free, for the
                                   histogram when live */
    uint8_t state;              /* enum vg_block_state */
    bool red;                   /* free: its colour in the tree */
    uint32_t stack;             /* live: its allocation's stack id (history.h), 0 = none */
    /* free: free_epoch when it became free, the latest of its parts' when
     * merged; arena.c unmaps only blocks free before a synchronize began. */
    uint64_t freed_at;
};

/* The pages of an arena range (arena.c): bit i of `pages` says whether
 * page i (from the range's start, h->page_size each) has memory behind it.
 *   mapped == (bits set in pages) * page_size
 *   every page a live or pending block touches is mapped (free blocks'
 *     pages may be either: mapped ones are the cache)
 *   pages past words * 64 are unmapped (the map grows as pages are used) */
struct vg_range {
    uint64_t *pages;
    size_t words;
    size_t mapped;                  /* bytes */
};

/* A segment: what the provider gave, tiled by blocks; with the arena, a
 * range of address space (range != NULL), of which only `range->mapped`
 * bytes hold memory.
 *   sum of its blocks' sizes == size, head->addr == addr
 *   idle == (head is free && head->next == NULL) == (on the heap's idle list) */
struct vg_segment {
    uintptr_t addr;
    size_t size;
    vg_range *range;                /* NULL for a segment */
    vg_stream_state *stream;        /* the stream whose blocks these are */
    int pool;
    vg_block *head;                 /* lowest-address block */
    vg_segment *prev, *next;        /* every segment of the heap */
    vg_segment *idle_prev, *idle_next; /* wholly free segments, oldest first */
    bool idle;
};

/* What the heap keeps per stream (streams.c), found by a hash of the key.
 * It lives while the stream owns a segment, or while an allocation works
 * for it, and is freed after, so distinct streams cost nothing once gone.
 *   segments == the number of segments with seg->stream == this
 *   segments > 0 || pins > 0    (between calls, no allocation waiting for
 *                                the device: segments > 0 and pins == 0) */
struct vg_stream_state {
    vg_stream_t key;                /* the handle: a heap serves one device */
    vg_stream_state *hash_next;
    size_t segments;
    /* Allocations working for the stream: more than one when one waits for
     * the device with the lock released and others run meanwhile. */
    uint32_t pins;
    vg_class_map classes[VG_POOL_COUNT];
};

/* The stream table: chained hash, the last stream asked for in front.
 *   count == the number of records reachable from buckets */
typedef struct vg_stream_table {
    vg_stream_state **buckets;
    unsigned bits;                  /* 2^bits buckets */
    size_t count;
    vg_stream_state *last;
} vg_stream_table;

/* ------------------------------------------------------------------ */
/* Live-address map (addr_map.c): open addressing, linear probing      */
/* ------------------------------------------------------------------ */

typedef struct vg_addr_map {
    uintptr_t *keys;   /* 0 = empty slot */
    vg_block **vals;
    size_t mask;       /* capacity - 1 */
    size_t count;
} vg_addr_map;

/* ------------------------------------------------------------------ */
/* Policy (policy.c, ../replay/policy_torch.c)                         */
/* ------------------------------------------------------------------ */

/* The decisions the heap asks a policy for. The heap carries them out and
 * counts them; the out-of-memory ladder that asks them is in ladder.c. */
struct vg_policy {
    const char *name;
    /* Split or keep: a block is split when at least this would remain. */
    size_t split_min[VG_POOL_COUNT];
    /* Which segment: the size to reserve for a request of `rounded` bytes. */
    size_t (*segment_size)(const vg_heap *h, int pool, size_t rounded);
    /* ... and when the budget or the device refuses it, a smaller one to
     * try (0 = none). */
    size_t (*fallback_segment_size)(const vg_heap *h, int pool, size_t rounded);
    /* Keep whole: the best cached fit `blk` would leave at least
     * keep_whole_from bytes (SIZE_MAX = never ask); should it stay whole, a
     * fresh segment being reserved for `rounded` instead? */
    size_t keep_whole_from;
    bool (*keep_whole)(const vg_heap *h, const vg_block *blk, size_t rounded);
    /* No fresh segment beside a block kept whole: release that block's
     * segment for a right-sized one (true), or split it after all? */
    bool (*swap_kept_whole)(const vg_heap *h, const vg_block *blk, size_t rounded);
    /* What to release first: bytes of the requesting stream's idle segments
     * (oldest first) before retrying; 0 skips the step. `budget_refused`:
     * the budget, not the device, refused the last segment asked for. */
    size_t (*stream_release)(const vg_heap *h, int pool, size_t rounded, bool budget_refused);
    /* After synchronizing, look for a cached fit again (deferred frees may
     * have finished) before releasing every idle segment. */
    bool refit_after_sync;
    /* Run the arena where the device has virtual memory (arena.c has its
     * own ladder); the fields above then serve the fallback to segments. */
    bool arena;
};

/* ------------------------------------------------------------------ */
/* Heap                                                                */
/* ------------------------------------------------------------------ */

typedef struct vg_history vg_history;

#define VG_BLOCK_SLAB 256

/* The vg_stat arrays of vg_stats that keep totals (allocated, freed). */
#define VG_COUNT_ONE(name) +1
#define VG_TOTALED_STATS (0 VG_TOTALED_STAT_LIST(VG_COUNT_ONE))

typedef struct vg_slab {
    struct vg_slab *next;
} vg_slab;

/* The heap.
 *   free_blocks == sum over bins of count == the number of free blocks
 *   stats.reserved_bytes[P].current == sum over its segments of pool P of
 *     their sizes, and of its ranges of pool P of their mapped bytes
 *   stats.segment[ALL].current == the number of its segments
 *   for every totaled vg_stat s: s.current <= s.peak, and as its readers
 *     see it (vg__stats_copy): s.allocated - s.freed == s.current -
 *     totals_base[s] (its current at the last reset_accumulated; 0 before
 *     any); the heap itself keeps only the pools' allocated (below) */
struct vg_heap {
    vg_lock lock;
    /* Held around the provider's synchronize, which runs with `lock`
     * released (no device wait under the heap's lock); never held while
     * `lock` is taken, nor taken while `lock` is held. */
    pthread_mutex_t device_wait;
    /* Synchronizes begun, and the last begun one that returned VG_OK. */
    uint64_t syncs_begun, syncs_done;
    /* Callers waiting for the device now, the lock released. */
    uint32_t device_waiters;
    vg_device *dev;
    const vg_policy *policy;
    size_t budget;         /* 0 = none */
    /* Bytes reserved by the other heaps this one shares its budget with
     * (a device's heap and its CUDA-graph pools: one budget per device),
     * NULL for none. Called under the lock, only where memory would grow
     * or the ceiling is asked, never for a cached block: it takes no heap
     * lock (vg_heap_share_budget). */
    size_t (*reserved_elsewhere)(void *ctx);
    void *reserved_elsewhere_ctx;
    double gc_threshold;   /* 0 = off */
    size_t device_total;
    /* The arena runs (the policy asks and the device has page_size > 0):
     * every segment is a range. Fixed at creation. */
    bool arena;
    unsigned page_shift;   /* log2 of the device's page size, with the arena */
    /* A block is split when at least this would remain: the policy's, or
     * the arena's (any remainder: it merges back whatever its size). */
    size_t split_min[VG_POOL_COUNT];
    /* Frees so far: an unmap after a synchronize is safe only for blocks
     * free before it began (arena.c compares their freed_at with it). */
    uint64_t free_epoch;

    vg_stream_table streams;
    vg_bin bins[VG_POOL_COUNT][VG_NBINS];

    vg_addr_map live;
    vg_block *spare_blocks;      /* free list of block records */
    vg_stream_use *spare_uses;
    vg_slab *slabs;              /* everything the free lists were cut from */

    vg_segment *segments;
    vg_segment *idle_head, *idle_tail;
    /* Freed blocks waiting for other streams, oldest first: their events
     * were recorded in this order. */
    vg_block *pending, *pending_tail;
    size_t free_blocks;

    vg_stats stats;
    /* Each totaled stat's current at the last reset_accumulated: freed is
     * allocated - (current - base) (vg__stats_copy, stats.c). */
    int64_t totals_base[VG_TOTALED_STATS][VG_STAT_TYPES];
    uint64_t live_per_bin[VG_NBINS];
    /* The highest allocated bytes since the last vg_heap_take_interval (peaks.c). */
    int64_t interval_peak;
    vg_history *history;         /* the ring, kept after a stop until taken */
    bool recording;              /* recording into it now */
    /* The recording's stack source, NULL when it keeps none: read without
     * the lock, before it is taken (VG_HISTORY_STACK). */
    _Atomic(vg_stack_source) stack_source;
    /* A CUDA graph may use its memory: no segment is released, idle or not
     * (vg_heap_set_keep_segments). */
    bool keep_segments;

    /* A provider call failed for another reason than memory since the
     * current allocation began: the ladder stops at once, since nothing it
     * could release would help, and the error is reported as itself. */
    bool device_failed;
    /* The provider answered an unmap VG_ERR_BUSY (a capture began after
     * the synchronize) in the batch underway: it stops there. */
    bool unmap_refused;
    vg_device_error device_error; /* the last one, for the report */
};

/* A provider call returned VG_ERR_DEVICE: count it (num_device_errors),
 * keep the provider's words, and set device_failed (heap.c). */
void vg__device_error(vg_heap *h);

#endif
