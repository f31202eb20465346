/* Fake device memory: host address space, mapped MAP_NORESERVE so that a
 * 16 GiB device costs nothing until its bytes are touched, and handed back
 * to the system on free. "Device" pointers are ordinary host pointers, so
 * copies are memcpy; what makes them device memory is this table of live
 * ranges, which the copy calls consult: a copy to a freed or foreign
 * pointer is refused with cudaErrorInvalidValue, as by a real driver,
 * instead of crashing the test.
 *
 * Each device counts the bytes it has handed out against its capacity;
 * cudaMemGetInfo reports exactly capacity - used - the context's bytes
 * (VG_FAKECUDA_CONTEXT, 0 unless set), no rounding, so tests can assert
 * exact numbers.
 *
 * On a phantom (VG_FAKECUDA_PHANTOM=1) device memory is address space with
 * no host pages behind it, so a dry run's host memory does not grow with
 * the device memory it uses; copies and sets go through vgfc_copy and
 * vgfc_fill, which leave it untouched.
 */
#include "core.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HOST_ALREADY_REGISTERED 712

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static vgfc_range *ranges; /* sorted by base, never overlapping */
static size_t nranges, ranges_cap;

static struct {
    /* `unmapped`: the part of `used` in VMM handles never mapped yet. The
     * peak leaves it out: PyTorch's expandable segments create a range's
     * handles before mapping them, and release them when one fails (the
     * device full): memory held for an instant, by a map that did not
     * happen, is not what the program held beside its allocator. */
    size_t used, unmapped, peak;
    long live;
    /* Unified memory allocated while the device was current, and the part
     * of all unified memory its last prefetch put on the device: neither is
     * in `used` (the driver evicts it under pressure). */
    size_t managed, managed_peak, resident, resident_peak;
} stats[VGFC_MAX_DEVICES];

static size_t page_round(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (size + page - 1) / page * page;
}

