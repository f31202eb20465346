/* One heap per CUDA device, created on first use for that device: what the
 * torch entry points (torch/torch_hook.cc) and vramguard's Python API share, so
 * that the allocator PyTorch calls and the numbers Python reads are one
 * instance.
 *
 * Settings (budget, gc threshold) are kept here and given to each heap as
 * it is created; configuring again applies them to existing heaps too.
 * For tests on machines without a GPU, vg_devices_simulate() makes every
 * device a simulated one, so the whole path above the provider runs.
 */
#include "registry.h"
#include "vramguard/report.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static _Atomic(vg_heap *) heaps[VG_MAX_DEVICES];
static pthread_mutex_t registry = PTHREAD_MUTEX_INITIALIZER;
/* What each heap runs on (vg_devices_backing): written before the heap is
 * published, read after it is seen, never changed. */
static char backing[VG_MAX_DEVICES][256];

static struct settings {
    size_t budget;          /* bytes, 0 = none */
    double budget_fraction; /* of the device's total, 0 = none */
    double gc_threshold;
    size_t simulated;       /* capacity of simulated devices, 0 = real ones */
    int arena;              /* 1: the arena where the device can; 0: segments */
} settings = {.arena = VG_DEVICES_ARENA_DEFAULT};
/* settings.simulated != 0, for the record_stream hook's every call
 * (vg_devices_stream_device): read without the registry's mutex. */
static atomic_int simulating;

/* Per thread, as errno: a caller reads the message of its own failure,
 * never one that another thread is writing. */
static _Thread_local char last_error[768];
static atomic_int warned_invalid_free;
static atomic_int torch_device_count = -1;

const char *vg_devices_error(void)
{
    return last_error;
}

void vg__devices_set_error(const char *message)
{
    snprintf(last_error, sizeof last_error, "%s", message);
}

/* The budget a device gets: a fraction of its total, or bytes. The
 * fraction is a vg_valid_fraction, so the product fits in size_t. A
 * fraction of a total nobody knows (the heap's mem_info failed when it was
 * created) is an error, not "no budget". */
static int budget_for(vg_heap *h, size_t budget, double fraction, size_t *out)
{
    if (fraction <= 0.0) {
        *out = budget;
        return VG_OK;
    }
    size_t total = vg_heap_device_total(h);
    if (!total) {
        snprintf(last_error, sizeof last_error,
                 "device %d memory unknown: a budget fraction cannot be applied to it",
                 vg_heap_device(h)->index);
        return VG_ERR_DEVICE;
    }
    *out = (size_t)((double)total * fraction);
    return VG_OK;
}

static int apply_budget(vg_heap *h, size_t budget, double fraction)
{
    size_t bytes = 0;
    int rc = budget_for(h, budget, fraction, &bytes);
    return rc == VG_OK ? vg_heap_set_budget(h, bytes) : rc;
}

/* With the registry's mutex held (the settings are read under it). */
static vg_device *provider_locked(int device, uintptr_t sim_base)
{
    char why[640] = "out of host memory";
    size_t simulated = settings.simulated;
    vg_device *dev = simulated ? vg_sim_create(simulated) : vg_cuda_create(device, why, sizeof why);
    if (!dev) {
        snprintf(last_error, sizeof last_error, "cannot use %s device %d: %s",
                 simulated ? "simulated" : "CUDA", device, why);
        return NULL;
    }
    dev->index = device;
    if (simulated) vg_sim_set_base(dev, sim_base);
    return dev;
}

vg_device *vg__devices_provider(int device, uintptr_t sim_base)
{
    pthread_mutex_lock(&registry);
    vg_device *dev = provider_locked(device, sim_base);
    pthread_mutex_unlock(&registry);
    return dev;
}

/* Why a device cannot have the arena, or NULL when it can. */
static const char *no_arena_reason(const vg_device *dev)
{
    if (dev->page_size) return NULL;
    if (settings.simulated) return "the simulated device has no pages";
    const char *why = vg_cuda_vmm_unsupported(dev);
    return why && *why ? why : "the device has no pages";
}

