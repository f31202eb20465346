/* libFuzzer harness: the fuzzer's bytes are a program of heap operations
 * (alloc, free, double free, record_stream, empty_cache, set_budget,
 * set_gc_threshold, synchronize, stream completion, resets) on a simulated
 * device that refuses reserves at random and fails with device errors. After every operation the heap's
 * own check must pass and the harness's model must agree with it: live
 * blocks never overlap, a freed block is unknown to the heap, the live
 * count is the heap's, and at the end everything goes back to the device. */
#include "fuzz_input.h"
#include "vramguard/heap.h"

#include <string.h>

#define MiB ((uint64_t)1 << 20)
#define SLOTS 64

typedef struct slot {
    uintptr_t addr;
    size_t size; /* the block's, as the heap rounded it */
} slot;

typedef struct world {
    vg_device *dev;
    vg_heap *heap;
    slot live[SLOTS];
    size_t nlive;
} world;

static void check_world(const world *w)
{
    const char *err = vg_heap_check(w->heap);
    FUZZ_ASSERT(err == NULL, "heap check: %s", err);
    vg_stats st;
    vg_heap_stats(w->heap, &st);
    FUZZ_ASSERT(st.allocation[VG_STAT_ALL].current == (int64_t)w->nlive, "live count %lld, model %zu",
                (long long)st.allocation[VG_STAT_ALL].current, w->nlive);
    FUZZ_ASSERT(st.reserved_bytes[VG_STAT_ALL].current >= st.active_bytes[VG_STAT_ALL].current,
                "reserved below active");
}

/* Sizes from every regime: tiny, small pool, large pool, past the device,
 * past the largest request, and 0. */
static size_t fuzz_size(fuzz_input *in)
{
    uint64_t kind = fuzz_take(in, 1) % 8, v = fuzz_take(in, 4);
    switch (kind) {
    case 0: return (size_t)(v % 4096);
    case 1: case 2: return 1 + (size_t)(v % MiB);
    case 3: case 4: return (size_t)(MiB + v % (64 * MiB));
    case 5: return (size_t)(v % (4096 * MiB));
    case 6: return (size_t)(VG_MAX_REQUEST - 512 + v % 2048);
    default: return (size_t)((uint64_t)fuzz_take(in, 4) << 32 | v);
    }
}

static void do_alloc(world *w, fuzz_input *in)
{
    size_t size = fuzz_size(in);
    vg_stream_t stream = (vg_stream_t)(fuzz_take(in, 1) % 4);
    vg_oom_info oom;
    void *p = vg_heap_alloc(w->heap, size, stream, &oom);
    if (!p) {
        FUZZ_ASSERT(size == 0 || oom.requested == size, "OOM record of %zu for %zu", oom.requested, size);
        FUZZ_ASSERT(size == 0 || oom.status == VG_ERR_NOMEM || oom.status == VG_ERR_DEVICE,
                    "failure status %d", oom.status);
        return;
    }
    uintptr_t a = (uintptr_t)p;
    size_t block = vg_heap_block_size(w->heap, p);
    FUZZ_ASSERT(block >= vg_round_size(size) && block % VG_ALIGN == 0, "block %zu for %zu", block, size);
    for (size_t i = 0; i < w->nlive; i++) {
        const slot *s = &w->live[i];
        FUZZ_ASSERT(a + block <= s->addr || s->addr + s->size <= a, "new block overlaps a live one");
    }
    if (w->nlive == SLOTS) { /* no room in the model: give it back */
        FUZZ_ASSERT(vg_heap_free(w->heap, p) == VG_OK, "free of a fresh block");
        return;
    }
    w->live[w->nlive++] = (slot){a, block};
}

static void do_free(world *w, fuzz_input *in)
{
    if (!w->nlive) { /* any pointer is unknown now; NULL is a no-op */
        uintptr_t a = (uintptr_t)fuzz_take(in, 8);
        FUZZ_ASSERT(vg_heap_free(w->heap, (void *)a) == (a ? VG_ERR_INVALID : VG_OK), "free of %#lx",
                    (unsigned long)a);
        return;
    }
    size_t i = (size_t)(fuzz_take(in, 1) % w->nlive);
    void *p = (void *)w->live[i].addr;
    w->live[i] = w->live[--w->nlive];
    FUZZ_ASSERT(vg_heap_free(w->heap, p) == VG_OK, "free of a live block");
    FUZZ_ASSERT(vg_heap_free(w->heap, p) == VG_ERR_INVALID, "double free accepted");
    FUZZ_ASSERT(vg_heap_block_size(w->heap, p) == 0, "freed block still live");
}

