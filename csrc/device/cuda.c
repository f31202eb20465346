/* The CUDA provider: segments from cudaMalloc / cudaFree, memory info from
 * cudaMemGetInfo, events for record_stream, cudaDeviceSynchronize before
 * cached memory that streams may still use is released.
 *
 * No CUDA toolkit is needed to build this: the few runtime functions used
 * are declared here and resolved when first needed, from the CUDA runtime
 * already loaded in the process (PyTorch's own, whatever its file name),
 * else the newest libcudart.so.* the dynamic loader can find. A process
 * must not hold two runtimes: each keeps its own state (current device,
 * last error), and memory or streams of one are not the other's.
 *
 * Errors: only cudaErrorMemoryAllocation is an out-of-memory (VG_ERR_NOMEM,
 * worth releasing cache for). Every other failure of a call on the path,
 * cudaSetDevice included, is VG_ERR_DEVICE with the runtime's own name and
 * description in vg_device.error. After a failed call the last error is
 * read (and so cleared, unless it is sticky), as PyTorch does, so that the
 * next kernel launch does not report our failure as its own.
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
#define CUDA_ERROR_MEMORY_ALLOCATION 2
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
    const char *(*GetErrorName)(cuda_error);
    const char *(*GetErrorString)(cuda_error);
} rt;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[640];
#define PATH_CHARS 256
static char load_source[PATH_CHARS + 32];

/* ------------------------------------------------------------------ */
/* Finding it                                                          */
/* ------------------------------------------------------------------ */