/* The policy a new heap of `dev` gets, and the words for it in backing[]. */
static const vg_policy *choose_policy(const vg_device *dev, char *words, size_t n)
{
    if (!settings.arena) {
        snprintf(words, n, "segments (the arena is turned off)");
        return &vg_policy_default;
    }
    const char *why = no_arena_reason(dev);
    if (why) {
        snprintf(words, n, "segments (virtual memory not supported: %s)", why);
        return &vg_policy_default;
    }
    size_t page = dev->page_size;
    if (page % ((size_t)1 << 20) == 0)
        snprintf(words, n, "arena (virtual memory, %zu MiB pages)", page >> 20);
    else
        snprintf(words, n, "arena (virtual memory, %zu KiB pages)", page >> 10);
    return &vg_policy_arena;
}

static vg_heap *create_locked(int device)
{
    /* simulated: 4 TiB of addresses per device, as real ones never overlap */
    vg_device *dev = provider_locked(device, ((uintptr_t)1 << 40) + ((uintptr_t)device << 42));
    if (!dev) return NULL;
    /* The budget after: the heap asks the device its total as it is
     * created, once. */
    vg_heap_config cfg = {choose_policy(dev, backing[device], sizeof backing[device]), 0,
                          settings.gc_threshold};
    vg_heap *h = vg_heap_create(dev, &cfg);
    if (!h) {
        dev->ops->destroy(dev);
        snprintf(last_error, sizeof last_error, "cannot create a heap for device %d", device);
        return NULL;
    }
    if (apply_budget(h, settings.budget, settings.budget_fraction) != VG_OK) {
        vg_heap_destroy(h);
        dev->ops->destroy(dev);
        return NULL;
    }
    /* One budget per device, its private pools' memory included. */
    vg_heap_share_budget(h, vg__pools_reserved_on, (void *)(intptr_t)device);
    atomic_store(&heaps[device], h);
    return h;
}

vg_heap *vg_devices_heap(int device)
{
    if (device < 0 || device >= VG_MAX_DEVICES) {
        snprintf(last_error, sizeof last_error, "device %d out of range (0..%d)", device,
                 VG_MAX_DEVICES - 1);
        return NULL;
    }
    vg_heap *h = atomic_load_explicit(&heaps[device], memory_order_acquire);
    if (h) return h;
    pthread_mutex_lock(&registry);
    h = atomic_load(&heaps[device]);
    if (!h) h = create_locked(device);
    pthread_mutex_unlock(&registry);
    return h;
}

vg_heap *vg_devices_existing(int device)
{
    if (device < 0 || device >= VG_MAX_DEVICES) return NULL;
    return atomic_load_explicit(&heaps[device], memory_order_acquire);
}

int vg_devices_configure(size_t budget, double budget_fraction, double gc_threshold)
{
    if (!vg_valid_fraction(budget_fraction) || !vg_valid_fraction(gc_threshold)) return VG_ERR_ARG;
    pthread_mutex_lock(&registry);
    /* Every heap's budget first, so that a refusal changes nothing. */
    size_t bytes[VG_MAX_DEVICES] = {0};
    int rc = VG_OK;
    for (int d = 0; d < VG_MAX_DEVICES && rc == VG_OK; d++) {
        vg_heap *h = atomic_load(&heaps[d]);
        if (h) rc = budget_for(h, budget, budget_fraction, &bytes[d]);
    }
    if (rc == VG_OK) {
        settings.budget = budget;
        settings.budget_fraction = budget_fraction;
        settings.gc_threshold = gc_threshold;
        for (int d = 0; d < VG_MAX_DEVICES; d++) {
            vg_heap *h = atomic_load(&heaps[d]);
            if (!h) continue;
            vg_heap_set_budget(h, bytes[d]);
            vg_heap_set_gc_threshold(h, gc_threshold);
        }
    }
    pthread_mutex_unlock(&registry);
    return rc;
}

int vg_devices_set_budget(int device, size_t budget, double budget_fraction)
{
    if (!vg_valid_fraction(budget_fraction)) return VG_ERR_ARG;
    vg_heap *h = vg_devices_heap(device);
    if (!h) return VG_ERR_DEVICE;
    return apply_budget(h, budget, budget_fraction);
}

int vg_devices_use_arena(int mode)
{
    if (mode < -1 || mode > 1) return VG_ERR_ARG;
    pthread_mutex_lock(&registry);
    settings.arena = mode < 0 ? VG_DEVICES_ARENA_DEFAULT : mode;
    pthread_mutex_unlock(&registry);
    return VG_OK;
}

