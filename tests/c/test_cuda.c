/* The CUDA provider (device/cuda.c) over a small fake runtime
 * (fake_cudart.c), linked in under the hash-style name older PyTorch
 * wheels give theirs, so that the provider's real code runs: finding the
 * runtime already loaded, out-of-memory against every other error, the
 * current device around each call, and events under the stream's device. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "vramguard/heap.h"
#include "vramguard/devices.h"
#include "harness.h"
#include "fake_cudart.h"

#include <link.h>
#include <pthread.h>
#include <string.h>

int cudaGetLastError(void);
int cudaSetDevice(int d);

static const size_t MiB = (size_t)1 << 20;

typedef struct fixture {
    vg_device *dev;
    vg_heap *heap;
} fixture;

static fixture setup(int device, const vg_policy *policy)
{
    fake_reset();
    char why[256] = "";
    fixture fx = {vg_cuda_create(device, why, sizeof why), NULL};
    if (!fx.dev) {
        fprintf(stderr, "  no CUDA provider: %s\n", why);
        return fx;
    }
    vg_heap_config cfg = {policy, 0, 0.0};
    fx.heap = vg_heap_create(fx.dev, &cfg);
    return fx;
}

static void destroy(fixture fx)
{
    if (fx.heap) vg_heap_destroy(fx.heap);
    if (fx.dev) fx.dev->ops->destroy(fx.dev);
}

static vg_stats stats_of(vg_heap *h)
{
    vg_stats st;
    vg_heap_stats(h, &st);
    return st;
}

/* ------------------------------------------------------------------ */
/* Finding the runtime                                                 */
/* ------------------------------------------------------------------ */

static void test_runtime_name_table(void)
{
    static const struct {
        const char *name;
        int rank;
    } table[] = {
        {"libcudart.so.13", 2},
        {"libcudart.so.12", 2},
        {"libcudart.so.12.4.127", 2},
        {"libcudart.so.11.0", 2},
        {"libcudart-9335f6a2.so.11.0", 2},
        {"/usr/lib/python3/site-packages/torch/lib/libcudart-d0da41ae.so.11.0", 2},
        {"/opt/nvidia/cu13/lib/libcudart.so.13", 2},
        {"libcudart.so", 1},
        {"/usr/local/cuda/lib64/libcudart.so", 1},
        {"libcudart_static.a", 0},
        {"libcudartx.so", 0},
        {"libcudart.so.", 0},
        {"libcudart.so.12.bak", 0},
        {"libcudart.so.12..4", 0},
        {"libcudart-.so.12", 0},
        {"libcudart-zz.so.12", 0},
        {"libcudart", 0},
        {"libcudadevrt.a", 0},
        {"libcuda.so.1", 0},
        {"/lib/libcudart.so.13/libc.so.6", 0},
        {"xlibcudart.so.13", 0},
        {"", 0},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        int rank = vg_cuda_runtime_name_rank(table[i].name);
        if (rank != table[i].rank) fprintf(stderr, "  %s: rank %d\n", table[i].name, rank);
        CHECK_EQ(rank, table[i].rank);
    }
    CHECK_EQ(vg_cuda_runtime_name_rank(NULL), 0);
}

static int count_runtimes(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    if (vg_cuda_runtime_name_rank(info->dlpi_name)) (*(int *)arg)++;
    return 0;
}

static void test_finds_the_loaded_runtime_whatever_its_name(void)
{
    CHECK(vg_cuda_runtime_present());
    const char *err = vg_cuda_load();
    if (err) fprintf(stderr, "  %s\n", err);
    CHECK(err == NULL);
    const char *source = vg_cuda_runtime_source();
    CHECK(source && strstr(source, "/libcudart-9335f6a2.so.11.0 (already loaded)"));
    /* and no second runtime came in beside it */
    int runtimes = 0;
    dl_iterate_phdr(count_runtimes, &runtimes);
    CHECK_EQ(runtimes, 1);
    CHECK_EQ(vg_cuda_device_count(), 2);
}

