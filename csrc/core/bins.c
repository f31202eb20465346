/* Size classes: rounding, the two-level class of a size, and best fit.
 *
 * A size is first rounded to VG_ALIGN. Counted in VG_ALIGN units, sizes
 * below 2^VG_SUB_BITS each have a class of their own; above, each power of
 * two is cut into 2^VG_SUB_BITS equal steps, so a class is never more than
 * 1/32 wider than its lower bound.
 *
 * Each pool has one bin per class, holding the free blocks of every stream
 * in a tree ordered by (stream, size, address) (bin_tree.c); each stream
 * has, per pool, a two-level bitmap of the classes where it has blocks
 * (vg_class_map). Best fit for a stream is then: its own class, if marked,
 * for its first block of at least the size; else the first class marked
 * above (two bit scans), whose first block of the stream fits whatever its
 * size. The answer is the smallest block that fits, the lowest address
 * among equals, as PyTorch's ordered set gives; its cost does not grow with
 * the number of free blocks but as the log of those in the one class read,
 * and is O(1) when the stream's first block there answers.
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
    return ((size_t)(VG_SUBS + step) << (fl - VG_SUB_BITS)) * VG_ALIGN;
}

/* ------------------------------------------------------------------ */
/* The largest block                                                   */
/* ------------------------------------------------------------------ */

vg_block *vg__bins_largest(const vg_bin *bins)
{
    uint32_t bin = VG_NBINS;
    while (bin > 0 && !bins[bin - 1].root) bin--;
    if (!bin) return NULL;
    /* The largest class holds the largest block; its streams' blocks are
     * interleaved by size, so read them all (reports only, never the hot
     * path). */
    vg_block *best = bins[bin - 1].first;
    for (vg_block *blk = best; blk; blk = vg__tree_next(blk))
        if (blk->size > best->size) best = blk;
    return best;
}
