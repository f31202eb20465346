/* The simulated device: a capacity, a fake 64-bit address space with no
 * memory behind it, simulated streams and events, and fault injection.
 *
 * Addresses are handed out by a bump pointer and never reused, so a stale
 * pointer can never alias a newer segment (tests rely on that to catch
 * use-after-release). The pointer never wraps: once the space up to SIM_END
 * is spent (2^64 bytes reserved in all, 131,072 segments of 128 TiB) every
 * reserve says VG_ERR_NOMEM, so no address is handed out twice, and none is 0.
 *
 * Events: each stream counts the events recorded on it and how many of them
 * have completed. An event is (stream slot, sequence number) packed into the
 * handle, so recording one allocates nothing. A stream is (device, handle),
 * as in CUDA: a heap may record events on another device's streams (handle
 * 0 is every device's default stream), and this device's table keeps them
 * apart from its own.
 *
 * Device errors: vg_sim_fail_device injects a failure that is not an
 * out-of-memory, one-shot or sticky, as CUDA reports an illegal address.
 *
 * Virtual memory (the arena's calls): ranges come from their own part of
 * the space, [SIM_RANGE_BASE, SIM_END), by a bump pointer of their own that
 * never wraps either; segments then stop below SIM_RANGE_BASE. A device
 * with page size 0 has no virtual memory and its segments get the whole
 * space. Mapped bytes count against the capacity as reserved ones do, and
 * a map is a reserve for fault injection: fail_nth, fail_random and
 * fail_device count map calls and reserve calls in one sequence, and
 * refuse or fail a map as they would a reserve (nothing is mapped then).
 *
 * Locking: the heap calls the ops with its own lock held, but the vg_sim_*
 * hooks come from any thread (a test completing a stream while another
 * frees), so every op and every hook takes the sim's own mutex. None of them
 * is on the heap's hot path.
 */
#include "vramguard/device.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#define SIM_BASE ((uintptr_t)1 << 40)
/* The end of the address space, granule-aligned as every address is. */
#define SIM_END (UINTPTR_MAX & ~(uintptr_t)(VG_SEGMENT_GRANULE - 1))
#define SIM_MAX_STREAMS 4096
/* The upper half of the space is for ranges, when there is virtual memory. */
#define SIM_RANGE_BASE ((uintptr_t)1 << 63)
#define SIM_DEFAULT_PAGE ((size_t)2 << 20)

typedef struct sim_stream {
    vg_stream_t stream;
    int device;
    uint64_t recorded;
    uint64_t completed;
} sim_stream;

typedef struct vg_sim {
    vg_device base;
    pthread_mutex_t lock; /* everything below */
    size_t capacity;
    size_t used;
    uintptr_t next_addr;
    uintptr_t next_range;   /* the ranges' own bump pointer */
    uint64_t maps, unmaps;  /* map and unmap calls that succeeded */
    size_t max_range;       /* the largest range reserved at once; 0 = any */
    uint64_t reserves;      /* reserve and map calls so far */
    uint64_t fail_at;       /* refuse when reserves reaches this; 0 = off */
    double fail_probability;
    uint64_t rng;
    uint64_t device_fail_at; /* device errors from this reserve on; 0 = off */
    bool device_fail_sticky; /* past it too, and in synchronize */
    sim_stream *streams;
    size_t nstreams;
    bool fail_events;        /* event_record says VG_ERR_NOMEM */
    uint64_t event_queries;
    int synchronize_answer;  /* VG_OK: wait; else return it, waiting for nothing */
    int unmap_answer;        /* VG_OK: unmap; else return it, unmapping nothing */

    /* A test may hold synchronize at its start, to see what other threads
     * can do meanwhile: its own mutex, since the sim's must stay free. */
    pthread_mutex_t hold_lock;
    pthread_cond_t hold_changed;
    bool hold;
    int held; /* synchronizes waiting at the hold now */
} vg_sim;

static vg_sim *as_sim(vg_device *dev)
{
    return (vg_sim *)dev;
}

