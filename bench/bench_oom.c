/* Out-of-memory pressure benchmark: N threads allocating and freeing under
 * a budget on one heap of the simulated device, for the segments policy
 * and the arena in the same process, repeats alternating between them so
 * that a busy neighbour slows both alike.
 *
 * Each thread keeps SLOTS slots and, per operation, picks one at random
 * (seeded per thread): an occupied slot is freed (the first LONG_SLOTS of
 * them only one visit in LONG_HOLD: tensors held for a while), an empty one
 * gets an allocation, small (512 B to 1 MiB) or large (1 MiB to MAX_LARGE,
 * log-uniform) as SMALL_PERCENT says. An allocation that returns NULL is an
 * OOM and leaves the slot empty. Near the budget many allocations fail:
 * what this measures is what a failing allocation costs, and what the
 * ladder's steps cost the allocations that succeed after them.
 *
 * The device is the simulated one behind a wrapper that counts every
 * provider call (and can make each cost some microseconds, as map, unmap
 * and synchronize do on a real GPU: --provider-us), so the report tells
 * the allocator's own time from the provider's.
 *
 * Per policy, medians over the repeats: operations per second, OOMs, time
 * per OOM (the mean wall time of a failing vg_heap_alloc), provider calls
 * per operation, and the ladder's rungs as the heap counts them.
 *
 * Usage: bench_oom [--threads N] [--budget GiB] [--ops per thread]
 *                  [--repeats R] [--seed S] [--streams one|per-thread]
 *                  [--provider-us US] [--only segments|arena]
 * With --threads 1 the run is deterministic: it prints a hash of which
 * allocations succeeded, which must not change when the ladder is made
 * cheaper (what fits, fits).
 */
#include "vramguard/heap.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)
#define SLOTS 24
#define LONG_SLOTS 4
#define LONG_HOLD 16
#define MAX_THREADS 64
#define MAX_REPEATS 64

/* ------------------------------------------------------------------ */
/* A counting provider                                                 */
/* ------------------------------------------------------------------ */

enum { C_RESERVE, C_RELEASE, C_MAP, C_UNMAP, C_SYNC, C_RANGE_RESERVE, C_RANGE_RELEASE,
       C_MEM_INFO, C_EVENT, C_CALLS };
static const char *call_names[C_CALLS] = {"reserve", "release", "map", "unmap", "sync",
                                          "range_reserve", "range_release", "mem_info", "event"};

typedef struct counting_dev {
    vg_device base;
    vg_device *inner;
    double cost_us; /* spun per reserve, release, map, unmap, synchronize */
    atomic_ullong calls[C_CALLS];
} counting_dev;

