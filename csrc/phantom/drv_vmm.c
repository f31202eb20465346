/* Driver API: virtual memory management, the calls behind PyTorch's
 * expandable segments. The fake does what the real driver does, with the
 * host's own virtual memory:
 *
 *   cuMemAddressReserve   address space only: PROT_NONE, MAP_NORESERVE
 *   cuMemCreate           physical memory: a memfd of that size, counted
 *                         against the device's capacity (OOM past it)
 *   cuMemMap              the memfd mapped MAP_FIXED into a reservation,
 *                         still inaccessible
 *   cuMemSetAccess        mprotect: now copies and memsets may use it
 *
 * On a phantom the same bookkeeping without host memory: no memfd, no
 * mapping over the reservation, no mprotect (copies skip device memory).
 *   cuMemUnmap            the reservation's PROT_NONE pages put back
 *   cuMemRelease          the handle dropped; the physical memory goes
 *                         when no handle or mapping holds it
 *
 * Mapping the same handle twice shows the same bytes at both addresses, as
 * on a GPU. Sizes and offsets must be multiples of the granularity (2 MiB).
 */
#include "drv.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GRANULARITY ((size_t)2 << 20)

struct phys {
    int fd;
    size_t size;
    int refs;        /* the handle's own references plus its mappings */
    int ever_mapped; /* counted in the device's peak from its first mapping */
    CUmemAllocationProp prop;
    struct phys *next;
};

struct span {
    uintptr_t base;
    size_t size;
    struct phys *phys; /* mappings only */
    int accessible;    /* mappings only: a range in the core's table */
};

/* Reservations and mappings, each a small array sorted by base. */
struct spans {
    struct span *v;
    size_t n, cap;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct spans reserved, mapped;
static struct phys *handles; /* live physical allocations */

/* ---- span arrays (callers hold the lock) ------------------------------- */

static size_t first_above(const struct spans *s, uintptr_t addr)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->v[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The span containing [addr, addr+size), or NULL. */
static struct span *enclosing(const struct spans *s, uintptr_t addr, size_t size)
{
    size_t i = first_above(s, addr);
    if (i == 0)
        return NULL;
    struct span *sp = &s->v[i - 1];
    return addr - sp->base < sp->size && size <= sp->size - (addr - sp->base) ? sp : NULL;
}

static int any_within(const struct spans *s, uintptr_t addr, size_t size)
{
    size_t i = first_above(s, addr);
    if (i > 0 && addr - s->v[i - 1].base < s->v[i - 1].size)
        return 1;
    return i < s->n && s->v[i].base < addr + size;
}

static int add_span(struct spans *s, struct span sp)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        struct span *grown = realloc(s->v, cap * sizeof *grown);
        if (!grown)
            return -1;
        s->v = grown;
        s->cap = cap;
    }
    size_t i = first_above(s, sp.base);
    memmove(&s->v[i + 1], &s->v[i], (s->n - i) * sizeof *s->v);
    s->v[i] = sp;
    s->n++;
    return 0;
}

static void remove_span(struct spans *s, struct span *sp)
{
    size_t i = (size_t)(sp - s->v);
    memmove(&s->v[i], &s->v[i + 1], (s->n - i - 1) * sizeof *s->v);
    s->n--;
}

/* ---- physical allocations ---------------------------------------------- */

static struct phys *find_handle(CUmemGenericAllocationHandle handle)
{
    for (struct phys *p = handles; p; p = p->next)
        if ((CUmemGenericAllocationHandle)(uintptr_t)p == handle)
            return p;
    return NULL;
}

/* Drops one reference; the last one gives the memory back. */
static void unref(struct phys *p)
{
    if (--p->refs > 0)
        return;
    for (struct phys **link = &handles; *link; link = &(*link)->next) {
        if (*link == p) {
            *link = p->next;
            break;
        }
    }
    if (p->fd >= 0)
        close(p->fd);
    vgfc_mem_uncharge(p->prop.location.id, p->size, p->ever_mapped);
    free(p);
}

static int valid_prop(const CUmemAllocationProp *prop)
{
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && vgfc_valid_device(prop->location.id);
}

