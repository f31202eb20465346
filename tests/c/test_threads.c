/* Many threads on one heap, and on the per-device heaps of the registry:
 * allocating, freeing, recording streams, completing them, reading every
 * report, changing settings. Seeded; the interleaving is the scheduler's, so
 * what is checked is what holds whatever it was: the invariants, and totals
 * that each thread counted for itself. Built plain, under ASan+UBSan and
 * under ThreadSanitizer (make test-c-tsan), where a data race fails it. */
#include "harness.h"
#include "lock.h"
#include "vramguard/devices.h"
#include "vramguard/history.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

#define WORKERS 3
#define SLOTS 48
#define OPS 20000
#define STREAMS 4

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Mostly small blocks, some of several MiB: both pools, splits and new
 * segments. */
static size_t draw_size(uint64_t *rng)
{
    uint64_t r = rng_next(rng);
    if (r % 8 == 0) return 1 + (size_t)(r >> 8) % (6 * MiB);
    return 1 + (size_t)(r >> 8) % (64 * KiB);
}

/* ------------------------------------------------------------------ */
/* The lock on its own                                                 */
/* ------------------------------------------------------------------ */

typedef struct lock_job {
    vg_lock *lock;
    uint64_t *counter; /* plain memory: only the lock protects it */
    int rounds;
} lock_job;

static void *lock_main(void *arg)
{
    lock_job *job = arg;
    for (int i = 0; i < job->rounds; i++) {
        vg_lock_acquire(job->lock);
        uint64_t v = *job->counter;
        /* Now and then hold it long enough that waiters stop spinning and
         * sleep, as they do behind a device call. */
        if (i % 64 == 0) nanosleep(&(struct timespec){0, 50000}, NULL);
        *job->counter = v + 1;
        vg_lock_release(job->lock);
    }
    return NULL;
}

static void test_lock_excludes_and_wakes_sleepers(void)
{
    enum { THREADS = 4, ROUNDS = 5000 };
    vg_lock lock;
    vg_lock_init(&lock);
    uint64_t counter = 0;
    pthread_t tid[THREADS];
    lock_job job = {&lock, &counter, ROUNDS};
    for (int i = 0; i < THREADS; i++) CHECK_EQ(pthread_create(&tid[i], NULL, lock_main, &job), 0);
    for (int i = 0; i < THREADS; i++) pthread_join(tid[i], NULL);
    CHECK_EQ(counter, THREADS * ROUNDS);
    CHECK_EQ(atomic_load(&lock.state), 0);
}

/* A waiter behind a long holder (a device call) sleeps: the CPU time it
 * uses while waiting is a small part of the time it waits, not all of it
 * as a spinning or yielding waiter's is. */
typedef struct waiter_job {
    vg_lock *lock;
    atomic_int started;
    double cpu_s;
} waiter_job;

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *waiter_main(void *arg)
{
    waiter_job *job = arg;
    double t0 = thread_cpu_s();
    atomic_store(&job->started, 1);
    vg_lock_acquire(job->lock);
    job->cpu_s = thread_cpu_s() - t0;
    vg_lock_release(job->lock);
    return NULL;
}

static void test_lock_waiter_sleeps_behind_a_long_holder(void)
{
    vg_lock lock;
    vg_lock_init(&lock);
    waiter_job job = {&lock, 0, 0.0};
    pthread_t tid;
    vg_lock_acquire(&lock);
    CHECK_EQ(pthread_create(&tid, NULL, waiter_main, &job), 0);
    while (!atomic_load(&job.started)) sched_yield();
    const double held_s = 0.2;
    nanosleep(&(struct timespec){0, (long)(held_s * 1e9)}, NULL);
    vg_lock_release(&lock);
    pthread_join(tid, NULL);
    CHECK(job.cpu_s < held_s / 5);
}

/* ------------------------------------------------------------------ */
/* One heap                                                            */
/* ------------------------------------------------------------------ */

/* What a worker did, counted by the worker. */
typedef struct tally {
    uint64_t allocs, ooms, frees, records, deferred;
} tally;

typedef struct worker {
    vg_heap *heap;
    int device;        /* -1: use `heap`; else the registry's device heaps */
    uint64_t seed;
    vg_stream_t stream;
    tally t;
    int errors;
} worker;

typedef struct slot {
    void *ptr;
    int device;
    int recorded;
} slot;