static counting_dev *as_counting(vg_device *dev)
{
    return (counting_dev *)dev;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A device call's own time, as a spin: what it would cost the caller. */
static void cost(counting_dev *d, int call)
{
    atomic_fetch_add_explicit(&d->calls[call], 1, memory_order_relaxed);
    if (d->cost_us <= 0.0) return;
    double until = now_s() + d->cost_us * 1e-6;
    while (now_s() < until) {
    }
}

static int c_reserve(vg_device *dev, size_t size, uintptr_t *addr)
{
    counting_dev *d = as_counting(dev);
    cost(d, C_RESERVE);
    return d->inner->ops->reserve(d->inner, size, addr);
}

static int c_release(vg_device *dev, uintptr_t addr, size_t size)
{
    counting_dev *d = as_counting(dev);
    cost(d, C_RELEASE);
    return d->inner->ops->release(d->inner, addr, size);
}

static int c_mem_info(vg_device *dev, size_t *free_bytes, size_t *total)
{
    counting_dev *d = as_counting(dev);
    atomic_fetch_add_explicit(&d->calls[C_MEM_INFO], 1, memory_order_relaxed);
    return d->inner->ops->mem_info(d->inner, free_bytes, total);
}

static int c_synchronize(vg_device *dev)
{
    counting_dev *d = as_counting(dev);
    cost(d, C_SYNC);
    return d->inner->ops->synchronize(d->inner);
}

static int c_event_record(vg_device *dev, int device, vg_stream_t stream, vg_event_t *ev)
{
    counting_dev *d = as_counting(dev);
    atomic_fetch_add_explicit(&d->calls[C_EVENT], 1, memory_order_relaxed);
    return d->inner->ops->event_record(d->inner, device, stream, ev);
}

static int c_event_query(vg_device *dev, vg_event_t ev)
{
    counting_dev *d = as_counting(dev);
    atomic_fetch_add_explicit(&d->calls[C_EVENT], 1, memory_order_relaxed);
    return d->inner->ops->event_query(d->inner, ev);
}

static void c_event_release(vg_device *dev, vg_event_t ev)
{
    counting_dev *d = as_counting(dev);
    d->inner->ops->event_release(d->inner, ev);
}

static void c_destroy(vg_device *dev)
{
    counting_dev *d = as_counting(dev);
    d->inner->ops->destroy(d->inner);
    free(d);
}

static int c_range_reserve(vg_device *dev, size_t size, uintptr_t *addr)
{
    counting_dev *d = as_counting(dev);
    atomic_fetch_add_explicit(&d->calls[C_RANGE_RESERVE], 1, memory_order_relaxed);
    return d->inner->ops->range_reserve(d->inner, size, addr);
}

static int c_range_release(vg_device *dev, uintptr_t addr, size_t size)
{
    counting_dev *d = as_counting(dev);
    atomic_fetch_add_explicit(&d->calls[C_RANGE_RELEASE], 1, memory_order_relaxed);
    return d->inner->ops->range_release(d->inner, addr, size);
}

static int c_map(vg_device *dev, uintptr_t addr, size_t size)
{
    counting_dev *d = as_counting(dev);
    cost(d, C_MAP);
    return d->inner->ops->map(d->inner, addr, size);
}

static int c_unmap(vg_device *dev, uintptr_t addr, size_t size)
{
    counting_dev *d = as_counting(dev);
    cost(d, C_UNMAP);
    return d->inner->ops->unmap(d->inner, addr, size);
}

static const vg_device_ops counting_ops = {
    .reserve = c_reserve,
    .release = c_release,
    .mem_info = c_mem_info,
    .synchronize = c_synchronize,
    .event_record = c_event_record,
    .event_query = c_event_query,
    .event_release = c_event_release,
    .destroy = c_destroy,
    .range_reserve = c_range_reserve,
    .range_release = c_range_release,
    .map = c_map,
    .unmap = c_unmap,
};

static vg_device *counting_create(size_t capacity, double cost_us)
{
    counting_dev *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->inner = vg_sim_create(capacity);
    if (!d->inner) {
        free(d);
        return NULL;
    }
    d->base.ops = &counting_ops;
    d->base.index = d->inner->index;
    d->base.page_size = d->inner->page_size;
    d->cost_us = cost_us;
    for (int i = 0; i < C_CALLS; i++) atomic_init(&d->calls[i], 0);
    return &d->base;
}

/* ------------------------------------------------------------------ */
/* The workload                                                        */
/* ------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Log-uniform in [lo, hi): as many 1-2 MiB tensors as 128-256 MiB ones. */
static size_t log_uniform(uint64_t *rng, size_t lo, size_t hi)
{
    int lo_bit = 63 - __builtin_clzll(lo), hi_bit = 63 - __builtin_clzll(hi);
    int bit = lo_bit + (int)(rng_next(rng) % (uint64_t)(hi_bit - lo_bit));
    size_t base = (size_t)1 << bit;
    return base + (size_t)(rng_next(rng) % base);
}

static int small_percent = 40;
static size_t max_large = 1024 * MiB;

static size_t draw_size(uint64_t *rng)
{
    if (rng_next(rng) % 100 < (uint64_t)small_percent) return log_uniform(rng, 512, MiB);
    return log_uniform(rng, MiB, max_large);
}

typedef struct worker {
    vg_heap *h;
    int index;
    long ops;
    uint64_t seed;
    vg_stream_t stream;
    pthread_barrier_t *start;
    /* out */
    uint64_t ooms, allocs, frees;
    double oom_s;     /* wall time inside failing allocations */
    double alloc_s;   /* ... inside succeeding ones */
    double began, ended;
    uint64_t outcome; /* a hash of which allocations succeeded */
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    void *slot[SLOTS] = {0};
    uint64_t rng = w->seed * 0x9E3779B97F4A7C15ull + (uint64_t)w->index + 1;
    uint64_t outcome = 1469598103934665603ull;
    pthread_barrier_wait(w->start);
    w->began = now_s();
    for (long i = 0; i < w->ops; i++) {
        int s = (int)(rng_next(&rng) % SLOTS);
        if (slot[s]) {
            if (s < LONG_SLOTS && rng_next(&rng) % LONG_HOLD) continue;
            vg_heap_free(w->h, slot[s]);
            slot[s] = NULL;
            w->frees++;
            continue;
        }
        size_t size = draw_size(&rng);
        double t0 = now_s();
        slot[s] = vg_heap_alloc(w->h, size, w->stream, NULL);
        double dt = now_s() - t0;
        w->allocs++;
        if (!slot[s]) {
            w->ooms++;
            w->oom_s += dt;
        } else {
            w->alloc_s += dt;
        }
        outcome = (outcome ^ (uint64_t)(slot[s] != NULL)) * 1099511628211ull;
    }
    for (int s = 0; s < SLOTS; s++) vg_heap_free(w->h, slot[s]);
    w->ended = now_s();
    w->outcome = outcome;
    return NULL;
}

/* ------------------------------------------------------------------ */
/* One run, and the report                                             */
/* ------------------------------------------------------------------ */

typedef struct result {
    double ops_per_s;
    double ops, allocs, ooms, oom_us, alloc_us;
    double calls[C_CALLS];
    vg_stats st;
    uint64_t outcome;
} result;

typedef struct options {
    int threads;
    size_t budget;
    long ops;
    int repeats;
    uint64_t seed;
    int per_thread_streams;
    double provider_us;
} options;

static int run_once(const options *o, const vg_policy *policy, result *out)
{
    vg_device *dev = counting_create(80 * GiB, o->provider_us);
    vg_heap_config cfg = {policy, o->budget, 0};
    vg_heap *h = dev ? vg_heap_create(dev, &cfg) : NULL;
    if (!h) return -1;
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)o->threads + 1);
    worker w[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    for (int i = 0; i < o->threads; i++) {
        w[i] = (worker){h, i, o->ops, o->seed, o->per_thread_streams ? (vg_stream_t)(i + 1) : 0,
                        &start, 0, 0, 0, 0, 0, 0, 0, 0};
        pthread_create(&tid[i], NULL, worker_main, &w[i]);
    }
    pthread_barrier_wait(&start);
    for (int i = 0; i < o->threads; i++) pthread_join(tid[i], NULL);
    /* From the first thread's start to the last one's end. */
    double began = w[0].began, ended = w[0].ended;
    for (int i = 1; i < o->threads; i++) {
        if (w[i].began < began) began = w[i].began;
        if (w[i].ended > ended) ended = w[i].ended;
    }
    double wall = ended - began;
    pthread_barrier_destroy(&start);

    memset(out, 0, sizeof *out);
    double oom_s = 0, alloc_s = 0;
    for (int i = 0; i < o->threads; i++) {
        out->allocs += (double)w[i].allocs;
        out->ops += (double)(w[i].allocs + w[i].frees);
        out->ooms += (double)w[i].ooms;
        oom_s += w[i].oom_s;
        alloc_s += w[i].alloc_s;
        out->outcome = out->outcome * 31 + w[i].outcome;
    }
    out->ops_per_s = out->ops / wall;
    out->oom_us = out->ooms ? oom_s * 1e6 / out->ooms : 0;
    out->alloc_us = out->allocs > out->ooms ? alloc_s * 1e6 / (out->allocs - out->ooms) : 0;
    vg_heap_stats(h, &out->st);
    counting_dev *d = as_counting(dev);
    for (int c = 0; c < C_CALLS; c++) out->calls[c] = (double)atomic_load(&d->calls[c]);
    const char *err = vg_heap_check(h);
    if (err) {
        fprintf(stderr, "heap check failed: %s\n", err);
        return -1;
    }
    vg_heap_destroy(h);
    dev->ops->destroy(dev);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of one field over the repeats. */
static double median_of(const result *r, int n, double (*get)(const result *))
{
    double v[MAX_REPEATS];
    for (int i = 0; i < n; i++) v[i] = get(&r[i]);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define GETTER(name, expr) \
    static double name(const result *r) { return (double)(expr); }
GETTER(g_ops_per_s, r->ops_per_s)
GETTER(g_ooms, r->ooms)
GETTER(g_oom_us, r->oom_us)
GETTER(g_alloc_us, r->alloc_us)
GETTER(g_ops, r->ops)
GETTER(g_provider, r->calls[C_RESERVE] + r->calls[C_RELEASE] + r->calls[C_MAP] +
                       r->calls[C_UNMAP] + r->calls[C_SYNC] + r->calls[C_RANGE_RESERVE] +
                       r->calls[C_RANGE_RELEASE])
GETTER(g_map_unmap, r->calls[C_MAP] + r->calls[C_UNMAP] + r->calls[C_RESERVE] + r->calls[C_RELEASE])
GETTER(g_sync, r->calls[C_SYNC])
GETTER(g_budget_refusals, r->st.num_budget_refusals)
GETTER(g_stream_releases, r->st.num_stream_releases)
GETTER(g_retries, r->st.num_alloc_retries)
GETTER(g_sync_all, r->st.num_sync_all_streams)
GETTER(g_sync_releases, r->st.num_sync_releases)
GETTER(g_unmap_syncs, r->st.num_unmap_syncs)
GETTER(g_unmap_skips, r->st.num_unmap_skips)
/* Counters newer than some builds this is compared against (compare-oom.sh
 * builds it against a baseline's library too). */
#ifdef VG_STATS_HAVE_LADDER_SHORTCUTS
GETTER(g_hopeless, r->st.num_oom_fast_fails)
#else
GETTER(g_hopeless, 0 * r->ooms)
#endif
GETTER(g_unmapped_pages, r->st.num_unmapped_pages)
GETTER(g_mapped_pages, r->st.num_mapped_pages)

static void report(const char *name, const result *r, int n)
{
    double ops = median_of(r, n, g_ops);
    printf("%-9s %10.0f ops/s  %7.0f OOMs  %8.1f us/OOM  %6.1f us/ok-alloc  "
           "%6.3f provider calls/op (%6.3f map+unmap+reserve+release, %6.3f sync)\n",
           name, median_of(r, n, g_ops_per_s), median_of(r, n, g_ooms), median_of(r, n, g_oom_us),
           median_of(r, n, g_alloc_us), median_of(r, n, g_provider) / ops,
           median_of(r, n, g_map_unmap) / ops, median_of(r, n, g_sync) / ops);
    printf("%-9s rungs: budget refusals %.0f, stream releases %.0f, retries %.0f, "
           "sync-all %.0f, sync releases %.0f, unmap syncs %.0f, unmap skips %.0f, "
           "fast fails %.0f; pages mapped %.0f, unmapped %.0f\n",
           "", median_of(r, n, g_budget_refusals), median_of(r, n, g_stream_releases),
           median_of(r, n, g_retries), median_of(r, n, g_sync_all), median_of(r, n, g_sync_releases),
           median_of(r, n, g_unmap_syncs), median_of(r, n, g_unmap_skips),
           median_of(r, n, g_hopeless), median_of(r, n, g_mapped_pages),
           median_of(r, n, g_unmapped_pages));
    printf("%-9s provider calls (last repeat):", "");
    for (int c = 0; c < C_CALLS; c++) printf(" %s %.0f", call_names[c], r[n - 1].calls[c]);
    printf("\n");
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--threads N] [--budget GiB] [--ops per thread] [--repeats R]\n"
            "          [--seed S] [--streams one|per-thread] [--provider-us US]\n"
            "          [--only segments|arena]\n",
            argv0);
}

