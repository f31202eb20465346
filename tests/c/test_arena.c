/* The arena (csrc/core/arena.c) on the simulated device: exact mapped bytes
 * and map calls after known sequences, the pressure that unmaps, faults
 * met while mapping, and seeded random sequences checked at every step. */
#include "heap_internal.h"
#include "harness.h"
#include "vramguard/device.h"
#include "vramguard/heap.h"
#include "vramguard/history.h"
#include "vramguard/report.h"

#include <pthread.h>
#include <stdlib.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

typedef struct fixture {
    vg_device *dev;
    vg_heap *h;
} fixture;

static fixture make(size_t capacity, size_t budget, double gc)
{
    fixture f;
    f.dev = vg_sim_create(capacity);
    vg_heap_config cfg = {&vg_policy_arena, budget, gc};
    f.h = vg_heap_create(f.dev, &cfg);
    return f;
}

static void done(fixture *f)
{
    vg_heap_destroy(f->h);
    CHECK_EQ(vg_sim_used(f->dev), 0);
    f->dev->ops->destroy(f->dev);
}

static vg_stats stats_of(vg_heap *h)
{
    vg_stats st;
    vg_heap_stats(h, &st);
    return st;
}

static size_t reserved(vg_heap *h)
{
    return (size_t)stats_of(h).reserved_bytes[VG_STAT_ALL].current;
}

/* The heap's books and the device's agree on what is mapped. */
#define CHECK_MAPPED(f, bytes)                                                   \
    do {                                                                         \
        CHECK_HEAP((f).h);                                                       \
        CHECK_EQ(reserved((f).h), (bytes));                                      \
        CHECK_EQ(vg_sim_used((f).dev), (bytes));                                 \
    } while (0)

/* ------------------------------------------------------------------ */
/* Choosing the arena                                                  */
/* ------------------------------------------------------------------ */

static void test_policies_by_name(void)
{
    CHECK(vg_policy_named("arena") == &vg_policy_arena);
    CHECK(vg_policy_named("segments") == &vg_policy_default);
    CHECK(vg_policy_named("torch") == &vg_policy_torch);
    CHECK(vg_policy_named("vramguard") == vg_policy_named(vg_policy_recommended()));
    CHECK(vg_policy_named("Arena") == NULL);
    CHECK(vg_policy_named("") == NULL);
    CHECK(vg_policy_named(NULL) == NULL);
}

static void test_device_without_pages_falls_back_to_segments(void)
{
    vg_device *dev = vg_sim_create(GiB);
    CHECK_EQ(vg_sim_set_page_size(dev, 0), VG_OK);
    vg_heap_config cfg = {&vg_policy_arena, 0, 0};
    vg_heap *h = vg_heap_create(dev, &cfg);
    CHECK_EQ(vg_heap_uses_arena(h), 0);
    CHECK(!strcmp(vg_heap_policy_name(h), "arena"));
    void *p = vg_heap_alloc(h, 3 * MiB, 0, NULL);
    CHECK(p != NULL);
    vg_stats st = stats_of(h);
    CHECK_EQ(st.num_maps, 0);
    CHECK_EQ(st.num_device_alloc, 1);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 6 * MiB); /* the segments policy's: 2 x 3 MiB */
    CHECK_HEAP(h);
    vg_heap_free(h, p);
    vg_heap_destroy(h);
    dev->ops->destroy(dev);
}

static void test_page_size_knob_refuses_odd_sizes(void)
{
    vg_device *dev = vg_sim_create(GiB);
    CHECK_EQ(vg_sim_set_page_size(dev, 3 * MiB), VG_ERR_ARG);
    CHECK_EQ(vg_sim_set_page_size(dev, 4 * MiB), VG_ERR_ARG); /* past the granule */
    CHECK_EQ(vg_sim_set_page_size(dev, 256), VG_ERR_ARG);    /* below VG_ALIGN */
    CHECK_EQ(vg_sim_set_page_size(dev, 64 * KiB), VG_OK);
    CHECK_EQ(dev->page_size, 64 * KiB);
    CHECK_EQ(vg_sim_set_page_size(NULL, 0), VG_ERR_ARG);
    dev->ops->destroy(dev);
}

static void test_sim_pages_count_against_capacity(void)
{
    vg_device *dev = vg_sim_create(8 * MiB);
    uintptr_t range = 0, seg = 0;
    CHECK_EQ(dev->ops->range_reserve(dev, 64 * GiB, &range), VG_OK);
    CHECK_EQ(vg_sim_used(dev), 0);
    CHECK_EQ(dev->ops->map(dev, range, 4 * MiB), VG_OK);
    CHECK_EQ(dev->ops->reserve(dev, 2 * MiB, &seg), VG_OK);
    CHECK(seg < range); /* segments and ranges from their own parts */
    CHECK_EQ(dev->ops->map(dev, range + 4 * MiB, 4 * MiB), VG_ERR_NOMEM);
    CHECK_EQ(dev->ops->map(dev, range + 4 * MiB, 2 * MiB), VG_OK);
    CHECK_EQ(vg_sim_used(dev), 8 * MiB);
    CHECK_EQ(dev->ops->map(dev, range + MiB, 2 * MiB), VG_ERR_DEVICE); /* not page-aligned */
    CHECK(!strcmp(vg_device_last_error()->call, "cuMemMap"));
    CHECK_EQ(dev->ops->unmap(dev, range, 6 * MiB), VG_OK);
    uint64_t maps = 0, unmaps = 0;
    vg_sim_vm_calls(dev, &maps, &unmaps);
    CHECK_EQ(maps, 2);
    CHECK_EQ(unmaps, 1);
    dev->ops->release(dev, seg, 2 * MiB);
    CHECK_EQ(vg_sim_used(dev), 0);
    CHECK_EQ(dev->ops->range_release(dev, range, 64 * GiB), VG_OK);
    dev->ops->destroy(dev);
}

static void test_sim_ranges_never_wrap(void)
{
    vg_device *dev = vg_sim_create(GiB);
    uintptr_t addr = 0, last = 0;
    size_t n = 0;
    /* The ranges' part is 2^63 bytes: 2^16 ranges of 2^47, then no more. */
    while (dev->ops->range_reserve(dev, VG_MAX_REQUEST, &addr) == VG_OK) {
        CHECK(addr > last && addr + VG_MAX_REQUEST > addr);
        last = addr;
        n++;
        CHECK(n <= ((size_t)1 << 16));
    }
    CHECK_EQ(n, ((size_t)1 << 16) - 1); /* the last page-aligned slot is the end */
    dev->ops->destroy(dev);
}

