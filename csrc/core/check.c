/* Invariants: vg_heap_check walks every segment, block, bin, stream record,
 * list and counter and names the first equation of heap_internal.h that
 * does not hold: O(everything), for tests and debugging, never the hot
 * path. vg__check_block and vg__check_totals are the parts one operation
 * touches, which debug builds (VG_DEBUG) assert as the heap runs. */
#include "check.h"
#include "addr_map.h"
#include "arena.h"
#include "bins.h"
#include "stats.h"
#include "streams.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if VG_DEBUG_CHECKS
_Thread_local uint64_t vg__debug_tree_steps;
#endif

_Noreturn void vg__assert_fail(const char *expr, const char *file, int line, const char *func)
{
    fprintf(stderr, "vramguard: internal assertion failed: %s (%s:%d, %s)\n", expr, file, line,
            func);
    abort();
}

typedef struct tally {
    int64_t reserved[VG_STAT_TYPES], segments[VG_STAT_TYPES];
    int64_t allocated[VG_STAT_TYPES], requested[VG_STAT_TYPES];
    int64_t live[VG_STAT_TYPES], active[VG_STAT_TYPES], active_bytes[VG_STAT_TYPES];
    int64_t split_free[VG_STAT_TYPES], split_free_bytes[VG_STAT_TYPES];
    size_t free_blocks, idle_segments, pending, stream_segments;
} tally;

static void count2(int64_t *v, int pool, int64_t n)
{
    v[VG_STAT_ALL] += n;
    v[1 + pool] += n;
}

/* ------------------------------------------------------------------ */
/* One segment                                                         */
/* ------------------------------------------------------------------ */

static const char *check_free_block(const vg_segment *seg, const vg_block *blk)
{
    if (blk->next && blk->next->state == VG_BLOCK_FREE) return "two free neighbours were not coalesced";
    if (blk->uses) return "free block still has stream uses";
    if (blk->owner != seg->stream) return "free block filed under another stream";
    if (blk->bin != vg__bin_of_size(blk->size)) return "free block in the wrong size class";
    if (!vg__class_marked(&seg->stream->classes[seg->pool], blk->bin))
        return "free block's class not marked for its stream";
    return NULL;
}

static const char *check_block_shape(const vg_segment *seg, const vg_block *blk)
{
    if (blk->seg != seg) return "block does not point back to its segment";
    if (blk->size == 0 || blk->size % VG_ALIGN) return "block size is not a positive multiple of VG_ALIGN";
    if (blk->next && blk->next->addr != blk->addr + blk->size) return "blocks do not tile their segment";
    if (blk->next && blk->next->prev != blk) return "block neighbour links disagree";
    switch (blk->state) {
    case VG_BLOCK_FREE:
        return check_free_block(seg, blk);
    case VG_BLOCK_LIVE:
        if (blk->requested == 0 || blk->requested > blk->size) return "live block's requested size out of range";
        if (blk->bin != vg__bin_of_size(blk->size)) return "live block's size class is stale";
        return NULL;
    case VG_BLOCK_PENDING:
        return NULL;
    default:
        return "block has an unknown state";
    }
}

/* A segment is idle exactly when one free block covers it. */
static const char *check_idle_flag(const vg_segment *seg)
{
    bool whole_free = seg->head->state == VG_BLOCK_FREE && !seg->head->next;
    return seg->idle != whole_free ? "segment idle flag disagrees with its blocks" : NULL;
}

/* The invariants that hold around one block: its own, its tiling with its
 * neighbours and its segment's ends, and its segment's idle flag. Checked
 * for every block an operation touches, they imply the segment-wide ones
 * (the blocks' bytes sum to the segment's size) by induction. */
const char *vg__check_block(const vg_heap *h, const vg_block *blk)
{
    const vg_segment *seg = blk->seg;
    const char *err = check_block_shape(seg, blk);
    if (err) return err;
    if (blk->prev ? blk->prev->next != blk : (seg->head != blk || blk->addr != seg->addr))
        return "block's left neighbour or segment start is wrong";
    if (blk->prev && blk->prev->state == VG_BLOCK_FREE && blk->state == VG_BLOCK_FREE)
        return "two free neighbours were not coalesced";
    if (!blk->next && blk->addr + blk->size != seg->addr + seg->size) return "last block does not end its segment";
    if (seg->range && blk->state != VG_BLOCK_FREE && !vg__arena_pages_mapped(h, seg, blk->addr, blk->size))
        return "a block in use has an unmapped page";
    return check_idle_flag(seg);
}

