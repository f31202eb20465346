/* The fake runtime's internals: the runtime API's types
 * (cuda_runtime_api.h, from the CUDA version the fake is built for) over
 * the fake device in the fake driver (core.h). */
#ifndef VGFC_RT_H
#define VGFC_RT_H

#include <cuda_runtime_api.h>

#include "core.h"

/* Makes `code` this thread's last error (as every failing runtime call
 * does) and returns it. */
cudaError_t rt_error(int code);

/* Where every generated stub goes: counts, traces, sets the last error,
 * and gives the code to return (cudaErrorNotSupported, or a sticky error). */
int vgfc_rt_unsupported(const char *name);

/* Counts the call and returns early with an injected or sticky error. */
#define RT_ENTER(api)                                                            \
    do {                                                                         \
        int enter_err_ = vgfc_enter(VGFC_API_##api);                             \
        if (enter_err_)                                                          \
            return rt_error(enter_err_);                                         \
    } while (0)

/* The current device, its primary context made active, as the runtime
 * does on a device's first use; -1 when there is no device. */
int rt_current_device(void);

/* A stream handle's device: NULL and the legacy and per-thread handles
 * mean the current device. -1 for a handle that is no stream. */
int rt_stream_device(cudaStream_t stream);

/* ---- streams and events (rt_stream.c) ---------------------------------
 * Their capture fields belong to rt_graph.c and are read and written under
 * its lock only. */

#define RT_STREAM_MAGIC 0x5354524du /* "STRM" */
#define RT_EVENT_MAGIC 0x4556454eu  /* "EVEN" */

struct rt_capture;
struct CUgraphNode_st;

struct CUstream_st {
    unsigned magic;
    int device;
    unsigned flags;
    int priority;
    /* The capture the stream is in (NULL: none), and the nodes its next
     * work depends on (with as many zero edges, for the capture queries). */
    struct rt_capture *capture;
    struct CUgraphNode_st **tips;
#if CUDART_VERSION >= 12030
    cudaGraphEdgeData *tip_edges;
#endif
    size_t ntips, tips_cap;
};

struct CUevent_st {
    unsigned magic;
    int device;
    unsigned flags;
    int recorded;
    double time_ms;
    /* Last recorded in a capturing stream: the capture's id (0: not), and
     * that stream's dependencies then, which a stream waiting on it takes. */
    unsigned long long capture_id;
    struct CUgraphNode_st **tips;
    size_t ntips;
};

/* ---- stream capture (rt_graph.c) ---------------------------------------
 * Each costs one atomic load while nothing captures. */

/* Work about to be done on `stream` (a launch, copy, set, host function,
 * graph launch): 0 to do it now. 1 when the call is answered instead, with
 * *err: cudaSuccess when a capturing stream recorded it as a node of type
 * `type` (fn and data: a host node's, run at each replay); an error when
 * the stream's capture was invalidated (cudaErrorStreamCaptureInvalidated),
 * or when legacy-stream work would wait on a blocking stream that captures
 * (cudaErrorStreamCaptureImplicit, which invalidates that capture). The
 * error is this thread's last error. */
int rt_capture_work(cudaStream_t stream, enum cudaGraphNodeType type, cudaHostFn_t fn, void *data,
                    cudaError_t *err);
/* Before a potentially unsafe call (cudaMalloc, cudaFree, synchronizes,
 * event queries): cudaSuccess, or cudaErrorStreamCaptureUnsupported when a
 * capture forbids it to this thread (by the capture modes, as CUDA's), the
 * captures that forbid it invalidated. */
cudaError_t rt_capture_unsafe(void);
/* A synchronize or query of `stream`: cudaErrorStreamCaptureUnsupported
 * when it captures (invalidated), else cudaSuccess. */
cudaError_t rt_capture_stream_wait(cudaStream_t stream);
/* cudaEventRecord: 0 to record it now (the event leaves any capture), or 1
 * with *err as rt_capture_work (cudaSuccess: recorded in the capture). */
int rt_capture_event_record(cudaEvent_t event, cudaStream_t stream, cudaError_t *err);
/* cudaStreamWaitEvent: 0 when nothing captures there (nothing to wait
 * for), or 1 with *err: a stream joins the capture of an event recorded in
 * one, or an error (merge, isolation, implicit, invalidated). */
int rt_capture_event_wait(cudaStream_t stream, cudaEvent_t event, unsigned flags, cudaError_t *err);
/* An event query, synchronize or elapsed time: cudaErrorCapturedEvent when
 * it was last recorded in a capture. */
cudaError_t rt_capture_event_check(cudaEvent_t event);
/* Before a stream or event is freed: it leaves its capture (a capturing
 * stream's capture is invalidated). */
void rt_capture_forget_stream(cudaStream_t stream);
void rt_capture_forget_event(cudaEvent_t event);

#endif
