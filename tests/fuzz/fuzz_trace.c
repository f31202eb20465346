/* libFuzzer harness: the trace reader's C half. The fuzzer's bytes become
 * a columnar trace, mostly well formed (allocations of fresh ids, frees of
 * live ones) with faults mixed in (unknown kinds, ids out of range, double
 * frees, sizes of 0 or past the largest request, an id count that lies).
 * vg_trace_validate must find exactly the first fault a simple model of
 * the rules finds; a trace it passes must give the model's peak and replay
 * under a budget with the heap's check holding and nothing left live. */
#include "fuzz_input.h"
#include "vramguard/replay.h"

#include <string.h>

#define MAX_OPS 2048
#define MiB ((uint64_t)1 << 20)

typedef struct columns {
    uint8_t kinds[MAX_OPS];
    uint32_t ids[MAX_OPS];
    uint64_t sizes[MAX_OPS];
    uint64_t streams[MAX_OPS];
    uint32_t live[MAX_OPS]; /* ids live as the trace is built */
    size_t nlive;
    size_t n, fresh;        /* ops, ids handed out */
} columns;

static uint64_t op_size(fuzz_input *in)
{
    uint64_t kind = fuzz_take(in, 1) % 8, v = fuzz_take(in, 4);
    switch (kind) {
    case 0: return 0;
    case 1: return VG_MAX_REQUEST + 1 + v;
    case 2: return VG_MAX_REQUEST - v % 4096;
    case 3: case 4: return 1 + v % MiB;
    default: return 1 + v % (256 * MiB);
    }
}

static void add(columns *c, uint8_t kind, uint32_t id, uint64_t size, uint64_t stream)
{
    c->kinds[c->n] = kind;
    c->ids[c->n] = id;
    c->sizes[c->n] = size;
    c->streams[c->n] = stream;
    c->n++;
}

static void build_op(columns *c, fuzz_input *in)
{
    uint64_t what = fuzz_take(in, 1) % 10;
    if (what < 4) { /* a fresh allocation */
        uint32_t id = (uint32_t)c->fresh++;
        add(c, VG_OP_ALLOC, id, what == 0 ? op_size(in) : 1 + fuzz_take(in, 3), fuzz_take(in, 1) % 3);
        c->live[c->nlive++] = id;
    } else if (what < 7 && c->nlive) { /* a free of a live id */
        size_t i = (size_t)(fuzz_take(in, 1) % c->nlive);
        add(c, VG_OP_FREE, c->live[i], 0, 0);
        c->live[i] = c->live[--c->nlive];
    } else if (what == 7) {
        add(c, fuzz_take(in, 1) & 1 ? VG_OP_EMPTY_CACHE : VG_OP_SYNCHRONIZE, 0, 0, 0);
    } else { /* anything at all */
        add(c, (uint8_t)fuzz_take(in, 1) % 6, (uint32_t)fuzz_take(in, 1) % (c->fresh + 3),
            op_size(in), fuzz_take(in, 8));
    }
}

/* The rules, written out again: the first op at fault (SIZE_MAX for the
 * trace as a whole, n when none) and the peak of live bytes. */
static size_t model_fault(const vg_trace_ops *t, uint64_t *peak_out)
{
    if (t->nids > t->n) return SIZE_MAX;
    static uint64_t size_of[MAX_OPS];
    static uint8_t is_live[MAX_OPS];
    memset(is_live, 0, sizeof is_live);
    uint64_t live = 0, peak = 0;
    for (size_t i = 0; i < t->n; i++) {
        uint8_t k = t->kinds[i];
        uint32_t id = t->ids[i];
        if (k == VG_OP_EMPTY_CACHE || k == VG_OP_SYNCHRONIZE) continue;
        if (k != VG_OP_ALLOC && k != VG_OP_FREE) return i;
        if (id >= t->nids) return i;
        if (k == VG_OP_FREE) {
            if (!is_live[id]) return i;
            is_live[id] = 0;
            live -= size_of[id];
            continue;
        }
        if (is_live[id] || t->sizes[i] == 0 || t->sizes[i] > VG_MAX_REQUEST) return i;
        is_live[id] = 1;
        size_of[id] = t->sizes[i];
        live += t->sizes[i];
        if (live > peak) peak = live;
    }
    *peak_out = peak;
    return t->n;
}

static void replay_and_check(const vg_trace_ops *t, uint64_t peak, fuzz_input *in)
{
    uint64_t knobs = fuzz_take(in, 4);
    vg_device *dev = vg_sim_create((size_t)1 << 50);
    vg_heap_config cfg = {knobs & 1 ? &vg_policy_torch : &vg_policy_default,
                          (size_t)((knobs >> 1) & 0x3ff) * 16 * MiB, 0.0};
    vg_heap *h = vg_heap_create(dev, &cfg);
    vg_replay_sample samples[16];
    size_t nsamples = (size_t)((knobs >> 11) % 17);
    vg_replay_result r;
    int rc = vg_replay(h, t, nsamples ? samples : NULL, nsamples, 1 + t->n / 16, &r);
    FUZZ_ASSERT(rc == VG_OK, "replay: %d", rc);
    const char *err = vg_heap_check(h);
    FUZZ_ASSERT(err == NULL, "heap check after replay: %s", err);
    FUZZ_ASSERT(r.ops == t->n && r.ooms <= r.allocs && r.samples <= nsamples, "replay counts");
    FUZZ_ASSERT(r.peak_requested <= peak, "replayed peak %llu over the trace's %llu",
                (unsigned long long)r.peak_requested, (unsigned long long)peak);
    vg_stats st;
    vg_heap_stats(h, &st);
    FUZZ_ASSERT(st.allocation[VG_STAT_ALL].current == 0, "blocks left live after a replay");
    if (cfg.budget) FUZZ_ASSERT(r.peak_reserved <= cfg.budget, "over the budget");
    vg_heap_destroy(h);
    dev->ops->destroy(dev);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static columns c;
    memset(&c, 0, sizeof c);
    fuzz_input in = {data, size, 0};
    uint64_t lie = fuzz_take(&in, 1);
    size_t nops = (size_t)(fuzz_take(&in, 2) % MAX_OPS);
    for (size_t i = 0; i < nops && fuzz_more(&in); i++) build_op(&c, &in);
    /* The id count: right, a little off, or what a crafted header says. */
    uint64_t nids = c.fresh;
    if (lie % 8 == 1) nids += lie >> 3;
    else if (lie % 8 == 2) nids = nids > (lie >> 3) ? nids - (lie >> 3) : 0;
    else if (lie % 8 == 3) nids = UINT32_MAX;
    vg_trace_ops t = {c.kinds, c.ids, c.sizes, c.streams, c.n, (size_t)nids};
    uint64_t peak = 0;
    size_t expected = model_fault(&t, &peak), bad = 7;
    const char *err = vg_trace_validate(&t, &bad);
    if (expected != t.n) {
        FUZZ_ASSERT(err != NULL, "fault at op %zu not found", expected);
        FUZZ_ASSERT(bad == expected, "fault reported at op %zu, the model says %zu", bad, expected);
        return 0;
    }
    FUZZ_ASSERT(err == NULL, "valid trace refused at op %zu: %s", bad, err);
    uint64_t got = 0;
    FUZZ_ASSERT(vg_trace_peak_live(&t, &got) == VG_OK && got == peak, "peak %llu, model %llu",
                (unsigned long long)got, (unsigned long long)peak);
    replay_and_check(&t, peak, &in);
    return 0;
}