/* ------------------------------------------------------------------ */
/* Known sequences                                                     */
/* ------------------------------------------------------------------ */

static void test_one_range_per_stream_and_pool(void)
{
    fixture f = make(GiB, 0, 0);
    CHECK_EQ(vg_heap_uses_arena(f.h), 1);
    void *a = vg_heap_alloc(f.h, 512, 0, NULL);       /* small pool */
    void *b = vg_heap_alloc(f.h, 3 * MiB, 0, NULL);   /* large pool */
    void *c = vg_heap_alloc(f.h, 3 * MiB, 7, NULL);   /* another stream */
    void *d = vg_heap_alloc(f.h, 5 * MiB, 7, NULL);   /* the same range */
    CHECK(a && b && c && d);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.segment[VG_STAT_ALL].current, 3);
    CHECK_EQ(st.num_range_reserves, 3);
    CHECK_EQ((uintptr_t)d, (uintptr_t)c + 3 * MiB);
    /* 2 MiB small + 4 MiB for b + pages 0..3 for c and d (8 MiB) */
    CHECK_MAPPED(f, 14 * MiB);
    CHECK_EQ(st.reserved_bytes[VG_STAT_SMALL].current, 2 * MiB);
    CHECK_EQ(st.num_maps, 4);
    CHECK_EQ(st.num_mapped_pages, 7);
    CHECK_EQ(st.inactive_split[VG_STAT_ALL].current, 0);
    vg_heap_free(f.h, a);
    vg_heap_free(f.h, b);
    vg_heap_free(f.h, c);
    vg_heap_free(f.h, d);
    CHECK_MAPPED(f, 14 * MiB); /* cached */
    CHECK_EQ(vg_heap_empty_cache(f.h), 14 * MiB);
    st = stats_of(f.h);
    CHECK_EQ(st.segment[VG_STAT_ALL].current, 0);
    CHECK_EQ(st.num_range_releases, 3);
    CHECK_EQ(st.num_unmap_syncs, 1);
    CHECK_EQ(f.h->streams.count, 0);
    CHECK_MAPPED(f, 0);
    done(&f);
}

static void test_a_refused_range_is_asked_smaller(void)
{
    fixture f = make(GiB, 0, 0);
    vg_sim_max_range(f.dev, GiB + 3 * MiB);
    void *a = vg_heap_alloc(f.h, 3 * MiB, 0, NULL);
    CHECK(a != NULL);
    vg_fragmentation fr;
    vg_heap_fragmentation(f.h, &fr);
    CHECK_EQ(fr.largest_free_range, GiB - 3 * MiB); /* 4 GiB, 2 GiB refused */
    vg_sim_max_range(f.dev, MiB); /* nothing fits now: an OOM, nothing half-made */
    vg_oom_info oom;
    CHECK(vg_heap_alloc(f.h, 3 * MiB, 1, &oom) == NULL);
    CHECK_EQ(oom.status, VG_ERR_NOMEM);
    CHECK_EQ(f.h->streams.count, 1);
    CHECK_MAPPED(f, 4 * MiB);
    vg_heap_free(f.h, a);
    done(&f);
}

static void test_free_in_the_middle_then_bigger_reuses_the_merged_range(void)
{
    fixture f = make(GiB, 0, 0);
    char *a = vg_heap_alloc(f.h, 3 * MiB, 0, NULL);
    char *b = vg_heap_alloc(f.h, 3 * MiB, 0, NULL);
    char *c = vg_heap_alloc(f.h, 3 * MiB, 0, NULL);
    CHECK(b == a + 3 * MiB && c == b + 3 * MiB);
    CHECK_MAPPED(f, 10 * MiB); /* pages 0..4 */
    CHECK_EQ(stats_of(f.h).num_maps, 3);
    vg_heap_free(f.h, a);
    vg_heap_free(f.h, b);
    char *d = vg_heap_alloc(f.h, 6 * MiB, 0, NULL);
    CHECK(d == a); /* the two freed blocks merged: one free block of 6 MiB */
    CHECK_MAPPED(f, 10 * MiB);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_maps, 3);
    CHECK_EQ(st.num_merges, 1);
    CHECK_EQ(st.num_cache_hits, 1);
    CHECK_EQ(st.num_cache_misses, 3);
    vg_heap_free(f.h, c);
    vg_heap_free(f.h, d);
    done(&f);
}

static void test_partial_pages_stay_mapped(void)
{
    fixture f = make(GiB, 0, 0);
    char *a = vg_heap_alloc(f.h, MiB + 512, 0, NULL); /* large pool, page 0 */
    char *b = vg_heap_alloc(f.h, MiB + 512, 0, NULL); /* pages 0 and 1 */
    CHECK(b == a + MiB + 512);
    CHECK_MAPPED(f, 4 * MiB);
    CHECK_EQ(stats_of(f.h).num_maps, 2);
    void *s[3];
    for (int i = 0; i < 3; i++) s[i] = vg_heap_alloc(f.h, 512, 0, NULL);
    CHECK_MAPPED(f, 6 * MiB);
    vg_heap_free(f.h, a); /* page 0 is still b's too */
    for (int i = 0; i < 3; i++) vg_heap_free(f.h, s[i]);
    CHECK_EQ(vg_heap_empty_cache(f.h), 2 * MiB); /* only the small range's page */
    CHECK_MAPPED(f, 4 * MiB);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_unmaps, 1);
    CHECK_EQ(st.num_unmapped_pages, 1);
    CHECK_EQ(st.segment[VG_STAT_ALL].current, 1); /* the small range went */
    vg_fragmentation fr;
    vg_heap_fragmentation(f.h, &fr);
    CHECK_EQ(fr.free_bytes, 4 * MiB - (MiB + 512));
    /* the free stretches: [0, 1 MiB+512) and [2 MiB+1 KiB, 4 MiB) */
    CHECK_EQ(fr.largest_free_block, 2 * MiB - KiB);
    CHECK_EQ(fr.largest_free_range, 4 * GiB - (2 * MiB + KiB));
    vg_heap_free(f.h, b);
    CHECK_EQ(vg_heap_empty_cache(f.h), 4 * MiB);
    CHECK_MAPPED(f, 0);
    done(&f);
}