static void test_missing_device_is_named(void)
{
    fake_reset();
    char why[256] = "";
    CHECK(vg_cuda_create(5, why, sizeof why) == NULL);
    CHECK(strcmp(why, "it does not exist (2 visible)") == 0);
    fake_fail_device_count(35);
    CHECK(vg_cuda_create(0, why, sizeof why) == NULL);
    CHECK(strcmp(why, "cudaGetDeviceCount failed with cudaErrorInsufficientDriver: CUDA driver "
                      "version is insufficient for CUDA runtime version") == 0);
    CHECK_EQ(cudaGetLastError(), 0); /* read, so cleared */
    fake_reset();
}

/* This runtime offers no driver entry points and no libcuda.so.1 is
 * loaded: segments only, and the reason said. */
static void test_no_driver_means_no_virtual_memory(void)
{
    fixture fx = setup(0, NULL);
    CHECK(fx.dev);
    CHECK_EQ(fx.dev->page_size, 0);
    CHECK(!fx.dev->ops->range_reserve && !fx.dev->ops->map && !fx.dev->ops->unmap);
    const char *why = vg_cuda_vmm_unsupported(fx.dev);
    CHECK(why && strcmp(why, "no CUDA driver found (the runtime has no cudaGetDriverEntryPoint, "
                             "and no libcuda.so.1 is loaded)") == 0);
    destroy(fx);
}

/* ------------------------------------------------------------------ */
/* Out of memory, and everything else                                  */
/* ------------------------------------------------------------------ */

/* One cached idle segment, so that a ladder would have something to release. */
static void cache_one_segment(fixture fx)
{
    void *p = vg_heap_alloc(fx.heap, 30 * MiB, 0, NULL);
    vg_heap_free(fx.heap, p);
}

static void test_only_memory_allocation_is_an_oom(void)
{
    fixture fx = setup(0, NULL);
    CHECK(fx.heap);
    CHECK_EQ(vg_heap_device(fx.heap)->index, 0);
    cache_one_segment(fx);
    /* more than the device holds: cudaErrorMemoryAllocation, and the whole
     * ladder runs before the OOM */
    vg_oom_info oom;
    CHECK(vg_heap_alloc(fx.heap, 70 * MiB, 0, &oom) == NULL);
    CHECK_EQ(oom.status, VG_ERR_NOMEM);
    vg_stats st = stats_of(fx.heap);
    CHECK_EQ(st.num_ooms, 1);
    CHECK_EQ(st.num_device_errors, 0);
    CHECK_EQ(st.num_device_alloc_failed, 3);
    CHECK_EQ(st.num_stream_releases, 1);
    CHECK_EQ(st.num_sync_all_streams, 1);
    CHECK_EQ(st.num_alloc_retries, 2);
    CHECK_EQ(oom.device_total, 64 * MiB);
    CHECK_EQ(oom.device_free, 64 * MiB);
    CHECK_EQ(cudaGetLastError(), 0); /* our refusal is not left for the next kernel */
    /* a refusal where there was room is an OOM too: the ladder's retry serves */
    cache_one_segment(fx);
    fake_fail_malloc(2, 0);
    void *p = vg_heap_alloc(fx.heap, 40 * MiB, 0, &oom);
    CHECK(p != NULL);
    st = stats_of(fx.heap);
    CHECK_EQ(st.num_device_alloc_failed, 4);
    CHECK_EQ(st.num_stream_releases, 2);
    CHECK_EQ(st.num_device_errors, 0);
    CHECK_EQ(cudaGetLastError(), 0);
    vg_heap_free(fx.heap, p);
    CHECK_HEAP(fx.heap);
    destroy(fx);
}

