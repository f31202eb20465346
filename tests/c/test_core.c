/* Tests of the allocator core on the simulated device: exact byte counts
 * after known sequences, each policy step with its counter, bad input, and
 * invariants after long seeded random sequences, single and multi-threaded. */
#include "harness.h"
#include "heap_internal.h"
#include "addr_map.h"
#include "bins.h"
#include "check.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

typedef struct fixture {
    vg_device *dev;
    vg_heap *heap;
} fixture;

static fixture make(size_t capacity, size_t budget, double gc, const vg_policy *policy)
{
    fixture f;
    f.dev = vg_sim_create(capacity);
    vg_heap_config cfg = {policy, budget, gc};
    f.heap = vg_heap_create(f.dev, &cfg);
    return f;
}

static void destroy(fixture f)
{
    vg_heap_destroy(f.heap);
    f.dev->ops->destroy(f.dev);
}

static vg_stats stats_of(vg_heap *h)
{
    vg_stats st;
    vg_heap_stats(h, &st);
    return st;
}

/* ------------------------------------------------------------------ */
/* Size classes                                                        */
/* ------------------------------------------------------------------ */

static void test_round_size(void)
{
    CHECK_EQ(vg_round_size(0), 0);
    CHECK_EQ(vg_round_size(1), 512);
    CHECK_EQ(vg_round_size(512), 512);
    CHECK_EQ(vg_round_size(513), 1024);
    CHECK_EQ(vg_round_size(VG_MAX_REQUEST), VG_MAX_REQUEST);
    CHECK_EQ(vg_round_size(VG_MAX_REQUEST + 1), 0);
    CHECK_EQ(vg_round_size(SIZE_MAX), 0);
    CHECK_EQ(vg_round_size(SIZE_MAX - 100), 0);
}

static void test_bin_classes(void)
{
    /* Every size lies inside its class, and classes grow with size. */
    uint32_t last = 0;
    for (size_t units = 1; units < 200000; units += 1 + units / 64) {
        size_t size = units * VG_ALIGN;
        uint32_t bin = vg__bin_of_size(size);
        CHECK(bin < VG_NBINS);
        CHECK(bin >= last);
        CHECK(vg__bin_lower_bound(bin) <= size);
        CHECK(vg__bin_lower_bound(bin + 1) > size);
        last = bin;
    }
    CHECK(vg__bin_of_size(VG_MAX_REQUEST) < VG_NBINS);
    CHECK_EQ(vg__bin_of_size(31 * 512), 31);
    CHECK_EQ(vg__bin_of_size(32 * 512), 32);
    CHECK_EQ(vg__bin_lower_bound(vg__bin_of_size(MiB)), MiB);
    /* A class is at most 1/32 wider than its lower bound. */
    for (uint32_t bin = 33; bin < VG_NBINS - 1; bin += 7) {
        size_t lo = vg__bin_lower_bound(bin), hi = vg__bin_lower_bound(bin + 1);
        CHECK(hi - lo <= lo / 32);
    }
}

static void test_addr_map(void)
{
    vg_addr_map m;
    CHECK_EQ(vg__map_init(&m, 16), VG_OK);
    enum { N = 20000 };
    static uintptr_t keys[N];
    static int present[N];
    uint64_t rng = 42;
    for (int i = 0; i < N; i++) keys[i] = ((uintptr_t)i + 1) * 512 * 3;
    for (int round = 0; round < 200000; round++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int i = (int)((rng >> 33) % N);
        if (present[i]) {
            CHECK(vg__map_take(&m, keys[i]) == (vg_block *)&keys[i]);
            present[i] = 0;
        } else {
            CHECK(vg__map_get(&m, keys[i]) == NULL);
            CHECK_EQ(vg__map_put(&m, keys[i], (vg_block *)&keys[i]), VG_OK);
            present[i] = 1;
        }
    }
    size_t count = 0;
    for (int i = 0; i < N; i++) {
        CHECK((vg__map_get(&m, keys[i]) != NULL) == (present[i] != 0));
        count += (size_t)present[i];
    }
    CHECK_EQ(m.count, count);
    vg__map_free(&m);
}

/* ------------------------------------------------------------------ */
/* Exact byte counts                                                   */
/* ------------------------------------------------------------------ */

static void test_small_alloc_split_coalesce(void)
{
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 1000, 0, NULL);
    CHECK(a != NULL);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.requested_bytes[VG_STAT_ALL].current, 1000);
    CHECK_EQ(st.allocated_bytes[VG_STAT_SMALL].current, 1024);
    CHECK_EQ(st.reserved_bytes[VG_STAT_SMALL].current, 2 * MiB);
    CHECK_EQ(st.reserved_bytes[VG_STAT_LARGE].current, 0);
    CHECK_EQ(st.num_splits, 1);
    CHECK_EQ(vg_heap_block_size(f.heap, a), 1024);

    void *b = vg_heap_alloc(f.heap, 1024, 0, NULL);
    void *c = vg_heap_alloc(f.heap, 4096, 0, NULL);
    CHECK((uintptr_t)b == (uintptr_t)a + 1024);
    CHECK((uintptr_t)c == (uintptr_t)b + 1024);
    CHECK_HEAP(f.heap);

    /* Free the middle: a hole of 1024 between two live blocks. */
    CHECK_EQ(vg_heap_free(f.heap, b), VG_OK);
    vg_fragmentation fr;
    vg_heap_fragmentation(f.heap, &fr);
    CHECK_EQ(fr.free_bytes, 2 * MiB - 1024 - 4096);
    CHECK_EQ(fr.free_blocks, 2);
    CHECK_EQ(fr.largest_free_block, 2 * MiB - 1024 * 2 - 4096);
    CHECK_HEAP(f.heap);

    /* A 1024 request takes the hole (best fit), not the tail. */
    void *d = vg_heap_alloc(f.heap, 700, 0, NULL);
    CHECK(d == b);
    CHECK_EQ(vg_heap_free(f.heap, d), VG_OK);

    /* Freeing a and c coalesces everything back into one idle segment. */
    CHECK_EQ(vg_heap_free(f.heap, a), VG_OK);
    CHECK_EQ(vg_heap_free(f.heap, c), VG_OK);
    st = stats_of(f.heap);
    CHECK_EQ(st.allocated_bytes[VG_STAT_ALL].current, 0);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 2 * MiB);
    CHECK_EQ(st.num_merges, st.num_splits);
    vg_heap_fragmentation(f.heap, &fr);
    CHECK_EQ(fr.free_blocks, 1);
    CHECK_EQ(fr.largest_free_block, 2 * MiB);
    CHECK_HEAP(f.heap);

    CHECK_EQ(vg_heap_empty_cache(f.heap), 2 * MiB);
    st = stats_of(f.heap);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 0);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].peak, 2 * MiB);
    CHECK_EQ(st.num_empty_cache, 1);
    CHECK_EQ(st.num_empty_cache_releases, 1);
    CHECK_EQ(vg_sim_used(f.dev), 0);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_large_segments(void)
{
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    /* 3 MiB: a segment packed for two of its size (6 MiB, no rounding waste). */
    void *a = vg_heap_alloc(f.heap, 3 * MiB, 0, NULL);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.reserved_bytes[VG_STAT_LARGE].current, 6 * MiB);
    CHECK_EQ(st.allocated_bytes[VG_STAT_LARGE].current, 3 * MiB);
    /* The second 3 MiB tensor fills it. */
    void *b = vg_heap_alloc(f.heap, 3 * MiB, 0, NULL);
    CHECK((uintptr_t)b == (uintptr_t)a + 3 * MiB);
    CHECK_EQ(stats_of(f.heap).num_device_alloc, 1);
    /* 15 MiB + 1: no multiple fits under 20 MiB, so its own 16 MiB; the
     * sub-MiB remainder stays in the block (no large request fits it). */
    void *c = vg_heap_alloc(f.heap, 15 * MiB + 1, 0, NULL);
    st = stats_of(f.heap);
    CHECK_EQ(st.reserved_bytes[VG_STAT_LARGE].current, 6 * MiB + 16 * MiB);
    CHECK_EQ(st.allocated_bytes[VG_STAT_LARGE].current, 6 * MiB + 16 * MiB);
    CHECK_EQ(st.requested_bytes[VG_STAT_LARGE].current, 6 * MiB + 15 * MiB + 1);
    CHECK_EQ(st.segment[VG_STAT_LARGE].current, 2);
    /* 2.25 MiB: eight of them fill 18 MiB exactly. */
    void *d = vg_heap_alloc(f.heap, 2 * MiB + 256 * KiB, 0, NULL);
    CHECK_EQ(stats_of(f.heap).reserved_bytes[VG_STAT_LARGE].current, 6 * MiB + 16 * MiB + 18 * MiB);
    CHECK_HEAP(f.heap);
    vg_heap_free(f.heap, a);
    vg_heap_free(f.heap, b);
    vg_heap_free(f.heap, c);
    vg_heap_free(f.heap, d);
    CHECK_EQ(vg_heap_empty_cache(f.heap), 40 * MiB);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_torch_policy_segments(void)
{
    /* PyTorch: under 10 MiB a 20 MiB segment, else rounded to 2 MiB. */
    fixture t = make(GiB, 0, 0, &vg_policy_torch);
    vg_heap_alloc(t.heap, 3 * MiB, 0, NULL);
    CHECK_EQ(stats_of(t.heap).reserved_bytes[VG_STAT_LARGE].current, 20 * MiB);
    vg_heap_alloc(t.heap, 17 * MiB + 1, 0, NULL);
    CHECK_EQ(stats_of(t.heap).reserved_bytes[VG_STAT_LARGE].current, 20 * MiB + 18 * MiB);
    destroy(t);
}

