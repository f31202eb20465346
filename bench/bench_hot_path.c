/* Hot-path benchmark: ns per alloc+free pair of cached blocks on the
 * simulated device, median over repeats, with baselines run in the same
 * process (glibc malloc/free on the same size sequence, the heap under the
 * torch policy, and the heap under the arena policy, whose ratio to the
 * segments policy ("vramguard" here) is the arena's cost on the hot path).
 *
 *   (a) one size (1 MiB) allocated and freed in a loop;
 *   (b) a training-step mix: sizes drawn from the size distribution of a
 *       transformer fine-tuning trace (log2 buckets, 4 B to 256 MiB, most of
 *       them small), 256 blocks live at once, the oldest freed each time;
 *   (c) (b) on 2 threads sharing one heap;
 *   (d) 512 B allocated and freed in a loop while 0, 10,000 or 50,000 other
 *       free blocks wait in its size class (every other 512 B block of a run
 *       freed, so none coalesce): best fit must not slow down with them.
 *
 * Usage: bench_hot_path [pairs per repeat] [repeats] [only [abc]]
 * With a third argument only one heap runs: `arena` the arena policy's,
 * anything else (`only`, `segments`) the segments policy's ("vramguard"),
 * for callgrind's instruction counts, which are repeatable where timings
 * are not, and for bench/compare.sh, which runs two builds alternately. A
 * fourth argument `abc` leaves out case (d).
 */
#include "vramguard/heap.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LIVE 256
#define SEQ 65536 /* pre-drawn sizes, cycled */

static size_t sizes[SEQ];

/* Allocation counts per log2 size bucket in an OPT-125m fine-tuning step
 * (a public PyTorch memory snapshot): small tensors dominate, a few are
 * hundreds of MiB. */