static void test_sticky_error_is_reported_as_itself(void)
{
    fixture fx = setup(0, NULL);
    CHECK(fx.heap);
    cache_one_segment(fx);
    void *small = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    vg_heap_free(fx.heap, small);
    fake_fail_malloc(700, 1); /* an earlier kernel's illegal address */
    vg_oom_info info;
    CHECK(vg_heap_alloc(fx.heap, 40 * MiB, 0, &info) == NULL);
    CHECK_EQ(info.status, VG_ERR_DEVICE);
    CHECK_EQ(info.device_error.code, 700);
    CHECK(strcmp(info.device_error.call, "cudaMalloc") == 0);
    CHECK(strcmp(info.device_error.name, "cudaErrorIllegalAddress") == 0);
    CHECK(strcmp(info.device_error.text, "an illegal memory access was encountered") == 0);
    CHECK_EQ(info.requested, 40 * MiB);
    vg_stats st = stats_of(fx.heap);
    CHECK_EQ(st.num_ooms, 0);
    CHECK_EQ(st.num_device_errors, 1);
    CHECK_EQ(st.num_device_alloc_failed, 0);
    /* no ladder: nothing released, nothing retried, nothing synchronized */
    CHECK_EQ(st.num_alloc_retries, 0);
    CHECK_EQ(st.num_stream_releases + st.num_sync_releases + st.num_gc_releases, 0);
    CHECK_EQ(st.num_sync_all_streams, 0);
    CHECK_EQ(st.num_device_free, 0);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 32 * MiB);
    CHECK_EQ(fake_mallocs(0), 2);
    char msg[1536];
    vg_format_device_error(&info, "CUDA", msg, sizeof msg);
    CHECK(strncmp(msg, "CUDA error: an illegal memory access was encountered\n", 53) == 0);
    CHECK(strstr(msg, "cudaMalloc failed with cudaErrorIllegalAddress (700) while allocating "
                      "40.00 MiB on GPU 0") != NULL);
    CHECK(strstr(msg, "out of memory") == NULL);
    /* a sticky error stays for the user's next CUDA call to see */
    CHECK_EQ(cudaGetLastError(), 700);
    /* cached memory still serves, as PyTorch's cache does */
    void *again = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(again == small);
    vg_heap_free(fx.heap, again);
    CHECK_HEAP(fx.heap);
    destroy(fx);
    fake_reset();
}

static void test_other_errors_are_device_errors_and_cleared(void)
{
    fixture fx = setup(0, &vg_policy_torch);
    CHECK(fx.heap);
    cache_one_segment(fx);
    fake_fail_malloc(1, 0); /* cudaErrorInvalidValue, not sticky */
    vg_oom_info info;
    CHECK(vg_heap_alloc(fx.heap, 40 * MiB, 0, &info) == NULL);
    CHECK_EQ(info.status, VG_ERR_DEVICE);
    CHECK(strcmp(info.device_error.name, "cudaErrorInvalidValue") == 0);
    vg_stats st = stats_of(fx.heap);
    CHECK_EQ(st.num_ooms, 0);
    CHECK_EQ(st.num_device_errors, 1);
    CHECK_EQ(st.num_sync_all_streams, 0);
    CHECK_EQ(st.num_alloc_retries, 0);
    CHECK_EQ(cudaGetLastError(), 0);
    /* not sticky: the next allocation works */
    void *p = vg_heap_alloc(fx.heap, 40 * MiB, 0, &info);
    CHECK(p != NULL);
    vg_heap_free(fx.heap, p);
    CHECK_HEAP(fx.heap);
    destroy(fx);
}

/* ------------------------------------------------------------------ */
/* The current device                                                  */
/* ------------------------------------------------------------------ */

static void test_failed_set_device_is_a_device_error(void)
{
    fixture fx = setup(1, NULL);
    CHECK(fx.heap);
    CHECK_EQ(fake_current(), 0);
    fake_fail_set_device(1, 101);
    vg_oom_info info;
    CHECK(vg_heap_alloc(fx.heap, 4 * MiB, 0, &info) == NULL);
    CHECK_EQ(info.status, VG_ERR_DEVICE);
    CHECK(strcmp(info.device_error.call, "cudaSetDevice(1)") == 0);
    CHECK(strcmp(info.device_error.name, "cudaErrorInvalidDevice") == 0);
    CHECK_EQ(info.device, 1);
    /* device 1's heap got nothing, and above all nothing on device 0 */
    CHECK_EQ(fake_mallocs(0), 0);
    CHECK_EQ(fake_mallocs(1), 0);
    CHECK_EQ(stats_of(fx.heap).num_device_errors, 1);
    CHECK_EQ(stats_of(fx.heap).num_ooms, 0);
    CHECK_EQ(fake_current(), 0);
    fake_fail_set_device(1, 0);
    void *p = vg_heap_alloc(fx.heap, 4 * MiB, 0, &info);
    CHECK(p != NULL);
    CHECK_EQ(fake_mallocs(1), 1);
    CHECK_EQ(fake_current(), 0); /* the caller's device, back */
    vg_heap_free(fx.heap, p);
    destroy(fx);
}

