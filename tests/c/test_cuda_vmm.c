/* The CUDA provider's virtual memory calls (device/cuda_vmm.c) over the
 * fake CUDA of the real-torch tier (csrc/phantom: libcudart.so.N and
 * libcuda.so.1, linked in), so that the provider finds the driver as it
 * would under PyTorch: through the runtime's cudaGetDriverEntryPoint.
 * Built and run by `make test-fakecuda` (it needs the fake, which needs the
 * CUDA headers of PyTorch's runtime wheel).
 *
 * Three devices of 64 MiB each; exact bytes in use on the fake after each
 * step. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "vramguard/device.h"
#include "vramguard/devices.h"
#include "harness.h"
#include "fakecuda.h"

#include <stdlib.h>
#include <string.h>

/* The few runtime calls used to look at the memory, declared as the
 * runtime has them (no CUDA header here). */
int cudaSetDevice(int device);
int cudaGetDevice(int *device);
int cudaMemcpy(void *dst, const void *src, size_t n, int kind);
#define COPY_DEVICE_TO_HOST 2 /* cudaMemcpyDeviceToHost */
#define COPY_DEFAULT 4        /* cudaMemcpyDefault */

static const size_t MiB = (size_t)1 << 20;
static const size_t CAPACITY = (size_t)64 << 20;

static vg_device *create(int device)
{
    char why[256] = "";
    vg_device *dev = vg_cuda_create(device, why, sizeof why);
    if (!dev) fprintf(stderr, "  no CUDA provider: %s\n", why);
    return dev;
}

static void fresh(void)
{
    vg_fakecuda_reset();
    vg_fakecuda_set_vmm(1);
    vg_fakecuda_set_capacity(0, (long long)CAPACITY);
    vg_fakecuda_set_capacity(1, (long long)CAPACITY);
    vg_fakecuda_set_capacity(2, (long long)CAPACITY);
}

static long calls(const char *api)
{
    return vg_fakecuda_calls(api);
}

/* ------------------------------------------------------------------ */

static void test_supported_device_has_2mib_pages(void)
{
    fresh();
    vg_device *dev = create(0);
    CHECK(dev);
    CHECK_EQ(dev->page_size, 2 * MiB);
    CHECK(dev->ops->range_reserve && dev->ops->range_release && dev->ops->map && dev->ops->unmap);
    CHECK(vg_cuda_vmm_unsupported(dev) == NULL);
    /* found through the runtime, once: the 12 driver calls it uses */
    CHECK_EQ(calls("cudaGetDriverEntryPointByVersion"), 12);
    dev->ops->destroy(dev);
}

static void test_unsupported_device_has_no_pages(void)
{
    fresh();
    vg_fakecuda_set_vmm(0);
    vg_device *dev = create(1);
    CHECK(dev);
    CHECK_EQ(dev->page_size, 0);
    CHECK(!dev->ops->range_reserve && !dev->ops->range_release && !dev->ops->map && !dev->ops->unmap);
    const char *why = vg_cuda_vmm_unsupported(dev);
    CHECK(why && strcmp(why, "device 1 does not support virtual memory management") == 0);
    CHECK(dev->ops->reserve); /* segments still work */
    dev->ops->destroy(dev);
    vg_fakecuda_set_vmm(1);
}

