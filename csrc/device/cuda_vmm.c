/* The CUDA provider's virtual memory calls, for the arena: address space
 * from cuMemAddressReserve, memory put behind it page by page with
 * cuMemCreate + cuMemMap, made accessible with cuMemSetAccess, and taken
 * back with cuMemUnmap.
 *
 * The driver is the one PyTorch's runtime uses: its functions are asked of
 * that runtime (cudaGetDriverEntryPointByVersion, else
 * cudaGetDriverEntryPoint), else looked up in a libcuda.so.1 already
 * loaded; never a second driver loaded here. The few types needed are
 * declared below, so no CUDA toolkit is needed to build.
 *
 * One physical allocation per page, so that any single page can be
 * unmapped later. Its handle is released as soon as it is mapped: the
 * mapping keeps the memory alive, and unmapping it gives the memory back,
 * so there is no handle to keep per page.
 *
 * Driver calls, each tens of microseconds on a GPU and made with the
 * heap's lock held, so as few as the driver allows: a run of N pages is
 * mapped with N cuMemCreate + N cuMemMap (the driver maps one allocation
 * per call) + N cuMemRelease + one cuMemSetAccess over the whole run, and
 * unmapped with one cuMemUnmap however many pages it spans.
 *
 * Errors: CUDA_ERROR_OUT_OF_MEMORY is VG_ERR_NOMEM (nothing stays mapped);
 * every other failure is VG_ERR_DEVICE with the driver's name and text.
 *
 * CUDA graphs. PyTorch never maps expandable segments for a graph's
 * private pool (alloc_block: "our checkpointing logic for private pools
 * doesn't support the expandable_segments_ structure yet"), so it has no
 * rule for a map during a capture; its rule for cudaMalloc is the relaxed
 * capture mode, and that is what map and range_reserve run in here, since
 * neither touches a stream. Its unmap synchronizes first (unmapHandles),
 * which a capture forbids, and it never releases cache during a capture:
 * here an unmap during a capture on the device answers VG_ERR_BUSY and
 * unmaps nothing, and a range release is deferred as a cudaFree is.
 */
#include "cuda_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

/* ------------------------------------------------------------------ */
/* The driver's types, as cuda.h declares them                          */
/* ------------------------------------------------------------------ */

typedef int cu_result;
typedef int cu_device;
typedef unsigned long long cu_deviceptr;
typedef unsigned long long cu_handle;

#define CU_ERROR_OUT_OF_MEMORY 2
#define CU_ATTRIBUTE_VMM_SUPPORTED 102 /* CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
#define CU_ALLOCATION_TYPE_PINNED 1
#define CU_LOCATION_TYPE_DEVICE 1
#define CU_ACCESS_READWRITE 3
#define CU_GRANULARITY_MINIMUM 0
/* The ABI asked for through cudaGetDriverEntryPointByVersion: none of
 * these functions has changed since (they date from 10.2). */
#define CU_ENTRY_VERSION 12000

typedef struct cu_location {
    int type;
    int id;
} cu_location;

typedef struct cu_allocation_prop {
    int type;
    int requested_handle_types;
    cu_location location;
    void *win32_metadata;
    struct {
        unsigned char compression_type;
        unsigned char gpu_direct_rdma_capable;
        unsigned short usage;
        unsigned char reserved[4];
    } flags;
} cu_allocation_prop;

typedef struct cu_access_desc {
    cu_location location;
    int flags;
} cu_access_desc;

_Static_assert(sizeof(cu_allocation_prop) == 32, "CUmemAllocationProp is 32 bytes");
_Static_assert(sizeof(cu_access_desc) == 12, "CUmemAccessDesc is 12 bytes");

