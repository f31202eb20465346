/* vg_heap_check: walk every segment, block, bin, list and counter, and name
 * the first invariant that does not hold. O(everything): for tests and
 * debugging, never for the hot path. */
#include "heap_internal.h"
#include "addr_map.h"
#include "bins.h"

#include <string.h>

typedef struct tally {
    int64_t reserved[VG_STAT_TYPES], segments[VG_STAT_TYPES];
    int64_t allocated[VG_STAT_TYPES], requested[VG_STAT_TYPES];
    int64_t live[VG_STAT_TYPES], active[VG_STAT_TYPES], active_bytes[VG_STAT_TYPES];
    size_t free_blocks, idle_segments, pending;
} tally;

static void count2(int64_t *v, int pool, int64_t n)
{
    v[VG_STAT_ALL] += n;
    v[1 + pool] += n;
}

static const char *check_block(vg_heap *h, const vg_segment *seg, const vg_block *blk, tally *t)
{
    if (blk->seg != seg) return "block does not point back to its segment";
    if (blk->size == 0 || blk->size % VG_ALIGN) return "block size is not a positive multiple of 512";
    if (blk->next && blk->next->addr != blk->addr + blk->size) return "blocks do not tile their segment";
    if (blk->next && blk->next->prev != blk) return "block neighbour links disagree";
    switch (blk->state) {
    case VG_BLOCK_FREE:
        if (blk->next && blk->next->state == VG_BLOCK_FREE) return "two free neighbours were not coalesced";
        if (blk->uses) return "free block still has stream uses";
        t->free_blocks++;
        break;
    case VG_BLOCK_LIVE:
        if (vg__map_get(&h->live, blk->addr) != blk) return "live block missing from the address map";
        if (blk->requested == 0 || blk->requested > blk->size) return "live block's requested size out of range";
        if (blk->bin != vg__bin_of_size(blk->size)) return "live block's size class is stale";
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
    default:
        return "block has an unknown state";
    }
    return NULL;
}

static const char *check_segments(vg_heap *h, tally *t)
{
    for (const vg_segment *seg = h->segments; seg; seg = seg->next) {
        if (seg->next && seg->next->prev != seg) return "segment list links disagree";
        if (!seg->head || seg->head->addr != seg->addr || seg->head->prev) return "segment's first block is wrong";
        if (seg->size % VG_SEGMENT_GRANULE) return "segment size is not a multiple of the granule";
        size_t covered = 0;
        for (const vg_block *blk = seg->head; blk; blk = blk->next) {
            const char *err = check_block(h, seg, blk, t);
            if (err) return err;
            covered += blk->size;
        }
        if (covered != seg->size) return "blocks do not cover their segment";
        bool whole_free = seg->head->state == VG_BLOCK_FREE && !seg->head->next;
        if (seg->idle != whole_free) return "segment idle flag disagrees with its blocks";
        t->idle_segments += seg->idle;
        count2(t->reserved, seg->pool, (int64_t)seg->size);
        count2(t->segments, seg->pool, 1);
    }
    return NULL;
}

static const char *check_bins(vg_heap *h, size_t *binned)
{
    for (size_t s = 0; s < h->nstreams; s++) {
        const vg_stream_bins *sb = h->streams[s];
        for (int pool = 0; pool < VG_POOL_COUNT; pool++) {
            const vg_bins *b = &sb->pool[pool];
            for (uint32_t bin = 0; bin < VG_NBINS; bin++) {
                uint32_t level = bin / VG_SUBS, bit = 1u << (bin % VG_SUBS);
                bool marked = (b->sub_map[level] & bit) != 0;
                if (marked != (b->head[bin] != NULL)) return "bin bitmap disagrees with its list";
                for (const vg_block *blk = b->head[bin]; blk; blk = blk->link_next) {
                    if (blk->state != VG_BLOCK_FREE) return "non-free block in a bin";
                    if (vg__bin_of_size(blk->size) != bin || blk->bin != bin) return "block in the wrong size class";
                    if (blk->seg->owner != sb || blk->seg->pool != pool) return "block in another stream's or pool's bins";
                    if (blk->link_next && blk->link_next->link_prev != blk) return "bin list links disagree";
                    (*binned)++;
                }
            }
            for (uint32_t level = 0; level < VG_LEVELS; level++) {
                if (((b->level_map >> level) & 1u) != (b->sub_map[level] != 0)) return "level bitmap disagrees";
            }
        }
    }
    return NULL;
}

static const char *check_lists(vg_heap *h, const tally *t)
{
    size_t idle = 0, pending = 0;
    for (const vg_segment *seg = h->idle_head; seg; seg = seg->idle_next) {
        if (!seg->idle) return "segment on the idle list is not idle";
        if (seg->idle_next && seg->idle_next->idle_prev != seg) return "idle list links disagree";
        idle++;
    }
    if (idle != t->idle_segments) return "idle list misses idle segments";
    for (const vg_block *blk = h->pending; blk; blk = blk->link_next) {
        if (blk->state != VG_BLOCK_PENDING) return "non-pending block on the pending list";
        pending++;
    }
    if (pending != t->pending) return "pending list misses pending blocks";
    return NULL;
}

static bool stat_matches(const vg_stat *s, const int64_t *expected)
{
    for (int i = 0; i < VG_STAT_TYPES; i++) {
        if (s[i].current != expected[i]) return false;
        if (s[i].peak < s[i].current) return false;
    }
    return true;
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
    if (!vg__totals_consistent(h)) return "allocated - freed totals are off";
    if (h->free_blocks != t->free_blocks) return "free block counter is off";
    if (h->live.count != (size_t)t->live[VG_STAT_ALL]) return "address map holds blocks that are not live";
    uint64_t per_bin = 0;
    for (uint32_t bin = 0; bin < VG_NBINS; bin++) per_bin += h->live_per_bin[bin];
    if (per_bin != (uint64_t)t->live[VG_STAT_ALL]) return "live histogram is off";
    return NULL;
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
    if (!err) err = check_lists(h, &t);
    if (!err) err = check_counters(h, &t);
    vg_lock_release(&h->lock);
    return err;
}
