/* Hostile and mistaken input to the core: traces whose counts lie, settings
 * that are NaN, recordings started twice, an address space used up, and
 * totals reset as PyTorch resets them. Each call answers with an error or a
 * bounded result, never a zero that hides a failure. */
#include "harness.h"
#include "heap_internal.h"
#include "vramguard/devices.h"
#include "vramguard/report.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* ------------------------------------------------------------------ */
/* Traces                                                              */
/* ------------------------------------------------------------------ */

/* A trace of up to 8 ops, built op by op. */
typedef struct small_trace {
    uint8_t kinds[8];
    uint32_t ids[8];
    uint64_t sizes[8];
    uint64_t streams[8];
    vg_trace_ops ops;
} small_trace;

static void add(small_trace *s, uint8_t kind, uint32_t id, uint64_t size)
{
    size_t i = s->ops.n++;
    s->kinds[i] = kind;
    s->ids[i] = id;
    s->sizes[i] = size;
    s->streams[i] = 0;
    s->ops.kinds = s->kinds;
    s->ops.ids = s->ids;
    s->ops.sizes = s->sizes;
    s->ops.streams = s->streams;
}

static void test_trace_with_more_ids_than_ops_is_refused(void)
{
    small_trace s = {0};
    add(&s, VG_OP_ALLOC, 0, MiB);
    add(&s, VG_OP_FREE, 0, 0);
    s.ops.nids = UINT32_MAX; /* what a 76-byte file header claimed */
    size_t bad = 0;
    const char *err = vg_trace_validate(&s.ops, &bad);
    CHECK(err && strstr(err, "more allocation ids than ops"));
    CHECK_EQ(bad, SIZE_MAX);
    s.ops.nids = 1;
    CHECK(vg_trace_validate(&s.ops, &bad) == NULL);
    uint64_t peak = 7;
    CHECK_EQ(vg_trace_peak_live(&s.ops, &peak), VG_OK);
    CHECK_EQ(peak, MiB);
}

static void test_trace_sizes_past_the_largest_request_are_refused(void)
{
    small_trace s = {0};
    add(&s, VG_OP_ALLOC, 0, VG_MAX_REQUEST);
    add(&s, VG_OP_ALLOC, 1, VG_MAX_REQUEST + 1);
    s.ops.nids = 2;
    size_t bad = 0;
    const char *err = vg_trace_validate(&s.ops, &bad);
    CHECK(err && strstr(err, "larger than any heap serves"));
    CHECK_EQ(bad, 1);
}

static void test_peak_live_past_64_bits_is_an_error(void)
{
    /* Eight ops of 2^47 are 2^50: fine. The count of live bytes can only
     * pass 2^64 with 2^17 of them, so build that trace on the heap. */
    size_t n = ((size_t)1 << 17) + 1;
    uint8_t *kinds = malloc(n);
    uint32_t *ids = malloc(n * sizeof *ids);
    uint64_t *sizes = malloc(n * sizeof *sizes);
    CHECK(kinds && ids && sizes);
    for (size_t i = 0; i < n; i++) {
        kinds[i] = VG_OP_ALLOC;
        ids[i] = (uint32_t)i;
        sizes[i] = VG_MAX_REQUEST;
    }
    vg_trace_ops t = {kinds, ids, sizes, NULL, n, n};
    CHECK(vg_trace_validate(&t, NULL) == NULL);
    uint64_t peak = 7;
    int rc = vg_trace_peak_live(&t, &peak);
    free(kinds);
    free(ids);
    free(sizes);
    CHECK_EQ(rc, VG_ERR_ARG);
    CHECK_EQ(peak, 7); /* untouched on failure */
}

/* ------------------------------------------------------------------ */
/* Settings                                                            */
/* ------------------------------------------------------------------ */