/* splitmix64: small, seedable, good enough for fault injection. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static bool injected_fault(vg_sim *sim)
{
    if (sim->fail_at && sim->reserves == sim->fail_at) return true;
    if (sim->fail_probability > 0.0) {
        double u = (double)(next_random(&sim->rng) >> 11) / 9007199254740992.0;
        if (u < sim->fail_probability) return true;
    }
    return false;
}

/* A device error as CUDA would report it; VG_ERR_DEVICE. */
static int report_error(int code, const char *call, const char *name, const char *text)
{
    vg_device_error *e = vg_device_last_error();
    e->code = code;
    snprintf(e->call, sizeof e->call, "%s", call);
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->text, sizeof e->text, "%s", text);
    return VG_ERR_DEVICE;
}

/* What CUDA reports after a kernel's illegal memory access. */
static int device_error(const char *call)
{
    return report_error(700, call, "cudaErrorIllegalAddress",
                        "an illegal memory access was encountered");
}

/* Is the device failing now? `reserves` counts the current reserve. */
static bool device_failing(const vg_sim *sim)
{
    if (!sim->device_fail_at || sim->reserves < sim->device_fail_at) return false;
    return sim->device_fail_sticky || sim->reserves == sim->device_fail_at;
}

/* Where segments end: below the ranges' part when there are ranges. */
static uintptr_t segments_end(const vg_sim *sim)
{
    return sim->base.page_size ? SIM_RANGE_BASE : SIM_END;
}

/* What a reserve and a map have in common: one more call in the sequence
 * fault injection counts, which may fail the device or be refused, and
 * `size` more bytes against the capacity. VG_OK: the call may go on. */
static int take_memory(vg_sim *sim, size_t size, const char *call)
{
    sim->reserves++;
    if (device_failing(sim)) return device_error(call);
    if (injected_fault(sim)) return VG_ERR_NOMEM;
    return size > sim->capacity - sim->used ? VG_ERR_NOMEM : VG_OK;
}

static int sim_reserve(vg_device *dev, size_t size, uintptr_t *addr)
{
    vg_sim *sim = as_sim(dev);
    int rc = take_memory(sim, size, "cudaMalloc");
    if (rc != VG_OK) return rc;
    /* next_addr and the end are granule-aligned, so a size that fits fits
     * rounded up too, and the rounding cannot overflow. */
    uintptr_t end = segments_end(sim);
    if (sim->next_addr >= end || size > end - sim->next_addr) return VG_ERR_NOMEM;
    sim->used += size;
    *addr = sim->next_addr;
    sim->next_addr += (size + VG_SEGMENT_GRANULE - 1) & ~(VG_SEGMENT_GRANULE - 1);
    return VG_OK;
}

static int sim_release(vg_device *dev, uintptr_t addr, size_t size)
{
    (void)addr;
    as_sim(dev)->used -= size;
    return VG_OK;
}

static int sim_mem_info(vg_device *dev, size_t *free_bytes, size_t *total_bytes)
{
    vg_sim *sim = as_sim(dev);
    uintptr_t end = segments_end(sim);
    size_t unused = sim->capacity - sim->used;
    size_t space_left = sim->next_addr < end ? end - sim->next_addr : 0;
    /* Once the address space runs low it is what limits the next reserve. */
    *free_bytes = unused < space_left ? unused : space_left;
    *total_bytes = sim->capacity;
    return VG_OK;
}

/* Every stream it recorded on, its own device's and others'. */
static int sim_synchronize(vg_device *dev)
{
    vg_sim *sim = as_sim(dev);
    if (sim->device_fail_sticky && device_failing(sim))
        return device_error("cudaDeviceSynchronize");
    if (sim->synchronize_answer != VG_OK) return sim->synchronize_answer;
    for (size_t i = 0; i < sim->nstreams; i++) sim->streams[i].completed = sim->streams[i].recorded;
    return VG_OK;
}

/* A call that breaks the page contract is a device error, as CUDA's
 * CUDA_ERROR_INVALID_VALUE: the heap's own checks then see it. */
