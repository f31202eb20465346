/* The ordered set of free blocks inside one size class (vg_bin): a
 * red-black tree keyed by (stream, size, address), intrusive (the links
 * live in the blocks, so inserting never allocates), with its least block
 * kept at hand.
 *
 * Costs, n being the blocks in the class: the least block is read in O(1);
 * inserting a block below the least one (the usual case in a loop that
 * frees and allocates one size: the freed block is the lowest) is O(1)
 * amortized, elsewhere O(log n); removing is O(1) amortized plus finding
 * the successor; a lower bound is O(log n). The rebalancing is the
 * textbook one (Cormen et al., chapter 13), with NULL leaves.
 */
#include "bin_tree.h"

/* ------------------------------------------------------------------ */
/* Order                                                               */
/* ------------------------------------------------------------------ */

static inline bool before(const vg_block *a, const vg_block *b)
{
    return vg__key_before(a->owner, a->size, a->addr, b);
}

vg_block *vg__tree_next(const vg_block *blk)
{
    if (blk->link.tree.right) {
        blk = blk->link.tree.right;
        while (blk->link.tree.left) {
            VG_DEBUG_TREE_STEP();
            blk = blk->link.tree.left;
        }
        return (vg_block *)blk;
    }
    const vg_block *parent = blk->link.tree.parent;
    while (parent && blk == parent->link.tree.right) {
        VG_DEBUG_TREE_STEP();
        blk = parent;
        parent = parent->link.tree.parent;
    }
    return (vg_block *)parent;
}

vg_block *vg__tree_prev(const vg_block *blk)
{
    if (blk->link.tree.left) {
        blk = blk->link.tree.left;
        while (blk->link.tree.right) {
            VG_DEBUG_TREE_STEP();
            blk = blk->link.tree.right;
        }
        return (vg_block *)blk;
    }
    const vg_block *parent = blk->link.tree.parent;
    while (parent && blk == parent->link.tree.left) {
        VG_DEBUG_TREE_STEP();
        blk = parent;
        parent = parent->link.tree.parent;
    }
    return (vg_block *)parent;
}

/* What holds of a bin after every change (debug builds assert it). */
static inline bool bin_sane(const vg_bin *bin)
{
    if (!bin->root) return !bin->first && !bin->count;
    return !bin->root->red && !bin->root->link.tree.parent && bin->count &&
           bin->first && !bin->first->link.tree.left;
}

/* ------------------------------------------------------------------ */
/* Rotations                                                           */
/* ------------------------------------------------------------------ */

/* Put `child` where `old` hangs from its parent (or at the root). */
static void replace_child(vg_bin *bin, vg_block *old, vg_block *child, vg_block *parent)
{
    if (!parent) bin->root = child;
    else if (parent->link.tree.left == old) parent->link.tree.left = child;
    else parent->link.tree.right = child;
}

static void rotate_left(vg_bin *bin, vg_block *x)
{
    vg_block *y = x->link.tree.right;
    x->link.tree.right = y->link.tree.left;
    if (y->link.tree.left) y->link.tree.left->link.tree.parent = x;
    y->link.tree.parent = x->link.tree.parent;
    replace_child(bin, x, y, x->link.tree.parent);
    y->link.tree.left = x;
    x->link.tree.parent = y;
}

static void rotate_right(vg_bin *bin, vg_block *x)
{
    vg_block *y = x->link.tree.left;
    x->link.tree.left = y->link.tree.right;
    if (y->link.tree.right) y->link.tree.right->link.tree.parent = x;
    y->link.tree.parent = x->link.tree.parent;
    replace_child(bin, x, y, x->link.tree.parent);
    y->link.tree.right = x;
    x->link.tree.parent = y;
}

static inline bool is_red(const vg_block *b)
{
    return b && b->red;
}

/* ------------------------------------------------------------------ */
/* Insert                                                              */
/* ------------------------------------------------------------------ */

static void insert_fixup(vg_bin *bin, vg_block *z)
{
    vg_block *p;
    while ((p = z->link.tree.parent) && p->red) {
        VG_DEBUG_TREE_STEP();
        vg_block *g = p->link.tree.parent; /* p is red, so not the root */
        if (p == g->link.tree.left) {
            vg_block *uncle = g->link.tree.right;
            if (is_red(uncle)) {
                p->red = uncle->red = false;
                g->red = true;
                z = g;
                continue;
            }
            if (z == p->link.tree.right) {
                rotate_left(bin, p);
                z = p;
                p = z->link.tree.parent;
            }
            p->red = false;
            g->red = true;
            rotate_right(bin, g);
        } else {
            vg_block *uncle = g->link.tree.left;
            if (is_red(uncle)) {
                p->red = uncle->red = false;
                g->red = true;
                z = g;
                continue;
            }
            if (z == p->link.tree.left) {
                rotate_right(bin, p);
                z = p;
                p = z->link.tree.parent;
            }
            p->red = false;
            g->red = true;
            rotate_left(bin, g);
        }
    }
    bin->root->red = false;
}

