/* vramguard: what reports read beside the counters: an interval peak per
 * heap (several max_memory_allocated counters at once, for regions), the
 * heap's state copied at a failure, and the last out-of-memory of the
 * device heaps (the installed allocator's). */
#ifndef VRAMGUARD_REPORT_H
#define VRAMGUARD_REPORT_H

#include "vramguard/heap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Interval peak (core/peaks.c)                                        */
/* ------------------------------------------------------------------ */

/* Read in one hold of the heap's lock. `peak`: the highest allocated
 * bytes (all pools) since the last take (or since the heap was created);
 * the take starts the next interval at `current`. `allocated_total`:
 * allocated_bytes' total (restarts from 0 at vg_heap_reset_accumulated).
 * Independent of vg_heap_reset_peaks. One reader per heap: a caller that
 * keeps several counters folds each take into all of them. */
typedef struct vg_interval {
    int64_t peak;
    int64_t current;
    int64_t allocated_total;
} vg_interval;
void vg_heap_take_interval(vg_heap *h, vg_interval *out);

/* ------------------------------------------------------------------ */
/* The heap's state for a report (core/heap_state.c)                   */
/* ------------------------------------------------------------------ */

/* Live blocks by power of two: class k holds sizes in [2^k, 2^(k+1)). */
#define VG_LIVE_CLASSES 64

typedef struct vg_heap_state {
    vg_stats stats;
    vg_fragmentation frag;
    uint64_t segments;
    uint64_t idle_segments;        /* wholly free: what empty_cache releases */
    uint64_t idle_segment_bytes;   /* an arena range's: its mapped bytes */
    uint64_t live_blocks[VG_LIVE_CLASSES];
    uint64_t live_bytes[VG_LIVE_CLASSES];
} vg_heap_state;
/* One hold of the lock, one walk of the segments; no allocation. */
void vg_heap_state_copy(vg_heap *h, vg_heap_state *out);

/* ------------------------------------------------------------------ */
/* The device heaps' last out-of-memory (device/last_oom.c)            */
/* ------------------------------------------------------------------ */

typedef struct vg_oom_record {
    uint64_t seq;          /* 1 for the first out-of-memory of the process; 0: none yet */
    vg_oom_info info;      /* as the failing allocation filled it */
    vg_heap_state state;   /* copied right after the failure */
} vg_oom_record;

/* A device heap's allocation failed with VG_ERR_NOMEM (`oom`): keep it,
 * with the heap's state, as the last one. Other heaps (replays, Heap
 * objects of Python) are not recorded: their failures are answers. */
void vg_devices_note_oom(vg_heap *h, const vg_oom_info *oom);
/* Copies the last one; returns its seq (0, and `out` untouched: none). */
uint64_t vg_devices_last_oom(vg_oom_record *out);
/* The seq alone, cheap. */
uint64_t vg_devices_last_oom_seq(void);

#ifdef __cplusplus
}
#endif
#endif
