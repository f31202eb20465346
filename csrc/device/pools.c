/* Private pools: what CUDA graphs allocate from (include/vramguard/devices.h).
 *
 * PyTorch's pluggable allocator routes nothing by itself: during a capture
 * it calls begin_allocate_to_pool(device, id, filter), then malloc for
 * every allocation (captured or not), then end_allocate_to_pool, and
 * release_pool when the graph is reset. The allocator must send the
 * allocations the filter accepts to the pool, keep the pool's memory for
 * the graph (its replays write into the blocks it was captured with,
 * freed or not), and reuse freed pool blocks only for that pool.
 *
 * Here each pool is a heap of its own on its device, whose segments are
 * kept (vg_heap_set_keep_segments) until the pool is released. Blocks go
 * back to their heap by address: a free that the device's heap does not
 * know comes here. Begins are counted per device (vg_capture_enter), which
 * is what makes the providers capture-safe and what the allocation path
 * reads, without a lock, to know whether to ask the filters.
 *
 * One mutex covers the pool list and the routes. It is taken before any
 * heap lock, never after; filters are called under it, never under a heap
 * lock.
 *
 * A device has one budget, shared by its heap and its pools, as PyTorch's
 * own allocator counts a private pool's segments in the device's reserved
 * memory. What the pools of a device reserve is published in an atomic
 * (pools_reserved) after every call that may change it; the device heap's
 * budget check and ceiling add it (vg_heap_share_budget), without a lock.
 * A pool's heap adds the device heap's reserved bytes, read just before
 * its allocation, and the other pools'. The two heaps check under their
 * own locks, so an allocation on the device heap racing one in a pool may
 * each pass on the other's figure of just before: the budget is exact for
 * allocations one after the other, and may be passed by at most the
 * racing segment otherwise.
 *
 * The device's figures (vg_devices_totals) are its heap's plus its
 * pools', as PyTorch reports them. Their peaks are kept here: the highest
 * sum seen at each pool call and each look, and a new peak of the device
 * heap plus what the pools held while it was reached.
 */
#include "registry.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct private_pool {
    int device;
    uint64_t id0, id1;
    vg_heap *heap;
    vg_device *dev;
    vg_heap *device_heap;   /* whose budget it shares */
    size_t budget;          /* the device heap's, as last given to `heap` */
    size_t published;       /* its reserved bytes, as in pools_reserved */
    size_t device_reserved; /* the device heap's, read before an allocation */
    /* PyTorch keeps a pool's reserved bytes under its id after the pool
     * goes (current 0, the rest until reset): what an earlier pool of the
     * same id left, added to this one's. */
    vg_stat reserved_before[VG_STAT_TYPES];
    int use_count; /* begins not yet released */
    int begun;     /* begins not yet ended: 0 or 1 */
    bool released;
    struct private_pool *next; /* oldest first */
} private_pool;

/* A begin not yet ended, in begin order per device. */
typedef struct pool_route {
    private_pool *pool;
    vg_pool_filter filter;
    void *ctx;
    void (*drop)(void *ctx);
    struct pool_route *next;
} pool_route;

/* A pool gone: its reserved bytes, kept under its id (current 0), as
 * PyTorch keeps them: a reset zeroes them, nothing drops them. One small
 * record per pool id a process ever used. */
typedef struct gone_pool {
    int device;
    uint64_t id0, id1;
    vg_stat reserved[VG_STAT_TYPES];
    struct gone_pool *next;
} gone_pool;

/* The device's figures' peaks (see the top). */
typedef struct device_peaks {
    vg_stats peaks;      /* only the totaled stats' .peak */
    vg_stats heap_seen;  /* the device heap's, at the last look */
    vg_stats pools_seen; /* the pools' sum, at the last look */
} device_peaks;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static private_pool *pools;
static gone_pool *gone;
static unsigned created; /* pools so far: each simulated one its own addresses */
static pool_route *routes[VG_MAX_DEVICES];
static atomic_int npools;
/* Bytes reserved by the pools of each device: written under the mutex,
 * read without it by the device heap's budget check. */