/* ------------------------------------------------------------------ */
/* Streams of other devices                                            */
/* ------------------------------------------------------------------ */

static void test_events_are_recorded_under_the_streams_device(void)
{
    fixture fx = setup(0, NULL);
    CHECK(fx.heap);
    void *p = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    /* device 0's own default stream: nothing to wait for */
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 0, 0), VG_OK);
    CHECK_EQ(stats_of(fx.heap).num_record_stream, 0);
    /* device 1's default stream has the same handle, and is another stream */
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 1, 0), VG_OK);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 1, fake_stream(1, 5)), VG_OK);
    CHECK_EQ(stats_of(fx.heap).num_record_stream, 2);
    fake_events_wait(1);
    vg_heap_free(fx.heap, p);
    fake_record r = fake_last_record();
    CHECK_EQ(r.event_device, 1);
    CHECK_EQ(r.stream_device, 1);
    CHECK_EQ(r.current, 1);
    CHECK_EQ(fake_current(), 0);
    vg_stats st = stats_of(fx.heap);
    CHECK_EQ(st.num_deferred_frees, 1);
    CHECK_EQ(st.num_device_errors, 0);
    CHECK_EQ(st.num_sync_all_streams, 0);
    CHECK_EQ(fake_syncs(0) + fake_syncs(1), 0); /* both events recorded: no fallback */
    /* device 1's work is not done: the block waits */
    void *q = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(q != NULL && q != p);
    vg_heap_free(fx.heap, q);
    fake_complete(1);
    void *again = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(again == p);
    vg_heap_free(fx.heap, again);
    CHECK_HEAP(fx.heap);
    destroy(fx);
}

static void test_synchronize_covers_the_devices_recorded_on(void)
{
    fixture fx = setup(0, NULL);
    CHECK(fx.heap);
    void *p = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 1, fake_stream(1, 3)), VG_OK);
    fake_events_wait(1);
    vg_heap_free(fx.heap, p);
    vg_heap_synchronize(fx.heap);
    CHECK_EQ(fake_syncs(0), 1);
    CHECK_EQ(fake_syncs(1), 1);
    CHECK_EQ(fake_current(), 0);
    vg_fragmentation fr;
    vg_heap_fragmentation(fx.heap, &fr);
    CHECK_EQ(fr.pending_blocks, 0);
    /* done with device 1: the next synchronize is device 0's alone */
    vg_heap_synchronize(fx.heap);
    CHECK_EQ(fake_syncs(0), 2);
    CHECK_EQ(fake_syncs(1), 1);
    destroy(fx);
}

static void test_failed_event_record_falls_back_to_synchronize(void)
{
    fixture fx = setup(0, NULL);
    CHECK(fx.heap);
    void *p = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 1, 0), VG_OK);
    fake_fail_set_device(1, 101);
    vg_heap_free(fx.heap, p);
    vg_stats st = stats_of(fx.heap);
    /* the record and the synchronize of device 1 failed: both counted */
    CHECK_EQ(st.num_device_errors, 2);
    CHECK_EQ(fake_syncs(0), 1);
    CHECK_EQ(fake_current(), 0);
    fake_fail_set_device(1, 0);
    CHECK_HEAP(fx.heap);
    destroy(fx);
}

/* ------------------------------------------------------------------ */
/* CUDA graph capture                                                  */
/* ------------------------------------------------------------------ */

#define CAPTURE_MODE_GLOBAL 0
#define CAPTURE_MODE_RELAXED 2