void vg__tree_insert_below(vg_bin *bin, vg_block *blk)
{
    blk->link.tree.left = blk->link.tree.right = NULL;
    vg_block *parent = NULL, **link = &bin->root;
    bool least = true;
    if (bin->first && before(blk, bin->first)) {
        /* Below the least block: its left child, which is free. */
        parent = bin->first;
        link = &parent->link.tree.left;
    } else {
        while (*link) {
            VG_DEBUG_TREE_STEP();
            parent = *link;
            if (before(blk, parent)) {
                link = &parent->link.tree.left;
            } else {
                link = &parent->link.tree.right;
                least = false;
            }
        }
    }
    blk->link.tree.parent = parent;
    blk->red = true;
    *link = blk;
    if (least) bin->first = blk;
    bin->count++;
    insert_fixup(bin, blk);
    vg_assert_internal(bin_sane(bin));
}

/* ------------------------------------------------------------------ */
/* Erase                                                               */
/* ------------------------------------------------------------------ */

/* A black node was removed above `x` (maybe NULL), child of `parent`:
 * that side is one black short. */
static void erase_fixup(vg_bin *bin, vg_block *x, vg_block *parent)
{
    while (x != bin->root && !is_red(x)) {
        VG_DEBUG_TREE_STEP();
        if (x == parent->link.tree.left) {
            vg_block *w = parent->link.tree.right; /* not NULL: it has a black more */
            if (w->red) {
                w->red = false;
                parent->red = true;
                rotate_left(bin, parent);
                w = parent->link.tree.right;
            }
            if (!is_red(w->link.tree.left) && !is_red(w->link.tree.right)) {
                w->red = true;
                x = parent;
                parent = x->link.tree.parent;
                continue;
            }
            if (!is_red(w->link.tree.right)) {
                w->link.tree.left->red = false;
                w->red = true;
                rotate_right(bin, w);
                w = parent->link.tree.right;
            }
            w->red = parent->red;
            parent->red = false;
            w->link.tree.right->red = false;
            rotate_left(bin, parent);
        } else {
            vg_block *w = parent->link.tree.left;
            if (w->red) {
                w->red = false;
                parent->red = true;
                rotate_right(bin, parent);
                w = parent->link.tree.left;
            }
            if (!is_red(w->link.tree.left) && !is_red(w->link.tree.right)) {
                w->red = true;
                x = parent;
                parent = x->link.tree.parent;
                continue;
            }
            if (!is_red(w->link.tree.left)) {
                w->link.tree.right->red = false;
                w->red = true;
                rotate_left(bin, w);
                w = parent->link.tree.left;
            }
            w->red = parent->red;
            parent->red = false;
            w->link.tree.left->red = false;
            rotate_right(bin, parent);
        }
        x = bin->root;
    }
    if (x) x->red = false;
}

void vg__tree_erase(vg_bin *bin, vg_block *z, vg_block *successor)
{
    if (bin->first == z) bin->first = successor;
    bin->count--;
    vg_block *x, *parent;
    bool removed_black;
    if (!z->link.tree.left || !z->link.tree.right) {
        x = z->link.tree.left ? z->link.tree.left : z->link.tree.right;
        parent = z->link.tree.parent;
        removed_black = !z->red;
        replace_child(bin, z, x, parent);
        if (x) x->link.tree.parent = parent;
    } else {
        /* Two children: the successor (leftmost of the right subtree)
         * takes z's place and colour; its own place loses a node. */
        vg_block *y = successor;
        removed_black = !y->red;
        x = y->link.tree.right;
        if (y->link.tree.parent == z) {
            parent = y;
        } else {
            parent = y->link.tree.parent;
            parent->link.tree.left = x;
            if (x) x->link.tree.parent = parent;
            y->link.tree.right = z->link.tree.right;
            y->link.tree.right->link.tree.parent = y;
        }
        y->link.tree.parent = z->link.tree.parent;
        replace_child(bin, z, y, z->link.tree.parent);
        y->link.tree.left = z->link.tree.left;
        y->link.tree.left->link.tree.parent = y;
        y->red = z->red;
    }
    if (removed_black) erase_fixup(bin, x, parent);
    z->link.tree.left = z->link.tree.right = z->link.tree.parent = NULL;
    vg_assert_internal(bin_sane(bin));
}
