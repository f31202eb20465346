// The torch entry points on simulated devices: what PyTorch's pluggable
// allocator sees. An OOM must arrive as a std::exception whose message
// starts the way PyTorch's own does, and a device error as one that starts
// as PyTorch's CUDA errors do and never reads as an OOM; a free must never
// throw; size 0 and bad pointers must be harmless.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <functional>
#include <thread>
#include <stdexcept>
#include <string>
#include <sys/types.h>
#include <utility>
#include <vector>

#include "vramguard/devices.h"
#include "harness.h"

extern "C" void *vramguard_torch_malloc(ssize_t size, int device, void *stream);
extern "C" void vramguard_torch_free(void *ptr, ssize_t size, int device, void *stream) noexcept;
extern "C" void vramguard_torch_init(int device_count) noexcept;
extern "C" void vramguard_torch_reset(void) noexcept;
extern "C" void vramguard_torch_memory_fraction(double fraction, int device);
extern "C" void vramguard_torch_record_stream(void *ptr, void *stream) noexcept;
extern "C" void *vramguard_torch_base_alloc(void *ptr, size_t *size);
extern "C" int vramguard_torch_base_alloc_refusal(const void *ptr, char *message, size_t n) noexcept;
extern "C" void vramguard_torch_set_oom_thrower(void (*fn)(const char *)) noexcept;

struct CUstream_st;
typedef CUstream_st *cudaStream_t;
using pool_id = std::pair<unsigned long long, unsigned long long>;
using stream_filter = std::function<bool(cudaStream_t)>;
extern "C" void vramguard_torch_begin_pool(int device, pool_id id, stream_filter filter);
extern "C" void vramguard_torch_end_pool(int device, uint64_t id0, uint64_t id1) noexcept;
extern "C" void vramguard_torch_release_pool(int device, uint64_t id0, uint64_t id1) noexcept;

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
    vg_devices_use_arena(0); /* segments: the call that fails is a cudaMalloc */
    vg_heap *h = vg_devices_heap(3);
    vg_devices_use_arena(-1);
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

/* ------------------------------------------------------------------ */
/* The other hooks                                                     */
/* ------------------------------------------------------------------ */

static vg_stats stats_of(int device)
{
    vg_stats st;
    vg_heap_stats(vg_devices_existing(device), &st);
    return st;
}

/* reset_fn empties the cache of every device heap. */
static void test_reset_empties_every_device(void)
{
    void *a = vramguard_torch_malloc(30 * MiB, 6, nullptr);
    void *b = vramguard_torch_malloc(50 * MiB, 7, nullptr);
    vramguard_torch_free(a, 30 * MiB, 6, nullptr);
    vramguard_torch_free(b, 50 * MiB, 7, nullptr);
    CHECK_EQ(stats_of(6).reserved_bytes[VG_STAT_ALL].current, 30 * MiB);
    CHECK_EQ(stats_of(7).reserved_bytes[VG_STAT_ALL].current, 50 * MiB);
    vramguard_torch_reset();
    CHECK_EQ(stats_of(6).reserved_bytes[VG_STAT_ALL].current, 0);
    CHECK_EQ(stats_of(7).reserved_bytes[VG_STAT_ALL].current, 0);
    CHECK_EQ(stats_of(6).num_empty_cache, 1);
}

static bool throws_invalid(double fraction, int device)
{
    try {
        vramguard_torch_memory_fraction(fraction, device);
    } catch (const std::invalid_argument &) {
        return true;
    }
    return false;
}