static void *alloc_on(worker *w, size_t size, int device)
{
    if (w->device < 0) return vg_heap_alloc(w->heap, size, w->stream, NULL);
    void *p = NULL;
    vg_oom_info oom;
    int rc = vg_devices_alloc(size, device, w->stream, &p, &oom);
    if (rc != VG_OK && rc != VG_ERR_NOMEM) w->errors++;
    return p;
}

/* On the block's own device: each device's heap is asked directly (each
 * simulated device has its own 4 TiB of addresses, so none would be found
 * in another's heap; this is the shorter way). */
static int record_on(worker *w, const slot *s, vg_stream_t stream)
{
    vg_heap *h = w->device < 0 ? w->heap : vg_devices_existing(s->device);
    return vg_heap_record_stream(h, s->ptr, stream);
}

static void free_on(worker *w, slot *s)
{
    if (w->device < 0) w->errors += vg_heap_free(w->heap, s->ptr) != VG_OK;
    else vg_devices_free(s->ptr, s->device);
    w->t.frees++;
    w->t.deferred += (uint64_t)s->recorded;
    *s = (slot){NULL, 0, 0};
}

/* What a training loop reads between steps, while another thread may be
 * changing the settings; and, on the registry, an error of its own. */
static void read_between_steps(worker *w, int device)
{
    vg_heap *h = w->device < 0 ? w->heap : vg_devices_existing(device);
    if (h) {
        vg_stats st;
        vg_heap_stats(h, &st);
        (void)vg_heap_budget(h);
        (void)vg_heap_gc_threshold(h);
        (void)vg_heap_device_total(h);
    }
    if (w->device >= 0 && (vg_devices_heap(VG_MAX_DEVICES) || !vg_devices_error()[0])) w->errors++;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    uint64_t rng = w->seed;
    slot slots[SLOTS] = {{NULL, 0, 0}};
    for (int i = 0; i < OPS; i++) {
        if (i % 64 == 0) read_between_steps(w, i / 64 % WORKERS);
        slot *s = &slots[rng_next(&rng) % SLOTS];
        uint64_t action = rng_next(&rng) % 8;
        if (s->ptr && action == 0 && !s->recorded) {
            /* Another stream reads it: its free waits for that stream. */
            vg_stream_t other = 100 + (vg_stream_t)(rng_next(&rng) % STREAMS);
            if (record_on(w, s, other) == VG_OK) {
                s->recorded = 1;
                w->t.records++;
            } else {
                w->errors++;
            }
        } else if (s->ptr) {
            free_on(w, s);
        } else {
            int device = w->device < 0 ? 0 : (int)(rng_next(&rng) % WORKERS);
            s->ptr = alloc_on(w, draw_size(&rng), device);
            s->device = device;
            if (s->ptr) w->t.allocs++;
            else w->t.ooms++;
        }
    }
    for (int k = 0; k < SLOTS; k++)
        if (slots[k].ptr) free_on(w, &slots[k]);
    return NULL;
}

static void spawn_workers(worker *workers, pthread_t *tid, vg_heap *heap, int device_heaps)
{
    for (int i = 0; i < WORKERS; i++) {
        workers[i] = (worker){heap, device_heaps ? 0 : -1, 1000 + (uint64_t)i,
                              (vg_stream_t)(i + 1), {0, 0, 0, 0, 0}, 0};
        pthread_create(&tid[i], NULL, worker_main, &workers[i]);
    }
}

static tally join_workers(worker *workers, pthread_t *tid, int *errors)
{
    tally sum = {0, 0, 0, 0, 0};
    for (int i = 0; i < WORKERS; i++) {
        pthread_join(tid[i], NULL);
        sum.allocs += workers[i].t.allocs;
        sum.ooms += workers[i].t.ooms;
        sum.frees += workers[i].t.frees;
        sum.records += workers[i].t.records;
        sum.deferred += workers[i].t.deferred;
        *errors += workers[i].errors;
    }
    return sum;
}

/* Reads everything a report reads, and changes what a user changes, until
 * the workers are done. */
typedef struct observer {
    vg_heap *heap;
    vg_device *dev;
    atomic_int *done;
    uint64_t reads;
} observer;

static int count_segment(void *arg, const vg_segment_info *si)
{
    (*(uint64_t *)arg) += si->blocks;
    return 0;
}