static void test_map_counts_against_capacity(void)
{
    fresh();
    vg_device *dev = create(0);
    CHECK(dev);
    uintptr_t base = 0;
    CHECK_EQ(dev->ops->range_reserve(dev, 256 * MiB, &base), VG_OK); /* 4x the device */
    CHECK_EQ(base % (2 * MiB), 0);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0); /* address space costs nothing */

    CHECK_EQ(dev->ops->map(dev, base + 2 * MiB, 6 * MiB), VG_OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 6 * MiB);
    CHECK_EQ(vg_fakecuda_live_allocations(0), 3); /* one physical allocation per page */
    CHECK_EQ(calls("cuMemCreate"), 3);
    CHECK_EQ(calls("cuMemMap"), 3);
    CHECK_EQ(calls("cuMemSetAccess"), 1); /* one call for the run */
    size_t free_bytes = 0, total = 0;
    CHECK_EQ(dev->ops->mem_info(dev, &free_bytes, &total), VG_OK);
    CHECK_EQ(free_bytes, CAPACITY - 6 * MiB);
    CHECK_EQ(total, CAPACITY);

    /* One page of the three back: the others stay. */
    CHECK_EQ(dev->ops->unmap(dev, base + 4 * MiB, 2 * MiB), VG_OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 4 * MiB);
    CHECK_EQ(vg_fakecuda_live_allocations(0), 2);
    /* and mapped again on its own */
    CHECK_EQ(dev->ops->map(dev, base + 4 * MiB, 2 * MiB), VG_OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 6 * MiB);

    /* Up to the capacity exactly: 32 pages in all. */
    CHECK_EQ(dev->ops->map(dev, base + 8 * MiB, CAPACITY - 6 * MiB), VG_OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), CAPACITY);
    CHECK_EQ(dev->ops->map(dev, base + 128 * MiB, 2 * MiB), VG_ERR_NOMEM);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), CAPACITY);

    CHECK_EQ(dev->ops->unmap(dev, base + 2 * MiB, 6 * MiB), VG_OK);
    CHECK_EQ(dev->ops->unmap(dev, base + 8 * MiB, CAPACITY - 6 * MiB), VG_OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0);
    CHECK_EQ(vg_fakecuda_live_allocations(0), 0);
    CHECK_EQ(dev->ops->range_release(dev, base, 256 * MiB), VG_OK);
    CHECK_EQ(calls("cuMemAddressFree"), 1);
    dev->ops->destroy(dev);
}

static void test_mapped_memory_holds_bytes(void)
{
    fresh();
    vg_device *dev = create(0);
    CHECK(dev);
    uintptr_t base = 0;
    CHECK_EQ(dev->ops->range_reserve(dev, 16 * MiB, &base), VG_OK);
    CHECK_EQ(dev->ops->map(dev, base, 4 * MiB), VG_OK);
    /* A copy across the page boundary, out and back. */
    static unsigned char out[1 << 20], back[1 << 20];
    for (size_t i = 0; i < sizeof out; i++) out[i] = (unsigned char)(i * 7 + 3);
    void *at = (void *)(base + 2 * MiB - 4096);
    CHECK_EQ(cudaMemcpy(at, out, sizeof out, COPY_DEFAULT), 0);
    CHECK_EQ(cudaMemcpy(back, at, sizeof back, COPY_DEFAULT), 0);
    CHECK(memcmp(out, back, sizeof out) == 0);
    CHECK_EQ(dev->ops->unmap(dev, base, 4 * MiB), VG_OK);
    /* unmapped: no longer device memory */
    CHECK(cudaMemcpy(back, at, 16, COPY_DEVICE_TO_HOST) != 0);
    CHECK_EQ(dev->ops->range_release(dev, base, 16 * MiB), VG_OK);
    dev->ops->destroy(dev);
}

static void test_out_of_memory_maps_nothing(void)
{
    fresh();
    vg_device *dev = create(0);
    CHECK(dev);
    uintptr_t base = 0;
    CHECK_EQ(dev->ops->range_reserve(dev, 256 * MiB, &base), VG_OK);
    /* More pages than the device has: the first 32 are made, the 33rd is
     * refused, and all are given back. */
    CHECK_EQ(dev->ops->map(dev, base, CAPACITY + 2 * MiB), VG_ERR_NOMEM);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0);
    CHECK_EQ(vg_fakecuda_live_allocations(0), 0);
    CHECK_EQ(calls("cuMemCreate"), 33);
    /* The driver refusing the third page (a fault) is the same. */
    CHECK_EQ(vg_fakecuda_fail_call("cuMemCreate", 3, 2 /* CUDA_ERROR_OUT_OF_MEMORY */), 0);
    CHECK_EQ(dev->ops->map(dev, base, 8 * MiB), VG_ERR_NOMEM);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0);
    /* and the next map works */
    CHECK_EQ(dev->ops->map(dev, base, 8 * MiB), VG_OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 8 * MiB);
    CHECK_EQ(dev->ops->unmap(dev, base, 8 * MiB), VG_OK);
    /* Address space refused: out of memory too. */
    CHECK_EQ(vg_fakecuda_fail_call("cuMemAddressReserve", 1, 2), 0);
    uintptr_t other = 0;
    CHECK_EQ(dev->ops->range_reserve(dev, 64 * MiB, &other), VG_ERR_NOMEM);
    CHECK_EQ(dev->ops->range_release(dev, base, 256 * MiB), VG_OK);
    dev->ops->destroy(dev);
}

