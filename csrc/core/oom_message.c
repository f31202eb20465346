/* The OOM message: PyTorch's own wording first, so that tools that parse
 * it (batch-size finders in accelerate, Lightning, HF Trainer) recognise
 * it, then one line with the most likely cause vramguard can see. */
#include "vramguard/heap.h"
#include "vramguard/oom.h"

#include <stdarg.h>
#include <stdio.h>

/* The ending of a counted word: "1 byte", "2 bytes", "0 pools" (the rule
 * of vramguard/render/words.py, for the messages built here). */
static const char *plural_s(uint64_t n)
{
    return n == 1 ? "" : "s";
}

/* As PyTorch formats sizes: bytes, then KiB / MiB / GiB with two decimals,
 * except that one byte is "1 byte" (PyTorch writes "1 bytes"). */
/* The largest unit in which the value shows at least 1.00, judged after
 * rounding to two decimals: 1 GiB is "1.00 GiB", and 1 GiB - 1 byte too,
 * rather than "1024.00 MiB" (which also overflows a report's column). */
void vg_format_size(uint64_t bytes, char *buf, size_t n)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, n, "%llu byte%s", (unsigned long long)bytes, plural_s(bytes));
        return;
    }
    double value = (double)bytes / 1024.0;
    size_t u = 0;
    while (u + 1 < sizeof units / sizeof units[0] && value >= 1023.995) {
        value /= 1024.0;
        u++;
    }
    snprintf(buf, n, "%.2f %s", value, units[u]);
}

typedef struct writer {
    char *buf;
    size_t n, used;
} writer;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void put(writer *w, const char *fmt, ...)
{
    if (w->used >= w->n) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(w->buf + w->used, w->n - w->used, fmt, ap);
    va_end(ap);
    if (k > 0) w->used += (size_t)k < w->n - w->used ? (size_t)k : w->n - w->used - 1;
}

#define SZ(name, value)                                                          \
    char name[32];                                                               \
    vg_format_size((uint64_t)(value), name, sizeof name)

/* What the heap that refused caches unallocated: for a capture's request
 * its graph's pool's (free_bytes, as its largest free block is the pool's),
 * never the device heap's, which the request could not use. */
static size_t unallocated_where_refused(const vg_oom_info *o)
{
    return o->in_private_pool ? o->free_bytes : o->reserved - o->allocated;
}

/* The cause, from what the record shows, most specific first. */
static void put_cause(writer *w, const vg_oom_info *o)
{
    size_t ceiling = o->budget ? o->budget : o->device_total;
    size_t unallocated = unallocated_where_refused(o);
    SZ(req, o->rounded ? o->rounded : o->requested);
    SZ(cap, ceiling);
    SZ(live, o->allocated);
    SZ(largest, o->largest_free_block);
    SZ(unalloc, unallocated);
    put(w, "\nvramguard: ");
    if (o->budget == VG_BUDGET_NOTHING) {
        put(w, "a memory fraction of 0 allows no new memory "
               "(torch.cuda.set_per_process_memory_fraction(0)); raise it to allocate.");
    } else if (o->rounded == 0) {
        put(w, "the request is larger than any device can hold; check the tensor's shape.");
    } else if (o->rounded > ceiling) {
        put(w, "this one tensor (%s) is larger than the whole %s (%s); check its shape or "
               "lower the batch size.", req, o->budget ? "budget" : "device", cap);
    } else if (o->arena && o->free_bytes >= o->rounded && o->largest_free_block < o->rounded) {
        put(w, "%s is mapped but unallocated, in pages that live tensors share (whole free "
               "pages were unmapped); the largest mapped free stretch is %s. A smaller batch "
               "helps.", unalloc, largest);
    } else if (o->free_bytes >= o->rounded && o->largest_free_block < o->rounded) {
        put(w, "fragmentation: %s is cached but unallocated%s, yet its largest free block is "
               "%s. Freeing tensors that sit between cached blocks, or a smaller batch, "
               "helps; vramguard.summary() shows the segments.", unalloc,
            o->in_private_pool ? " in the graph's pool" : "", largest);
    } else if (o->budget_refused && o->budget && o->device_free > o->rounded) {
        SZ(dev_free, o->device_free);
        put(w, "the budget (%s) is the limit, not the device (%s still free on it). Raise "
               "the budget or lower the batch size.", cap, dev_free);
    } else if (o->in_private_pool) {
        /* The device heap's cache is not the pool's: put_pools says what
         * would free it. */
        SZ(live_all, o->allocated + o->pools_allocated);
        put(w, "live tensors hold %s of %s. Lower the batch size, free tensors you no longer "
               "need (del x), or use gradient checkpointing.", live_all, cap);
    } else if (o->reserved > o->allocated + o->rounded) {
        put(w, "%s is held in the cache but could not be used for this request.", unalloc);
    } else {
        put(w, "live tensors hold %s of %s; the cache held nothing to release. Lower the "
               "batch size, free tensors you no longer need (del x), or use gradient "
               "checkpointing.", live, cap);
    }
}