static _Atomic size_t pools_reserved[VG_MAX_DEVICES];
static device_peaks peaks_of[VG_MAX_DEVICES];
/* What the gone pools of each device counted (allocated, freed, the
 * counters; currents 0, since their memory went back with them): the
 * device's totals keep them, as PyTorch's keep a private pool's after it
 * is freed, until reset_accumulated. Their peaks are in peaks_of. */
static vg_stats gone_stats[VG_MAX_DEVICES];

size_t vg__pools_reserved_on(void *device)
{
    return atomic_load_explicit(&pools_reserved[(intptr_t)device], memory_order_relaxed);
}

/* A pool heap's view of the shared budget: the device heap's bytes, read
 * before this call, and the other pools' (none changes while the mutex is
 * held, which every call on a pool's heap holds). */
static size_t reserved_beside_pool(void *ctx)
{
    const private_pool *p = ctx;
    return p->device_reserved + atomic_load_explicit(&pools_reserved[p->device], memory_order_relaxed) -
           p->published;
}

/* ------------------------------------------------------------------ */
/* Figures                                                             */
/* ------------------------------------------------------------------ */

#define COUNTERS_OF(st) ((uint64_t *)&(st)->num_device_alloc)
#define NUM_COUNTERS ((sizeof(vg_stats) - offsetof(vg_stats, num_device_alloc)) / sizeof(uint64_t))

static void add_stats(vg_stats *sum, const vg_stats *st)
{
#define ADD(name)                                                    \
    for (int t = 0; t < VG_STAT_TYPES; t++) {                        \
        sum->name[t].current += st->name[t].current;                 \
        sum->name[t].peak += st->name[t].peak;                       \
        sum->name[t].allocated += st->name[t].allocated;             \
        sum->name[t].freed += st->name[t].freed;                     \
    }
    VG_TOTALED_STAT_LIST(ADD)
#undef ADD
    uint64_t *to = COUNTERS_OF(sum);
    const uint64_t *from = (const uint64_t *)&st->num_device_alloc;
    for (size_t i = 0; i < NUM_COUNTERS; i++) to[i] += from[i];
}

static size_t reserved_of(vg_heap *h)
{
    vg_stats st;
    vg_heap_stats(h, &st);
    return (size_t)st.reserved_bytes[VG_STAT_ALL].current;
}

/* The pools of `device`, summed; returns how many there are. */
static size_t sum_pools(int device, vg_stats *sum)
{
    size_t n = 0;
    memset(sum, 0, sizeof *sum);
    for (private_pool *p = pools; p; p = p->next) {
        if (p->device != device) continue;
        vg_stats st;
        vg_heap_stats(p->heap, &st);
        add_stats(sum, &st);
        n++;
    }
    return n;
}

static inline int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* Raise the device's peaks to what is seen now: the sum, the device
 * heap's own peak, and a peak the heap reached since the last look, when
 * the pools held what they held at that look. A reset made on the heap
 * itself since the last look (Heap.reset_peaks; its count, not its peaks,
 * tells: a new peak may have passed the old one already) starts the
 * device's again from there. */
static void look(int device, const vg_stats *heap, const vg_stats *sum)
{
    device_peaks *dp = &peaks_of[device];
    bool reset = heap->peak_resets != dp->heap_seen.peak_resets;
#define RAISE(name)                                                                      \
    for (int t = 0; t < VG_STAT_TYPES; t++) {                                            \
        int64_t peak = max64(reset ? 0 : dp->peaks.name[t].peak, heap->name[t].peak);    \
        peak = max64(peak, heap->name[t].current + sum->name[t].current);                \
        if (reset || heap->name[t].peak > dp->heap_seen.name[t].peak)                    \
            peak = max64(peak, heap->name[t].peak + dp->pools_seen.name[t].current);     \
        dp->peaks.name[t].peak = peak;                                                   \
    }
    VG_TOTALED_STAT_LIST(RAISE)
#undef RAISE
    dp->heap_seen = *heap;
    dp->pools_seen = *sum;
}

/* After any call that may change what the pools of `device` hold: publish
 * their reserved bytes, and look at the peaks. */
