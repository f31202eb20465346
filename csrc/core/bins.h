/* Size classes, the hot half: the class of a size and the bin list
 * operations, inline because every allocation and free runs them.
 * bins.c has the rest (rounding, best fit, class bounds). */
#ifndef VG_BINS_H
#define VG_BINS_H

#include "heap_internal.h"

/* vg_round_size, inline for the allocation path. */
static inline size_t vg__round(size_t size)
{
    if (size == 0 || size > VG_MAX_REQUEST) return 0;
    return (size + VG_ALIGN - 1) & ~(VG_ALIGN - 1);
}

static inline unsigned vg__floor_log2(uint64_t v)
{
    return 63u - (unsigned)__builtin_clzll(v);
}

static inline uint32_t vg__bin_of_size(size_t size)
{
    uint64_t units = size / VG_ALIGN;
    if (units < VG_SUBS) return (uint32_t)units;
    unsigned fl = vg__floor_log2(units);
    uint32_t step = (uint32_t)(units >> (fl - VG_SUB_BITS)) - VG_SUBS;
    uint32_t level = fl - VG_SUB_BITS + 1;
    return level * VG_SUBS + step;
}

/* ------------------------------------------------------------------ */
/* Bin lists                                                           */
/* ------------------------------------------------------------------ */

static inline void bin_mark_non_empty(vg_bins *b, uint32_t bin)
{
    b->sub_map[bin / VG_SUBS] |= 1u << (bin % VG_SUBS);
    b->level_map |= 1ull << (bin / VG_SUBS);
}

static inline void bin_mark_empty(vg_bins *b, uint32_t bin)
{
    uint32_t level = bin / VG_SUBS;
    b->sub_map[level] &= ~(1u << (bin % VG_SUBS));
    if (!b->sub_map[level]) b->level_map &= ~(1ull << level);
}

/* Newest first: a size freed and asked for again in a loop is found at the
 * head of its list, which keeps the common training-step pattern O(1). */
static inline void vg__bins_insert(vg_bins *b, vg_block *blk)
{
    uint32_t bin = vg__bin_of_size(blk->size);
    blk->bin = bin;
    vg_block *head = b->head[bin];
    blk->link_prev = NULL;
    blk->link_next = head;
    if (head) head->link_prev = blk;
    else bin_mark_non_empty(b, bin);
    b->head[bin] = blk;
}

static inline void vg__bins_remove(vg_bins *b, vg_block *blk)
{
    uint32_t bin = blk->bin; /* set by vg__bins_insert */
    if (blk->link_prev) blk->link_prev->link_next = blk->link_next;
    else b->head[bin] = blk->link_next;
    if (blk->link_next) blk->link_next->link_prev = blk->link_prev;
    if (!b->head[bin]) bin_mark_empty(b, bin);
    blk->link_prev = blk->link_next = NULL;
}

#endif