/* A training step: the same tensors each time, freed in another order. */
static void training_step(vg_heap *h, void **p)
{
    static const size_t sizes[8] = {3 * MiB, 700 * KiB, 12 * MiB + 512, 4 * KiB,
                                    40 * MiB, 3 * MiB, 1536, 9 * MiB};
    for (int i = 0; i < 8; i++) p[i] = vg_heap_alloc(h, sizes[i], i % 2 ? 5 : 0, NULL);
    for (int i = 0; i < 8; i += 2) vg_heap_free(h, p[i]);
    for (int i = 0; i < 4; i++) p[i * 2] = vg_heap_alloc(h, sizes[(i * 3) % 8], 0, NULL);
    for (int i = 7; i >= 0; i--) vg_heap_free(h, p[i]);
}

static void test_steady_loop_maps_nothing_after_its_first_step(void)
{
    fixture f = make(GiB, 200 * MiB, 0.8);
    void *p[8];
    training_step(f.h, p);
    vg_stats first = stats_of(f.h);
    CHECK(first.num_maps > 0);
    for (int step = 0; step < 20; step++) {
        training_step(f.h, p);
        CHECK_HEAP(f.h);
    }
    vg_stats last = stats_of(f.h);
    CHECK_EQ(last.num_maps, first.num_maps);
    CHECK_EQ(last.num_unmaps, 0);
    CHECK_EQ(last.num_unmap_syncs, 0);
    CHECK_EQ(last.reserved_bytes[VG_STAT_ALL].current, first.reserved_bytes[VG_STAT_ALL].current);
    done(&f);
}

static void test_pressure_unmaps_whole_free_pages_after_one_synchronize(void)
{
    fixture f = make(GiB, 8 * MiB, 0);
    void *a = vg_heap_alloc(f.h, 3 * MiB, 0, NULL);       /* pages 0, 1 */
    void *b = vg_heap_alloc(f.h, MiB + 512, 0, NULL);     /* pages 1, 2 */
    CHECK_MAPPED(f, 6 * MiB);
    vg_heap_free(f.h, a); /* page 0 wholly free, page 1 shared with b */
    void *c = vg_heap_alloc(f.h, 4 * MiB, 9, NULL);       /* 4 MiB more: over budget */
    CHECK(c != NULL);
    CHECK_MAPPED(f, 8 * MiB);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_budget_refusals, 1);
    CHECK_EQ(st.num_unmaps, 1);
    CHECK_EQ(st.num_unmapped_pages, 1);
    CHECK_EQ(st.num_unmap_syncs, 1);
    CHECK_EQ(st.num_sync_all_streams, 1);
    CHECK_EQ(st.num_sync_releases, 1);
    CHECK_EQ(st.num_stream_releases, 0); /* stream 9 had nothing to give */
    CHECK_EQ(st.num_ooms, 0);
    vg_heap_free(f.h, b);
    vg_heap_free(f.h, c);
    done(&f);
}
/* The live bytes and the request's alone pass the budget: no step of the
 * ladder can help, so it goes straight to its last step's unmapping and
 * the OOM: no stream step, no retry. */
static void test_live_bytes_past_the_budget_fail_at_once(void)
{
    fixture f = make(GiB, 8 * MiB, 0);
    void *a = vg_heap_alloc(f.h, 6 * MiB, 0, NULL);       /* pages 0-2 */
    void *b = vg_heap_alloc(f.h, MiB + 512, 0, NULL);     /* page 3 */
    CHECK_MAPPED(f, 8 * MiB);
    vg_heap_free(f.h, b); /* page 3 cached */
    vg_oom_info oom;
    CHECK(vg_heap_alloc(f.h, 3 * MiB, 0, &oom) == NULL);  /* 6 + 3 MiB live > 8 */
    CHECK_EQ(oom.status, VG_ERR_NOMEM);
    CHECK(oom.budget_refused);
    /* The cached page is the fit's, spared: nothing to unmap, so not even
     * the one synchronize (the ladder made two, and unmapped nothing). */
    CHECK_EQ(oom.reserved, 8 * MiB);
    CHECK_MAPPED(f, 8 * MiB);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_ooms, 1);
    CHECK_EQ(st.num_oom_fast_fails, 1);
    CHECK_EQ(st.num_budget_refusals, 1);
    CHECK_EQ(st.num_unmap_syncs, 0);
    CHECK_EQ(st.num_sync_all_streams, 0);
    CHECK_EQ(st.num_stream_releases, 0);
    CHECK_EQ(st.num_alloc_retries, 0);
    CHECK_EQ(st.num_unmaps, 0);
    /* What fits still fits: 2 MiB more, in the cached page. */
    void *c = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);
    CHECK(c != NULL);
    CHECK_EQ(stats_of(f.h).num_oom_fast_fails, 1);
    vg_heap_free(f.h, a);
    vg_heap_free(f.h, c);
    done(&f);
}

/* The live bytes leave room, but what would stay mapped after unmapping
 * every page the ladder may unmap (pages shared with a live block stay),
 * plus the request's missing pages, passes the budget: an OOM at once.
 * One page less, and the ladder unmaps and fits as before. */
static void test_unmappable_pages_short_of_the_request_fail_at_once(void)
{
    fixture f = make(GiB, 8 * MiB, 0);
    void *a = vg_heap_alloc(f.h, 3 * MiB, 0, NULL);       /* pages 0, 1 */
    void *b = vg_heap_alloc(f.h, MiB + 512, 0, NULL);     /* pages 1, 2 */
    CHECK_MAPPED(f, 6 * MiB);
    vg_heap_free(f.h, a); /* page 0 unmappable, page 1 shared with b */
    /* The fit is the tail from b's end: 6 MiB touch pages 2-5, 4 of them
     * missing (8 MiB); mapped after every unmap: pages 1, 2 (4 MiB). */
    CHECK(vg_heap_alloc(f.h, 6 * MiB, 0, NULL) == NULL);
    CHECK_MAPPED(f, 4 * MiB); /* page 0 unmapped, as the ladder left it, after one synchronize */
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_ooms, 1);
    CHECK_EQ(st.num_oom_fast_fails, 1);
    CHECK_EQ(st.num_unmap_syncs, 1);
    CHECK_EQ(st.num_sync_all_streams, 0);
    CHECK_EQ(st.num_alloc_retries, 0);
    CHECK_EQ(st.num_unmaps, 1);
    /* 5 MiB touch pages 2-4: 4 + 4 MiB fit, page 0 being unmapped. */
    void *c = vg_heap_alloc(f.h, 5 * MiB, 0, NULL);
    CHECK(c != NULL);
    CHECK_MAPPED(f, 8 * MiB);
    st = stats_of(f.h);
    CHECK_EQ(st.num_oom_fast_fails, 1);
    CHECK_EQ(st.num_ooms, 1);
    CHECK_EQ(st.num_unmap_syncs, 1);
    CHECK_EQ(st.num_unmapped_pages, 1);
    CHECK_EQ(st.num_budget_refusals, 1);
    vg_heap_free(f.h, b);
    vg_heap_free(f.h, c);
    done(&f);
}