static int all_digits(const char *s, size_t n)
{
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

/* ".<digits>" repeated, to the end: the version after ".so". */
static int version_suffix(const char *s)
{
    while (*s) {
        if (*s != '.') return 0;
        size_t n = strspn(s + 1, "0123456789");
        if (!all_digits(s + 1, n)) return 0;
        s += 1 + n;
    }
    return 1;
}

int vg_cuda_runtime_name_rank(const char *path)
{
    if (!path) return 0;
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    static const char stem[] = "libcudart";
    if (strncmp(name, stem, sizeof stem - 1) != 0) return 0;
    const char *p = name + sizeof stem - 1;
    if (*p == '-') { /* libcudart-9335f6a2.so.11.0: older PyTorch wheels */
        size_t n = strspn(p + 1, "0123456789abcdefABCDEF");
        if (n == 0) return 0;
        p += 1 + n;
    }
    if (strncmp(p, ".so", 3) != 0) return 0;
    p += 3;
    if (*p == '\0') return 1;
    return version_suffix(p) ? 2 : 0;
}

typedef struct runtime_search {
    char path[PATH_CHARS];
    int rank;
} runtime_search;

/* The best-ranked libcudart already mapped, the first of equals. */
static int visit_loaded(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    runtime_search *found = arg;
    int rank = vg_cuda_runtime_name_rank(info->dlpi_name);
    if (rank > found->rank && strlen(info->dlpi_name) < PATH_CHARS) {
        snprintf(found->path, PATH_CHARS, "%s", info->dlpi_name);
        found->rank = rank;
    }
    return 0;
}

static runtime_search find_loaded(void)
{
    runtime_search found = {"", 0};
    dl_iterate_phdr(visit_loaded, &found);
    return found;
}

int vg_cuda_runtime_present(void)
{
    return find_loaded().rank > 0;
}

static void *open_runtime(void)
{
    runtime_search loaded = find_loaded();
    if (loaded.rank) {
        void *h = dlopen(loaded.path, RTLD_NOW | RTLD_NOLOAD);
        if (h) {
            snprintf(load_source, sizeof load_source, "%s (already loaded)", loaded.path);
            return h;
        }
    }
    /* None in the process: nothing can clash with the one loaded here. */
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
    RESOLVE(GetErrorName, "cudaGetErrorName");
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

/* ------------------------------------------------------------------ */
/* Errors                                                              */
/* ------------------------------------------------------------------ */

/* The runtime's words for `err`. Reading the last error afterwards clears
 * it unless it is sticky; a sticky error stays, and is reported as itself
 * by every call after, which is what the user must see. */
static void describe(vg_device_error *e, const char *call, cuda_error err)
{
    const char *name = rt.GetErrorName(err);
    const char *text = rt.GetErrorString(err);
    e->code = err;
    snprintf(e->call, sizeof e->call, "%s", call);
    snprintf(e->name, sizeof e->name, "%s", name ? name : "cudaErrorUnknown");
    snprintf(e->text, sizeof e->text, "%s", text ? text : "unknown error");
    (void)rt.GetLastError();
}

static int failed(vg_device *dev, const char *call, cuda_error err)
{
    describe(&dev->error, call, err);
    return VG_ERR_DEVICE;
}

int vg_cuda_device_count(void)
{
    int n = 0;
    if (vg_cuda_load()) return 0;
    if (rt.GetDeviceCount(&n) != CUDA_SUCCESS) {
        (void)rt.GetLastError();
        return 0;
    }
    return n;
}

/* ------------------------------------------------------------------ */
/* The provider                                                        */
/* ------------------------------------------------------------------ */

/* An event, and the device it was created on: it can be recorded only on
 * that device's streams, so released ones wait in per-device lists. */
typedef struct event_slot {
    cuda_event event;
    int device;
    struct event_slot *next;
} event_slot;

typedef struct vg_cuda {
    vg_device base;
    event_slot *spare[VG_MAX_DEVICES]; /* a recorded event costs a create only once */
    uint64_t recorded_on; /* devices with events recorded since the last synchronize */
} vg_cuda;

/* Run on a given device, then put the caller's device back: cudaMalloc
 * and friends act on the current device, which may be another. */
typedef struct device_guard {
    int previous;
    int switched;
} device_guard;

static int enter(vg_device *dev, int device, device_guard *g)
{
    g->switched = 0;
    cuda_error err = rt.GetDevice(&g->previous);
    if (err != CUDA_SUCCESS) return failed(dev, "cudaGetDevice", err);
    if (g->previous == device) return VG_OK;
    err = rt.SetDevice(device);
    if (err != CUDA_SUCCESS) {
        char call[32];
        snprintf(call, sizeof call, "cudaSetDevice(%d)", device);
        return failed(dev, call, err);
    }
    g->switched = 1;
    return VG_OK;
}

/* As PyTorch's device guard does, a failure to switch back is not the
 * call's failure; its last error is cleared all the same. */
static void leave(device_guard g)
{
    if (g.switched && rt.SetDevice(g.previous) != CUDA_SUCCESS) (void)rt.GetLastError();
}

static int cuda_reserve(vg_device *dev, size_t size, uintptr_t *addr)
{
    device_guard g;
    int rc = enter(dev, dev->index, &g);
    if (rc != VG_OK) return rc;
    void *p = NULL;
    cuda_error err = rt.Malloc(&p, size);
    leave(g);
    if (err == CUDA_ERROR_MEMORY_ALLOCATION) {
        (void)rt.GetLastError(); /* as PyTorch does for an OOM */
        return VG_ERR_NOMEM;
    }
    if (err != CUDA_SUCCESS) return failed(dev, "cudaMalloc", err);
    *addr = (uintptr_t)p;
    return VG_OK;
}

static int cuda_release(vg_device *dev, uintptr_t addr, size_t size)
{
    (void)size;
    device_guard g;
    int rc = enter(dev, dev->index, &g);
    if (rc != VG_OK) return rc;
    cuda_error err = rt.Free((void *)addr);
    leave(g);
    return err == CUDA_SUCCESS ? VG_OK : failed(dev, "cudaFree", err);
}

static int cuda_mem_info(vg_device *dev, size_t *free_bytes, size_t *total_bytes)
{
    device_guard g;
    int rc = enter(dev, dev->index, &g);
    if (rc != VG_OK) return rc;
    cuda_error err = rt.MemGetInfo(free_bytes, total_bytes);
    leave(g);
    return err == CUDA_SUCCESS ? VG_OK : failed(dev, "cudaMemGetInfo", err);
}

static int synchronize_one(vg_device *dev, int device)
{
    device_guard g;
    int rc = enter(dev, device, &g);
    if (rc != VG_OK) return rc;
    cuda_error err = rt.DeviceSynchronize();
    leave(g);
    return err == CUDA_SUCCESS ? VG_OK : failed(dev, "cudaDeviceSynchronize", err);
}

/* Its own device, and each device it recorded events on: then every event
 * it handed out queries done, as the heap expects. */
static int cuda_synchronize(vg_device *dev)
{
    vg_cuda *c = (vg_cuda *)dev;
    uint64_t devices = c->recorded_on | (uint64_t)1 << dev->index;
    int first_error = VG_OK;
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        if (!(devices >> d & 1)) continue;
        int rc = synchronize_one(dev, d);
        if (rc == VG_OK) c->recorded_on &= ~((uint64_t)1 << d);
        else if (first_error == VG_OK) first_error = rc;
    }
    return first_error;
}

/* A spare event of `device`, or a new one created there (the caller has
 * made `device` current). */
static int take_event(vg_cuda *c, int device, event_slot **out)
{
    event_slot *s = c->spare[device];
    if (s) {
        c->spare[device] = s->next;
        *out = s;
        return VG_OK;
    }
    s = malloc(sizeof *s);
    if (!s) return VG_ERR_NOMEM;
    cuda_error err = rt.EventCreateWithFlags(&s->event, CUDA_EVENT_DISABLE_TIMING);
    if (err != CUDA_SUCCESS) {
        free(s);
        return failed(&c->base, "cudaEventCreateWithFlags", err);
    }
    s->device = device;
    *out = s;
    return VG_OK;
}

static void put_event(vg_cuda *c, event_slot *s)
{
    s->next = c->spare[s->device];
    c->spare[s->device] = s;
}

/* Under the stream's device: the default stream (handle 0) is the current
 * device's, and an event records only on streams of the device it was
 * created on. */
static int cuda_event_record(vg_device *dev, int device, vg_stream_t stream, vg_event_t *ev)
{
    vg_cuda *c = (vg_cuda *)dev;
    if (device < 0 || device >= VG_MAX_DEVICES) return VG_ERR_ARG;
    /* Even if recording fails, the synchronize the heap falls back on must
     * cover this device. */
    c->recorded_on |= (uint64_t)1 << device;
    device_guard g;
    int rc = enter(dev, device, &g);
    if (rc != VG_OK) return rc;
    event_slot *s = NULL;
    rc = take_event(c, device, &s);
    if (rc == VG_OK) {
        cuda_error err = rt.EventRecord(s->event, (void *)stream);
        if (err == CUDA_SUCCESS) {
            *ev = (vg_event_t)s;
        } else {
            put_event(c, s);
            rc = failed(dev, "cudaEventRecord", err);
        }
    }
    leave(g);
    return rc;
}

/* cudaEventQuery works whatever the current device. */
static int cuda_event_query(vg_device *dev, vg_event_t ev)
{
    (void)dev;
    cuda_error err = rt.EventQuery(((event_slot *)ev)->event);
    if (err == CUDA_SUCCESS) return 1;
    (void)rt.GetLastError();
    /* Any error but "not ready" means the event will never complete; the
     * heap would otherwise hold the block forever. */
    return err != CUDA_ERROR_NOT_READY;
}

static void cuda_event_release(vg_device *dev, vg_event_t ev)
{
    put_event((vg_cuda *)dev, (event_slot *)ev);
}

static void cuda_destroy(vg_device *dev)
{
    vg_cuda *c = (vg_cuda *)dev;
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        while (c->spare[d]) {
            event_slot *s = c->spare[d];
            c->spare[d] = s->next;
            if (rt.EventDestroy(s->event) != CUDA_SUCCESS) (void)rt.GetLastError();
            free(s);
        }
    }
    free(c);
}