static void test_keep_big_idle_segment_whole_under_budget(void)
{
    /* A 148 MiB idle segment and an 8 MiB request near the budget: reserve
     * 8 MiB beside it rather than strand 140 MiB in a split. */
    fixture f = make(GiB, 300 * MiB, 0, &vg_policy_default);
    void *big = vg_heap_alloc(f.heap, 147 * MiB, 0, NULL);
    void *pin = vg_heap_alloc(f.heap, 100 * MiB, 0, NULL);
    vg_heap_free(f.heap, big);
    void *small = vg_heap_alloc(f.heap, 8 * MiB, 0, NULL);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.num_kept_whole, 1);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 148 * MiB + 100 * MiB + 8 * MiB);
    /* The big request comes back and finds its segment whole. */
    CHECK(vg_heap_alloc(f.heap, 147 * MiB, 0, NULL) == big);
    vg_heap_free(f.heap, big);
    /* 256 + 50 > 300: no room beside it, so the idle 148 MiB is swapped
     * for a 50 MiB one. */
    void *mid = vg_heap_alloc(f.heap, 50 * MiB, 0, NULL);
    CHECK(mid != NULL);
    st = stats_of(f.heap);
    CHECK_EQ(st.num_kept_whole, 1);
    CHECK_EQ(st.num_oversize_releases, 1);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 100 * MiB + 8 * MiB + 50 * MiB);
    CHECK_HEAP(f.heap);
    vg_heap_free(f.heap, pin);
    vg_heap_free(f.heap, small);
    vg_heap_free(f.heap, mid);
    destroy(f);
}

static void test_far_from_the_ceiling(void)
{
    /* Without pressure an idle segment is split, whatever its size: 2x
     * too big, and 18x too big alike (no fresh segment beside it). */
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    void *mid = vg_heap_alloc(f.heap, 40 * MiB, 0, NULL);
    vg_heap_free(f.heap, mid);
    CHECK(vg_heap_alloc(f.heap, 20 * MiB, 0, NULL) == mid);
    CHECK_EQ(stats_of(f.heap).num_kept_whole, 0);
    CHECK_EQ(stats_of(f.heap).num_device_alloc, 1);
    destroy(f);
    f = make(GiB, 0, 0, &vg_policy_default);
    void *big = vg_heap_alloc(f.heap, 147 * MiB, 0, NULL);
    vg_heap_free(f.heap, big);
    CHECK(vg_heap_alloc(f.heap, 8 * MiB, 0, NULL) == big);
    CHECK_EQ(stats_of(f.heap).num_kept_whole, 0);
    CHECK_EQ(stats_of(f.heap).num_device_alloc, 1);
    CHECK_EQ(stats_of(f.heap).reserved_bytes[VG_STAT_ALL].peak, 148 * MiB);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_large_split_rule(void)
{
    /* Both policies keep a sub-MiB remainder of a large block in the block
     * (19.5 MiB in 20 MiB), and split off anything bigger. */
    const vg_policy *policies[2] = {&vg_policy_torch, &vg_policy_default};
    for (int i = 0; i < 2; i++) {
        fixture f = make(GiB, 0, 0, policies[i]);
        CHECK(vg_heap_alloc(f.heap, 19 * MiB + 512 * KiB, 0, NULL) != NULL);
        CHECK_EQ(stats_of(f.heap).allocated_bytes[VG_STAT_ALL].current, 20 * MiB);
        CHECK_EQ(stats_of(f.heap).num_splits, 0);
        void *big = vg_heap_alloc(f.heap, 50 * MiB, 0, NULL);
        vg_heap_free(f.heap, big);
        CHECK(vg_heap_alloc(f.heap, 40 * MiB, 0, NULL) == big);
        CHECK_EQ(stats_of(f.heap).allocated_bytes[VG_STAT_ALL].current, 20 * MiB + 40 * MiB);
        CHECK_EQ(stats_of(f.heap).num_splits, 1);
        CHECK_HEAP(f.heap);
        destroy(f);
    }
    CHECK(strcmp(vg_policy_torch.name, "torch") == 0);
}

static void test_reuse_only_on_same_stream(void)
{
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 64 * MiB, 1, NULL);
    vg_heap_free(f.heap, a);
    void *b = vg_heap_alloc(f.heap, 64 * MiB, 2, NULL);
    CHECK(b != a);
    CHECK_EQ(stats_of(f.heap).num_device_alloc, 2);
    void *c = vg_heap_alloc(f.heap, 64 * MiB, 1, NULL);
    CHECK(c == a);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.num_cache_hits, 1);
    CHECK_EQ(st.num_cache_misses, 2);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_record_stream_defers_reuse(void)
{
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 64 * MiB, 1, NULL);
    CHECK_EQ(vg_heap_record_stream(f.heap, a, 7), VG_OK);
    CHECK_EQ(vg_heap_record_stream(f.heap, a, 7), VG_OK); /* once is enough */
    CHECK_EQ(vg_heap_record_stream(f.heap, a, 1), VG_OK); /* its own stream: no-op */
    CHECK_EQ(stats_of(f.heap).num_record_stream, 1);
    CHECK_EQ(vg_heap_free(f.heap, a), VG_OK);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.allocated_bytes[VG_STAT_ALL].current, 0);
    CHECK_EQ(st.active_bytes[VG_STAT_ALL].current, 64 * MiB);
    CHECK_EQ(st.num_deferred_frees, 1);
    CHECK_HEAP(f.heap);
    /* Stream 7 has not finished: stream 1 must not get the block back. */
    void *b = vg_heap_alloc(f.heap, 64 * MiB, 1, NULL);
    CHECK(b != a);
    vg_heap_free(f.heap, b);
    /* A double free of the deferred block is caught too. */
    CHECK_EQ(vg_heap_free(f.heap, a), VG_ERR_INVALID);
    vg_sim_complete_stream(f.dev, 7);
    void *c = vg_heap_alloc(f.heap, 128 * MiB, 1, NULL);
    st = stats_of(f.heap);
    CHECK_EQ(st.active_bytes[VG_STAT_ALL].current, 128 * MiB);
    vg_heap_free(f.heap, c);
    /* Both 64 MiB blocks are cached now; the next 64 MiB is a hit. */
    uint64_t hits = st.num_cache_hits;
    void *d = vg_heap_alloc(f.heap, 64 * MiB, 1, NULL);
    CHECK(d == a || d == b);
    CHECK_EQ(stats_of(f.heap).num_cache_hits, hits + 1);
    vg_heap_free(f.heap, d);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_empty_cache_waits_for_deferred_frees(void)
{
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 32 * MiB, 1, NULL);
    vg_heap_record_stream(f.heap, a, 2);
    vg_heap_free(f.heap, a);
    CHECK_EQ(vg_heap_empty_cache(f.heap), 32 * MiB);
    CHECK_EQ(stats_of(f.heap).reserved_bytes[VG_STAT_ALL].current, 0);
    CHECK_HEAP(f.heap);
    destroy(f);
}