/* A deferred free a synchronize may finish could give pages back: the
 * walk's arithmetic does not answer then, and the ladder runs as before
 * (here in vain: the freed block's page 0 is not enough). */
static void test_a_pending_free_keeps_the_ladder(void)
{
    fixture f = make(GiB, 8 * MiB, 0);
    void *a = vg_heap_alloc(f.h, 3 * MiB, 0, NULL);       /* pages 0, 1 */
    void *b = vg_heap_alloc(f.h, MiB + 512, 0, NULL);     /* pages 1, 2 */
    CHECK_EQ(vg_heap_record_stream(f.h, a, 11), VG_OK);
    vg_heap_free(f.h, a); /* pending on stream 11 */
    CHECK(vg_heap_alloc(f.h, 6 * MiB, 0, NULL) == NULL);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_ooms, 1);
    CHECK_EQ(st.num_oom_fast_fails, 0);
    CHECK_EQ(st.num_stream_releases, 0); /* nothing free before the synchronize */
    CHECK_EQ(st.num_sync_all_streams, 1);
    CHECK_EQ(st.num_unmap_syncs, 1);
    CHECK_EQ(st.num_sync_releases, 1); /* page 0, once a's free finished */
    CHECK_EQ(st.num_alloc_retries, 1);
    CHECK_MAPPED(f, 4 * MiB);
    vg_heap_free(f.h, b);
    done(&f);
}

/* A capture begins between the synchronize and the unmap: the provider
 * answers VG_ERR_BUSY, nothing is unmapped, no device error is counted,
 * and the allocation is refused as any over the budget is. */
static void test_unmap_refused_while_capturing_stops_the_batch(void)
{
    fixture f = make(GiB, 8 * MiB, 0);
    void *a = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);
    void *b = vg_heap_alloc(f.h, 2 * MiB, 5, NULL);
    void *keep = vg_heap_alloc(f.h, 2 * MiB, 7, NULL);
    vg_heap_free(f.h, a);
    vg_heap_free(f.h, b); /* two free pages, on two ranges */
    CHECK_MAPPED(f, 6 * MiB);
    vg_sim_unmap_answer(f.dev, VG_ERR_BUSY);
    CHECK(vg_heap_alloc(f.h, 4 * MiB, 9, NULL) == NULL);
    CHECK_MAPPED(f, 6 * MiB);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_unmaps, 0);
    CHECK_EQ(st.num_unmapped_pages, 0);
    CHECK_EQ(st.num_device_errors, 0);
    CHECK_EQ(st.num_unmaps_refused, 1); /* the batch stopped at its first call */
    CHECK_EQ(st.num_range_releases, 0);
    CHECK_EQ(st.num_ooms, 1);
    uint64_t maps, unmaps;
    vg_sim_vm_calls(f.dev, &maps, &unmaps);
    CHECK_EQ(unmaps, 0);
    /* The capture over, the same request unmaps both pages and fits. */
    vg_sim_unmap_answer(f.dev, VG_OK);
    void *c = vg_heap_alloc(f.h, 4 * MiB, 9, NULL);
    CHECK(c != NULL);
    CHECK_MAPPED(f, 6 * MiB);
    st = stats_of(f.h);
    CHECK_EQ(st.num_unmapped_pages, 2);
    CHECK_EQ(st.num_device_errors, 0);
    vg_heap_free(f.h, keep);
    vg_heap_free(f.h, c);
    done(&f);
}

/* Maps and unmaps are recorded, with each run's address and bytes: the
 * recording's reserved curve. */
static void test_history_records_maps_and_unmaps(void)
{
    fixture f = make(GiB, 0, 0);
    CHECK_EQ(vg_heap_history_start(f.h, 16), VG_OK);
    void *a = vg_heap_alloc(f.h, 3 * MiB, 0, NULL);  /* pages 0, 1 */
    void *b = vg_heap_alloc(f.h, 5 * MiB, 0, NULL);  /* pages 2, 3 */
    vg_heap_free(f.h, b);
    vg_heap_empty_cache(f.h);                        /* pages 2, 3 */
    vg_history_event ev[16];
    uint64_t dropped = 1;
    size_t n = vg_heap_history_take(f.h, ev, 16, &dropped);
    CHECK_EQ(dropped, 0);
    CHECK_EQ(n, 7); /* map, alloc, map, alloc, free, unmap, empty_cache */
    uintptr_t base = (uintptr_t)a;
    CHECK_EQ(ev[0].kind, VG_EV_MAP);
    CHECK_EQ(ev[0].addr, base);
    CHECK_EQ(ev[0].size, 4 * MiB);
    CHECK_EQ(ev[1].kind, VG_EV_ALLOC);
    CHECK_EQ(ev[2].kind, VG_EV_MAP);
    CHECK_EQ(ev[2].addr, base + 4 * MiB);
    CHECK_EQ(ev[2].size, 4 * MiB);
    CHECK_EQ(ev[3].kind, VG_EV_ALLOC);
    CHECK_EQ(ev[4].kind, VG_EV_FREE);
    CHECK_EQ(ev[5].kind, VG_EV_UNMAP);
    CHECK_EQ(ev[5].addr, base + 4 * MiB);
    CHECK_EQ(ev[5].size, 4 * MiB);
    CHECK_EQ(ev[6].kind, VG_EV_EMPTY_CACHE);
    CHECK_EQ(ev[6].size, 4 * MiB);
    vg_heap_history_stop(f.h);
    vg_heap_free(f.h, a);
    done(&f);
}


/* Another thread's work while the heap's lock is released for the
 * synchronize before unmapping: a device whose every synchronize sees a
 * 4 KiB block allocated and freed on stream 0. */
static vg_heap *busy_heap;
static const vg_device_ops *busy_sim;

static int synchronize_amid_frees(vg_device *dev)
{
    if (busy_heap) vg_heap_free(busy_heap, vg_heap_alloc(busy_heap, 4096, 0, NULL));
    return busy_sim->synchronize(dev);
}

