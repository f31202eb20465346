/* The emulation of PyTorch's expandable segments (torch_expandable.c) on
 * hand-made traces, with the exact bytes PyTorch's rules give, worked out
 * in the comments; then a seeded random trace against its invariants. */
#include "vramguard/expandable.h"

#include <stddef.h>
#include <stdlib.h>

#include "harness.h"

#define MiB ((uint64_t)1 << 20)
#define MAX_OPS 4096

/* The host running out: this test is linked with malloc, calloc and
 * realloc wrapped (the Makefile's --wrap), so that once host_allows is set
 * to n >= 0 the first n host allocations succeed and every later one is
 * refused, as on a host out of memory. -1: no limit. */
void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);

static long host_allows = -1;

static int host_refuses(void)
{
    if (host_allows < 0) return 0;
    if (host_allows == 0) return 1;
    host_allows--;
    return 0;
}

void *__wrap_malloc(size_t size)
{
    return host_refuses() ? NULL : __real_malloc(size);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return host_refuses() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t size)
{
    return host_refuses() ? NULL : __real_realloc(p, size);
}

/* A trace under construction; one stream per op, ids named by the test. */
typedef struct builder {
    uint8_t kinds[MAX_OPS];
    uint32_t ids[MAX_OPS];
    uint64_t sizes[MAX_OPS], streams[MAX_OPS];
    size_t n, nids;
} builder;

static builder B;

static void reset(void)
{
    memset(&B, 0, sizeof B);
}

static void op(uint8_t kind, uint32_t id, uint64_t size, uint64_t stream)
{
    B.kinds[B.n] = kind;
    B.ids[B.n] = id;
    B.sizes[B.n] = size;
    B.streams[B.n] = stream;
    B.n++;
    if (kind == VG_OP_ALLOC && id + 1 > B.nids) B.nids = id + 1;
}

static void alloc_on(uint32_t id, uint64_t size, uint64_t stream)
{
    op(VG_OP_ALLOC, id, size, stream);
}

static void alloc(uint32_t id, uint64_t size)
{
    alloc_on(id, size, 0);
}

static void release(uint32_t id)
{
    op(VG_OP_FREE, id, 0, 0);
}

static void empty_cache(void)
{
    op(VG_OP_EMPTY_CACHE, 0, 0, 0);
}

static vg_trace_ops trace(void)
{
    vg_trace_ops t = {B.kinds, B.ids, B.sizes, B.streams, B.n, B.nids};
    return t;
}

/* Replays B with `budget`; the last sample (one op per window) is the
 * state after the last op. */
static int replay(uint64_t budget, vg_expandable_result *r, vg_replay_sample *last)
{
    static vg_replay_sample samples[MAX_OPS];
    vg_trace_ops t = trace();
    if (vg_trace_validate(&t, NULL)) return -1;
    vg_expandable_config config = {budget, 0, 0, 0};
    int rc = vg_expandable_replay(&t, &config, samples, MAX_OPS, 1, r);
    if (rc == VG_OK && last && r->replay.samples) *last = samples[r->replay.samples - 1];
    return rc;
}

static void test_a_request_over_1_mib_maps_a_20_mib_page(void)
{
    reset();
    alloc(0, MiB + 1);    /* rounded to 1 MiB + 512: the large pool */
    alloc(1, 512 * 1024); /* the small pool: a 2 MiB page */
    alloc(2, 1);          /* 512 bytes, in the small page already mapped */
    vg_expandable_result r;
    vg_replay_sample now;
    CHECK_EQ(replay(0, &r, &now), VG_OK);
    CHECK_EQ(now.reserved, 22 * MiB);
    CHECK_EQ(now.allocated, MiB + 512 + 512 * 1024 + 512);
    CHECK_EQ(now.requested, MiB + 1 + 512 * 1024 + 1);
    CHECK_EQ(r.map_calls, 2);
    CHECK_EQ(r.map_pages, 2);
    CHECK_EQ(r.segments_created, 2);
    CHECK_EQ(r.replay.peak_reserved, 22 * MiB);
    CHECK_EQ(r.replay.device_alloc, 2);
}