static bool pages_ok(const vg_sim *sim, uintptr_t addr, size_t size)
{
    size_t page = sim->base.page_size;
    return page && size && addr % page == 0 && size % page == 0 && addr >= SIM_RANGE_BASE;
}

static int invalid_value(const char *call)
{
    return report_error(1, call, "CUDA_ERROR_INVALID_VALUE", "invalid argument");
}

static int sim_range_reserve(vg_device *dev, size_t size, uintptr_t *addr)
{
    vg_sim *sim = as_sim(dev);
    size_t page = sim->base.page_size;
    if (!page || !size || size % page) return invalid_value("cuMemAddressReserve");
    if (sim->max_range && size > sim->max_range) return VG_ERR_NOMEM;
    /* next_range and SIM_END are page-aligned (pages are powers of two no
     * bigger than the granule), so this cannot wrap. */
    if (size > SIM_END - sim->next_range) return VG_ERR_NOMEM;
    *addr = sim->next_range;
    sim->next_range += size;
    return VG_OK;
}

static int sim_range_release(vg_device *dev, uintptr_t addr, size_t size)
{
    vg_sim *sim = as_sim(dev);
    return pages_ok(sim, addr, size) ? VG_OK : invalid_value("cuMemAddressFree");
}

static int sim_map(vg_device *dev, uintptr_t addr, size_t size)
{
    vg_sim *sim = as_sim(dev);
    if (!pages_ok(sim, addr, size)) return invalid_value("cuMemMap");
    int rc = take_memory(sim, size, "cuMemMap");
    if (rc != VG_OK) return rc;
    sim->used += size;
    sim->maps++;
    return VG_OK;
}

static int sim_unmap(vg_device *dev, uintptr_t addr, size_t size)
{
    vg_sim *sim = as_sim(dev);
    if (sim->unmap_answer != VG_OK) return sim->unmap_answer;
    if (!pages_ok(sim, addr, size) || size > sim->used) return invalid_value("cuMemUnmap");
    sim->used -= size;
    sim->unmaps++;
    return VG_OK;
}

static sim_stream *find_stream(vg_sim *sim, int device, vg_stream_t stream, bool create)
{
    for (size_t i = 0; i < sim->nstreams; i++)
        if (sim->streams[i].stream == stream && sim->streams[i].device == device)
            return &sim->streams[i];
    if (!create || sim->nstreams == SIM_MAX_STREAMS) return NULL;
    if (!sim->streams) {
        sim->streams = calloc(SIM_MAX_STREAMS, sizeof *sim->streams);
        if (!sim->streams) return NULL;
    }
    sim_stream *s = &sim->streams[sim->nstreams++];
    s->stream = stream;
    s->device = device;
    return s;
}

#define SEQ_BITS 40

static int sim_event_record(vg_device *dev, int device, vg_stream_t stream, vg_event_t *ev)
{
    vg_sim *sim = as_sim(dev);
    if (sim->fail_events) return VG_ERR_NOMEM;
    sim_stream *s = find_stream(sim, device, stream, true);
    if (!s) return VG_ERR_NOMEM;
    uint64_t slot = (uint64_t)(s - sim->streams);
    *ev = (vg_event_t)((slot << SEQ_BITS) | ++s->recorded);
    return VG_OK;
}

static int sim_event_query(vg_device *dev, vg_event_t ev)
{
    vg_sim *sim = as_sim(dev);
    sim->event_queries++;
    const sim_stream *s = &sim->streams[(uint64_t)ev >> SEQ_BITS];
    return s->completed >= ((uint64_t)ev & (((uint64_t)1 << SEQ_BITS) - 1));
}

static void sim_event_release(vg_device *dev, vg_event_t ev)
{
    (void)dev;
    (void)ev;
}

static void sim_destroy(vg_device *dev)
{
    vg_sim *sim = as_sim(dev);
    pthread_mutex_destroy(&sim->lock);
    pthread_mutex_destroy(&sim->hold_lock);
    pthread_cond_destroy(&sim->hold_changed);
    free(sim->streams);
    free(sim);
}

