/* Size classes, the hot half: the class of a size, the per-stream class
 * maps, and putting a free block in its bin or taking it out, inline
 * because every allocation and free runs them, and best fit. bins.c has
 * the rest (rounding, class bounds, the largest block). */
#ifndef VG_BINS_H
#define VG_BINS_H

#include "heap_internal.h"
#include "bin_tree.h"

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
    uint64_t units = size >> VG_ALIGN_SHIFT;
    if (units < VG_SUBS) return (uint32_t)units;
    unsigned fl = vg__floor_log2(units);
    uint32_t step = (uint32_t)(units >> (fl - VG_SUB_BITS)) - VG_SUBS;
    uint32_t level = fl - VG_SUB_BITS + 1;
    return level * VG_SUBS + step;
}

/* The smallest size of a class. */
size_t vg__bin_lower_bound(uint32_t bin);

/* ------------------------------------------------------------------ */
/* Class maps                                                          */
/* ------------------------------------------------------------------ */

static inline bool vg__class_marked(const vg_class_map *m, uint32_t bin)
{
    return (m->sub_map[bin / VG_SUBS] >> (bin % VG_SUBS)) & 1u;
}

static inline void vg__class_mark(vg_class_map *m, uint32_t bin)
{
    m->sub_map[bin / VG_SUBS] |= 1u << (bin % VG_SUBS);
    m->level_map |= 1ull << (bin / VG_SUBS);
}

static inline void vg__class_unmark(vg_class_map *m, uint32_t bin)
{
    uint32_t level = bin / VG_SUBS;
    m->sub_map[level] &= ~(1u << (bin % VG_SUBS));
    if (!m->sub_map[level]) m->level_map &= ~(1ull << level);
}

/* First class marked strictly above `bin`, or VG_NBINS. */
static inline uint32_t vg__next_marked(const vg_class_map *m, uint32_t bin)
{
    uint32_t level = bin / VG_SUBS, step = bin % VG_SUBS;
    uint32_t above = step + 1 < VG_SUBS ? m->sub_map[level] & (~0u << (step + 1)) : 0;
    if (above) return level * VG_SUBS + (uint32_t)__builtin_ctz(above);
    uint64_t levels = level + 1 < 64 ? m->level_map & (~0ull << (level + 1)) : 0;
    if (!levels) return VG_NBINS;
    level = (uint32_t)__builtin_ctzll(levels);
    return level * VG_SUBS + (uint32_t)__builtin_ctz(m->sub_map[level]);
}

/* ------------------------------------------------------------------ */
/* Bins: `bins` is the array of one pool's classes                     */
/* ------------------------------------------------------------------ */

/* The smallest free block of at least `size` of stream `s` in a pool, the
 * lowest address among equals; NULL if none (bins.c says how). Every
 * allocation asks it. */
VG_HOT vg_block *vg__bins_best_fit(const vg_bin *bins, const vg_stream_state *s, int pool,
                                   size_t size)
{
    const vg_class_map *m = &s->classes[pool];
    uint32_t bin = vg__bin_of_size(size);
    if (vg__class_marked(m, bin)) {
        vg_block *hit = vg__tree_lower_bound(&bins[bin], s, size);
        if (hit && hit->owner == s) return hit;
    }
    uint32_t above = vg__next_marked(m, bin);
    if (above == VG_NBINS) return NULL;
    vg_block *hit = vg__tree_lower_bound(&bins[above], s, 0);
    vg_assert_internal(hit && hit->owner == s && hit->size >= size);
    return hit;
}

/* The largest free block of any stream, NULL when none. */
vg_block *vg__bins_largest(const vg_bin *bins);

/* A free block joins the bin of its size, under its segment's stream. */
static inline void vg__bins_insert(vg_bin *bins, vg_block *blk)
{
    vg_stream_state *owner = blk->seg->stream;
    uint32_t bin = vg__bin_of_size(blk->size);
    blk->owner = owner;
    blk->bin = bin;
    vg__tree_insert(&bins[bin], blk);
    vg__class_mark(&owner->classes[blk->seg->pool], bin);
}

/* The stream's class stays marked while another of its blocks is in the
 * bin: its blocks are contiguous in the tree, so a neighbour tells. */
static inline void vg__bins_remove(vg_bin *bins, vg_block *blk)
{
    vg_bin *bin = &bins[blk->bin];
    if (bin->count == 1) {
        /* The usual case: the class's only block. */
        bin->root = bin->first = NULL;
        bin->count = 0;
        vg__class_unmark(&blk->owner->classes[blk->seg->pool], blk->bin);
        return;
    }
    vg_block *next = vg__tree_next(blk);
    vg_block *prev = bin->first == blk ? NULL : vg__tree_prev(blk);
    bool more = (next && next->owner == blk->owner) || (prev && prev->owner == blk->owner);
    vg__tree_erase(bin, blk, next);
    if (!more) vg__class_unmark(&blk->owner->classes[blk->seg->pool], blk->bin);
}

#endif