static void pools_changed(int device)
{
    vg_stats sum, st;
    memset(&sum, 0, sizeof sum);
    size_t total = 0;
    for (private_pool *p = pools; p; p = p->next) {
        if (p->device != device) continue;
        vg_heap_stats(p->heap, &st);
        add_stats(&sum, &st);
        p->published = (size_t)st.reserved_bytes[VG_STAT_ALL].current;
        total += p->published;
    }
    atomic_store_explicit(&pools_reserved[device], total, memory_order_relaxed);
    vg_heap *h = vg_devices_existing(device);
    if (!h) return;
    vg_heap_stats(h, &st);
    look(device, &st, &sum);
}

static private_pool *find(int device, uint64_t id0, uint64_t id1)
{
    for (private_pool *p = pools; p; p = p->next)
        if (p->device == device && p->id0 == id0 && p->id1 == id1) return p;
    return NULL;
}

/* What a gone pool of this id left, taken back for its successor. */
static void take_gone(private_pool *p)
{
    for (gone_pool **link = &gone; *link; link = &(*link)->next) {
        gone_pool *g = *link;
        if (g->device != p->device || g->id0 != p->id0 || g->id1 != p->id1) continue;
        memcpy(p->reserved_before, g->reserved, sizeof g->reserved);
        *link = g->next;
        free(g);
        return;
    }
}

/* A pool's reserved bytes under its id: its heap's, after what an earlier
 * pool of the id left (allocated and freed add up; the peak is the higher). */
static void reserved_by_pool(const private_pool *p, const vg_stats *st, vg_stat *out)
{
    for (int t = 0; t < VG_STAT_TYPES; t++) {
        const vg_stat *now = &st->reserved_bytes[t], *before = &p->reserved_before[t];
        out[t].current = now->current;
        out[t].peak = max64(now->peak, before->peak);
        out[t].allocated = now->allocated + before->allocated;
        out[t].freed = now->freed + before->freed;
    }
}

/* A gone pool's figures into its device's: what was still current went
 * back as the heap went, so it counts as freed. */
static void fold_gone_stats(int device, const vg_stats *st)
{
    vg_stats *into = &gone_stats[device];
#define FOLD(name)                                                        \
    for (int t = 0; t < VG_STAT_TYPES; t++) {                             \
        into->name[t].allocated += st->name[t].allocated;                 \
        into->name[t].freed += st->name[t].freed + st->name[t].current;   \
    }
    VG_TOTALED_STAT_LIST(FOLD)
#undef FOLD
    uint64_t *to = COUNTERS_OF(into);
    const uint64_t *from = (const uint64_t *)&st->num_device_alloc;
    for (size_t i = 0; i < NUM_COUNTERS; i++) to[i] += from[i];
}

static private_pool *create(int device, uint64_t id0, uint64_t id1)
{
    /* Made first: the pool shares its budget. */
    vg_heap *device_heap = vg_devices_heap(device);
    if (!device_heap) return NULL;
    private_pool *p = calloc(1, sizeof *p);
    if (!p) {
        vg__devices_set_error("out of host memory for a private pool");
        return NULL;
    }
    /* 256 TiB apart, above the device heaps' simulated addresses (1 TiB on) */
    uintptr_t sim_base = (uintptr_t)(created++ % 0xfffe + 1) << 48;
    p->dev = vg__devices_provider(device, sim_base);
    /* Segments, as before the arena was the default: no budget, no gc,
     * nothing is released while a graph may use it. */
    vg_heap_config cfg = {&vg_policy_default, 0, 0.0};
    p->heap = p->dev ? vg_heap_create(p->dev, &cfg) : NULL;
    if (!p->heap) {
        if (p->dev) {
            p->dev->ops->destroy(p->dev);
            vg__devices_set_error("cannot create a heap for a private pool");
        }
        free(p);
        return NULL;
    }
    vg_heap_set_keep_segments(p->heap, 1);
    p->device = device;
    p->id0 = id0;
    p->id1 = id1;
    p->device_heap = device_heap;
    vg_heap_share_budget(p->heap, reserved_beside_pool, p);
    take_gone(p);
    private_pool **tail = &pools;
    while (*tail) tail = &(*tail)->next;
    *tail = p;
    atomic_fetch_add(&npools, 1);
    return p;
}

