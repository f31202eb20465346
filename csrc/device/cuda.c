/* The CUDA provider: segments from cudaMalloc / cudaFree, memory info from
 * cudaMemGetInfo, events for record_stream, cudaDeviceSynchronize before
 * cached memory that streams may still use is released.
 *
 * No CUDA toolkit is needed to build this: the few runtime functions used
 * are declared here and resolved when first needed, preferring the CUDA
 * runtime already loaded in the process (PyTorch's own), else the newest
 * libcudart.so.* the dynamic loader can find.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dl_iterate_phdr, RTLD_NOLOAD */
#endif
#include "vramguard/device.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* The runtime, resolved at load time                                  */
/* ------------------------------------------------------------------ */

typedef int cuda_error;
typedef void *cuda_event;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_READY 600
#define CUDA_EVENT_DISABLE_TIMING 2u

static struct cudart {
    cuda_error (*Malloc)(void **, size_t);
    cuda_error (*Free)(void *);
    cuda_error (*MemGetInfo)(size_t *, size_t *);
    cuda_error (*GetDevice)(int *);
    cuda_error (*SetDevice)(int);
    cuda_error (*GetDeviceCount)(int *);
    cuda_error (*DeviceSynchronize)(void);
    cuda_error (*EventCreateWithFlags)(cuda_event *, unsigned);
    cuda_error (*EventRecord)(cuda_event, void *);
    cuda_error (*EventQuery)(cuda_event);
    cuda_error (*EventDestroy)(cuda_event);
    cuda_error (*GetLastError)(void);
    const char *(*GetErrorString)(cuda_error);
} rt;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[640];
#define PATH_CHARS 256
static char load_source[PATH_CHARS + 32];

/* Find a libcudart already mapped into the process. */
static int find_loaded(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, "libcudart.so")) {
        snprintf(arg, PATH_CHARS, "%s", info->dlpi_name);
        return 1;
    }
    return 0;
}

static void *open_runtime(void)
{
    char loaded[PATH_CHARS] = "";
    dl_iterate_phdr(find_loaded, loaded);
    if (loaded[0]) {
        void *h = dlopen(loaded, RTLD_NOW | RTLD_NOLOAD);
        if (h) {
            snprintf(load_source, sizeof load_source, "%s (already loaded)", loaded);
            return h;
        }
    }
    static const char *const names[] = {
        "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(load_source, sizeof load_source, "%s", names[i]);
            return h;
        }
    }
    return NULL;
}

#define RESOLVE(field, symbol)                                                   \
    do {                                                                         \
        *(void **)(&rt.field) = dlsym(h, symbol);                                \
        if (!rt.field) {                                                         \
            snprintf(load_error, sizeof load_error,                              \
                     "the CUDA runtime %s lacks %s", load_source, symbol);       \
            return;                                                              \
        }                                                                        \
    } while (0)

static void load_runtime(void)
{
    void *h = open_runtime();
    if (!h) {
        snprintf(load_error, sizeof load_error,
                 "no CUDA runtime found: neither loaded in this process nor libcudart.so.13/12/11.0 "
                 "on the library path (install PyTorch with CUDA, or the CUDA runtime)");
        return;
    }
    RESOLVE(Malloc, "cudaMalloc");
    RESOLVE(Free, "cudaFree");
    RESOLVE(MemGetInfo, "cudaMemGetInfo");
    RESOLVE(GetDevice, "cudaGetDevice");
    RESOLVE(SetDevice, "cudaSetDevice");
    RESOLVE(GetDeviceCount, "cudaGetDeviceCount");
    RESOLVE(DeviceSynchronize, "cudaDeviceSynchronize");
    RESOLVE(EventCreateWithFlags, "cudaEventCreateWithFlags");
    RESOLVE(EventRecord, "cudaEventRecord");
    RESOLVE(EventQuery, "cudaEventQuery");
    RESOLVE(EventDestroy, "cudaEventDestroy");
    RESOLVE(GetLastError, "cudaGetLastError");
    RESOLVE(GetErrorString, "cudaGetErrorString");
}

const char *vg_cuda_load(void)
{
    pthread_once(&load_once, load_runtime);
    return load_error[0] ? load_error : NULL;
}

const char *vg_cuda_runtime_source(void)
{
    return vg_cuda_load() ? NULL : load_source;
}

int vg_cuda_device_count(void)
{
    int n = 0;
    if (vg_cuda_load() || rt.GetDeviceCount(&n) != CUDA_SUCCESS) {
        if (!vg_cuda_load()) rt.GetLastError();
        return 0;
    }
    return n;
}

/* ------------------------------------------------------------------ */
/* The provider                                                        */
/* ------------------------------------------------------------------ */