const char *vg__check_segment(const vg_heap *h, const vg_segment *seg)
{
    (void)h;
    if (!seg->head || seg->head->addr != seg->addr || seg->head->prev) return "segment's first block is wrong";
    if (seg->size % VG_SEGMENT_GRANULE) return "segment size is not a multiple of the granule";
    if (!seg->stream || !seg->stream->segments) return "segment's stream does not count it";
    size_t covered = 0;
    for (const vg_block *blk = seg->head; blk; blk = blk->next) {
        const char *err = check_block_shape(seg, blk);
        if (err) return err;
        covered += blk->size;
    }
    if (covered != seg->size) return "blocks do not cover their segment";
    return check_idle_flag(seg);
}

/* ------------------------------------------------------------------ */
/* Every segment and block                                             */
/* ------------------------------------------------------------------ */

static const char *tally_block(vg_heap *h, const vg_segment *seg, const vg_block *blk, tally *t)
{
    switch (blk->state) {
    case VG_BLOCK_FREE:
        t->free_blocks++;
        /* inactive_split: it shares its segment (a range's are not counted) */
        if (!seg->range && (blk->prev || blk->next)) {
            count2(t->split_free, seg->pool, 1);
            count2(t->split_free_bytes, seg->pool, (int64_t)blk->size);
        }
        break;
    case VG_BLOCK_LIVE:
        if (vg__map_get(&h->live, blk->addr) != blk) return "live block missing from the address map";
        count2(t->live, seg->pool, 1);
        count2(t->allocated, seg->pool, (int64_t)blk->size);
        count2(t->requested, seg->pool, (int64_t)blk->requested);
        count2(t->active, seg->pool, 1);
        count2(t->active_bytes, seg->pool, (int64_t)blk->size);
        break;
    case VG_BLOCK_PENDING:
        if (vg__map_get(&h->live, blk->addr)) return "pending block still in the address map";
        count2(t->active, seg->pool, 1);
        count2(t->active_bytes, seg->pool, (int64_t)blk->size);
        t->pending++;
        break;
    }
    return NULL;
}

/* A range's page map against its mapped bytes, and the pages of every
 * block in use mapped. */
static const char *check_range(const vg_heap *h, const vg_segment *seg)
{
    if (!h->arena) return "a range in a heap without the arena";
    if (vg__arena_count_mapped(h, seg) != seg->range->mapped) return "range's mapped bytes disagree with its pages";
    for (const vg_block *blk = seg->head; blk; blk = blk->next)
        if (blk->state != VG_BLOCK_FREE && !vg__arena_pages_mapped(h, seg, blk->addr, blk->size))
            return "a block in use has an unmapped page";
    return NULL;
}

static bool stream_registered(const vg_heap *h, const vg_stream_state *s)
{
    return vg__stream_find(&h->streams, s->key) == s;
}

