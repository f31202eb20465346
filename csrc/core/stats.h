/* The heap's counters: the adds and subtractions every operation makes,
 * inline because the hot path makes several; and stats.c's readers. */
#ifndef VG_STATS_H
#define VG_STATS_H

#include "heap_internal.h"

/* stats.c, with the heap locked. */
void vg__fragmentation_locked(vg_heap *h, vg_fragmentation *out);
/* The largest request the heap could serve with `new_memory` more bytes
 * from the device once its cache is released (out->releasable_bytes back):
 * the largest free block, or one new block of that memory, in whole
 * granules. */
uint64_t vg__largest_allocatable(const vg_fragmentation *f, uint64_t new_memory);
/* The heap's stats with the totals it does not keep filled in. */
void vg__stats_copy(const vg_heap *h, vg_stats *out);
/* The totals the heap does not keep are untouched (0), and each stat's
 * all-pools base is its pools' sum, so that the totals vg__stats_copy
 * derives satisfy allocated - freed == current - base in every entry. */
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

/* Of a totaled stat's two totals the heap keeps one, `allocated`, in the
 * pools' entries alone: the all-pools entry's is their sum, and `freed`
 * follows from the heap's invariant (struct vg_heap, heap_internal.h):
 * allocated - (current - base).
 * vg__stats_copy (stats.c) fills them in for readers. So an add costs
 * current, peak and one total per entry kept, a subtraction current
 * alone, and every number read is the same as were they all kept. */
static inline void vg__stat_raise(vg_stat *s, int64_t v)
{
    s->current += v;
    if (s->current > s->peak) s->peak = s->current;
}

/* Add to the all-pools entry and the pool's own. */
static inline void vg__stat_add2(vg_stat *s, int pool, int64_t v)
{
    vg__stat_raise(&s[VG_STAT_ALL], v);
    vg__stat_raise(&s[1 + pool], v);
    s[1 + pool].allocated = vg__total_add(s[1 + pool].allocated, v);
}

static inline void vg__stat_sub2(vg_stat *s, int pool, int64_t v)
{
    s[VG_STAT_ALL].current -= v;
    s[1 + pool].current -= v;
}

/* The all-pools total added, as vg__stats_copy gives it. */
static inline int64_t vg__stat_allocated_total(const vg_stat *s)
{
    return vg__total_add(s[VG_STAT_SMALL].allocated, s[VG_STAT_LARGE].allocated);
}

#endif