static void test_nan_and_negative_settings_are_refused(void)
{
    CHECK(!vg_valid_fraction(NAN));
    CHECK(!vg_valid_fraction(-0.25));
    CHECK(!vg_valid_fraction(1.5));
    CHECK(vg_valid_fraction(0.0) && vg_valid_fraction(1.0));
    vg_device *dev = vg_sim_create(GiB);
    vg_heap_config nan_cfg = {NULL, 0, NAN}, neg_cfg = {NULL, 0, -0.5};
    CHECK(vg_heap_create(dev, &nan_cfg) == NULL);
    CHECK(vg_heap_create(dev, &neg_cfg) == NULL);
    vg_heap *h = vg_heap_create(dev, NULL);
    CHECK(h != NULL);
    CHECK_EQ(vg_heap_set_gc_threshold(h, NAN), VG_ERR_ARG);
    CHECK_EQ(vg_heap_set_gc_threshold(h, -0.1), VG_ERR_ARG);
    CHECK(vg_heap_gc_threshold(h) == 0.0);
    vg_heap_destroy(h);
    dev->ops->destroy(dev);
    /* The registry: refused before anything is touched. */
    CHECK_EQ(vg_devices_configure(0, NAN, 0.0), VG_ERR_ARG);
    CHECK_EQ(vg_devices_configure(0, 0.0, NAN), VG_ERR_ARG);
    CHECK_EQ(vg_devices_configure(0, -0.5, 0.0), VG_ERR_ARG);
    CHECK_EQ(vg_devices_set_budget(0, 0, NAN), VG_ERR_ARG);
}

/* ------------------------------------------------------------------ */
/* Recording                                                           */
/* ------------------------------------------------------------------ */

static void test_a_second_recording_is_refused_and_loses_nothing(void)
{
    vg_device *dev = vg_sim_create(GiB);
    vg_heap *h = vg_heap_create(dev, NULL);
    CHECK_EQ(vg_heap_history_start(h, 16), VG_OK);
    vg_heap_free(h, vg_heap_alloc(h, 1000, 0, NULL)); /* map (the arena's first page), alloc, free */
    CHECK_EQ(vg_heap_history_start(h, 16), VG_ERR_BUSY);
    vg_heap_free(h, vg_heap_alloc(h, 1000, 0, NULL)); /* alloc, free */
    vg_heap_history_stop(h);
    /* Stopped with events not taken: a new start would drop them. */
    CHECK_EQ(vg_heap_history_start(h, 16), VG_ERR_BUSY);
    vg_history_event ev[16];
    uint64_t dropped = 9;
    CHECK_EQ(vg_heap_history_take(h, ev, 16, &dropped), 5);
    CHECK_EQ(dropped, 0);
    CHECK_EQ(ev[0].kind, VG_EV_MAP);
    CHECK_EQ(ev[0].size, 2 * MiB);
    CHECK_EQ(ev[4].kind, VG_EV_FREE);
    CHECK_EQ(vg_heap_history_start(h, 16), VG_OK);
    CHECK(vg_heap_history_active(h));
    vg_heap_destroy(h);
    dev->ops->destroy(dev);
}

/* ------------------------------------------------------------------ */
/* Totals                                                              */
/* ------------------------------------------------------------------ */

/* One stat's totals per pool entry: {allocated, freed} for ALL, SMALL, LARGE. */
static void check_totals(const vg_stat *s, const int64_t expected[VG_STAT_TYPES][2])
{
    for (int i = 0; i < VG_STAT_TYPES; i++) {
        CHECK_EQ(s[i].allocated, expected[i][0]);
        CHECK_EQ(s[i].freed, expected[i][1]);
        CHECK_EQ(s[i].allocated - s[i].freed, s[i].current);
    }
}

/* The heap keeps only the pools' added totals; every reader (stats, the
 * state copy, the interval) sees the all-pools totals and the freed ones
 * exactly, before and after a reset, under both policies. */