static void test_the_segment_grows_at_its_end_and_reuses_holes_that_fit(void)
{
    reset();
    alloc(0, 8 * MiB);  /* page 0: A 0-8, free 8-20 */
    alloc(1, 8 * MiB);  /* B 8-16 from the free rest, free 16-20 */
    alloc(2, 8 * MiB);  /* 4 MiB free + page 1 mapped: C 16-24, free 24-40 */
    release(1);         /* a hole of 8 MiB between A and C */
    alloc(3, 12 * MiB); /* the hole is too small: D 24-36 from the tail, free 36-40 */
    alloc(4, 10 * MiB); /* nothing fits: page 2 joins the 4 MiB tail, E 36-46 */
    alloc(5, 8 * MiB);  /* the hole fits exactly: F 8-16, nothing mapped */
    vg_expandable_result r;
    vg_replay_sample now;
    CHECK_EQ(replay(0, &r, &now), VG_OK);
    CHECK_EQ(now.reserved, 60 * MiB);
    CHECK_EQ(now.allocated, 46 * MiB);
    CHECK_EQ(r.map_calls, 3);
    CHECK_EQ(r.map_pages, 3);
    CHECK_EQ(r.segments_created, 1);
    CHECK_EQ(r.unmap_calls, 0);
}

static void test_best_fit_keeps_the_tail_for_what_nothing_else_fits(void)
{
    reset();
    alloc(0, 16 * MiB); /* page 0: A 0-16, free 16-20 */
    alloc(1, 4 * MiB);  /* B 16-20 */
    alloc(2, 6 * MiB);  /* page 1: C 20-26, free 26-40: 14 MiB before the unmapped rest */
    release(0);         /* a 16 MiB hole at 0-16 */
    /* 12 MiB: the best fit by size is the 14 MiB tail, but its expandable
     * size (14 MiB + the unmapped rest) is larger than the hole's (16 MiB),
     * so get_free_block takes the hole: G 0-12. Then 14 MiB fits the tail
     * only. */
    alloc(3, 12 * MiB);
    alloc(4, 14 * MiB);
    vg_expandable_result r;
    vg_replay_sample now;
    CHECK_EQ(replay(0, &r, &now), VG_OK);
    CHECK_EQ(now.reserved, 40 * MiB);
    CHECK_EQ(now.allocated, 36 * MiB);
    CHECK_EQ(r.map_calls, 2);
    /* Had the tail been taken, 14 MiB would have needed a third page. */
}

static void test_each_stream_has_its_own_segment(void)
{
    reset();
    alloc_on(0, 4 * MiB, 1);  /* stream 1: page 0 of its segment */
    alloc_on(1, 4 * MiB, 2);  /* stream 2: a second segment */
    release(0);               /* stream 1's page is all free */
    alloc_on(2, 4 * MiB, 2);  /* stream 2's free 16 MiB: 4-8 */
    alloc_on(3, 13 * MiB, 2); /* stream 2 has 12 MiB free: it maps a page */
    vg_expandable_result r;
    vg_replay_sample now;
    CHECK_EQ(replay(0, &r, &now), VG_OK);
    CHECK_EQ(r.segments_created, 2);
    CHECK_EQ(r.peak_segments, 2);
    CHECK_EQ(now.reserved, 60 * MiB);
    CHECK_EQ(now.allocated, 21 * MiB);
    CHECK_EQ(r.map_calls, 3);
}

static void test_empty_cache_unmaps_only_whole_free_pages(void)
{
    reset();
    alloc(0, 30 * MiB); /* pages 0-1 in one map: A 0-30, free 30-40 */
    alloc(1, 5 * MiB);  /* B 30-35, free 35-40 */
    release(0);         /* free 0-30 */
    empty_cache();      /* page 0 goes; 20-30 and 35-40 are parts of page 1 */
    vg_expandable_result r;
    vg_replay_sample now;
    CHECK_EQ(replay(0, &r, &now), VG_OK);
    CHECK_EQ(now.reserved, 20 * MiB);
    CHECK_EQ(r.map_calls, 1);
    CHECK_EQ(r.map_pages, 2);
    CHECK_EQ(r.unmap_calls, 1);
    CHECK_EQ(r.unmap_pages, 1);
    CHECK_EQ(r.stream_syncs, 1);
    CHECK_EQ(r.device_syncs, 1);
    /* B's free: all of page 1 is free, and the next release takes it and
     * the segment with it. */
    release(1);
    empty_cache();
    CHECK_EQ(replay(0, &r, &now), VG_OK);
    CHECK_EQ(now.reserved, 0);
    CHECK_EQ(r.unmap_calls, 2);
    CHECK_EQ(r.unmap_pages, 2);
    CHECK_EQ(r.device_syncs, 2);
    CHECK_EQ(r.segments_created, 1);
    /* A new allocation reserves a new segment. */
    alloc(2, 4 * MiB);
    CHECK_EQ(replay(0, &r, &now), VG_OK);
    CHECK_EQ(r.segments_created, 2);
    CHECK_EQ(r.peak_segments, 1);
    CHECK_EQ(now.reserved, 20 * MiB);
}

