/* An emulation of PyTorch's CUDA caching allocator with expandable segments
 * (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, every other setting
 * at its default), for replays: what it would map, unmap and reserve for a
 * trace. Each rule names the function of c10/cuda/CUDACachingAllocator.cpp
 * it follows (PyTorch 2.x, DeviceCachingAllocator and ExpandableSegment).
 *
 * The model: per (stream, pool) one or more segments, each a virtual range
 * of 9/8 of the device's memory cut into pages (20 MiB in the large pool,
 * 2 MiB in the small one). Blocks tile a segment in address order; each is
 * allocated, free and mapped (in its pool's `blocks` set, ordered by
 * (stream, size, address)), or free and unmapped (in its pool's `unmapped`
 * set, ordered by (stream, address)). Unmapped blocks start and end on page
 * boundaries (only whole pages are ever mapped or unmapped), so the blocks
 * alone say which pages are mapped: no per-page state, and a map or unmap
 * of any size costs the same. Reserved bytes = mapped bytes.
 *
 * Not emulated: CUDA events and record_stream (no op of a trace carries
 * them), graph pools, the memory fraction and garbage collection, and the
 * max_split_size / roundup_power2_divisions / large_segment_size settings
 * (their defaults are what get_free_block and round_size see). */
#include "vramguard/expandable.h"

#include "debug.h"
#include "replay_loop.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* kMinBlockSize and kSmallSize of CUDACachingAllocator.cpp are vramguard's
 * own rounding and small-pool limit (common.h); pages are whole granules. */
#define MIN_BLOCK ((uint64_t)VG_ALIGN)
#define SMALL_SIZE ((uint64_t)VG_SMALL_REQUEST)
#define PAGE_GRANULE ((uint64_t)VG_SEGMENT_GRANULE)
/* The largest device_total accepted: 9/8 of it and a page more stay far
 * below 2^64, as does any sum of mapped bytes. */
#define MAX_DEVICE_TOTAL ((uint64_t)1 << 56)
#define CHUNK_BLOCKS 4096

typedef struct seg seg;
typedef struct xblock xblock;

/* One ExpandableSegment: a virtual range of `va` bytes in pages of `page`.
 * `seq` orders the segments of one (stream, pool) by address, as later
 * cuMemAddressReserve ranges are taken to lie above earlier ones. */
struct seg {
    uint64_t seq, page, va;
    int which; /* its pool: 0 small, 1 large */
    seg *prev_live, *next_live;
};

/* A Block: [off, off + size) of its segment.
 *   allocated           => in no set
 *   !allocated, mapped  => in its pool's blocks set
 *   !allocated, !mapped => in its pool's unmapped set, off and size whole pages
 *   prev->off + prev->size == off, and no two neighbours both free with the
 *   same mapped state (try_merge_blocks merges them). */
struct xblock {
    xblock *prev, *next;   /* neighbours in the segment, NULL at its ends */
    xblock *left, *right;  /* links of the treap that holds it */
    xblock *wprev, *wnext; /* free mapped blocks holding a whole page: their pool's list */
    seg *segment;
    uint64_t stream, off, size, requested;
    /* Unmapped blocks: what find_expandable_block would find from here (see
     * refresh_run); max_space the most in its treap subtree. */
    uint64_t space, max_space;
    uint32_t prio;
    bool allocated, mapped, in_whole;
};

/* A BlockPool: its free mapped blocks and its unmapped ranges; and, in a
 * list, the free mapped blocks that hold at least one whole page (nwhole
 * of them): the only ones a release changes, so that a release costs what
 * it unmaps, not what the pool holds. */
typedef struct pool {
    xblock *blocks, *unmapped, *whole;
    size_t nwhole;
    uint64_t page;
} pool;

typedef struct chunk {
    struct chunk *next;
    xblock blocks[CHUNK_BLOCKS];
} chunk;

