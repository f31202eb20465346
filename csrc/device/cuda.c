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
 * description in the calling thread's record of it (vg_device_last_error:
 * thread-local, because synchronize runs without the heap's lock while
 * the other calls run under it). After a failed call the last error is
 * read (and so cleared, unless it is sticky), as PyTorch does, so that the
 * next kernel launch does not report our failure as its own.
 *
 * CUDA graphs: while an allocation into a private pool is underway on a
 * device (vg_capture_active), no call here may break a stream capture
 * there. Event queries answer "not finished" without asking the runtime,
 * events are recorded only once no capture is underway, synchronize does
 * nothing, a release is deferred to the first call on that device after
 * the capture, and cudaMalloc runs in the relaxed capture mode (PyTorch's
 * own allocator does the same: a captured cudaMalloc is legal, a captured
 * cudaFree or event query is not).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dl_iterate_phdr, RTLD_NOLOAD */
#endif
#include "cuda_internal.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* The runtime, resolved at load time                                  */
/* ------------------------------------------------------------------ */

typedef void *cuda_event;
#define CUDA_ERROR_MEMORY_ALLOCATION 2
#define CUDA_ERROR_NOT_READY 600
#define CUDA_EVENT_DISABLE_TIMING 2u
#define CUDA_CAPTURE_MODE_RELAXED 2

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
    /* Optional: NULL where the runtime lacks them. */
    cuda_error (*ThreadExchangeStreamCaptureMode)(int *); /* CUDA 10.1 */
    cuda_error (*StreamGetDevice)(void *, int *);          /* CUDA 12.8 */
} rt;
/* What cuda_vmm.c needs of the runtime. */
static cuda_runtime_calls rt_vmm;

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
    *(void **)(&rt.ThreadExchangeStreamCaptureMode) = dlsym(h, "cudaThreadExchangeStreamCaptureMode");
    *(void **)(&rt.StreamGetDevice) = dlsym(h, "cudaStreamGetDevice");
    rt_vmm.GetLastError = rt.GetLastError;
    *(void **)(&rt_vmm.GetDriverEntryPoint) = dlsym(h, "cudaGetDriverEntryPoint");
    *(void **)(&rt_vmm.GetDriverEntryPointByVersion) = dlsym(h, "cudaGetDriverEntryPointByVersion");
}

