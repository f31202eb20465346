/* Reading the heap's numbers. Counters are kept current by heap.c and the
 * policies as they act, so reading them is a copy; fragmentation and the
 * histogram are computed on demand because they are read rarely and
 * keeping them current would tax every allocation. */
#include "stats.h"
#include "arena.h"
#include "bins.h"
#include "budget.h"

#include <stddef.h>
#include <string.h>

void vg_heap_stats(vg_heap *h, vg_stats *out)
{
    vg_lock_acquire(&h->lock);
    vg__stats_copy(h, out);
    vg_lock_release(&h->lock);
}

static void reset_peak(vg_stat *s)
{
    for (int i = 0; i < VG_STAT_TYPES; i++) s[i].peak = s[i].current;
}

/* The stats with totals, in the order of heap_internal.h's totals_base. */
#define VG_STAT_OFFSET(name) offsetof(vg_stats, name),
static const size_t stats_with_totals[VG_TOTALED_STATS] = {VG_TOTALED_STAT_LIST(VG_STAT_OFFSET)};

static vg_stat *stat_at(vg_stats *st, size_t k)
{
    return (vg_stat *)(void *)((char *)st + stats_with_totals[k]);
}

/* The totals the hot path leaves out (heap_internal.h): the all-pools
 * entry's allocated is the pools' sum, and every entry's freed is what
 * allocated - freed == current - base leaves. */
void vg__stats_copy(const vg_heap *h, vg_stats *out)
{
    *out = h->stats;
    for (size_t k = 0; k < VG_TOTALED_STATS; k++) {
        vg_stat *s = stat_at(out, k);
        s[VG_STAT_ALL].allocated = vg__stat_allocated_total(s);
        for (int i = 0; i < VG_STAT_TYPES; i++) {
            uint64_t net = (uint64_t)s[i].current - (uint64_t)h->totals_base[k][i];
            s[i].freed = (int64_t)((uint64_t)s[i].allocated - net);
        }
    }
}

void vg_heap_reset_peaks(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    for (size_t k = 0; k < VG_TOTALED_STATS; k++) reset_peak(stat_at(&h->stats, k));
    h->stats.peak_resets++;
    vg_lock_release(&h->lock);
}

void vg_heap_restore_peaks(vg_heap *h, const vg_stats *saved)
{
    vg_stats kept = *saved; /* stat_at() takes a mutable struct */
    vg_lock_acquire(&h->lock);
    for (size_t k = 0; k < VG_TOTALED_STATS; k++) {
        vg_stat *s = stat_at(&h->stats, k);
        const vg_stat *old = stat_at(&kept, k);
        for (int i = 0; i < VG_STAT_TYPES; i++)
            s[i].peak = old[i].peak > s[i].current ? old[i].peak : s[i].current;
    }
    vg_lock_release(&h->lock);
}

/* As PyTorch's Stat::reset_accumulated: allocated and freed restart from 0.
 * Where current stood is kept so that the check still holds them to it. */
void vg_heap_reset_accumulated(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    vg_stats *st = &h->stats;
    for (size_t k = 0; k < VG_TOTALED_STATS; k++) {
        vg_stat *s = stat_at(st, k);
        for (int i = 0; i < VG_STAT_TYPES; i++) {
            h->totals_base[k][i] = s[i].current;
            s[i].allocated = 0;
            s[i].freed = 0;
        }
    }
    /* The counters follow the last of the stats, up to the end. */
    memset(&st->num_device_alloc, 0, sizeof *st - offsetof(vg_stats, num_device_alloc));
    vg_lock_release(&h->lock);
}

bool vg__totals_consistent(vg_heap *h)
{
    for (size_t k = 0; k < VG_TOTALED_STATS; k++) {
        const vg_stat *s = stat_at(&h->stats, k);
        const int64_t *base = h->totals_base[k];
        if (s[VG_STAT_ALL].allocated != 0) return false;
        for (int i = 0; i < VG_STAT_TYPES; i++)
            if (s[i].freed != 0) return false;
        /* In unsigned arithmetic, as the totals wrap (heap_internal.h). */
        uint64_t pools = (uint64_t)base[VG_STAT_SMALL] + (uint64_t)base[VG_STAT_LARGE];
        if ((uint64_t)base[VG_STAT_ALL] != pools) return false;
    }
    return true;
}

