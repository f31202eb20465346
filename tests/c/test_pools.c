/* CUDA-graph private pools share their device's budget and figures, on
 * simulated devices: a pool's reserved memory counts against the budget of
 * the device heap and the other way round, the device's figures are its
 * heap's plus its pools' (as PyTorch reports them), and a released pool
 * drops out, its id keeping its peak until reset.
 *
 * Each test uses a device of its own: the registry is per process. The
 * device heaps run the arena (2 MiB pages mapped as needed), the pools run
 * segments (vramguard's policy): a small request gets a 2 MiB segment, 3 MiB
 * a 6 MiB one (two blocks), 20 MiB its own, and under a budget a segment
 * shrinks to the request before it is refused. */
#include "vramguard/devices.h"
#include "vramguard/oom.h"
#include "harness.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

static const size_t MiB = (size_t)1 << 20;

/* The capture's stream: what a CUDA graph's filter accepts. */
static const vg_stream_t CAPTURE = (vg_stream_t)0x51;

static int only_capture(void *ctx, vg_stream_t stream)
{
    (void)ctx;
    return stream == CAPTURE;
}

static void *alloc(int device, size_t size, vg_stream_t stream, vg_oom_info *oom)
{
    void *p = NULL;
    vg_devices_alloc(size, device, stream, &p, oom);
    return p;
}

static vg_device_totals totals(int device)
{
    vg_device_totals t;
    vg_devices_totals(device, &t);
    return t;
}

static vg_stats heap_stats(int device)
{
    vg_stats st;
    vg_heap_stats(vg_devices_existing(device), &st);
    return st;
}

#define RESERVED(st) ((st).reserved_bytes[VG_STAT_ALL].current)
#define ALLOCATED(st) ((st).allocated_bytes[VG_STAT_ALL].current)

/* 40 MiB on the heap and 20 in a pool under a 64 MiB budget: the pool's
 * next request, which a budget of its own would have let pass, is refused
 * and says what the pools hold; the device heap may use only the 4 MiB
 * left. */
static void test_budget_counts_pool_memory(void)
{
    const int dev = 1;
    CHECK_EQ(vg_devices_set_budget(dev, 64 * MiB, 0.0), VG_OK);
    vg_oom_info oom;
    void *a = alloc(dev, 40 * MiB, 0, &oom);
    CHECK(a);
    CHECK_EQ(vg_devices_begin_pool(dev, 7, 0, only_capture, NULL, NULL), VG_OK);
    void *g = alloc(dev, 20 * MiB, CAPTURE, &oom);
    CHECK(g);
    CHECK_EQ(totals(dev).pools_reserved, 20 * MiB);

    /* 8 MiB more in the pool: 68 MiB with the heap's 40 */
    CHECK(!alloc(dev, 8 * MiB, CAPTURE, &oom));
    CHECK_EQ(oom.status, VG_ERR_NOMEM);
    CHECK(oom.budget_refused);
    CHECK(oom.in_private_pool);
    CHECK_EQ(oom.pools, 1);
    CHECK_EQ(oom.pools_reserved, 20 * MiB);
    CHECK_EQ(oom.pools_allocated, 20 * MiB);
    CHECK_EQ(oom.allocated, 40 * MiB); /* the device heap's own */
    CHECK_EQ(oom.reserved, 40 * MiB);
    char msg[2048];
    vg_format_oom(&oom, "CUDA", msg, sizeof msg);
    CHECK(strstr(msg, "Of the allocated memory 60.00 MiB is allocated by PyTorch, with 20.00 MiB "
                      "allocated in private pools (e.g., CUDA Graphs), and 0 bytes is reserved"));
    CHECK(strstr(msg, "CUDA graph private pools hold 20.00 MiB (1 pool, 20.00 MiB of it in live "
                      "tensors), counted in the budget"));
    CHECK(strstr(msg, "refused in its graph's pool"));

    /* 6 MiB on the device heap: 66 MiB in all */
    CHECK(!alloc(dev, 6 * MiB, 0, &oom));
    CHECK(oom.budget_refused);
    CHECK(!oom.in_private_pool);
    CHECK_EQ(oom.pools_reserved, 20 * MiB);
    vg_format_oom(&oom, "CUDA", msg, sizeof msg);
    CHECK(strstr(msg, "with 20.00 MiB allocated in private pools"));
    /* 4 MiB fits exactly */
    void *b = alloc(dev, 4 * MiB, 0, &oom);
    CHECK(b);
    vg_device_totals t = totals(dev);
    CHECK_EQ(RESERVED(t.stats), 64 * MiB);
    CHECK_EQ(t.stats.num_budget_refusals, heap_stats(dev).num_budget_refusals + 2);

    CHECK_EQ(vg_devices_end_pool(dev, 7, 0), VG_OK);
    vg_devices_free(g, dev);
    CHECK_EQ(vg_devices_release_pool(dev, 7, 0), VG_OK);
    /* The pool is gone, its 20 MiB with it: the heap may use them now. */
    CHECK_EQ(totals(dev).pools_reserved, 0);
    void *c = alloc(dev, 20 * MiB, 0, &oom);
    CHECK(c);
    vg_devices_free(a, dev);
    vg_devices_free(b, dev);
    vg_devices_free(c, dev);
}