void *vgfc_map_anonymous(size_t size)
{
    void *p = mmap(NULL, page_round(size), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* A phantom's device memory: addresses only. Nothing may touch it (copies
 * and sets skip it), and a stray host access faults rather than silently
 * committing pages: a 40 GiB phantom stays free of host memory. */
static void *map_device(size_t size)
{
    if (!vgfc_phantom())
        return vgfc_map_anonymous(size);
    void *p = mmap(NULL, page_round(size), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static long d2h_reads;

void vgfc_copy(void *dst, const void *src, size_t n, int dst_on_device, int src_on_device)
{
    if (!vgfc_phantom()) {
        memmove(dst, src, n);
    } else if (!dst_on_device) {
        if (src_on_device) {
            memset(dst, 0, n);
            __atomic_add_fetch(&d2h_reads, 1, __ATOMIC_RELAXED);
        } else {
            memmove(dst, src, n);
        }
    }
}

void vgfc_fill(void *dst, int value, size_t n)
{
    if (!vgfc_phantom())
        memset(dst, value, n);
}

long vg_fakecuda_d2h_reads(void)
{
    return __atomic_load_n(&d2h_reads, __ATOMIC_RELAXED);
}

/* ---- the range table (callers hold the lock) --------------------------- */

/* Index of the first range whose base is above addr. */
static size_t upper_bound(uintptr_t addr)
{
    size_t lo = 0, hi = nranges;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ranges[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Index of the range containing addr, or -1. */
static long containing(uintptr_t addr)
{
    size_t i = upper_bound(addr);
    if (i == 0 || addr - ranges[i - 1].base >= ranges[i - 1].size)
        return -1;
    return (long)(i - 1);
}

static int overlaps(uintptr_t base, size_t size)
{
    size_t i = upper_bound(base);
    if (i > 0 && base - ranges[i - 1].base < ranges[i - 1].size)
        return 1;
    return i < nranges && ranges[i].base < base + size;
}

static void insert(const vgfc_range *r)
{
    if (nranges == ranges_cap) {
        size_t cap = ranges_cap ? 2 * ranges_cap : 256;
        vgfc_range *grown = realloc(ranges, cap * sizeof *grown);
        if (!grown)
            abort(); /* the fake's own bookkeeping: nothing sensible to return */
        ranges = grown;
        ranges_cap = cap;
    }
    size_t i = upper_bound(r->base);
    memmove(&ranges[i + 1], &ranges[i], (nranges - i) * sizeof *ranges);
    ranges[i] = *r;
    nranges++;
}

static void erase(size_t i)
{
    memmove(&ranges[i], &ranges[i + 1], (nranges - i - 1) * sizeof *ranges);
    nranges--;
}

/* ---- accounting -------------------------------------------------------- */

static void note_peak_locked(int dev)
{
    size_t held = stats[dev].used - stats[dev].unmapped;
    if (held > stats[dev].peak)
        stats[dev].peak = held;
}

/* `size` more in use, of which `unmapped` in handles not mapped yet. */
static int charge_locked(int dev, size_t size, size_t unmapped)
{
    size_t capacity = vgfc_capacity(dev); /* a knob may have lowered it below used */
    size_t held = stats[dev].used + vgfc_context_bytes();
    if (held > capacity || size > capacity - held)
        return VGFC_OUT_OF_MEMORY;
    stats[dev].used += size;
    stats[dev].unmapped += unmapped;
    stats[dev].live++;
    note_peak_locked(dev);
    return VGFC_SUCCESS;
}

static void uncharge_locked(int dev, size_t size, size_t unmapped)
{
    stats[dev].used -= size;
    stats[dev].unmapped -= unmapped;
    stats[dev].live--;
}

int vgfc_mem_charge(int dev, size_t size, int mapped)
{
    pthread_mutex_lock(&lock);
    int err = charge_locked(dev, size, mapped ? 0 : size);
    pthread_mutex_unlock(&lock);
    return err;
}

void vgfc_mem_uncharge(int dev, size_t size, int mapped)
{
    pthread_mutex_lock(&lock);
    uncharge_locked(dev, size, mapped ? 0 : size);
    pthread_mutex_unlock(&lock);
}

void vgfc_mem_mapped(int dev, size_t size)
{
    pthread_mutex_lock(&lock);
    stats[dev].unmapped -= size;
    note_peak_locked(dev);
    pthread_mutex_unlock(&lock);
}

size_t vgfc_mem_used(int dev)
{
    pthread_mutex_lock(&lock);
    size_t used = stats[dev].used;
    pthread_mutex_unlock(&lock);
    return used + vgfc_context_bytes(); /* what the device holds, as nvidia-smi counts it */
}

/* ---- device addresses --------------------------------------------------- */

/* A real driver hands out device addresses upward: each allocation at the
 * lowest free 2 MiB-aligned address of the device's space (a real GPU's
 * snapshot, its segments in the order they were made: 58 of 60 steps up,
 * the two down reusing freed space). mmap's addresses go downward. The
 * order matters to allocators that break ties between equal free blocks
 * by address (PyTorch's, vramguard's segments policy): with mmap's, a dry
 * run of Llama with LoRA under the segments policy reserved 5,104 MiB,
 * where the same allocations with addresses upward reserve 4,856. So each
 * device reserves a span of address space once (no memory behind it) and
 * places its allocations first-fit inside; where the span has no room
 * (a capacity raised past it), plain mmap serves. */
#define SPAN_ALIGN ((size_t)2 << 20)
#define SPAN_MIN ((size_t)64 << 30)
#define SPAN_MAX ((size_t)2 << 40)

static struct {
    uintptr_t base;
    size_t size;
    int tried; /* reserved, or refused: not asked again */
} spans[VGFC_MAX_DEVICES];

static size_t span_round(size_t size)
{
    return (size + SPAN_ALIGN - 1) & ~(SPAN_ALIGN - 1);
}

/* The device's span, reserved the first time (the lock held). */
static int span_ready_locked(int dev)
{
    if (!spans[dev].tried) {
        spans[dev].tried = 1;
        size_t size = vgfc_capacity(dev) > SPAN_MAX / 4 ? SPAN_MAX : span_round(4 * vgfc_capacity(dev));
        if (size < SPAN_MIN)
            size = SPAN_MIN;
        /* Aligned by over-reserving one alignment and trimming the ends. */
        void *p = mmap(NULL, size + SPAN_ALIGN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
            uintptr_t raw = (uintptr_t)p, base = (raw + SPAN_ALIGN - 1) & ~(uintptr_t)(SPAN_ALIGN - 1);
            if (base > raw)
                munmap(p, base - raw);
            munmap((void *)(base + size), raw + SPAN_ALIGN - base); /* base < raw + SPAN_ALIGN */
            spans[dev].base = base;
            spans[dev].size = size;
        }
    }
    return spans[dev].size != 0;
}

static int in_span(int dev, uintptr_t addr)
{
    return dev >= 0 && spans[dev].size && addr - spans[dev].base < spans[dev].size;
}

/* The lowest address of the span with room for `size`, or 0 (the lock
 * held): the device's ranges lie in the table in address order. */
static uintptr_t span_first_fit_locked(int dev, size_t size)
{
    uintptr_t at = spans[dev].base, end = spans[dev].base + spans[dev].size;
    size_t need = span_round(size);
    for (size_t i = upper_bound(at - 1); i < nranges && ranges[i].base < end; i++) {
        if (ranges[i].base - at >= need)
            break;
        at = ranges[i].base + span_round(ranges[i].size);
    }
    return end - at >= need ? at : 0;
}

/* Device memory at the span's lowest free address, entered in the table;
 * NULL when the span cannot hold it. */
static void *span_alloc(int dev, size_t size, enum vgfc_mem_kind kind)
{
    pthread_mutex_lock(&lock);
    uintptr_t at = span_ready_locked(dev) ? span_first_fit_locked(dev, size) : 0;
    if (at) {
        vgfc_range r = {at, size, dev, kind, 0, 0, 0};
        insert(&r);
    }
    pthread_mutex_unlock(&lock);
    if (!at || vgfc_phantom()) /* a phantom's memory is the span's own PROT_NONE */
        return (void *)at;
    void *p = mmap((void *)at, page_round(size), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (p != MAP_FAILED)
        return p;
    pthread_mutex_lock(&lock);
    erase((size_t)containing(at));
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* Give a span's pages back and keep its address space reserved. */
static void span_release(uintptr_t addr, size_t size)
{
    if (!vgfc_phantom())
        mmap((void *)addr, page_round(size), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
             -1, 0);
}

/* ---- allocations ------------------------------------------------------- */

int vgfc_mem_alloc(int dev, size_t size, enum vgfc_mem_kind kind, void **out)
{
    *out = NULL;
    if (size == 0)
        return VGFC_SUCCESS;
    if (dev >= 0 && vgfc_mem_charge(dev, size, 1) != VGFC_SUCCESS)
        return VGFC_OUT_OF_MEMORY;
    if (dev >= 0 && (*out = span_alloc(dev, size, kind)) != NULL)
        return VGFC_SUCCESS;
    void *p = dev >= 0 ? map_device(size) : vgfc_map_anonymous(size);
    if (!p) {
        if (dev >= 0)
            vgfc_mem_uncharge(dev, size, 1);
        return VGFC_OUT_OF_MEMORY;
    }
    vgfc_range r = {(uintptr_t)p, size, dev, kind, 0, 0, 0};
    pthread_mutex_lock(&lock);
    insert(&r);
    pthread_mutex_unlock(&lock);
    *out = p;
    return VGFC_SUCCESS;
}

int vgfc_mem_free(void *ptr, enum vgfc_mem_kind kind)
{
    pthread_mutex_lock(&lock);
    long i = containing((uintptr_t)ptr);
    /* cudaFree and cuMemFree free managed memory too. */
    int managed = i >= 0 && ranges[i].kind == VGFC_MEM_MANAGED && kind == VGFC_MEM_DEVICE;
    if (i < 0 || ranges[i].base != (uintptr_t)ptr || (ranges[i].kind != kind && !managed)) {
        pthread_mutex_unlock(&lock);
        return VGFC_INVALID_VALUE;
    }
    vgfc_range r = ranges[i];
    erase((size_t)i);
    if (r.device >= 0)
        uncharge_locked(r.device, r.size, 0);
    if (managed) {
        stats[r.home].managed -= r.size;
        if (r.resident)
            stats[r.resident_device].resident -= r.resident;
    }
    int spanned = in_span(r.device, r.base);
    pthread_mutex_unlock(&lock);
    if (spanned)
        span_release(r.base, r.size);
    else if (kind != VGFC_MEM_REGISTERED)
        munmap(ptr, page_round(r.size));
    return VGFC_SUCCESS;
}

/* ---- unified memory ----------------------------------------------------- */

int vgfc_managed_alloc(int home, size_t size, void **out)
{
    *out = NULL;
    if (size == 0)
        return VGFC_INVALID_VALUE;
    void *p = vgfc_map_anonymous(size);
    if (!p)
        return VGFC_OUT_OF_MEMORY;
    vgfc_range r = {(uintptr_t)p, size, -1, VGFC_MEM_MANAGED, home, 0, 0};
    pthread_mutex_lock(&lock);
    insert(&r);
    stats[home].managed += size;
    if (stats[home].managed > stats[home].managed_peak)
        stats[home].managed_peak = stats[home].managed;
    pthread_mutex_unlock(&lock);
    *out = p;
    return VGFC_SUCCESS;
}

/* Index of the managed allocation holding [addr, addr+size), or -1 (the
 * lock held). */
static long managed_locked(uintptr_t addr, size_t size)
{
    long i = containing(addr);
    if (i < 0 || ranges[i].kind != VGFC_MEM_MANAGED || size > ranges[i].size - (addr - ranges[i].base))
        return -1;
    return i;
}

int vgfc_managed_contains(const void *ptr, size_t size)
{
    pthread_mutex_lock(&lock);
    long i = managed_locked((uintptr_t)ptr, size);
    pthread_mutex_unlock(&lock);
    return i >= 0;
}

/* An allocation is resident where its last prefetch sent it, by that
 * prefetch's size: bitsandbytes prefetches a paged tensor whole, so this
 * is its state's bytes on the device. */
int vgfc_managed_prefetch(const void *ptr, size_t size, int dev)
{
    pthread_mutex_lock(&lock);
    long i = managed_locked((uintptr_t)ptr, size);
    if (i >= 0) {
        vgfc_range *r = &ranges[i];
        if (r->resident)
            stats[r->resident_device].resident -= r->resident;
        r->resident = dev >= 0 ? size : 0;
        r->resident_device = dev >= 0 ? dev : 0;
        if (dev >= 0) {
            stats[dev].resident += size;
            if (stats[dev].resident > stats[dev].resident_peak)
                stats[dev].resident_peak = stats[dev].resident;
        }
    }
    pthread_mutex_unlock(&lock);
    return i >= 0 ? VGFC_SUCCESS : VGFC_INVALID_VALUE;
}

int vgfc_mem_register(void *ptr, size_t size)
{
    int err = VGFC_SUCCESS;
    pthread_mutex_lock(&lock);
    if (overlaps((uintptr_t)ptr, size)) {
        err = HOST_ALREADY_REGISTERED;
    } else {
        vgfc_range r = {(uintptr_t)ptr, size, -1, VGFC_MEM_REGISTERED, 0, 0, 0};
        insert(&r);
    }
    pthread_mutex_unlock(&lock);
    return err;
}

void vgfc_mem_add_range(const vgfc_range *r)
{
    pthread_mutex_lock(&lock);
    insert(r);
    pthread_mutex_unlock(&lock);
}

void vgfc_mem_remove_range(uintptr_t base)
{
    pthread_mutex_lock(&lock);
    long i = containing(base);
    if (i >= 0 && ranges[i].base == base)
        erase((size_t)i);
    pthread_mutex_unlock(&lock);
}

int vgfc_mem_find(const void *ptr, vgfc_range *out)
{
    pthread_mutex_lock(&lock);
    long i = containing((uintptr_t)ptr);
    if (i >= 0)
        *out = ranges[i];
    pthread_mutex_unlock(&lock);
    return i >= 0;
}

static int is_device(const vgfc_range *r, int dev)
{
    return (r->kind == VGFC_MEM_DEVICE || r->kind == VGFC_MEM_MAPPED) &&
           (dev < 0 || r->device == dev);
}

/* VMM mappings that sit side by side are one piece of memory to a copy:
 * PyTorch's expandable segments put a tensor across several of them. */
int vgfc_mem_check_device(const void *ptr, size_t size, int dev)
{
    uintptr_t addr = (uintptr_t)ptr, end = addr + size;
    if (end < addr)
        return VGFC_INVALID_VALUE;
    int err = VGFC_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    long i = containing(addr);
    if (i >= 0 && is_device(&ranges[i], dev)) {
        dev = ranges[i].device;
        for (;;) {
            uintptr_t range_end = ranges[i].base + ranges[i].size;
            if (end <= range_end) {
                err = VGFC_SUCCESS;
                break;
            }
            i++;
            if ((size_t)i == nranges || ranges[i].kind != VGFC_MEM_MAPPED ||
                ranges[i - 1].kind != VGFC_MEM_MAPPED || ranges[i].base != range_end ||
                ranges[i].device != dev)
                break;
        }
    }
    pthread_mutex_unlock(&lock);
    return err;
}

/* ---- knobs ------------------------------------------------------------- */

long long vg_fakecuda_bytes_in_use(int dev)
{
    return vgfc_valid_device(dev) ? (long long)vgfc_mem_used(dev) : -1;
}

long long vg_fakecuda_peak_bytes(int dev)
{
    if (!vgfc_valid_device(dev))
        return -1;
    pthread_mutex_lock(&lock);
    size_t peak = stats[dev].peak;
    pthread_mutex_unlock(&lock);
    return (long long)(peak + vgfc_context_bytes());
}

long vg_fakecuda_live_allocations(int dev)
{
    if (!vgfc_valid_device(dev))
        return -1;
    pthread_mutex_lock(&lock);
    long live = stats[dev].live;
    pthread_mutex_unlock(&lock);
    return live;
}

/* Unified memory per device: `which` picks the figure. */
static long long managed_stat(int dev, size_t *(*which)(int))
{
    if (!vgfc_valid_device(dev))
        return -1;
    pthread_mutex_lock(&lock);
    size_t bytes = *which(dev);
    pthread_mutex_unlock(&lock);
    return (long long)bytes;
}

static size_t *managed_now(int dev) { return &stats[dev].managed; }
static size_t *managed_peak(int dev) { return &stats[dev].managed_peak; }
static size_t *resident_now(int dev) { return &stats[dev].resident; }
static size_t *resident_peak(int dev) { return &stats[dev].resident_peak; }

long long vg_fakecuda_managed_bytes(int dev) { return managed_stat(dev, managed_now); }
long long vg_fakecuda_managed_peak_bytes(int dev) { return managed_stat(dev, managed_peak); }
long long vg_fakecuda_prefetched_bytes(int dev) { return managed_stat(dev, resident_now); }
long long vg_fakecuda_prefetched_peak_bytes(int dev) { return managed_stat(dev, resident_peak); }

void vgfc_mem_reset_peaks(void)
{
    pthread_mutex_lock(&lock);
    for (int d = 0; d < VGFC_MAX_DEVICES; d++) {
        stats[d].peak = stats[d].used - stats[d].unmapped;
        stats[d].managed_peak = stats[d].managed;
        stats[d].resident_peak = stats[d].resident;
    }
    pthread_mutex_unlock(&lock);
}
