/* Device errors and streams of several devices, on simulated devices: a
 * device error stops the allocation at once and is reported as itself,
 * never as an out-of-memory; a stream is (device, handle), so another
 * device's default stream is not the block's own. */
#include "vramguard/heap.h"
#include "harness.h"

#include <string.h>

static const size_t MiB = (size_t)1 << 20;

typedef struct fixture {
    vg_device *dev;
    vg_heap *heap;
} fixture;

static fixture setup(size_t capacity, const vg_policy *policy)
{
    fixture fx;
    fx.dev = vg_sim_create(capacity);
    vg_heap_config cfg = {policy, 0, 0.0};
    fx.heap = vg_heap_create(fx.dev, &cfg);
    return fx;
}

static void destroy(fixture fx)
{
    vg_heap_destroy(fx.heap);
    fx.dev->ops->destroy(fx.dev);
}

static vg_stats stats_of(vg_heap *h)
{
    vg_stats st;
    vg_heap_stats(h, &st);
    return st;
}

/* One idle cached segment of stream 0 and two of stream 1: what an
 * out-of-memory ladder would release. */
static void fill_cache(fixture fx)
{
    void *a = vg_heap_alloc(fx.heap, 30 * MiB, 0, NULL);
    void *b = vg_heap_alloc(fx.heap, 30 * MiB, 1, NULL);
    void *c = vg_heap_alloc(fx.heap, 1000, 1, NULL);
    vg_heap_free(fx.heap, a);
    vg_heap_free(fx.heap, b);
    vg_heap_free(fx.heap, c);
}

/* ------------------------------------------------------------------ */
/* Device errors                                                       */
/* ------------------------------------------------------------------ */

static void test_device_error_stops_the_ladder(const vg_policy *policy)
{
    fixture fx = setup(100 * MiB, policy);
    fill_cache(fx);
    vg_stats before = stats_of(fx.heap);
    vg_sim_fail_device(fx.dev, 1, 0);
    vg_oom_info info;
    CHECK(vg_heap_alloc(fx.heap, 50 * MiB, 0, &info) == NULL);
    CHECK_EQ(info.status, VG_ERR_DEVICE);
    CHECK_EQ(info.requested, 50 * MiB);
    CHECK_EQ(info.device_error.code, 700);
    CHECK(strcmp(info.device_error.name, "cudaErrorIllegalAddress") == 0);
    vg_stats st = stats_of(fx.heap);
    CHECK_EQ(st.num_device_errors, 1);
    CHECK_EQ(st.num_ooms, 0);
    CHECK_EQ(st.num_device_alloc_failed, 0);
    CHECK_EQ(st.num_alloc_retries, 0);
    CHECK_EQ(st.num_sync_all_streams, 0);
    CHECK_EQ(st.num_device_free, before.num_device_free);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 62 * MiB);
    CHECK_EQ(vg_sim_used(fx.dev), 62 * MiB);
    /* one-shot: the same request is served now, the cache released for it */
    void *p = vg_heap_alloc(fx.heap, 50 * MiB, 0, &info);
    CHECK(p != NULL);
    CHECK_EQ(stats_of(fx.heap).num_device_errors, 1);
    vg_heap_free(fx.heap, p);
    CHECK_HEAP(fx.heap);
    destroy(fx);
}

static void test_device_error_stops_vramguards_ladder(void)
{
    test_device_error_stops_the_ladder(NULL);
}

static void test_device_error_stops_torchs_ladder(void)
{
    test_device_error_stops_the_ladder(&vg_policy_torch);
}

static void test_device_error_when_the_ladder_retries(void)
{
    /* The device refuses for memory first, then fails otherwise on the
     * retry: the ladder stops there, and the report is the device error. */
    fixture fx = setup(64 * MiB, &vg_policy_default);
    fill_cache(fx);
    vg_sim_fail_nth(fx.dev, 1);
    vg_sim_fail_device(fx.dev, 2, 0);
    vg_oom_info info;
    CHECK(vg_heap_alloc(fx.heap, 40 * MiB, 0, &info) == NULL);
    CHECK_EQ(info.status, VG_ERR_DEVICE);
    vg_stats st = stats_of(fx.heap);
    CHECK_EQ(st.num_device_alloc_failed, 1);
    CHECK_EQ(st.num_stream_releases, 1);
    CHECK_EQ(st.num_alloc_retries, 1);
    CHECK_EQ(st.num_sync_all_streams, 0);
    CHECK_EQ(st.num_device_errors, 1);
    CHECK_EQ(st.num_ooms, 0);
    CHECK_HEAP(fx.heap);
    destroy(fx);
}

static void test_sticky_device_error_in_synchronize(void)
{
    fixture fx = setup(64 * MiB, &vg_policy_default);
    void *p = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    vg_sim_fail_device(fx.dev, 1, 1);
    vg_oom_info info;
    CHECK(vg_heap_alloc(fx.heap, 8 * MiB, 0, &info) == NULL);
    CHECK(vg_heap_alloc(fx.heap, 8 * MiB, 0, &info) == NULL);
    CHECK_EQ(info.status, VG_ERR_DEVICE);
    vg_heap_synchronize(fx.heap);
    vg_stats st = stats_of(fx.heap);
    CHECK_EQ(st.num_device_errors, 3);
    CHECK_EQ(st.num_ooms, 0);
    CHECK(strcmp(info.device_error.call, "cudaMalloc") == 0);
    /* the cache serves what it holds */
    void *q = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(q != NULL);
    vg_sim_fail_device(fx.dev, 0, 0);
    void *r = vg_heap_alloc(fx.heap, 8 * MiB, 0, &info);
    CHECK(r != NULL);
    vg_heap_free(fx.heap, p);
    vg_heap_free(fx.heap, q);
    vg_heap_free(fx.heap, r);
    CHECK_HEAP(fx.heap);
    destroy(fx);
}