/* The device's figures after a capture: the heap's and the pool's summed,
 * peaks included; the pool's reserved bytes under its id. Released, the
 * pool drops out of the current figures; its id keeps its peak and totals
 * until reset, and the entry after. */
static void test_device_figures_include_pools(void)
{
    const int dev = 2;
    vg_oom_info oom;
    void *a = alloc(dev, 10 * MiB, 0, &oom); /* heap: 10 MiB mapped */
    CHECK(a);
    CHECK_EQ(vg_devices_begin_pool(dev, 0, 3, only_capture, NULL, NULL), VG_OK);
    void *g1 = alloc(dev, 3 * MiB, CAPTURE, &oom);   /* a 6 MiB segment */
    void *g2 = alloc(dev, 512 * 1024, CAPTURE, &oom); /* a 2 MiB one */
    void *h = alloc(dev, 2 * MiB, (vg_stream_t)0x99, &oom); /* not the capture's: the heap */
    CHECK(g1 && g2 && h);
    CHECK_EQ(vg_devices_end_pool(dev, 0, 3), VG_OK);

    vg_stats heap = heap_stats(dev);
    CHECK_EQ(RESERVED(heap), 12 * MiB);
    CHECK_EQ(ALLOCATED(heap), 12 * MiB);
    vg_device_totals t = totals(dev);
    CHECK_EQ(t.pools, 1);
    CHECK_EQ(t.pools_reserved, 8 * MiB);
    CHECK_EQ(t.pools_allocated, 3 * MiB + 512 * 1024);
    CHECK_EQ(RESERVED(t.stats), 20 * MiB);
    CHECK_EQ(t.stats.reserved_bytes[VG_STAT_ALL].peak, 20 * MiB);
    CHECK_EQ(t.stats.reserved_bytes[VG_STAT_SMALL].current, 2 * MiB);
    CHECK_EQ(ALLOCATED(t.stats), 15 * MiB + 512 * 1024);
    CHECK_EQ(t.stats.allocation[VG_STAT_ALL].current, 4);
    CHECK_EQ(t.stats.segment[VG_STAT_ALL].current, heap.segment[VG_STAT_ALL].current + 2);
    CHECK_EQ(t.stats.num_device_alloc, heap.num_device_alloc + 2);

    vg_pool_reservation r[4];
    CHECK_EQ(vg_devices_pool_reservations(dev, r, 4), 1);
    CHECK_EQ(r[0].id0, 0);
    CHECK_EQ(r[0].id1, 3);
    CHECK_EQ(r[0].reserved[VG_STAT_ALL].current, 8 * MiB);
    CHECK_EQ(r[0].reserved[VG_STAT_LARGE].current, 6 * MiB);

    /* Freed and released: the pool's 8 MiB leave the current figures, the
     * peak of the sum stays 20 MiB of reserved memory. */
    vg_devices_free(h, dev);
    vg_devices_free(g1, dev);
    vg_devices_free(g2, dev);
    CHECK_EQ(vg_devices_release_pool(dev, 0, 3), VG_OK);
    t = totals(dev);
    CHECK_EQ(t.pools, 0);
    CHECK_EQ(t.pools_reserved, 0);
    CHECK_EQ(RESERVED(t.stats), RESERVED(heap_stats(dev)));
    CHECK_EQ(ALLOCATED(t.stats), 10 * MiB);
    CHECK_EQ(t.stats.reserved_bytes[VG_STAT_ALL].peak, 20 * MiB);
    CHECK_EQ(t.stats.allocated_bytes[VG_STAT_ALL].peak, 15 * MiB + 512 * 1024);
    /* freed as much as allocated: totals stay consistent across heaps */
    CHECK_EQ(t.stats.allocated_bytes[VG_STAT_ALL].allocated - t.stats.allocated_bytes[VG_STAT_ALL].freed,
             ALLOCATED(t.stats));

    CHECK_EQ(vg_devices_pool_reservations(dev, r, 4), 1);
    CHECK_EQ(r[0].reserved[VG_STAT_ALL].current, 0);
    CHECK_EQ(r[0].reserved[VG_STAT_ALL].peak, 8 * MiB);
    CHECK_EQ(r[0].reserved[VG_STAT_ALL].allocated, 8 * MiB);
    CHECK_EQ(r[0].reserved[VG_STAT_ALL].freed, 8 * MiB);

    vg_devices_reset_peaks(dev);
    t = totals(dev);
    CHECK_EQ(t.stats.reserved_bytes[VG_STAT_ALL].peak, RESERVED(t.stats));
    CHECK_EQ(t.stats.allocated_bytes[VG_STAT_ALL].peak, 10 * MiB);
    CHECK_EQ(vg_devices_pool_reservations(dev, r, 4), 1);
    CHECK_EQ(r[0].reserved[VG_STAT_ALL].peak, 0);
    vg_devices_reset_accumulated(dev);
    /* all zero, and kept, as PyTorch keeps it */
    CHECK_EQ(vg_devices_pool_reservations(dev, r, 4), 1);
    CHECK_EQ(r[0].reserved[VG_STAT_ALL].allocated, 0);
    CHECK_EQ(r[0].reserved[VG_STAT_ALL].freed, 0);
    CHECK_EQ(r[0].reserved[VG_STAT_ALL].peak, 0);
    CHECK_EQ(totals(dev).stats.num_device_alloc, 0);
    vg_devices_free(a, dev);
}