/* memory_fraction_fn: that device's budget, as a fraction of its memory. */
static void test_memory_fraction_sets_the_budget(void)
{
    vramguard_torch_memory_fraction(0.25, 8);
    CHECK_EQ(vg_heap_budget(vg_devices_existing(8)), 256 * MiB); /* of 1 GiB */
    void *a = vramguard_torch_malloc(200 * MiB, 8, nullptr);
    CHECK(a != nullptr);
    bool oom = false;
    try {
        vramguard_torch_malloc(100 * MiB, 8, nullptr);
    } catch (const std::runtime_error &e) {
        oom = std::strstr(e.what(), "vramguard's budget is 256.00 MiB") != nullptr;
    }
    CHECK(oom);
    /* 0: nothing new at all (native PyTorch's 0 too); what is cached serves */
    vramguard_torch_memory_fraction(0.0, 8);
    CHECK_EQ(vg_heap_budget(vg_devices_existing(8)), 1);
    vramguard_torch_free(a, 200 * MiB, 8, nullptr);
    void *again = vramguard_torch_malloc(200 * MiB, 8, nullptr);
    CHECK(again == a);
    vramguard_torch_free(again, 200 * MiB, 8, nullptr);
    vramguard_torch_memory_fraction(1.0, 8);
    CHECK_EQ(vg_heap_budget(vg_devices_existing(8)), 1024 * MiB);
    /* bad input: an exception, the budget untouched */
    CHECK(throws_invalid(1.5, 8));
    CHECK(throws_invalid(-0.1, 8));
    CHECK(throws_invalid(__builtin_nan(""), 8));
    CHECK(throws_invalid(0.5, -1));
    CHECK(throws_invalid(0.5, VG_MAX_DEVICES));
    CHECK_EQ(vg_heap_budget(vg_devices_existing(8)), 1024 * MiB);
}

/* init_fn: PyTorch's device count, which bounds the devices after it. */
static void test_init_notes_the_device_count(void)
{
    CHECK_EQ(vg_devices_device_count(), -1);
    vramguard_torch_init(9);
    CHECK_EQ(vg_devices_device_count(), 9);
    CHECK(throws_invalid(0.5, 9));
    vramguard_torch_memory_fraction(0.5, 8);
    CHECK_EQ(vg_heap_budget(vg_devices_existing(8)), 512 * MiB);
    vramguard_torch_memory_fraction(1.0, 8);
    vramguard_torch_init(VG_MAX_DEVICES);
}

/* record_stream_fn: on the simulated devices the stream's device is the
 * block's own; unknown and null pointers are ignored. */
static void test_record_stream_hook(void)
{
    void *p = vramguard_torch_malloc(1000, 10, nullptr);
    vramguard_torch_record_stream(p, reinterpret_cast<void *>(0x77));
    vramguard_torch_record_stream(p, reinterpret_cast<void *>(0x77)); /* once is enough */
    vramguard_torch_record_stream(reinterpret_cast<void *>(0xbad000), reinterpret_cast<void *>(0x77));
    vramguard_torch_record_stream(nullptr, reinterpret_cast<void *>(0x77));
    vg_heap *h = vg_devices_existing(10);
    CHECK_EQ(stats_of(10).num_record_stream, 1);
    vramguard_torch_free(p, 1000, 10, nullptr);
    CHECK_EQ(stats_of(10).num_deferred_frees, 1);
    void *q = vramguard_torch_malloc(1000, 10, nullptr);
    CHECK(q != p); /* stream 0x77 has not finished */
    vg_sim_complete_stream(vg_heap_device(h), 0x77);
    void *r = vramguard_torch_malloc(1000, 10, nullptr);
    CHECK(r == p);
    vramguard_torch_free(q, 1000, 10, nullptr);
    vramguard_torch_free(r, 1000, 10, nullptr);
    CHECK_HEAP(h);
}

/* base_alloc_fn: the segment a pointer lies in. */
static void test_base_alloc_hook(void)
{
    vg_devices_use_arena(0); /* segments: the base is the segment's */
    CHECK(vg_devices_heap(11) != nullptr);
    vg_devices_use_arena(-1);
    void *a = vramguard_torch_malloc(3 * MiB, 11, nullptr);
    void *b = vramguard_torch_malloc(3 * MiB, 11, nullptr); /* two 3 MiB blocks: one 6 MiB segment */
    CHECK(b == static_cast<char *>(a) + 3 * MiB);
    size_t size = 1;
    void *base = vramguard_torch_base_alloc(b, &size);
    CHECK(base == a);
    CHECK_EQ(size, 6 * MiB);
    base = vramguard_torch_base_alloc(static_cast<char *>(b) + 100, &size); /* inside */
    CHECK(base == a);
    CHECK_EQ(size, 6 * MiB);
    void *stranger = reinterpret_cast<void *>(0x1234000);
    CHECK(vramguard_torch_base_alloc(stranger, &size) == stranger);
    CHECK_EQ(size, 0);
    CHECK(vramguard_torch_base_alloc(a, nullptr) == a);
    vramguard_torch_free(a, 3 * MiB, 11, nullptr);
    vramguard_torch_free(b, 3 * MiB, 11, nullptr);
}

/* base_alloc_fn for a block of the arena (the default on simulated
 * devices): no base CUDA IPC could export, so an exception naming the
 * arena and the way out, as PyTorch's own refusal for expandable segments;
 * the heap is untouched. */