static void test_totals_per_pool_as_every_reader_sees_them(void)
{
    const vg_policy *policies[] = {&vg_policy_default, &vg_policy_arena};
    for (int p = 0; p < 2; p++) {
        vg_device *dev = vg_sim_create(GiB);
        vg_heap_config cfg = {policies[p], 0, 0};
        vg_heap *h = vg_heap_create(dev, &cfg);
        void *a = vg_heap_alloc(h, 1000, 0, NULL);     /* small: 1,024 B */
        void *b = vg_heap_alloc(h, 3 * MiB, 0, NULL);  /* large */
        vg_heap_free(h, a);
        vg_heap_free(h, b);
        void *c = vg_heap_alloc(h, 2000, 0, NULL);     /* small: 2,048 B */
        vg_stats st;
        vg_heap_stats(h, &st);
        const int64_t bytes[VG_STAT_TYPES][2] = {
            {3072 + 3 * MiB, 1024 + 3 * MiB}, {3072, 1024}, {3 * MiB, 3 * MiB}};
        const int64_t blocks[VG_STAT_TYPES][2] = {{3, 2}, {2, 1}, {1, 1}};
        const int64_t asked[VG_STAT_TYPES][2] = {
            {3000 + 3 * MiB, 1000 + 3 * MiB}, {3000, 1000}, {3 * MiB, 3 * MiB}};
        check_totals(st.allocated_bytes, bytes);
        check_totals(st.active_bytes, bytes);
        check_totals(st.allocation, blocks);
        check_totals(st.active, blocks);
        check_totals(st.requested_bytes, asked);
        vg_heap_state state;
        vg_heap_state_copy(h, &state);
        CHECK(memcmp(&state.stats, &st, sizeof st) == 0);
        vg_interval iv;
        vg_heap_take_interval(h, &iv);
        CHECK_EQ(iv.allocated_total, 3072 + 3 * MiB);
        CHECK_HEAP(h);

        vg_heap_reset_accumulated(h);
        vg_heap_free(h, c);
        void *d = vg_heap_alloc(h, 512, 0, NULL);
        vg_heap_stats(h, &st);
        const int64_t after[VG_STAT_TYPES][2] = {{512, 2048}, {512, 2048}, {0, 0}};
        for (int i = 0; i < VG_STAT_TYPES; i++) {
            CHECK_EQ(st.allocated_bytes[i].allocated, after[i][0]);
            CHECK_EQ(st.allocated_bytes[i].freed, after[i][1]);
        }
        vg_heap_take_interval(h, &iv);
        CHECK_EQ(iv.allocated_total, 512);
        CHECK_HEAP(h);
        vg_heap_free(h, d);
        vg_heap_destroy(h);
        dev->ops->destroy(dev);
    }
}

static void test_reset_accumulated_zeroes_totals_as_pytorch(void)
{
    vg_device *dev = vg_sim_create(GiB);
    vg_heap *h = vg_heap_create(dev, NULL);
    void *a = vg_heap_alloc(h, 1000, 0, NULL);
    void *b = vg_heap_alloc(h, 3 * MiB, 0, NULL);
    vg_heap_free(h, a);
    vg_heap_reset_accumulated(h);
    vg_stats st;
    vg_heap_stats(h, &st);
    CHECK_EQ(st.allocated_bytes[VG_STAT_ALL].current, 3 * MiB);
    CHECK_EQ(st.allocated_bytes[VG_STAT_ALL].allocated, 0);
    CHECK_EQ(st.allocated_bytes[VG_STAT_ALL].freed, 0);
    CHECK_EQ(st.segment[VG_STAT_ALL].allocated, 0);
    CHECK_EQ(st.num_device_alloc, 0);
    CHECK_HEAP(h);
    vg_heap_free(h, b);
    void *c = vg_heap_alloc(h, 512, 0, NULL);
    vg_heap_stats(h, &st);
    CHECK_EQ(st.allocated_bytes[VG_STAT_ALL].allocated, 512);
    CHECK_EQ(st.allocated_bytes[VG_STAT_ALL].freed, 3 * MiB);
    CHECK_EQ(st.allocation[VG_STAT_ALL].allocated, 1);
    CHECK_EQ(st.allocation[VG_STAT_ALL].freed, 1);
    CHECK_HEAP(h);
    vg_heap_free(h, c);
    vg_heap_destroy(h);
    dev->ops->destroy(dev);
}