int main(int argc, char **argv)
{
    options o = {6, 2 * GiB, 20000, 5, 1, 0, 0.0};
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            usage(argv[0]);
            return 2;
        }
        if (!strcmp(a, "--threads")) o.threads = atoi(v);
        else if (!strcmp(a, "--budget")) o.budget = (size_t)(atof(v) * (double)GiB);
        else if (!strcmp(a, "--ops")) o.ops = atol(v);
        else if (!strcmp(a, "--repeats")) o.repeats = atoi(v);
        else if (!strcmp(a, "--seed")) o.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--streams")) o.per_thread_streams = !strcmp(v, "per-thread");
        else if (!strcmp(a, "--provider-us")) o.provider_us = atof(v);
        else if (!strcmp(a, "--only")) only = v;
        else if (!strcmp(a, "--small-percent")) small_percent = atoi(v);
        else if (!strcmp(a, "--max-large-mib")) max_large = (size_t)atol(v) * MiB;
        else {
            usage(argv[0]);
            return 2;
        }
        i++;
    }
    if (o.threads < 1 || o.threads > MAX_THREADS || o.repeats < 1 || o.repeats > MAX_REPEATS ||
        o.ops < 1 || (only && strcmp(only, "segments") && strcmp(only, "arena"))) {
        usage(argv[0]);
        return 2;
    }
    struct { const char *name; const vg_policy *policy; } policies[] = {
        {"segments", &vg_policy_default},
        {"arena", &vg_policy_arena},
    };
    static result res[2][MAX_REPEATS];
    printf("%d threads, budget %.2f GiB, %ld ops per thread, %s, provider calls %.1f us, "
           "median of %d repeats (policies alternating)\n",
           o.threads, (double)o.budget / (double)GiB, o.ops,
           o.per_thread_streams ? "a stream per thread" : "one stream", o.provider_us, o.repeats);
    for (int r = 0; r < o.repeats; r++)
        for (int p = 0; p < 2; p++) {
            if (only && strcmp(only, policies[p].name)) continue;
            if (run_once(&o, policies[p].policy, &res[p][r]) != 0) return 1;
        }
    for (int p = 0; p < 2; p++) {
        if (only && strcmp(only, policies[p].name)) continue;
        report(policies[p].name, res[p], o.repeats);
        if (o.threads == 1)
            printf("%-9s outcome hash %016llx (deterministic with one thread)\n", "",
                   (unsigned long long)res[p][0].outcome);
    }
    return 0;
}