static void test_base_alloc_refuses_arena_blocks(void)
{
    /* Device 0: simulated devices' ranges share addresses, and a lookup by
     * address finds the lowest device's first. */
    const int dev = 0;
    void *a = vramguard_torch_malloc(3 * MiB, dev, nullptr);
    CHECK(a != nullptr);
    CHECK(vg_heap_uses_arena(vg_devices_existing(dev)));
    char expected[640];
    std::snprintf(expected, sizeof expected,
                  "vramguard: the CUDA memory at %p lies in vramguard's arena on GPU 0, virtual "
                  "memory mapped page by page (cuMemMap, as PyTorch's expandable segments), which "
                  "has no base allocation that CUDA IPC (cudaIpcGetMemHandle) can share with "
                  "another process. To share CUDA tensors between processes, allocate them with "
                  "segments: vramguard.install(arena=False), or VRAMGUARD_ARENA=0 in the "
                  "environment, in the process that allocates them.",
                  static_cast<char *>(a) + 100);
    std::string msg;
    size_t size = 1;
    try {
        vramguard_torch_base_alloc(static_cast<char *>(a) + 100, &size);
    } catch (const std::runtime_error &e) {
        msg = e.what();
    }
    CHECK(msg == expected);
    CHECK_EQ(size, 1); /* nothing written */
    char words[640];
    CHECK_EQ(vramguard_torch_base_alloc_refusal(static_cast<char *>(a) + 100, words, sizeof words), 1);
    CHECK(msg == words);
    /* a segment's block, or a stranger: no refusal */
    CHECK_EQ(vramguard_torch_base_alloc_refusal(reinterpret_cast<void *>(0x1234000), words, sizeof words), 0);
    vg_stats st;
    vg_heap_stats(vg_devices_existing(dev), &st);
    CHECK_EQ(st.requested_bytes[VG_STAT_ALL].current, 3 * MiB);
    vramguard_torch_free(a, 3 * MiB, dev, nullptr);
    CHECK_HEAP(vg_devices_existing(dev));
}

/* ------------------------------------------------------------------ */
/* Private pools                                                       */
/* ------------------------------------------------------------------ */

static std::vector<vg_pool_info> pools(void)
{
    std::vector<vg_pool_info> out(vg_devices_pools(nullptr, 0));
    out.resize(vg_devices_pools(out.data(), out.size()));
    return out;
}

static void *on_stream(uintptr_t s)
{
    return reinterpret_cast<void *>(s);
}

static stream_filter only_stream(uintptr_t wanted)
{
    return [wanted](cudaStream_t s) { return reinterpret_cast<uintptr_t>(s) == wanted; };
}

/* A graph's pool: the allocations its filter accepts go to a heap of their
 * own, kept whole until the pool is released; the rest are untouched. */
static void test_pool_routes_what_the_filter_accepts(void)
{
    const int dev = 12;
    vramguard_torch_begin_pool(dev, {1, 0}, only_stream(0x51));
    CHECK_EQ(vg_capture_active(dev), 1);
    void *in = vramguard_torch_malloc(30 * MiB, dev, on_stream(0x51));
    void *tmp = vramguard_torch_malloc(1000, dev, on_stream(0x51));
    void *out = vramguard_torch_malloc(30 * MiB, dev, on_stream(0x52));
    CHECK_EQ(stats_of(dev).allocated_bytes[VG_STAT_ALL].current, 30 * MiB); /* only `out` */
    std::vector<vg_pool_info> p = pools();
    CHECK_EQ(p.size(), 1);
    CHECK_EQ(p[0].device, dev);
    CHECK_EQ(p[0].id0, 1);
    CHECK_EQ(p[0].id1, 0);
    CHECK_EQ(p[0].use_count, 1);
    CHECK_EQ(p[0].begun, 1);
    CHECK_EQ(p[0].stats.allocation[VG_STAT_ALL].current, 2);
    /* freed during the capture: reused by the pool's next allocation */
    vramguard_torch_free(tmp, 1000, dev, on_stream(0x51));
    void *tmp2 = vramguard_torch_malloc(1000, dev, on_stream(0x51));
    CHECK(tmp2 == tmp);
    vramguard_torch_end_pool(dev, 1, 0);
    CHECK_EQ(vg_capture_active(dev), 0);
    /* after the end, the same stream allocates from the device's heap */
    void *after = vramguard_torch_malloc(1000, dev, on_stream(0x51));
    CHECK_EQ(pools()[0].stats.allocation[VG_STAT_ALL].current, 2);
    /* freed pool blocks stay the pool's: not for the device, not released */
    vramguard_torch_free(in, 30 * MiB, dev, nullptr);
    vramguard_torch_free(tmp2, 1000, dev, nullptr);
    vramguard_torch_reset();
    p = pools();
    CHECK_EQ(p[0].stats.allocation[VG_STAT_ALL].current, 0);
    CHECK_EQ(p[0].stats.reserved_bytes[VG_STAT_ALL].current, 32 * MiB);
    void *main_block = vramguard_torch_malloc(30 * MiB, dev, on_stream(0x51));
    CHECK(main_block != in);
    /* released with nothing live: the heap goes, its memory with it */
    vramguard_torch_release_pool(dev, 1, 0);
    CHECK_EQ(pools().size(), 0);
    vramguard_torch_free(main_block, 30 * MiB, dev, nullptr);
    vramguard_torch_free(after, 1000, dev, nullptr);
    vramguard_torch_free(out, 30 * MiB, dev, nullptr);
    CHECK_EQ(stats_of(dev).num_invalid_frees, 0);
    CHECK_HEAP(vg_devices_existing(dev));
}