static void test_other_errors_are_named(void)
{
    static const struct {
        const char *api;
        long nth;
        int code;
        const char *name;
    } faults[] = {
        {"cuMemCreate", 2, 801, "CUDA_ERROR_NOT_SUPPORTED"},
        {"cuMemMap", 3, 700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
        {"cuMemSetAccess", 1, 1, "CUDA_ERROR_INVALID_VALUE"},
    };
    fresh();
    vg_device *dev = create(0);
    CHECK(dev);
    uintptr_t base = 0;
    CHECK_EQ(dev->ops->range_reserve(dev, 64 * MiB, &base), VG_OK);
    vg_device_error *e = vg_device_last_error(); /* this thread's */
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        memset(e, 0, sizeof *e);
        CHECK_EQ(vg_fakecuda_fail_call(faults[i].api, faults[i].nth, faults[i].code), 0);
        CHECK_EQ(dev->ops->map(dev, base, 6 * MiB), VG_ERR_DEVICE);
        if (strcmp(e->call, faults[i].api) != 0) fprintf(stderr, "  call %s\n", e->call);
        CHECK(strcmp(e->call, faults[i].api) == 0);
        CHECK(strcmp(e->name, faults[i].name) == 0);
        CHECK_EQ(e->code, faults[i].code);
        CHECK(e->text[0] && strcmp(e->text, "unknown error") != 0);
        CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0); /* nothing stays mapped */
        CHECK_EQ(vg_fakecuda_live_allocations(0), 0);
        vg_fakecuda_reset();
    }
    /* An unmap the driver refuses: named too, one call for the four pages,
     * and nothing unmapped (nor mapped again). */
    CHECK_EQ(dev->ops->map(dev, base, 8 * MiB), VG_OK);
    vg_fakecuda_reset();
    CHECK_EQ(vg_fakecuda_fail_call("cuMemUnmap", 1, 700), 0);
    CHECK_EQ(dev->ops->unmap(dev, base, 8 * MiB), VG_ERR_DEVICE);
    CHECK(strcmp(e->call, "cuMemUnmap") == 0);
    CHECK(strcmp(e->name, "CUDA_ERROR_ILLEGAL_ADDRESS") == 0);
    CHECK_EQ(calls("cuMemUnmap"), 1);
    CHECK_EQ(calls("cuMemCreate") + calls("cuMemMap") + calls("cuMemSetAccess"), 0);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 8 * MiB);
    static unsigned char byte = 0x5a, back = 0;
    CHECK_EQ(cudaMemcpy((void *)base, &byte, 1, COPY_DEFAULT), 0); /* mapped and accessible */
    CHECK_EQ(cudaMemcpy(&back, (void *)base, 1, COPY_DEFAULT), 0);
    CHECK_EQ(back, 0x5a);
    CHECK_EQ(dev->ops->unmap(dev, base, 8 * MiB), VG_OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0);
    CHECK_EQ(dev->ops->range_release(dev, base, 64 * MiB), VG_OK);
    dev->ops->destroy(dev);
}

/* The driver's virtual memory calls, all of them. */
static const char *const VMM_CALLS[] = {
    "cuMemCreate", "cuMemMap", "cuMemRelease", "cuMemSetAccess", "cuMemUnmap",
};

static long vmm_calls(void)
{
    long n = 0;
    for (size_t i = 0; i < sizeof VMM_CALLS / sizeof VMM_CALLS[0]; i++) n += calls(VMM_CALLS[i]);
    return n;
}

/* What a run of pages costs in driver calls (each tens of microseconds on
 * a GPU, made with the heap's lock held). Mapping: one physical allocation
 * per page, so that any page can be unmapped alone, and the driver maps
 * one allocation per cuMemMap: cuMemCreate + cuMemMap + cuMemRelease per
 * page, and one cuMemSetAccess for the run. Unmapping: one cuMemUnmap for
 * the run, however many mappings it spans. */