static void test_an_oom_releases_free_pages_and_retries(void)
{
    reset();
    alloc(0, 25 * MiB); /* pages 0-1: A 0-25, free 25-40 */
    alloc(1, 10 * MiB); /* B 25-35, free 35-40 */
    release(0);         /* free 0-25 */
    /* 30 MiB: no free block fits; the tail would grow by pages 2-3, 80 MiB
     * in all, past the 60 MiB budget. release_cached_blocks unmaps page 0
     * (20-25 stays), and the retry maps pages 2-3: C 35-65. */
    alloc(2, 30 * MiB);
    vg_expandable_result r;
    vg_replay_sample now;
    CHECK_EQ(replay(60 * MiB, &r, &now), VG_OK);
    CHECK_EQ(r.replay.ooms, 0);
    CHECK_EQ(r.replay.alloc_retries, 1);
    CHECK_EQ(r.device_syncs, 1);
    CHECK_EQ(r.unmap_pages, 1);
    CHECK_EQ(r.map_calls, 2);
    CHECK_EQ(r.map_pages, 4);
    CHECK_EQ(now.reserved, 60 * MiB);
    CHECK_EQ(r.replay.peak_reserved, 60 * MiB);
    CHECK_EQ(now.allocated, 40 * MiB);
}

static void test_a_trace_past_the_budget_fails_at_its_op(void)
{
    reset();
    for (uint32_t i = 0; i < 4; i++) alloc(i, 10 * MiB); /* pages 0-1, full */
    alloc(4, 10 * MiB); /* op 4: a third page passes 40 MiB, and nothing is free */
    release(0);
    alloc(5, 10 * MiB); /* fits A's place */
    vg_expandable_result r;
    vg_replay_sample now;
    CHECK_EQ(replay(40 * MiB, &r, &now), VG_OK);
    CHECK_EQ(r.replay.ooms, 1);
    CHECK_EQ(r.replay.first_oom, 4);
    CHECK_EQ(r.replay.alloc_retries, 1);
    CHECK_EQ(r.replay.peak_reserved, 40 * MiB);
    CHECK_EQ(now.allocated, 40 * MiB);
    /* One page more and it fits. */
    CHECK_EQ(replay(60 * MiB, &r, &now), VG_OK);
    CHECK_EQ(r.replay.ooms, 0);
    CHECK_EQ(r.replay.first_oom, -1);
}

static void test_2_mib_large_pages_map_what_is_needed(void)
{
    reset();
    alloc(0, 3 * MiB);
    vg_trace_ops t = trace();
    vg_expandable_config config = {0, 0, 2 * MiB, 0};
    vg_expandable_result r;
    CHECK_EQ(vg_expandable_replay(&t, &config, NULL, 0, 1, &r), VG_OK);
    CHECK_EQ(r.replay.peak_reserved, 4 * MiB);
    CHECK_EQ(r.map_pages, 2);
    CHECK_EQ(r.replay.samples, 0);
}

static void test_bad_page_sizes_are_refused(void)
{
    reset();
    alloc(0, 1);
    vg_trace_ops t = trace();
    vg_expandable_result r;
    uint64_t bad[] = {3 * MiB, MiB, (uint64_t)1 << 62};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        vg_expandable_config large = {0, 0, bad[i], 0}, small = {0, 0, 0, bad[i]};
        CHECK_EQ(vg_expandable_replay(&t, &large, NULL, 0, 1, &r), VG_ERR_ARG);
        CHECK_EQ(r.replay.first_oom, -1);
        CHECK_EQ(vg_expandable_replay(&t, &small, NULL, 0, 1, &r), VG_ERR_ARG);
    }
    vg_expandable_config huge = {0, (uint64_t)1 << 60, 0, 0};
    CHECK_EQ(vg_expandable_replay(&t, &huge, NULL, 0, 1, &r), VG_ERR_ARG);
}