typedef struct emu {
    pool pools[2]; /* [0] small, [1] large */
    uint64_t capacity, va_bytes[2];
    uint64_t mapped, requested, allocated;
    uint64_t peak_mapped, peak_requested, peak_allocated;
    uint64_t next_seq, live_segments;
    uint32_t rng;
    bool nomem;
    chunk *chunks;
    size_t chunk_used;
    xblock *free_blocks;
    seg *segments;
    xblock **scratch; /* release_blocks' list */
    size_t scratch_cap;
    vg_expandable_result *out;
} emu;

/* ------------------------------------------------------------------ */
/* Host memory                                                         */
/* ------------------------------------------------------------------ */

static xblock *new_block(emu *e)
{
    xblock *b = e->free_blocks;
    if (b) {
        e->free_blocks = b->next;
    } else {
        if (!e->chunks || e->chunk_used == CHUNK_BLOCKS) {
            chunk *c = malloc(sizeof *c);
            if (!c) {
                e->nomem = true;
                return NULL;
            }
            c->next = e->chunks;
            e->chunks = c;
            e->chunk_used = 0;
        }
        b = &e->chunks->blocks[e->chunk_used++];
    }
    memset(b, 0, sizeof *b);
    e->rng ^= e->rng << 13; /* xorshift32: the treap's priorities */
    e->rng ^= e->rng >> 17;
    e->rng ^= e->rng << 5;
    b->prio = e->rng;
    return b;
}

static void drop_block(emu *e, xblock *b)
{
    b->next = e->free_blocks;
    e->free_blocks = b;
}

/* A new block beside b, in its stream and segment: [off, off + size),
 * mapped or not, in no set yet; NULL when the host runs out. */
static xblock *new_piece(emu *e, const xblock *b, uint64_t off, uint64_t size, bool mapped)
{
    xblock *x = new_block(e);
    if (!x) return NULL;
    x->stream = b->stream;
    x->segment = b->segment;
    x->off = off;
    x->size = size;
    x->mapped = mapped;
    return x;
}

#if VG_DEBUG_CHECKS
static size_t set_size(const xblock *t)
{
    return t ? 1 + set_size(t->left) + set_size(t->right) : 0;
}

/* Every record taken from the chunks is free for reuse, in one of the
 * pools' sets, or live (allocated): none is lost, on any path, the host's
 * refusals midway included. */
static bool records_accounted(const emu *e, void *const *live, size_t nids)
{
    size_t taken = 0, held = 0;
    for (const chunk *c = e->chunks; c; c = c->next)
        taken += c == e->chunks ? e->chunk_used : CHUNK_BLOCKS;
    for (const xblock *b = e->free_blocks; b; b = b->next) held++;
    for (int i = 0; i < 2; i++)
        held += set_size(e->pools[i].blocks) + set_size(e->pools[i].unmapped);
    for (size_t i = 0; i < nids; i++) held += live[i] != NULL;
    return taken == held;
}
#endif

/* ------------------------------------------------------------------ */
/* The ordered sets: treaps keyed as PyTorch's std::set comparators     */
/* ------------------------------------------------------------------ */

/* BlockComparatorSize (by_size) or BlockComparatorAddress: is a below b? */
static bool key_below(uint64_t stream, uint64_t size, uint64_t seq, uint64_t off, const xblock *b,
                      bool by_size)
{
    if (stream != b->stream) return stream < b->stream;
    if (by_size && size != b->size) return size < b->size;
    if (seq != b->segment->seq) return seq < b->segment->seq;
    return off < b->off;
}

static bool below(const xblock *a, const xblock *b, bool by_size)
{
    return key_below(a->stream, a->size, a->segment->seq, a->off, b, by_size);
}

static xblock *recompute(xblock *t)
{
    uint64_t m = t->space;
    if (t->left && t->left->max_space > m) m = t->left->max_space;
    if (t->right && t->right->max_space > m) m = t->right->max_space;
    t->max_space = m;
    return t;
}