static const struct { int log2; int weight; } mix[] = {
    {2, 1003}, {3, 10}, {4, 8}, {5, 2}, {6, 24}, {7, 30}, {9, 306}, {10, 30},
    {11, 2982}, {12, 12}, {13, 324}, {14, 96}, {19, 960}, {20, 1}, {21, 1440},
    {22, 27}, {23, 649}, {25, 6}, {27, 30},
};

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void draw_sizes(uint64_t seed)
{
    int total = 0;
    for (size_t i = 0; i < sizeof mix / sizeof mix[0]; i++) total += mix[i].weight;
    for (int k = 0; k < SEQ; k++) {
        int r = (int)(rng_next(&seed) % (uint64_t)total);
        size_t b = 0;
        while (r >= mix[b].weight) r -= mix[b++].weight;
        size_t lo = (size_t)1 << mix[b].log2;
        sizes[k] = lo + (size_t)(rng_next(&seed) % lo);
        if (sizes[k] > ((size_t)256 << 20)) sizes[k] = (size_t)256 << 20;
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ------------------------------------------------------------------ */
/* Workloads                                                           */
/* ------------------------------------------------------------------ */

typedef struct allocator {
    void *(*alloc)(void *ctx, size_t size);
    void (*release)(void *ctx, void *p);
    void *ctx;
} allocator;

static void *heap_alloc(void *ctx, size_t size) { return vg_heap_alloc(ctx, size, 0, NULL); }
static void heap_release(void *ctx, void *p) { vg_heap_free(ctx, p); }
static void *libc_alloc(void *ctx, size_t size) { (void)ctx; return malloc(size); }
static void libc_release(void *ctx, void *p) { (void)ctx; free(p); }

/* ns per pair */
static double one_size(const allocator *a, long pairs)
{
    double t0 = now_s();
    for (long i = 0; i < pairs; i++) {
        void *p = a->alloc(a->ctx, (size_t)1 << 20);
        a->release(a->ctx, p);
    }
    return (now_s() - t0) * 1e9 / (double)pairs;
}

static double mixed(const allocator *a, long pairs, int offset)
{
    void *live[LIVE];
    for (int i = 0; i < LIVE; i++) live[i] = a->alloc(a->ctx, sizes[(offset + i) % SEQ]);
    double t0 = now_s();
    for (long i = 0; i < pairs; i++) {
        int slot = (int)(i % LIVE);
        a->release(a->ctx, live[slot]);
        live[slot] = a->alloc(a->ctx, sizes[(size_t)(offset + LIVE + i) % SEQ]);
    }
    double ns = (now_s() - t0) * 1e9 / (double)pairs;
    for (int i = 0; i < LIVE; i++) a->release(a->ctx, live[i]);
    return ns;
}

typedef struct thread_arg {
    const allocator *a;
    long pairs;
    int offset;
    double ns;
} thread_arg;

static void *mixed_thread(void *p)
{
    thread_arg *t = p;
    t->ns = mixed(t->a, t->pairs, t->offset);
    return NULL;
}

/* Per-thread ns per pair, the two threads running at once. */
static double mixed_2_threads(const allocator *a, long pairs)
{
    pthread_t tid[2];
    thread_arg args[2] = {{a, pairs, 0, 0}, {a, pairs, SEQ / 2, 0}};
    for (int i = 0; i < 2; i++) pthread_create(&tid[i], NULL, mixed_thread, &args[i]);
    for (int i = 0; i < 2; i++) pthread_join(tid[i], NULL);
    return 0.5 * (args[0].ns + args[1].ns);
}

typedef double (*workload)(const allocator *, long);

static double mixed_1_thread(const allocator *a, long pairs) { return mixed(a, pairs, 0); }

static double run(workload w, const allocator *a, long pairs, int repeats)
{
    double v[64];
    w(a, pairs / 4); /* warm the cache: later rounds are all hits */
    for (int r = 0; r < repeats; r++) v[r] = w(a, pairs);
    return median(v, repeats);
}

/* ------------------------------------------------------------------ */
/* Many free blocks in one class                                       */
/* ------------------------------------------------------------------ */

/* A heap holding `nfree` free 512 B blocks, each between two live ones. */
static vg_heap *heap_with_free_blocks(vg_device *dev, const vg_policy *policy, long nfree,
                                      void ***held)
{
    vg_heap_config cfg = {policy, 0, 0};
    vg_heap *h = vg_heap_create(dev, &cfg);
    void **p = malloc((size_t)(2 * nfree + 1) * sizeof *p);
    for (long i = 0; i < 2 * nfree + 1; i++) p[i] = vg_heap_alloc(h, VG_ALIGN, 0, NULL);
    for (long i = 1; i < 2 * nfree + 1; i += 2) {
        vg_heap_free(h, p[i]);
        p[i] = NULL;
    }
    *held = p;
    return h;
}

static double small_loop(const allocator *a, long pairs)
{
    double t0 = now_s();
    for (long i = 0; i < pairs; i++) a->release(a->ctx, a->alloc(a->ctx, VG_ALIGN));
    return (now_s() - t0) * 1e9 / (double)pairs;
}

/* ns per pair with `nfree` free blocks waiting in the class. */
static double with_free_blocks(const vg_policy *policy, long nfree, long pairs, int repeats)
{
    vg_device *dev = vg_sim_create((size_t)1 << 40);
    void **held;
    vg_heap *h = heap_with_free_blocks(dev, policy, nfree, &held);
    allocator a = {heap_alloc, heap_release, h};
    double ns = run(small_loop, &a, pairs, repeats);
    for (long i = 0; i < 2 * nfree + 1; i++) vg_heap_free(h, held[i]);
    free(held);
    vg_heap_destroy(h);
    dev->ops->destroy(dev);
    return ns;
}

static void free_blocks_case(long pairs, int repeats, const vg_policy *only)
{
    static const long counts[] = {0, 10000, 50000};
    const vg_policy *policies[] = {only ? only : &vg_policy_default, &vg_policy_torch};
    const char *names[] = {only == &vg_policy_arena ? "arena" : "vramguard", "torch-policy"};
    for (int p = 0; p < (only ? 1 : 2); p++) {
        double ns[3];
        for (int i = 0; i < 3; i++) ns[i] = with_free_blocks(policies[p], counts[i], pairs, repeats);
        printf("(d) 512 B, free blocks in class, %-12s 0: %.1f   10,000: %.1f (%.2fx)   "
               "50,000: %.1f (%.2fx)   goal: within 2x\n", names[p], ns[0], ns[1], ns[1] / ns[0],
               ns[2], ns[2] / ns[0]);
    }
}

/* ------------------------------------------------------------------ */
/* Main                                                                */
/* ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    long pairs = argc > 1 ? atol(argv[1]) : 1000000;
    int repeats = argc > 2 ? atoi(argv[2]) : 11;
    /* One heap alone: its policy, NULL for the whole table. */
    const vg_policy *only = argc > 3 ? (strcmp(argv[3], "arena") ? &vg_policy_default
                                                                   : &vg_policy_arena)
                                     : NULL;
    int with_d = !(argc > 4 && !strcmp(argv[4], "abc"));
    if (pairs <= 0 || repeats <= 0 || repeats > 64) {
        fprintf(stderr, "usage: %s [pairs per repeat > 0] [repeats 1..64] [segments|arena [abc]]\n",
                argv[0]);
        return 2;
    }
    draw_sizes(12345);
    /* glibc: no mmap, no trim, so it is its fast path we compare with. */
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);

    vg_device *dev_v = vg_sim_create((size_t)1 << 40), *dev_t = vg_sim_create((size_t)1 << 40);
    vg_device *dev_a = vg_sim_create((size_t)1 << 40);
    vg_heap_config cfg_v = {&vg_policy_default, 0, 0}, cfg_t = {&vg_policy_torch, 0, 0};
    vg_heap_config cfg_a = {&vg_policy_arena, 0, 0};
    vg_heap *hv = vg_heap_create(dev_v, &cfg_v), *ht = vg_heap_create(dev_t, &cfg_t);
    vg_heap *ha = vg_heap_create(dev_a, &cfg_a);
    allocator vg = {heap_alloc, heap_release, hv};
    allocator torch = {heap_alloc, heap_release, ht};
    allocator arena = {heap_alloc, heap_release, ha};
    allocator libc = {libc_alloc, libc_release, NULL};

    struct { const char *name; workload w; } cases[] = {
        {"(a) one size, 1 thread", one_size},
        {"(b) mix, 1 thread", mixed_1_thread},
        {"(c) mix, 2 threads", mixed_2_threads},
    };
    printf("ns per alloc+free pair, median of %d repeats of %ld pairs\n", repeats, pairs);
    if (only)
        printf("%-24s %10s\n", "case", only == &vg_policy_arena ? "arena" : "vramguard");
    else
        printf("%-24s %10s %12s %10s %14s %12s %10s %12s\n", "case", "vramguard", "torch-policy",
               "glibc", "vg/torch-pol.", "vg/glibc", "arena", "arena/vg");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double v = run(cases[c].w, only == &vg_policy_arena ? &arena : &vg, pairs, repeats);
        if (only) {
            printf("%-24s %10.1f\n", cases[c].name, v);
            continue;
        }
        double t = run(cases[c].w, &torch, pairs, repeats);
        double g = run(cases[c].w, &libc, pairs, repeats);
        double a = run(cases[c].w, &arena, pairs, repeats);
        printf("%-24s %10.1f %12.1f %10.1f %14.2f %12.2f %10.1f %12.2f\n", cases[c].name, v, t, g,
               v / t, v / g, a, a / v);
    }
    if (with_d) free_blocks_case(pairs, repeats, only);
    vg_stats st;
    vg_heap_stats(hv, &st);
    if (only != &vg_policy_arena)
        printf("vramguard heap: cache hits %llu, misses %llu (%.4f%% misses), device allocs %llu\n",
               (unsigned long long)st.num_cache_hits, (unsigned long long)st.num_cache_misses,
               100.0 * (double)st.num_cache_misses /
                   (double)(st.num_cache_hits + st.num_cache_misses),
               (unsigned long long)st.num_device_alloc);
    vg_heap_stats(ha, &st);
    if (only != &vg_policy_default)
        printf("arena heap: cache hits %llu, misses %llu, maps %llu, unmaps %llu\n",
               (unsigned long long)st.num_cache_hits, (unsigned long long)st.num_cache_misses,
               (unsigned long long)st.num_maps, (unsigned long long)st.num_unmaps);
    const char *err = vg_heap_check(hv);
    if (!err) err = vg_heap_check(ha);
    if (err) {
        fprintf(stderr, "heap check failed: %s\n", err);
        return 1;
    }
    vg_heap_destroy(hv);
    vg_heap_destroy(ht);
    vg_heap_destroy(ha);
    dev_a->ops->destroy(dev_a);
    dev_v->ops->destroy(dev_v);
    dev_t->ops->destroy(dev_t);
    return 0;
}