/* A peak the device heap reaches while a pool holds memory is the sum. */
static void test_heap_peak_with_pool_is_the_sum(void)
{
    const int dev = 3;
    vg_oom_info oom;
    CHECK_EQ(vg_devices_begin_pool(dev, 9, 9, only_capture, NULL, NULL), VG_OK);
    void *g = alloc(dev, 12 * MiB, CAPTURE, &oom);
    CHECK_EQ(vg_devices_end_pool(dev, 9, 9), VG_OK);
    void *a = alloc(dev, 8 * MiB, 0, &oom);
    CHECK(g && a);
    vg_devices_free(a, dev); /* no call on the pool in between */
    vg_device_totals t = totals(dev);
    CHECK_EQ(ALLOCATED(t.stats), 12 * MiB);
    CHECK_EQ(t.stats.allocated_bytes[VG_STAT_ALL].peak, 20 * MiB);
    /* A reset on the device heap itself starts the device's peak again. */
    vg_heap_reset_peaks(vg_devices_existing(dev));
    t = totals(dev);
    CHECK_EQ(t.stats.allocated_bytes[VG_STAT_ALL].peak, 12 * MiB);
    vg_devices_free(g, dev);
    CHECK_EQ(vg_devices_release_pool(dev, 9, 9), VG_OK);
}

/* A device without a heap has no figures; a pool made before the device
 * heap makes it, so that the budget is shared from the first byte. */