static int aligned(size_t n)
{
    return n % GRANULARITY == 0;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    DRV_ENTER(cuMemGetAllocationGranularity);
    (void)option; /* minimum and recommended are the same here */
    if (!granularity || !valid_prop(prop))
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    *granularity = GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    DRV_ENTER(cuMemCreate);
    if (!handle || !valid_prop(prop) || size == 0 || !aligned(size) || flags != 0)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    int dev = prop->location.id;
    if (vgfc_mem_charge(dev, size, 0) != VGFC_SUCCESS)
        return drv_error(CUDA_ERROR_OUT_OF_MEMORY);
    struct phys *p = calloc(1, sizeof *p);
    /* A phantom's physical memory is a count, not a file: a descriptor per
     * handle would run out at the open-file limit (20,000 2 MiB pages is
     * 40 GiB) and be taken for an out-of-memory. */
    int fd = vgfc_phantom() ? -1 : memfd_create("vg_fakecuda", MFD_CLOEXEC);
    if (!p || (!vgfc_phantom() && (fd < 0 || ftruncate(fd, (off_t)size) != 0))) {
        if (fd >= 0)
            close(fd);
        free(p);
        vgfc_mem_uncharge(dev, size, 0);
        return drv_error(CUDA_ERROR_OUT_OF_MEMORY);
    }
    *p = (struct phys){.fd = fd, .size = size, .refs = 1, .prop = *prop};
    pthread_mutex_lock(&lock);
    p->next = handles;
    handles = p;
    pthread_mutex_unlock(&lock);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    DRV_ENTER(cuMemRelease);
    pthread_mutex_lock(&lock);
    struct phys *p = find_handle(handle);
    if (p)
        unref(p);
    pthread_mutex_unlock(&lock);
    return p ? CUDA_SUCCESS : drv_error(CUDA_ERROR_INVALID_VALUE);
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    DRV_ENTER(cuMemRetainAllocationHandle);
    if (!handle)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&lock);
    struct span *m = enclosing(&mapped, (uintptr_t)addr, 1);
    if (m) {
        m->phys->refs++;
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)m->phys;
    }
    pthread_mutex_unlock(&lock);
    return m ? CUDA_SUCCESS : drv_error(CUDA_ERROR_INVALID_VALUE);
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
    DRV_ENTER(cuMemGetAllocationPropertiesFromHandle);
    if (!prop)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&lock);
    struct phys *p = find_handle(handle);
    if (p)
        *prop = p->prop;
    pthread_mutex_unlock(&lock);
    return p ? CUDA_SUCCESS : drv_error(CUDA_ERROR_INVALID_VALUE);
}

/* ---- address space ----------------------------------------------------- */