static xblock *merge_trees(xblock *a, xblock *b)
{
    if (!a) return b;
    if (!b) return a;
    if (a->prio > b->prio) {
        a->right = merge_trees(a->right, b);
        return recompute(a);
    }
    b->left = merge_trees(a, b->left);
    return recompute(b);
}

/* Splits t into the nodes below `k` (*lo) and the rest (*hi). */
static void split_tree(xblock *t, const xblock *k, bool by_size, xblock **lo, xblock **hi)
{
    if (!t) {
        *lo = *hi = NULL;
    } else if (below(t, k, by_size)) {
        split_tree(t->right, k, by_size, &t->right, hi);
        *lo = recompute(t);
    } else {
        split_tree(t->left, k, by_size, lo, &t->left);
        *hi = recompute(t);
    }
}

static void set_insert(xblock **root, xblock *b, bool by_size)
{
    xblock *lo, *hi;
    b->left = b->right = NULL;
    b->max_space = b->space;
    split_tree(*root, b, by_size, &lo, &hi);
    *root = merge_trees(merge_trees(lo, b), hi);
}

/* The subtree t without b; the maxima on the way are recomputed. */
static xblock *erase_from(xblock *t, xblock *b, bool by_size)
{
    if (t == b) return merge_trees(b->left, b->right);
    if (below(b, t, by_size)) t->left = erase_from(t->left, b, by_size);
    else t->right = erase_from(t->right, b, by_size);
    return recompute(t);
}

static void set_erase(xblock **root, xblock *b, bool by_size)
{
    *root = erase_from(*root, b, by_size);
}

/* After b->space changed: the maxima from b up to the root. */
static void space_changed(xblock *t, const xblock *b)
{
    if (t != b) space_changed(below(b, t, false) ? t->left : t->right, b);
    recompute(t);
}

/* The least unmapped block of `stream` whose space reaches `size`: the
 * subtree maxima prune every subtree that has none. */
static xblock *first_with_space(xblock *t, uint64_t stream, uint64_t size)
{
    if (!t || t->max_space < size) return NULL;
    if (t->stream < stream) return first_with_space(t->right, stream, size);
    if (t->stream == stream) {
        xblock *found = first_with_space(t->left, stream, size);
        if (found) return found;
        if (t->space >= size) return t;
        return first_with_space(t->right, stream, size);
    }
    return first_with_space(t->left, stream, size);
}

/* The least node at or above (stream, size, the lowest address), NULL if
 * none; segments' seq start at 1, so no node equals that key. */
static xblock *set_lower_bound(xblock *t, uint64_t stream, uint64_t size, bool by_size)
{
    xblock *found = NULL;
    while (t) {
        bool t_below = t->stream != stream ? t->stream < stream : by_size && t->size < size;
        if (t_below) {
            t = t->right;
        } else {
            found = t;
            t = t->left;
        }
    }
    return found;
}

