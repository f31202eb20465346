// The torch entry points on simulated devices: what PyTorch's pluggable
// allocator sees. An OOM must arrive as a std::exception whose message
// starts the way PyTorch's own does, and a device error as one that starts
// as PyTorch's CUDA errors do and never reads as an OOM; a free must never
// throw; size 0 and bad pointers must be harmless.
#include <cstring>
#include <stdexcept>
#include <string>
#include <sys/types.h>

#include "vramguard/devices.h"
#include "harness.h"

extern "C" void *vramguard_torch_malloc(ssize_t size, int device, void *stream);
extern "C" void vramguard_torch_free(void *ptr, ssize_t size, int device, void *stream) noexcept;

static const size_t MiB = (size_t)1 << 20;

static void test_alloc_free_per_device(void)
{
    void *a = vramguard_torch_malloc(1000, 0, nullptr);
    void *b = vramguard_torch_malloc(3 * MiB, 1, reinterpret_cast<void *>(0x42));
    CHECK(a != nullptr && b != nullptr);
    vg_stats st;
    vg_heap_stats(vg_devices_existing(0), &st);
    CHECK_EQ(st.requested_bytes[VG_STAT_ALL].current, 1000);
    vg_heap_stats(vg_devices_existing(1), &st);
    CHECK_EQ(st.requested_bytes[VG_STAT_ALL].current, 3 * MiB);
    vramguard_torch_free(a, 1000, 0, nullptr);
    /* PyTorch names the right device; a wrong one is still found. */
    vramguard_torch_free(b, 3 * MiB, 0, nullptr);
    vg_heap_stats(vg_devices_existing(1), &st);
    CHECK_EQ(st.requested_bytes[VG_STAT_ALL].current, 0);
    vg_heap_stats(vg_devices_existing(0), &st);
    CHECK_EQ(st.num_invalid_frees, 0); /* found elsewhere: not an invalid free */
    CHECK_HEAP(vg_devices_existing(0));
    CHECK_HEAP(vg_devices_existing(1));
}

static void test_size_zero_is_null(void)
{
    CHECK(vramguard_torch_malloc(0, 0, nullptr) == nullptr);
    vramguard_torch_free(nullptr, 0, 0, nullptr);
}

static void test_oom_throws_a_pytorch_style_message(void)
{
    CHECK_EQ(vg_devices_set_budget(2, 64 * MiB, 0.0), VG_OK);
    void *a = vramguard_torch_malloc(60 * MiB, 2, nullptr);
    CHECK(a != nullptr);
    std::string msg;
    try {
        vramguard_torch_malloc(20 * MiB, 2, nullptr);
    } catch (const std::runtime_error &e) {
        msg = e.what();
    }
    CHECK(msg.rfind("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 2 has a total capacity of", 0) == 0);
    CHECK(msg.find("vramguard's budget is 64.00 MiB") != std::string::npos);
    CHECK(msg.find("\nvramguard: the budget (64.00 MiB) is the limit") != std::string::npos);
    /* The heap goes on working: free, and the same request fits. */
    vramguard_torch_free(a, 60 * MiB, 2, nullptr);
    void *b = vramguard_torch_malloc(20 * MiB, 2, nullptr);
    CHECK(b != nullptr);
    vramguard_torch_free(b, 20 * MiB, 2, nullptr);
    CHECK_HEAP(vg_devices_existing(2));
}

static void test_device_error_throws_a_pytorch_style_cuda_error(void)
{
    vg_heap *h = vg_devices_heap(3);
    CHECK(h != nullptr);
    void *cached = vramguard_torch_malloc(30 * MiB, 3, nullptr);
    vramguard_torch_free(cached, 30 * MiB, 3, nullptr);
    vg_sim_fail_device(vg_heap_device(h), 1, 1); /* sticky, as after an illegal address */
    std::string msg;
    try {
        vramguard_torch_malloc(40 * MiB, 3, nullptr);
    } catch (const std::runtime_error &e) {
        msg = e.what();
    }
    CHECK(msg.rfind("CUDA error: an illegal memory access was encountered\n", 0) == 0);
    CHECK(msg.find("cudaMalloc failed with cudaErrorIllegalAddress (700) while allocating "
                   "40.00 MiB on GPU 3") != std::string::npos);
    CHECK(msg.find("out of memory") == std::string::npos);
    vg_stats st;
    vg_heap_stats(h, &st);
    CHECK_EQ(st.num_ooms, 0);
    CHECK_EQ(st.num_device_errors, 1);
    CHECK_EQ(st.num_alloc_retries, 0);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 30 * MiB); /* the cache kept */
    /* what the cache holds still serves */
    void *again = vramguard_torch_malloc(30 * MiB, 3, nullptr);
    CHECK(again == cached);
    vramguard_torch_free(again, 30 * MiB, 3, nullptr);
    vg_sim_fail_device(vg_heap_device(h), 0, 0);
    CHECK_HEAP(h);
}