/* Released while a block of it is live (a graph's output kept after the
 * graph): the pool goes when that block is freed. */
static void test_released_pool_goes_with_its_last_block(void)
{
    const int dev = 12;
    vramguard_torch_begin_pool(dev, {0, 2}, only_stream(0x51));
    void *kept = vramguard_torch_malloc(3 * MiB, dev, on_stream(0x51));
    void *gone = vramguard_torch_malloc(30 * MiB, dev, on_stream(0x51));
    vramguard_torch_free(gone, 30 * MiB, dev, nullptr);
    vramguard_torch_end_pool(dev, 0, 2);
    vramguard_torch_release_pool(dev, 0, 2);
    std::vector<vg_pool_info> p = pools();
    CHECK_EQ(p.size(), 1);
    CHECK_EQ(p[0].released, 1);
    CHECK_EQ(p[0].use_count, 0);
    /* the idle 30 MiB went back at once; the live block's segment stays */
    CHECK_EQ(p[0].stats.reserved_bytes[VG_STAT_ALL].current, 6 * MiB);
    size_t seg = 0;
    CHECK(vramguard_torch_base_alloc(kept, &seg) == kept);
    CHECK_EQ(seg, 6 * MiB);
    vramguard_torch_free(kept, 3 * MiB, dev, nullptr);
    CHECK_EQ(pools().size(), 0);
    CHECK_EQ(stats_of(dev).num_invalid_frees, 0);
}

/* Two graphs sharing a pool (torch.cuda.graph(pool=...)): each begin is a
 * use, each release gives one back. */
static void test_shared_pool_counts_its_uses(void)
{
    const int dev = 12;
    vramguard_torch_begin_pool(dev, {3, 0}, only_stream(0x51));
    void *a = vramguard_torch_malloc(1000, dev, on_stream(0x51));
    vramguard_torch_end_pool(dev, 3, 0);
    vramguard_torch_begin_pool(dev, {3, 0}, only_stream(0x51));
    vramguard_torch_free(a, 1000, dev, nullptr);
    void *b = vramguard_torch_malloc(1000, dev, on_stream(0x51));
    CHECK(b == a); /* the second graph reuses the first one's freed block */
    vramguard_torch_end_pool(dev, 3, 0);
    CHECK_EQ(pools()[0].use_count, 2);
    vramguard_torch_free(b, 1000, dev, nullptr);
    vramguard_torch_release_pool(dev, 3, 0);
    CHECK_EQ(pools().size(), 1);
    CHECK_EQ(pools()[0].use_count, 1);
    vramguard_torch_release_pool(dev, 3, 0);
    CHECK_EQ(pools().size(), 0);
    vramguard_torch_release_pool(dev, 3, 0); /* once too often: ignored */
    vramguard_torch_end_pool(dev, 3, 0);
}

/* Two begins on a device: the earliest whose filter accepts wins; a filter
 * that throws accepts nothing. */