/* The least node above b (which is in the set), NULL if none. */
static xblock *set_next(xblock *t, const xblock *b, bool by_size)
{
    xblock *found = NULL;
    while (t) {
        if (below(b, t, by_size)) {
            found = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return found;
}

static bool holds_whole_page(const xblock *b)
{
    uint64_t page = b->segment->page;
    return (b->off + page - 1) / page < (b->off + b->size) / page;
}

static void pool_add_free(pool *p, xblock *b)
{
    set_insert(&p->blocks, b, true);
    b->in_whole = holds_whole_page(b);
    if (b->in_whole) {
        b->wprev = NULL;
        b->wnext = p->whole;
        if (p->whole) p->whole->wprev = b;
        p->whole = b;
        p->nwhole++;
    }
}

static void pool_remove_free(pool *p, xblock *b)
{
    set_erase(&p->blocks, b, true);
    if (b->in_whole) {
        if (b->wprev) b->wprev->wnext = b->wnext;
        else p->whole = b->wnext;
        if (b->wnext) b->wnext->wprev = b->wprev;
        b->in_whole = false;
        p->nwhole--;
    }
}

/* ------------------------------------------------------------------ */
/* Statistics                                                          */
/* ------------------------------------------------------------------ */

static void note_peak(uint64_t now, uint64_t *peak)
{
    if (now > *peak) *peak = now;
}

/* ------------------------------------------------------------------ */
/* Blocks                                                              */
/* ------------------------------------------------------------------ */

static bool allocatable(const xblock *b)
{
    return b && !b->allocated; /* no events: see the header comment */
}

/* try_merge_blocks: src joins dst when both are free and both mapped or
 * both unmapped. dst is in no set while this runs. */
static void try_merge_blocks(emu *e, pool *p, xblock *dst, xblock *src)
{
    if (!src || src->allocated || src->mapped != dst->mapped) return;
    if (src->mapped) pool_remove_free(p, src);
    else set_erase(&p->unmapped, src, false);
    if (dst->prev == src) { /* [src dst] */
        dst->off = src->off;
        dst->prev = src->prev;
        if (dst->prev) dst->prev->next = dst;
    } else { /* [dst src] */
        dst->next = src->next;
        if (dst->next) dst->next->prev = dst;
    }
    dst->size += src->size;
    drop_block(e, src);
}

/* `b` goes in between `before` and `after` (either may be NULL). */
static void splice(xblock *b, xblock *before, xblock *after)
{
    b->prev = before;
    b->next = after;
    if (before) before->next = b;
    if (after) after->prev = b;
}

/* A run: the free and unmapped blocks between two allocated ones (or a
 * segment's ends). find_expandable_block looks from an unmapped block u
 * (or from the free block just before it) through the free and unmapped
 * blocks after: u's space is what that walk can cover, the run's bytes
 * from that start on. Kept up to date for every run an operation touches,
 * so that the first unmapped block with room is a treap descent, not
 * PyTorch's scan of every unmapped range (same answer: debug builds
 * check it against the scan). */
static void refresh_run_of(pool *p, xblock *x)
{
    xblock *start = x;
    while (allocatable(start->prev)) start = start->prev;
    uint64_t total = 0;
    for (xblock *b = start; allocatable(b); b = b->next) total += b->size;
    uint64_t before = 0; /* bytes of the run before b */
    for (xblock *b = start; allocatable(b); before += b->size, b = b->next) {
        if (b->mapped) continue;
        uint64_t from = allocatable(b->prev) && b != start ? before - b->prev->size : before;
        if (b->space != total - from) {
            b->space = total - from;
            space_changed(p->unmapped, b);
        }
    }
}

/* The runs on either side of block x (its own when it is free). */
static void refresh_run(pool *p, xblock *x)
{
    if (allocatable(x)) {
        refresh_run_of(p, x);
        return;
    }
    if (allocatable(x->prev)) refresh_run_of(p, x->prev);
    if (allocatable(x->next)) refresh_run_of(p, x->next);
}

/* ------------------------------------------------------------------ */
/* Mapping: map_block, unmap_block, ExpandableSegment::map / unmap      */
/* ------------------------------------------------------------------ */

/* map_block with ExpandableSegment::map: the pages under [off, off + size)
 * of unmapped block b, all or none (map releases the handles it created
 * when cuMemCreate runs out). The mapped part merges with free mapped
 * neighbours; what is left of b stays unmapped. */
static bool map_block(emu *e, pool *p, xblock *b, uint64_t size)
{
    uint64_t page = b->segment->page;
    uint64_t first = b->off / page;
    uint64_t last = (b->off + size + page - 1) / page; /* segmentRight */
    uint64_t bytes = (last - first) * page;
    if (bytes > e->capacity - e->mapped) return false; /* CUDA_ERROR_OUT_OF_MEMORY */
    xblock *rest = NULL;
    if (bytes < b->size && !(rest = new_piece(e, b, b->off + bytes, b->size - bytes, false)))
        return false;
    set_erase(&p->unmapped, b, false);
    b->mapped = true;
    if (rest) {
        splice(rest, b, b->next);
        set_insert(&p->unmapped, rest, false);
        b->size = bytes;
    }
    try_merge_blocks(e, p, b, b->prev);
    try_merge_blocks(e, p, b, b->next);
    pool_add_free(p, b);
    refresh_run(p, b);
    e->mapped += bytes;
    note_peak(e->mapped, &e->peak_mapped);
    e->out->map_calls++;
    e->out->map_pages += last - first;
    return true;
}

/* unmap_block with ExpandableSegment::unmap: the whole pages inside free
 * block b; the partial pages at either end stay mapped as free blocks.
 * unmapHandles synchronizes the segment's stream first. */
static bool unmap_block(emu *e, pool *p, xblock *b)
{
    uint64_t page = b->segment->page;
    uint64_t first = (b->off + page - 1) / page; /* segmentRight */
    uint64_t last = (b->off + b->size) / page;   /* segmentLeft */
    if (first >= last) return true;
    uint64_t before = first * page - b->off, after = b->off + b->size - last * page;
    /* Both pieces or neither: a head taken when the tail is refused goes
     * back, else its record would be lost to the replay. */
    xblock *head = NULL, *tail = NULL;
    if (before && !(head = new_piece(e, b, b->off, before, true))) return false;
    if (after && !(tail = new_piece(e, b, last * page, after, true))) {
        if (head) drop_block(e, head);
        return false;
    }
    pool_remove_free(p, b);
    if (head) {
        splice(head, b->prev, b);
        pool_add_free(p, head);
    }
    if (tail) {
        splice(tail, b, b->next);
        pool_add_free(p, tail);
    }
    b->off = first * page;
    b->size = (last - first) * page;
    b->mapped = false;
    try_merge_blocks(e, p, b, b->prev);
    try_merge_blocks(e, p, b, b->next);
    set_insert(&p->unmapped, b, false);
    refresh_run(p, b);
    e->mapped -= (last - first) * page;
    e->out->unmap_calls++;
    e->out->unmap_pages += last - first;
    e->out->stream_syncs++;
    return true;
}

/* ------------------------------------------------------------------ */
/* Segments                                                            */
/* ------------------------------------------------------------------ */

/* The live segments' list, which teardown frees. */
static void link_segment(emu *e, seg *s)
{
    s->prev_live = NULL;
    s->next_live = e->segments;
    if (e->segments) e->segments->prev_live = s;
    e->segments = s;
}

static void unlink_segment(emu *e, seg *s)
{
    if (s->prev_live) s->prev_live->next_live = s->next_live;
    else e->segments = s->next_live;
    if (s->next_live) s->next_live->prev_live = s->prev_live;
}

/* The ExpandableSegment constructor (called from find_expandable_block):
 * reserves 9/8 of the device's memory, in whole pages, maps nothing. Its
 * one block is unmapped. */
static xblock *new_segment(emu *e, pool *p, uint64_t stream, int which)
{
    seg *s = malloc(sizeof *s);
    xblock *b = s ? new_block(e) : NULL;
    if (!b) {
        free(s);
        e->nomem = true;
        return NULL;
    }
    s->seq = ++e->next_seq;
    s->page = p->page;
    s->va = e->va_bytes[which];
    s->which = which;
    link_segment(e, s);
    b->stream = stream;
    b->segment = s;
    b->size = s->va;
    b->space = s->va; /* a run of one block */
    set_insert(&p->unmapped, b, false);
    e->out->segments_created++;
    note_peak(++e->live_segments, &e->out->peak_segments);
    return b;
}

/* release_expandable_segment: b is the segment's one block, unmapped. */
static void release_segment(emu *e, pool *p, xblock *b)
{
    seg *s = b->segment;
    set_erase(&p->unmapped, b, false);
    unlink_segment(e, s);
    free(s);
    drop_block(e, b);
    e->live_segments--;
}

/* ------------------------------------------------------------------ */
/* Finding and growing                                                 */
/* ------------------------------------------------------------------ */

/* get_free_block: the best fit among the stream's free mapped blocks,
 * (size, address) order; then, among expandable blocks, it moves on to the
 * next larger block while that one's expandable size (its size plus an
 * unmapped range right after it) is smaller, so that the tail of a segment
 * is kept for requests nothing else fits. The max_split_size checks that
 * follow never refuse with its default (SIZE_MAX). */
static xblock *get_free_block(pool *p, uint64_t stream, uint64_t size)
{
    xblock *it = set_lower_bound(p->blocks, stream, size, true);
    if (!it || it->stream != stream) return NULL;
#define EXPANDABLE_SIZE(b) ((b)->size + ((b)->next && !(b)->next->mapped ? (b)->next->size : 0))
    for (xblock *n = set_next(p->blocks, it, true);
         n && n->stream == stream && EXPANDABLE_SIZE(n) < EXPANDABLE_SIZE(it);
         n = set_next(p->blocks, n, true))
        it = n;
#undef EXPANDABLE_SIZE
    pool_remove_free(p, it);
    return it;
}

/* find_expandable_block's scan: the lowest-addressed unmapped range of the
 * stream that, with the free block just before it and the free or
 * unmapped blocks after, spans `size`. */
static xblock *scan_for_room(pool *p, uint64_t stream, uint64_t size)
{
    for (xblock *u = set_lower_bound(p->unmapped, stream, 0, false); u && u->stream == stream;
         u = set_next(p->unmapped, u, false)) {
        xblock *c = allocatable(u->prev) ? u->prev : u;
        uint64_t bytes = 0;
        for (xblock *b = c; bytes < size && allocatable(b); b = b->next) bytes += b->size;
        if (bytes >= size) return c;
    }
    return NULL;
}

/* find_expandable_block: the scan's answer, from the run spaces (see
 * refresh_run); else a new segment. */
static xblock *find_expandable_block(emu *e, pool *p, uint64_t stream, uint64_t size, int which)
{
    xblock *u = first_with_space(p->unmapped, stream, size);
    xblock *c = u && allocatable(u->prev) ? u->prev : u;
#if VG_DEBUG_CHECKS
    vg_assert_internal(c == scan_for_room(p, stream, size));
#else
    (void)scan_for_room;
#endif
    return c ? c : new_segment(e, p, stream, which);
}

/* try_allocate_expandable_block: maps what the candidate lacks, from its
 * start (a free block and the unmapped range after it, or an unmapped
 * range), and hands the grown free block out of the pool. NULL when a map
 * is refused; the pages mapped before the refusal stay mapped. */
static xblock *try_allocate_expandable_block(emu *e, pool *p, uint64_t stream, uint64_t size,
                                             int which)
{
    xblock *c = find_expandable_block(e, p, stream, size, which);
    if (!c) return NULL;
    if (!c->mapped && !map_block(e, p, c, c->size < size ? c->size : size)) return NULL;
    while (c->size < size) {
        xblock *n = c->next; /* free -> unmapped -> ... */
        if (!n || n->mapped || n->allocated) return NULL; /* not reached */
        uint64_t missing = size - c->size;
        if (!map_block(e, p, n, missing < n->size ? missing : n->size)) return NULL;
        c = n; /* n absorbed c */
    }
    pool_remove_free(p, c);
    return c;
}

/* release_blocks for one pool: every free mapped block loses its whole
 * pages; a segment left with one unmapped block is released. Only the
 * blocks holding a whole page are visited: the others would be left as
 * they are. */
static bool release_blocks(emu *e, pool *p)
{
    if (p->nwhole > e->scratch_cap) {
        xblock **grown = realloc(e->scratch, p->nwhole * sizeof *grown);
        if (!grown) {
            e->nomem = true;
            return false;
        }
        e->scratch = grown;
        e->scratch_cap = p->nwhole;
    }
    /* Gathered first: unmapping changes the pool (as release_blocks'
     * to_unmap). Free mapped blocks are never neighbours, so unmapping
     * them in any order gives the same blocks. */
    size_t n = 0;
    for (xblock *b = p->whole; b; b = b->wnext) e->scratch[n++] = b;
    for (size_t i = 0; i < n; i++) {
        xblock *b = e->scratch[i];
        if (!unmap_block(e, p, b)) return false;
        if (!b->prev && !b->next) release_segment(e, p, b);
    }
    return true;
}

/* release_cached_blocks: synchronize_and_free_events, then release_blocks
 * for the large pool and the small one. */
static bool release_cached_blocks(emu *e)
{
    e->out->device_syncs++;
    return release_blocks(e, &e->pools[1]) && release_blocks(e, &e->pools[0]);
}

/* ------------------------------------------------------------------ */
/* malloc and free                                                     */
/* ------------------------------------------------------------------ */

/* round_size with its defaults: at least kMinBlockSize, a multiple of it. */
static uint64_t round_size(uint64_t size)
{
    return size < MIN_BLOCK ? MIN_BLOCK : (size + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

/* alloc_found_block: the front `size` bytes of b are handed out; the rest
 * goes back to the pool as a free block when should_split says so (with
 * expandable segments, in either pool: at least kMinBlockSize left). */
static xblock *alloc_found_block(emu *e, pool *p, xblock *b, uint64_t size, uint64_t requested)
{
    if (b->size - size >= MIN_BLOCK) {
        xblock *front = new_piece(e, b, b->off, size, true);
        if (!front) return NULL;
        splice(front, b->prev, b);
        b->off += size;
        b->size -= size;
        pool_add_free(p, b);
        b = front;
    }
    b->allocated = true;
    b->requested = requested;
    refresh_run(p, b);
    e->allocated += b->size;
    e->requested += requested;
    note_peak(e->allocated, &e->peak_allocated);
    note_peak(e->requested, &e->peak_requested);
    return b;
}

/* malloc: get_free_block, else alloc_block (try_allocate_expandable_block),
 * else release_cached_blocks and alloc_block once more (a retry); else an
 * OOM. release_available_cached_blocks frees nothing with the default
 * max_split_size and is left out. */
static xblock *emu_malloc(emu *e, uint64_t requested, uint64_t stream)
{
    uint64_t size = round_size(requested);
    int which = size <= SMALL_SIZE ? 0 : 1; /* get_pool */
    pool *p = &e->pools[which];
    xblock *b = get_free_block(p, stream, size);
    if (!b) b = try_allocate_expandable_block(e, p, stream, size, which);
    if (!b && !e->nomem) {
        if (!release_cached_blocks(e)) return NULL;
        e->out->replay.alloc_retries++;
        b = try_allocate_expandable_block(e, p, stream, size, which);
    }
    if (!b) return NULL;
    xblock *got = alloc_found_block(e, p, b, size, requested);
    if (!got) pool_add_free(p, b); /* host out of memory: b stays free */
    return got;
}

/* free_block: the block merges with free neighbours of the same mapped
 * state and goes back to its pool. Nothing is unmapped. */
static void emu_free(emu *e, xblock *b)
{
    pool *p = &e->pools[b->segment->which];
    e->allocated -= b->size;
    e->requested -= b->requested;
    b->allocated = false;
    b->requested = 0;
    try_merge_blocks(e, p, b, b->prev);
    try_merge_blocks(e, p, b, b->next);
    pool_add_free(p, b);
    refresh_run(p, b);
}

/* ------------------------------------------------------------------ */
/* The replay                                                          */
/* ------------------------------------------------------------------ */

static bool valid_page(uint64_t page)
{
    return page && page % PAGE_GRANULE == 0 && page <= MAX_DEVICE_TOTAL;
}

/* The config's defaults filled in; false when a value is out of range. */
static bool setup(emu *e, const vg_expandable_config *config)
{
    uint64_t large = config->large_page ? config->large_page : VG_EXPANDABLE_LARGE_PAGE;
    uint64_t small = config->small_page ? config->small_page : VG_EXPANDABLE_SMALL_PAGE;
    uint64_t total = config->device_total ? config->device_total
                     : config->budget     ? config->budget
                                          : VG_EXPANDABLE_UNLIMITED;
    if (!valid_page(large) || !valid_page(small) || total > MAX_DEVICE_TOTAL) return false;
    e->pools[0].page = small;
    e->pools[1].page = large;
    e->capacity = config->budget && config->budget < total ? config->budget : total;
    for (int i = 0; i < 2; i++) { /* max_handles_ = numSegments(total + total / 8) */
        uint64_t page = e->pools[i].page;
        e->va_bytes[i] = (total + total / 8 + page - 1) / page * page;
    }
    e->rng = 2463534242u;
    return true;
}

static void teardown(emu *e)
{
    while (e->chunks) {
        chunk *c = e->chunks;
        e->chunks = c->next;
        free(c);
    }
    while (e->segments) {
        seg *s = e->segments;
        e->segments = s->next_live;
        free(s);
    }
    free(e->scratch);
}

static void finish(const emu *e, vg_expandable_result *out)
{
    vg_replay_result *r = &out->replay;
    r->peak_requested = e->peak_requested;
    r->peak_allocated = e->peak_allocated;
    r->peak_reserved = e->peak_mapped;
    r->device_alloc = out->map_calls;
    r->device_free = out->unmap_calls;
}

/* The emulation as the replay loop drives it. */
static void *engine_alloc(void *e, uint64_t size, uint64_t stream)
{
    return emu_malloc(e, size, stream);
}

static void engine_free(void *e, void *b)
{
    emu_free(e, b);
}

static void engine_empty_cache(void *e) /* emptyCache */
{
    release_cached_blocks(e);
}

static void engine_levels(const void *self, vg_replay_sample *now)
{
    const emu *e = self;
    now->requested = e->requested;
    now->allocated = e->allocated;
    now->reserved = e->mapped;
}

static bool engine_host_failed(const void *e)
{
    return ((const emu *)e)->nomem;
}

static const vg_replay_engine emu_engine = {
    .alloc = engine_alloc,
    .free = engine_free,
    .empty_cache = engine_empty_cache,
    .synchronize = NULL, /* the allocator is not involved */
    .levels = engine_levels,
    .host_failed = engine_host_failed,
};

int vg_expandable_replay(const vg_trace_ops *t, const vg_expandable_config *config,
                         vg_replay_sample *samples, size_t nsamples, size_t window_ops,
                         vg_expandable_result *out)
{
    memset(out, 0, sizeof *out);
    out->replay.first_oom = -1;
    emu e;
    memset(&e, 0, sizeof e);
    if (!setup(&e, config)) return VG_ERR_ARG;
    void **live = calloc(t->nids ? t->nids : 1, sizeof *live);
    if (!live) return VG_ERR_NOMEM;
    e.out = out;
    bool ok = vg__replay_loop(t, &emu_engine, &e, live, samples, nsamples, window_ops,
                              &out->replay);
    vg_assert_internal(records_accounted(&e, live, t->nids));
    free(live);
    teardown(&e);
    if (!ok) {
        memset(out, 0, sizeof *out);
        out->replay.first_oom = -1;
        return VG_ERR_NOMEM;
    }
    finish(&e, out);
    return VG_OK;
}
