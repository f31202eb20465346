/* Runtime API: streams and events. Work completes when its call returns,
 * so every stream is idle and every recorded event complete; an event
 * keeps the host time it was recorded at, so elapsed times are real
 * (small) durations. Handles are checked by a magic number: a destroyed or
 * foreign handle gives cudaErrorInvalidResourceHandle, not a crash.
 * Stream capture is rt_graph.c's: the calls here ask it first (a captured
 * record or wait changes the capture, not the event; synchronizing a
 * capturing stream, or during a capture, is refused as by CUDA).
 */
#include "rt.h"

#include <stdlib.h>

#define STREAM_MAGIC RT_STREAM_MAGIC
#define EVENT_MAGIC RT_EVENT_MAGIC

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
    *s = (struct CUstream_st){.magic = STREAM_MAGIC, .device = dev, .flags = flags, .priority = priority};
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
    rt_capture_forget_stream(stream);
    stream->magic = 0;
    free(stream);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    RT_ENTER(cudaStreamQuery);
    cudaError_t err = check_stream(stream);
    return err ? err : rt_capture_stream_wait(stream);
}

/* Refused during a capture in the global mode, as any synchronize. */
cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    RT_ENTER(cudaStreamSynchronize);
    cudaError_t err = check_stream(stream);
    if (!err)
        err = rt_capture_stream_wait(stream);
    return err ? err : rt_capture_unsafe();
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

/* CUDA 12.8's: the device the stream belongs to (the current one for the
 * built-in handles). A lookup only, so the fake lets it through a capture;
 * whether the driver does is what tests/gpu/probe_accumulate_grad.py asks
 * of a GPU. */
#if CUDART_VERSION >= 12080
cudaError_t cudaStreamGetDevice(cudaStream_t stream, int *device)
{
    RT_ENTER(cudaStreamGetDevice);
    if (!device)
        return rt_error(cudaErrorInvalidValue);
    cudaError_t err = check_stream(stream);
    if (err == cudaSuccess)
        *device = rt_stream_device(stream);
    return err;
}
#endif

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
    rt_capture_forget_event(event);
    event->magic = 0;
    free(event);
    return cudaSuccess;
}

/* The stream must be on the event's device, as on a GPU. */
static cudaError_t record(cudaEvent_t event, cudaStream_t stream, unsigned flags)
{
    if (!valid_event(event))
        return rt_error(cudaErrorInvalidResourceHandle);
    if (flags & ~(unsigned)cudaEventRecordExternal)
        return rt_error(cudaErrorInvalidValue);
    int dev = rt_stream_device(stream);
    if (dev < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    if (dev != event->device)
        return rt_error(cudaErrorInvalidResourceHandle);
    cudaError_t err;
    /* External: a node of the graph, when captured; the event is untouched. */
    if (flags & cudaEventRecordExternal) {
        if (rt_capture_work(stream, cudaGraphNodeTypeEventRecord, NULL, NULL, &err))
            return err;
    } else if (rt_capture_event_record(event, stream, &err)) {
        return err;
    }
    event->recorded = 1;
    event->time_ms = vgfc_now_ms();
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    RT_ENTER(cudaEventRecord);
    return record(event, stream, 0);
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
    RT_ENTER(cudaEventRecordWithFlags);
    return record(event, stream, flags);
}

/* A query or synchronize is refused during a capture in the global mode
 * (the capture invalidated), and on an event last recorded in a capture. */
static cudaError_t event_wait(cudaEvent_t event)
{
    if (!valid_event(event))
        return rt_error(cudaErrorInvalidResourceHandle);
    cudaError_t err = rt_capture_unsafe();
    return err ? err : rt_capture_event_check(event);
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    RT_ENTER(cudaEventQuery);
    return event_wait(event);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    RT_ENTER(cudaEventSynchronize);
    return event_wait(event);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    RT_ENTER(cudaStreamWaitEvent);
    if (flags & ~(unsigned)cudaEventWaitExternal)
        return rt_error(cudaErrorInvalidValue);
    cudaError_t err = check_stream(stream);
    if (err != cudaSuccess)
        return err;
    if (!valid_event(event))
        return rt_error(cudaErrorInvalidResourceHandle);
    rt_capture_event_wait(stream, event, flags, &err);
    return err;
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
    cudaError_t err = rt_capture_event_check(start);
    if (!err)
        err = rt_capture_event_check(end);
    if (err)
        return err;
    *ms = (float)(end->time_ms - start->time_ms);
    return cudaSuccess;
}