/* ------------------------------------------------------------------ */
/* Policy steps                                                        */
/* ------------------------------------------------------------------ */

static void test_budget_shrinks_then_refuses(void)
{
    fixture f = make(GiB, 4 * MiB, 0, &vg_policy_default);
    vg_oom_info oom;
    void *a = vg_heap_alloc(f.heap, 3 * MiB, 0, &oom);
    CHECK(a != NULL);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 4 * MiB); /* not 20 MiB */
    CHECK_EQ(st.num_shrunk_segments, 1);
    CHECK_EQ(st.num_budget_refusals, 1);
    void *b = vg_heap_alloc(f.heap, 3 * MiB, 0, &oom);
    CHECK(b == NULL);
    st = stats_of(f.heap);
    CHECK_EQ(st.num_ooms, 1);
    CHECK_EQ(oom.requested, 3 * MiB);
    CHECK_EQ(oom.rounded, 3 * MiB);
    CHECK_EQ(oom.budget, 4 * MiB);
    CHECK_EQ(oom.reserved, 4 * MiB);
    CHECK_EQ(oom.allocated, 4 * MiB); /* the 1 MiB remainder stays in the block */
    CHECK_EQ(oom.largest_free_block, 0);
    CHECK_EQ(oom.free_blocks, 0);
    CHECK_EQ(oom.device_total, GiB);
    CHECK_EQ(oom.device_free, GiB - 4 * MiB);
    CHECK(oom.budget_refused);
    CHECK(st.reserved_bytes[VG_STAT_ALL].peak <= 4 * (int64_t)MiB);
    CHECK_HEAP(f.heap);
    /* The heap still works after an OOM. */
    vg_heap_free(f.heap, a);
    CHECK(vg_heap_alloc(f.heap, 3 * MiB, 0, &oom) == a);
    destroy(f);
}

static void test_release_same_stream_then_retry(void)
{
    fixture f = make(GiB, 40 * MiB, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 12 * MiB, 1, NULL); /* own 12 MiB segment */
    vg_heap_free(f.heap, a);
    void *b = vg_heap_alloc(f.heap, 30 * MiB, 1, NULL); /* 12 + 30 > 40 */
    CHECK(b != NULL);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.num_stream_releases, 1);
    CHECK_EQ(st.num_alloc_retries, 1);
    CHECK_EQ(st.num_sync_all_streams, 0);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 30 * MiB);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_sync_release_all_then_retry(void)
{
    fixture f = make(GiB, 40 * MiB, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 30 * MiB, 1, NULL);
    vg_heap_free(f.heap, a);
    /* Another stream: its own idle segments are none, so step 3 acts. */
    void *b = vg_heap_alloc(f.heap, 30 * MiB, 2, NULL);
    CHECK(b != NULL);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.num_stream_releases, 0);
    CHECK_EQ(st.num_sync_all_streams, 1);
    CHECK_EQ(st.num_sync_releases, 1);
    CHECK_EQ(st.num_alloc_retries, 1);
    CHECK_EQ(st.num_device_free, 1);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 30 * MiB);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_sync_finishes_deferred_free_and_reuses_it(void)
{
    fixture f = make(GiB, 40 * MiB, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 30 * MiB, 1, NULL);
    vg_heap_record_stream(f.heap, a, 9);
    vg_heap_free(f.heap, a);
    void *b = vg_heap_alloc(f.heap, 30 * MiB, 1, NULL);
    CHECK(b == a); /* after the synchronize, the cached block fits */
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.num_sync_all_streams, 1);
    CHECK_EQ(st.num_device_alloc, 1);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_torch_policy_releases_before_refit(void)
{
    /* The same deferred free as above under the torch policy: it takes no
     * second look at the cache after the synchronize, so the finished
     * block's segment is released and a fresh one reserved, as PyTorch's
     * release_cached_blocks does; and nothing of the requesting stream is
     * released before the synchronize. */
    fixture f = make(GiB, 40 * MiB, 0, &vg_policy_torch);
    void *a = vg_heap_alloc(f.heap, 30 * MiB, 1, NULL);
    vg_heap_record_stream(f.heap, a, 9);
    vg_heap_free(f.heap, a);
    void *b = vg_heap_alloc(f.heap, 30 * MiB, 1, NULL);
    CHECK(b != NULL && b != a);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.num_sync_all_streams, 1);
    CHECK_EQ(st.num_sync_releases, 1);
    CHECK_EQ(st.num_stream_releases, 0);
    CHECK_EQ(st.num_alloc_retries, 1);
    CHECK_EQ(st.num_device_alloc, 2);
    CHECK_EQ(st.num_device_free, 1);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_gc_threshold_releases_oldest(void)
{
    fixture f = make(GiB, 100 * MiB, 0.5, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 20 * MiB, 1, NULL);
    void *b = vg_heap_alloc(f.heap, 20 * MiB, 2, NULL);
    vg_heap_free(f.heap, a); /* idle first: the oldest */
    vg_heap_free(f.heap, b);
    void *c = vg_heap_alloc(f.heap, 20 * MiB, 3, NULL); /* 60 > 50: gc */
    CHECK(c != NULL);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.num_gc_releases, 1);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 40 * MiB);
    /* The one released was a's: b's segment is still cached for stream 2. */
    CHECK(vg_heap_alloc(f.heap, 20 * MiB, 2, NULL) == b);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_device_refusal_and_fault_injection(void)
{
    fixture f = make(64 * MiB, 0, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 40 * MiB, 0, NULL);
    vg_heap_free(f.heap, a);
    vg_oom_info oom;
    /* The device is full of our own cache: release it and retry. */
    void *b = vg_heap_alloc(f.heap, 50 * MiB, 0, &oom);
    CHECK(b != NULL);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.num_device_alloc_failed, 1);
    CHECK_EQ(st.num_stream_releases, 1);
    /* An injected failure of the next reserve is ridden over by the retry. */
    vg_sim_fail_nth(f.dev, 1);
    void *c = vg_heap_alloc(f.heap, 2 * MiB, 0, &oom);
    CHECK(c != NULL);
    st = stats_of(f.heap);
    CHECK_EQ(st.num_device_alloc_failed, 2);
    CHECK_EQ(st.num_ooms, 0);
    /* Too big for the device: an OOM, not from the budget. */
    CHECK(vg_heap_alloc(f.heap, 100 * MiB, 0, &oom) == NULL);
    CHECK(!oom.budget_refused);
    CHECK_EQ(oom.budget, 0);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_lowering_budget_releases_idle(void)
{
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 30 * MiB, 0, NULL);
    void *b = vg_heap_alloc(f.heap, 30 * MiB, 0, NULL);
    vg_heap_free(f.heap, a);
    CHECK_EQ(vg_heap_set_budget(f.heap, 40 * MiB), VG_OK);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 30 * MiB);
    CHECK_EQ(st.num_budget_releases, 1);
    CHECK_EQ(vg_heap_budget(f.heap), 40 * MiB);
    vg_heap_free(f.heap, b);
    CHECK_EQ(vg_heap_set_gc_threshold(f.heap, 1.5), VG_ERR_ARG);
    CHECK_EQ(vg_heap_set_gc_threshold(f.heap, 0.25), VG_OK);
    CHECK_HEAP(f.heap);
    destroy(f);
}