/* Keep what the pool counted in its device's figures, and what it
 * reserved under its id (current 0 now), as PyTorch does; without host
 * memory for the id's record that record is lost, nothing else. */
static void keep_gone(const private_pool *p)
{
    vg_stats st;
    vg_heap_stats(p->heap, &st);
    fold_gone_stats(p->device, &st);
    gone_pool *g = calloc(1, sizeof *g);
    if (!g) return;
    g->device = p->device;
    g->id0 = p->id0;
    g->id1 = p->id1;
    reserved_by_pool(p, &st, g->reserved);
    for (int t = 0; t < VG_STAT_TYPES; t++) g->reserved[t].current = 0;
    g->next = gone;
    gone = g;
}

static void destroy(private_pool *p)
{
    private_pool **link = &pools;
    while (*link != p) link = &(*link)->next;
    *link = p->next;
    keep_gone(p);
    int device = p->device;
    vg_heap_destroy(p->heap);
    p->dev->ops->destroy(p->dev);
    free(p);
    atomic_fetch_sub(&npools, 1);
    pools_changed(device);
}

/* A released pool gives back what is idle; once nothing in it is live
 * (nor waiting for a stream) and no begin routes to it, it goes. */
static size_t finish_if_idle(private_pool *p)
{
    size_t released = vg_heap_empty_cache(p->heap);
    vg_stats st;
    vg_heap_stats(p->heap, &st);
    if (!p->begun && st.active[VG_STAT_ALL].current == 0) destroy(p);
    else if (released) pools_changed(p->device);
    return released;
}

/* Calls on the device's heap that checked for captures before this begin
 * counted hold its lock, or its device wait, until they are done: waiting
 * for both once waits for them, so nothing they do can meet the capture
 * that follows. */
static void wait_for_calls_in_flight(int device)
{
    vg_heap *h = vg_devices_existing(device);
    if (h) vg_heap_wait_for_calls(h);
}

/* ------------------------------------------------------------------ */
/* Begin, end, release                                                 */
/* ------------------------------------------------------------------ */

static int begin_locked(int device, uint64_t id0, uint64_t id1, pool_route *r)
{
    private_pool *p = find(device, id0, id1);
    if (p && p->begun) {
        vg__devices_set_error("this private pool is being allocated to already");
        return VG_ERR_ARG;
    }
    if (!p && !(p = create(device, id0, id1))) return VG_ERR_DEVICE;
    if (p->released) vg_heap_set_keep_segments(p->heap, 1);
    p->released = false;
    p->use_count++;
    p->begun++;
    r->pool = p;
    pool_route **tail = &routes[device];
    while (*tail) tail = &(*tail)->next;
    *tail = r;
    vg_capture_enter(device);
    return VG_OK;
}

int vg_devices_begin_pool(int device, uint64_t id0, uint64_t id1, vg_pool_filter filter,
                          void *ctx, void (*drop)(void *ctx))
{
    int rc = VG_OK;
    pool_route *r = NULL;
    if (device < 0 || device >= VG_MAX_DEVICES || (id0 == 0 && id1 == 0) || !filter) {
        vg__devices_set_error(filter ? "begin of the default pool, or of a device out of range"
                                     : "begin without a filter");
        rc = VG_ERR_ARG;
    } else if (!(r = calloc(1, sizeof *r))) {
        vg__devices_set_error("out of host memory for a private pool");
        rc = VG_ERR_NOMEM;
    } else {
        r->filter = filter;
        r->ctx = ctx;
        r->drop = drop;
        pthread_mutex_lock(&lock);
        rc = begin_locked(device, id0, id1, r);
        pthread_mutex_unlock(&lock);
    }
    if (rc != VG_OK) {
        free(r);
        if (drop) drop(ctx);
        return rc;
    }
    wait_for_calls_in_flight(device);
    return VG_OK;
}

