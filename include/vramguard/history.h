/* vramguard: a heap's memory history, a bounded ring of events recorded
 * while a recording runs (history.c). What a recording is turned into, the
 * trace a replay reads, is in replay.h. */
#ifndef VRAMGUARD_HISTORY_H
#define VRAMGUARD_HISTORY_H

#include "vramguard/heap.h"

#ifdef __cplusplus
extern "C" {
#endif

enum vg_event_kind {
    VG_EV_ALLOC = 1,         /* addr, size = block, requested, stream */
    VG_EV_FREE = 2,          /* addr, size = block, requested, stream = owner */
    VG_EV_RESERVE = 3,       /* addr, size = segment */
    VG_EV_RELEASE = 4,       /* addr, size = segment */
    VG_EV_RECORD_STREAM = 5, /* addr, size = block, stream = the recorded one */
    VG_EV_EMPTY_CACHE = 6,   /* size = bytes released */
    VG_EV_OOM = 7,           /* size = rounded, requested */
    /* The arena: pages given memory or taken it back (a range reserved or
     * released is address space only, and not recorded). */
    VG_EV_MAP = 8,           /* addr, size = the run's bytes, stream = the range's */
    VG_EV_UNMAP = 9,         /* addr, size = the run's bytes, stream = the range's */
};

typedef struct vg_history_event {
    uint64_t time_ns;  /* CLOCK_MONOTONIC */
    uint64_t addr;
    uint64_t size;
    uint64_t requested;
    uint64_t stream;
    uint32_t kind;
    /* VG_EV_ALLOC of a recording that keeps stacks: what its stack source
     * returned for the allocating thread; 0 = none (and for other kinds). */
    uint32_t stack;
} vg_history_event;

/* Where a recording's allocation stacks come from: called on the allocating
 * thread, before the heap's lock is taken (it may look at the caller's
 * language runtime, never wait for it), and returns an interned stack id,
 * 0 for none. The Python extension's is in csrc/python/py_stacks.c. */
typedef uint32_t (*vg_stack_source)(void);

/* Start recording into a fresh ring of `capacity` events (older events are
 * overwritten when it is full, and counted as dropped). VG_ERR_BUSY while a
 * recording runs, or while a stopped one's events have not all been taken:
 * a heap has one ring and one reader. */
int vg_heap_history_start(vg_heap *h, size_t capacity);
/* As vg_heap_history_start, and every allocation event carries the stack
 * id `source` gives (NULL: none, as vg_heap_history_start). */
int vg_heap_history_start_stacks(vg_heap *h, size_t capacity, vg_stack_source source);
/* Stop recording; the events stay until taken. */
void vg_heap_history_stop(vg_heap *h);
int vg_heap_history_active(vg_heap *h);
/* Move up to `max` of the oldest events into `out`; returns how many.
 * `dropped` (may be NULL) gets the number overwritten since the start. */
size_t vg_heap_history_take(vg_heap *h, vg_history_event *out, size_t max, uint64_t *dropped);

#ifdef __cplusplus
}
#endif
#endif