/* ------------------------------------------------------------------ */
/* Bad input                                                           */
/* ------------------------------------------------------------------ */

/* A heap made without a policy gets the recommended one, the arena; on a
 * device without virtual memory it falls back to segments. */
static void test_no_policy_means_the_recommended_one(void)
{
    CHECK(strcmp(vg_policy_recommended(), "arena") == 0);
    CHECK(vg_policy_named("vramguard") == &vg_policy_arena);
    vg_device *dev = vg_sim_create(GiB);
    vg_heap *h = vg_heap_create(dev, NULL);
    CHECK(strcmp(vg_heap_policy_name(h), "arena") == 0);
    CHECK_EQ(vg_heap_uses_arena(h), 1);
    void *p = vg_heap_alloc(h, 1000, 0, NULL);
    vg_stats st;
    vg_heap_stats(h, &st);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, (int64_t)(2 * MiB)); /* one page mapped, not a 2 MiB segment's rounding */
    vg_heap_free(h, p);
    vg_heap_destroy(h);
    dev->ops->destroy(dev);
}

static void test_bad_input(void)
{
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 4096, 0, NULL);
    CHECK_EQ(vg_heap_free(f.heap, NULL), VG_OK);
    CHECK_EQ(vg_heap_free(f.heap, (char *)a + 512), VG_ERR_INVALID); /* interior */
    CHECK_EQ(vg_heap_free(f.heap, (void *)(uintptr_t)0xdeadbeef000), VG_ERR_INVALID);
    CHECK_EQ(vg_heap_free(f.heap, a), VG_OK);
    CHECK_EQ(vg_heap_free(f.heap, a), VG_ERR_INVALID); /* double free */
    CHECK_EQ(vg_heap_record_stream(f.heap, a, 3), VG_ERR_INVALID);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.num_invalid_frees, 3);
    CHECK_HEAP(f.heap);

    vg_oom_info oom;
    CHECK(vg_heap_alloc(f.heap, 0, 0, &oom) == NULL);
    CHECK_EQ(stats_of(f.heap).num_zero_allocs, 1);
    CHECK_EQ(stats_of(f.heap).num_ooms, 0);
    CHECK(vg_heap_alloc(f.heap, SIZE_MAX, 0, &oom) == NULL);
    CHECK_EQ(oom.requested, SIZE_MAX);
    CHECK_EQ(oom.rounded, 0);
    CHECK(vg_heap_alloc(f.heap, SIZE_MAX - 511, 0, &oom) == NULL);
    CHECK(vg_heap_alloc(f.heap, VG_MAX_REQUEST, 0, &oom) == NULL);
    CHECK(vg_heap_alloc(f.heap, 2 * GiB, 0, &oom) == NULL);
    CHECK_EQ(stats_of(f.heap).num_ooms, 4);
    CHECK_HEAP(f.heap);

    vg_heap_config bad = {NULL, 0, 2.0};
    CHECK(vg_heap_create(f.dev, &bad) == NULL);
    CHECK(vg_heap_create(NULL, NULL) == NULL);
    /* Sim controls ignore devices that are not simulated. */
    vg_device not_sim = {0};
    vg_sim_fail_nth(&not_sim, 1);
    CHECK_EQ(vg_sim_used(&not_sim), 0);
    destroy(f);
}

/* ------------------------------------------------------------------ */
/* Visiting, histogram, trace                                          */
/* ------------------------------------------------------------------ */

typedef struct visit_tally {
    size_t segments, blocks, live, bytes;
} visit_tally;

static int on_segment(void *arg, const vg_segment_info *seg)
{
    visit_tally *t = arg;
    t->segments++;
    t->bytes += seg->size;
    return 0;
}

static int on_block(void *arg, const vg_block_info *blk)
{
    visit_tally *t = arg;
    t->blocks++;
    t->live += blk->state == VG_BLOCK_LIVE;
    return 0;
}

static void test_visit_and_histogram(void)
{
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    void *p[5];
    for (int i = 0; i < 4; i++) p[i] = vg_heap_alloc(f.heap, 1000, 0, NULL);
    p[4] = vg_heap_alloc(f.heap, 30 * MiB, 0, NULL);
    visit_tally t = {0, 0, 0, 0};
    CHECK_EQ(vg_heap_visit(f.heap, on_segment, on_block, &t), 0);
    CHECK_EQ(t.segments, 2);
    CHECK_EQ(t.blocks, 6); /* 4 small + tail, 1 large */
    CHECK_EQ(t.live, 5);
    CHECK_EQ(t.bytes, 32 * MiB);
    uint64_t lo[8], n[8];
    CHECK_EQ(vg_heap_histogram(f.heap, lo, n, 8), 2);
    CHECK_EQ(lo[0], 1024);
    CHECK_EQ(n[0], 4);
    CHECK(lo[1] <= 30 * MiB);
    CHECK_EQ(n[1], 1);
    for (int i = 0; i < 5; i++) vg_heap_free(f.heap, p[i]);
    CHECK_EQ(vg_heap_histogram(f.heap, lo, n, 8), 0);
    destroy(f);
}

/* A caller sizes its buffers, then a class appears before it fills them:
 * the second call writes what fits and says so, never what exists. */
static void test_histogram_class_appearing_between_calls(void)
{
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 1000, 0, NULL);
    void *b = vg_heap_alloc(f.heap, 30 * MiB, 0, NULL);
    uint64_t lo[VG_SIZE_CLASSES + 1], n[VG_SIZE_CLASSES + 1];
    size_t sized = vg_heap_histogram(f.heap, lo, n, VG_SIZE_CLASSES);
    CHECK_EQ(sized, 2);
    void *c = vg_heap_alloc(f.heap, 5000, 0, NULL); /* a class between the two */
    lo[sized] = n[sized] = 0xC0FFEE;
    CHECK_EQ(vg_heap_histogram(f.heap, lo, n, sized), sized);
    CHECK_EQ(lo[sized], 0xC0FFEE);
    CHECK_EQ(n[sized], 0xC0FFEE);
    CHECK_EQ(lo[0], 1024);
    CHECK_EQ(lo[1], 5120);
    CHECK_EQ(vg_heap_histogram(f.heap, lo, n, VG_SIZE_CLASSES), 3);
    CHECK_EQ(vg_heap_histogram(f.heap, lo, n, 0), 0);
    vg_heap_free(f.heap, a);
    vg_heap_free(f.heap, b);
    vg_heap_free(f.heap, c);
    destroy(f);
}

static void test_history_ring(void)
{
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    CHECK_EQ(vg_heap_history_start(f.heap, 0), VG_ERR_ARG);
    CHECK_EQ(vg_heap_history_start(f.heap, 4), VG_OK);
    void *a = vg_heap_alloc(f.heap, 1000, 5, NULL);
    vg_heap_free(f.heap, a);
    vg_heap_empty_cache(f.heap);
    vg_history_event ev[8];
    uint64_t dropped = 0;
    /* reserve, alloc, free, release, empty_cache: 5 events in a ring of 4 */
    size_t n = vg_heap_history_take(f.heap, ev, 8, &dropped);
    CHECK_EQ(n, 4);
    CHECK_EQ(dropped, 1);
    CHECK_EQ(ev[0].kind, VG_EV_ALLOC);
    CHECK_EQ(ev[0].requested, 1000);
    CHECK_EQ(ev[0].size, 1024);
    CHECK_EQ(ev[0].stream, 5);
    CHECK_EQ(ev[1].kind, VG_EV_FREE);
    CHECK_EQ(ev[2].kind, VG_EV_RELEASE);
    CHECK_EQ(ev[3].kind, VG_EV_EMPTY_CACHE);
    CHECK(ev[0].time_ns <= ev[3].time_ns);
    vg_heap_history_stop(f.heap);
    CHECK(!vg_heap_history_active(f.heap));
    vg_heap_alloc(f.heap, 1000, 5, NULL);
    CHECK_EQ(vg_heap_history_take(f.heap, ev, 8, NULL), 0);
    destroy(f);
}