static void read_everything(vg_heap *h)
{
    vg_stats st;
    vg_fragmentation fr;
    uint64_t lower[VG_SIZE_CLASSES], counts[VG_SIZE_CLASSES], blocks = 0;
    vg_history_event ev[64];
    uint64_t dropped;
    vg_heap_stats(h, &st);
    vg_heap_fragmentation(h, &fr);
    vg_heap_histogram(h, lower, counts, VG_SIZE_CLASSES);
    vg_heap_visit(h, count_segment, NULL, &blocks);
    vg_heap_history_take(h, ev, 64, &dropped);
    (void)vg_heap_budget(h);
    (void)vg_heap_gc_threshold(h);
    (void)vg_heap_device_total(h);
    (void)vg_heap_check(h);
}

static void *observer_main(void *arg)
{
    observer *o = arg;
    uint64_t rng = 77;
    while (!atomic_load(o->done)) {
        read_everything(o->heap);
        switch (rng_next(&rng) % 6) {
        case 0: vg_heap_set_budget(o->heap, rng_next(&rng) % 2 ? 96 * MiB : 0); break;
        case 1: vg_heap_set_gc_threshold(o->heap, rng_next(&rng) % 2 ? 0.8 : 0.0); break;
        case 2: vg_sim_complete_stream(o->dev, 100 + (vg_stream_t)(rng_next(&rng) % STREAMS)); break;
        case 3: vg_heap_synchronize(o->heap); break;
        case 4: vg_heap_empty_cache(o->heap); break;
        default: vg_heap_reset_peaks(o->heap); (void)vg_sim_used(o->dev); break;
        }
        o->reads++;
    }
    return NULL;
}

/* Every block freed and every deferred free finished: the heap holds
 * nothing live, and its counters agree with what the workers counted. */
#define CHECK_QUIET_HEAP(h, dev)                                                       \
    do {                                                                               \
        vg_heap_synchronize(h);                                                        \
        CHECK_HEAP(h);                                                                 \
        vg_stats st_;                                                                  \
        vg_heap_stats(h, &st_);                                                        \
        CHECK_EQ(st_.allocation[VG_STAT_ALL].current, 0);                              \
        CHECK_EQ(st_.active[VG_STAT_ALL].current, 0);                                  \
        CHECK_EQ(st_.requested_bytes[VG_STAT_ALL].current, 0);                         \
        CHECK_EQ(st_.reserved_bytes[VG_STAT_ALL].current, vg_sim_used(dev));           \
        CHECK_EQ(st_.num_invalid_frees, 0);                                            \
    } while (0)

static void test_one_heap_many_threads(void)
{
    vg_device *dev = vg_sim_create(64 * GiB);
    vg_heap_config cfg = {NULL, 0, 0};
    vg_heap *heap = vg_heap_create(dev, &cfg);
    CHECK_EQ(vg_heap_history_start(heap, 4096), VG_OK);
    atomic_int done = 0;
    observer obs = {heap, dev, &done, 0};
    pthread_t otid, tid[WORKERS];
    worker workers[WORKERS];
    pthread_create(&otid, NULL, observer_main, &obs);
    spawn_workers(workers, tid, heap, 0);
    int errors = 0;
    tally sum = join_workers(workers, tid, &errors);
    atomic_store(&done, 1);
    pthread_join(otid, NULL);
    CHECK_EQ(errors, 0);
    CHECK(obs.reads > 0);
    CHECK_QUIET_HEAP(heap, dev);
    vg_stats st;
    vg_heap_stats(heap, &st);
    CHECK_EQ(st.allocation[VG_STAT_ALL].allocated, sum.allocs);
    CHECK_EQ(st.allocation[VG_STAT_ALL].freed, sum.frees);
    CHECK_EQ(sum.allocs, sum.frees);
    CHECK_EQ(st.num_ooms, sum.ooms);
    CHECK_EQ(st.num_record_stream, sum.records);
    CHECK_EQ(st.num_deferred_frees, sum.deferred);
    vg_heap_destroy(heap);
    dev->ops->destroy(dev);
}

/* ------------------------------------------------------------------ */
/* The registry's per-device heaps                                     */
/* ------------------------------------------------------------------ */