/* During a capture on the device: no event query, no event record, no
 * synchronize, no cudaFree (deferred), and cudaMalloc in the relaxed mode;
 * after it, the deferred work is done on the next calls. */
static void test_capture_defers_what_would_break_it(void)
{
    fixture fx = setup(0, NULL);
    CHECK(fx.heap);
    void *p = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    void *big = vg_heap_alloc(fx.heap, 30 * MiB, 0, NULL);
    CHECK(p && big);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 0, fake_stream(0, 7)), VG_OK);
    unsigned records = fake_event_records(), queries = fake_event_queries();
    unsigned frees = fake_frees(), syncs = fake_syncs(0);

    vg_capture_enter(0);
    vg_heap_free(fx.heap, p);   /* used by stream 7: waits for an event */
    vg_heap_free(fx.heap, big);
    CHECK_EQ(vg_heap_empty_cache(fx.heap), 30 * MiB); /* off the books ... */
    CHECK_EQ(vg_cuda_deferred_frees(0), 1);           /* ... but not freed yet */
    CHECK_EQ(fake_used(0), 32 * MiB);
    void *q = vg_heap_alloc(fx.heap, 1000, 0, NULL);  /* p still waits */
    CHECK(q != NULL && q != p);
    void *grown = vg_heap_alloc(fx.heap, 10 * MiB, 0, NULL);
    CHECK(grown != NULL);
    CHECK_EQ(fake_malloc_capture_mode(), CAPTURE_MODE_RELAXED);
    CHECK_EQ(fake_capture_mode(), CAPTURE_MODE_GLOBAL); /* the thread's mode, back */
    CHECK_EQ(fake_event_records(), records);
    CHECK_EQ(fake_event_queries(), queries);
    CHECK_EQ(fake_frees(), frees);
    CHECK_EQ(fake_syncs(0), syncs); /* empty_cache's synchronize did nothing */
    vg_fragmentation fr;
    vg_heap_fragmentation(fx.heap, &fr);
    CHECK_EQ(fr.pending_blocks, 1);
    vg_capture_leave(0);

    /* The next allocation records the event, queries it, and finds p free;
     * the next reserve frees what was deferred first. */
    void *again = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(again == p);
    CHECK_EQ(fake_event_records(), records + 1);
    CHECK_EQ(fake_event_queries(), queries + 1);
    void *more = vg_heap_alloc(fx.heap, 10 * MiB, 0, NULL);
    CHECK(more != NULL);
    CHECK_EQ(fake_frees(), frees + 1);
    CHECK_EQ(vg_cuda_deferred_frees(0), 0);
    CHECK_EQ(fake_used(0), 2 * MiB + 10 * MiB + 10 * MiB); /* small, grown, more */
    CHECK_EQ(fake_malloc_capture_mode(), CAPTURE_MODE_GLOBAL);
    vg_heap_free(fx.heap, again);
    vg_heap_free(fx.heap, q);
    vg_heap_free(fx.heap, grown);
    vg_heap_free(fx.heap, more);
    CHECK_HEAP(fx.heap);
    destroy(fx);
}

/* The end of both capture tests: a synchronize that runs on device 1
 * finishes the deferred free of `p`, which the next 1000-byte request gets. */
static void expect_reuse_after_synchronize(fixture fx, void *p, void *q, unsigned syncs)
{
    vg_heap_synchronize(fx.heap);
    CHECK_EQ(fake_syncs(1), syncs + 1);
    void *again = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(again == p);
    vg_heap_free(fx.heap, again);
    vg_heap_free(fx.heap, q);
    CHECK_HEAP(fx.heap);
    destroy(fx);
}

/* An event asked for during a capture whose record then fails: the query
 * answers "not finished" (no device synchronize on the allocation path),
 * and a synchronize of that device finishes it. */