static uint32_t stack_calls;
static uint32_t counting_stack_source(void)
{
    return 100 + stack_calls++;
}

/* A recording with a stack source: each allocation event carries the id it
 * returned, one call per allocation (zero-size ones included, which record
 * nothing); other events carry none, and a stop stops the calls. */
static void test_history_stacks(void)
{
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    stack_calls = 0;
    CHECK_EQ(vg_heap_history_start_stacks(f.heap, 16, counting_stack_source), VG_OK);
    void *a = vg_heap_alloc(f.heap, 1000, 0, NULL);
    CHECK(vg_heap_alloc(f.heap, 0, 0, NULL) == NULL);
    void *b = vg_heap_alloc(f.heap, 3000, 0, NULL);
    vg_heap_free(f.heap, a);
    vg_heap_history_stop(f.heap);
    void *c = vg_heap_alloc(f.heap, 1000, 0, NULL);
    CHECK_EQ(stack_calls, 3);
    vg_history_event ev[8];
    size_t n = vg_heap_history_take(f.heap, ev, 8, NULL);
    CHECK_EQ(n, 4); /* reserve, alloc, alloc, free */
    CHECK_EQ(ev[0].kind, VG_EV_RESERVE);
    CHECK_EQ(ev[0].stack, 0);
    CHECK_EQ(ev[1].kind, VG_EV_ALLOC);
    CHECK_EQ(ev[1].stack, 100);
    CHECK_EQ(ev[2].stack, 102);
    CHECK_EQ(ev[3].kind, VG_EV_FREE);
    CHECK_EQ(ev[3].stack, 0);
    vg_heap_free(f.heap, b);
    vg_heap_free(f.heap, c);
    destroy(f);
}

/* ------------------------------------------------------------------ */
/* Random sequences                                                    */
/* ------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Sizes as in a training step: mostly small, some mid, a few large. */
static size_t random_size(uint64_t *rng)
{
    uint64_t r = rng_next(rng);
    switch (r % 10) {
    case 0: case 1: case 2: case 3: case 4: return 1 + (size_t)(r >> 8) % (64 * KiB);
    case 5: case 6: return 1 + (size_t)(r >> 8) % MiB;
    case 7: case 8: return MiB + (size_t)(r >> 8) % (16 * MiB);
    default: return 16 * MiB + (size_t)(r >> 8) % (128 * MiB);
    }
}

static void run_random(const vg_policy *policy, size_t budget, double gc, uint64_t seed, int ops)
{
    enum { SLOTS = 512 };
    fixture f = make(4 * GiB, budget, gc, policy);
    void *live[SLOTS] = {0};
    uint64_t rng = seed;
    int64_t ooms = 0;
    for (int i = 0; i < ops; i++) {
        uint64_t r = rng_next(&rng);
        int slot = (int)(r % SLOTS);
        if (live[slot]) {
            if ((r >> 20) % 8 == 0) vg_heap_record_stream(f.heap, live[slot], 10 + (r >> 24) % 3);
            CHECK_EQ(vg_heap_free(f.heap, live[slot]), VG_OK);
            live[slot] = NULL;
        } else {
            live[slot] = vg_heap_alloc(f.heap, random_size(&rng), (r >> 32) % 3, NULL);
            ooms += live[slot] == NULL;
        }
        if ((r >> 40) % 97 == 0) vg_sim_complete_stream(f.dev, 10 + (r >> 44) % 3);
        if ((r >> 48) % 5000 == 0) vg_heap_empty_cache(f.heap);
        if (i % 2000 == 0) CHECK_HEAP(f.heap);
    }
    CHECK_EQ(stats_of(f.heap).num_ooms, (uint64_t)ooms);
    for (int s = 0; s < SLOTS; s++) CHECK_EQ(vg_heap_free(f.heap, live[s]), VG_OK);
    vg_heap_synchronize(f.heap);
    vg_heap_empty_cache(f.heap);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 0);
    CHECK_EQ(st.allocated_bytes[VG_STAT_ALL].current, 0);
    CHECK_EQ(st.active[VG_STAT_ALL].current, 0);
    CHECK_EQ(vg_sim_used(f.dev), 0);
    if (budget) CHECK(st.reserved_bytes[VG_STAT_ALL].peak <= (int64_t)budget);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_random_default(void) { run_random(&vg_policy_default, 0, 0, 1, 200000); }
static void test_random_budget(void) { run_random(&vg_policy_default, 3 * GiB, 0, 2, 200000); }
static void test_random_budget_gc(void) { run_random(&vg_policy_default, 2 * GiB, 0.7, 3, 200000); }
static void test_random_torch(void) { run_random(&vg_policy_torch, 2 * GiB, 0, 4, 200000); }

static void test_random_fault_injection(void)
{
    fixture f = make(4 * GiB, 0, 0, &vg_policy_default);
    vg_sim_fail_random(f.dev, 0.3, 99);
    void *live[256] = {0};
    uint64_t rng = 7;
    for (int i = 0; i < 50000; i++) {
        int slot = (int)(rng_next(&rng) % 256);
        if (live[slot]) {
            CHECK_EQ(vg_heap_free(f.heap, live[slot]), VG_OK);
            live[slot] = NULL;
        } else {
            live[slot] = vg_heap_alloc(f.heap, random_size(&rng), 0, NULL);
        }
        if (i % 5000 == 0) CHECK_HEAP(f.heap);
    }
    vg_stats st = stats_of(f.heap);
    CHECK(st.num_device_alloc_failed > 0);
    CHECK(st.num_alloc_retries > 0);
    CHECK_HEAP(f.heap);
    destroy(f);
}

/* ------------------------------------------------------------------ */
/* Bounded best fit                                                    */
/* ------------------------------------------------------------------ */

/* `nfree` free 512 B blocks, each between two live ones (none coalesce);
 * held[] keeps the live ones. */
static void **hold_free_blocks(vg_heap *h, size_t nfree)
{
    void **held = calloc(2 * nfree + 1, sizeof *held);
    for (size_t i = 0; i < 2 * nfree + 1; i++) held[i] = vg_heap_alloc(h, VG_ALIGN, 0, NULL);
    for (size_t i = 1; i < 2 * nfree + 1; i += 2) {
        vg_heap_free(h, held[i]);
        held[i] = NULL;
    }
    return held;
}

static void release_held(vg_heap *h, void **held, size_t nfree)
{
    for (size_t i = 0; i < 2 * nfree + 1; i++) vg_heap_free(h, held[i]);
    free(held);
}

static int log2_ceil(size_t n)
{
    int k = 0;
    while (((size_t)1 << k) < n) k++;
    return k;
}

/* Nodes the bin trees visit for one alloc+free of 512 B. */
static uint64_t steps_of_one_pair(vg_heap *h, void **got)
{
    uint64_t before = vg__debug_tree_steps;
    *got = vg_heap_alloc(h, VG_ALIGN, 0, NULL);
    vg_heap_free(h, *got);
    return vg__debug_tree_steps - before;
}

static void test_best_fit_bounded_with_many_free_blocks(void)
{
    /* With 50,000 free blocks in the class, best fit still gives the
     * lowest address (as an ordered set would) and reads a handful of
     * nodes, not the class: a loop that frees and allocates one size finds
     * its block first in the class, and puts it back there. */
    const vg_policy *policies[2] = {&vg_policy_default, &vg_policy_torch};
    for (int p = 0; p < 2; p++) {
        fixture f = make(GiB, 0, 0, policies[p]);
        enum { NFREE = 50000 };
        void **held = hold_free_blocks(f.heap, NFREE);
        CHECK_EQ(f.heap->bins[VG_POOL_SMALL][1].count, NFREE);
        uintptr_t lowest = (uintptr_t)held[0] + VG_ALIGN;
        void *got;
        uint64_t most = 0, total = 0;
        for (int i = 0; i < 1000; i++) {
            uint64_t steps = steps_of_one_pair(f.heap, &got);
            total += steps;
            if (steps > most) most = steps;
            CHECK_EQ((uintptr_t)got, lowest);
        }
        /* O(1) amortized (rebalancing now and then climbs the tree), and
         * never more than the tree's height allows. */
        CHECK(total <= 2 * 1000);
        CHECK(most <= (uint64_t)(4 * log2_ceil(NFREE)));
        CHECK_HEAP(f.heap);
        release_held(f.heap, held, NFREE);
        destroy(f);
    }
}

