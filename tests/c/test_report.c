/* What reports read: the interval peak (exact after known sequences, and
 * under threads), the heap's state copied for a report, and the device
 * heaps' last out-of-memory. */
#include "vramguard/devices.h"
#include "vramguard/report.h"
#include "harness.h"

#include <pthread.h>
#include <string.h>

static const size_t MiB = (size_t)1 << 20;

static vg_heap *sim_heap(size_t capacity, vg_device **dev)
{
    *dev = vg_sim_create(capacity);
    vg_heap_config cfg = {&vg_policy_default, 0, 0.0}; /* segments: the state copy counts idle segments */
    return vg_heap_create(*dev, &cfg);
}

static void destroy(vg_heap *h, vg_device *dev)
{
    vg_heap_destroy(h);
    dev->ops->destroy(dev);
}

static void test_interval_peak_is_the_highest_since_the_last_take(void)
{
    vg_device *dev;
    vg_heap *h = sim_heap(1024 * MiB, &dev);
    vg_interval iv;
    vg_heap_take_interval(h, &iv);
    CHECK_EQ(iv.peak, 0);
    void *a = vg_heap_alloc(h, 10 * MiB, 0, NULL);
    void *b = vg_heap_alloc(h, 30 * MiB, 0, NULL);
    vg_heap_free(h, b);
    vg_heap_reset_peaks(h); /* the stats' peak: another counter */
    vg_heap_take_interval(h, &iv);
    CHECK_EQ(iv.peak, 40 * MiB);
    CHECK_EQ(iv.current, 10 * MiB);
    CHECK_EQ(iv.allocated_total, 40 * MiB);
    vg_heap_take_interval(h, &iv); /* the next interval starts at current */
    CHECK_EQ(iv.peak, 10 * MiB);
    vg_heap_free(h, a);
    vg_heap_take_interval(h, &iv);
    CHECK_EQ(iv.peak, 10 * MiB);
    CHECK_EQ(iv.current, 0);
    CHECK_HEAP(h);
    destroy(h, dev);
}

static void test_state_copy_counts_live_blocks_by_power_of_two(void)
{
    vg_device *dev;
    vg_heap *h = sim_heap(1024 * MiB, &dev);
    void *small[4];
    for (int i = 0; i < 4; i++) small[i] = vg_heap_alloc(h, 512 * 1024, 0, NULL);
    void *big = vg_heap_alloc(h, 3 * MiB, 0, NULL);
    void *gone = vg_heap_alloc(h, 40 * MiB, 0, NULL);
    vg_heap_free(h, gone); /* an idle segment */
    vg_heap_free(h, small[1]);
    vg_heap_state st;
    vg_heap_state_copy(h, &st);
    CHECK_EQ(st.live_blocks[19], 3);          /* [512 KiB, 1 MiB) */
    CHECK_EQ(st.live_bytes[19], 3 * 512 * 1024);
    CHECK_EQ(st.live_blocks[21], 1);          /* [2 MiB, 4 MiB) */
    CHECK_EQ(st.live_bytes[21], 3 * MiB);
    CHECK_EQ(st.idle_segments, 1);
    CHECK_EQ(st.idle_segment_bytes, 40 * MiB);
    CHECK_EQ(st.segments, 3);
    CHECK_EQ(st.stats.allocated_bytes[VG_STAT_ALL].current, 3 * 512 * 1024 + 3 * MiB);
    CHECK_EQ(st.frag.free_bytes, (uint64_t)st.stats.reserved_bytes[VG_STAT_ALL].current -
                                     (uint64_t)st.stats.allocated_bytes[VG_STAT_ALL].current);
    CHECK_EQ(st.stats.segment[VG_STAT_ALL].current, 3);
    for (int i = 0; i < 4; i++)
        if (i != 1) vg_heap_free(h, small[i]);
    vg_heap_free(h, big);
    destroy(h, dev);
}