static const vg_device_ops cuda_ops = {
    .reserve = cuda_reserve,
    .release = cuda_release,
    .mem_info = cuda_mem_info,
    .synchronize = cuda_synchronize,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_release = cuda_event_release,
    .destroy = cuda_destroy,
};

/* Whether `device` exists, in the runtime's words when it cannot say. */
static int check_device(int device, char *why, size_t n)
{
    const char *missing = vg_cuda_load();
    if (missing) {
        snprintf(why, n, "%s", missing);
        return VG_ERR_DEVICE;
    }
    int count = 0;
    cuda_error err = rt.GetDeviceCount(&count);
    if (err != CUDA_SUCCESS) {
        vg_device_error e;
        describe(&e, "cudaGetDeviceCount", err);
        snprintf(why, n, "%s failed with %s: %s", e.call, e.name, e.text);
        return VG_ERR_DEVICE;
    }
    if (device < 0 || device >= count || device >= VG_MAX_DEVICES) {
        snprintf(why, n, "it does not exist (%d visible)", count);
        return VG_ERR_DEVICE;
    }
    return VG_OK;
}

vg_device *vg_cuda_create(int device, char *why, size_t n)
{
    if (check_device(device, why, n) != VG_OK) return NULL;
    vg_cuda *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(why, n, "out of host memory");
        return NULL;
    }
    c->base.ops = &cuda_ops;
    c->base.index = device;
    return &c->base;
}