static void test_begins_are_asked_in_order(void)
{
    const int dev = 12;
    vramguard_torch_begin_pool(dev, {4, 0}, only_stream(0x51));
    vramguard_torch_begin_pool(dev, {5, 0}, [](cudaStream_t) { return true; });
    vramguard_torch_begin_pool(dev, {6, 0}, [](cudaStream_t) -> bool {
        throw std::runtime_error("cudaStreamGetCaptureInfo failed");
    });
    CHECK_EQ(vg_capture_active(dev), 3);
    void *a = vramguard_torch_malloc(1000, dev, on_stream(0x51));
    void *b = vramguard_torch_malloc(1000, dev, on_stream(0x99));
    std::vector<vg_pool_info> p = pools();
    CHECK_EQ(p.size(), 3);
    CHECK_EQ(p[0].stats.allocation[VG_STAT_ALL].current, 1);
    CHECK_EQ(p[1].stats.allocation[VG_STAT_ALL].current, 1);
    CHECK_EQ(p[2].stats.allocation[VG_STAT_ALL].current, 0);
    vramguard_torch_end_pool(dev, 5, 0);
    void *c = vramguard_torch_malloc(1000, dev, on_stream(0x99)); /* only the thrower left */
    CHECK_EQ(pools()[2].stats.allocation[VG_STAT_ALL].current, 0);
    vramguard_torch_end_pool(dev, 4, 0);
    vramguard_torch_end_pool(dev, 6, 0);
    CHECK_EQ(vg_capture_active(dev), 0);
    for (void *ptr : {a, b, c}) vramguard_torch_free(ptr, 1000, dev, nullptr);
    for (uint64_t id : {4, 5, 6}) vramguard_torch_release_pool(dev, id, 0);
    CHECK_EQ(pools().size(), 0);
    CHECK_EQ(stats_of(dev).num_invalid_frees, 0);
}

static std::string begin_error(int device, pool_id id)
{
    try {
        vramguard_torch_begin_pool(device, id, [](cudaStream_t) { return true; });
    } catch (const std::exception &e) {
        return e.what();
    }
    return "";
}

static void test_begin_refuses_bad_pools(void)
{
    const int dev = 12;
    CHECK(begin_error(dev, {0, 0}).find("(0, 0) on device 12") != std::string::npos);
    CHECK(begin_error(VG_MAX_DEVICES, {1, 1}) != "");
    vramguard_torch_begin_pool(dev, {7, 0}, only_stream(0x51));
    std::string twice = begin_error(dev, {7, 0});
    CHECK(twice.find("being allocated to already") != std::string::npos);
    CHECK_EQ(vg_capture_active(dev), 1);
    CHECK_EQ(pools()[0].use_count, 1);
    vramguard_torch_end_pool(dev, 7, 0);
    vramguard_torch_release_pool(dev, 7, 0);
    CHECK_EQ(pools().size(), 0);
    CHECK_EQ(vg_capture_active(dev), 0);
}

/* The out-of-memory ladder of a pool releases nothing: the graph replays
 * into freed blocks too. */
static void test_pool_oom_keeps_its_segments(void)
{
    const int dev = 13;
    vramguard_torch_begin_pool(dev, {8, 0}, only_stream(0x51));
    void *a = vramguard_torch_malloc(600 * MiB, dev, on_stream(0x51));
    vramguard_torch_free(a, 600 * MiB, dev, nullptr);
    bool oom = false;
    try {
        vramguard_torch_malloc(700 * MiB, dev, on_stream(0x51));
    } catch (const std::runtime_error &e) {
        oom = std::strncmp(e.what(), "CUDA out of memory.", 19) == 0;
    }
    CHECK(oom);
    std::vector<vg_pool_info> p = pools();
    CHECK_EQ(p[0].stats.reserved_bytes[VG_STAT_ALL].current, 600 * MiB);
    CHECK_EQ(p[0].stats.num_device_free, 0);
    CHECK_EQ(p[0].stats.num_ooms, 1);
    vramguard_torch_end_pool(dev, 8, 0);
    vramguard_torch_release_pool(dev, 8, 0);
    CHECK_EQ(pools().size(), 0);
}