int vg_devices_arena_mode(void)
{
    pthread_mutex_lock(&registry);
    int mode = settings.arena;
    pthread_mutex_unlock(&registry);
    return mode;
}

const char *vg_devices_backing(int device)
{
    return vg_devices_existing(device) ? backing[device] : NULL;
}

int vg_devices_simulate(size_t capacity)
{
    pthread_mutex_lock(&registry);
    int rc = VG_OK;
    for (int d = 0; d < VG_MAX_DEVICES && rc == VG_OK; d++)
        if (atomic_load(&heaps[d])) rc = VG_ERR_ARG; /* too late: heaps exist */
    if (rc == VG_OK) {
        settings.simulated = capacity;
        atomic_store_explicit(&simulating, capacity != 0, memory_order_release);
    }
    pthread_mutex_unlock(&registry);
    return rc;
}

int vg_devices_simulated(void)
{
    return atomic_load_explicit(&simulating, memory_order_acquire);
}

/* ------------------------------------------------------------------ */
/* What the torch entry points call                                    */
/* ------------------------------------------------------------------ */

int vg_devices_alloc(size_t size, int device, vg_stream_t stream, void **out, vg_oom_info *oom)
{
    *out = NULL;
    oom->status = VG_OK;
    if (size == 0) return VG_OK; /* as PyTorch's own allocator: a null pointer */
    int rc;
    if (vg_capture_active(device) && vg__pools_alloc(size, device, stream, out, oom, &rc)) return rc;
    vg_heap *h = vg_devices_heap(device);
    if (!h) return VG_ERR_DEVICE;
    *out = vg_heap_alloc(h, size, stream, oom);
    if (!*out && oom->status == VG_ERR_NOMEM) {
        vg__pools_explain(device, oom);
        vg_devices_note_oom(h, oom); /* last_oom.c */
    }
    return *out ? VG_OK : oom->status;
}

void vg_devices_free(void *ptr, int device)
{
    if (!ptr) return;
    vg_heap *h = vg_devices_existing(device);
    if (h && vg_heap_free_if_owned(h, ptr) == VG_OK) return;
    if (vg__pools_free(ptr) == VG_OK) return; /* a CUDA graph's block */
    /* Not where PyTorch said: look on the other devices before giving up. */
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        vg_heap *other = vg_devices_existing(d);
        if (other && other != h && vg_heap_free_if_owned(other, ptr) == VG_OK) return;
    }
    if (h) vg_heap_count_invalid_free(h);
    /* Said once, since a free cannot raise. */
    if (!atomic_exchange(&warned_invalid_free, 1))
        fprintf(stderr, "vramguard: free of %p, which no device heap allocated (ignored; "
                        "counted in num_invalid_frees)\n", ptr);
}

int vg_devices_record_stream(void *ptr, int stream_device, vg_stream_t stream)
{
    if (stream_device >= VG_MAX_DEVICES) return VG_ERR_ARG;
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        vg_heap *h = vg_devices_existing(d);
        if (!h) continue;
        int rc = vg_heap_record_device_stream(h, ptr, stream_device < 0 ? d : stream_device, stream);
        if (rc != VG_ERR_INVALID) return rc;
    }
    return vg__pools_record_stream(ptr, stream_device, stream);
}

/* ------------------------------------------------------------------ */
/* What PyTorch's other hooks ask                                      */
/* ------------------------------------------------------------------ */

size_t vg_devices_empty_cache_all(void)
{
    size_t released = 0;
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        vg_heap *h = vg_devices_existing(d);
        if (h) released += vg_heap_empty_cache(h);
    }
    return released + vg__pools_empty_cache();
}

int vg_devices_segment_of(const void *ptr, uintptr_t *base, size_t *size)
{
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        vg_heap *h = vg_devices_existing(d);
        if (h && vg_heap_segment_of(h, ptr, base, size) == VG_OK) return VG_OK;
    }
    return vg__pools_segment_of(ptr, base, size);
}

void vg_devices_note_device_count(int count)
{
    atomic_store(&torch_device_count, count);
}

int vg_devices_device_count(void)
{
    return atomic_load(&torch_device_count);
}

int vg_devices_stream_device(vg_stream_t stream)
{
    return vg_devices_simulated() ? -1 : vg_cuda_stream_device(stream);
}