static void test_record_stream_of_another_device(void)
{
    /* A block of device 4, used by device 5's default stream (handle 0, as
     * device 4's own): freeing it must wait for device 5's stream. */
    void *p = vramguard_torch_malloc(1000, 4, nullptr);
    CHECK(p != nullptr);
    CHECK_EQ(vg_devices_record_stream(p, 5, 0), VG_OK);
    CHECK_EQ(vg_devices_record_stream(p, -1, 0), VG_OK); /* its own device's: nothing */
    vg_heap *h = vg_devices_existing(4);
    vg_stats st;
    vg_heap_stats(h, &st);
    CHECK_EQ(st.num_record_stream, 1);
    vramguard_torch_free(p, 1000, 4, nullptr);
    void *q = vramguard_torch_malloc(1000, 4, nullptr);
    CHECK(q != p);
    vramguard_torch_free(q, 1000, 4, nullptr);
    vg_sim_complete_stream_of(vg_heap_device(h), 5, 0);
    q = vramguard_torch_malloc(1000, 4, nullptr);
    CHECK(q == p);
    vramguard_torch_free(q, 1000, 4, nullptr);
    CHECK_EQ(vg_devices_record_stream(reinterpret_cast<void *>(0xbad000), 5, 0), VG_ERR_INVALID);
    CHECK_EQ(vg_devices_record_stream(q, VG_MAX_DEVICES, 0), VG_ERR_ARG);
    CHECK_HEAP(h);
}

static void test_bad_input(void)
{
    bool threw = false;
    try {
        vramguard_torch_malloc(-1, 0, nullptr);
    } catch (const std::invalid_argument &) {
        threw = true;
    }
    CHECK(threw);
    threw = false;
    try {
        vramguard_torch_malloc(16, VG_MAX_DEVICES, nullptr);
    } catch (const std::runtime_error &e) {
        threw = std::strstr(e.what(), "out of range") != nullptr;
    }
    CHECK(threw);
    /* An unknown pointer: counted, reported once, never thrown. */
    vramguard_torch_free(reinterpret_cast<void *>(0xdead000), 512, 0, nullptr);
    vg_stats st;
    vg_heap_stats(vg_devices_existing(0), &st);
    CHECK(st.num_invalid_frees >= 1);
    CHECK_EQ(vg_devices_simulate(MiB), VG_ERR_ARG); /* heaps exist: too late */
}

static void test_configure_applies_to_existing_heaps(void)
{
    CHECK_EQ(vg_devices_configure(0, 0.5, 0.25), VG_OK);
    CHECK_EQ(vg_heap_budget(vg_devices_existing(0)), 512 * MiB); /* half of 1 GiB */
    CHECK(vg_heap_gc_threshold(vg_devices_existing(0)) == 0.25);
    CHECK_EQ(vg_devices_configure(0, 1.5, 0.0), VG_ERR_ARG);
    CHECK_EQ(vg_devices_configure(0, 0.0, 0.0), VG_OK);
    CHECK_EQ(vg_heap_budget(vg_devices_existing(0)), 0);
}

#define T(fn) {#fn, fn}
static const harness_test tests[] = {
    T(test_alloc_free_per_device),
    T(test_size_zero_is_null),
    T(test_oom_throws_a_pytorch_style_message),
    T(test_device_error_throws_a_pytorch_style_cuda_error),
    T(test_record_stream_of_another_device),
    T(test_bad_input),
    T(test_configure_applies_to_existing_heaps),
};

int main(int argc, char **argv)
{
    if (vg_devices_simulate(1024 * MiB) != VG_OK) return 2;
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : nullptr);
}
