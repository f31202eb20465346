/* Size classes: rounding, the two-level class of a size, and the free-block
 * bins with their bitmaps.
 *
 * A size is first rounded to VG_ALIGN. Counted in VG_ALIGN units, sizes
 * below 2^VG_SUB_BITS each have a class of their own; above, each power of
 * two is cut into 2^VG_SUB_BITS equal steps, so a class is never more than
 * 1/32 wider than its lower bound. Two bitmaps (levels, then steps in a
 * level) make "the first non-empty class at or above c" a pair of bit scans.
 */
#include "heap_internal.h"
#include "bins.h"

/* ------------------------------------------------------------------ */
/* Rounding and classes                                                */
/* ------------------------------------------------------------------ */

size_t vg_round_size(size_t size)
{
    /* VG_MAX_REQUEST is far below SIZE_MAX, so rounding cannot overflow. */
    return vg__round(size);
}

size_t vg__bin_lower_bound(uint32_t bin)
{
    uint32_t level = bin / VG_SUBS, step = bin % VG_SUBS;
    if (level == 0) return (size_t)step * VG_ALIGN;
    unsigned fl = level + VG_SUB_BITS - 1;
    return (size_t)(VG_SUBS + step) << (fl - VG_SUB_BITS) << 9;
}

/* First non-empty bin strictly above `bin`, or VG_NBINS. */
static uint32_t next_non_empty(const vg_bins *b, uint32_t bin)
{
    uint32_t level = bin / VG_SUBS, step = bin % VG_SUBS;
    uint32_t above = step + 1 < VG_SUBS ? b->sub_map[level] & (~0u << (step + 1)) : 0;
    if (above) return level * VG_SUBS + (uint32_t)__builtin_ctz(above);
    uint64_t levels = level + 1 < 64 ? b->level_map & (~0ull << (level + 1)) : 0;
    if (!levels) return VG_NBINS;
    level = (uint32_t)__builtin_ctzll(levels);
    return level * VG_SUBS + (uint32_t)__builtin_ctz(b->sub_map[level]);
}

/* Smallest block of at least `size` in one list. With a scan limit, an
 * exact fit ends the search at once; without one the whole list is read and
 * ties go to the lowest address, as an ordered set (size, address) would. */
static vg_block *best_in_list(vg_block *blk, size_t size, unsigned scan_limit)
{
    vg_block *best = NULL;
    for (unsigned seen = 0; blk; blk = blk->link_next) {
        if (blk->size >= size &&
            (!best || blk->size < best->size ||
             (blk->size == best->size && blk->addr < best->addr))) {
            best = blk;
            if (scan_limit && blk->size == size) break;
        }
        if (scan_limit && ++seen >= scan_limit && best) break;
    }
    return best;
}

vg_block *vg__bins_best_fit(const vg_bins *b, size_t size, unsigned scan_limit)
{
    uint32_t bin = vg__bin_of_size(size);
    if (b->head[bin]) {
        vg_block *hit = best_in_list(b->head[bin], size, scan_limit);
        if (hit) return hit;
    }
    uint32_t above = next_non_empty(b, bin);
    if (above == VG_NBINS) return NULL;
    return best_in_list(b->head[above], size, scan_limit);
}

vg_block *vg__bins_largest(const vg_bins *b)
{
    if (!b->level_map) return NULL;
    uint32_t level = vg__floor_log2(b->level_map);
    uint32_t bin = level * VG_SUBS + vg__floor_log2(b->sub_map[level]);
    vg_block *best = b->head[bin];
    for (vg_block *blk = best; blk; blk = blk->link_next)
        if (blk->size > best->size) best = blk;
    return best;
}