static void do_record_stream(world *w, fuzz_input *in)
{
    vg_stream_t stream = (vg_stream_t)(fuzz_take(in, 1) % 6);
    if (!w->nlive) {
        FUZZ_ASSERT(vg_heap_record_stream(w->heap, (void *)(uintptr_t)0x1000, stream) == VG_ERR_INVALID,
                    "record_stream of nothing");
        return;
    }
    size_t i = (size_t)(fuzz_take(in, 1) % w->nlive);
    int rc = vg_heap_record_stream(w->heap, (void *)w->live[i].addr, stream);
    FUZZ_ASSERT(rc == VG_OK || rc == VG_ERR_NOMEM, "record_stream: %d", rc);
}

static void do_settings(world *w, fuzz_input *in)
{
    switch (fuzz_take(in, 1) % 6) {
    case 0: {
        size_t budget = (size_t)(fuzz_take(in, 2) * 8 * MiB);
        FUZZ_ASSERT(vg_heap_set_budget(w->heap, budget) == VG_OK, "set_budget");
        FUZZ_ASSERT(vg_heap_budget(w->heap) == budget, "budget read back");
        break;
    }
    case 1: {
        uint64_t bits = fuzz_take(in, 8);
        double g;
        memcpy(&g, &bits, sizeof g); /* NaN, infinities, negatives, all of it */
        double before = vg_heap_gc_threshold(w->heap);
        int rc = vg_heap_set_gc_threshold(w->heap, g);
        FUZZ_ASSERT(rc == (vg_valid_fraction(g) ? VG_OK : VG_ERR_ARG), "gc threshold %g: %d", g, rc);
        FUZZ_ASSERT(vg_heap_gc_threshold(w->heap) == (rc == VG_OK ? g : before), "gc read back");
        break;
    }
    case 2: vg_heap_reset_peaks(w->heap); break;
    case 3: vg_heap_reset_accumulated(w->heap); break;
    case 4: vg_sim_fail_nth(w->dev, fuzz_take(in, 1) % 4); break;
    default: { /* a device error that is not an out-of-memory, maybe sticky */
        uint64_t v = fuzz_take(in, 1);
        vg_sim_fail_device(w->dev, (v >> 1) % 4, (int)(v & 1));
        break;
    }
    }
}

static void step(world *w, fuzz_input *in)
{
    switch (fuzz_take(in, 1) % 12) {
    case 0: case 1: case 2: case 3: do_alloc(w, in); break;
    case 4: case 5: case 6: do_free(w, in); break;
    case 7: do_record_stream(w, in); break;
    case 8: vg_heap_empty_cache(w->heap); break;
    case 9: vg_heap_synchronize(w->heap); break;
    case 10: vg_sim_complete_stream(w->dev, (vg_stream_t)(fuzz_take(in, 1) % 6)); break;
    default: do_settings(w, in); break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_input in = {data, size, 0};
    uint64_t head = fuzz_take(&in, 4);
    const vg_policy *policy = head & 1 ? &vg_policy_torch : &vg_policy_default;
    size_t capacity = (size_t)(((head >> 1) & 0xff) + 1) * 64 * MiB; /* 64 MiB to 16 GiB */
    size_t budget = (size_t)((head >> 9) & 0xff) * 32 * MiB;
    double gc = (double)((head >> 17) % 5) / 4.0;
    world w = {0};
    w.dev = vg_sim_create(capacity);
    vg_heap_config cfg = {policy, budget, gc};
    w.heap = vg_heap_create(w.dev, &cfg);
    FUZZ_ASSERT(w.heap != NULL, "heap create");
    vg_sim_fail_random(w.dev, (double)((head >> 20) % 4) * 0.15, head);
    for (int ops = 0; fuzz_more(&in) && ops < 4096; ops++) {
        step(&w, &in);
        check_world(&w);
    }
    while (w.nlive) FUZZ_ASSERT(vg_heap_free(w.heap, (void *)w.live[--w.nlive].addr) == VG_OK, "final free");
    vg_sim_fail_device(w.dev, 0, 0); /* a device that recovered gives everything back */
    vg_heap_synchronize(w.heap);
    vg_heap_empty_cache(w.heap);
    check_world(&w);
    vg_stats st;
    vg_heap_stats(w.heap, &st);
    FUZZ_ASSERT(st.reserved_bytes[VG_STAT_ALL].current == 0, "reserved after emptying");
    FUZZ_ASSERT(vg_sim_used(w.dev) == 0, "the device holds %zu bytes", vg_sim_used(w.dev));
    vg_heap_destroy(w.heap);
    w.dev->ops->destroy(w.dev);
    return 0;
}