static void *configurer_main(void *arg)
{
    observer *o = arg;
    uint64_t rng = 99;
    while (!atomic_load(o->done)) {
        switch (rng_next(&rng) % 5) {
        case 0: vg_devices_configure(rng_next(&rng) % 2 ? 200 * MiB : 0, 0.0, 0.0); break;
        case 1: vg_devices_configure(0, 0.25, 0.5); break;
        case 2: vg_devices_set_budget((int)(rng_next(&rng) % WORKERS), 0, 0.5); break;
        case 3:
            /* A device out of range: an error message for this thread. */
            if (vg_devices_heap(-1) || !vg_devices_error()[0]) o->reads = UINT64_MAX;
            break;
        default: {
            vg_heap *h = vg_devices_existing((int)(rng_next(&rng) % WORKERS));
            if (h) {
                read_everything(h);
                vg_sim_complete_stream(vg_heap_device(h), 100 + (vg_stream_t)(rng_next(&rng) % STREAMS));
            }
            (void)vg_devices_simulated();
            break;
        }
        }
        if (o->reads != UINT64_MAX) o->reads++;
    }
    return NULL;
}

static void test_device_heaps_many_threads(void)
{
    CHECK_EQ(vg_devices_simulate(8 * GiB), VG_OK);
    atomic_int done = 0;
    observer conf = {NULL, NULL, &done, 0};
    pthread_t ctid, tid[WORKERS];
    worker workers[WORKERS];
    pthread_create(&ctid, NULL, configurer_main, &conf);
    spawn_workers(workers, tid, NULL, 1);
    int errors = 0;
    tally sum = join_workers(workers, tid, &errors);
    atomic_store(&done, 1);
    pthread_join(ctid, NULL);
    CHECK_EQ(errors, 0);
    CHECK(conf.reads != UINT64_MAX);
    uint64_t allocated = 0, freed = 0, ooms = 0, records = 0, deferred = 0;
    for (int d = 0; d < WORKERS; d++) {
        vg_heap *h = vg_devices_existing(d);
        CHECK(h);
        CHECK_QUIET_HEAP(h, vg_heap_device(h));
        vg_stats st;
        vg_heap_stats(h, &st);
        allocated += (uint64_t)st.allocation[VG_STAT_ALL].allocated;
        freed += (uint64_t)st.allocation[VG_STAT_ALL].freed;
        ooms += st.num_ooms;
        records += st.num_record_stream;
        deferred += st.num_deferred_frees;
    }
    CHECK_EQ(allocated, sum.allocs);
    CHECK_EQ(freed, sum.frees);
    CHECK_EQ(ooms, sum.ooms);
    CHECK_EQ(records, sum.records);
    CHECK_EQ(deferred, sum.deferred);
}

/* ------------------------------------------------------------------ */
/* No device wait under the heap's lock                                */
/* ------------------------------------------------------------------ */

enum waiting_call { WAIT_SYNCHRONIZE, WAIT_EMPTY_CACHE, WAIT_LADDER };

typedef struct device_waiter {
    vg_heap *heap;
    enum waiting_call call;
    vg_stream_t stream;
    void *block; /* WAIT_LADDER: what the allocation got */
} device_waiter;

static void *device_waiter_main(void *arg)
{
    device_waiter *w = arg;
    switch (w->call) {
    case WAIT_SYNCHRONIZE: vg_heap_synchronize(w->heap); break;
    case WAIT_EMPTY_CACHE: (void)vg_heap_empty_cache(w->heap); break;
    case WAIT_LADDER: w->block = vg_heap_alloc(w->heap, 6 * MiB, w->stream, NULL); break;
    }
    return NULL;
}

/* One thread is stopped inside the device's synchronize (the sim holds it
 * there) while this one reads the stats, frees a block and allocates one:
 * it could not if the waiting thread held the heap's lock (it would hang). */