static void test_frees_during_the_unmap_synchronize_spare_only_their_blocks(void)
{
    fixture f = make(64 * MiB, 0, 0);
    vg_heap_free(f.h, vg_heap_alloc(f.h, 4096, 0, NULL)); /* small pool: its page stays */
    vg_heap_free(f.h, vg_heap_alloc(f.h, 48 * MiB, 0, NULL));
    CHECK_MAPPED(f, 50 * MiB);
    /* 32 MiB more does not fit: stream 1 has nothing, so every stream's
     * free pages go, but the small block's: freed during the synchronize. */
    vg_device_ops ops = *f.dev->ops;
    busy_sim = f.dev->ops;
    busy_heap = f.h;
    ops.synchronize = synchronize_amid_frees;
    f.dev->ops = &ops;
    void *c = vg_heap_alloc(f.h, 32 * MiB, 1, NULL);
    f.dev->ops = busy_sim;
    busy_heap = NULL;
    CHECK(c != NULL);
    CHECK_MAPPED(f, 34 * MiB); /* c's 16 pages and the small block's one */
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_unmap_syncs, 1);
    CHECK_EQ(st.num_unmap_skips, 1);
    CHECK_EQ(st.num_unmaps, 1);
    CHECK_EQ(st.num_unmapped_pages, 24);
    CHECK_EQ(st.num_ooms, 0);
    /* The next batch covers the small block: it was free before. */
    vg_heap_free(f.h, c);
    CHECK_EQ(vg_heap_empty_cache(f.h), 34 * MiB);
    CHECK_MAPPED(f, 0);
    st = stats_of(f.h);
    CHECK_EQ(st.num_unmap_syncs, 2);
    CHECK_EQ(st.num_unmap_skips, 1);
    done(&f);
}

static void test_requesting_stream_gives_back_first(void)
{
    fixture f = make(GiB, 8 * MiB, 0);
    void *a = vg_heap_alloc(f.h, 4 * MiB, 0, NULL);
    void *b = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);
    vg_heap_free(f.h, a);
    CHECK_MAPPED(f, 6 * MiB);
    /* 6 MiB does not fit the free 4 MiB: the tail needs 6 MiB more */
    void *c = vg_heap_alloc(f.h, 6 * MiB, 0, NULL);
    CHECK(c != NULL);
    CHECK_MAPPED(f, 8 * MiB);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_stream_releases, 1); /* pages 0 and 1 in one call */
    CHECK_EQ(st.num_unmapped_pages, 2);
    CHECK_EQ(st.num_unmap_syncs, 1);
    CHECK_EQ(st.num_sync_all_streams, 0);
    CHECK_EQ(st.num_alloc_retries, 1);
    vg_heap_free(f.h, b);
    vg_heap_free(f.h, c);
    done(&f);
}

static void test_map_refused_midway_is_retried(void)
{
    fixture f = make(GiB, 0, 0);
    void *p1 = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);
    void *p2 = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);
    void *p3 = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);
    vg_heap_free(f.h, p1);
    vg_heap_free(f.h, p3);
    CHECK_EQ(vg_heap_empty_cache(f.h), 4 * MiB); /* pages 0 and 2 */
    vg_heap_free(f.h, p2);
    CHECK_MAPPED(f, 2 * MiB);
    vg_sim_fail_nth(f.dev, 2); /* the second of the two runs */
    void *q = vg_heap_alloc(f.h, 6 * MiB, 0, NULL);
    CHECK(q == p1);
    CHECK_MAPPED(f, 6 * MiB);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_device_alloc_failed, 1);
    CHECK_EQ(st.num_maps, 3 + 2); /* three blocks, then page 0, then page 2 again */
    CHECK_EQ(st.num_ooms, 0);
    CHECK_EQ(st.num_sync_all_streams, 1);
    vg_heap_free(f.h, q);
    done(&f);
}

static void test_map_refused_to_the_end_is_an_oom(void)
{
    fixture f = make(4 * MiB, 0, 0);
    void *a = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);
    void *b = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);
    vg_heap_free(f.h, a);
    vg_oom_info oom;
    void *c = vg_heap_alloc(f.h, 6 * MiB, 0, &oom);
    CHECK(c == NULL);
    CHECK_EQ(oom.status, VG_ERR_NOMEM);
    CHECK_EQ(oom.arena, 1);
    CHECK_EQ(oom.ranges, 1);
    CHECK_EQ(oom.reserved, 2 * MiB);
    CHECK_EQ(oom.unmapped_bytes, 2 * MiB);
    CHECK_EQ(oom.largest_free_range, 16 * MiB - 4 * MiB);
    CHECK_MAPPED(f, 2 * MiB);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_ooms, 1);
    CHECK_EQ(st.num_unmaps, 1);
    CHECK_EQ(st.num_stream_releases, 1);
    CHECK_EQ(st.num_sync_all_streams, 1);
    CHECK_EQ(st.num_device_alloc_failed, 3);
    char msg[1024];
    vg_format_oom(&oom, "CUDA", msg, sizeof msg);
    CHECK_EQ(oom.largest_allocatable, 2 * MiB); /* the device's 4 MiB, 2 MiB live */
    CHECK(strstr(msg, "arena: 2.00 MiB mapped in 1 range, 2.00 MiB unmapped so far; the largest block "
                      "that could be allocated now is 2.00 MiB.") != NULL);
    CHECK(strstr(msg, "free range") == NULL);
    /* And the heap goes on. */
    void *d = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);
    CHECK(d == a);
    CHECK_MAPPED(f, 4 * MiB);
    vg_heap_free(f.h, b);
    vg_heap_free(f.h, d);
    done(&f);
}

/* The OOM says what could be allocated (the budget's room), never the
 * free address space of the range (four times the device), and it is true:
 * that much is allocated right after, a granule more is not. */