static void test_requests_larger_than_the_device_are_ooms(void)
{
    reset();
    alloc(0, 100 * MiB); /* the segment's range is 9/8 of 64 MiB: 80 MiB */
    alloc(1, 10 * MiB);
    vg_expandable_result r;
    CHECK_EQ(replay(64 * MiB, &r, NULL), VG_OK);
    CHECK_EQ(r.replay.ooms, 1);
    CHECK_EQ(r.replay.first_oom, 0);
    CHECK_EQ(r.replay.peak_reserved, 20 * MiB);
}

/* A thousand unmapped holes that no later request fits: every search for
 * room passes them (PyTorch scans them one by one; the emulation's run
 * spaces answer at once, and debug builds check that against the scan). */
static void test_many_holes_none_of_which_fit(void)
{
    reset();
    for (uint32_t i = 0; i < 2000; i++) alloc(i, 20 * MiB); /* a page each */
    for (uint32_t i = 0; i < 2000; i += 2) release(i);
    empty_cache(); /* 1,000 holes of one page between live pages */
    for (uint32_t i = 2000; i < 3000; i++) alloc(i, 40 * MiB);
    vg_expandable_result r;
    vg_replay_sample now;
    CHECK_EQ(replay(0, &r, &now), VG_OK);
    CHECK_EQ(r.unmap_calls, 1000);
    CHECK_EQ(r.map_calls, 3000);
    CHECK_EQ(now.reserved, (1000 * 20 + 1000 * 40) * MiB);
    CHECK_EQ(r.replay.peak_reserved, 60000 * MiB); /* the tail grew past the holes */
    CHECK_EQ(r.segments_created, 1);
}

/* A seeded random trace on three streams under a budget: whatever happens,
 * mapped bytes stay whole pages within the budget, blocks hold at least
 * what was asked, the same trace gives the same figures, and with
 * everything freed an empty_cache leaves nothing mapped. */
static void test_random_traces_keep_the_invariants(void)
{
    for (uint32_t seed = 1; seed <= 20; seed++) {
        reset();
        uint32_t x = seed * 2654435761u, live[64] = {0}, next_id = 0;
        size_t nlive = 0;
        while (B.n < MAX_OPS - 80) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            if (x % 16 == 0) {
                empty_cache();
            } else if (nlive && (x % 3 == 0 || nlive == 64)) {
                size_t k = (x >> 8) % nlive;
                release(live[k]);
                live[k] = live[--nlive];
            } else {
                uint64_t size = x % 4 ? (x >> 4) % (3 * MiB) + 1 : (x >> 4) % (90 * MiB) + 1;
                alloc_on(next_id, size, (x >> 20) % 3);
                live[nlive++] = next_id++;
            }
        }
        while (nlive) release(live[--nlive]);
        empty_cache();
        uint64_t budget = (uint64_t)(200 + seed * 20) * MiB;
        static vg_replay_sample samples[MAX_OPS];
        vg_trace_ops t = trace();
        CHECK(vg_trace_validate(&t, NULL) == NULL);
        vg_expandable_config config = {budget, 0, 0, 0};
        vg_expandable_result r, again;
        CHECK_EQ(vg_expandable_replay(&t, &config, samples, MAX_OPS, 1, &r), VG_OK);
        CHECK_EQ(vg_expandable_replay(&t, &config, NULL, 0, 1, &again), VG_OK);
        CHECK_EQ(r.replay.samples, t.n);
        for (size_t i = 0; i < t.n; i++) {
            CHECK(samples[i].reserved <= budget);
            CHECK_EQ(samples[i].reserved % (2 * MiB), 0);
            CHECK(samples[i].allocated >= samples[i].requested);
            CHECK(samples[i].allocated <= samples[i].reserved);
        }
        CHECK_EQ(samples[t.n - 1].reserved, 0);
        CHECK_EQ(samples[t.n - 1].allocated, 0);
        CHECK_EQ(r.map_pages - r.unmap_pages, 0);
        CHECK_EQ(again.replay.peak_reserved, r.replay.peak_reserved);
        CHECK_EQ(again.replay.ooms, r.replay.ooms);
        CHECK_EQ(again.map_pages, r.map_pages);
    }
}