static void test_unrecorded_capture_event_waits_for_a_synchronize(void)
{
    fixture fx = setup(0, NULL);
    CHECK(fx.heap);
    void *p = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 1, fake_stream(1, 7)), VG_OK);
    vg_capture_enter(1);
    vg_heap_free(fx.heap, p); /* the record waits for the capture's end */
    vg_capture_leave(1);
    fake_fail_set_device(1, 101); /* ... and then cannot be made */
    unsigned syncs = fake_syncs(1);
    void *q = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(q && q != p);
    CHECK_EQ(fake_syncs(1), syncs);
    vg_fragmentation fr;
    vg_heap_fragmentation(fx.heap, &fr);
    CHECK_EQ(fr.pending_blocks, 1);
    fake_fail_set_device(1, 0);
    expect_reuse_after_synchronize(fx, p, q, syncs);
}

/* A use whose event could not be recorded waits for a synchronize of its
 * device that ran: one skipped for a capture (VG_ERR_BUSY, not a device
 * error) frees nothing. */
static void test_synchronize_skipped_by_a_capture_frees_nothing(void)
{
    fixture fx = setup(0, NULL);
    CHECK(fx.heap);
    void *p = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 1, fake_stream(1, 7)), VG_OK);
    fake_fail_set_device(1, 101);
    vg_heap_free(fx.heap, p); /* record and synchronize of device 1 fail */
    fake_fail_set_device(1, 0);
    uint64_t errors = stats_of(fx.heap).num_device_errors;
    vg_capture_enter(1);
    unsigned syncs = fake_syncs(1);
    vg_heap_synchronize(fx.heap); /* device 1 skipped */
    CHECK_EQ(fake_syncs(1), syncs);
    CHECK_EQ(stats_of(fx.heap).num_device_errors, errors);
    void *q = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(q && q != p);
    vg_capture_leave(1);
    expect_reuse_after_synchronize(fx, p, q, syncs);
}

/* A capture on device 1 changes nothing for device 0's calls. */
static void test_capture_is_per_device(void)
{
    fixture fx = setup(0, NULL);
    CHECK(fx.heap);
    void *big = vg_heap_alloc(fx.heap, 30 * MiB, 0, NULL);
    vg_heap_free(fx.heap, big);
    unsigned frees = fake_frees();
    vg_capture_enter(1);
    CHECK_EQ(vg_heap_empty_cache(fx.heap), 30 * MiB);
    CHECK_EQ(fake_frees(), frees + 1);
    CHECK_EQ(vg_cuda_deferred_frees(0), 0);
    vg_capture_leave(1);
    CHECK_EQ(vg_capture_active(1), 0);
    destroy(fx);
}

static void test_stream_device(void)
{
    fake_reset();
    CHECK_EQ(vg_cuda_stream_device(fake_stream(1, 3)), 1);
    CHECK_EQ(vg_cuda_stream_device(fake_stream(0, 3)), 0);
    CHECK_EQ(cudaSetDevice(1), 0);
    CHECK_EQ(vg_cuda_stream_device(0), 1); /* the default stream: the current device's */
    CHECK_EQ(cudaSetDevice(0), 0);
}

/* A budget fraction of a device whose total is unknown (cudaMemGetInfo
 * failed when its heap was created) is an error, not "no budget". */
static void test_budget_fraction_of_unknown_memory_is_refused(void)
{
    fake_reset();
    fake_fail_mem_info(1);
    CHECK_EQ(vg_devices_configure(0, 0.5, 0.0), VG_OK); /* no heap yet */
    CHECK(vg_devices_heap(1) == NULL);
    CHECK(strstr(vg_devices_error(), "memory unknown"));
    CHECK_EQ(vg_devices_configure(0, 0.0, 0.0), VG_OK);
    vg_heap *h = vg_devices_heap(1); /* its total unknown */
    CHECK(h);
    CHECK_EQ(vg_heap_device_total(h), 0);
    fake_fail_mem_info(0);
    CHECK_EQ(vg_devices_set_budget(1, 0, 0.5), VG_ERR_DEVICE);
    CHECK(strstr(vg_devices_error(), "device 1 memory unknown"));
    CHECK_EQ(vg_devices_configure(64 * MiB, 0.5, 0.25), VG_ERR_DEVICE);
    CHECK_EQ(vg_heap_budget(h), 0); /* nothing changed */
    CHECK(vg_heap_gc_threshold(h) == 0.0);
    CHECK_EQ(vg_devices_set_budget(1, 64 * MiB, 0.0), VG_OK);
    CHECK_EQ(vg_heap_budget(h), 64 * MiB);
    CHECK_EQ(vg_devices_configure(32 * MiB, 0.0, 0.0), VG_OK);
    CHECK_EQ(vg_heap_budget(h), 32 * MiB);
}