void vg__fragmentation_locked(vg_heap *h, vg_fragmentation *out)
{
    memset(out, 0, sizeof *out);
    const vg_stats *st = &h->stats;
    out->reserved_bytes = (uint64_t)st->reserved_bytes[VG_STAT_ALL].current;
    out->allocated_bytes = (uint64_t)st->allocated_bytes[VG_STAT_ALL].current;
    /* Pending blocks are not free yet: count only what can be handed out. */
    out->free_bytes = out->reserved_bytes - (uint64_t)st->active_bytes[VG_STAT_ALL].current;
    out->free_blocks = h->free_blocks;
    out->pending_blocks = (uint64_t)(st->active[VG_STAT_ALL].current -
                                     st->allocation[VG_STAT_ALL].current);
    if (h->arena) {
        /* Free blocks span unmapped pages too: cached free memory is
         * their mapped stretches, each a piece, the largest what serves
         * a request without a map. */
        vg__arena_free_pieces(h, &out->free_blocks, &out->largest_free_block,
                              &out->largest_free_range);
    } else {
        for (int pool = 0; pool < VG_POOL_COUNT; pool++) {
            const vg_block *blk = vg__bins_largest(h->bins[pool]);
            if (blk && blk->size > out->largest_free_block) out->largest_free_block = blk->size;
        }
    }
    if (h->arena) {
        out->releasable_bytes = vg__arena_releasable(h);
    } else {
        for (const vg_segment *seg = h->segments; seg; seg = seg->next)
            if (seg->idle) out->releasable_bytes += seg->size;
    }
    size_t ceiling = vg__ceiling(h), reserved = vg__reserved(h);
    out->largest_allocatable = vg__largest_allocatable(out, ceiling > reserved ? ceiling - reserved : 0);
    if (out->free_bytes)
        out->external = 1.0 - (double)out->largest_free_block / (double)out->free_bytes;
    if (out->reserved_bytes)
        out->unused = 1.0 - (double)out->allocated_bytes / (double)out->reserved_bytes;
}

uint64_t vg__largest_allocatable(const vg_fragmentation *f, uint64_t new_memory)
{
    uint64_t fresh = (new_memory + f->releasable_bytes) & ~(uint64_t)(VG_SEGMENT_GRANULE - 1);
    return fresh > f->largest_free_block ? fresh : f->largest_free_block;
}

void vg_heap_fragmentation(vg_heap *h, vg_fragmentation *out)
{
    vg_lock_acquire(&h->lock);
    vg__fragmentation_locked(h, out);
    vg_lock_release(&h->lock);
}

uint64_t vg_heap_largest_allocatable(vg_heap *h)
{
    vg_fragmentation frag;
    vg_lock_acquire(&h->lock);
    vg__fragmentation_locked(h, &frag);
    size_t ceiling = vg__ceiling(h), reserved = vg__reserved(h);
    vg_lock_release(&h->lock);
    uint64_t room = ceiling > reserved ? ceiling - reserved : 0;
    size_t free_bytes = 0, total = 0;
    /* the device is asked with no lock held; one that cannot say leaves
     * the budget's room */
    if (h->dev->ops->mem_info(h->dev, &free_bytes, &total) == VG_OK && room > free_bytes) room = free_bytes;
    return vg__largest_allocatable(&frag, room);
}

_Static_assert(VG_NBINS == VG_SIZE_CLASSES, "heap.h's VG_SIZE_CLASSES is the number of bins");

/* Returns what it wrote, never what exists: a caller that sized its buffers
 * earlier must not read past them when a class appeared since. */
size_t vg_heap_histogram(vg_heap *h, uint64_t *lower_bounds, uint64_t *counts, size_t n)
{
    size_t written = 0;
    vg_lock_acquire(&h->lock);
    for (uint32_t bin = 0; bin < VG_NBINS && written < n; bin++) {
        if (!h->live_per_bin[bin]) continue;
        lower_bounds[written] = vg__bin_lower_bound(bin);
        counts[written] = h->live_per_bin[bin];
        written++;
    }
    vg_lock_release(&h->lock);
    return written;
}