typedef struct vg_cuda {
    vg_device base;
    cuda_event *spare_events; /* recorded events cost a create only once */
    size_t nspare, spare_cap;
} vg_cuda;

/* Run on the heap's device, then put the caller's device back: cudaMalloc
 * and friends act on the current device, which may be another. */
typedef struct device_guard {
    int previous;
    int switched;
} device_guard;

static device_guard enter(const vg_device *dev)
{
    device_guard g = {0, 0};
    if (rt.GetDevice(&g.previous) == CUDA_SUCCESS && g.previous != dev->index) {
        g.switched = rt.SetDevice(dev->index) == CUDA_SUCCESS;
    }
    return g;
}

static void leave(device_guard g)
{
    if (g.switched) rt.SetDevice(g.previous);
}

static int cuda_reserve(vg_device *dev, size_t size, uintptr_t *addr)
{
    device_guard g = enter(dev);
    void *p = NULL;
    cuda_error err = rt.Malloc(&p, size);
    leave(g);
    if (err != CUDA_SUCCESS) {
        /* Clear the sticky "last error" so the next kernel launch does not
         * report our refused cudaMalloc as its own failure. */
        rt.GetLastError();
        return VG_ERR_NOMEM;
    }
    *addr = (uintptr_t)p;
    return VG_OK;
}

static void cuda_release(vg_device *dev, uintptr_t addr, size_t size)
{
    (void)size;
    device_guard g = enter(dev);
    if (rt.Free((void *)addr) != CUDA_SUCCESS) rt.GetLastError();
    leave(g);
}

static int cuda_mem_info(vg_device *dev, size_t *free_bytes, size_t *total_bytes)
{
    device_guard g = enter(dev);
    cuda_error err = rt.MemGetInfo(free_bytes, total_bytes);
    leave(g);
    if (err != CUDA_SUCCESS) {
        rt.GetLastError();
        return VG_ERR_DEVICE;
    }
    return VG_OK;
}

static void cuda_synchronize(vg_device *dev)
{
    device_guard g = enter(dev);
    if (rt.DeviceSynchronize() != CUDA_SUCCESS) rt.GetLastError();
    leave(g);
}

static int cuda_event_record(vg_device *dev, vg_stream_t stream, vg_event_t *ev)
{
    vg_cuda *c = (vg_cuda *)dev;
    device_guard g = enter(dev);
    cuda_event e = NULL;
    if (c->nspare) e = c->spare_events[--c->nspare];
    else if (rt.EventCreateWithFlags(&e, CUDA_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) e = NULL;
    int rc = VG_ERR_DEVICE;
    if (e && rt.EventRecord(e, (void *)stream) == CUDA_SUCCESS) {
        *ev = (vg_event_t)e;
        rc = VG_OK;
    } else {
        rt.GetLastError();
        if (e) rt.EventDestroy(e);
    }
    leave(g);
    return rc;
}

static int cuda_event_query(vg_device *dev, vg_event_t ev)
{
    (void)dev;
    cuda_error err = rt.EventQuery((cuda_event)ev);
    if (err == CUDA_SUCCESS) return 1;
    rt.GetLastError();
    /* Any error but "not ready" means the event will never complete; the
     * heap would otherwise hold the block forever. */
    return err != CUDA_ERROR_NOT_READY;
}

static void cuda_event_release(vg_device *dev, vg_event_t ev)
{
    vg_cuda *c = (vg_cuda *)dev;
    if (c->nspare == c->spare_cap) {
        size_t cap = c->spare_cap ? c->spare_cap * 2 : 64;
        cuda_event *grown = realloc(c->spare_events, cap * sizeof *grown);
        if (!grown) {
            rt.EventDestroy((cuda_event)ev);
            return;
        }
        c->spare_events = grown;
        c->spare_cap = cap;
    }
    c->spare_events[c->nspare++] = (cuda_event)ev;
}

static void cuda_destroy(vg_device *dev)
{
    vg_cuda *c = (vg_cuda *)dev;
    for (size_t i = 0; i < c->nspare; i++) rt.EventDestroy(c->spare_events[i]);
    free(c->spare_events);
    free(c);
}

static const vg_device_ops cuda_ops = {
    .name = "cuda",
    .reserve = cuda_reserve,
    .release = cuda_release,
    .mem_info = cuda_mem_info,
    .synchronize = cuda_synchronize,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_release = cuda_event_release,
    .destroy = cuda_destroy,
};

vg_device *vg_cuda_create(int device)
{
    if (vg_cuda_load() || device < 0) return NULL;
    vg_cuda *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.ops = &cuda_ops;
    c->base.index = device;
    return &c->base;
}