/* What CUDA graphs hold: memory no other allocation can use until their
 * graphs are released, counted in the budget as the device heap's is. */
static void put_pools(writer *w, const vg_oom_info *o)
{
    if (o->pools_reserved) {
        SZ(held, o->pools_reserved);
        SZ(live, o->pools_allocated);
        put(w, " CUDA graph private pools hold %s (%zu pool%s, %s of it in live tensors)%s: a "
               "graph keeps its pool's memory for its replays until the graph is released (del "
               "the torch.cuda.CUDAGraph; torch._dynamo.reset() for torch.compile's "
               "mode=\"reduce-overhead\").", held, o->pools, plural_s(o->pools), live,
            o->budget ? ", counted in the budget" : "");
    }
    if (!o->in_private_pool) return;
    put(w, " This request came from a capture and was refused in its graph's pool.");
    /* Nothing may be freed on the device while a graph captures, so the
     * device heap's idle cache stays where it is until the capture ends. */
    if (o->reserved > o->allocated) {
        SZ(idle, o->reserved - o->allocated);
        put(w, " The device heap caches %s unallocated%s, which cannot be released during a "
               "capture: torch.cuda.empty_cache() before the capture would free it "
               "(torch.cuda.graph calls it on entry; CUDAGraph.capture_begin does not).", idle,
            o->budget ? ", counted in the budget" : "");
    }
}

size_t vg_format_oom(const vg_oom_info *o, const char *device_kind, char *buf, size_t n)
{
    writer w = {buf, n, 0};
    if (n) buf[0] = '\0';
    SZ(req, o->requested);
    SZ(total, o->device_total);
    SZ(free_b, o->device_free);
    SZ(alloc, o->allocated);
    SZ(unalloc, o->reserved - o->allocated);
    put(&w, "%s out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of "
            "which %s is free. ", device_kind, req, o->device, total, free_b);
    if (o->pools_reserved) {
        /* PyTorch's wording: what private pools hold counts as allocated,
         * since nothing else may use it. */
        SZ(with_pools, o->allocated + o->pools_reserved);
        SZ(in_pools, o->pools_reserved);
        put(&w, "Of the allocated memory %s is allocated by PyTorch, with %s allocated in "
                "private pools (e.g., CUDA Graphs), and %s is reserved by PyTorch but "
                "unallocated.", with_pools, in_pools, unalloc);
    } else {
        put(&w, "Of the allocated memory %s is allocated by PyTorch, and %s is reserved by "
                "PyTorch but unallocated.", alloc, unalloc);
    }
    if (o->budget == VG_BUDGET_NOTHING) {
        put(&w, " vramguard's budget is 0 bytes (a memory fraction of 0).");
    } else if (o->budget) {
        SZ(budget, o->budget);
        put(&w, " vramguard's budget is %s.", budget);
    }
    if (o->arena) {
        SZ(mapped, o->reserved);
        SZ(unmapped, o->unmapped_bytes);
        /* What could be allocated, never the free address space: a range's
         * unmapped pages are not memory, and "58.97 GiB free" beside an
         * out-of-memory on a 15 GiB device misleads. */
        SZ(fits, o->largest_allocatable);
        put(&w, " vramguard's arena: %s mapped in %zu range%s, %s unmapped so far; the largest "
                "block that could be allocated now is %s.", mapped, o->ranges,
            o->ranges == 1 ? "" : "s", unmapped, fits);
    }
    put_cause(&w, o);
    put_pools(&w, o);
    return w.used;
}

/* PyTorch's C10_CUDA_CHECK writes "CUDA error: <cudaGetErrorString>";
 * the same head lets people and tools recognise the error they know. */
size_t vg_format_device_error(const vg_oom_info *info, const char *device_kind, char *buf,
                              size_t n)
{
    writer w = {buf, n, 0};
    if (n) buf[0] = '\0';
    const vg_device_error *e = &info->device_error;
    SZ(req, info->requested);
    put(&w, "%s error: %s", device_kind, e->text[0] ? e->text : "unknown error");
    put(&w, "\nvramguard: %s failed with %s (%d) while allocating %s on GPU %d. This is a "
            "device error, not a lack of memory: nothing was released or retried, and a "
            "smaller batch will not help. Kernel errors are reported asynchronously, at some "
            "later call, so an earlier kernel may be the cause; for debugging consider "
            "passing CUDA_LAUNCH_BLOCKING=1.",
        e->call[0] ? e->call : "a device call", e->name[0] ? e->name : "an unnamed error",
        e->code, req, info->device);
    return w.used;
}
