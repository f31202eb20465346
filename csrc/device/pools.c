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
 */
#include "registry.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct private_pool {
    int device;
    uint64_t id0, id1;
    vg_heap *heap;
    vg_device *dev;
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

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static private_pool *pools;
static unsigned created; /* pools so far: each simulated one its own addresses */
static pool_route *routes[VG_MAX_DEVICES];
static atomic_int npools;

static private_pool *find(int device, uint64_t id0, uint64_t id1)
{
    for (private_pool *p = pools; p; p = p->next)
        if (p->device == device && p->id0 == id0 && p->id1 == id1) return p;
    return NULL;
}

static private_pool *create(int device, uint64_t id0, uint64_t id1)
{
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
    private_pool **tail = &pools;
    while (*tail) tail = &(*tail)->next;
    *tail = p;
    atomic_fetch_add(&npools, 1);
    return p;
}

static void destroy(private_pool *p)
{
    private_pool **link = &pools;
    while (*link != p) link = &(*link)->next;
    *link = p->next;
    vg_heap_destroy(p->heap);
    p->dev->ops->destroy(p->dev);
    free(p);
    atomic_fetch_sub(&npools, 1);
}

/* A released pool gives back what is idle; once nothing in it is live
 * (nor waiting for a stream) and no begin routes to it, it goes. */
static size_t finish_if_idle(private_pool *p)
{
    size_t released = vg_heap_empty_cache(p->heap);
    vg_stats st;
    vg_heap_stats(p->heap, &st);
    if (!p->begun && st.active[VG_STAT_ALL].current == 0) destroy(p);
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

int vg__pools_alloc(size_t size, int device, vg_stream_t stream, void **out, vg_oom_info *oom,
                    int *rc)
{
    pthread_mutex_lock(&lock);
    pool_route *r = routes[device];
    while (r && !r->filter(r->ctx, stream)) r = r->next;
    if (r) {
        *out = vg_heap_alloc(r->pool->heap, size, stream, oom);
        *rc = *out ? VG_OK : oom->status;
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
        if (p->released) finish_if_idle(p);
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