static const char *check_segments(vg_heap *h, tally *t)
{
    for (const vg_segment *seg = h->segments; seg; seg = seg->next) {
        if (seg->next && seg->next->prev != seg) return "segment list links disagree";
        const char *err = vg__check_segment(h, seg);
        if (err) return err;
        if (!stream_registered(h, seg->stream))
            return "segment's stream is not in the stream table";
        for (const vg_block *blk = seg->head; blk; blk = blk->next) {
            err = tally_block(h, seg, blk, t);
            if (err) return err;
        }
        t->idle_segments += seg->idle;
        if (seg->range) {
            err = check_range(h, seg);
            if (err) return err;
        }
        count2(t->reserved, seg->pool, (int64_t)(seg->range ? seg->range->mapped : seg->size));
        count2(t->segments, seg->pool, 1);
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Bins: red-black trees ordered by (stream, size, address)            */
/* ------------------------------------------------------------------ */

/* The black height of the subtree at `node`, or -1 with *err set. */
static int check_subtree(const vg_block *node, const vg_block *parent, const char **err)
{
    if (!node) return 0;
    if (node->link.tree.parent != parent) return *err = "bin tree parent links disagree", -1;
    if (node->red && parent && parent->red) return *err = "red block with a red parent in a bin tree", -1;
    const vg_block *l = node->link.tree.left, *r = node->link.tree.right;
    if ((l && !vg__key_before(l->owner, l->size, l->addr, node)) ||
        (r && !vg__key_before(node->owner, node->size, node->addr, r)))
        return *err = "bin tree out of order", -1;
    int lh = check_subtree(l, node, err);
    if (lh < 0) return -1;
    int rh = check_subtree(r, node, err);
    if (rh < 0) return -1;
    if (lh != rh) return *err = "bin tree black heights differ", -1;
    return lh + !node->red;
}

static const char *check_bin(const vg_bin *bin, int pool, uint32_t class, size_t *binned)
{
    const char *err = NULL;
    if (bin->root && (bin->root->red || bin->root->link.tree.parent)) return "bin tree root is wrong";
    if (check_subtree(bin->root, NULL, &err) < 0) return err;
    const vg_block *least = bin->root;
    while (least && least->link.tree.left) least = least->link.tree.left;
    if (bin->first != least) return "bin's first block is not its least";
    size_t n = 0;
    for (const vg_block *blk = bin->first; blk; blk = vg__tree_next(blk), n++) {
        if (blk->state != VG_BLOCK_FREE) return "non-free block in a bin";
        if (blk->bin != class || vg__bin_of_size(blk->size) != class) return "block in the wrong size class";
        if (blk->seg->pool != pool) return "block in another pool's bins";
        if (blk->owner != blk->seg->stream) return "block filed under another stream";
        if (!vg__class_marked(&blk->owner->classes[pool], class)) return "bin holds a block of a stream whose map lacks it";
    }
    if (n != bin->count) return "bin count is off";
    *binned += n;
    return NULL;
}

static const char *check_bins(vg_heap *h, size_t *binned)
{
    for (int pool = 0; pool < VG_POOL_COUNT; pool++) {
        for (uint32_t class = 0; class < VG_NBINS; class++) {
            const char *err = check_bin(&h->bins[pool][class], pool, class, binned);
            if (err) return err;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Stream records                                                      */
/* ------------------------------------------------------------------ */

/* Every class marked for `s` holds one of its blocks, and the level map
 * agrees with the steps. */
static const char *check_class_map(const vg_heap *h, const vg_stream_state *s, int pool)
{
    const vg_class_map *m = &s->classes[pool];
    for (uint32_t level = 0; level < VG_LEVELS; level++) {
        if (((m->level_map >> level) & 1u) != (m->sub_map[level] != 0)) return "level bitmap disagrees";
        for (uint32_t step = 0; step < VG_SUBS; step++) {
            uint32_t class = level * VG_SUBS + step;
            if (!vg__class_marked(m, class)) continue;
            const vg_block *blk = vg__tree_lower_bound(&h->bins[pool][class], s, 0);
            if (!blk || blk->owner != s) return "class marked for a stream without a block there";
        }
    }
    if (m->level_map >> VG_LEVELS) return "level bitmap marks a level that does not exist";
    return NULL;
}

static const char *check_streams(vg_heap *h, size_t segments)
{
    const vg_stream_table *t = &h->streams;
    size_t records = 0, owned = 0;
    for (size_t i = 0; i < (size_t)1 << t->bits; i++) {
        for (const vg_stream_state *s = t->buckets[i]; s; s = s->hash_next) {
            records++;
            owned += s->segments;
            /* An allocation waiting for the device keeps its stream pinned. */
            if (!h->device_waiters && !s->segments) return "stream record kept without a segment";
            if (!h->device_waiters && s->pins) return "stream record still pinned between calls";
            if (!s->segments && !s->pins) return "stream record neither pinned nor owning a segment";
            for (int pool = 0; pool < VG_POOL_COUNT; pool++) {
                const char *err = check_class_map(h, s, pool);
                if (err) return err;
            }
        }
    }
    if (records != t->count) return "stream table count is off";
    if (owned != segments) return "stream records do not count the segments";
    if (t->last && !stream_registered(h, t->last)) return "last stream is not in the table";
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Lists and counters                                                  */
/* ------------------------------------------------------------------ */

static const char *check_lists(vg_heap *h, const tally *t)
{
    size_t idle = 0, pending = 0;
    for (const vg_segment *seg = h->idle_head; seg; seg = seg->idle_next) {
        if (!seg->idle) return "segment on the idle list is not idle";
        if (seg->idle_next && seg->idle_next->idle_prev != seg) return "idle list links disagree";
        idle++;
    }
    if (idle != t->idle_segments) return "idle list misses idle segments";
    const vg_block *last = NULL;
    for (const vg_block *blk = h->pending; blk; blk = blk->link.wait.next) {
        if (blk->state != VG_BLOCK_PENDING) return "non-pending block on the pending list";
        if (blk->link.wait.prev != last) return "pending list links disagree";
        last = blk;
        pending++;
    }
    if (last != h->pending_tail) return "pending list's tail is not its last block";
    if (pending != t->pending) return "pending list misses pending blocks";
    return NULL;
}

/* A counter's own equations: 0 <= current <= peak, and the all-pools
 * entry is the sum of the pools'. (Its totals: vg__totals_consistent.) */
static bool stat_consistent(const vg_stat *s)
{
    for (int i = 0; i < VG_STAT_TYPES; i++)
        if (s[i].current < 0 || s[i].peak < s[i].current) return false;
    return s[VG_STAT_ALL].current == s[VG_STAT_SMALL].current + s[VG_STAT_LARGE].current;
}

/* ... and its current values equal a recount. */
static bool stat_matches(const vg_stat *s, const int64_t *expected)
{
    for (int i = 0; i < VG_STAT_TYPES; i++)
        if (s[i].current != expected[i]) return false;
    return stat_consistent(s);
}

static const char *check_counters(vg_heap *h, const tally *t)
{
    const vg_stats *st = &h->stats;
    if (!stat_matches(st->reserved_bytes, t->reserved)) return "reserved_bytes counter is off";
    if (!stat_matches(st->segment, t->segments)) return "segment counter is off";
    if (!stat_matches(st->allocated_bytes, t->allocated)) return "allocated_bytes counter is off";
    if (!stat_matches(st->requested_bytes, t->requested)) return "requested_bytes counter is off";
    if (!stat_matches(st->allocation, t->live)) return "allocation counter is off";
    if (!stat_matches(st->active, t->active)) return "active counter is off";
    if (!stat_matches(st->active_bytes, t->active_bytes)) return "active_bytes counter is off";
    if (!stat_matches(st->inactive_split, t->split_free)) return "inactive_split counter is off";
    if (!stat_matches(st->inactive_split_bytes, t->split_free_bytes))
        return "inactive_split_bytes counter is off";
    if (!vg__totals_consistent(h)) return "allocated - freed totals are off";
    if (h->free_blocks != t->free_blocks) return "free block counter is off";
    if (h->live.count != (size_t)t->live[VG_STAT_ALL]) return "address map holds blocks that are not live";
    uint64_t per_bin = 0;
    for (uint32_t bin = 0; bin < VG_NBINS; bin++) per_bin += h->live_per_bin[bin];
    if (per_bin != (uint64_t)t->live[VG_STAT_ALL]) return "live histogram is off";
    return NULL;
}

const char *vg__check_totals(vg_heap *h)
{
    const vg_stats *st = &h->stats;
#define VG_STAT_ARRAY(name) st->name,
    const vg_stat *all[] = {VG_TOTALED_STAT_LIST(VG_STAT_ARRAY)};
#undef VG_STAT_ARRAY
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!stat_consistent(all[i])) return "a counter's current and peak disagree";
    if (!vg__totals_consistent(h)) return "allocated - freed totals are off";
    if (h->live.count != (size_t)st->allocation[VG_STAT_ALL].current) return "the address map and the allocation counter disagree";
    return NULL;
}

const char *vg__check_bin_counts(const vg_heap *h)
{
    size_t binned = 0;
    for (int pool = 0; pool < VG_POOL_COUNT; pool++)
        for (uint32_t class = 0; class < VG_NBINS; class++) binned += h->bins[pool][class].count;
    return binned == h->free_blocks ? NULL : "free_blocks is not the sum of the bins' counts";
}

const char *vg_heap_check(vg_heap *h)
{
    tally t;
    memset(&t, 0, sizeof t);
    size_t binned = 0;
    vg_lock_acquire(&h->lock);
    const char *err = check_segments(h, &t);
    if (!err) err = check_bins(h, &binned);
    if (!err && binned != t.free_blocks) err = "free blocks missing from the bins";
    if (!err) err = check_streams(h, (size_t)t.segments[VG_STAT_ALL]);
    if (!err) err = check_lists(h, &t);
    /* check_counters covers vg__check_totals, and the bins' recount
     * vg__check_bin_counts: the debug builds' per-call subsets. */
    if (!err) err = check_counters(h, &t);
    vg_lock_release(&h->lock);
    return err;
}