static void check_heap_usable_during_wait(enum waiting_call call)
{
    vg_device *dev = vg_sim_create(8 * MiB);
    vg_heap_config cfg = {&vg_policy_default, 0, 0}; /* segments: the release below needs no wait */
    vg_heap *heap = vg_heap_create(dev, &cfg);
    void *big = vg_heap_alloc(heap, 6 * MiB, 0, NULL);
    void *small = vg_heap_alloc(heap, 1000, 0, NULL);
    CHECK(big && small);
    /* a deferred free, for empty_cache to synchronize for */
    CHECK_EQ(vg_heap_record_stream(heap, small, 7), VG_OK);
    CHECK_EQ(vg_heap_free(heap, small), VG_OK);
    vg_sim_hold_synchronize(dev, 1);
    device_waiter w = {heap, call, 0, NULL};
    pthread_t tid;
    pthread_create(&tid, NULL, device_waiter_main, &w);
    vg_sim_wait_for_held(dev, 1);
    vg_stats st;
    vg_heap_stats(heap, &st);
    CHECK_EQ(st.num_deferred_frees, 1);
    CHECK_EQ(vg_heap_free(heap, big), VG_OK);
    void *again = vg_heap_alloc(heap, 1000, 0, NULL);
    CHECK(again);
    CHECK_EQ(vg_heap_free(heap, again), VG_OK);
    vg_sim_hold_synchronize(dev, 0);
    pthread_join(tid, NULL);
    vg_heap_stats(heap, &st);
    CHECK_EQ(st.num_sync_all_streams, call == WAIT_LADDER);
    if (call == WAIT_LADDER) {
        /* after the wait the step looked again: big's block was free by then */
        CHECK(w.block == big);
        CHECK_EQ(st.num_cache_hits + st.num_cache_misses, st.allocation[VG_STAT_ALL].allocated);
        CHECK_EQ(vg_heap_free(heap, w.block), VG_OK);
    }
    CHECK_EQ(st.active[VG_STAT_ALL].current, call == WAIT_LADDER);
    CHECK_HEAP(heap);
    vg_heap_destroy(heap);
    dev->ops->destroy(dev);
}

static void test_synchronize_leaves_the_heap_usable(void)
{
    check_heap_usable_during_wait(WAIT_SYNCHRONIZE);
}

static void test_empty_cache_leaves_the_heap_usable_while_it_waits(void)
{
    check_heap_usable_during_wait(WAIT_EMPTY_CACHE);
}

static void test_ladder_leaves_the_heap_usable_while_it_waits(void)
{
    check_heap_usable_during_wait(WAIT_LADDER);
}

/* While an allocation for stream 5 waits for the device, another one for
 * stream 5 comes and goes, and the stream's only segment is released: the
 * waiting allocation's stream record must outlive both (ASan sees it if
 * not). */
static void test_stream_record_outlives_a_waiting_allocation(void)
{
    vg_device *dev = vg_sim_create(8 * MiB);
    vg_heap_config cfg = {&vg_policy_default, 0, 0}; /* segments: stream 5 has a segment of its own */
    vg_heap *heap = vg_heap_create(dev, &cfg);
    void *big = vg_heap_alloc(heap, 6 * MiB, 0, NULL);
    CHECK(big);
    vg_sim_hold_synchronize(dev, 1);
    device_waiter w = {heap, WAIT_LADDER, 5, NULL};
    pthread_t tid;
    pthread_create(&tid, NULL, device_waiter_main, &w);
    vg_sim_wait_for_held(dev, 1);
    void *small = vg_heap_alloc(heap, 1000, 5, NULL);
    CHECK(small);
    CHECK_EQ(vg_heap_free(heap, small), VG_OK);
    CHECK_EQ(vg_heap_empty_cache(heap), 2 * MiB); /* stream 5's only segment */
    CHECK_HEAP(heap); /* the waiting allocation's record is pinned */
    CHECK_EQ(vg_heap_free(heap, big), VG_OK);
    vg_sim_hold_synchronize(dev, 0);
    pthread_join(tid, NULL);
    CHECK(w.block); /* big's idle segment released, a segment for stream 5 */
    vg_stats st;
    vg_heap_stats(heap, &st);
    CHECK_EQ(st.num_sync_releases, 1);
    CHECK_EQ(vg_heap_free(heap, w.block), VG_OK);
    CHECK_HEAP(heap);
    vg_heap_destroy(heap);
    dev->ops->destroy(dev);
}

#define T(fn) {#fn, fn}
static const harness_test tests[] = {
    T(test_lock_excludes_and_wakes_sleepers),
    T(test_lock_waiter_sleeps_behind_a_long_holder),
    T(test_one_heap_many_threads),
    T(test_device_heaps_many_threads),
    T(test_synchronize_leaves_the_heap_usable),
    T(test_empty_cache_leaves_the_heap_usable_while_it_waits),
    T(test_ladder_leaves_the_heap_usable_while_it_waits),
    T(test_stream_record_outlives_a_waiting_allocation),
};

int main(int argc, char **argv)
{
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
