/* Runtime API: streams and events. Work completes when its call returns,
 * so every stream is idle and every recorded event complete; an event
 * keeps the host time it was recorded at, so elapsed times are real
 * (small) durations. Handles are checked by a magic number: a destroyed or
 * foreign handle gives cudaErrorInvalidResourceHandle, not a crash.
 * Graph capture is not faked: streams never capture (begin-capture is a
 * stub), and the capture queries say so.
 */
#include "rt.h"

#include <stdlib.h>

#define STREAM_MAGIC 0x5354524du /* "STRM" */
#define EVENT_MAGIC 0x4556454eu  /* "EVEN" */

struct CUstream_st {
    unsigned magic;
    int device;
    unsigned flags;
    int priority;
};

struct CUevent_st {
    unsigned magic;
    int device;
    unsigned flags;
    int recorded;
    double time_ms;
};

static _Thread_local enum cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;

/* ---- streams ----------------------------------------------------------- */

static int is_builtin(cudaStream_t s)
{
    return s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

int rt_stream_device(cudaStream_t s)
{
    if (is_builtin(s))
        return rt_current_device();
    return s->magic == STREAM_MAGIC ? s->device : -1;
}

static cudaError_t check_stream(cudaStream_t s)
{
    int dev = rt_stream_device(s);
    if (dev >= 0)
        return cudaSuccess;
    return rt_error(is_builtin(s) ? cudaErrorNoDevice : cudaErrorInvalidResourceHandle);
}

static cudaError_t create_stream(cudaStream_t *out, unsigned flags, int priority)
{
    if (!out || (flags & ~(unsigned)cudaStreamNonBlocking))
        return rt_error(cudaErrorInvalidValue);
    int dev = rt_current_device();
    if (dev < 0)
        return rt_error(cudaErrorNoDevice);
    struct CUstream_st *s = malloc(sizeof *s);
    if (!s)
        return rt_error(cudaErrorMemoryAllocation);
    /* Out-of-range priorities are clamped, as by the real runtime. */
    priority = priority > 0 ? 0 : priority < -5 ? -5 : priority;
    *s = (struct CUstream_st){STREAM_MAGIC, dev, flags, priority};
    *out = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream)
{
    RT_ENTER(cudaStreamCreate);
    return create_stream(stream, cudaStreamDefault, 0);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    RT_ENTER(cudaStreamCreateWithFlags);
    return create_stream(stream, flags, 0);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority)
{
    RT_ENTER(cudaStreamCreateWithPriority);
    return create_stream(stream, flags, priority);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    RT_ENTER(cudaStreamDestroy);
    if (is_builtin(stream) || stream->magic != STREAM_MAGIC)
        return rt_error(cudaErrorInvalidResourceHandle);
    stream->magic = 0;
    free(stream);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    RT_ENTER(cudaStreamQuery);
    return check_stream(stream);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    RT_ENTER(cudaStreamSynchronize);
    return check_stream(stream);
}

cudaError_t cudaStreamGetPriority(cudaStream_t stream, int *priority)
{
    RT_ENTER(cudaStreamGetPriority);
    if (!priority)
        return rt_error(cudaErrorInvalidValue);
    cudaError_t err = check_stream(stream);
    if (err == cudaSuccess)
        *priority = is_builtin(stream) ? 0 : stream->priority;
    return err;
}

cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int *flags)
{
    RT_ENTER(cudaStreamGetFlags);
    if (!flags)
        return rt_error(cudaErrorInvalidValue);
    cudaError_t err = check_stream(stream);
    if (err == cudaSuccess)
        *flags = is_builtin(stream) ? cudaStreamDefault : stream->flags;
    return err;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status)
{
    RT_ENTER(cudaStreamIsCapturing);
    if (!status)
        return rt_error(cudaErrorInvalidValue);
    cudaError_t err = check_stream(stream);
    if (err == cudaSuccess)
        *status = cudaStreamCaptureStatusNone;
    return err;
}

static cudaError_t capture_info(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                unsigned long long *id)
{
    if (!status)
        return rt_error(cudaErrorInvalidValue);
    cudaError_t err = check_stream(stream);
    if (err == cudaSuccess) {
        *status = cudaStreamCaptureStatusNone;
        if (id)
            *id = 0;
    }
    return err;
}