/* ------------------------------------------------------------------ */
/* The simulated address space                                         */
/* ------------------------------------------------------------------ */

static void test_sim_addresses_never_wrap(void)
{
    vg_device *dev = vg_sim_create((size_t)1 << 56);
    /* Without virtual memory, segments have the whole space to spend. */
    CHECK_EQ(vg_sim_set_page_size(dev, 0), VG_OK);
    uintptr_t keep = 0, addr = 0;
    CHECK_EQ(dev->ops->reserve(dev, 2 * MiB, &keep), VG_OK);
    size_t rounds = 0;
    /* 2^17 rounds of 2^47 would bring a wrapping counter back to `keep`. */
    while (rounds < ((size_t)1 << 17) + 2) {
        if (dev->ops->reserve(dev, VG_MAX_REQUEST, &addr) != VG_OK) break;
        CHECK(addr != 0);
        CHECK(addr > keep);
        CHECK(addr + VG_MAX_REQUEST > addr); /* the range does not wrap */
        dev->ops->release(dev, addr, VG_MAX_REQUEST);
        rounds++;
    }
    CHECK(rounds < ((size_t)1 << 17)); /* the space ran out instead */
    CHECK(rounds > ((size_t)1 << 17) - 3);
    CHECK_EQ(vg_sim_used(dev), 2 * MiB);
    /* What is left is less than one more round, and is still handed out. */
    CHECK_EQ(dev->ops->reserve(dev, VG_MAX_REQUEST / 2, &addr), VG_OK);
    CHECK(addr > keep && addr + VG_MAX_REQUEST / 2 > addr);
    dev->ops->destroy(dev);
}

static void test_heap_on_a_spent_address_space_reports_oom(void)
{
    vg_device *dev = vg_sim_create((size_t)1 << 56);
    /* Segments' address space spent (the arena's ranges are another test). */
    vg_heap_config cfg = {&vg_policy_default, 0, 0};
    vg_heap *h = vg_heap_create(dev, &cfg);
    void *keep = vg_heap_alloc(h, MiB, 0, NULL);
    CHECK(keep != NULL);
    vg_oom_info oom;
    size_t rounds = 0;
    for (;;) {
        void *p = vg_heap_alloc(h, VG_MAX_REQUEST, 0, &oom);
        if (!p) break;
        CHECK(p != keep);
        vg_heap_free(h, p);
        vg_heap_empty_cache(h);
        rounds++;
        CHECK(rounds < ((size_t)1 << 17));
    }
    CHECK_EQ(oom.rounded, VG_MAX_REQUEST);
    CHECK_EQ(vg_heap_block_size(h, keep), 1024 * 1024);
    CHECK_HEAP(h);
    CHECK_EQ(vg_heap_free(h, keep), VG_OK);
    CHECK_HEAP(h);
    vg_heap_destroy(h);
    dev->ops->destroy(dev);
}

#define T(fn) {#fn, fn}
static const harness_test tests[] = {
    T(test_trace_with_more_ids_than_ops_is_refused),
    T(test_trace_sizes_past_the_largest_request_are_refused),
    T(test_peak_live_past_64_bits_is_an_error),
    T(test_nan_and_negative_settings_are_refused),
    T(test_a_second_recording_is_refused_and_loses_nothing),
    T(test_reset_accumulated_zeroes_totals_as_pytorch),
    T(test_totals_per_pool_as_every_reader_sees_them),
    T(test_sim_addresses_never_wrap),
    T(test_heap_on_a_spent_address_space_reports_oom),
};

int main(int argc, char **argv)
{
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