static void test_pool_first_makes_the_device_heap(void)
{
    vg_device_totals t;
    CHECK_EQ(vg_devices_totals(4, &t), VG_ERR_INVALID);
    CHECK_EQ(vg_devices_totals(-1, &t), VG_ERR_INVALID);
    CHECK_EQ(vg_devices_totals(VG_MAX_DEVICES, &t), VG_ERR_INVALID);
    CHECK_EQ(vg_devices_pool_reservations(4, NULL, 0), 0);
    vg_devices_reset_peaks(VG_MAX_DEVICES); /* nothing to do, nothing broken */
    vg_devices_reset_accumulated(-1);
    CHECK_EQ(vg_devices_set_budget(5, 0, 0.0), VG_OK); /* makes device 5's heap */
    CHECK(!vg_devices_existing(4));
    CHECK_EQ(vg_devices_begin_pool(4, 1, 1, only_capture, NULL, NULL), VG_OK);
    CHECK(vg_devices_existing(4));
    CHECK_EQ(vg_devices_totals(4, &t), VG_OK);
    CHECK_EQ(t.pools, 1);
    CHECK_EQ(vg_devices_end_pool(4, 1, 1), VG_OK);
    CHECK_EQ(vg_devices_release_pool(4, 1, 1), VG_OK);
    CHECK_EQ(vg_devices_totals(4, &t), VG_OK);
    CHECK_EQ(t.pools, 0);
}

/* A lower budget with a pool holding memory trims the device heap's idle
 * pages to what the pool leaves it. */
static void test_lower_budget_trims_to_what_pools_leave(void)
{
    const int dev = 6;
    vg_oom_info oom;
    void *a = alloc(dev, 30 * MiB, 0, &oom);
    CHECK(a);
    vg_devices_free(a, dev); /* 30 MiB mapped, idle */
    CHECK_EQ(vg_devices_begin_pool(dev, 2, 2, only_capture, NULL, NULL), VG_OK);
    void *g = alloc(dev, 20 * MiB, CAPTURE, &oom);
    CHECK(g);
    CHECK_EQ(vg_devices_end_pool(dev, 2, 2), VG_OK);
    CHECK_EQ(vg_devices_set_budget(dev, 36 * MiB, 0.0), VG_OK);
    CHECK(RESERVED(heap_stats(dev)) <= (int64_t)(16 * MiB));
    CHECK_EQ(RESERVED(totals(dev).stats), RESERVED(heap_stats(dev)) + 20 * MiB);
    vg_devices_free(g, dev);
    CHECK_EQ(vg_devices_release_pool(dev, 2, 2), VG_OK);
}

/* Seeded random allocations and frees on a device heap and a pool under
 * one budget, one after the other: the sum never passes the budget, the
 * device's figures are the heap's plus the pools' at every step, and each
 * peak is at least its current. */
static void test_random_sequence_keeps_one_budget(void)
{
    enum { SLOTS = 24, STEPS = 3000 };
    const int dev = 7;
    const size_t budget = 48 * MiB;
    CHECK_EQ(vg_devices_set_budget(dev, budget, 0.0), VG_OK);
    CHECK_EQ(vg_devices_begin_pool(dev, 5, 5, only_capture, NULL, NULL), VG_OK);
    void *slot[SLOTS] = {0};
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    size_t refusals = 0;
    for (int step = 0; step < STEPS; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        unsigned r = (unsigned)(seed >> 33);
        int i = (int)(r % SLOTS);
        if (slot[i]) {
            vg_devices_free(slot[i], dev);
            slot[i] = NULL;
        } else {
            size_t size = ((size_t)(r >> 8) % (6 * MiB)) + 1;
            vg_oom_info oom;
            slot[i] = alloc(dev, size, i % 2 ? CAPTURE : 0, &oom);
            if (!slot[i]) {
                CHECK_EQ(oom.status, VG_ERR_NOMEM);
                refusals++;
            }
        }
        vg_device_totals t = totals(dev);
        vg_stats heap = heap_stats(dev);
        CHECK_EQ(RESERVED(t.stats), RESERVED(heap) + t.pools_reserved);
        CHECK_EQ(ALLOCATED(t.stats), ALLOCATED(heap) + t.pools_allocated);
        CHECK((size_t)RESERVED(t.stats) <= budget);
        CHECK(t.stats.reserved_bytes[VG_STAT_ALL].peak >= RESERVED(t.stats));
        CHECK(t.stats.allocated_bytes[VG_STAT_ALL].peak >= ALLOCATED(t.stats));
        CHECK(t.stats.reserved_bytes[VG_STAT_ALL].peak <= (int64_t)budget);
    }
    CHECK(refusals > 0); /* the budget was met */
    for (int i = 0; i < SLOTS; i++) vg_devices_free(slot[i], dev);
    CHECK_EQ(vg_devices_end_pool(dev, 5, 5), VG_OK);
    CHECK_EQ(vg_devices_release_pool(dev, 5, 5), VG_OK);
    CHECK_EQ(totals(dev).pools_reserved, 0);
    CHECK_HEAP(vg_devices_existing(dev));
}