/* Inaccessible, uncommitted pages: a reservation, or a hole put back. */
static void *reserve_pages(void *at, size_t size)
{
    int fixed = at ? MAP_FIXED : 0;
    void *p = mmap(at, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | fixed, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Reservations go upward, as a real driver hands address space out (the
 * device memory's addresses do too: core_memory.c), at the lowest free
 * aligned address of one span of address space reserved once; mmap's own
 * addresses go downward. The order matters to PyTorch's expandable
 * segments, which take the lowest-addressed segment with room first: with
 * mmap's, each new segment lay below the older ones, and a GPT's run that
 * fits a 13.47 GiB phantom ran out of memory on one of 13.45 GiB where the
 * replay of its own allocations, segments upward, fits. Where the span
 * cannot be had (a sanitizer's layout) or is full, plain mmap serves. */
#define VA_SPAN ((size_t)8 << 40)

static struct {
    uintptr_t base;
    size_t size;
    int tried;
} va;

static uintptr_t align_up(uintptr_t n, size_t alignment)
{
    return (n + alignment - 1) & ~(uintptr_t)(alignment - 1);
}

static int in_va_span(uintptr_t base)
{
    return va.size && base - va.base < va.size;
}

/* The span's lowest free address for `size` at `alignment`, or 0 (the lock held). */
static uintptr_t va_first_fit_locked(size_t size, size_t alignment)
{
    if (!va.tried) {
        va.tried = 1;
        void *p = reserve_pages(NULL, VA_SPAN);
        if (p) {
            va.base = (uintptr_t)p;
            va.size = VA_SPAN;
        }
    }
    if (!va.size)
        return 0;
    uintptr_t end = va.base + va.size, at = align_up(va.base, alignment);
    for (size_t i = first_above(&reserved, va.base - 1); i < reserved.n && reserved.v[i].base < end; i++) {
        if (at < end && reserved.v[i].base >= at && reserved.v[i].base - at >= size)
            break;
        at = align_up(reserved.v[i].base + reserved.v[i].size, alignment);
    }
    return at < end && end - at >= size ? at : 0;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    DRV_ENTER(cuMemAddressReserve);
    (void)addr; /* a hint, which the fake does not take */
    if (!ptr || size == 0 || !aligned(size) || flags != 0 || (alignment & (alignment - 1)))
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    if (alignment < GRANULARITY)
        alignment = GRANULARITY;
    pthread_mutex_lock(&lock);
    uintptr_t at = size <= VA_SPAN ? va_first_fit_locked(size, alignment) : 0;
    int refused = at ? add_span(&reserved, (struct span){.base = at, .size = size}) : 0;
    pthread_mutex_unlock(&lock);
    if (refused)
        return drv_error(CUDA_ERROR_OUT_OF_MEMORY);
    if (at) { /* the span's pages are PROT_NONE already */
        *ptr = (CUdeviceptr)at;
        return CUDA_SUCCESS;
    }
    /* Over-reserve, then trim both ends to the alignment. */
    uintptr_t raw = (uintptr_t)reserve_pages(NULL, size + alignment);
    if (!raw)
        return drv_error(CUDA_ERROR_OUT_OF_MEMORY);
    uintptr_t base = (raw + alignment - 1) & ~(uintptr_t)(alignment - 1);
    if (base > raw)
        munmap((void *)raw, base - raw);
    if (raw + alignment > base)
        munmap((void *)(base + size), raw + alignment - base);
    pthread_mutex_lock(&lock);
    int err = add_span(&reserved, (struct span){.base = base, .size = size});
    pthread_mutex_unlock(&lock);
    if (err) {
        munmap((void *)base, size);
        return drv_error(CUDA_ERROR_OUT_OF_MEMORY);
    }
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

/* Freeing address space that still has mappings is refused: the caller
 * leaked them, which a test wants to hear about. */
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    DRV_ENTER(cuMemAddressFree);
    CUresult res = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct span *r = enclosing(&reserved, (uintptr_t)ptr, size);
    if (r && r->base == (uintptr_t)ptr && r->size == size && !any_within(&mapped, r->base, r->size)) {
        if (!in_va_span(r->base)) /* in the span, its pages stay PROT_NONE, for the next reservation */
            munmap((void *)r->base, r->size);
        remove_span(&reserved, r);
        res = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return res == CUDA_SUCCESS ? res : drv_error(res);
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    DRV_ENTER(cuMemMap);
    uintptr_t base = (uintptr_t)ptr;
    if (size == 0 || !aligned(size) || !aligned(offset) || flags != 0 || !aligned(base))
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    CUresult res = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct phys *p = find_handle(handle);
    if (p && offset <= p->size && size <= p->size - offset && enclosing(&reserved, base, size) &&
        !any_within(&mapped, base, size)) {
        /* A phantom's mapping is bookkeeping: the reservation's PROT_NONE
         * pages stay as they are (no host memory, no new memory region). */
        void *at = vgfc_phantom() ? (void *)base
                                  : mmap((void *)base, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, (off_t)offset);
        if (at == MAP_FAILED) {
            res = CUDA_ERROR_OUT_OF_MEMORY;
        } else if (add_span(&mapped, (struct span){base, size, p, 0}) != 0) {
            reserve_pages(at, size);
            res = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            p->refs++;
            if (!p->ever_mapped) {
                p->ever_mapped = 1;
                vgfc_mem_mapped(p->prop.location.id, p->size);
            }
            res = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return res == CUDA_SUCCESS ? res : drv_error(res);
}

/* Every mapping in [base, base+size), which they must cover exactly, with
 * no gap: the index of the first, and how many; -1 otherwise. */
static long mappings_covering(uintptr_t base, size_t size, size_t *count)
{
    size_t i = first_above(&mapped, base);
    if (i == 0 || mapped.v[i - 1].base != base)
        return -1;
    size_t first = i - 1, j = first;
    uintptr_t at = base, end = base + size;
    while (j < mapped.n && mapped.v[j].base == at && at < end) {
        at += mapped.v[j].size;
        j++;
    }
    if (at != end)
        return -1;
    *count = j - first;
    return (long)first;
}

static void set_accessible(struct span *m, int accessible)
{
    if (accessible && !m->accessible) {
        vgfc_range r = {m->base, m->size, m->phys->prop.location.id, VGFC_MEM_MAPPED, 0, 0, 0};
        vgfc_mem_add_range(&r);
    } else if (!accessible && m->accessible) {
        vgfc_mem_remove_range(m->base);
    }
    m->accessible = accessible;
}

static int protection(const CUmemAccessDesc *desc, size_t count)
{
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !vgfc_valid_device(desc[i].location.id))
            return -1;
        if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            prot = PROT_READ | PROT_WRITE;
        else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE)
            prot = PROT_READ;
    }
    return prot;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    DRV_ENTER(cuMemSetAccess);
    int prot = desc && count ? protection(desc, count) : -1;
    if (prot < 0)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    CUresult res = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    size_t n;
    long first = mappings_covering((uintptr_t)ptr, size, &n);
    if (first >= 0 && (vgfc_phantom() || mprotect((void *)(uintptr_t)ptr, size, prot) == 0)) {
        for (size_t k = 0; k < n; k++)
            set_accessible(&mapped.v[first + (long)k], prot != PROT_NONE);
        res = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return res == CUDA_SUCCESS ? res : drv_error(res);
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    DRV_ENTER(cuMemUnmap);
    CUresult res = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    size_t n;
    long first = mappings_covering((uintptr_t)ptr, size, &n);
    if (first >= 0) {
        if (!vgfc_phantom())
            reserve_pages((void *)(uintptr_t)ptr, size);
        while (n--) {
            struct span *m = &mapped.v[first];
            set_accessible(m, 0);
            unref(m->phys);
            remove_span(&mapped, m);
        }
        res = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return res == CUDA_SUCCESS ? res : drv_error(res);
}