/* The ops as the heap sees them: each one under the sim's mutex. */
#define LOCKED(sim, call)                    \
    do {                                     \
        pthread_mutex_lock(&(sim)->lock);    \
        call;                                \
        pthread_mutex_unlock(&(sim)->lock);  \
    } while (0)

/* locked_OP: sim_OP under the mutex; synchronize, which waits at the
 * test's hold first, is written out below. */
#define LOCKED_OP(op, params, args)              \
    static int locked_##op params                \
    {                                            \
        int rc;                                  \
        LOCKED(as_sim(dev), rc = sim_##op args); \
        return rc;                               \
    }

LOCKED_OP(reserve, (vg_device *dev, size_t size, uintptr_t *addr), (dev, size, addr))
LOCKED_OP(release, (vg_device *dev, uintptr_t addr, size_t size), (dev, addr, size))
LOCKED_OP(mem_info, (vg_device *dev, size_t *free_bytes, size_t *total_bytes),
          (dev, free_bytes, total_bytes))
LOCKED_OP(event_record, (vg_device *dev, int device, vg_stream_t stream, vg_event_t *ev),
          (dev, device, stream, ev))
LOCKED_OP(event_query, (vg_device *dev, vg_event_t ev), (dev, ev))
LOCKED_OP(range_reserve, (vg_device *dev, size_t size, uintptr_t *addr), (dev, size, addr))
LOCKED_OP(range_release, (vg_device *dev, uintptr_t addr, size_t size), (dev, addr, size))
LOCKED_OP(map, (vg_device *dev, uintptr_t addr, size_t size), (dev, addr, size))
LOCKED_OP(unmap, (vg_device *dev, uintptr_t addr, size_t size), (dev, addr, size))

static void wait_at_hold(vg_sim *sim)
{
    pthread_mutex_lock(&sim->hold_lock);
    sim->held++;
    pthread_cond_broadcast(&sim->hold_changed);
    while (sim->hold) pthread_cond_wait(&sim->hold_changed, &sim->hold_lock);
    sim->held--;
    pthread_mutex_unlock(&sim->hold_lock);
}

static int locked_synchronize(vg_device *dev)
{
    wait_at_hold(as_sim(dev));
    int rc;
    LOCKED(as_sim(dev), rc = sim_synchronize(dev));
    return rc;
}

static const vg_device_ops sim_ops = {
    .reserve = locked_reserve,
    .release = locked_release,
    .mem_info = locked_mem_info,
    .synchronize = locked_synchronize,
    .event_record = locked_event_record,
    .event_query = locked_event_query,
    .event_release = sim_event_release,
    .destroy = sim_destroy,
    .range_reserve = locked_range_reserve,
    .range_release = locked_range_release,
    .map = locked_map,
    .unmap = locked_unmap,
};

vg_device *vg_sim_create(size_t capacity)
{
    vg_sim *sim = calloc(1, sizeof *sim);
    if (!sim) return NULL;
    if (pthread_mutex_init(&sim->lock, NULL)) {
        free(sim);
        return NULL;
    }
    pthread_mutex_init(&sim->hold_lock, NULL);
    pthread_cond_init(&sim->hold_changed, NULL);
    sim->base.ops = &sim_ops;
    sim->capacity = capacity;
    sim->next_addr = SIM_BASE;
    sim->next_range = SIM_RANGE_BASE;
    sim->base.page_size = SIM_DEFAULT_PAGE;
    return &sim->base;
}

/* The public sim_* calls accept any device and ignore those that are not
 * simulated, so a caller's mistake cannot corrupt a real provider. */
static vg_sim *sim_of(const vg_device *dev)
{
    return dev && dev->ops == &sim_ops ? (vg_sim *)(uintptr_t)dev : NULL;
}

void vg_sim_set_base(vg_device *dev, uintptr_t base)
{
    vg_sim *sim = sim_of(dev);
    if (sim && base) sim->next_addr = base;
}

void vg_sim_fail_nth(vg_device *dev, uint64_t nth)
{
    vg_sim *sim = sim_of(dev);
    if (!sim) return;
    LOCKED(sim, sim->fail_at = nth ? sim->reserves + nth : 0);
}

void vg_sim_fail_random(vg_device *dev, double probability, uint64_t seed)
{
    vg_sim *sim = sim_of(dev);
    if (!sim) return;
    LOCKED(sim, sim->fail_probability = probability; sim->rng = seed);
}

void vg_sim_fail_device(vg_device *dev, uint64_t nth, int sticky)
{
    vg_sim *sim = sim_of(dev);
    if (!sim) return;
    LOCKED(sim, sim->device_fail_at = nth ? sim->reserves + nth : 0;
           sim->device_fail_sticky = nth && sticky);
}

void vg_sim_complete_stream(vg_device *dev, vg_stream_t stream)
{
    if (dev) vg_sim_complete_stream_of(dev, dev->index, stream);
}

static void complete_stream(vg_sim *sim, int device, vg_stream_t stream)
{
    sim_stream *s = find_stream(sim, device, stream, false);
    if (s) s->completed = s->recorded;
}

void vg_sim_complete_stream_of(vg_device *dev, int device, vg_stream_t stream)
{
    vg_sim *sim = sim_of(dev);
    if (sim) LOCKED(sim, complete_stream(sim, device, stream));
}

size_t vg_sim_used(const vg_device *dev)
{
    vg_sim *sim = sim_of(dev);
    size_t used = 0;
    if (sim) LOCKED(sim, used = sim->used);
    return used;
}

void vg_sim_fail_events(vg_device *dev, int fail)
{
    vg_sim *sim = sim_of(dev);
    if (!sim) return;
    LOCKED(sim, sim->fail_events = fail != 0);
}

void vg_sim_synchronize_answer(vg_device *dev, int rc)
{
    vg_sim *sim = sim_of(dev);
    if (!sim) return;
    LOCKED(sim, sim->synchronize_answer = rc);
}

void vg_sim_unmap_answer(vg_device *dev, int rc)
{
    vg_sim *sim = sim_of(dev);
    if (!sim) return;
    LOCKED(sim, sim->unmap_answer = rc);
}

void vg_sim_hold_synchronize(vg_device *dev, int hold)
{
    vg_sim *sim = sim_of(dev);
    if (!sim) return;
    pthread_mutex_lock(&sim->hold_lock);
    sim->hold = hold != 0;
    pthread_cond_broadcast(&sim->hold_changed);
    pthread_mutex_unlock(&sim->hold_lock);
}

void vg_sim_wait_for_held(vg_device *dev, int n)
{
    vg_sim *sim = sim_of(dev);
    if (!sim) return;
    pthread_mutex_lock(&sim->hold_lock);
    while (sim->held < n) pthread_cond_wait(&sim->hold_changed, &sim->hold_lock);
    pthread_mutex_unlock(&sim->hold_lock);
}

uint64_t vg_sim_event_queries(vg_device *dev)
{
    vg_sim *sim = sim_of(dev);
    if (!sim) return 0;
    uint64_t n;
    LOCKED(sim, n = sim->event_queries);
    return n;
}

int vg_sim_set_page_size(vg_device *dev, size_t page_size)
{
    vg_sim *sim = sim_of(dev);
    if (!sim) return VG_ERR_ARG;
    bool power_of_two = (page_size & (page_size - 1)) == 0;
    if (page_size && (!power_of_two || page_size < VG_ALIGN || page_size > VG_SEGMENT_GRANULE))
        return VG_ERR_ARG;
    LOCKED(sim, sim->base.page_size = page_size);
    return VG_OK;
}

void vg_sim_max_range(vg_device *dev, size_t bytes)
{
    vg_sim *sim = sim_of(dev);
    if (sim) LOCKED(sim, sim->max_range = bytes);
}

void vg_sim_vm_calls(vg_device *dev, uint64_t *maps, uint64_t *unmaps)
{
    vg_sim *sim = sim_of(dev);
    uint64_t m = 0, u = 0;
    if (sim) LOCKED(sim, m = sim->maps; u = sim->unmaps);
    if (maps) *maps = m;
    if (unmaps) *unmaps = u;
}