static struct driver {
    cu_result (*DeviceGet)(cu_device *, int);
    cu_result (*DeviceGetAttribute)(int *, int, cu_device);
    cu_result (*MemGetAllocationGranularity)(size_t *, const cu_allocation_prop *, int);
    cu_result (*MemAddressReserve)(cu_deviceptr *, size_t, size_t, cu_deviceptr, unsigned long long);
    cu_result (*MemAddressFree)(cu_deviceptr, size_t);
    cu_result (*MemCreate)(cu_handle *, size_t, const cu_allocation_prop *, unsigned long long);
    cu_result (*MemRelease)(cu_handle);
    cu_result (*MemMap)(cu_deviceptr, size_t, size_t, cu_handle, unsigned long long);
    cu_result (*MemSetAccess)(cu_deviceptr, size_t, const cu_access_desc *, size_t);
    cu_result (*MemUnmap)(cu_deviceptr, size_t);
    cu_result (*GetErrorName)(cu_result, const char **);
    cu_result (*GetErrorString)(cu_result, const char **);
} drv;

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static char driver_missing[200];

/* ------------------------------------------------------------------ */
/* Finding the driver                                                  */
/* ------------------------------------------------------------------ */

typedef struct driver_source {
    const cuda_runtime_calls *rt;
    void *libcuda; /* an already-loaded libcuda.so.1, or NULL */
} driver_source;

static void *through_runtime(const cuda_runtime_calls *rt, const char *symbol)
{
    void *fn = NULL;
    int status = 0;
    cuda_error err = -1;
    if (rt->GetDriverEntryPointByVersion)
        err = rt->GetDriverEntryPointByVersion(symbol, &fn, CU_ENTRY_VERSION, 0, &status);
    else if (rt->GetDriverEntryPoint)
        err = rt->GetDriverEntryPoint(symbol, &fn, 0, &status);
    if (err != CUDA_SUCCESS) {
        (void)rt->GetLastError();
        return NULL;
    }
    return status == 0 ? fn : NULL; /* cudaDriverEntryPointSuccess */
}

static void *resolve(const driver_source *src, const char *symbol)
{
    void *fn = src->rt ? through_runtime(src->rt, symbol) : NULL;
    if (!fn && src->libcuda) fn = dlsym(src->libcuda, symbol);
    return fn;
}

#define DRIVER_CALL(field, symbol)                                                       \
    do {                                                                                 \
        *(void **)(&drv.field) = resolve(&src, symbol);                                  \
        if (!drv.field) {                                                                \
            snprintf(driver_missing, sizeof driver_missing,                              \
                     "the CUDA driver has no %s", symbol);                               \
            return;                                                                      \
        }                                                                                \
    } while (0)

static void load_driver(void)
{
    driver_source src = {vg__cuda_runtime(), dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)};
    int by_runtime = src.rt && (src.rt->GetDriverEntryPoint || src.rt->GetDriverEntryPointByVersion);
    if (!by_runtime) src.rt = NULL;
    if (!src.rt && !src.libcuda) {
        snprintf(driver_missing, sizeof driver_missing,
                 "no CUDA driver found (the runtime has no cudaGetDriverEntryPoint, and no "
                 "libcuda.so.1 is loaded)");
        return;
    }
    DRIVER_CALL(DeviceGet, "cuDeviceGet");
    DRIVER_CALL(DeviceGetAttribute, "cuDeviceGetAttribute");
    DRIVER_CALL(MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    DRIVER_CALL(MemAddressReserve, "cuMemAddressReserve");
    DRIVER_CALL(MemAddressFree, "cuMemAddressFree");
    DRIVER_CALL(MemCreate, "cuMemCreate");
    DRIVER_CALL(MemRelease, "cuMemRelease");
    DRIVER_CALL(MemMap, "cuMemMap");
    DRIVER_CALL(MemSetAccess, "cuMemSetAccess");
    DRIVER_CALL(MemUnmap, "cuMemUnmap");
    DRIVER_CALL(GetErrorName, "cuGetErrorName");
    DRIVER_CALL(GetErrorString, "cuGetErrorString");
}

/* ------------------------------------------------------------------ */
/* Errors                                                              */
/* ------------------------------------------------------------------ */

static void describe(vg_device_error *e, const char *call, cu_result err)
{
    const char *name = NULL, *text = NULL;
    if (drv.GetErrorName(err, &name) != CUDA_SUCCESS) name = NULL;
    if (drv.GetErrorString(err, &text) != CUDA_SUCCESS) text = NULL;
    e->code = err;
    snprintf(e->call, sizeof e->call, "%s", call);
    snprintf(e->name, sizeof e->name, "%s", name ? name : "CUDA_ERROR_UNKNOWN");
    snprintf(e->text, sizeof e->text, "%s", text ? text : "unknown error");
}

