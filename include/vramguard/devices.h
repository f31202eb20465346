/* vramguard: the per-device heap registry (device/heaps.c): one heap per
 * CUDA device, shared by the torch entry points and Python. */
#ifndef VRAMGUARD_DEVICES_H
#define VRAMGUARD_DEVICES_H

#include "vramguard/heap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The heap of `device`, created on first use; NULL (see vg_devices_error)
 * when the device cannot be used. */
vg_heap *vg_devices_heap(int device);
/* The heap of `device` if it exists; never creates one. */
vg_heap *vg_devices_existing(int device);
/* Why the last heap could not be created. */
const char *vg_devices_error(void);

/* Budget in bytes, or as a fraction of each device's total (which wins when
 * positive); 0 for none. Applies to existing heaps and to those to come.
 * VG_ERR_ARG unless both fractions are vg_valid_fraction (NaN is not).
 * VG_ERR_DEVICE, with vg_devices_error() saying "memory unknown", for a
 * fraction when a device's total is unknown (its mem_info failed): then
 * nothing is changed, and a heap created under such a setting is refused
 * the same way. */
int vg_devices_configure(size_t budget, double budget_fraction, double gc_threshold);
int vg_devices_set_budget(int device, size_t budget, double budget_fraction);
/* Arena or segments, for the device heaps created from now on (a heap
 * keeps what it was created with): 1 the arena (one virtual range per
 * device, pages mapped on demand) where the device supports virtual
 * memory, segments where it does not; 0 segments; -1 the default,
 * VG_DEVICES_ARENA_DEFAULT. VG_ERR_ARG for anything else. */
#define VG_DEVICES_ARENA_DEFAULT 1
int vg_devices_use_arena(int mode);
/* The mode heaps are created with now (0 or 1). */
int vg_devices_arena_mode(void);
/* What the heap of `device` runs on, in words, for the summary:
 * "arena (virtual memory, 2 MiB pages)", "segments (virtual memory not
 * supported: <why>)" or "segments (the arena is turned off)"; NULL when the
 * device has no heap. Set once, as the heap is created. */
const char *vg_devices_backing(int device);

/* Tests: every device is simulated with this capacity. Only before any
 * device heap exists (VG_ERR_ARG after). */
int vg_devices_simulate(size_t capacity);
int vg_devices_simulated(void);

/* The entry points' work. Size 0 gives NULL and VG_OK, as PyTorch's own
 * allocator does. A failure of the heap fills `oom` and returns its status:
 * VG_ERR_NOMEM (an out-of-memory) or VG_ERR_DEVICE (a device error, said
 * in oom->device_error). VG_ERR_DEVICE with oom->status VG_OK means the
 * device has no heap (vg_devices_error says why). */
int vg_devices_alloc(size_t size, int device, vg_stream_t stream, void **out, vg_oom_info *oom);
/* Never fails: a pointer no heap knows is reported once, and counted in
 * num_invalid_frees of `device`'s heap when that heap exists (else
 * nowhere). */
void vg_devices_free(void *ptr, int device);
/* The block at `ptr`, on whichever device heap holds it, is also used by
 * `stream` of device `stream_device` (-1: of the block's own device).
 * VG_ERR_INVALID when no heap holds it. */
int vg_devices_record_stream(void *ptr, int stream_device, vg_stream_t stream);

/* ------------------------------------------------------------------ */
/* What PyTorch's other allocator hooks ask (csrc/torch/)              */
/* ------------------------------------------------------------------ */

/* Release the idle cache of every device heap, and of every private pool
 * that is released; returns the bytes released. */
size_t vg_devices_empty_cache_all(void);
/* The segment that holds `ptr`, in whichever heap (device or pool). */
int vg_devices_segment_of(const void *ptr, uintptr_t *base, size_t *size);
/* The device count PyTorch saw when it initialised CUDA (-1 before). */
void vg_devices_note_device_count(int count);
int vg_devices_device_count(void);
/* The device of a stream handle, for record_stream: the runtime's answer,
 * or -1 (the block's own device) on simulated devices. */
int vg_devices_stream_device(vg_stream_t stream);

/* ------------------------------------------------------------------ */
/* Private pools (device/pools.c)                                      */
/* ------------------------------------------------------------------ */