/* Threads allocating on the heap, in a pool, and reading the device's
 * figures at once (for ThreadSanitizer): afterwards the figures add up,
 * and the budget was passed by at most one racing segment (8 MiB here). */
enum { THREAD_ROUNDS = 400 };
static const int THREADED_DEVICE = 8;

static void *allocate_and_free(void *arg)
{
    vg_stream_t stream = (vg_stream_t)(uintptr_t)arg;
    vg_oom_info oom;
    for (int i = 0; i < THREAD_ROUNDS; i++) {
        void *p = alloc(THREADED_DEVICE, (size_t)(1 + i % 4) * 2 * MiB, stream, &oom);
        vg_devices_free(p, THREADED_DEVICE);
    }
    return NULL;
}

static void *read_figures(void *arg)
{
    int64_t *highest = arg;
    for (int i = 0; i < THREAD_ROUNDS; i++) {
        vg_device_totals t = totals(THREADED_DEVICE);
        if (RESERVED(t.stats) > *highest) *highest = RESERVED(t.stats);
    }
    return NULL;
}

static void test_threads_share_one_budget(void)
{
    const size_t budget = 24 * MiB;
    CHECK_EQ(vg_devices_set_budget(THREADED_DEVICE, budget, 0.0), VG_OK);
    CHECK_EQ(vg_devices_begin_pool(THREADED_DEVICE, 4, 4, only_capture, NULL, NULL), VG_OK);
    int64_t highest = 0;
    pthread_t heap_thread, pool_thread, reader;
    pthread_create(&heap_thread, NULL, allocate_and_free, (void *)(uintptr_t)0);
    pthread_create(&pool_thread, NULL, allocate_and_free, (void *)(uintptr_t)CAPTURE);
    pthread_create(&reader, NULL, read_figures, &highest);
    pthread_join(heap_thread, NULL);
    pthread_join(pool_thread, NULL);
    pthread_join(reader, NULL);
    CHECK(highest <= (int64_t)(budget + 8 * MiB));
    vg_device_totals t = totals(THREADED_DEVICE);
    CHECK_EQ(RESERVED(t.stats), RESERVED(heap_stats(THREADED_DEVICE)) + t.pools_reserved);
    CHECK_EQ(ALLOCATED(t.stats), 0);
    CHECK_EQ(vg_devices_end_pool(THREADED_DEVICE, 4, 4), VG_OK);
    CHECK_EQ(vg_devices_release_pool(THREADED_DEVICE, 4, 4), VG_OK);
    CHECK_EQ(totals(THREADED_DEVICE).pools_reserved, 0);
}

/* A pool that goes leaves what it counted in the device's totals: 10 MiB
 * on the heap and 20 in a pool, the pool's block freed and the pool
 * released, the device has allocated 30 MiB and freed 20 of them, and
 * reserved and released one 20 MiB segment, until reset_accumulated. */