/* k small allocations (512 bytes each, one 2 MiB small page), then in
 * the large pool, with 2 MiB pages: A 0-1.5 MiB and B 1.5-5.5 MiB, C
 * 5.5-7 MiB; B freed, and empty_cache unmaps B's one whole page (2-4 MiB),
 * leaving a head (1.5-2) and a tail (4-5.5) mapped. */
static void build_head_and_tail_unmap(uint32_t k)
{
    reset();
    for (uint32_t i = 0; i < k; i++) alloc(i, 512);
    alloc(k, 3 * MiB / 2);
    alloc(k + 1, 4 * MiB);
    alloc(k + 2, 3 * MiB / 2);
    release(k + 1);
    empty_cache();
}

/* The host refusing an allocation midway: the replay says VG_ERR_NOMEM
 * with its figures zeroed, and (as debug builds assert when a replay
 * ends) no block record is lost. The case that lost one: with k = 4,088,
 * the small allocations take k + 2 records and the large pool 5, all from
 * the first chunk of 4,096 and none free, so the unmap's head takes the
 * chunk's last record and its tail needs a new chunk: host allocation
 * number 6 (after the ids' array, the first chunk, the two segments and
 * release_blocks' list), which the host refuses. The head used to be kept
 * from the replay then. Around it: every refusal point, a few chunk
 * offsets either side. */
static void test_the_host_running_out_midway_loses_no_record(void)
{
    vg_expandable_config config = {0, 0, 2 * MiB, 0};
    for (uint32_t k = 4080; k <= 4090; k++) {
        build_head_and_tail_unmap(k);
        vg_trace_ops t = trace();
        CHECK(vg_trace_validate(&t, NULL) == NULL);
        vg_expandable_result whole, r;
        CHECK_EQ(vg_expandable_replay(&t, &config, NULL, 0, 1, &whole), VG_OK);
        CHECK_EQ(whole.unmap_calls, 1);
        CHECK_EQ(whole.unmap_pages, 1);
        CHECK_EQ(whole.replay.ooms, 0);
        /* k + 9 records in all: from k = 4,088 on, a second chunk. */
        long needs = k < 4088 ? 5 : 6;
        for (long allows = 0; allows <= 6; allows++) {
            host_allows = allows;
            int rc = vg_expandable_replay(&t, &config, NULL, 0, 1, &r);
            host_allows = -1;
            if (allows >= needs) {
                CHECK_EQ(rc, VG_OK);
                CHECK(!memcmp(&r.map_calls, &whole.map_calls,
                              sizeof r - offsetof(vg_expandable_result, map_calls)));
                CHECK_EQ(r.replay.peak_reserved, whole.replay.peak_reserved);
                continue;
            }
            CHECK_EQ(rc, VG_ERR_NOMEM);
            CHECK_EQ(r.replay.ops, 0);
            CHECK_EQ(r.unmap_calls, 0);
            CHECK_EQ(r.replay.first_oom, -1);
        }
    }
}

#define T(fn) {#fn, fn}
static const harness_test tests[] = {
    T(test_a_request_over_1_mib_maps_a_20_mib_page),
    T(test_the_segment_grows_at_its_end_and_reuses_holes_that_fit),
    T(test_best_fit_keeps_the_tail_for_what_nothing_else_fits),
    T(test_each_stream_has_its_own_segment),
    T(test_empty_cache_unmaps_only_whole_free_pages),
    T(test_an_oom_releases_free_pages_and_retries),
    T(test_a_trace_past_the_budget_fails_at_its_op),
    T(test_2_mib_large_pages_map_what_is_needed),
    T(test_bad_page_sizes_are_refused),
    T(test_requests_larger_than_the_device_are_ooms),
    T(test_many_holes_none_of_which_fit),
    T(test_random_traces_keep_the_invariants),
    T(test_the_host_running_out_midway_loses_no_record),
};

int main(int argc, char **argv)
{
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