static void test_device_error_message(void)
{
    fixture fx = setup(64 * MiB, &vg_policy_default);
    vg_sim_fail_device(fx.dev, 1, 0);
    vg_oom_info info;
    CHECK(vg_heap_alloc(fx.heap, 3 * MiB, 0, &info) == NULL);
    char msg[1536];
    size_t n = vg_format_device_error(&info, "CUDA", msg, sizeof msg);
    CHECK_EQ(n, strlen(msg));
    const char *head = "CUDA error: an illegal memory access was encountered\nvramguard: "
                       "cudaMalloc failed with cudaErrorIllegalAddress (700) while allocating "
                       "3.00 MiB on GPU 0. This is a device error, not a lack of memory";
    CHECK(strncmp(msg, head, strlen(head)) == 0);
    CHECK(strstr(msg, "CUDA_LAUNCH_BLOCKING=1") != NULL);
    CHECK(strstr(msg, "out of memory") == NULL);
    /* a short buffer is cut, never overrun */
    char small[16];
    vg_format_device_error(&info, "CUDA", small, sizeof small);
    CHECK(strcmp(small, "CUDA error: an ") == 0);
    destroy(fx);
}

/* ------------------------------------------------------------------ */
/* Streams of two devices                                              */
/* ------------------------------------------------------------------ */

static void test_other_devices_default_stream_is_not_the_blocks_own(void)
{
    fixture fx = setup(64 * MiB, &vg_policy_default); /* device 0 */
    void *p = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 0, 0), VG_OK); /* its own: nothing */
    CHECK_EQ(stats_of(fx.heap).num_record_stream, 0);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 1, 0), VG_OK);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 1, 0), VG_OK); /* once is enough */
    CHECK_EQ(stats_of(fx.heap).num_record_stream, 1);
    vg_heap_free(fx.heap, p);
    CHECK_EQ(stats_of(fx.heap).num_deferred_frees, 1);
    void *q = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(q != p); /* device 1's default stream may still read it */
    vg_heap_free(fx.heap, q);
    vg_sim_complete_stream(fx.dev, 0); /* device 0's default stream: not the one */
    q = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(q != p);
    vg_heap_free(fx.heap, q);
    vg_sim_complete_stream_of(fx.dev, 1, 0);
    q = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(q == p);
    vg_heap_free(fx.heap, q);
    CHECK_HEAP(fx.heap);
    destroy(fx);
}

static void test_same_handle_on_two_devices_is_two_streams(void)
{
    fixture fx = setup(64 * MiB, &vg_policy_default);
    void *p = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 0, 5), VG_OK);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 1, 5), VG_OK);
    CHECK_EQ(stats_of(fx.heap).num_record_stream, 2);
    vg_heap_free(fx.heap, p);
    vg_sim_complete_stream(fx.dev, 5); /* device 0's stream 5 only */
    void *q = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(q != p);
    vg_heap_free(fx.heap, q);
    vg_sim_complete_stream_of(fx.dev, 1, 5);
    q = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(q == p);
    vg_heap_free(fx.heap, q);
    /* the heap's own stream on another device is another stream too */
    void *r = vg_heap_alloc(fx.heap, 1000, 7, NULL);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, r, 2, 7), VG_OK);
    CHECK_EQ(vg_heap_record_stream(fx.heap, r, 7), VG_OK); /* its own */
    CHECK_EQ(stats_of(fx.heap).num_record_stream, 3);
    vg_heap_free(fx.heap, r);
    vg_heap_synchronize(fx.heap); /* waits for every stream recorded on */
    vg_fragmentation fr;
    vg_heap_fragmentation(fx.heap, &fr);
    CHECK_EQ(fr.pending_blocks, 0);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, q, -1, 0), VG_ERR_ARG);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, q, VG_MAX_DEVICES, 0), VG_ERR_ARG);
    CHECK_HEAP(fx.heap);
    destroy(fx);
}

static void test_second_device_heap_keeps_its_streams(void)
{
    /* A heap on device 1: its blocks' own stream is device 1's; device
     * 0's default stream, handle 0 too, must be waited for. */
    fixture fx = setup(64 * MiB, &vg_policy_default);
    fx.dev->index = 1;
    void *p = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK_EQ(vg_heap_record_stream(fx.heap, p, 0), VG_OK); /* device 1's own default */
    CHECK_EQ(stats_of(fx.heap).num_record_stream, 0);
    CHECK_EQ(vg_heap_record_device_stream(fx.heap, p, 0, 0), VG_OK);
    CHECK_EQ(stats_of(fx.heap).num_record_stream, 1);
    vg_heap_free(fx.heap, p);
    vg_sim_complete_stream(fx.dev, 0); /* device 1's: not enough */
    void *q = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(q != p);
    vg_heap_free(fx.heap, q);
    vg_sim_complete_stream_of(fx.dev, 0, 0);
    q = vg_heap_alloc(fx.heap, 1000, 0, NULL);
    CHECK(q == p);
    vg_heap_free(fx.heap, q);
    destroy(fx);
}

#define T(fn) {#fn, fn}
static const harness_test tests[] = {
    T(test_device_error_stops_vramguards_ladder),
    T(test_device_error_stops_torchs_ladder),
    T(test_device_error_when_the_ladder_retries),
    T(test_sticky_device_error_in_synchronize),
    T(test_device_error_message),
    T(test_other_devices_default_stream_is_not_the_blocks_own),
    T(test_same_handle_on_two_devices_is_two_streams),
    T(test_second_device_heap_keeps_its_streams),
};

int main(int argc, char **argv)
{
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