static void test_driver_calls_per_run(void)
{
    fresh();
    vg_device *dev = create(0);
    CHECK(dev);
    uintptr_t base = 0;
    CHECK_EQ(dev->ops->range_reserve(dev, 64 * MiB, &base), VG_OK);
    for (size_t pages = 1; pages <= 16; pages *= 2) {
        vg_fakecuda_reset();
        CHECK_EQ(dev->ops->map(dev, base, pages * 2 * MiB), VG_OK);
        CHECK_EQ(calls("cuMemCreate"), (long)pages);
        CHECK_EQ(calls("cuMemMap"), (long)pages);
        CHECK_EQ(calls("cuMemRelease"), (long)pages);
        CHECK_EQ(calls("cuMemSetAccess"), 1);
        CHECK_EQ(vmm_calls(), 3 * (long)pages + 1);
        vg_fakecuda_reset();
        CHECK_EQ(dev->ops->unmap(dev, base, pages * 2 * MiB), VG_OK);
        CHECK_EQ(calls("cuMemUnmap"), 1);
        CHECK_EQ(vmm_calls(), 1);
        CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0);
        CHECK_EQ(vg_fakecuda_live_allocations(0), 0);
    }
    /* A run mapped in pieces (page 2, then 0-1, then 3) goes back in one call. */
    CHECK_EQ(dev->ops->map(dev, base + 4 * MiB, 2 * MiB), VG_OK);
    CHECK_EQ(dev->ops->map(dev, base, 4 * MiB), VG_OK);
    CHECK_EQ(dev->ops->map(dev, base + 6 * MiB, 2 * MiB), VG_OK);
    vg_fakecuda_reset();
    CHECK_EQ(dev->ops->unmap(dev, base, 8 * MiB), VG_OK);
    CHECK_EQ(calls("cuMemUnmap"), 1);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0);
    /* A map refused at its fifth page: four pages made, then given back in
     * one call. */
    vg_fakecuda_reset();
    CHECK_EQ(vg_fakecuda_fail_call("cuMemCreate", 5, 2 /* CUDA_ERROR_OUT_OF_MEMORY */), 0);
    CHECK_EQ(dev->ops->map(dev, base, 16 * MiB), VG_ERR_NOMEM);
    CHECK_EQ(calls("cuMemCreate"), 5);
    CHECK_EQ(calls("cuMemMap"), 4);
    CHECK_EQ(calls("cuMemRelease"), 4);
    CHECK_EQ(calls("cuMemSetAccess"), 0);
    CHECK_EQ(calls("cuMemUnmap"), 1);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0);
    CHECK_EQ(vg_fakecuda_live_allocations(0), 0);
    CHECK_EQ(dev->ops->range_release(dev, base, 64 * MiB), VG_OK);
    dev->ops->destroy(dev);
}

static void test_calls_run_on_the_provider_device(void)
{
    fresh();
    vg_device *dev = create(1);
    CHECK(dev);
    CHECK_EQ(cudaSetDevice(0), 0);
    uintptr_t base = 0;
    CHECK_EQ(dev->ops->range_reserve(dev, 64 * MiB, &base), VG_OK);
    CHECK_EQ(dev->ops->map(dev, base, 4 * MiB), VG_OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(1), 4 * MiB);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0);
    int current = -1;
    CHECK_EQ(cudaGetDevice(&current), 0);
    CHECK_EQ(current, 0); /* the caller's device is put back */
    CHECK_EQ(dev->ops->unmap(dev, base, 4 * MiB), VG_OK);
    CHECK_EQ(dev->ops->range_release(dev, base, 64 * MiB), VG_OK);
    dev->ops->destroy(dev);
}

/* During a capture: a map runs in the relaxed capture mode (as PyTorch's
 * cudaMalloc does), an unmap is refused with nothing unmapped, a range
 * release waits for the capture's end. */
static void test_capture_rules(void)
{
    fresh();
    vg_device *dev = create(0);
    CHECK(dev);
    uintptr_t base = 0;
    CHECK_EQ(dev->ops->range_reserve(dev, 64 * MiB, &base), VG_OK);
    vg_capture_enter(0);
    long exchanges = calls("cudaThreadExchangeStreamCaptureMode");
    CHECK_EQ(dev->ops->map(dev, base, 4 * MiB), VG_OK);
    CHECK_EQ(calls("cudaThreadExchangeStreamCaptureMode"), exchanges + 2); /* relaxed, then back */
    CHECK_EQ(dev->ops->unmap(dev, base, 4 * MiB), VG_ERR_BUSY);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 4 * MiB);
    CHECK_EQ(calls("cuMemUnmap"), 0);
    vg_capture_leave(0);
    CHECK_EQ(dev->ops->unmap(dev, base, 4 * MiB), VG_OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0);

    vg_capture_enter(0);
    CHECK_EQ(dev->ops->range_release(dev, base, 64 * MiB), VG_OK);
    CHECK_EQ(calls("cuMemAddressFree"), 0);
    CHECK_EQ(vg_cuda_deferred_frees(0), 1);
    vg_capture_leave(0);
    size_t free_bytes, total;
    CHECK_EQ(dev->ops->mem_info(dev, &free_bytes, &total), VG_OK); /* the first call after */
    CHECK_EQ(calls("cuMemAddressFree"), 1);
    CHECK_EQ(vg_cuda_deferred_frees(0), 0);
    dev->ops->destroy(dev);
}