int vg_devices_end_pool(int device, uint64_t id0, uint64_t id1)
{
    if (device < 0 || device >= VG_MAX_DEVICES) return VG_ERR_INVALID;
    pthread_mutex_lock(&lock);
    pool_route **link = &routes[device];
    while (*link && ((*link)->pool->id0 != id0 || (*link)->pool->id1 != id1)) link = &(*link)->next;
    pool_route *r = *link;
    if (r) {
        *link = r->next;
        private_pool *p = r->pool;
        p->begun--;
        vg_capture_leave(device);
        if (p->released) finish_if_idle(p);
    }
    pthread_mutex_unlock(&lock);
    if (!r) return VG_ERR_INVALID;
    /* After the lock: no allocation can be calling the filter now. */
    if (r->drop) r->drop(r->ctx);
    free(r);
    return VG_OK;
}

int vg_devices_release_pool(int device, uint64_t id0, uint64_t id1)
{
    pthread_mutex_lock(&lock);
    private_pool *p = find(device, id0, id1);
    int rc = p && p->use_count > 0 ? VG_OK : VG_ERR_INVALID;
    if (rc == VG_OK && --p->use_count == 0) {
        p->released = true;
        vg_heap_set_keep_segments(p->heap, 0);
        finish_if_idle(p);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ------------------------------------------------------------------ */
/* What the registry routes here                                       */
/* ------------------------------------------------------------------ */

/* Before an allocation in the pool: the device's budget, and what its
 * heap holds now. */
static void share_budget(private_pool *p)
{
    size_t budget = vg_heap_budget(p->device_heap);
    p->device_reserved = reserved_of(p->device_heap);
    if (budget != p->budget) {
        vg_heap_set_budget(p->heap, budget);
        p->budget = budget;
    }
}

/* The pools' part of an out-of-memory report on `device`. */
static void explain_locked(int device, vg_oom_info *oom, bool in_pool)
{
    oom->pools = oom->pools_reserved = oom->pools_allocated = 0;
    oom->in_private_pool = in_pool;
    for (private_pool *p = pools; p; p = p->next) {
        if (p->device != device) continue;
        vg_stats st;
        vg_heap_stats(p->heap, &st);
        size_t held = (size_t)st.reserved_bytes[VG_STAT_ALL].current;
        oom->pools += held != 0;
        oom->pools_reserved += held;
        oom->pools_allocated += (size_t)st.allocated_bytes[VG_STAT_ALL].current;
    }
    if (!in_pool) return;
    /* The device heap's own figures, as a failure on it would give them:
     * allocated and reserved are the device heap's, the free figures the
     * pool's (where the request was refused); the message keeps them apart
     * (oom_message.c). The heap's idle cache stays: nothing may be freed
     * while a graph captures. */
    vg_heap *h = vg_devices_existing(device);
    if (!h) return;
    vg_stats st;
    vg_heap_stats(h, &st);
    oom->allocated = (size_t)st.allocated_bytes[VG_STAT_ALL].current;
    oom->reserved = (size_t)st.reserved_bytes[VG_STAT_ALL].current;
}

void vg__pools_explain(int device, vg_oom_info *oom)
{
    if (!atomic_load_explicit(&npools, memory_order_acquire)) return;
    pthread_mutex_lock(&lock);
    explain_locked(device, oom, false);
    pthread_mutex_unlock(&lock);
}

int vg__pools_alloc(size_t size, int device, vg_stream_t stream, void **out, vg_oom_info *oom,
                    int *rc)
{
    pthread_mutex_lock(&lock);
    pool_route *r = routes[device];
    while (r && !r->filter(r->ctx, stream)) r = r->next;
    if (r) {
        private_pool *p = r->pool;
        share_budget(p);
        *out = vg_heap_alloc(p->heap, size, stream, oom);
        *rc = *out ? VG_OK : oom->status;
        pools_changed(device);
        if (!*out && oom->status == VG_ERR_NOMEM) explain_locked(device, oom, true);
    }
    pthread_mutex_unlock(&lock);
    return r != NULL;
}

int vg__pools_free(void *ptr)
{
    if (!atomic_load_explicit(&npools, memory_order_acquire)) return VG_ERR_INVALID;
    int rc = VG_ERR_INVALID;
    pthread_mutex_lock(&lock);
    for (private_pool *p = pools; p; p = p->next) {
        rc = vg_heap_free_if_owned(p->heap, ptr);
        if (rc != VG_OK) continue;
        /* The owner found: finish_if_idle may free p, so nothing reads it after. */
        int device = p->device;
        if (p->released) finish_if_idle(p);
        pools_changed(device);
        break;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int vg__pools_record_stream(void *ptr, int stream_device, vg_stream_t stream)
{
    if (!atomic_load_explicit(&npools, memory_order_acquire)) return VG_ERR_INVALID;
    int rc = VG_ERR_INVALID;
    pthread_mutex_lock(&lock);
    for (private_pool *p = pools; p && rc == VG_ERR_INVALID; p = p->next)
        rc = vg_heap_record_device_stream(p->heap, ptr, stream_device < 0 ? p->device : stream_device,
                                          stream);
    pthread_mutex_unlock(&lock);
    return rc;
}

int vg__pools_segment_of(const void *ptr, uintptr_t *base, size_t *size)
{
    if (!atomic_load_explicit(&npools, memory_order_acquire)) return VG_ERR_INVALID;
    int rc = VG_ERR_INVALID;
    pthread_mutex_lock(&lock);
    for (private_pool *p = pools; p && rc != VG_OK; p = p->next)
        rc = vg_heap_segment_of(p->heap, ptr, base, size);
    pthread_mutex_unlock(&lock);
    return rc;
}

size_t vg__pools_empty_cache(void)
{
    size_t released = 0;
    pthread_mutex_lock(&lock);
    private_pool *p = pools;
    while (p) {
        private_pool *next = p->next; /* p may go */
        if (p->released) released += finish_if_idle(p);
        p = next;
    }
    pthread_mutex_unlock(&lock);
    return released;
}

size_t vg_devices_pools(vg_pool_info *out, size_t n)
{
    size_t count = 0;
    pthread_mutex_lock(&lock);
    for (private_pool *p = pools; p; p = p->next, count++) {
        if (count >= n) continue;
        vg_pool_info *info = &out[count];
        info->device = p->device;
        info->id0 = p->id0;
        info->id1 = p->id1;
        info->use_count = p->use_count;
        info->begun = p->begun;
        info->released = p->released;
        vg_heap_stats(p->heap, &info->stats);
    }
    pthread_mutex_unlock(&lock);
    return count;
}

int vg_devices_visit_pools(int device, vg_pool_visitor on_pool, vg_segment_visitor on_segment,
                           vg_block_visitor on_block, void *arg)
{
    int rc = 0;
    pthread_mutex_lock(&lock);
    for (private_pool *p = pools; p && !rc; p = p->next) {
        if (p->device != device) continue;
        rc = on_pool(arg, p->id0, p->id1);
        if (!rc) rc = vg_heap_visit(p->heap, on_segment, on_block, arg);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ------------------------------------------------------------------ */
/* The device's figures, pools included                                */
/* ------------------------------------------------------------------ */

int vg_devices_totals(int device, vg_device_totals *out)
{
    memset(out, 0, sizeof *out);
    vg_heap *h = device >= 0 && device < VG_MAX_DEVICES ? vg_devices_existing(device) : NULL;
    if (!h) return VG_ERR_INVALID;
    vg_stats heap, sum;
    pthread_mutex_lock(&lock);
    vg_heap_stats(h, &heap);
    out->pools = sum_pools(device, &sum);
    look(device, &heap, &sum);
    out->stats = heap;
    add_stats(&out->stats, &sum);
    add_stats(&out->stats, &gone_stats[device]);
#define PEAK(name) \
    for (int t = 0; t < VG_STAT_TYPES; t++) out->stats.name[t].peak = peaks_of[device].peaks.name[t].peak;
    VG_TOTALED_STAT_LIST(PEAK)
#undef PEAK
    pthread_mutex_unlock(&lock);
    out->pools_reserved = (size_t)sum.reserved_bytes[VG_STAT_ALL].current;
    out->pools_allocated = (size_t)sum.allocated_bytes[VG_STAT_ALL].current;
    return VG_OK;
}

size_t vg_devices_pool_reservations(int device, vg_pool_reservation *out, size_t n)
{
    size_t count = 0;
    pthread_mutex_lock(&lock);
    for (private_pool *p = pools; p; p = p->next) {
        if (p->device != device) continue;
        if (count < n) {
            vg_stats st;
            vg_heap_stats(p->heap, &st);
            out[count].id0 = p->id0;
            out[count].id1 = p->id1;
            reserved_by_pool(p, &st, out[count].reserved);
        }
        count++;
    }
    for (gone_pool *g = gone; g; g = g->next) {
        if (g->device != device) continue;
        if (count < n) {
            out[count].id0 = g->id0;
            out[count].id1 = g->id1;
            memcpy(out[count].reserved, g->reserved, sizeof g->reserved);
        }
        count++;
    }
    pthread_mutex_unlock(&lock);
    return count;
}

/* As PyTorch's reset_peak_memory_stats / reset_accumulated_memory_stats:
 * every figure of the device, its heap's, its pools' and the gone pools'. */
static void reset_device(int device, bool peaks)
{
    vg_heap *h = device >= 0 && device < VG_MAX_DEVICES ? vg_devices_existing(device) : NULL;
    if (!h) return;
    pthread_mutex_lock(&lock);
    void (*reset)(vg_heap *) = peaks ? vg_heap_reset_peaks : vg_heap_reset_accumulated;
    reset(h);
    for (private_pool *p = pools; p; p = p->next) {
        if (p->device != device) continue;
        reset(p->heap);
        for (int t = 0; t < VG_STAT_TYPES; t++) {
            if (peaks) p->reserved_before[t].peak = 0;
            else p->reserved_before[t].allocated = p->reserved_before[t].freed = 0;
        }
    }
    for (gone_pool *g = gone; g; g = g->next) {
        if (g->device != device) continue;
        for (int t = 0; t < VG_STAT_TYPES; t++) {
            if (peaks) g->reserved[t].peak = 0;
            else g->reserved[t].allocated = g->reserved[t].freed = 0;
        }
    }
    /* The gone pools' part holds no peak (peaks_of does) and no current:
     * only its accumulated figures restart, as the heaps' do. */
    if (!peaks) memset(&gone_stats[device], 0, sizeof gone_stats[device]);
    if (peaks) {
        /* The peaks start again from the sum now. */
        vg_stats heap, sum;
        vg_heap_stats(h, &heap);
        sum_pools(device, &sum);
        memset(&peaks_of[device], 0, sizeof peaks_of[device]);
        look(device, &heap, &sum);
    }
    pthread_mutex_unlock(&lock);
}

void vg_devices_reset_peaks(int device)
{
    reset_device(device, true);
}

void vg_devices_reset_accumulated(int device)
{
    reset_device(device, false);
}

int vg_devices_save_peaks(int device, vg_device_peaks *out)
{
    memset(out, 0, sizeof *out);
    vg_heap *h = device >= 0 && device < VG_MAX_DEVICES ? vg_devices_existing(device) : NULL;
    if (!h) return VG_ERR_INVALID;
    vg_device_totals t;
    vg_devices_totals(device, &t);
    out->device = t.stats;
    vg_heap_stats(h, &out->heap);
    return VG_OK;
}

int vg_devices_restore_peaks(int device, const vg_device_peaks *saved)
{
    vg_heap *h = device >= 0 && device < VG_MAX_DEVICES ? vg_devices_existing(device) : NULL;
    if (!h) return VG_ERR_INVALID;
    pthread_mutex_lock(&lock);
    vg_heap_restore_peaks(h, &saved->heap);
    vg_stats heap, sum;
    vg_heap_stats(h, &heap);
    sum_pools(device, &sum);
    device_peaks *dp = &peaks_of[device];
#define RESTORE(name)                                                                    \
    for (int t = 0; t < VG_STAT_TYPES; t++)                                              \
        dp->peaks.name[t].peak = max64(saved->device.name[t].peak,                       \
                                       heap.name[t].current + sum.name[t].current);
    VG_TOTALED_STAT_LIST(RESTORE)
#undef RESTORE
    /* What the heap shows now is seen: its lowered peak raises nothing. */
    dp->heap_seen = heap;
    dp->pools_seen = sum;
    pthread_mutex_unlock(&lock);
    return VG_OK;
}