static void test_last_oom_of_the_device_heaps(void)
{
    /* The registry is the process's: this test owns device 0's heap. */
    CHECK_EQ(vg_devices_simulate(256 * MiB), VG_OK);
    vg_oom_record rec;
    CHECK_EQ(vg_devices_last_oom(&rec), 0);
    void *keep = NULL;
    vg_oom_info oom;
    CHECK_EQ(vg_devices_alloc(100 * MiB, 0, 0, &keep, &oom), VG_OK);
    void *p = NULL;
    CHECK_EQ(vg_devices_alloc(200 * MiB, 0, 0, &p, &oom), VG_ERR_NOMEM);
    CHECK_EQ(vg_devices_last_oom_seq(), 1);
    CHECK_EQ(vg_devices_last_oom(&rec), 1);
    CHECK_EQ(rec.info.requested, 200 * MiB);
    CHECK_EQ(rec.info.allocated, 100 * MiB);
    CHECK_EQ(rec.state.live_blocks[26], 1); /* [64 MiB, 128 MiB) */
    CHECK_EQ(rec.state.stats.num_ooms, 1);
    /* A heap outside the registry fails without being recorded. */
    vg_device *dev;
    vg_heap *h = sim_heap(64 * MiB, &dev);
    CHECK(vg_heap_alloc(h, 128 * MiB, 0, &oom) == NULL);
    CHECK_EQ(vg_devices_last_oom_seq(), 1);
    destroy(h, dev);
    vg_devices_free(keep, 0);
}

/* The largest request that could be allocated now, with segments: the
 * device's room plus the wholly free segments an OOM's ladder releases,
 * and true: that much is allocated, a granule more is not. */
static void test_largest_allocatable_with_segments(void)
{
    vg_device *dev;
    vg_heap *h = sim_heap(64 * MiB, &dev);
    void *a = vg_heap_alloc(h, 20 * MiB, 0, NULL);
    void *b = vg_heap_alloc(h, 12 * MiB, 0, NULL);
    vg_heap_free(h, b); /* a wholly free segment */
    vg_fragmentation fr;
    vg_heap_fragmentation(h, &fr);
    CHECK_EQ(fr.releasable_bytes, 12 * MiB);
    CHECK_EQ(fr.largest_allocatable, 44 * MiB); /* 32 MiB unreserved + 12 MiB idle */
    vg_oom_info oom;
    CHECK(vg_heap_alloc(h, 46 * MiB, 0, &oom) == NULL);
    CHECK_EQ(oom.largest_allocatable, 44 * MiB); /* the ladder released b's segment */
    CHECK_EQ(oom.device_free, 44 * MiB);
    void *c = vg_heap_alloc(h, 44 * MiB, 0, NULL);
    CHECK(c != NULL);
    vg_heap_fragmentation(h, &fr);
    CHECK_EQ(fr.largest_allocatable, 0);
    vg_heap_free(h, c);
    vg_heap_free(h, a);
    CHECK_HEAP(h);
    destroy(h, dev);
}

/* Threads allocate and free while another takes intervals: every take's
 * peak is at least its current, and the last is the highest since. */
typedef struct churn_arg {
    vg_heap *h;
    int rounds;
} churn_arg;

static void *churn(void *p)
{
    churn_arg *arg = p;
    for (int i = 0; i < arg->rounds; i++) {
        void *a = vg_heap_alloc(arg->h, (size_t)(1 + i % 7) * 4096, 0, NULL);
        vg_heap_free(arg->h, a);
    }
    return NULL;
}

static void test_interval_takes_while_threads_allocate(void)
{
    vg_device *dev;
    vg_heap *h = sim_heap(1024 * MiB, &dev);
    churn_arg arg = {h, 20000};
    pthread_t threads[3];
    for (int t = 0; t < 3; t++) pthread_create(&threads[t], NULL, churn, &arg);
    int bad = 0;
    for (int i = 0; i < 2000; i++) {
        vg_interval iv;
        vg_heap_take_interval(h, &iv);
        if (iv.peak < iv.current || iv.peak > 3 * 7 * 4096) bad++;
    }
    for (int t = 0; t < 3; t++) pthread_join(threads[t], NULL);
    CHECK_EQ(bad, 0);
    vg_interval iv;
    vg_heap_take_interval(h, &iv);
    CHECK_EQ(iv.current, 0);
    CHECK_HEAP(h);
    destroy(h, dev);
}

#define T(fn) {#fn, fn}
static const harness_test tests[] = {
    T(test_interval_peak_is_the_highest_since_the_last_take),
    T(test_state_copy_counts_live_blocks_by_power_of_two),
    T(test_last_oom_of_the_device_heaps),
    T(test_largest_allocatable_with_segments),
    T(test_interval_takes_while_threads_allocate),
};

int main(int argc, char **argv)
{
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