static void test_best_fit_bounded_in_any_order(void)
{
    /* Frees in a scrambled order: every insert, removal and lookup in a
     * class of 20,000 blocks reads O(log n) nodes, the tree stays balanced
     * (vg_heap_check verifies the red-black rules), and each allocation
     * still gets the lowest free address. */
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    enum { N = 20000 };
    void **p = calloc(2 * N, sizeof *p);
    for (size_t i = 0; i < 2 * N; i++) p[i] = vg_heap_alloc(f.heap, VG_ALIGN, 0, NULL);
    uint64_t rng = 99, most = 0;
    size_t order[N];
    for (size_t i = 0; i < N; i++) order[i] = 2 * i;
    for (size_t i = N - 1; i > 0; i--) {
        size_t j = (size_t)(rng_next(&rng) % (i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < N; i++) {
        uint64_t before = vg__debug_tree_steps;
        vg_heap_free(f.heap, p[order[i]]);
        uint64_t steps = vg__debug_tree_steps - before;
        if (steps > most) most = steps;
    }
    CHECK_HEAP(f.heap);
    /* Insert: descent (2 log n at most in a red-black tree) plus
     * rebalancing; removal of the neighbours: their in-order neighbours. */
    CHECK(most <= (uint64_t)(6 * log2_ceil(N)));
    for (size_t i = 0; i < N; i++) {
        uint64_t before = vg__debug_tree_steps;
        void *q = vg_heap_alloc(f.heap, VG_ALIGN, 0, NULL);
        uint64_t steps = vg__debug_tree_steps - before;
        if (steps > most) most = steps;
        CHECK(q == p[2 * i]); /* lowest address first */
    }
    CHECK(most <= (uint64_t)(6 * log2_ceil(N)));
    CHECK_HEAP(f.heap);
    for (size_t i = 0; i < 2 * N; i++) vg_heap_free(f.heap, p[i]);
    free(p);
    CHECK_HEAP(f.heap);
    destroy(f);
}

/* Free blocks of the given sizes on `stream`, each between two live ones. */
static void free_blocks_of(vg_heap *h, vg_stream_t stream, const size_t *sizes, int n, void **out)
{
    for (int i = 0; i < n; i++) {
        vg_heap_alloc(h, VG_ALIGN, stream, NULL);
        out[i] = vg_heap_alloc(h, sizes[i], stream, NULL);
    }
    vg_heap_alloc(h, VG_ALIGN, stream, NULL);
    for (int i = n - 1; i >= 0; i--) vg_heap_free(h, out[i]);
}

static void test_best_fit_smallest_then_lowest_per_stream(void)
{
    /* One class (128-132 KiB), several sizes on two streams: the smallest
     * block that fits, the lowest address among equals, and never another
     * stream's block, however well it would fit. */
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    CHECK_EQ(vg__bin_of_size(128 * KiB), vg__bin_of_size(131 * KiB + 512));
    size_t mine_sizes[6] = {130 * KiB + 512, 129 * KiB, 129 * KiB + 512, 129 * KiB, 130 * KiB, 129 * KiB};
    size_t their_sizes[3] = {128 * KiB + 512, 129 * KiB + 512, 129 * KiB};
    void *mine[6], *theirs[3];
    free_blocks_of(f.heap, 1, mine_sizes, 6, mine);
    free_blocks_of(f.heap, 2, their_sizes, 3, theirs);
    CHECK_HEAP(f.heap);
    CHECK(vg_heap_alloc(f.heap, 128 * KiB + 512, 1, NULL) == mine[1]);
    CHECK(vg_heap_alloc(f.heap, 129 * KiB, 1, NULL) == mine[3]);
    CHECK(vg_heap_alloc(f.heap, 129 * KiB, 1, NULL) == mine[5]);
    CHECK(vg_heap_alloc(f.heap, 129 * KiB, 1, NULL) == mine[2]);
    CHECK(vg_heap_alloc(f.heap, 129 * KiB + 512, 1, NULL) == mine[4]);
    CHECK(vg_heap_alloc(f.heap, 129 * KiB + 512, 1, NULL) == mine[0]);
    CHECK(vg_heap_alloc(f.heap, 129 * KiB, 2, NULL) == theirs[2]);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_check_names_broken_invariants(void)
{
    /* vg_heap_check names the equation that fails; put back, it passes. */
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    size_t sizes[4] = {129 * KiB, 130 * KiB, 129 * KiB + 512, 131 * KiB};
    void *blk[4];
    free_blocks_of(f.heap, 1, sizes, 4, blk);
    CHECK_HEAP(f.heap);
    vg_bin *bin = &f.heap->bins[VG_POOL_SMALL][vg__bin_of_size(129 * KiB)];
    CHECK_EQ(bin->count, 4);

    vg_block *root = bin->root;
    root->red = true;
    CHECK(strcmp(vg_heap_check(f.heap), "bin tree root is wrong") == 0);
    root->red = false;
    CHECK_HEAP(f.heap);

    vg_block *least = bin->first;
    vg_block *leaf = least->link.tree.right ? least->link.tree.right : least;
    bool was_red = leaf->red;
    leaf->red = !was_red;
    CHECK(vg_heap_check(f.heap) != NULL);
    leaf->red = was_red;
    CHECK_HEAP(f.heap);

    bin->count++;
    CHECK(strcmp(vg_heap_check(f.heap), "bin count is off") == 0);
    bin->count--;

    vg_class_map *map = &least->owner->classes[VG_POOL_SMALL];
    uint32_t spare = vg__bin_of_size(3 * KiB);
    CHECK(!vg__class_marked(map, spare));
    vg__class_mark(map, spare);
    CHECK(strcmp(vg_heap_check(f.heap), "class marked for a stream without a block there") == 0);
    vg__class_unmark(map, spare);
    CHECK_HEAP(f.heap);

    vg_segment *seg = least->seg;
    seg->stream->segments++;
    CHECK(strcmp(vg_heap_check(f.heap), "stream records do not count the segments") == 0);
    seg->stream->segments--;

    least->size += VG_ALIGN;
    CHECK(vg__check_block(f.heap, least) != NULL);
    CHECK(vg_heap_check(f.heap) != NULL);
    least->size -= VG_ALIGN;
    CHECK(vg__check_block(f.heap, least) == NULL);
    CHECK_HEAP(f.heap);
    destroy(f);
}

/* ------------------------------------------------------------------ */
/* Stream records                                                      */
/* ------------------------------------------------------------------ */

static void test_many_streams_bounded_state(void)
{
    /* 100,000 streams, each allocating once: under a 64 MiB budget the
     * ladder releases the idle segments of streams gone by, and their
     * records go with them. At most one record per segment the budget
     * holds, plus the one allocating, ever lives. */
    fixture f = make(GiB, 64 * MiB, 0, &vg_policy_default);
    enum { STREAMS = 100000 };
    size_t most = 0;
    for (vg_stream_t s = 1; s <= STREAMS; s++) {
        void *p = vg_heap_alloc(f.heap, 4096, s, NULL);
        CHECK(p != NULL);
        CHECK_EQ(vg_heap_free(f.heap, p), VG_OK);
        if (f.heap->streams.count > most) most = f.heap->streams.count;
        if (s % 20000 == 0) CHECK_HEAP(f.heap);
    }
    CHECK(most <= 64 / 2);
    CHECK(f.heap->streams.bits <= 6);
    vg_heap_empty_cache(f.heap);
    CHECK_EQ(f.heap->streams.count, 0);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_stream_state_freed_with_its_last_segment(void)
{
    fixture f = make(64 * MiB, 0, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 1000, 7, NULL);
    void *b = vg_heap_alloc(f.heap, 30 * MiB, 7, NULL);
    CHECK_EQ(f.heap->streams.count, 1);
    vg_heap_free(f.heap, a);
    vg_heap_free(f.heap, b);
    /* Its segments are cached: the record stays. */
    CHECK_EQ(f.heap->streams.count, 1);
    CHECK_EQ(vg_heap_empty_cache(f.heap), 32 * MiB);
    CHECK_EQ(f.heap->streams.count, 0);
    /* A request that fails leaves no record behind. */
    vg_oom_info oom;
    CHECK(vg_heap_alloc(f.heap, 100 * MiB, 8, &oom) == NULL);
    CHECK_EQ(f.heap->streams.count, 0);
    /* Streams only recorded on (record_stream) get no record. */
    void *c = vg_heap_alloc(f.heap, 1000, 9, NULL);
    for (vg_stream_t s = 100; s < 200; s++) CHECK_EQ(vg_heap_record_stream(f.heap, c, s), VG_OK);
    CHECK_EQ(f.heap->streams.count, 1);
    vg_heap_free(f.heap, c);
    vg_heap_synchronize(f.heap);
    /* The ladder releasing the requesting stream's last segment keeps its
     * record for the segment it reserves next. */
    void *d = vg_heap_alloc(f.heap, 40 * MiB, 9, NULL);
    CHECK(d != NULL);
    CHECK_EQ(stats_of(f.heap).num_stream_releases, 0);
    vg_heap_free(f.heap, d);
    void *e = vg_heap_alloc(f.heap, 50 * MiB, 9, NULL); /* 42 + 50 > 64 */
    CHECK(e != NULL);
    CHECK_EQ(stats_of(f.heap).num_stream_releases, 2);
    CHECK_EQ(f.heap->streams.count, 1);
    CHECK_HEAP(f.heap);
    vg_heap_free(f.heap, e);
    destroy(f);
}

static void test_replay_of_many_streams(void)
{
    /* The replay engine on a trace of 100,000 streams (alloc, free each):
     * no OOM, and under a budget only the streams with cached segments
     * keep a record. */
    enum { STREAMS = 100000, OPS = 2 * STREAMS };
    uint8_t *kinds = malloc(OPS);
    uint32_t *ids = malloc(OPS * sizeof *ids);
    uint64_t *sizes = malloc(OPS * sizeof *sizes), *streams = malloc(OPS * sizeof *streams);
    for (size_t i = 0; i < STREAMS; i++) {
        kinds[2 * i] = VG_OP_ALLOC;
        kinds[2 * i + 1] = VG_OP_FREE;
        ids[2 * i] = ids[2 * i + 1] = (uint32_t)(i % 4);
        sizes[2 * i] = sizes[2 * i + 1] = 4096;
        streams[2 * i] = streams[2 * i + 1] = 0x7f0000000000ull + 0x1000 * i;
    }
    vg_trace_ops t = {kinds, ids, sizes, streams, OPS, 4};
    fixture f = make((size_t)1 << 40, 32 * MiB, 0, &vg_policy_default);
    vg_replay_result r;
    CHECK_EQ(vg_replay(f.heap, &t, NULL, 0, 0, &r), VG_OK);
    CHECK_EQ(r.ooms, 0);
    CHECK_EQ(r.allocs, STREAMS);
    CHECK(f.heap->streams.count <= 16);
    CHECK_HEAP(f.heap);
    destroy(f);
    free(kinds);
    free(ids);
    free(sizes);
    free(streams);
}

/* ------------------------------------------------------------------ */
/* Threads: autograd frees from other threads                          */
/* ------------------------------------------------------------------ */

typedef struct thread_job {
    vg_heap *heap;
    uint64_t seed;
    int errors;
} thread_job;

static void *thread_main(void *arg)
{
    thread_job *job = arg;
    enum { SLOTS = 64 };
    void *live[SLOTS] = {0};
    uint64_t rng = job->seed;
    for (int i = 0; i < 100000; i++) {
        int slot = (int)(rng_next(&rng) % SLOTS);
        if (live[slot]) {
            job->errors += vg_heap_free(job->heap, live[slot]) != VG_OK;
            live[slot] = NULL;
        } else {
            live[slot] = vg_heap_alloc(job->heap, 1 + (size_t)(rng_next(&rng) % (4 * MiB)), 0, NULL);
            job->errors += live[slot] == NULL;
        }
    }
    for (int s = 0; s < SLOTS; s++) job->errors += vg_heap_free(job->heap, live[s]) != VG_OK;
    return NULL;
}

static void test_threads(void)
{
    enum { THREADS = 4 };
    fixture f = make(64 * GiB, 0, 0, &vg_policy_default);
    pthread_t tid[THREADS];
    thread_job jobs[THREADS];
    for (int i = 0; i < THREADS; i++) {
        jobs[i] = (thread_job){f.heap, 1000 + (uint64_t)i, 0};
        CHECK_EQ(pthread_create(&tid[i], NULL, thread_main, &jobs[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(tid[i], NULL);
    for (int i = 0; i < THREADS; i++) CHECK_EQ(jobs[i].errors, 0);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.allocated_bytes[VG_STAT_ALL].current, 0);
    CHECK_EQ(st.allocation[VG_STAT_ALL].allocated, st.allocation[VG_STAT_ALL].freed);
    CHECK_HEAP(f.heap);
    destroy(f);
}

/* A use whose event could not be recorded is finished only by a
 * synchronize that worked: not by one the provider skipped (a capture),
 * nor by one that failed. Until then its block is not reused. */
static void test_unrecorded_use_waits_for_a_synchronize_that_worked(void)
{
    vg_device *dev = vg_sim_create(1 * GiB);
    vg_heap_config cfg = {&vg_policy_default, 0, 0};
    vg_heap *h = vg_heap_create(dev, &cfg);
    void *p = vg_heap_alloc(h, 1000, 0, NULL);
    CHECK_EQ(vg_heap_record_stream(h, p, 7), VG_OK);
    vg_sim_fail_events(dev, 1);
    vg_sim_synchronize_answer(dev, VG_ERR_BUSY);
    CHECK_EQ(vg_heap_free(h, p), VG_OK); /* no event, and the synchronize skipped */
    vg_stats st;
    vg_heap_stats(h, &st);
    CHECK_EQ(st.active[VG_STAT_ALL].current, 1);
    CHECK_EQ(st.num_device_errors, 0);
    void *q = vg_heap_alloc(h, 1000, 0, NULL);
    CHECK(q && q != p);
    vg_heap_synchronize(h); /* skipped again */
    vg_sim_synchronize_answer(dev, VG_ERR_DEVICE);
    vg_heap_synchronize(h); /* failed */
    vg_heap_stats(h, &st);
    CHECK_EQ(st.active[VG_STAT_ALL].current, 2);
    CHECK_EQ(st.num_device_errors, 1);
    void *r = vg_heap_alloc(h, 1000, 0, NULL);
    CHECK(r && r != p);
    vg_sim_synchronize_answer(dev, VG_OK);
    vg_heap_synchronize(h);
    vg_heap_stats(h, &st);
    CHECK_EQ(st.active[VG_STAT_ALL].current, 2);
    void *again = vg_heap_alloc(h, 1000, 0, NULL);
    CHECK(again == p);
    vg_heap_free(h, again);
    vg_heap_free(h, q);
    vg_heap_free(h, r);
    CHECK_HEAP(h);
    vg_heap_destroy(h);
    dev->ops->destroy(dev);
}

/* Each allocation that succeeds counts once: a hit, or a miss when its
 * block is a segment reserved for it, whichever ladder step found it. */
#define CHECK_HITS_AND_MISSES(h)                                                   \
    do {                                                                           \
        vg_stats st_ = stats_of(h);                                                \
        CHECK_EQ(st_.num_cache_hits + st_.num_cache_misses,                        \
                 st_.allocation[VG_STAT_ALL].allocated);                           \
    } while (0)

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A seeded random sequence near the device's capacity, with deferred
 * frees: it takes every path of the ladder (checked below). */
static void run_random_sequence(const vg_policy *policy, uint64_t seed, vg_stats *out)
{
    fixture f = make(96 * MiB, 0, 0, policy);
    void *slot[32] = {0};
    uint64_t rng = seed, allocs = 0;
    for (int i = 0; i < 4000; i++) {
        int k = (int)(xorshift(&rng) % 32);
        if (slot[k]) {
            if (xorshift(&rng) % 4 == 0) vg_heap_record_stream(f.heap, slot[k], 9);
            CHECK_EQ(vg_heap_free(f.heap, slot[k]), VG_OK);
            slot[k] = NULL;
            if (xorshift(&rng) % 8 == 0) vg_sim_complete_stream(f.dev, 9);
            continue;
        }
        uint64_t r = xorshift(&rng);
        size_t size = r % 4 == 0 ? 1 + (size_t)(r >> 8) % (24 * MiB) : 1 + (size_t)(r >> 8) % (2 * MiB);
        slot[k] = vg_heap_alloc(f.heap, size, (vg_stream_t)(r >> 60) % 2, NULL);
        if (slot[k]) allocs++;
        CHECK_HITS_AND_MISSES(f.heap);
    }
    for (int k = 0; k < 32; k++) vg_heap_free(f.heap, slot[k]);
    *out = stats_of(f.heap);
    CHECK_EQ(out->allocation[VG_STAT_ALL].allocated, allocs);
    CHECK_HEAP(f.heap);
    destroy(f);
}

static void test_hits_and_misses_count_each_allocation_once(void)
{
    vg_stats a, b;
    run_random_sequence(&vg_policy_default, 12345, &a);
    run_random_sequence(&vg_policy_torch, 777, &b);
    /* the paths that used to count twice or not at all were taken */
    CHECK(a.num_sync_all_streams + b.num_sync_all_streams > 0);
    CHECK(a.num_kept_whole + b.num_kept_whole > 0);
    CHECK(a.num_oversize_splits + b.num_oversize_splits + a.num_oversize_releases +
              b.num_oversize_releases > 0);
    CHECK(a.num_ooms > 0 && b.num_ooms > 0);
}

/* The ladder's paths one by one: found again after the synchronize, a fit
 * kept whole with a segment beside it. */
static void test_hits_and_misses_on_each_ladder_path(void)
{
    fixture f = make(8 * MiB, 0, 0, &vg_policy_default);
    void *a = vg_heap_alloc(f.heap, 6 * MiB, 0, NULL);
    CHECK_EQ(vg_heap_record_stream(f.heap, a, 7), VG_OK);
    vg_heap_free(f.heap, a);
    vg_sim_complete_stream(f.dev, 7);
    /* the event completes only as the synchronize sees it: found again */
    void *b = vg_heap_alloc(f.heap, 6 * MiB, 0, NULL);
    CHECK(b == a);
    vg_stats st = stats_of(f.heap);
    CHECK_EQ(st.num_cache_misses, 1);
    CHECK_EQ(st.num_cache_hits, 1);
    vg_heap_free(f.heap, b);
    destroy(f);

    f = make(GiB, 300 * MiB, 0, &vg_policy_default); /* 200 of 300 MiB reserved: the pressure */
    void *big = vg_heap_alloc(f.heap, 200 * MiB, 0, NULL);
    vg_heap_free(f.heap, big);
    void *small = vg_heap_alloc(f.heap, 20 * MiB, 0, NULL); /* kept whole: a fresh segment */
    CHECK(small != big);
    st = stats_of(f.heap);
    CHECK_EQ(st.num_kept_whole, 1);
    CHECK_EQ(st.num_cache_misses, 2);
    CHECK_EQ(st.num_cache_hits, 0);
    vg_heap_free(f.heap, small);
    CHECK_HITS_AND_MISSES(f.heap);
    destroy(f);
}

/* Deferred frees are finished oldest first, and one pass queries a busy
 * stream once: its later events cannot have finished before it. */
static void test_pending_frees_query_each_busy_stream_once(void)
{
    fixture f = make(GiB, 0, 0, &vg_policy_default);
    void *p[8];
    for (int i = 0; i < 8; i++) {
        p[i] = vg_heap_alloc(f.heap, 1000, 0, NULL);
        CHECK_EQ(vg_heap_record_stream(f.heap, p[i], i < 6 ? 7 : 8), VG_OK);
    }
    for (int i = 0; i < 8; i++) CHECK_EQ(vg_heap_free(f.heap, p[i]), VG_OK);
    uint64_t before = vg_sim_event_queries(f.dev);
    void *q = vg_heap_alloc(f.heap, 1000, 0, NULL); /* one pass: streams 7 and 8 once each */
    CHECK_EQ(vg_sim_event_queries(f.dev) - before, 2);
    vg_sim_complete_stream(f.dev, 8);
    before = vg_sim_event_queries(f.dev);
    vg_heap_free(f.heap, q);
    q = vg_heap_alloc(f.heap, 1000, 0, NULL); /* 7 once; 8's two finish */
    CHECK_EQ(vg_sim_event_queries(f.dev) - before, 3);
    vg_fragmentation fr;
    vg_heap_fragmentation(f.heap, &fr);
    CHECK_EQ(fr.pending_blocks, 6);
    vg_sim_complete_stream(f.dev, 7);
    vg_heap_free(f.heap, q);
    q = vg_heap_alloc(f.heap, 1000, 0, NULL);
    vg_heap_fragmentation(f.heap, &fr);
    CHECK_EQ(fr.pending_blocks, 0);
    vg_heap_free(f.heap, q);
    CHECK_HEAP(f.heap);
    destroy(f);
}

#define T(fn) {#fn, fn}
static const harness_test tests[] = {
    T(test_round_size),
    T(test_bin_classes),
    T(test_addr_map),
    T(test_small_alloc_split_coalesce),
    T(test_large_segments),
    T(test_large_split_rule),
    T(test_torch_policy_segments),
    T(test_keep_big_idle_segment_whole_under_budget),
    T(test_far_from_the_ceiling),
    T(test_reuse_only_on_same_stream),
    T(test_record_stream_defers_reuse),
    T(test_empty_cache_waits_for_deferred_frees),
    T(test_budget_shrinks_then_refuses),
    T(test_release_same_stream_then_retry),
    T(test_sync_release_all_then_retry),
    T(test_sync_finishes_deferred_free_and_reuses_it),
    T(test_torch_policy_releases_before_refit),
    T(test_gc_threshold_releases_oldest),
    T(test_device_refusal_and_fault_injection),
    T(test_lowering_budget_releases_idle),
    T(test_no_policy_means_the_recommended_one),
    T(test_bad_input),
    T(test_visit_and_histogram),
    T(test_histogram_class_appearing_between_calls),
    T(test_history_ring),
    T(test_history_stacks),
    T(test_random_default),
    T(test_random_budget),
    T(test_random_budget_gc),
    T(test_random_torch),
    T(test_random_fault_injection),
    T(test_best_fit_bounded_with_many_free_blocks),
    T(test_best_fit_bounded_in_any_order),
    T(test_best_fit_smallest_then_lowest_per_stream),
    T(test_check_names_broken_invariants),
    T(test_many_streams_bounded_state),
    T(test_stream_state_freed_with_its_last_segment),
    T(test_replay_of_many_streams),
    T(test_threads),
    T(test_unrecorded_use_waits_for_a_synchronize_that_worked),
    T(test_hits_and_misses_count_each_allocation_once),
    T(test_hits_and_misses_on_each_ladder_path),
    T(test_pending_frees_query_each_busy_stream_once),
};

int main(int argc, char **argv)
{
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