/* The words go to the calling thread's record (vg_device_last_error). */
static int failed(const char *call, cu_result err)
{
    if (err == CU_ERROR_OUT_OF_MEMORY) return VG_ERR_NOMEM;
    describe(vg_device_last_error(), call, err);
    return VG_ERR_DEVICE;
}

/* ------------------------------------------------------------------ */
/* Whether the device can                                              */
/* ------------------------------------------------------------------ */

static cu_allocation_prop page_prop(int device)
{
    cu_allocation_prop prop = {0};
    prop.type = CU_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

static void probe_failed(char *why, size_t n, const char *call, cu_result err)
{
    vg_device_error e;
    describe(&e, call, err);
    snprintf(why, n, "%s failed with %s: %s", e.call, e.name, e.text);
}

static int power_of_two(size_t n)
{
    return n && !(n & (n - 1));
}

void vg__cuda_vmm_probe(vg_device *dev, char *why, size_t n)
{
    dev->page_size = 0;
    snprintf(why, n, "%s", "");
    pthread_once(&driver_once, load_driver);
    if (driver_missing[0]) {
        snprintf(why, n, "%s", driver_missing);
        return;
    }
    cu_device d = 0;
    int supported = 0;
    size_t granularity = 0;
    cu_allocation_prop prop = page_prop(dev->index);
    cu_result err = drv.DeviceGet(&d, dev->index);
    if (err != CUDA_SUCCESS) return probe_failed(why, n, "cuDeviceGet", err);
    err = drv.DeviceGetAttribute(&supported, CU_ATTRIBUTE_VMM_SUPPORTED, d);
    if (err != CUDA_SUCCESS) return probe_failed(why, n, "cuDeviceGetAttribute", err);
    if (!supported) {
        snprintf(why, n, "device %d does not support virtual memory management", dev->index);
        return;
    }
    err = drv.MemGetAllocationGranularity(&granularity, &prop, CU_GRANULARITY_MINIMUM);
    if (err != CUDA_SUCCESS) return probe_failed(why, n, "cuMemGetAllocationGranularity", err);
    if (!power_of_two(granularity) || granularity % VG_ALIGN) {
        snprintf(why, n, "device %d has an allocation granularity of %zu bytes", dev->index,
                 granularity);
        return;
    }
    dev->page_size = granularity;
}

/* ------------------------------------------------------------------ */
/* Address space                                                       */
/* ------------------------------------------------------------------ */

int vg__cuda_range_reserve(vg_device *dev, size_t size, uintptr_t *addr)
{
    device_guard g;
    int rc = vg__cuda_enter(dev->index, &g);
    if (rc != VG_OK) return rc;
    vg__cuda_free_deferred(dev);
    int mode;
    int relaxed = vg__cuda_capture_relax(dev->index, &mode);
    cu_deviceptr p = 0;
    cu_result err = drv.MemAddressReserve(&p, size, dev->page_size, 0, 0);
    vg__cuda_capture_restore(relaxed, &mode);
    vg__cuda_leave(g);
    if (err != CUDA_SUCCESS) return failed("cuMemAddressReserve", err);
    *addr = (uintptr_t)p;
    return VG_OK;
}

void vg__cuda_address_free_now(uintptr_t addr, size_t size)
{
    (void)drv.MemAddressFree((cu_deviceptr)addr, size);
}

int vg__cuda_range_release(vg_device *dev, uintptr_t addr, size_t size)
{
    if (vg_capture_active(dev->index) && vg__cuda_defer_free(dev->index, addr, size) == 0) return VG_OK;
    device_guard g;
    int rc = vg__cuda_enter(dev->index, &g);
    if (rc != VG_OK) return rc;
    vg__cuda_free_deferred(dev);
    cu_result err = drv.MemAddressFree((cu_deviceptr)addr, size);
    vg__cuda_leave(g);
    return err == CUDA_SUCCESS ? VG_OK : failed("cuMemAddressFree", err);
}

/* ------------------------------------------------------------------ */
/* Pages                                                               */
/* ------------------------------------------------------------------ */

/* Unmaps [addr, addr+size), one page's mapping or a run of them, in one
 * call: cuMemUnmap must cover whole mappings ("the entire contiguous
 * address range that was mapped to": it cannot cut one), and a run of
 * adjacent ones is such a range, as NVIDIA's own growable-vector sample
 * unmaps all its handles with one cuMemUnmap. Pages are each their own
 * mapping, so any run of them qualifies. A refused call is taken to have
 * unmapped nothing (the driver checks the whole range before it changes
 * any of it), so that "all the pages or none" holds for the heap. */
static int unmap_range(uintptr_t addr, size_t size)
{
    cu_result err = drv.MemUnmap((cu_deviceptr)addr, size);
    return err == CUDA_SUCCESS ? VG_OK : failed("cuMemUnmap", err);
}

/* Undo of a map that failed part way: the pages it mapped go back, and
 * the error reported stays the first one. */
static void unmap_quietly(vg_device *dev, uintptr_t addr, size_t pages)
{
    if (pages == 0) return;
    vg_device_error *words = vg_device_last_error();
    vg_device_error first = *words;
    (void)unmap_range(addr, pages * dev->page_size);
    *words = first;
}

/* One page's memory, mapped at `at`; its handle released at once (the
 * mapping holds the memory). */
static int map_page(vg_device *dev, uintptr_t at, const cu_allocation_prop *prop)
{
    cu_handle h = 0;
    cu_result err = drv.MemCreate(&h, dev->page_size, prop, 0);
    if (err != CUDA_SUCCESS) return failed("cuMemCreate", err);
    err = drv.MemMap((cu_deviceptr)at, dev->page_size, 0, h, 0);
    cu_result released = drv.MemRelease(h);
    if (err != CUDA_SUCCESS) return failed("cuMemMap", err);
    if (released != CUDA_SUCCESS) {
        (void)drv.MemUnmap((cu_deviceptr)at, dev->page_size);
        return failed("cuMemRelease", released);
    }
    return VG_OK;
}

/* All the pages or none: a failure unmaps those mapped so far (the error
 * reported is the first one). */
static int map_run(vg_device *dev, uintptr_t addr, size_t size)
{
    cu_allocation_prop prop = page_prop(dev->index);
    size_t pages = size / dev->page_size;
    for (size_t i = 0; i < pages; i++) {
        int rc = map_page(dev, addr + i * dev->page_size, &prop);
        if (rc == VG_OK) continue;
        unmap_quietly(dev, addr, i);
        return rc;
    }
    cu_access_desc access = {{CU_LOCATION_TYPE_DEVICE, dev->index}, CU_ACCESS_READWRITE};
    cu_result err = drv.MemSetAccess((cu_deviceptr)addr, size, &access, 1);
    if (err == CUDA_SUCCESS) return VG_OK;
    int rc = failed("cuMemSetAccess", err);
    unmap_quietly(dev, addr, pages);
    return rc;
}

int vg__cuda_map(vg_device *dev, uintptr_t addr, size_t size)
{
    device_guard g;
    int rc = vg__cuda_enter(dev->index, &g);
    if (rc != VG_OK) return rc;
    vg__cuda_free_deferred(dev);
    int mode;
    int relaxed = vg__cuda_capture_relax(dev->index, &mode);
    rc = map_run(dev, addr, size);
    vg__cuda_capture_restore(relaxed, &mode);
    vg__cuda_leave(g);
    return rc;
}

int vg__cuda_unmap(vg_device *dev, uintptr_t addr, size_t size)
{
    if (vg_capture_active(dev->index)) return VG_ERR_BUSY; /* the pages stay mapped */
    device_guard g;
    int rc = vg__cuda_enter(dev->index, &g);
    if (rc != VG_OK) return rc;
    vg__cuda_free_deferred(dev);
    rc = unmap_range(addr, size); /* all the pages or none */
    vg__cuda_leave(g);
    return rc;
}