const cuda_runtime_calls *vg__cuda_runtime(void)
{
    return vg_cuda_load() ? NULL : &rt_vmm;
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

/* The words go to the calling thread's record (vg_device_last_error). */
static int failed(const char *call, cuda_error err)
{
    describe(vg_device_last_error(), call, err);
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

/* No cudaStreamGetDevice while a graph is captured: on an H200 with
 * PyTorch 2.11, make_graphed_callables' backward capture ended with
 * cudaErrorStreamCaptureInvalidated under vramguard and not under PyTorch's
 * allocator, and this lookup, made by autograd's thread in record_stream,
 * was the one call vramguard made there that PyTorch's allocator does not
 * (the fake's trace of the same program). The current device stands in,
 * as it does where the runtime has no such call. */
int vg_cuda_stream_device(vg_stream_t stream)
{
    int device = -1;
    if (vg_cuda_load()) return -1;
    if (rt.StreamGetDevice && !vg_capture_any()) {
        if (rt.StreamGetDevice((void *)stream, &device) == CUDA_SUCCESS) return device;
        (void)rt.GetLastError(); /* not supported, or a stream it does not know */
    }
    if (rt.GetDevice(&device) == CUDA_SUCCESS) return device;
    (void)rt.GetLastError();
    return -1;
}

/* ------------------------------------------------------------------ */
/* The provider                                                        */
/* ------------------------------------------------------------------ */

/* An event, and the device it was created on: it can be recorded only on
 * that device's streams, so released ones wait in per-device lists. */
typedef struct event_slot {
    cuda_event event;       /* NULL until first recorded */
    int device;
    vg_stream_t stream;     /* where it is to be recorded */
    int recorded;           /* 0: asked for during a capture, not yet recorded */
    uint64_t syncs_before;  /* vg_cuda.syncs_begun[device] when asked for */
    struct event_slot *next;
} event_slot;

typedef struct vg_cuda {
    vg_device base;
    event_slot *spare[VG_MAX_DEVICES]; /* a recorded event costs a create only once */
    /* Shared by synchronize, which runs without the heap's lock, and the
     * event calls, which run under it: atomics. */
    atomic_uint_least64_t recorded_on; /* devices with events recorded since the last synchronize */
    /* Per device: synchronizes begun, and the last begun one that ended
     * well. An event asked for before a synchronize began that ended well
     * is done, recorded or not. */
    atomic_uint_least64_t syncs_begun[VG_MAX_DEVICES];
    atomic_uint_least64_t syncs_done[VG_MAX_DEVICES];
    char vmm_unsupported[200]; /* why page_size is 0; "" when it is not */
} vg_cuda;

/* Run on a given device, then put the caller's device back: cudaMalloc
 * and friends act on the current device, which may be another. */

static int enter(int device, device_guard *g)
{
    g->switched = 0;
    cuda_error err = rt.GetDevice(&g->previous);
    if (err != CUDA_SUCCESS) return failed("cudaGetDevice", err);
    if (g->previous == device) return VG_OK;
    err = rt.SetDevice(device);
    if (err != CUDA_SUCCESS) {
        char call[32];
        snprintf(call, sizeof call, "cudaSetDevice(%d)", device);
        return failed(call, err);
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

int vg__cuda_enter(int device, device_guard *g)
{
    return enter(device, g);
}

void vg__cuda_leave(device_guard g)
{
    leave(g);
}

/* ------------------------------------------------------------------ */
/* Releases deferred during a capture                                  */
/* ------------------------------------------------------------------ */

/* Ranges released while a capture was underway on their device, freed by
 * the first call on that device after it. Per device, not per provider:
 * a pool's heap may be destroyed during another pool's capture. */
typedef struct deferred_free {
    uintptr_t addr;
    size_t range_size; /* 0: a cudaMalloc'd segment; else address space */
    struct deferred_free *next;
} deferred_free;

static struct deferred_frees {
    pthread_mutex_t lock;
    deferred_free *head[VG_MAX_DEVICES];
    atomic_int count[VG_MAX_DEVICES];
} deferred = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* 0 when the range is kept for later; -1 when there is no memory to note
 * it in (the caller frees it now, capture or not). */
int vg__cuda_defer_free(int device, uintptr_t addr, size_t range_size)
{
    deferred_free *d = malloc(sizeof *d);
    if (!d) return -1;
    d->addr = addr;
    d->range_size = range_size;
    pthread_mutex_lock(&deferred.lock);
    d->next = deferred.head[device];
    deferred.head[device] = d;
    atomic_fetch_add(&deferred.count[device], 1);
    pthread_mutex_unlock(&deferred.lock);
    return 0;
}

static deferred_free *take_deferred(int device)
{
    pthread_mutex_lock(&deferred.lock);
    deferred_free *list = deferred.head[device];
    deferred.head[device] = NULL;
    atomic_store(&deferred.count[device], 0);
    pthread_mutex_unlock(&deferred.lock);
    return list;
}

/* The device's current device is `dev->index` (the caller entered it).
 * A range the runtime refuses now is lost either way: the heap's books
 * let go of it when it was released. */
void vg__cuda_free_deferred(vg_device *dev)
{
    if (!atomic_load_explicit(&deferred.count[dev->index], memory_order_relaxed)) return;
    if (vg_capture_active(dev->index)) return;
    deferred_free *d = take_deferred(dev->index);
    while (d) {
        deferred_free *next = d->next;
        if (d->range_size) vg__cuda_address_free_now(d->addr, d->range_size);
        else if (rt.Free((void *)d->addr) != CUDA_SUCCESS) (void)rt.GetLastError();
        free(d);
        d = next;
    }
}

size_t vg_cuda_deferred_frees(int device)
{
    if (device < 0 || device >= VG_MAX_DEVICES) return 0;
    return (size_t)atomic_load(&deferred.count[device]);
}

/* ------------------------------------------------------------------ */
/* Memory                                                              */
/* ------------------------------------------------------------------ */

/* A cudaMalloc during a capture is legal in the relaxed mode only; the
 * mode is the calling thread's, so it is put back at once. */
int vg__cuda_capture_relax(int device, int *mode)
{
    *mode = CUDA_CAPTURE_MODE_RELAXED;
    return vg_capture_active(device) && rt.ThreadExchangeStreamCaptureMode &&
           rt.ThreadExchangeStreamCaptureMode(mode) == CUDA_SUCCESS;
}

void vg__cuda_capture_restore(int relaxed, int *mode)
{
    if (relaxed && rt.ThreadExchangeStreamCaptureMode(mode) != CUDA_SUCCESS) (void)rt.GetLastError();
}

static cuda_error malloc_capture_safe(int device, void **p, size_t size)
{
    int mode;
    int relaxed = vg__cuda_capture_relax(device, &mode);
    cuda_error err = rt.Malloc(p, size);
    vg__cuda_capture_restore(relaxed, &mode);
    return err;
}

static int cuda_reserve(vg_device *dev, size_t size, uintptr_t *addr)
{
    device_guard g;
    int rc = enter(dev->index, &g);
    if (rc != VG_OK) return rc;
    vg__cuda_free_deferred(dev);
    void *p = NULL;
    cuda_error err = malloc_capture_safe(dev->index, &p, size);
    leave(g);
    if (err == CUDA_ERROR_MEMORY_ALLOCATION) {
        (void)rt.GetLastError(); /* as PyTorch does for an OOM */
        return VG_ERR_NOMEM;
    }
    if (err != CUDA_SUCCESS) return failed("cudaMalloc", err);
    *addr = (uintptr_t)p;
    return VG_OK;
}

static int cuda_release(vg_device *dev, uintptr_t addr, size_t size)
{
    (void)size;
    if (vg_capture_active(dev->index) && vg__cuda_defer_free(dev->index, addr, 0) == 0) return VG_OK;
    device_guard g;
    int rc = enter(dev->index, &g);
    if (rc != VG_OK) return rc;
    vg__cuda_free_deferred(dev);
    cuda_error err = rt.Free((void *)addr);
    leave(g);
    return err == CUDA_SUCCESS ? VG_OK : failed("cudaFree", err);
}

static int cuda_mem_info(vg_device *dev, size_t *free_bytes, size_t *total_bytes)
{
    device_guard g;
    int rc = enter(dev->index, &g);
    if (rc != VG_OK) return rc;
    vg__cuda_free_deferred(dev);
    cuda_error err = rt.MemGetInfo(free_bytes, total_bytes);
    leave(g);
    return err == CUDA_SUCCESS ? VG_OK : failed("cudaMemGetInfo", err);
}

/* ------------------------------------------------------------------ */
/* Synchronize and events                                              */
/* ------------------------------------------------------------------ */

static int wait_for_one(int device)
{
    device_guard g;
    int rc = enter(device, &g);
    if (rc != VG_OK) return rc;
    cuda_error err = rt.DeviceSynchronize();
    leave(g);
    return err == CUDA_SUCCESS ? VG_OK : failed("cudaDeviceSynchronize", err);
}

static int synchronize_one(vg_cuda *c, int device)
{
    uint64_t begun = atomic_fetch_add(&c->syncs_begun[device], 1) + 1;
    int rc = wait_for_one(device);
    if (rc == VG_OK) atomic_store(&c->syncs_done[device], begun);
    return rc;
}

/* Its own device, and each device it recorded events on: then every event
 * it handed out before queries done, as the heap expects. During a capture
 * on one of them nothing is waited for (a synchronize would end the
 * capture with an error): events there go on answering "not finished",
 * and the answer is VG_ERR_BUSY, so that the heap frees nothing on the
 * strength of it. The devices are taken from recorded_on at the start, so
 * that one recorded on meanwhile stays for the next synchronize; those not
 * waited for go back. */
static int cuda_synchronize(vg_device *dev)
{
    vg_cuda *c = (vg_cuda *)dev;
    uint64_t devices = atomic_exchange(&c->recorded_on, 0) | (uint64_t)1 << dev->index;
    uint64_t left = 0;
    int first_error = VG_OK;
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        if (!(devices >> d & 1)) continue;
        int rc = vg_capture_active(d) ? VG_ERR_BUSY : synchronize_one(c, d);
        if (rc == VG_OK) continue;
        left |= (uint64_t)1 << d;
        if (first_error == VG_OK || first_error == VG_ERR_BUSY) first_error = rc;
    }
    if (left) atomic_fetch_or(&c->recorded_on, left & ~((uint64_t)1 << dev->index));
    return first_error;
}

/* A spare slot of `device`, or a new one; its event is created when first
 * recorded. */
static event_slot *take_event(vg_cuda *c, int device)
{
    event_slot *s = c->spare[device];
    if (s) {
        c->spare[device] = s->next;
        return s;
    }
    s = calloc(1, sizeof *s);
    if (s) s->device = device;
    return s;
}

static void put_event(vg_cuda *c, event_slot *s)
{
    s->next = c->spare[s->device];
    c->spare[s->device] = s;
}

/* Under the stream's device: the default stream (handle 0) is the current
 * device's, and an event records only on streams of the device it was
 * created on. */
static int record_now(event_slot *s)
{
    device_guard g;
    int rc = enter(s->device, &g);
    if (rc != VG_OK) return rc;
    cuda_error err = CUDA_SUCCESS;
    if (!s->event) err = rt.EventCreateWithFlags(&s->event, CUDA_EVENT_DISABLE_TIMING);
    if (err != CUDA_SUCCESS) {
        s->event = NULL;
        rc = failed("cudaEventCreateWithFlags", err);
    } else if ((err = rt.EventRecord(s->event, (void *)s->stream)) != CUDA_SUCCESS) {
        rc = failed("cudaEventRecord", err);
    } else {
        s->recorded = 1;
    }
    leave(g);
    return rc;
}

static int capturing(const vg_device *dev, const event_slot *s)
{
    return vg_capture_active(s->device) || vg_capture_active(dev->index);
}

static int cuda_event_record(vg_device *dev, int device, vg_stream_t stream, vg_event_t *ev)
{
    vg_cuda *c = (vg_cuda *)dev;
    if (device < 0 || device >= VG_MAX_DEVICES) return VG_ERR_ARG;
    /* Even if recording fails, the synchronize the heap falls back on must
     * cover this device. */
    atomic_fetch_or(&c->recorded_on, (uint64_t)1 << device);
    event_slot *s = take_event(c, device);
    if (!s) return VG_ERR_NOMEM;
    s->stream = stream;
    s->recorded = 0;
    s->syncs_before = atomic_load(&c->syncs_begun[device]);
    /* During a capture the record waits for the first query after it, as
     * PyTorch's allocator defers its events until no capture is underway. */
    int rc = capturing(dev, s) ? VG_OK : record_now(s);
    if (rc == VG_OK) *ev = (vg_event_t)s;
    else put_event(c, s);
    return rc;
}

/* cudaEventQuery works whatever the current device. */
static int cuda_event_query(vg_device *dev, vg_event_t ev)
{
    event_slot *s = (event_slot *)ev;
    vg_cuda *c = (vg_cuda *)dev;
    if (capturing(dev, s)) return 0; /* a query would break the capture */
    if (!s->recorded) {
        /* Asked for during a capture: a synchronize of its device begun
         * since has waited for the work. Else record it now; if that
         * fails, "not finished" (no device wait on the allocation path):
         * the heap's next synchronize, which covers this device, ends it. */
        if (atomic_load(&c->syncs_done[s->device]) > s->syncs_before) return 1;
        if (record_now(s) != VG_OK) return 0;
    }
    cuda_error err = rt.EventQuery(s->event);
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
            if (s->event && rt.EventDestroy(s->event) != CUDA_SUCCESS) (void)rt.GetLastError();
            free(s);
        }
    }
    free(c);
}

#define CUDA_OPS                              \
    .reserve = cuda_reserve,                  \
    .release = cuda_release,                  \
    .mem_info = cuda_mem_info,                \
    .synchronize = cuda_synchronize,          \
    .event_record = cuda_event_record,        \
    .event_query = cuda_event_query,          \
    .event_release = cuda_event_release,      \
    .destroy = cuda_destroy

static const vg_device_ops cuda_ops = {CUDA_OPS};
/* Where the device and the driver support virtual memory (cuda_vmm.c). */
static const vg_device_ops cuda_vmm_ops = {
    CUDA_OPS,
    .range_reserve = vg__cuda_range_reserve,
    .range_release = vg__cuda_range_release,
    .map = vg__cuda_map,
    .unmap = vg__cuda_unmap,
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
    c->base.index = device;
    vg__cuda_vmm_probe(&c->base, c->vmm_unsupported, sizeof c->vmm_unsupported);
    c->base.ops = c->base.page_size ? &cuda_vmm_ops : &cuda_ops;
    return &c->base;
}

const char *vg_cuda_vmm_unsupported(const vg_device *dev)
{
    const vg_cuda *c = (const vg_cuda *)dev;
    return dev->page_size ? NULL : c->vmm_unsupported;
}
