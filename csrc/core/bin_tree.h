/* The ordered set of free blocks inside one size class: see bin_tree.c. */
#ifndef VG_BIN_TREE_H
#define VG_BIN_TREE_H

#include "heap_internal.h"

/* `blk` (owner, size, addr set) joins a tree that is not empty. */
void vg__tree_insert_below(vg_bin *bin, vg_block *blk);
/* `blk` leaves the tree; `successor` is vg__tree_next(blk), which the
 * caller has at hand. */
void vg__tree_erase(vg_bin *bin, vg_block *blk, vg_block *successor);
/* In-order neighbours, NULL at the ends. */
vg_block *vg__tree_next(const vg_block *blk);
vg_block *vg__tree_prev(const vg_block *blk);

/* Is the key (owner, size, addr) below block b's? */
static inline bool vg__key_before(const vg_stream_state *owner, size_t size, uintptr_t addr,
                                  const vg_block *b)
{
    if (owner != b->owner) return (uintptr_t)owner < (uintptr_t)b->owner;
    if (size != b->size) return size < b->size;
    return addr < b->addr;
}

/* The least block at or above (owner, size, address 0), NULL if none: it
 * belongs to `owner` only if `owner` has a block of at least `size`. The
 * least block of the tree answers whenever the key is below it (no block
 * has address 0, so the key never equals one): the usual case. */
static inline vg_block *vg__tree_lower_bound(const vg_bin *bin, const vg_stream_state *owner,
                                             size_t size)
{
    vg_block *first = bin->first;
    if (!first || vg__key_before(owner, size, 0, first)) return first;
    vg_block *found = NULL;
    for (vg_block *node = bin->root; node;) {
        VG_DEBUG_TREE_STEP();
        if (vg__key_before(owner, size, 0, node)) {
            found = node;
            node = node->link.tree.left;
        } else {
            node = node->link.tree.right;
        }
    }
    return found;
}

/* `blk` (owner, size, addr set) joins the tree. */
static inline void vg__tree_insert(vg_bin *bin, vg_block *blk)
{
    if (bin->root) {
        vg__tree_insert_below(bin, blk);
        return;
    }
    /* The usual case: most classes hold one block or none. */
    blk->link.tree.left = blk->link.tree.right = blk->link.tree.parent = NULL;
    blk->red = false;
    bin->root = bin->first = blk;
    bin->count = 1;
}

#endif