static void test_gone_pool_stays_in_totals(void)
{
    const int dev = 10;
    vg_oom_info oom;
    void *a = alloc(dev, 10 * MiB, 0, &oom);
    CHECK_EQ(vg_devices_begin_pool(dev, 5, 5, only_capture, NULL, NULL), VG_OK);
    void *g = alloc(dev, 20 * MiB, CAPTURE, &oom);
    CHECK(a && g);
    CHECK_EQ(vg_devices_end_pool(dev, 5, 5), VG_OK);
    vg_devices_free(g, dev);
    CHECK_EQ(vg_devices_release_pool(dev, 5, 5), VG_OK);

    vg_stats heap = heap_stats(dev);
    vg_device_totals t = totals(dev);
    CHECK_EQ(t.pools, 0);
    const vg_stat *al = &t.stats.allocated_bytes[VG_STAT_ALL];
    CHECK_EQ(al->current, 10 * MiB);
    CHECK_EQ(al->allocated, 30 * MiB);
    CHECK_EQ(al->freed, 20 * MiB);
    CHECK_EQ(al->peak, 30 * MiB);
    const vg_stat *rs = &t.stats.reserved_bytes[VG_STAT_ALL];
    CHECK_EQ(rs->current, 10 * MiB);
    CHECK_EQ(rs->allocated, 30 * MiB);
    CHECK_EQ(rs->freed, 20 * MiB);
    CHECK_EQ(t.stats.allocation[VG_STAT_ALL].allocated, 2);
    CHECK_EQ(t.stats.allocation[VG_STAT_ALL].freed, 1);
    CHECK_EQ(t.stats.segment[VG_STAT_LARGE].freed, heap.segment[VG_STAT_LARGE].freed + 1);
    CHECK_EQ(t.stats.num_device_alloc, heap.num_device_alloc + 1);
    CHECK_EQ(t.stats.num_device_free, heap.num_device_free + 1);
    CHECK_EQ(t.stats.num_cache_misses, heap.num_cache_misses + 1);

    /* A peak reset keeps the totals; an accumulated reset clears them all. */
    vg_devices_reset_peaks(dev);
    t = totals(dev);
    CHECK_EQ(t.stats.allocated_bytes[VG_STAT_ALL].allocated, 30 * MiB);
    CHECK_EQ(t.stats.allocated_bytes[VG_STAT_ALL].peak, 10 * MiB);
    CHECK_EQ(t.stats.num_device_free, heap.num_device_free + 1);
    vg_devices_reset_accumulated(dev);
    t = totals(dev);
    CHECK_EQ(t.stats.allocated_bytes[VG_STAT_ALL].allocated, 0);
    CHECK_EQ(t.stats.allocated_bytes[VG_STAT_ALL].freed, 0);
    CHECK_EQ(t.stats.reserved_bytes[VG_STAT_ALL].freed, 0);
    CHECK_EQ(t.stats.allocated_bytes[VG_STAT_ALL].current, 10 * MiB);
    CHECK_EQ(t.stats.num_device_alloc, 0);
    CHECK_EQ(t.stats.num_device_free, 0);
    vg_devices_free(a, dev);
    t = totals(dev);
    CHECK_EQ(t.stats.allocated_bytes[VG_STAT_ALL].freed, 10 * MiB);
    CHECK_EQ(t.stats.allocated_bytes[VG_STAT_ALL].allocated, 0);
}

/* A capture's request refused in its pool while the device heap caches
 * idle memory under the shared budget: 24 MiB cached on the heap, 16 asked
 * in the pool under 32. The cache stays (nothing may be freed during a
 * capture); the report keeps the heap's figures and the pool's apart,
 * says the request came from a capture, and what would free the cache. */
static void test_pool_refusal_names_the_device_cache(void)
{
    const int dev = 11;
    CHECK_EQ(vg_devices_set_budget(dev, 32 * MiB, 0.0), VG_OK);
    vg_oom_info oom;
    void *a = alloc(dev, 24 * MiB, 0, &oom);
    CHECK(a);
    vg_devices_free(a, dev);
    CHECK_EQ(RESERVED(heap_stats(dev)), 24 * MiB);
    CHECK_EQ(vg_devices_begin_pool(dev, 2, 2, only_capture, NULL, NULL), VG_OK);
    CHECK(!alloc(dev, 16 * MiB, CAPTURE, &oom));
    CHECK_EQ(RESERVED(heap_stats(dev)), 24 * MiB);
    CHECK_EQ(oom.status, VG_ERR_NOMEM);
    CHECK(oom.in_private_pool);
    CHECK(oom.budget_refused);
    CHECK_EQ(oom.pools_reserved, 0);
    CHECK_EQ(oom.reserved, 24 * MiB); /* the device heap's */
    CHECK_EQ(oom.allocated, 0);
    CHECK_EQ(oom.free_bytes, 0); /* the pool's */
    CHECK_EQ(oom.largest_free_block, 0);
    char msg[2048];
    vg_format_oom(&oom, "CUDA", msg, sizeof msg);
    CHECK(strstr(msg, "Of the allocated memory 0 bytes is allocated by PyTorch, and 24.00 MiB is "
                      "reserved by PyTorch but unallocated. vramguard's budget is 32.00 MiB."));
    CHECK(strstr(msg, "\nvramguard: the budget (32.00 MiB) is the limit"));
    CHECK(!strstr(msg, "CUDA graph private pools hold"));
    CHECK(strstr(msg, " This request came from a capture and was refused in its graph's pool. "
                      "The device heap caches 24.00 MiB unallocated, counted in the budget, which "
                      "cannot be released during a capture: torch.cuda.empty_cache() before the "
                      "capture would free it (torch.cuda.graph calls it on entry; "
                      "CUDAGraph.capture_begin does not)."));
    CHECK_EQ(vg_devices_end_pool(dev, 2, 2), VG_OK);
    CHECK_EQ(vg_devices_release_pool(dev, 2, 2), VG_OK);
}