/* The arena's heap policy, where this build has it (as the registry
 * finds it). */
extern const vg_policy vg_policy_arena __attribute__((weak));

/* The registry: the arena where the device can, segments where it cannot
 * or where turned off, each said in words. Devices 0, 1 and 2 get their
 * heaps here, once per process. */
static void test_registry_chooses_arena_or_segments(void)
{
    fresh();
    CHECK_EQ(vg_devices_use_arena(2), VG_ERR_ARG);
    CHECK_EQ(vg_devices_use_arena(-2), VG_ERR_ARG);
    CHECK_EQ(vg_devices_arena_mode(), VG_DEVICES_ARENA_DEFAULT);
    CHECK(vg_devices_backing(0) == NULL); /* no heap yet */

    CHECK_EQ(vg_devices_use_arena(1), VG_OK);
    vg_heap *h0 = vg_devices_heap(0);
    CHECK(h0);
    const int have_arena = &vg_policy_arena != NULL;
    CHECK(strcmp(vg_devices_backing(0), have_arena ? "arena (virtual memory, 2 MiB pages)"
                 : "segments (virtual memory not supported: the arena is not in this build)") == 0);

    vg_fakecuda_set_vmm(0);
    CHECK(vg_devices_heap(1));
    CHECK(strcmp(vg_devices_backing(1), "segments (virtual memory not supported: device 1 does "
                                        "not support virtual memory management)") == 0);
    vg_fakecuda_set_vmm(1);

    CHECK_EQ(vg_devices_use_arena(0), VG_OK);
    CHECK(vg_devices_heap(2));
    CHECK(strcmp(vg_devices_backing(2), "segments (the arena is turned off)") == 0);
    CHECK_EQ(vg_devices_use_arena(-1), VG_OK);
    CHECK_EQ(vg_devices_arena_mode(), VG_DEVICES_ARENA_DEFAULT);

    /* The heap of device 0 on the fake: what it reserves is what the
     * driver handed out, to the byte. */
    vg_oom_info oom;
    void *p = NULL;
    CHECK_EQ(vg_devices_alloc(3 * MiB, 0, 0, &p, &oom), VG_OK);
    vg_stats st;
    vg_heap_stats(h0, &st);
    CHECK_EQ(st.reserved_bytes[0].current, (uint64_t)vg_fakecuda_bytes_in_use(0));
    if (have_arena) {
        CHECK_EQ(vg_fakecuda_malloc_calls(), 0);
        CHECK_EQ(st.reserved_bytes[0].current % (2 * MiB), 0);
    }
    vg_devices_free(p, 0);
    vg_devices_empty_cache_all();
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0);
}

int main(int argc, char **argv)
{
    /* Before the first CUDA call, which reads them. */
    setenv("VG_FAKECUDA_DEVICES", "3", 1);
    setenv("VG_FAKECUDA_MEM", "64MiB", 1);
    static const harness_test tests[] = {
        {"supported_device_has_2mib_pages", test_supported_device_has_2mib_pages},
        {"unsupported_device_has_no_pages", test_unsupported_device_has_no_pages},
        {"map_counts_against_capacity", test_map_counts_against_capacity},
        {"mapped_memory_holds_bytes", test_mapped_memory_holds_bytes},
        {"out_of_memory_maps_nothing", test_out_of_memory_maps_nothing},
        {"other_errors_are_named", test_other_errors_are_named},
        {"driver_calls_per_run", test_driver_calls_per_run},
        {"calls_run_on_the_provider_device", test_calls_run_on_the_provider_device},
        {"capture_rules", test_capture_rules},
        {"registry_chooses_arena_or_segments", test_registry_chooses_arena_or_segments},
    };
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