/* Outputs past the status and id are only written while capturing. */
#if CUDART_VERSION >= 13000
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                     unsigned long long *id, cudaGraph_t *graph,
                                     const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                     size_t *ndeps)
{
    RT_ENTER(cudaStreamGetCaptureInfo);
    (void)graph, (void)deps, (void)edges, (void)ndeps;
    return capture_info(stream, status, id);
}
#else
/* CUDA 12 names this one cudaStreamGetCaptureInfo_v2, and from 12.3 also
 * has _v3 (with edges): a cu12 PyTorch may use either. */
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                     unsigned long long *id, cudaGraph_t *graph,
                                     const cudaGraphNode_t **deps, size_t *ndeps)
{
    RT_ENTER(cudaStreamGetCaptureInfo);
    (void)graph, (void)deps, (void)ndeps;
    return capture_info(stream, status, id);
}
#if CUDART_VERSION >= 12030
cudaError_t cudaStreamGetCaptureInfo_v3(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                        unsigned long long *id, cudaGraph_t *graph,
                                        const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                        size_t *ndeps)
{
    RT_ENTER(cudaStreamGetCaptureInfo);
    (void)graph, (void)deps, (void)edges, (void)ndeps;
    return capture_info(stream, status, id);
}
#endif
#endif

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    RT_ENTER(cudaThreadExchangeStreamCaptureMode);
    if (!mode)
        return rt_error(cudaErrorInvalidValue);
    enum cudaStreamCaptureMode old = capture_mode;
    capture_mode = *mode;
    *mode = old;
    return cudaSuccess;
}

/* ---- events ------------------------------------------------------------ */

static int valid_event(cudaEvent_t e)
{
    return e && e->magic == EVENT_MAGIC;
}

static cudaError_t create_event(cudaEvent_t *out, unsigned flags)
{
    unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
    if (!out || (flags & ~known))
        return rt_error(cudaErrorInvalidValue);
    int dev = rt_current_device();
    if (dev < 0)
        return rt_error(cudaErrorNoDevice);
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e)
        return rt_error(cudaErrorMemoryAllocation);
    *e = (struct CUevent_st){.magic = EVENT_MAGIC, .device = dev, .flags = flags};
    *out = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    RT_ENTER(cudaEventCreate);
    return create_event(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    RT_ENTER(cudaEventCreateWithFlags);
    return create_event(event, flags);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    RT_ENTER(cudaEventDestroy);
    if (!valid_event(event))
        return rt_error(cudaErrorInvalidResourceHandle);
    event->magic = 0;
    free(event);
    return cudaSuccess;
}

/* The stream must be on the event's device, as on a GPU. */
static cudaError_t record(cudaEvent_t event, cudaStream_t stream)
{
    if (!valid_event(event))
        return rt_error(cudaErrorInvalidResourceHandle);
    int dev = rt_stream_device(stream);
    if (dev < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    if (dev != event->device)
        return rt_error(cudaErrorInvalidResourceHandle);
    event->recorded = 1;
    event->time_ms = vgfc_now_ms();
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    RT_ENTER(cudaEventRecord);
    return record(event, stream);
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
    RT_ENTER(cudaEventRecordWithFlags);
    (void)flags; /* external: no graph capture here, so no difference */
    return record(event, stream);
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    RT_ENTER(cudaEventQuery);
    return valid_event(event) ? cudaSuccess : rt_error(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    RT_ENTER(cudaEventSynchronize);
    return valid_event(event) ? cudaSuccess : rt_error(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    RT_ENTER(cudaStreamWaitEvent);
    (void)flags;
    cudaError_t err = check_stream(stream);
    if (err != cudaSuccess)
        return err;
    return valid_event(event) ? cudaSuccess : rt_error(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    RT_ENTER(cudaEventElapsedTime);
    if (!ms)
        return rt_error(cudaErrorInvalidValue);
    if (!valid_event(start) || !valid_event(end))
        return rt_error(cudaErrorInvalidResourceHandle);
    if ((start->flags | end->flags) & cudaEventDisableTiming)
        return rt_error(cudaErrorInvalidResourceHandle);
    if (!start->recorded || !end->recorded)
        return rt_error(cudaErrorInvalidResourceHandle);
    *ms = (float)(end->time_ms - start->time_ms);
    return cudaSuccess;
}