static void test_oom_reports_what_fits_not_address_space(void)
{
    fixture f = make(64 * MiB, 16 * MiB, 0);
    void *live = vg_heap_alloc(f.h, 10 * MiB, 0, NULL);
    CHECK(live != NULL);
    vg_oom_info oom;
    CHECK(vg_heap_alloc(f.h, 12 * MiB, 0, &oom) == NULL);
    CHECK_EQ(oom.status, VG_ERR_NOMEM);
    CHECK_EQ(oom.largest_free_range, 256 * MiB - 10 * MiB); /* kept, as address space */
    CHECK_EQ(oom.largest_allocatable, 6 * MiB);
    char msg[1024];
    vg_format_oom(&oom, "CUDA", msg, sizeof msg);
    CHECK(strstr(msg, "vramguard's budget is 16.00 MiB. vramguard's arena: 10.00 MiB mapped in 1 range, "
                      "0 bytes unmapped so far; the largest block that could be allocated now is "
                      "6.00 MiB.\n") != NULL);
    CHECK(strstr(msg, "246.00 MiB") == NULL);
    CHECK(vg_heap_alloc(f.h, 6 * MiB + 1, 0, NULL) == NULL);
    void *fits = vg_heap_alloc(f.h, 6 * MiB, 0, NULL);
    CHECK(fits != NULL);
    vg_heap_free(f.h, fits);
    vg_heap_free(f.h, live);
    done(&f);
}

/* Between failures the figure counts what releasing the cache gives back:
 * a freed block's mapped pages are unmapped for a request that needs the
 * room, so the room plus them is allocated, and no more. */
static void test_largest_allocatable_counts_the_releasable_cache(void)
{
    fixture f = make(64 * MiB, 16 * MiB, 0);
    void *a = vg_heap_alloc(f.h, 4 * MiB, 0, NULL);
    void *b = vg_heap_alloc(f.h, 4 * MiB, 0, NULL);
    vg_heap_free(f.h, a); /* 4 MiB cached, mapped */
    vg_fragmentation fr;
    vg_heap_fragmentation(f.h, &fr);
    CHECK_EQ(fr.releasable_bytes, 4 * MiB);
    CHECK_EQ(fr.largest_free_block, 4 * MiB);
    CHECK_EQ(fr.largest_allocatable, 12 * MiB); /* 8 MiB unreserved + 4 MiB cached */
    CHECK(vg_heap_alloc(f.h, 12 * MiB + 1, 0, NULL) == NULL);
    void *c = vg_heap_alloc(f.h, 12 * MiB, 0, NULL);
    CHECK(c != NULL);
    vg_heap_fragmentation(f.h, &fr);
    CHECK_EQ(fr.releasable_bytes, 0);
    CHECK_EQ(fr.largest_allocatable, 0);
    vg_heap_free(f.h, c);
    vg_heap_free(f.h, b);
    done(&f);
}

static void test_device_error_on_map_is_reported_as_itself(void)
{
    fixture f = make(GiB, 0, 0);
    void *a = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);
    vg_heap_free(f.h, a);
    vg_sim_fail_device(f.dev, 1, 0);
    vg_oom_info oom;
    CHECK(vg_heap_alloc(f.h, 6 * MiB, 0, &oom) == NULL);
    CHECK_EQ(oom.status, VG_ERR_DEVICE);
    CHECK(!strcmp(oom.device_error.call, "cuMemMap"));
    CHECK(!strcmp(oom.device_error.name, "cudaErrorIllegalAddress"));
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_device_errors, 1);
    CHECK_EQ(st.num_ooms, 0);
    CHECK_EQ(st.num_sync_all_streams, 0);
    CHECK_EQ(st.num_unmaps, 0);
    CHECK_MAPPED(f, 2 * MiB);
    /* The error was the allocation's: empty_cache still unmaps, and
     * releases the range left empty. */
    CHECK_EQ(vg_heap_empty_cache(f.h), 2 * MiB);
    CHECK_MAPPED(f, 0);
    CHECK_EQ(stats_of(f.h).num_range_releases, 1);
    void *b = vg_heap_alloc(f.h, 6 * MiB, 0, NULL); /* one-shot: it maps now */
    CHECK(b != NULL);
    CHECK_MAPPED(f, 6 * MiB);
    vg_heap_free(f.h, b);
    done(&f);
}

static void test_keep_segments_never_unmaps(void)
{
    fixture f = make(GiB, 8 * MiB, 0.5);
    vg_heap_set_keep_segments(f.h, 1);
    void *a = vg_heap_alloc(f.h, 6 * MiB, 0, NULL);
    vg_heap_free(f.h, a);
    CHECK_EQ(vg_heap_empty_cache(f.h), 0);
    vg_heap_set_budget(f.h, 4 * MiB);
    CHECK(vg_heap_alloc(f.h, 4 * MiB, 3, NULL) == NULL);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_unmaps, 0);
    CHECK_EQ(st.num_unmap_syncs, 0);
    CHECK_EQ(st.num_ooms, 1);
    CHECK_MAPPED(f, 6 * MiB);
    vg_heap_set_keep_segments(f.h, 0);
    CHECK_EQ(vg_heap_empty_cache(f.h), 6 * MiB);
    CHECK_MAPPED(f, 0);
    done(&f);
}

static void test_lower_budget_and_gc_threshold_unmap(void)
{
    fixture f = make(GiB, 0, 0);
    void *a = vg_heap_alloc(f.h, 10 * MiB, 0, NULL);
    void *b = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);
    vg_heap_free(f.h, a);
    CHECK_MAPPED(f, 12 * MiB);
    vg_heap_set_budget(f.h, 7 * MiB);
    CHECK_MAPPED(f, 6 * MiB); /* 5 MiB lacked: three pages in one run */
    CHECK_EQ(stats_of(f.h).num_budget_releases, 1);
    vg_heap_set_budget(f.h, 0);
    CHECK_EQ(vg_heap_set_gc_threshold(f.h, 0.01), VG_OK); /* 10.24 MiB of 1 GiB */
    void *c = vg_heap_alloc(f.h, 6 * MiB, 4, NULL);
    CHECK(c != NULL);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_gc_releases, 1);
    CHECK_MAPPED(f, 10 * MiB); /* b's page, 2 of a's left, c's 3 */
    vg_heap_free(f.h, b);
    vg_heap_free(f.h, c);
    done(&f);
}

static void test_a_skipped_synchronize_unmaps_nothing_and_is_counted(void)
{
    fixture f = make(GiB, 0, 0);
    vg_heap_free(f.h, vg_heap_alloc(f.h, 4 * MiB, 0, NULL));
    vg_sim_synchronize_answer(f.dev, VG_ERR_BUSY); /* a capture: nothing waits */
    CHECK_EQ(vg_heap_empty_cache(f.h), 0);
    CHECK_MAPPED(f, 4 * MiB);
    CHECK_EQ(stats_of(f.h).num_unmap_skips, 1);
    vg_sim_synchronize_answer(f.dev, VG_OK);
    CHECK_EQ(vg_heap_empty_cache(f.h), 4 * MiB);
    CHECK_MAPPED(f, 0);
    CHECK_EQ(stats_of(f.h).num_unmap_skips, 1);
    done(&f);
}

