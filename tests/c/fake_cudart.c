/* A fake CUDA runtime, just what the CUDA provider calls, for its C test
 * (test_cuda.c): two devices with a capacity each, a current device, a
 * last error (sticky or not), events bound to the device they were created
 * on, streams bound to a device (handle 0: the current device's default
 * stream), and knobs to make calls fail with chosen errors. Built as a
 * shared object named as older PyTorch wheels name their runtime, so that
 * the provider must find it already loaded whatever its name.
 *
 * Single-threaded, as the test is, except for what one test of threads
 * failing at once needs: the last error is per thread, as the real
 * runtime's is, and the persistent failures of cudaMemGetInfo and
 * cudaDeviceSynchronize only read the state. Error numbers, names and
 * descriptions are the real runtime's. */
#include "fake_cudart.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define DEVICES 2
#define MAX_SEGMENTS 256

enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    MEMORY_ALLOCATION = 2,
    INSUFFICIENT_DRIVER = 35,
    INVALID_DEVICE = 101,
    INVALID_RESOURCE_HANDLE = 400,
    NOT_READY = 600,
    ILLEGAL_ADDRESS = 700,
};

typedef struct fake_event {
    int device;          /* created on */
    int recorded_device; /* -1 until recorded */
    int pending;
} fake_event;

static struct fake_state {
    int current;
    int sticky;                  /* once set, every call returns it */
    int malloc_error;            /* the next cudaMalloc's */
    int malloc_sticky;
    int count_error;             /* cudaGetDeviceCount's */
    int mem_info_error;          /* cudaMemGetInfo's */
    int sync_error;              /* cudaDeviceSynchronize's */
    int set_device_error[DEVICES];
    int events_pending;          /* new records wait for fake_complete */
    size_t capacity, used[DEVICES];
    uintptr_t next_addr[DEVICES];
    unsigned mallocs[DEVICES], syncs[DEVICES];
    struct { uintptr_t addr; size_t size; int device; } segs[MAX_SEGMENTS];
    fake_event *events[64];
    int nevents;
    fake_record last_record;
    unsigned frees, event_queries, event_records;
    int capture_mode;          /* this (single) thread's, cudaStreamCaptureModeGlobal = 0 */
    int malloc_capture_mode;   /* the mode the last cudaMalloc ran in */
} f = {.capacity = (size_t)64 << 20};

static _Thread_local int last_error;

static int fail(int err)
{
    last_error = err;
    return err;
}

/* ------------------------------------------------------------------ */
/* Knobs                                                               */
/* ------------------------------------------------------------------ */

void fake_reset(void)
{
    for (int i = 0; i < f.nevents; i++) free(f.events[i]);
    size_t capacity = f.capacity;
    f = (struct fake_state){0};
    f.capacity = capacity;
    last_error = SUCCESS;
}

void fake_fail_malloc(int err, int sticky)
{
    f.malloc_error = err;
    f.malloc_sticky = sticky;
}

void fake_fail_set_device(int device, int err)
{
    f.set_device_error[device] = err;
}

void fake_fail_device_count(int err)
{
    f.count_error = err;
}

void fake_fail_mem_info(int err)
{
    f.mem_info_error = err;
}

void fake_fail_synchronize(int err)
{
    f.sync_error = err;
}

void fake_events_wait(int on)
{
    f.events_pending = on;
}

void fake_complete(int device)
{
    for (int i = 0; i < f.nevents; i++)
        if (f.events[i]->recorded_device == device) f.events[i]->pending = 0;
}

unsigned fake_mallocs(int device)
{
    return f.mallocs[device];
}

unsigned fake_syncs(int device)
{
    return f.syncs[device];
}

unsigned fake_frees(void)
{
    return f.frees;
}

unsigned fake_event_queries(void)
{
    return f.event_queries;
}

unsigned fake_event_records(void)
{
    return f.event_records;
}

int fake_capture_mode(void)
{
    return f.capture_mode;
}

int fake_malloc_capture_mode(void)
{
    return f.malloc_capture_mode;
}

size_t fake_used(int device)
{
    return f.used[device];
}

int fake_current(void)
{
    return f.current;
}

fake_record fake_last_record(void)
{
    return f.last_record;
}

/* A stream handle of a device: (device + 1) in the high half. */
uintptr_t fake_stream(int device, unsigned n)
{
    return ((uintptr_t)(device + 1) << 32) | n;
}

static int stream_device(void *stream)
{
    uintptr_t s = (uintptr_t)stream;
    return s ? (int)(s >> 32) - 1 : f.current;
}

/* ------------------------------------------------------------------ */
/* The runtime                                                         */
/* ------------------------------------------------------------------ */

int cudaGetLastError(void);
const char *cudaGetErrorName(int err);
const char *cudaGetErrorString(int err);
int cudaGetDeviceCount(int *n);
int cudaGetDevice(int *d);
int cudaSetDevice(int d);
int cudaMalloc(void **p, size_t size);
int cudaFree(void *p);
int cudaMemGetInfo(size_t *free_bytes, size_t *total);
int cudaDeviceSynchronize(void);
int cudaEventCreateWithFlags(void **ev, unsigned flags);
int cudaEventRecord(void *ev, void *stream);
int cudaEventQuery(void *ev);
int cudaEventDestroy(void *ev);
int cudaThreadExchangeStreamCaptureMode(int *mode);
int cudaStreamGetDevice(void *stream, int *device);

int cudaGetLastError(void)
{
    int err = last_error;
    if (!f.sticky) last_error = SUCCESS;
    return err;
}