/* record_stream and base_alloc find pool blocks too. */
static void test_hooks_find_pool_blocks(void)
{
    const int dev = 12;
    vramguard_torch_begin_pool(dev, {9, 0}, only_stream(0x51));
    void *a = vramguard_torch_malloc(1000, dev, on_stream(0x51));
    vramguard_torch_end_pool(dev, 9, 0);
    size_t size = 0;
    CHECK(vramguard_torch_base_alloc(a, &size) == a);
    CHECK_EQ(size, 2 * MiB);
    vramguard_torch_record_stream(a, on_stream(0x52));
    CHECK_EQ(pools()[0].stats.num_record_stream, 1);
    vramguard_torch_free(a, 1000, dev, nullptr);
    CHECK_EQ(pools()[0].stats.num_deferred_frees, 1);
    /* Released, its cache is emptied, which waits for stream 0x52 first
     * (as the device heaps' empty_cache does): nothing is left. */
    vramguard_torch_release_pool(dev, 9, 0);
    CHECK_EQ(pools().size(), 0);
}

/* Threads allocating and freeing while pools begin, end and are released:
 * every block goes back to the heap it came from, and nothing is left. */
static void test_pools_under_threads(void)
{
    const int dev = 14, threads = 4, rounds = 20000;
    std::atomic<int> finished{0};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; t++) {
        workers.emplace_back([t, &finished]() {
            uintptr_t stream = 0x60 + (uintptr_t)t; /* 0x60 and 0x61 are the pools' */
            for (int i = 0; i < rounds; i++) {
                size_t size = 512 + (size_t)((i * 7919 + t * 131) % 4096) * 512;
                void *p = vramguard_torch_malloc((ssize_t)size, dev, on_stream(stream));
                void *q = vramguard_torch_malloc(1000, dev, on_stream(stream));
                vramguard_torch_free(p, (ssize_t)size, dev, nullptr);
                vramguard_torch_free(q, 1000, dev, nullptr);
            }
            finished++;
        });
    }
    int cycles = 0;
    for (int i = 0; i < 100 || finished.load() < threads; i++, cycles++) {
        uint64_t id = 100 + (uint64_t)(i % 3);
        vramguard_torch_begin_pool(dev, {id, 0}, only_stream(0x60 + (uintptr_t)(i % 2)));
        vramguard_torch_end_pool(dev, id, 0);
        vramguard_torch_release_pool(dev, id, 0);
    }
    for (std::thread &w : workers) w.join();
    vramguard_torch_reset();
    std::printf("     %d pool cycles while the threads ran\n", cycles);
    CHECK_EQ(pools().size(), 0);
    CHECK_EQ(vg_capture_active(dev), 0);
    vg_stats st = stats_of(dev);
    CHECK_EQ(st.num_invalid_frees, 0);
    CHECK_EQ(st.allocation[VG_STAT_ALL].current, 0);
    CHECK_EQ(st.reserved_bytes[VG_STAT_ALL].current, 0);
    CHECK_HEAP(vg_devices_existing(dev));
}

/* An out-of-memory through the thrower install() hands over. */
static void throw_marked(const char *msg)
{
    throw std::length_error(std::string("marked: ") + msg);
}

static void test_oom_thrower_replaces_runtime_error(void)
{
    vramguard_torch_set_oom_thrower(throw_marked);
    std::string msg;
    try {
        vramguard_torch_malloc(2000 * MiB, 0, nullptr);
    } catch (const std::length_error &e) {
        msg = e.what();
    }
    vramguard_torch_set_oom_thrower(nullptr);
    CHECK(msg.rfind("marked: CUDA out of memory. Tried to allocate", 0) == 0);
    /* a device error is not an OOM: never the thrower's */
    bool runtime = false;
    try {
        vramguard_torch_malloc(2000 * MiB, 0, nullptr);
    } catch (const std::runtime_error &) {
        runtime = true;
    }
    CHECK(runtime);
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
    T(test_reset_empties_every_device),
    T(test_memory_fraction_sets_the_budget),
    T(test_init_notes_the_device_count),
    T(test_record_stream_hook),
    T(test_base_alloc_hook),
    T(test_base_alloc_refuses_arena_blocks),
    T(test_pool_routes_what_the_filter_accepts),
    T(test_released_pool_goes_with_its_last_block),
    T(test_shared_pool_counts_its_uses),
    T(test_begins_are_asked_in_order),
    T(test_begin_refuses_bad_pools),
    T(test_pool_oom_keeps_its_segments),
    T(test_hooks_find_pool_blocks),
    T(test_pools_under_threads),
    T(test_oom_thrower_replaces_runtime_error),
};

int main(int argc, char **argv)
{
    if (vg_devices_simulate(1024 * MiB) != VG_OK) return 2;
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : nullptr);
}