/* What an OOM report may count on: an idle range gives back its mapped
 * pages, not its address space (four times the device). */
static void test_idle_ranges_count_their_mapped_bytes(void)
{
    fixture f = make(GiB, 0, 0);
    vg_heap_free(f.h, vg_heap_alloc(f.h, 5 * MiB, 0, NULL)); /* 3 pages */
    vg_heap_free(f.h, vg_heap_alloc(f.h, 4096, 0, NULL));    /* small pool: 1 page */
    vg_heap_state st;
    vg_heap_state_copy(f.h, &st);
    CHECK_EQ(st.segments, 2);
    CHECK_EQ(st.idle_segments, 2);
    CHECK_EQ(st.idle_segment_bytes, 8 * MiB);
    CHECK_EQ(vg_heap_empty_cache(f.h), 8 * MiB);
    /* Twice the device: the ladder unmaps every page, releases the ranges
     * and still fails; an idle range left has nothing to give. */
    vg_oom_info oom = {0};
    CHECK(vg_heap_alloc(f.h, 2 * GiB, 0, &oom) == NULL);
    vg_heap_state_copy(f.h, &st);
    CHECK_EQ(st.idle_segments, 1);
    CHECK_EQ(st.idle_segment_bytes, (uint64_t)st.stats.reserved_bytes[VG_STAT_ALL].current);
    CHECK_EQ(st.idle_segment_bytes, 0);
    CHECK_MAPPED(f, 0);
    done(&f);
}

static void test_pending_blocks_keep_their_pages(void)
{
    fixture f = make(GiB, 0, 0);
    void *a = vg_heap_alloc(f.h, 4 * MiB, 0, NULL);
    CHECK_EQ(vg_heap_record_stream(f.h, a, 11), VG_OK);
    vg_heap_free(f.h, a); /* pending on stream 11 */
    vg_sim_synchronize_answer(f.dev, VG_ERR_BUSY); /* a capture: nothing waits */
    CHECK_EQ(vg_heap_empty_cache(f.h), 0);
    CHECK_MAPPED(f, 4 * MiB);
    vg_sim_synchronize_answer(f.dev, VG_OK);
    CHECK_EQ(vg_heap_empty_cache(f.h), 4 * MiB);
    CHECK_MAPPED(f, 0);
    done(&f);
}

static void test_many_streams_leave_nothing_behind(void)
{
    fixture f = make(4 * GiB, 0, 0); /* 1,000 streams' pages fit */
    for (vg_stream_t s = 1; s <= 100000; s++) {
        void *p = vg_heap_alloc(f.h, 4096, s, NULL);
        CHECK(p != NULL);
        vg_heap_free(f.h, p);
        if (s % 1000 == 0) vg_heap_empty_cache(f.h);
    }
    CHECK_EQ(f.h->streams.count, 0);
    vg_stats st = stats_of(f.h);
    CHECK_EQ(st.num_range_reserves, 100000);
    CHECK_EQ(st.num_range_releases, 100000);
    CHECK_EQ(st.num_unmap_syncs, 100);
    CHECK_MAPPED(f, 0);
    done(&f);
}

/* ------------------------------------------------------------------ */
/* Random sequences                                                    */
/* ------------------------------------------------------------------ */

static uint64_t next_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static size_t random_size(uint64_t *rng)
{
    switch (next_random(rng) % 4) {
    case 0: return 1 + next_random(rng) % (64 * KiB);
    case 1: return 1 + next_random(rng) % MiB;
    case 2: return MiB + next_random(rng) % (8 * MiB);
    default: return 8 * MiB + next_random(rng) % (40 * MiB);
    }
}

#define LIVE 64

/* The largest mapped stretch of a free block, found page by page: what
 * vg_heap_fragmentation finds a bitmap word at a time. */
static uint64_t largest_mapped_stretch(vg_heap *h)
{
    uint64_t best = 0;
    size_t page = (size_t)1 << h->page_shift;
    for (const vg_segment *seg = h->segments; seg; seg = seg->next) {
        const vg_range *r = seg->range;
        for (const vg_block *blk = seg->head; blk; blk = blk->next) {
            if (blk->state != VG_BLOCK_FREE) continue;
            uintptr_t run = 0; /* where the current stretch began, 0: none */
            for (uintptr_t at = blk->addr; at < blk->addr + blk->size;) {
                size_t i = (at - seg->addr) / page;
                uintptr_t next = seg->addr + (i + 1) * page;
                if (next > blk->addr + blk->size) next = blk->addr + blk->size;
                bool mapped = i / 64 < r->words && (r->pages[i / 64] >> (i % 64) & 1u);
                if (mapped && !run) run = at;
                if (!mapped) run = 0;
                if (run && next - run > best) best = next - run;
                at = next;
            }
        }
    }
    return best;
}

static uint64_t largest_free_block(vg_heap *h)
{
    vg_fragmentation fr;
    vg_heap_fragmentation(h, &fr);
    return fr.largest_free_block;
}

static void test_largest_free_block_is_its_mapped_stretch(void)
{
    fixture f = make(GiB, 0, 0);
    void *a = vg_heap_alloc(f.h, 124 * MiB, 0, NULL); /* pages 0-61 */
    void *b = vg_heap_alloc(f.h, 8 * MiB, 0, NULL);   /* pages 62-65: across a bitmap word */
    void *c = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);   /* page 66; the range's tail unmapped */
    CHECK_EQ(largest_free_block(f.h), 0);
    vg_heap_free(f.h, b);
    CHECK_EQ(largest_free_block(f.h), 8 * MiB);
    vg_heap_free(f.h, c); /* one free block from page 62 to the range's end */
    CHECK_EQ(largest_free_block(f.h), 10 * MiB);
    vg_heap_free(f.h, a);
    CHECK_EQ(largest_free_block(f.h), 134 * MiB);
    CHECK_EQ(largest_mapped_stretch(f.h), 134 * MiB);
    vg_heap_empty_cache(f.h);
    CHECK_EQ(largest_free_block(f.h), 0);
    done(&f);
}