/* Fragmentation in a graph's pool is told in the pool's figures, not in
 * the device heap's cache, which a capture's request cannot use. */
static void test_pool_fragmentation_in_pool_figures(void)
{
    vg_oom_info o;
    memset(&o, 0, sizeof o);
    o.status = VG_ERR_NOMEM;
    o.requested = o.rounded = 4 * MiB;
    o.device_total = o.device_free = 1024 * MiB;
    o.reserved = 24 * MiB; /* the device heap's, all idle */
    o.in_private_pool = 1;
    o.free_bytes = 5 * MiB; /* the pool's */
    o.free_blocks = 2;
    o.largest_free_block = 3 * MiB;
    o.pools = 1;
    o.pools_reserved = 12 * MiB;
    o.pools_allocated = 7 * MiB;
    char msg[2048];
    vg_format_oom(&o, "CUDA", msg, sizeof msg);
    CHECK(strstr(msg, "fragmentation: 5.00 MiB is cached but unallocated in the graph's pool, yet "
                      "its largest free block is 3.00 MiB."));
    CHECK(strstr(msg, "The device heap caches 24.00 MiB unallocated, which cannot be released"));

    /* No fragmentation and no budget: live tensors, the pools' included. */
    o.free_bytes = 3 * MiB;
    o.allocated = 20 * MiB;
    o.reserved = 20 * MiB;
    vg_format_oom(&o, "CUDA", msg, sizeof msg);
    CHECK(strstr(msg, "\nvramguard: live tensors hold 27.00 MiB of 1.00 GiB. Lower the batch"));
    CHECK(strstr(msg, "refused in its graph's pool."));
    CHECK(!strstr(msg, "The device heap caches"));
}

/* A peak reset made on the device heap itself is seen at the next look,
 * even when the heap's new peak has passed its old one by then: 10 MiB on
 * the heap and 20 in a pool (30 at the peak), both freed, the heap's peaks
 * reset, 12 MiB on the heap: the device's allocated peak is 12 MiB. */
static void test_heap_peak_reset_seen_by_device(void)
{
    const int dev = 12;
    vg_oom_info oom;
    void *a = alloc(dev, 10 * MiB, 0, &oom);
    CHECK_EQ(vg_devices_begin_pool(dev, 6, 6, only_capture, NULL, NULL), VG_OK);
    void *g = alloc(dev, 20 * MiB, CAPTURE, &oom);
    CHECK(a && g);
    CHECK_EQ(vg_devices_end_pool(dev, 6, 6), VG_OK);
    CHECK_EQ(totals(dev).stats.allocated_bytes[VG_STAT_ALL].peak, 30 * MiB);
    vg_devices_free(g, dev);
    vg_devices_free(a, dev);
    CHECK_EQ(totals(dev).stats.allocated_bytes[VG_STAT_ALL].peak, 30 * MiB);
    uint64_t resets = heap_stats(dev).peak_resets;
    vg_heap_reset_peaks(vg_devices_existing(dev));
    CHECK_EQ(heap_stats(dev).peak_resets, resets + 1);
    void *b = alloc(dev, 12 * MiB, 0, &oom);
    CHECK(b);
    CHECK_EQ(totals(dev).stats.allocated_bytes[VG_STAT_ALL].peak, 12 * MiB);
    vg_devices_free(b, dev);
    CHECK_EQ(totals(dev).stats.allocated_bytes[VG_STAT_ALL].peak, 12 * MiB);
    CHECK_EQ(vg_devices_release_pool(dev, 6, 6), VG_OK);
}