/* A pool is PyTorch's MempoolId_t (a pair of u64; (0, 0) is the default
 * pool and never private). Each private pool has a heap of its own on its
 * device, whose segments are kept until the pool is released: a CUDA
 * graph replays into the blocks it was captured with, freed or not.
 *
 * begin: allocations on `device` for which filter(ctx, stream) answers
 * non-zero go to pool `id` until the matching end; the first begin of a
 * pool creates it, each begin counts a use. The filter is called on the
 * allocating thread inside vg_devices_alloc, never with a heap lock held;
 * drop(ctx) is called once the registry no longer needs it (at end, or
 * when begin fails). Several begins may be active on a device; the
 * earliest whose filter accepts the stream wins, as in PyTorch.
 * VG_ERR_ARG for the default pool, a device out of range, or a pool with
 * a begin already active; VG_ERR_DEVICE when no heap can be made
 * (vg_devices_error says why). */
typedef int (*vg_pool_filter)(void *ctx, vg_stream_t stream);
int vg_devices_begin_pool(int device, uint64_t id0, uint64_t id1, vg_pool_filter filter,
                          void *ctx, void (*drop)(void *ctx));
/* VG_ERR_INVALID when no begin of that pool is active on `device`. */
int vg_devices_end_pool(int device, uint64_t id0, uint64_t id1);
/* One use fewer; at none the pool is released: its idle segments go back
 * to the device now, the others as their blocks are freed, and the heap
 * itself once nothing in it is live. VG_ERR_INVALID for an unknown pool. */
int vg_devices_release_pool(int device, uint64_t id0, uint64_t id1);

typedef struct vg_pool_info {
    int device;
    uint64_t id0, id1;
    int use_count;  /* begins not yet released */
    int begun;      /* begins active now (not yet ended) */
    int released;   /* use_count reached 0; waiting for its blocks */
    vg_stats stats;
} vg_pool_info;
/* Fills up to `n` records, oldest pool first; returns how many exist. */
size_t vg_devices_pools(vg_pool_info *out, size_t n);

/* The segments and blocks of each private pool of `device`, oldest pool
 * first: on_pool(arg, id0, id1) before each pool's, then vg_heap_visit on
 * its heap. Runs under the pools' lock and each heap's lock in turn, so
 * the visitors copy into host memory and nothing else (no Python, no
 * device call). Stops at a visitor's non-zero return, and returns it. */
typedef int (*vg_pool_visitor)(void *arg, uint64_t id0, uint64_t id1);
int vg_devices_visit_pools(int device, vg_pool_visitor on_pool, vg_segment_visitor on_segment,
                           vg_block_visitor on_block, void *arg);

/* A device's figures as PyTorch reports them: its heap's and its private
 * pools' together (PyTorch's native allocator counts a private pool's
 * segments and blocks in the device's statistics). The totaled stats'
 * current, allocated and freed, and every counter, are the sums, gone pools
 * included (their allocated, freed and counters stay, current 0, until
 * reset_accumulated, so no total goes down when a pool goes); a peak is
 * the highest sum seen (at each call on a pool and each call of this), or
 * a peak of the device heap plus what the pools held when it was reached,
 * so a peak the heap reached and left between two calls on pools, while
 * they held memory, is missed by what they held. VG_ERR_INVALID when the
 * device has no heap. */
typedef struct vg_device_totals {
    vg_stats stats;
    size_t pools;            /* private pools on the device now */
    size_t pools_reserved;   /* what they reserve: in stats.reserved_bytes too */
    size_t pools_allocated;
} vg_device_totals;
int vg_devices_totals(int device, vg_device_totals *out);

/* PyTorch's reserved_bytes_by_private_pools: per pool id, its reserved
 * bytes. A pool that is gone keeps its entry with current 0, its peak,
 * allocated and freed kept until reset; the entry itself stays, as
 * PyTorch's does.
 * Fills up to `n`, live pools oldest first, then gone ones; returns how
 * many there are. */
typedef struct vg_pool_reservation {
    uint64_t id0, id1;
    vg_stat reserved[VG_STAT_TYPES];
} vg_pool_reservation;
size_t vg_devices_pool_reservations(int device, vg_pool_reservation *out, size_t n);

/* torch.cuda.reset_peak_memory_stats / reset_accumulated_memory_stats for
 * a device: its heap, its pools, and the device's figures above. */
void vg_devices_reset_peaks(int device);
void vg_devices_reset_accumulated(int device);
/* The device's peaks (its heap's and the device's figures, pools included),
 * to be restored later: vg_devices_restore_peaks lowers each peak back to
 * the saved one, or to its current value where that is higher. The pools'
 * own peaks are left as they are. VG_ERR_INVALID when the device has no
 * heap. */
typedef struct vg_device_peaks {
    vg_stats heap;   /* the device heap's vg_heap_stats */
    vg_stats device; /* vg_devices_totals' stats: the peaks of the sum */
} vg_device_peaks;
int vg_devices_save_peaks(int device, vg_device_peaks *out);
int vg_devices_restore_peaks(int device, const vg_device_peaks *saved);

#ifdef __cplusplus
}
#endif
#endif