static void test_a_mapped_stretch_ends_where_the_bitmap_does(void)
{
    fixture f = {vg_sim_create(GiB), NULL};
    CHECK_EQ(vg_sim_set_page_size(f.dev, 64 * KiB), VG_OK);
    vg_heap_config cfg = {&vg_policy_arena, 0, 0};
    f.h = vg_heap_create(f.dev, &cfg);
    void *a = vg_heap_alloc(f.h, 30 * MiB, 0, NULL); /* pages 0-479 */
    void *b = vg_heap_alloc(f.h, 2 * MiB, 0, NULL);  /* pages 480-511: the bitmap's last */
    CHECK(f.h->segments && !f.h->segments->next);
    CHECK_EQ(f.h->segments->range->words * 64, 512);
    vg_heap_free(f.h, b); /* free from page 480 to the range's end, unmapped past 511 */
    CHECK_EQ(largest_free_block(f.h), 2 * MiB);
    CHECK_EQ(largest_mapped_stretch(f.h), 2 * MiB);
    vg_heap_free(f.h, a);
    CHECK_EQ(largest_free_block(f.h), 32 * MiB);
    done(&f);
}

static void run_random(uint64_t seed, size_t page, size_t budget, double gc, int steps)
{
    vg_device *dev = vg_sim_create(512 * MiB);
    CHECK_EQ(vg_sim_set_page_size(dev, page), VG_OK);
    vg_heap_config cfg = {&vg_policy_arena, budget, gc};
    vg_heap *h = vg_heap_create(dev, &cfg);
    CHECK_EQ(vg_heap_uses_arena(h), 1);
    vg_sim_fail_random(dev, 0.02, seed);
    uint64_t rng = seed;
    void *live[LIVE] = {0};
    for (int step = 0; step < steps; step++) {
        int i = (int)(next_random(&rng) % LIVE);
        uint64_t what = next_random(&rng) % 100;
        if (live[i]) {
            if (what < 10) vg_heap_record_stream(h, live[i], 20 + what % 3);
            vg_heap_free(h, live[i]);
            live[i] = NULL;
        } else if (what < 3) {
            vg_heap_empty_cache(h);
        } else if (what < 5) {
            vg_sim_complete_stream(dev, 20 + what % 3);
        } else {
            live[i] = vg_heap_alloc(h, random_size(&rng), next_random(&rng) % 3, NULL);
        }
        CHECK_HEAP(h);
        CHECK_EQ(vg_sim_used(dev), reserved(h));
        if (step % 32 == 0) CHECK_EQ(largest_free_block(h), largest_mapped_stretch(h));
    }
    for (int i = 0; i < LIVE; i++) vg_heap_free(h, live[i]);
    vg_heap_synchronize(h);
    vg_heap_empty_cache(h);
    CHECK_EQ(reserved(h), 0);
    CHECK_EQ(h->streams.count, 0);
    CHECK_HEAP(h);
    vg_heap_destroy(h);
    dev->ops->destroy(dev);
}

static void test_random_no_budget(void) { run_random(1, 2 * MiB, 0, 0, 4000); }
static void test_random_budget(void) { run_random(2, 2 * MiB, 256 * MiB, 0, 4000); }
static void test_random_budget_gc(void) { run_random(3, 2 * MiB, 200 * MiB, 0.6, 4000); }
static void test_random_small_pages(void) { run_random(4, 64 * KiB, 160 * MiB, 0, 4000); }

typedef struct worker {
    vg_heap *h;
    vg_stream_t stream;
    uint64_t seed;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    void *live[16] = {0};
    uint64_t rng = w->seed;
    for (int step = 0; step < 3000; step++) {
        int i = (int)(next_random(&rng) % 16);
        if (live[i]) {
            vg_heap_free(w->h, live[i]);
            live[i] = NULL;
        } else if (next_random(&rng) % 50 == 0) {
            vg_heap_empty_cache(w->h);
        } else {
            live[i] = vg_heap_alloc(w->h, random_size(&rng), w->stream, NULL);
        }
    }
    for (int i = 0; i < 16; i++) vg_heap_free(w->h, live[i]);
    return NULL;
}

static void test_two_threads(void)
{
    fixture f = make(512 * MiB, 300 * MiB, 0);
    worker w[2] = {{f.h, 1, 11}, {f.h, 2, 22}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, work, &w[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    CHECK_HEAP(f.h);
    CHECK_EQ(vg_sim_used(f.dev), reserved(f.h));
    vg_heap_empty_cache(f.h);
    CHECK_MAPPED(f, 0);
    done(&f);
}

#define T(fn) {#fn, fn}
static const harness_test tests[] = {
    T(test_policies_by_name),
    T(test_unmap_refused_while_capturing_stops_the_batch),
    T(test_history_records_maps_and_unmaps),
    T(test_device_without_pages_falls_back_to_segments),
    T(test_page_size_knob_refuses_odd_sizes),
    T(test_sim_pages_count_against_capacity),
    T(test_sim_ranges_never_wrap),
    T(test_one_range_per_stream_and_pool),
    T(test_a_refused_range_is_asked_smaller),
    T(test_free_in_the_middle_then_bigger_reuses_the_merged_range),
    T(test_partial_pages_stay_mapped),
    T(test_steady_loop_maps_nothing_after_its_first_step),
    T(test_pressure_unmaps_whole_free_pages_after_one_synchronize),
    T(test_live_bytes_past_the_budget_fail_at_once),
    T(test_unmappable_pages_short_of_the_request_fail_at_once),
    T(test_a_pending_free_keeps_the_ladder),
    T(test_frees_during_the_unmap_synchronize_spare_only_their_blocks),
    T(test_requesting_stream_gives_back_first),
    T(test_map_refused_midway_is_retried),
    T(test_map_refused_to_the_end_is_an_oom),
    T(test_oom_reports_what_fits_not_address_space),
    T(test_largest_allocatable_counts_the_releasable_cache),
    T(test_device_error_on_map_is_reported_as_itself),
    T(test_keep_segments_never_unmaps),
    T(test_lower_budget_and_gc_threshold_unmap),
    T(test_a_skipped_synchronize_unmaps_nothing_and_is_counted),
    T(test_idle_ranges_count_their_mapped_bytes),
    T(test_pending_blocks_keep_their_pages),
    T(test_many_streams_leave_nothing_behind),
    T(test_largest_free_block_is_its_mapped_stretch),
    T(test_a_mapped_stretch_ends_where_the_bitmap_does),
    T(test_random_no_budget),
    T(test_random_budget),
    T(test_random_budget_gc),
    T(test_random_small_pages),
    T(test_two_threads),
};

int main(int argc, char **argv)
{
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