/* A search that tried 50 MiB and freed it leaves the peaks as they were
 * (10 MiB), heap's and device's, and later allocations raise them from
 * there: the lowered heap peak is not taken for a new one. */
static void test_restore_peaks_forgets_what_ran_since(void)
{
    const int dev = 13;
    vg_oom_info oom;
    vg_device_peaks saved;
    CHECK_EQ(vg_devices_save_peaks(dev, &saved), VG_ERR_INVALID); /* no heap yet */
    void *a = alloc(dev, 10 * MiB, 0, &oom);
    CHECK(a);
    CHECK_EQ(vg_devices_save_peaks(dev, &saved), VG_OK);
    uint64_t resets = heap_stats(dev).peak_resets;
    void *b = alloc(dev, 50 * MiB, 0, &oom);
    CHECK(b);
    CHECK_EQ(totals(dev).stats.allocated_bytes[VG_STAT_ALL].peak, 60 * MiB);
    vg_devices_free(b, dev);
    vg_heap_empty_cache(vg_devices_existing(dev));
    CHECK_EQ(vg_devices_restore_peaks(dev, &saved), VG_OK);
    CHECK_EQ(totals(dev).stats.allocated_bytes[VG_STAT_ALL].peak, 10 * MiB);
    CHECK_EQ(heap_stats(dev).allocated_bytes[VG_STAT_ALL].peak, 10 * MiB);
    CHECK_EQ(totals(dev).stats.reserved_bytes[VG_STAT_ALL].peak, saved.device.reserved_bytes[VG_STAT_ALL].peak);
    CHECK_EQ(totals(dev).stats.allocation[VG_STAT_ALL].peak, 1);
    CHECK_EQ(heap_stats(dev).peak_resets, resets); /* not a reset */
    void *c = alloc(dev, 4 * MiB, 0, &oom);
    CHECK(c);
    CHECK_EQ(totals(dev).stats.allocated_bytes[VG_STAT_ALL].peak, 14 * MiB);
    vg_devices_free(c, dev);
    vg_devices_free(a, dev);
    /* Saved lower than what is live now: the peak is what is live. */
    CHECK_EQ(vg_devices_save_peaks(dev, &saved), VG_OK);
    void *d = alloc(dev, 30 * MiB, 0, &oom);
    CHECK(d);
    CHECK_EQ(vg_devices_restore_peaks(dev, &saved), VG_OK);
    CHECK_EQ(totals(dev).stats.allocated_bytes[VG_STAT_ALL].peak, 30 * MiB);
    CHECK_EQ(heap_stats(dev).allocated_bytes[VG_STAT_ALL].peak, 30 * MiB);
    vg_devices_free(d, dev);
    CHECK_EQ(vg_devices_restore_peaks(VG_MAX_DEVICES, &saved), VG_ERR_INVALID);
}

static const harness_test tests[] = {
    {"test_restore_peaks_forgets_what_ran_since", test_restore_peaks_forgets_what_ran_since},
    {"test_threads_share_one_budget", test_threads_share_one_budget},
    {"test_random_sequence_keeps_one_budget", test_random_sequence_keeps_one_budget},
    {"test_budget_counts_pool_memory", test_budget_counts_pool_memory},
    {"test_device_figures_include_pools", test_device_figures_include_pools},
    {"test_heap_peak_with_pool_is_the_sum", test_heap_peak_with_pool_is_the_sum},
    {"test_pool_first_makes_the_device_heap", test_pool_first_makes_the_device_heap},
    {"test_lower_budget_trims_to_what_pools_leave", test_lower_budget_trims_to_what_pools_leave},
    {"test_gone_pool_stays_in_totals", test_gone_pool_stays_in_totals},
    {"test_pool_refusal_names_the_device_cache", test_pool_refusal_names_the_device_cache},
    {"test_pool_fragmentation_in_pool_figures", test_pool_fragmentation_in_pool_figures},
    {"test_heap_peak_reset_seen_by_device", test_heap_peak_reset_seen_by_device},
};

int main(int argc, char **argv)
{
    if (vg_devices_simulate((size_t)1 << 30) != VG_OK) return 1;
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