const char *cudaGetErrorName(int err)
{
    switch (err) {
    case SUCCESS: return "cudaSuccess";
    case INVALID_VALUE: return "cudaErrorInvalidValue";
    case MEMORY_ALLOCATION: return "cudaErrorMemoryAllocation";
    case INSUFFICIENT_DRIVER: return "cudaErrorInsufficientDriver";
    case INVALID_DEVICE: return "cudaErrorInvalidDevice";
    case INVALID_RESOURCE_HANDLE: return "cudaErrorInvalidResourceHandle";
    case NOT_READY: return "cudaErrorNotReady";
    case ILLEGAL_ADDRESS: return "cudaErrorIllegalAddress";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(int err)
{
    switch (err) {
    case SUCCESS: return "no error";
    case INVALID_VALUE: return "invalid argument";
    case MEMORY_ALLOCATION: return "out of memory";
    case INSUFFICIENT_DRIVER: return "CUDA driver version is insufficient for CUDA runtime version";
    case INVALID_DEVICE: return "invalid device ordinal";
    case INVALID_RESOURCE_HANDLE: return "invalid resource handle";
    case NOT_READY: return "device not ready";
    case ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
    default: return "unknown error";
    }
}

int cudaGetDeviceCount(int *n)
{
    if (f.count_error) return fail(f.count_error);
    *n = DEVICES;
    return SUCCESS;
}

int cudaGetDevice(int *d)
{
    *d = f.current;
    return SUCCESS;
}

int cudaSetDevice(int d)
{
    if (d < 0 || d >= DEVICES) return fail(INVALID_DEVICE);
    if (f.set_device_error[d]) return fail(f.set_device_error[d]);
    f.current = d;
    return SUCCESS;
}

int cudaMalloc(void **p, size_t size)
{
    if (f.sticky) return fail(f.sticky);
    if (f.malloc_error) {
        int err = f.malloc_error;
        if (f.malloc_sticky) f.sticky = err;
        f.malloc_error = 0;
        return fail(err);
    }
    int d = f.current;
    f.malloc_capture_mode = f.capture_mode;
    if (size > f.capacity - f.used[d]) return fail(MEMORY_ALLOCATION);
    for (int i = 0; i < MAX_SEGMENTS; i++) {
        if (f.segs[i].addr) continue;
        if (!f.next_addr[d]) f.next_addr[d] = (uintptr_t)(d + 1) << 40;
        f.segs[i].addr = f.next_addr[d];
        f.segs[i].size = size;
        f.segs[i].device = d;
        f.next_addr[d] += size;
        f.used[d] += size;
        f.mallocs[d]++;
        *p = (void *)f.segs[i].addr;
        return SUCCESS;
    }
    return fail(MEMORY_ALLOCATION);
}

int cudaFree(void *p)
{
    if (f.sticky) return fail(f.sticky);
    for (int i = 0; i < MAX_SEGMENTS; i++) {
        if (f.segs[i].addr != (uintptr_t)p) continue;
        if (f.segs[i].device != f.current) return fail(INVALID_VALUE);
        f.used[f.current] -= f.segs[i].size;
        f.segs[i].addr = 0;
        f.frees++;
        return SUCCESS;
    }
    return fail(INVALID_VALUE);
}

int cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    if (f.sticky) return fail(f.sticky);
    if (f.mem_info_error) return fail(f.mem_info_error);
    *free_bytes = f.capacity - f.used[f.current];
    *total = f.capacity;
    return SUCCESS;
}

int cudaDeviceSynchronize(void)
{
    if (f.sticky) return fail(f.sticky);
    if (f.sync_error) return fail(f.sync_error);
    f.syncs[f.current]++;
    fake_complete(f.current);
    return SUCCESS;
}

int cudaEventCreateWithFlags(void **ev, unsigned flags)
{
    (void)flags;
    if (f.sticky) return fail(f.sticky);
    if (f.nevents == 64) return fail(MEMORY_ALLOCATION);
    fake_event *e = calloc(1, sizeof *e);
    if (!e) return fail(MEMORY_ALLOCATION);
    e->device = f.current;
    e->recorded_device = -1;
    f.events[f.nevents++] = e;
    *ev = e;
    return SUCCESS;
}

/* As CUDA: an event records only on a stream of the device it was created
 * on, and handle 0 is the current device's default stream. */
int cudaEventRecord(void *ev, void *stream)
{
    fake_event *e = ev;
    if (f.sticky) return fail(f.sticky);
    int sd = stream_device(stream);
    if (e->device != sd) return fail(INVALID_RESOURCE_HANDLE);
    e->recorded_device = sd;
    e->pending = f.events_pending;
    f.event_records++;
    f.last_record = (fake_record){e->device, sd, f.current};
    return SUCCESS;
}

int cudaEventQuery(void *ev)
{
    fake_event *e = ev;
    f.event_queries++;
    return e->pending ? fail(NOT_READY) : SUCCESS;
}

int cudaEventDestroy(void *ev)
{
    for (int i = 0; i < f.nevents; i++) {
        if (f.events[i] != ev) continue;
        free(ev);
        f.events[i] = f.events[--f.nevents];
        return SUCCESS;
    }
    return fail(INVALID_RESOURCE_HANDLE);
}

int cudaThreadExchangeStreamCaptureMode(int *mode)
{
    int old = f.capture_mode;
    f.capture_mode = *mode;
    *mode = old;
    return SUCCESS;
}

/* Streams made by fake_stream know their device; 0 is the current one's. */
int cudaStreamGetDevice(void *stream, int *device)
{
    *device = stream_device(stream);
    return SUCCESS;
}