/* ------------------------------------------------------------------ */
/* Threads failing at once                                             */
/* ------------------------------------------------------------------ */

enum { FAILURES = 2000 };

typedef struct failing_thread {
    vg_device *dev;
    pthread_mutex_t *heap_lock; /* stands for the heap's lock */
    long wrong_words;           /* failures reported in another call's words */
} failing_thread;

static int words_are(const vg_device_error *e, int code, const char *call)
{
    return e->code == code && strcmp(e->call, call) == 0;
}

/* As the heap calls synchronize: without its lock. */
static void *failing_synchronizes(void *arg)
{
    failing_thread *t = arg;
    for (int i = 0; i < FAILURES; i++) {
        int rc = t->dev->ops->synchronize(t->dev);
        if (rc != VG_ERR_DEVICE || !words_are(vg_device_last_error(), 700, "cudaDeviceSynchronize"))
            t->wrong_words++;
    }
    return NULL;
}

/* As the heap makes every other call: under its lock. */
static void *failing_mem_infos(void *arg)
{
    failing_thread *t = arg;
    for (int i = 0; i < FAILURES; i++) {
        size_t free_bytes = 0, total = 0;
        pthread_mutex_lock(t->heap_lock);
        int rc = t->dev->ops->mem_info(t->dev, &free_bytes, &total);
        if (rc != VG_ERR_DEVICE || !words_are(vg_device_last_error(), 1, "cudaMemGetInfo")) t->wrong_words++;
        pthread_mutex_unlock(t->heap_lock);
    }
    return NULL;
}

/* A synchronize fails while another thread's call fails under the heap's
 * lock, on one provider: each thread gets the words of its own failure,
 * and the provider's record of them is no data race (ThreadSanitizer,
 * in `make check`, would stop here). */
static void test_concurrent_failures_keep_their_own_words(void)
{
    fixture fx = setup(0, NULL);
    CHECK(fx.dev);
    fake_fail_synchronize(700); /* cudaErrorIllegalAddress */
    fake_fail_mem_info(1);      /* cudaErrorInvalidValue */
    pthread_mutex_t heap_lock = PTHREAD_MUTEX_INITIALIZER;
    failing_thread sync = {fx.dev, &heap_lock, 0}, info = {fx.dev, &heap_lock, 0};
    pthread_t a, b;
    CHECK_EQ(pthread_create(&a, NULL, failing_synchronizes, &sync), 0);
    CHECK_EQ(pthread_create(&b, NULL, failing_mem_infos, &info), 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    CHECK_EQ(sync.wrong_words, 0);
    CHECK_EQ(info.wrong_words, 0);
    destroy(fx);
    fake_reset();
}

#define T(fn) {#fn, fn}
static const harness_test tests[] = {
    T(test_runtime_name_table),
    T(test_finds_the_loaded_runtime_whatever_its_name),
    T(test_missing_device_is_named),
    T(test_no_driver_means_no_virtual_memory),
    T(test_only_memory_allocation_is_an_oom),
    T(test_sticky_error_is_reported_as_itself),
    T(test_other_errors_are_device_errors_and_cleared),
    T(test_failed_set_device_is_a_device_error),
    T(test_events_are_recorded_under_the_streams_device),
    T(test_synchronize_covers_the_devices_recorded_on),
    T(test_capture_defers_what_would_break_it),
    T(test_capture_is_per_device),
    T(test_stream_device),
    T(test_failed_event_record_falls_back_to_synchronize),
    T(test_budget_fraction_of_unknown_memory_is_refused),
    T(test_unrecorded_capture_event_waits_for_a_synchronize),
    T(test_synchronize_skipped_by_a_capture_frees_nothing),
    T(test_concurrent_failures_keep_their_own_words),
};

int main(int argc, char **argv)
{
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
