/* The fake CUDA's own test, linked against the fake runtime and driver:
 * two devices of 1 GiB and 512 MiB (set below, before the first call),
 * exact memory accounting, the fault knobs, streams and events, the stubs,
 * stream capture, graphs and user objects, and the driver's contexts,
 * entry points and VMM calls.
 *
 *   make test-fakecuda       all of it
 *   build/fakecuda/test_fakecuda vmm    the tests whose name contains "vmm"
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rerun.h"
#include "fakecuda.h"
#include "rt_launch.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

static size_t free_bytes(int dev)
{
    size_t free_b = 0, total = 0;
    cudaSetDevice(dev);
    cudaMemGetInfo(&free_b, &total);
    return free_b;
}

static void test_devices(void)
{
    int n = -1;
    CHECK_EQ(cudaGetDeviceCount(&n), cudaSuccess);
    CHECK_EQ(n, 2);
    struct cudaDeviceProp prop;
    CHECK_EQ(cudaGetDeviceProperties(&prop, 1), cudaSuccess);
    CHECK_EQ(prop.totalGlobalMem, 512 * MiB);
    CHECK_EQ(prop.major, 9);
    CHECK_EQ(prop.warpSize, 32);
    CHECK(strcmp(prop.name, "vramguard fake GPU") == 0);
    int sms = 0;
    CHECK_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    CHECK_EQ(sms, prop.multiProcessorCount);
    char bus[32];
    CHECK_EQ(cudaDeviceGetPCIBusId(bus, sizeof bus, 1), cudaSuccess);
    CHECK(strcmp(bus, "0000:02:00.0") == 0);
    CHECK_EQ(cudaSetDevice(2), cudaErrorInvalidDevice);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
    int dev = -1;
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaGetDevice(&dev), cudaSuccess);
    CHECK_EQ(dev, 1);
    cudaSetDevice(0);
}

static void test_malloc_to_capacity(void)
{
    vg_fakecuda_reset();
    void *a = NULL, *b = NULL;
    cudaSetDevice(0);
    CHECK_EQ(free_bytes(0), 1 * GiB);
    CHECK_EQ(cudaMalloc(&a, 1 * GiB - 100), cudaSuccess);
    CHECK_EQ(free_bytes(0), 100);
    CHECK_EQ(cudaMalloc(&b, 101), cudaErrorMemoryAllocation);
    CHECK(b == NULL);
    CHECK_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
    CHECK_EQ(cudaMalloc(&b, 100), cudaSuccess);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 1 * GiB);
    CHECK_EQ(vg_fakecuda_live_allocations(0), 2);
    CHECK_EQ(cudaFree(a), cudaSuccess);
    CHECK_EQ(cudaFree(b), cudaSuccess);
    CHECK_EQ(cudaFree(b), cudaErrorInvalidValue);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0);
    CHECK_EQ(vg_fakecuda_peak_bytes(0), 1 * GiB);
    CHECK_EQ(vg_fakecuda_malloc_calls(), 3);
    CHECK_EQ(vg_fakecuda_free_calls(), 3);

    /* The second device has its own, smaller capacity. */
    cudaSetDevice(1);
    CHECK_EQ(cudaMalloc(&a, 512 * MiB + 1), cudaErrorMemoryAllocation);
    CHECK_EQ(cudaMalloc(&a, 512 * MiB), cudaSuccess);
    CHECK_EQ(free_bytes(1), 0);
    CHECK_EQ(free_bytes(0), 1 * GiB);
    CHECK_EQ(cudaFree(a), cudaSuccess);
    cudaGetLastError();
    cudaSetDevice(0);
}

static void test_capacity_knob(void)
{
    vg_fakecuda_reset();
    void *a = NULL;
    CHECK_EQ(vg_fakecuda_set_capacity(0, 10 * MiB), 0);
    CHECK_EQ(cudaMalloc(&a, 11 * MiB), cudaErrorMemoryAllocation);
    CHECK_EQ(vg_fakecuda_set_capacity(0, (long long)GiB), 0);
    CHECK_EQ(cudaMalloc(&a, 11 * MiB), cudaSuccess);
    cudaFree(a);
    CHECK_EQ(vg_fakecuda_set_capacity(5, 1), -1);
    cudaGetLastError();
}

static void test_fail_malloc(void)
{
    vg_fakecuda_reset();
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_EQ(vg_fakecuda_fail_malloc(2, cudaErrorMemoryAllocation), 0);
    CHECK_EQ(cudaMalloc(&a, 1 * MiB), cudaSuccess);
    CHECK_EQ(cudaMalloc(&b, 1 * MiB), cudaErrorMemoryAllocation);
    CHECK(b == NULL);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 1 * MiB); /* the failed call took nothing */
    CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_EQ(cudaMalloc(&c, 1 * MiB), cudaSuccess);

    /* Any other code is given as itself: not an out-of-memory. */
    CHECK_EQ(vg_fakecuda_fail_malloc(1, cudaErrorIllegalAddress), 0);
    CHECK_EQ(cudaMalloc(&b, 1 * MiB), cudaErrorIllegalAddress);
    CHECK_EQ(cudaGetLastError(), cudaErrorIllegalAddress);

    /* A run of failures, then a recovery. */
    CHECK_EQ(vg_fakecuda_fail_calls("cudaFree", 1, 2, cudaErrorLaunchFailure), 0);
    CHECK_EQ(cudaFree(a), cudaErrorLaunchFailure);
    CHECK_EQ(cudaFree(a), cudaErrorLaunchFailure);
    CHECK_EQ(cudaFree(a), cudaSuccess);
    CHECK_EQ(cudaFree(c), cudaSuccess);
    cudaGetLastError();

    CHECK_EQ(vg_fakecuda_fail_call("cudaMallocc", 1, 2), -1);
    CHECK_EQ(vg_fakecuda_fail_call("cudaMalloc", 0, 2), -1);
    CHECK_EQ(vg_fakecuda_calls("cudaMallocc"), -1);
    CHECK_EQ(vg_fakecuda_calls("cudaMalloc"), 4);
}

static void test_sticky_error(void)
{
    vg_fakecuda_reset();
    void *a = NULL;
    CHECK_EQ(cudaMalloc(&a, 4096), cudaSuccess);
    vg_fakecuda_set_sticky_error(cudaErrorIllegalAddress);
    void *b = NULL;
    CHECK_EQ(cudaMalloc(&b, 4096), cudaErrorIllegalAddress);
    CHECK_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    CHECK_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
    CHECK_EQ(cudaGetLastError(), cudaErrorIllegalAddress); /* never cleared */
    CHECK_EQ(cudaLaunchKernel(NULL, (dim3){1, 1, 1}, (dim3){1, 1, 1}, NULL, 0, NULL), cudaErrorIllegalAddress);
    int n = 0;
    CHECK_EQ(cudaGetDeviceCount(&n), cudaSuccess); /* queries still answer */
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    CHECK(strcmp(cudaGetErrorString(cudaErrorIllegalAddress), "an illegal memory access was encountered") == 0);
    CHECK_EQ(vg_fakecuda_sticky_error(), cudaErrorIllegalAddress);
    vg_fakecuda_reset();
    CHECK_EQ(cudaGetLastError(), cudaErrorIllegalAddress); /* the thread's last error */
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
    CHECK_EQ(cudaFree(a), cudaSuccess);
}

static void test_copies(void)
{
    vg_fakecuda_reset();
    char host[64], back[64];
    for (int i = 0; i < 64; i++)
        host[i] = (char)i;
    char *dev = NULL;
    CHECK_EQ(cudaMalloc((void **)&dev, 64), cudaSuccess);
    CHECK_EQ(cudaMemset(dev, 0, 64), cudaSuccess);
    CHECK_EQ(cudaMemcpy(back, dev, 64, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK_EQ(back[63], 0);
    CHECK_EQ(cudaMemcpyAsync(dev, host, 64, cudaMemcpyHostToDevice, NULL), cudaSuccess);
    CHECK_EQ(cudaMemcpy(back, dev, 64, cudaMemcpyDefault), cudaSuccess);
    CHECK(memcmp(host, back, 64) == 0);
    /* Past the end of the allocation, or into host memory said to be device. */
    CHECK_EQ(cudaMemcpy(dev + 1, host, 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemcpy(back, host, 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemset(host, 0, 1), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemcpy2DAsync(back, 8, dev, 16, 8, 4, cudaMemcpyDeviceToHost, NULL), cudaSuccess);
    CHECK_EQ(back[8], 16);
    CHECK_EQ(cudaFree(dev), cudaSuccess);
    CHECK_EQ(cudaMemcpy(back, dev, 1, cudaMemcpyDeviceToHost), cudaErrorInvalidValue); /* freed */
    cudaGetLastError();

    struct cudaPointerAttributes attrs;
    void *pinned = NULL;
    CHECK_EQ(cudaHostAlloc(&pinned, 4096, 0), cudaSuccess);
    CHECK_EQ(cudaPointerGetAttributes(&attrs, pinned), cudaSuccess);
    CHECK_EQ(attrs.type, cudaMemoryTypeHost);
    CHECK_EQ(cudaPointerGetAttributes(&attrs, host), cudaSuccess);
    CHECK_EQ(attrs.type, cudaMemoryTypeUnregistered);
    CHECK_EQ(cudaFreeHost(pinned), cudaSuccess);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), 0); /* host memory is not device memory */
}

static void test_streams_and_events(void)
{
    vg_fakecuda_reset();
    cudaStream_t s;
    int least, greatest, prio;
    CHECK_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest - 3), cudaSuccess);
    CHECK_EQ(cudaStreamGetPriority(s, &prio), cudaSuccess);
    CHECK_EQ(prio, greatest); /* clamped */
    CHECK_EQ(cudaStreamQuery(s), cudaSuccess);
    enum cudaStreamCaptureStatus st;
    CHECK_EQ(cudaStreamIsCapturing(s, &st), cudaSuccess);
    CHECK_EQ(st, cudaStreamCaptureStatusNone);

    cudaEvent_t a, b, untimed;
    CHECK_EQ(cudaEventCreate(&a), cudaSuccess);
    CHECK_EQ(cudaEventCreate(&b), cudaSuccess);
    CHECK_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
    float ms = -1;
    CHECK_EQ(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle); /* not recorded */
    CHECK_EQ(cudaEventRecord(a, s), cudaSuccess);
    CHECK_EQ(cudaEventRecord(b, s), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(NULL, b, 0), cudaSuccess);
    CHECK_EQ(cudaEventSynchronize(b), cudaSuccess);
    CHECK_EQ(cudaEventQuery(b), cudaSuccess);
    CHECK_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
    CHECK(ms >= 0 && ms < 1000);
    CHECK_EQ(cudaEventRecord(untimed, s), cudaSuccess);
    CHECK_EQ(cudaEventElapsedTime(&ms, a, untimed), cudaErrorInvalidResourceHandle);

    CHECK_EQ(cudaEventDestroy(a), cudaSuccess);
    CHECK_EQ(cudaEventDestroy(b), cudaSuccess);
    CHECK_EQ(cudaEventDestroy(untimed), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(NULL), cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    CHECK_EQ(vg_fakecuda_calls("cudaEventRecord"), 3);
}

/* ---- stream capture, graphs, user objects -------------------------------- */

static const char graph_kernel = 0; /* a host stub's address stands for the kernel */

static cudaError_t launch_on(cudaStream_t s)
{
    dim3 one = {1, 1, 1};
    return cudaLaunchKernel(&graph_kernel, one, one, NULL, 0, s);
}

static int host_runs;
static void count_host(void *arg)
{
    host_runs += arg ? *(int *)arg : 1;
}

static size_t graph_nodes(cudaGraph_t g)
{
    size_t n = 0;
    return cudaGraphGetNodes(g, NULL, &n) == cudaSuccess ? n : (size_t)-1;
}

static enum cudaStreamCaptureStatus capture_status(cudaStream_t s)
{
    enum cudaStreamCaptureStatus st = (enum cudaStreamCaptureStatus)-1;
    cudaStreamIsCapturing(s, &st);
    return st;
}

static unsigned long long capture_id(cudaStream_t s)
{
    enum cudaStreamCaptureStatus st;
    unsigned long long id = 0;
#if CUDART_VERSION >= 13000
    cudaStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL, NULL);
#else
    cudaStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL);
#endif
    return id;
}

/* A capture records launches, copies, sets and host functions as nodes,
 * moving no bytes and running nothing; each replay runs the host nodes. */
static void test_graph_capture_and_replay(void)
{
    vg_fakecuda_reset();
    cudaSetDevice(0);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    unsigned char *d = NULL, host[64];
    CHECK_EQ(cudaMalloc((void **)&d, 64), cudaSuccess);
    CHECK_EQ(cudaMemset(d, 7, 64), cudaSuccess);
    memset(host, 1, sizeof host);

    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ(capture_status(s), cudaStreamCaptureStatusActive);
    unsigned long long id = capture_id(s);
    CHECK(id > 0);
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
    cudaGetLastError();
    cudaGraph_t capturing = NULL;
    enum cudaStreamCaptureStatus st;
    const cudaGraphNode_t *deps = NULL;
    size_t ndeps = 99;
#if CUDART_VERSION >= 13000
    CHECK_EQ(cudaStreamGetCaptureInfo(s, &st, NULL, &capturing, &deps, NULL, &ndeps), cudaSuccess);
#else
    CHECK_EQ(cudaStreamGetCaptureInfo(s, &st, NULL, &capturing, &deps, &ndeps), cudaSuccess);
#endif
    CHECK(capturing != NULL);
    CHECK_EQ(ndeps, 0);
    CHECK_EQ(launch_on(s), cudaSuccess);
    CHECK_EQ(cudaMemcpyAsync(d, host, 64, cudaMemcpyHostToDevice, s), cudaSuccess);
    CHECK_EQ(cudaMemsetAsync(d, 9, 64, s), cudaSuccess);
    CHECK_EQ(cudaMemcpyAsync(host, d, 64, cudaMemcpyDeviceToHost, s), cudaSuccess);
    int two = 2;
    CHECK_EQ(cudaLaunchHostFunc(s, count_host, &two), cudaSuccess);
    CHECK_EQ(host_runs, 0);          /* recorded, not run */
    CHECK_EQ(d[0], 7);               /* no copy or set was done */
    CHECK_EQ(host[0], 1);
    /* A copy into freed memory is refused as it would be at once. */
    CHECK_EQ(cudaMemcpyAsync(host, host + 1, 8, cudaMemcpyDeviceToHost, s), cudaErrorInvalidValue);
    cudaGetLastError();
    CHECK_EQ(capture_status(s), cudaStreamCaptureStatusActive);
    CHECK_EQ(graph_nodes(capturing), 5);
#if CUDART_VERSION >= 13000
    CHECK_EQ(cudaStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, NULL, &ndeps), cudaSuccess);
    CHECK_EQ(ndeps, 1);
    cudaGraphNode_t nodes[8];
    size_t n = 8;
    CHECK_EQ(cudaGraphGetNodes(capturing, nodes, &n), cudaSuccess);
    CHECK_EQ(n, 5);
    CHECK(deps[0] == nodes[4]);      /* each node depends on the one before */
    cudaGraphNode_t dep = NULL;
    size_t one = 1;
    CHECK_EQ(cudaGraphNodeGetDependencies(nodes[4], &dep, NULL, &one), cudaSuccess);
    CHECK(dep == nodes[3]);
    enum cudaGraphNodeType type;
    CHECK_EQ(cudaGraphNodeGetType(nodes[0], &type), cudaSuccess);
    CHECK_EQ(type, cudaGraphNodeTypeKernel);
    CHECK_EQ(cudaGraphNodeGetType(nodes[4], &type), cudaSuccess);
    CHECK_EQ(type, cudaGraphNodeTypeHost);
#endif
    cudaGraph_t g = NULL;
    CHECK_EQ(cudaGraphInstantiate((cudaGraphExec_t *)&g, capturing, 0), cudaErrorInvalidValue); /* still capturing */
    cudaGetLastError();
    CHECK_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    CHECK(g == capturing);
    CHECK_EQ(capture_status(s), cudaStreamCaptureStatusNone);
    CHECK_EQ(capture_id(s), 0);
    CHECK_EQ(cudaStreamEndCapture(s, &g), cudaErrorIllegalState);
    cudaGetLastError();

    cudaGraphExec_t exec;
    CHECK_EQ(cudaGraphInstantiateWithFlags(&exec, g, cudaGraphInstantiateFlagAutoFreeOnLaunch |
                                                         cudaGraphInstantiateFlagUseNodePriority), cudaSuccess);
    CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);       /* the executable graph stands alone */
    CHECK_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    CHECK_EQ(cudaGraphLaunch(exec, NULL), cudaSuccess); /* any stream */
    CHECK_EQ(host_runs, 4);
    CHECK_EQ(d[0], 7);
    CHECK_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    CHECK_EQ(cudaGraphExecDestroy(NULL), cudaErrorInvalidValue);
    cudaGetLastError();
    CHECK_EQ(vg_fakecuda_calls("cudaGraphLaunch"), 2);

    /* Ids are unique; work after the capture runs again. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    CHECK(capture_id(s) > id);
    CHECK_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    CHECK_EQ(graph_nodes(g), 0);
    CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);
    CHECK_EQ(cudaMemsetAsync(d, 3, 64, s), cudaSuccess);
    CHECK_EQ(d[0], 3);
    CHECK_EQ(cudaLaunchHostFunc(s, count_host, NULL), cudaSuccess);
    CHECK_EQ(host_runs, 5);
    /* The legacy stream cannot capture. */
    CHECK_EQ(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
    cudaGetLastError();
    CHECK_EQ(cudaFree(d), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    host_runs = 0;
}

/* Ends a capture that must have been invalidated: its end says so and
 * gives no graph. */
static int ends_invalidated(cudaStream_t s)
{
    cudaGraph_t g = (cudaGraph_t)&graph_kernel;
    int ok = capture_status(s) == cudaStreamCaptureStatusInvalidated &&
             launch_on(s) == cudaErrorStreamCaptureInvalidated &&
             cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && g == NULL &&
             capture_status(s) == cudaStreamCaptureStatusNone;
    cudaGetLastError();
    return ok;
}

struct other_thread {
    enum cudaStreamCaptureMode mode; /* the thread's */
    cudaError_t malloc_err, free_err;
};

static void *malloc_elsewhere(void *arg)
{
    struct other_thread *t = arg;
    enum cudaStreamCaptureMode mode = t->mode;
    cudaSetDevice(0);
    cudaThreadExchangeStreamCaptureMode(&mode);
    void *p = NULL;
    t->malloc_err = cudaMalloc(&p, 1024);
    t->free_err = p ? cudaFree(p) : cudaErrorInvalidValue;
    cudaGetLastError();
    return NULL;
}

static cudaError_t in_other_thread(enum cudaStreamCaptureMode mode)
{
    struct other_thread t = {mode, cudaErrorUnknown, cudaErrorUnknown};
    pthread_t th;
    if (pthread_create(&th, NULL, malloc_elsewhere, &t))
        return cudaErrorUnknown;
    pthread_join(th, NULL);
    return t.malloc_err ? t.malloc_err : t.free_err;
}

/* The capture modes: what a thread may do while captures are underway. */
static void test_graph_capture_modes(void)
{
    vg_fakecuda_reset();
    cudaSetDevice(0);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL, *q = NULL;
    CHECK_EQ(cudaMalloc(&q, 4096), cudaSuccess);
    cudaEvent_t e;
    CHECK_EQ(cudaEventCreate(&e), cudaSuccess);
    CHECK_EQ(cudaEventRecord(e, NULL), cudaSuccess);
    size_t used = vg_fakecuda_bytes_in_use(0);

    /* Global: the capturing thread's cudaMalloc fails, allocates nothing,
     * and invalidates the capture. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ(cudaMalloc(&p, 4096), cudaErrorStreamCaptureUnsupported);
    CHECK_EQ(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), used);
    CHECK(ends_invalidated(s));

    /* ... and so do cudaFree, the synchronizes, event queries and the
     * synchronous copies, each invalidating. */
    static const char *const what[] = {"cudaFree", "cudaDeviceSynchronize", "cudaStreamSynchronize",
                                       "cudaStreamSynchronize(capturing)", "cudaStreamQuery(capturing)",
                                       "cudaEventQuery", "cudaEventSynchronize", "cudaMemcpy", "cudaMemset"};
    cudaStream_t other;
    CHECK_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
    for (int i = 0; i < (int)(sizeof what / sizeof *what); i++) {
        CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
        char byte = 0;
        cudaError_t err = i == 0 ? cudaFree(q)
                        : i == 1 ? cudaDeviceSynchronize()
                        : i == 2 ? cudaStreamSynchronize(other)
                        : i == 3 ? cudaStreamSynchronize(s)
                        : i == 4 ? cudaStreamQuery(s)
                        : i == 5 ? cudaEventQuery(e)
                        : i == 6 ? cudaEventSynchronize(e)
                        : i == 7 ? cudaMemcpy(&byte, q, 1, cudaMemcpyDeviceToHost)
                                 : cudaMemset(q, 0, 1);
        if (err != cudaErrorStreamCaptureUnsupported)
            fprintf(stderr, "  %s during a global capture: %d\n", what[i], (int)err);
        CHECK_EQ(err, cudaErrorStreamCaptureUnsupported);
        CHECK(ends_invalidated(s));
    }
    CHECK_EQ(cudaStreamQuery(other), cudaSuccess); /* no capture: all answer again */
    CHECK_EQ(cudaEventQuery(e), cudaSuccess);

    /* The relaxed thread mode (PyTorch's guard around its cudaMalloc
     * during a capture) may allocate; back in the global mode, cudaFree
     * may not. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
    CHECK_EQ(mode, cudaStreamCaptureModeGlobal);
    CHECK_EQ(cudaMalloc(&p, 4096), cudaSuccess);
    CHECK_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
    CHECK_EQ(mode, cudaStreamCaptureModeRelaxed);
    CHECK_EQ(capture_status(s), cudaStreamCaptureStatusActive);
    /* Another thread in the global mode may not, in the thread-local one may. */
    CHECK_EQ(in_other_thread(cudaStreamCaptureModeThreadLocal), cudaSuccess);
    CHECK_EQ(capture_status(s), cudaStreamCaptureStatusActive);
    CHECK_EQ(in_other_thread(cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
    CHECK(ends_invalidated(s));
    CHECK_EQ(cudaFree(p), cudaSuccess);

    /* A thread-local capture leaves other threads alone, not its own. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    CHECK_EQ(in_other_thread(cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ(capture_status(s), cudaStreamCaptureStatusActive);
    CHECK_EQ(cudaMalloc(&p, 4096), cudaErrorStreamCaptureUnsupported);
    CHECK(ends_invalidated(s));

    /* A relaxed capture forbids nothing. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_EQ(cudaMalloc(&p, 4096), cudaSuccess);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    CHECK_EQ(in_other_thread(cudaStreamCaptureModeGlobal), cudaSuccess);
    /* ... but a capturing stream still cannot be waited for. */
    CHECK_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    CHECK(ends_invalidated(s));

    mode = (enum cudaStreamCaptureMode)7;
    CHECK_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaErrorInvalidValue);
    CHECK_EQ(cudaStreamBeginCapture(s, (enum cudaStreamCaptureMode)7), cudaErrorInvalidValue);
    cudaGetLastError();
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), used);
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaEventDestroy(e), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(other), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
}

struct end_arg {
    cudaError_t err;
    cudaStream_t stream;
};

static void *end_elsewhere(void *arg)
{
    struct end_arg *a = arg;
    cudaGraph_t g = NULL;
    a->err = cudaStreamEndCapture(a->stream, &g);
    if (g)
        cudaGraphDestroy(g);
    cudaGetLastError();
    return NULL;
}

/* Other streams join a capture through events, and must be joined back;
 * the legacy stream cannot touch a capturing blocking stream. */
static void test_graph_capture_streams(void)
{
    vg_fakecuda_reset();
    cudaSetDevice(0);
    cudaStream_t s, t, u, blocking;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&u, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaStreamCreate(&blocking), cudaSuccess);
    cudaEvent_t fork, join, outside;
    CHECK_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
    CHECK_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
    CHECK_EQ(cudaEventCreate(&outside), cudaSuccess);
    CHECK_EQ(cudaEventRecord(outside, u), cudaSuccess);
    cudaGraph_t g;

    /* Fork and join: t does its work in the capture. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ(launch_on(s), cudaSuccess);
    CHECK_EQ(cudaEventRecord(fork, s), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(t, fork, 0), cudaSuccess);
    CHECK_EQ(capture_status(t), cudaStreamCaptureStatusActive);
    CHECK_EQ(capture_id(t), capture_id(s));
    CHECK_EQ(launch_on(t), cudaSuccess);
    CHECK_EQ(launch_on(s), cudaSuccess);
    CHECK_EQ(cudaEventRecord(join, t), cudaSuccess);
    CHECK_EQ(cudaEventQuery(join), cudaErrorStreamCaptureUnsupported); /* which invalidates: not here */
    cudaGetLastError();
    CHECK(ends_invalidated(s));
    CHECK_EQ(capture_status(t), cudaStreamCaptureStatusNone);   /* t left with it */
    CHECK_EQ(cudaEventQuery(join), cudaErrorCapturedEvent);     /* recorded in a capture */
    cudaGetLastError();
    CHECK_EQ(cudaEventRecord(join, t), cudaSuccess);
    CHECK_EQ(cudaEventQuery(join), cudaSuccess);

    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ(launch_on(s), cudaSuccess);
    CHECK_EQ(cudaEventRecord(fork, s), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(t, fork, 0), cudaSuccess);
    CHECK_EQ(launch_on(t), cudaSuccess);
    CHECK_EQ(launch_on(s), cudaSuccess);
    CHECK_EQ(cudaEventRecord(join, t), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(s, join, 0), cudaSuccess);
    CHECK_EQ(launch_on(s), cudaSuccess);
    CHECK_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    CHECK_EQ(graph_nodes(g), 4);
    CHECK_EQ(capture_status(t), cudaStreamCaptureStatusNone);
    CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);

    /* Not joined back: the end fails and gives no graph. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ(cudaEventRecord(fork, s), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(t, fork, 0), cudaSuccess);
    CHECK_EQ(launch_on(t), cudaSuccess);
    g = (cudaGraph_t)&graph_kernel;
    CHECK_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureUnjoined);
    CHECK(g == NULL);
    CHECK_EQ(capture_status(t), cudaStreamCaptureStatusNone);
    cudaGetLastError();

    /* Ended on a joined stream, not the origin: unmatched, invalidated. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ(cudaEventRecord(fork, s), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(t, fork, 0), cudaSuccess);
    CHECK_EQ(cudaStreamEndCapture(t, &g), cudaErrorStreamCaptureUnmatched);
    cudaGetLastError();
    CHECK(ends_invalidated(s));

    /* Ended in another thread, not relaxed: refused, invalidated. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    struct end_arg arg = {cudaSuccess, s};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, end_elsewhere, &arg), 0);
    pthread_join(th, NULL);
    CHECK_EQ(arg.err, cudaErrorStreamCaptureWrongThread);
    CHECK(ends_invalidated(s));
    /* Relaxed, it may be. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_EQ(pthread_create(&th, NULL, end_elsewhere, &arg), 0);
    pthread_join(th, NULL);
    CHECK_EQ(arg.err, cudaSuccess);
    CHECK_EQ(capture_status(s), cudaStreamCaptureStatusNone);

    /* An event from outside the capture: isolation, unless external. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(s, outside, cudaEventWaitExternal), cudaSuccess);
    CHECK_EQ(cudaEventRecordWithFlags(outside, s, cudaEventRecordExternal), cudaSuccess);
    CHECK_EQ(capture_status(s), cudaStreamCaptureStatusActive);
    CHECK_EQ(cudaStreamWaitEvent(s, outside, 0), cudaErrorStreamCaptureIsolation);
    cudaGetLastError();
    CHECK(ends_invalidated(s));
    CHECK_EQ(cudaEventQuery(outside), cudaSuccess); /* external records leave it alone */

    /* Two captures cannot merge. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ(cudaStreamBeginCapture(u, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK(capture_id(u) != capture_id(s));
    CHECK_EQ(cudaEventRecord(fork, s), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(u, fork, 0), cudaErrorStreamCaptureMerge);
    cudaGetLastError();
    CHECK(ends_invalidated(u));
    CHECK(ends_invalidated(s));

    /* The legacy stream, while a blocking stream captures: its work would
     * wait on the capture. Non-blocking captures leave it alone. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_EQ(launch_on(NULL), cudaSuccess);
    CHECK_EQ(capture_status(NULL), cudaStreamCaptureStatusNone);
    CHECK_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);
    CHECK_EQ(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed), cudaSuccess);
    enum cudaStreamCaptureStatus st;
    CHECK_EQ(cudaStreamIsCapturing(NULL, &st), cudaErrorStreamCaptureImplicit);
    cudaGetLastError();
    CHECK_EQ(capture_status(blocking), cudaStreamCaptureStatusActive);
    CHECK_EQ(launch_on(cudaStreamLegacy), cudaErrorStreamCaptureImplicit);
    cudaGetLastError();
    CHECK(ends_invalidated(blocking));
    cudaSetDevice(1); /* another device's legacy stream is not concerned */
    CHECK_EQ(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_EQ(launch_on(NULL), cudaSuccess);
    cudaSetDevice(0);
    CHECK_EQ(cudaStreamEndCapture(blocking, &g), cudaSuccess);
    CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);

    /* A capturing stream destroyed: its capture goes with it. */
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ(cudaEventRecord(fork, s), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(t, fork, 0), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    CHECK_EQ(capture_status(t), cudaStreamCaptureStatusNone);
    void *p = NULL;
    CHECK_EQ(cudaMalloc(&p, 16), cudaSuccess);     /* nothing captures any more */
    CHECK_EQ(cudaFree(p), cudaSuccess);

    CHECK_EQ(cudaEventDestroy(fork), cudaSuccess);
    CHECK_EQ(cudaEventDestroy(join), cudaSuccess);
    CHECK_EQ(cudaEventDestroy(outside), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(t), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(u), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(blocking), cudaSuccess);
    CHECK_EQ(vg_fakecuda_unsupported_calls(), 0);
}

static int destroyed[2];
static void destroy_obj(void *p)
{
    destroyed[(int *)p - destroyed]++;
}

/* User objects: their destructor runs when the last reference goes, the
 * caller's, a graph's or an executable graph's. */
static void test_graph_user_objects(void)
{
    vg_fakecuda_reset();
    memset(destroyed, 0, sizeof destroyed);
    cudaUserObject_t a, b;
    CHECK_EQ(cudaUserObjectCreate(&a, &destroyed[0], destroy_obj, 1, 0), cudaErrorInvalidValue);
    cudaGetLastError();
    CHECK_EQ(cudaUserObjectCreate(&a, &destroyed[0], destroy_obj, 1, cudaUserObjectNoDestructorSync), cudaSuccess);
    CHECK_EQ(cudaUserObjectRetain(a, 2), cudaSuccess);
    CHECK_EQ(cudaUserObjectRelease(a, 2), cudaSuccess);
    CHECK_EQ(destroyed[0], 0);

    /* As PyTorch does: moved into a capturing graph. */
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    cudaGraph_t capturing = NULL;
    enum cudaStreamCaptureStatus st;
#if CUDART_VERSION >= 13000
    CHECK_EQ(cudaStreamGetCaptureInfo(s, &st, NULL, &capturing, NULL, NULL, NULL), cudaSuccess);
#else
    CHECK_EQ(cudaStreamGetCaptureInfo(s, &st, NULL, &capturing, NULL, NULL), cudaSuccess);
#endif
    CHECK_EQ(cudaGraphRetainUserObject(capturing, a, 1, cudaGraphUserObjectMove), cudaSuccess);
    CHECK_EQ(cudaUserObjectCreate(&b, &destroyed[1], destroy_obj, 1, cudaUserObjectNoDestructorSync), cudaSuccess);
    CHECK_EQ(cudaGraphRetainUserObject(capturing, b, 2, 0), cudaSuccess); /* new references */
    CHECK_EQ(launch_on(s), cudaSuccess);
    cudaGraph_t g;
    CHECK_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    cudaGraphExec_t exec, exec2;
    CHECK_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    CHECK_EQ(cudaGraphInstantiate(&exec2, g, 0), cudaSuccess);
    CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);
    CHECK_EQ(destroyed[0], 0);                    /* the executable graphs hold theirs */
    CHECK_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    CHECK_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    CHECK_EQ(destroyed[0], 0);
    CHECK_EQ(cudaGraphExecDestroy(exec2), cudaSuccess);
    CHECK_EQ(destroyed[0], 1);                    /* the last reference */
    CHECK_EQ(destroyed[1], 0);                    /* the caller's is left */
    CHECK_EQ(cudaUserObjectRelease(b, 2), cudaErrorInvalidValue); /* it has one */
    cudaGetLastError();
    CHECK_EQ(cudaUserObjectRelease(b, 1), cudaSuccess);
    CHECK_EQ(destroyed[1], 1);

    /* A graph's references can be handed back. An invalidated capture's
     * graph goes, and with it what it held. */
    CHECK_EQ(cudaGraphCreate(&g, 0), cudaSuccess);
    CHECK_EQ(cudaUserObjectCreate(&a, &destroyed[0], destroy_obj, 1, cudaUserObjectNoDestructorSync), cudaSuccess);
    CHECK_EQ(cudaGraphRetainUserObject(g, a, 1, 0), cudaSuccess);
    CHECK_EQ(cudaGraphReleaseUserObject(g, a, 2), cudaErrorInvalidValue);
    cudaGetLastError();
    CHECK_EQ(cudaGraphReleaseUserObject(g, a, 1), cudaSuccess);
    CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);
    CHECK_EQ(destroyed[0], 1);
    CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
#if CUDART_VERSION >= 13000
    CHECK_EQ(cudaStreamGetCaptureInfo(s, &st, NULL, &capturing, NULL, NULL, NULL), cudaSuccess);
#else
    CHECK_EQ(cudaStreamGetCaptureInfo(s, &st, NULL, &capturing, NULL, NULL), cudaSuccess);
#endif
    CHECK_EQ(cudaGraphRetainUserObject(capturing, a, 1, cudaGraphUserObjectMove), cudaSuccess);
    CHECK_EQ(cudaGraphDestroy(capturing), cudaErrorIllegalState); /* being captured into */
    cudaGetLastError();
    CHECK_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    cudaGetLastError();
    CHECK(ends_invalidated(s));
    CHECK_EQ(destroyed[0], 2);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
}

/* What PyTorch's conditional nodes and the caching allocator's graph
 * dependencies use: a capture into a graph of one's own, nodes added to
 * a capturing graph, a stream's dependencies set; the graph memory
 * attributes. */
static void test_graph_nodes_and_attributes(void)
{
    vg_fakecuda_reset();
    cudaSetDevice(0);
#if CUDART_VERSION >= 13000
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t g, out;
    CHECK_EQ(cudaGraphCreate(&g, 0), cudaSuccess);
    struct cudaGraphNodeParams params = {.type = cudaGraphNodeTypeEmpty};
    cudaGraphNode_t first, second;
    CHECK_EQ(cudaGraphAddNode(&first, g, NULL, NULL, 0, &params), cudaSuccess);
    CHECK_EQ(cudaStreamBeginCaptureToGraph(s, g, &first, NULL, 1, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ(launch_on(s), cudaSuccess);
    params = (struct cudaGraphNodeParams){.type = cudaGraphNodeTypeHost, .host = {count_host, NULL}};
    const cudaGraphNode_t *deps;
    size_t ndeps;
    enum cudaStreamCaptureStatus st;
    CHECK_EQ(cudaStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, NULL, &ndeps), cudaSuccess);
    CHECK_EQ(cudaGraphAddNode(&second, g, deps, NULL, ndeps, &params), cudaSuccess);
    CHECK_EQ(cudaStreamUpdateCaptureDependencies(s, &second, NULL, 1, cudaStreamSetCaptureDependencies),
             cudaSuccess);
    params = (struct cudaGraphNodeParams){.type = cudaGraphNodeTypeConditional};
    cudaGraphNode_t cond;
    CHECK_EQ(cudaGraphAddNode(&cond, g, &second, NULL, 1, &params), cudaErrorNotSupported);
    cudaGetLastError();
    CHECK_EQ(cudaStreamEndCapture(s, &out), cudaSuccess);
    CHECK(out == g);
    CHECK_EQ(graph_nodes(g), 3);
    size_t n = 1;
    cudaGraphNode_t dep;
    CHECK_EQ(cudaGraphNodeGetDependencies(second, &dep, NULL, &n), cudaSuccess);
    CHECK_EQ(n, 1);
    CHECK_EQ(cudaGraphNodeGetDependencies(dep, &dep, NULL, &n), cudaSuccess);
    CHECK(dep == first);
    cudaGraphExec_t exec;
    CHECK_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    host_runs = 0;
    CHECK_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    CHECK_EQ(host_runs, 1);
    CHECK_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    host_runs = 0;
#endif
    unsigned long long v = 1;
    CHECK_EQ(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &v), cudaSuccess);
    CHECK_EQ(v, 0);
    CHECK_EQ(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &v), cudaSuccess);
    v = 5;
    CHECK_EQ(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrReservedMemHigh, &v), cudaErrorInvalidValue);
    CHECK_EQ(cudaDeviceGetGraphMemAttribute(2, cudaGraphMemAttrUsedMemHigh, &v), cudaErrorInvalidDevice);
    cudaGetLastError();
    CHECK_EQ(cudaDeviceGraphMemTrim(0), cudaSuccess);
    CHECK_EQ(vg_fakecuda_unsupported_calls(), 0);
}

static void test_unsupported(void)
{
    vg_fakecuda_reset();
    void *pitched = NULL;
    size_t pitch = 0;
    CHECK_EQ(cudaMallocPitch(&pitched, &pitch, 64, 2), cudaErrorNotSupported);
    CHECK_EQ(cudaGetLastError(), cudaErrorNotSupported);
    CHECK_EQ(vg_fakecuda_unsupported_calls(), 1);
    CHECK(strcmp(vg_fakecuda_last_unsupported(), "cudaMallocPitch") == 0);
    CHECK(strcmp(cudaGetErrorName(cudaErrorNotSupported), "cudaErrorNotSupported") == 0);
    CHECK(strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0);
    CHECK(strcmp(cudaGetErrorString(cudaErrorInvalidKernelImage), "cudaErrorInvalidKernelImage") == 0);
}

static void test_driver(void)
{
    vg_fakecuda_reset();
    CHECK_EQ(cuInit(0), CUDA_SUCCESS);
    int version = 0, count = 0, active = -1;
    unsigned flags;
    CHECK_EQ(cuDriverGetVersion(&version), CUDA_SUCCESS);
    CHECK(version >= CUDART_VERSION);
    CHECK_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
    CHECK_EQ(count, 2);
    CHECK_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
    CHECK_EQ(active, 1); /* the runtime has used device 0 */
    size_t total = 0;
    CHECK_EQ(cuDeviceTotalMem(&total, 1), CUDA_SUCCESS);
    CHECK_EQ(total, 512 * MiB);
    /* The deprecated capability query answers what the attributes do. */
    int major = -1, minor = -1, attr_major = -2, attr_minor = -2;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    CHECK_EQ(cuDeviceComputeCapability(&major, &minor, 1), CUDA_SUCCESS);
    CHECK_EQ(cuDeviceComputeCapability(NULL, &minor, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuDeviceComputeCapability(&major, &minor, 7), CUDA_ERROR_INVALID_DEVICE);
#pragma GCC diagnostic pop
    CHECK_EQ(cuDeviceGetAttribute(&attr_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 1), CUDA_SUCCESS);
    CHECK_EQ(cuDeviceGetAttribute(&attr_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 1), CUDA_SUCCESS);
    CHECK_EQ(major, attr_major);
    CHECK_EQ(minor, attr_minor);
    CHECK(major >= 7);
    CUcontext ctx = NULL;
    CHECK_EQ(cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
    CHECK(ctx != NULL);

    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult found;
    CHECK_EQ(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault, &found), cudaSuccess);
    CHECK_EQ(found, cudaDriverEntryPointSuccess);
    CHECK(fn == (void *)&cuMemAlloc);
    CHECK_EQ(cudaGetDriverEntryPointByVersion("cuNoSuchThing", &fn, 12000, cudaEnableDefault, &found), cudaSuccess);
    CHECK_EQ(found, cudaDriverEntryPointSymbolNotFound);

    const char *msg = NULL;
    CHECK_EQ(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &msg), CUDA_SUCCESS);
    CHECK(strcmp(msg, "out of memory") == 0);
    CHECK_EQ(cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &msg), CUDA_SUCCESS);
    CHECK(strcmp(msg, "CUDA_ERROR_ILLEGAL_ADDRESS") == 0);
    /* A stub: found, and fails. */
    CUdeviceptr managed = 0;
    CHECK_EQ(cuMemAllocManaged(&managed, 64, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_NOT_SUPPORTED);
}

/* Kernels run nothing and succeed, through every path a library takes:
 * nvcc's CUDA 13 stubs, the runtime's launch calls, and the driver's
 * modules (NVRTC's and Triton's code). A block too large is refused. */
static void test_launches(void)
{
    vg_fakecuda_reset();
    dim3 one = {1, 1, 1}, big = {2048, 1, 1}, grid = {4096, 1, 1};
    static const char stub = 0; /* a host stub's address stands for the kernel */
#if CUDART_VERSION >= 13000
    cudaKernel_t k = NULL;
    CHECK_EQ(__cudaGetKernel(&k, &stub), cudaSuccess);
    CHECK_EQ(__cudaLaunchKernel(k, grid, one, NULL, 0, NULL), cudaSuccess);
    CHECK_EQ(vg_fakecuda_calls("__cudaLaunchKernel"), 1);
#endif
    CHECK_EQ(cudaLaunchKernel(&stub, grid, one, NULL, 0, NULL), cudaSuccess);
    CHECK_EQ(cudaLaunchKernel(&stub, grid, big, NULL, 0, NULL), cudaErrorInvalidConfiguration);
    cudaGetLastError();
    cudaLaunchConfig_t config = {.gridDim = grid, .blockDim = one};
    CHECK_EQ(cudaLaunchKernelExC(&config, &stub, NULL), cudaSuccess);
    CHECK_EQ(vg_fakecuda_calls("cudaLaunchKernel"), 2); /* the refused one counts too */

    struct cudaFuncAttributes attr;
    CHECK_EQ(cudaFuncGetAttributes(&attr, &stub), cudaSuccess);
    CHECK_EQ(attr.maxThreadsPerBlock, 1024);
    int blocks = 0;
    CHECK_EQ(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, &stub, 256, 0), cudaSuccess);
    CHECK_EQ(blocks, 8); /* 2048 threads per multiprocessor on the default 9.0 */

    CUmodule mod = NULL;
    CUfunction fn = NULL;
    CHECK_EQ(cuModuleLoadData(&mod, "any image"), CUDA_SUCCESS);
    CHECK_EQ(cuModuleGetFunction(&fn, mod, "kernel"), CUDA_SUCCESS);
    CHECK_EQ(cuLaunchKernel(fn, 8, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuLaunchKernel(fn, 8, 1, 1, 2048, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    int regs = 0;
    CHECK_EQ(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fn), CUDA_SUCCESS);
    CHECK(regs > 0);
    CUlinkState link = NULL;
    void *image = NULL;
    size_t image_size = 0;
    CHECK_EQ(cuLinkCreate(0, NULL, NULL, &link), CUDA_SUCCESS);
    CHECK_EQ(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)"ptx", 3, "k", 0, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuLinkComplete(link, &image, &image_size), CUDA_SUCCESS);
    CHECK(image != NULL && image_size > 0);
    CHECK_EQ(cuLinkDestroy(link), CUDA_SUCCESS);
    CHECK_EQ(cuModuleUnload(mod), CUDA_SUCCESS);
    CHECK_EQ(cuModuleUnload(mod), CUDA_ERROR_INVALID_HANDLE); /* once only */
    CHECK_EQ(cuModuleGetFunction(&fn, mod, "kernel"), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(vg_fakecuda_unsupported_calls(), 0);

    /* After an illegal access, launches fail as everything else does. */
    vg_fakecuda_set_sticky_error(700);
    CHECK_EQ(cudaLaunchKernel(&stub, grid, one, NULL, 0, NULL), cudaErrorIllegalAddress);
    CHECK_EQ(cuLaunchKernel(fn, 8, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_ILLEGAL_ADDRESS);
    vg_fakecuda_reset();
    cudaGetLastError();
}

static void test_vmm(void)
{
    vg_fakecuda_reset();
    cudaSetDevice(1);
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    size_t gran = 0;
    CHECK_EQ(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), CUDA_SUCCESS);
    CHECK_EQ(gran, 2 * MiB);

    CUdeviceptr va = 0;
    CHECK_EQ(cuMemAddressReserve(&va, 64 * MiB, 0, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(va % gran, 0);
    CHECK_EQ(free_bytes(1), 512 * MiB); /* address space costs nothing */

    CUmemGenericAllocationHandle h1, h2, big;
    CHECK_EQ(cuMemCreate(&h1, 2 * MiB, &prop, 0), CUDA_SUCCESS);
    CHECK_EQ(cuMemCreate(&h2, 4 * MiB, &prop, 0), CUDA_SUCCESS);
    CHECK_EQ(free_bytes(1), 506 * MiB);
    CHECK_EQ(cuMemCreate(&big, 508 * MiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(cuMemCreate(&big, 3 * MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE); /* not granular */

    /* A handle counts in the peak from its first mapping: one created and
     * released unmapped (a map that failed, the device full) never does. */
    long long before = vg_fakecuda_peak_bytes(1);
    CUmemGenericAllocationHandle unused;
    CHECK_EQ(cuMemCreate(&unused, 8 * MiB, &prop, 0), CUDA_SUCCESS);
    CHECK_EQ(cuMemRelease(unused), CUDA_SUCCESS);
    CHECK_EQ(vg_fakecuda_peak_bytes(1), before);

    /* Two handles side by side: one piece of memory to a copy. */
    CHECK_EQ(cuMemMap(va, 2 * MiB, 0, h1, 0), CUDA_SUCCESS);
    CHECK_EQ(vg_fakecuda_peak_bytes(1), before + (long long)(2 * MiB));
    CHECK_EQ(cuMemMap(va + 2 * MiB, 4 * MiB, 0, h2, 0), CUDA_SUCCESS);
    CHECK_EQ(vg_fakecuda_peak_bytes(1), before + (long long)(6 * MiB));
    CHECK_EQ(cuMemMap(va, 2 * MiB, 0, h2, 0), CUDA_ERROR_INVALID_VALUE); /* already mapped */
    char *p = (char *)(uintptr_t)va;
    CHECK_EQ(cudaMemset(p, 1, 3 * MiB), cudaErrorInvalidValue); /* no access yet */
    CUmemAccessDesc access = {.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 1;
    CHECK_EQ(cuMemSetAccess(va, 6 * MiB, &access, 1), CUDA_SUCCESS);
    CHECK_EQ(cudaMemset(p + MiB, 7, 3 * MiB), cudaSuccess);
    CHECK_EQ(p[4 * MiB - 1], 7);

    /* The same handle mapped twice shows the same bytes. */
    CHECK_EQ(cuMemMap(va + 8 * MiB, 2 * MiB, 0, h1, 0), CUDA_SUCCESS);
    CHECK_EQ(cuMemSetAccess(va + 8 * MiB, 2 * MiB, &access, 1), CUDA_SUCCESS);
    CHECK_EQ(p[8 * MiB + MiB], 7);

    CUmemGenericAllocationHandle again;
    CHECK_EQ(cuMemRetainAllocationHandle(&again, p + 3 * MiB), CUDA_SUCCESS);
    CHECK(again == h2);
    CHECK_EQ(cuMemRelease(again), CUDA_SUCCESS);

    /* Released handles live on while mapped. */
    CHECK_EQ(cuMemRelease(h1), CUDA_SUCCESS);
    CHECK_EQ(cuMemRelease(h2), CUDA_SUCCESS);
    CHECK_EQ(free_bytes(1), 506 * MiB);
    CHECK_EQ(cuMemAddressFree(va, 64 * MiB), CUDA_ERROR_INVALID_VALUE); /* still mapped */
    CHECK_EQ(cuMemUnmap(va, 6 * MiB), CUDA_SUCCESS);
    CHECK_EQ(free_bytes(1), 510 * MiB); /* h2 gone, h1 still mapped at +8 MiB */
    CHECK_EQ(cuMemUnmap(va + 8 * MiB, 2 * MiB), CUDA_SUCCESS);
    CHECK_EQ(free_bytes(1), 512 * MiB);
    CHECK_EQ(cuMemAddressFree(va, 64 * MiB), CUDA_SUCCESS);
    CHECK_EQ(vg_fakecuda_live_allocations(1), 0);
    cudaGetLastError();
    cudaSetDevice(0);
}

/* Run in a child with the environment test_env_knobs gives it: knobs read
 * at start-up. The exit status says which check failed (6: a sticky error). */
/* The L2 size of VG_FAKECUDA_L2, the same in the attribute and in the
 * properties, in MiB (the tests' sizes are whole MiB); 255 where they
 * disagree, or where the persisting set-aside exceeds the cache or exists
 * before compute capability 8.0. */
static int l2_child(void)
{
    int l2 = -1, persisting = -1;
    struct cudaDeviceProp prop;
    if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&persisting, cudaDevAttrMaxPersistingL2CacheSize, 0) != cudaSuccess ||
        cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.l2CacheSize != l2 ||
        prop.persistingL2CacheMaxSize != persisting || persisting > l2 || (prop.major < 8 && persisting != 0) ||
        (prop.major >= 8 && persisting == 0))
        return 255;
    return l2 >> 20;
}

static void test_l2_knob(void)
{
    CHECK_EQ(rerun("", "--l2-child 2>/dev/null"), 50); /* an H100's, the default */
    CHECK_EQ(rerun("VG_FAKECUDA_L2=4MiB VG_FAKECUDA_CC=7.5", "--l2-child 2>/dev/null"), 4); /* a T4 */
    CHECK_EQ(rerun("VG_FAKECUDA_L2=41943040 VG_FAKECUDA_CC=8.0", "--l2-child 2>/dev/null"), 40);
    CHECK_EQ(rerun("VG_FAKECUDA_L2=2MiB VG_FAKECUDA_CC=8.6", "--l2-child 2>/dev/null"), 2);
    CHECK(rerun("VG_FAKECUDA_L2=0", "--l2-child 2>/dev/null") >= 128);
    CHECK(rerun("VG_FAKECUDA_L2=lots", "--l2-child 2>/dev/null") >= 128);
    CHECK(rerun("VG_FAKECUDA_L2=2GiB", "--l2-child 2>/dev/null") >= 128);
    CHECK(rerun("VG_FAKECUDA_L2=-4MiB", "--l2-child 2>/dev/null") >= 128);
}

static int env_child(void)
{
    int n = 0;
    void *a = NULL, *b = NULL;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n != 3)
        return 1;
    cudaSetDevice(2);
    if (vg_fakecuda_capacity(2) != (long long)(3 * MiB)) /* the last entry repeats */
        return 2;
    cudaError_t first = cudaMalloc(&a, 1);
    if (first == cudaErrorLaunchFailure)
        return 6;
    if (first != cudaSuccess || cudaMalloc(&b, 1) != cudaErrorMemoryAllocation)
        return 3;
    if (cudaMalloc(&b, 1) != cudaSuccess) /* count 1 by default */
        return 4;
    return 0;
}

/* A phantom (VG_FAKECUDA_PHANTOM=1, a 1 GiB device whose context takes
 * 100 MiB): free memory reads as on a card with its context; a copy to
 * the device and back reads zeros, counted; device memory has no host
 * pages (touching it faults: the child dies of SIGSEGV when asked to). */
static int phantom_child(int touch)
{
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess || total != 1024 * MiB || free_b != 924 * MiB)
        return 1;
    char *d = NULL;
    if (cudaMalloc((void **)&d, 4 * MiB) != cudaSuccess)
        return 2;
    char host[64];
    memset(host, 7, sizeof host);
    if (cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemset(d, 1, 4 * MiB) != cudaSuccess ||
        cudaMemcpy(d + 64, d, sizeof host, cudaMemcpyDeviceToDevice) != cudaSuccess)
        return 3;
    if (cudaMemcpy(host, d, sizeof host, cudaMemcpyDefault) != cudaSuccess || host[0] != 0 || host[63] != 0)
        return 4;
    if (vg_fakecuda_d2h_reads() != 1)
        return 5;
    char *more = NULL; /* not d: a failed cudaMalloc sets it to NULL, and d is touched below */
    if (cudaMalloc((void **)&more, 921 * MiB) != cudaErrorMemoryAllocation) /* 924 - 4 MiB free */
        return 6;
    cudaGetLastError();
    /* Virtual memory: 256 pages mapped one handle each under an open-file
     * limit of 32, which one descriptor per handle would break (taken for
     * an out-of-memory); the mappings cost no host memory either. */
    struct rlimit few = {32, 32};
    if (setrlimit(RLIMIT_NOFILE, &few) != 0)
        return 7;
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUdeviceptr va = 0;
    if (cuMemAddressReserve(&va, 512 * MiB, 0, 0, 0) != CUDA_SUCCESS)
        return 8;
    CUmemAccessDesc rw = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    for (size_t i = 0; i < 256; i++) {
        CUmemGenericAllocationHandle h;
        if (cuMemCreate(&h, 2 * MiB, &prop, 0) != CUDA_SUCCESS ||
            cuMemMap(va + i * 2 * MiB, 2 * MiB, 0, h, 0) != CUDA_SUCCESS || cuMemRelease(h) != CUDA_SUCCESS ||
            cuMemSetAccess(va + i * 2 * MiB, 2 * MiB, &rw, 1) != CUDA_SUCCESS)
            return 9;
    }
    if (cudaMemset((void *)(uintptr_t)va, 1, 512 * MiB) != cudaSuccess || cudaMemGetInfo(&free_b, &total) ||
        free_b != (924 - 4 - 512) * MiB)
        return 10;
    if (cuMemUnmap(va, 512 * MiB) != CUDA_SUCCESS || cuMemAddressFree(va, 512 * MiB) != CUDA_SUCCESS)
        return 11;
    if (touch)
        d[0] = 1;
    return 0;
}

static void test_env_knobs(void)
{
    CHECK_EQ(rerun("VG_FAKECUDA_DEVICES=3 VG_FAKECUDA_MEM=1MiB,3MiB "
                   "VG_FAKECUDA_FAIL=cudaMalloc:2:cudaErrorMemoryAllocation", "--env-child 2>/dev/null"), 0);
    /* A sticky error from the start, named by its driver name. */
    CHECK_EQ(rerun("VG_FAKECUDA_DEVICES=3 VG_FAKECUDA_MEM=3MiB VG_FAKECUDA_STICKY=CUDA_ERROR_LAUNCH_FAILED",
                   "--env-child 2>/dev/null"), 6);
    /* Malformed settings stop the process rather than run on other devices. */
    CHECK(rerun("VG_FAKECUDA_MEM=12XB", "--env-child 2>/dev/null") >= 128);
    CHECK(rerun("VG_FAKECUDA_DEVICES=17", "--env-child 2>/dev/null") >= 128);
    CHECK(rerun("VG_FAKECUDA_FAIL=cudaMallocc:1:2", "--env-child 2>/dev/null") >= 128);
    CHECK(rerun("VG_FAKECUDA_SMS=0", "--env-child 2>/dev/null") >= 128);
    CHECK(rerun("VG_FAKECUDA_PHANTOM=yes", "--env-child 2>/dev/null") >= 128);
    CHECK(rerun("VG_FAKECUDA_CONTEXT=lots", "--env-child 2>/dev/null") >= 128);
}

/* A phantom names a stub on stderr the first time it is called, once: the
 * child's stderr goes to a file, which must hold the name on one line. */
static int phantom_stub_child(void)
{
    char path[] = "/tmp/vg_fakecuda_stub_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || !freopen(path, "w", stderr))
        return 1;
    void *p = NULL;
    size_t pitch = 0;
    for (int i = 0; i < 3; i++)
        if (cudaMallocPitch(&p, &pitch, 64, 2) != cudaErrorNotSupported)
            return 2;
    fflush(stderr);
    FILE *f = fopen(path, "r");
    char line[512];
    int lines = 0, named = 0;
    while (f && fgets(line, sizeof line, f)) {
        lines++;
        named += strstr(line, "cudaMallocPitch is not modelled") != NULL;
    }
    if (f)
        fclose(f);
    close(fd);
    unlink(path);
    return lines == 1 && named == 1 ? 0 : 3;
}

static void test_phantom(void)
{
    const char *env = "VG_FAKECUDA_PHANTOM=1 VG_FAKECUDA_MEM=1GiB VG_FAKECUDA_CONTEXT=100MiB";
    CHECK_EQ(rerun(env, "--phantom-child 2>/dev/null"), 0);
    CHECK_EQ(rerun(env, "--phantom-stub 2>/dev/null"), 0);
    /* AddressSanitizer would report the fault and exit 1: let it through. */
    CHECK_EQ(rerun("ASAN_OPTIONS=handle_segv=0 VG_FAKECUDA_PHANTOM=1 VG_FAKECUDA_MEM=1GiB "
                   "VG_FAKECUDA_CONTEXT=100MiB", "--phantom-touch 2>/dev/null"), 128 + SIGSEGV);
}

/* ---- unified memory (core_memory.c, rt_memory.c) ----------------------- */

/* A prefetch of [ptr, ptr+n) to `device` (cudaCpuDeviceId: the host), in
 * the signature of the CUDA the test is built for. */
static cudaError_t prefetch_to(const void *ptr, size_t n, int device)
{
#if CUDART_VERSION >= 13000
    struct cudaMemLocation loc = {device == cudaCpuDeviceId ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice,
                                  device == cudaCpuDeviceId ? 0 : device};
    return cudaMemPrefetchAsync(ptr, n, loc, 0, 0);
#else
    return cudaMemPrefetchAsync(ptr, n, device, 0);
#endif
}

static cudaError_t advise_to(const void *ptr, size_t n, enum cudaMemoryAdvise advice, int device)
{
#if CUDART_VERSION >= 13000
    struct cudaMemLocation loc = {device == cudaCpuDeviceId ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice,
                                  device == cudaCpuDeviceId ? 0 : device};
    return cudaMemAdvise(ptr, n, advice, loc);
#else
    return cudaMemAdvise(ptr, n, advice, device);
#endif
}

/* Allocation (both attach flags), host reads and writes, copies and sets,
 * attributes, and that device memory is untouched by it. */
static void test_managed_alloc(void)
{
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    int attr = -1;
    CHECK_EQ(cudaDeviceGetAttribute(&attr, cudaDevAttrConcurrentManagedAccess, 0), cudaSuccess);
    CHECK_EQ(attr, 1);
    CHECK_EQ(cudaDeviceGetAttribute(&attr, cudaDevAttrManagedMemory, 1), cudaSuccess);
    CHECK_EQ(attr, 1);
    long long used0 = vg_fakecuda_bytes_in_use(0), managed0 = vg_fakecuda_managed_bytes(0);
    uint32_t *host_attached = NULL, *global = NULL;
    CHECK_EQ(cudaMallocManaged((void **)&host_attached, 3 * MiB, cudaMemAttachHost), cudaSuccess);
    CHECK_EQ(cudaMallocManaged((void **)&global, 4096, cudaMemAttachGlobal), cudaSuccess);
    CHECK(host_attached != NULL && global != NULL);
    CHECK_EQ(vg_fakecuda_managed_bytes(0), managed0 + 3 * MiB + 4096);
    CHECK_EQ(vg_fakecuda_managed_bytes(1), 0);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), used0); /* paged by the driver, not held */
    host_attached[0] = 7;
    host_attached[3 * MiB / 4 - 1] = 9;
    CHECK_EQ(host_attached[0] + host_attached[3 * MiB / 4 - 1], 16);
    struct cudaPointerAttributes attrs;
    CHECK_EQ(cudaPointerGetAttributes(&attrs, host_attached + 5), cudaSuccess);
    CHECK_EQ(attrs.type, cudaMemoryTypeManaged);
    CHECK_EQ(attrs.device, 0);
    CHECK(attrs.hostPointer == host_attached + 5 && attrs.devicePointer == host_attached + 5);
    /* Copies of any kind and sets reach it, and are real. */
    uint32_t word = 0xabcd, back = 0;
    CHECK_EQ(cudaMemcpy(global + 1, &word, sizeof word, cudaMemcpyHostToDevice), cudaSuccess);
    CHECK_EQ(global[1], 0xabcd);
    CHECK_EQ(cudaMemcpy(&back, global + 1, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK_EQ(back, 0xabcd);
    CHECK_EQ(cudaMemset(global, 0x11, 4), cudaSuccess);
    CHECK_EQ(global[0], 0x11111111u);
    /* Not a byte past its end. */
    CHECK_EQ(cudaMemset(global, 0, 4097), cudaErrorInvalidValue);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemcpy(global + 1, &word, 4096, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    /* On device 1: counted there. */
    void *on_one = NULL;
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaMallocManaged(&on_one, 8192, cudaMemAttachGlobal), cudaSuccess);
    CHECK_EQ(vg_fakecuda_managed_bytes(1), 8192);
    CHECK_EQ(cudaPointerGetAttributes(&attrs, on_one), cudaSuccess);
    CHECK_EQ(attrs.device, 1);
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    /* cudaFree frees it; cudaFreeHost does not, nor a pointer inside. */
    CHECK_EQ(cudaFreeHost(global), cudaErrorInvalidValue);
    CHECK_EQ(cudaFree(host_attached + 1), cudaErrorInvalidValue);
    cudaGetLastError();
    CHECK_EQ(cudaFree(host_attached), cudaSuccess);
    CHECK_EQ(cudaFree(global), cudaSuccess);
    CHECK_EQ(cudaFree(on_one), cudaSuccess);
    CHECK_EQ(vg_fakecuda_managed_bytes(0), managed0);
    CHECK_EQ(vg_fakecuda_managed_bytes(1), 0);
    CHECK_EQ(vg_fakecuda_managed_peak_bytes(0), managed0 + 3 * MiB + 4096);
    CHECK_EQ(vg_fakecuda_managed_peak_bytes(1), 8192);
    CHECK_EQ(cudaFree(global), cudaErrorInvalidValue); /* twice */
    cudaGetLastError();
}

static void test_managed_bad_arguments(void)
{
    void *p = (void *)1;
    CHECK_EQ(cudaMallocManaged(&p, 0, cudaMemAttachGlobal), cudaErrorInvalidValue);
    CHECK_EQ(cudaMallocManaged(NULL, 64, cudaMemAttachGlobal), cudaErrorInvalidValue);
    CHECK_EQ(cudaMallocManaged(&p, 64, cudaMemAttachSingle), cudaErrorInvalidValue); /* not at allocation */
    CHECK_EQ(cudaMallocManaged(&p, 64, 0), cudaErrorInvalidValue);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_EQ(vg_fakecuda_managed_bytes(0), 0);
    CHECK_EQ(vg_fakecuda_managed_bytes(2), -1);
    CHECK_EQ(vg_fakecuda_managed_peak_bytes(-1), -1);
    CHECK_EQ(vg_fakecuda_prefetched_bytes(2), -1);
    CHECK_EQ(vg_fakecuda_prefetched_peak_bytes(16), -1);
    /* Prefetch and advice take managed memory only. */
    void *dev = NULL, *managed = NULL;
    char host[64];
    CHECK_EQ(cudaMalloc(&dev, 4096), cudaSuccess);
    CHECK_EQ(cudaMallocManaged(&managed, 4096, cudaMemAttachGlobal), cudaSuccess);
    CHECK_EQ(prefetch_to(dev, 4096, 0), cudaErrorInvalidValue);
    CHECK_EQ(prefetch_to(host, sizeof host, 0), cudaErrorInvalidValue);
    CHECK_EQ(prefetch_to(NULL, 64, 0), cudaErrorInvalidValue);
    CHECK_EQ(prefetch_to(managed, 0, 0), cudaErrorInvalidValue);
    CHECK_EQ(prefetch_to(managed, 4097, 0), cudaErrorInvalidValue);
    CHECK_EQ(prefetch_to((char *)managed + 1, 4096, 0), cudaErrorInvalidValue);
    CHECK_EQ(prefetch_to(managed, 4096, 2), cudaErrorInvalidDevice);
    CHECK_EQ(prefetch_to(managed, 4096, -7), cudaErrorInvalidDevice);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
#if CUDART_VERSION >= 13000
    struct cudaMemLocation loc = {cudaMemLocationTypeDevice, 0};
    CHECK_EQ(cudaMemPrefetchAsync(managed, 4096, loc, 1, 0), cudaErrorInvalidValue); /* flags are 0 */
    CHECK_EQ(cudaMemPrefetchAsync(managed, 4096, loc, 0, (cudaStream_t)&loc), cudaErrorInvalidResourceHandle);
    loc.type = cudaMemLocationTypeInvalid;
    CHECK_EQ(cudaMemPrefetchAsync(managed, 4096, loc, 0, 0), cudaErrorInvalidValue);
#else
    CHECK_EQ(cudaMemPrefetchAsync(managed, 4096, 0, (cudaStream_t)host), cudaErrorInvalidResourceHandle);
#endif
    CHECK_EQ(vg_fakecuda_prefetched_bytes(0), 0);
    CHECK_EQ(advise_to(managed, 4096, cudaMemAdviseSetPreferredLocation, 0), cudaSuccess);
    CHECK_EQ(advise_to(managed, 4096, cudaMemAdviseSetAccessedBy, cudaCpuDeviceId), cudaSuccess);
    CHECK_EQ(advise_to(managed, 4096, cudaMemAdviseSetReadMostly, 5), cudaSuccess); /* no location read */
    CHECK_EQ(advise_to(managed, 4096, cudaMemAdviseSetPreferredLocation, 2), cudaErrorInvalidDevice);
    CHECK_EQ(advise_to(managed, 4096, (enum cudaMemoryAdvise)0, 0), cudaErrorInvalidValue);
    CHECK_EQ(advise_to(managed, 4096, (enum cudaMemoryAdvise)7, 0), cudaErrorInvalidValue);
    CHECK_EQ(advise_to(dev, 4096, cudaMemAdviseSetPreferredLocation, 0), cudaErrorInvalidValue);
    CHECK_EQ(advise_to(managed, 8192, cudaMemAdviseSetPreferredLocation, 0), cudaErrorInvalidValue);
    cudaGetLastError();
    CHECK_EQ(cudaFree(dev), cudaSuccess);
    CHECK_EQ(cudaFree(managed), cudaSuccess);
}

/* The managed bytes each device holds by its last prefetch: a prefetch
 * moves an allocation, to another device or back to the host. */
static void test_managed_prefetch(void)
{
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    vg_fakecuda_reset();
    char *a = NULL, *b = NULL;
    CHECK_EQ(cudaMallocManaged((void **)&a, 2 * MiB, cudaMemAttachHost), cudaSuccess);
    CHECK_EQ(cudaMallocManaged((void **)&b, MiB, cudaMemAttachGlobal), cudaSuccess);
    long long used = vg_fakecuda_bytes_in_use(0);
    CHECK_EQ(prefetch_to(a, 2 * MiB, 0), cudaSuccess);
    CHECK_EQ(prefetch_to(b + 4096, 8192, 0), cudaSuccess); /* a part */
    CHECK_EQ(vg_fakecuda_prefetched_bytes(0), 2 * MiB + 8192);
    CHECK_EQ(prefetch_to(b, MiB, 0), cudaSuccess); /* again, whole: counted once */
    CHECK_EQ(vg_fakecuda_prefetched_bytes(0), 3 * MiB);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), used);
    CHECK_EQ(prefetch_to(a, 2 * MiB, 1), cudaSuccess);
    CHECK_EQ(vg_fakecuda_prefetched_bytes(0), MiB);
    CHECK_EQ(vg_fakecuda_prefetched_bytes(1), 2 * MiB);
    CHECK_EQ(prefetch_to(b, MiB, cudaCpuDeviceId), cudaSuccess);
    CHECK_EQ(vg_fakecuda_prefetched_bytes(0), 0);
    CHECK_EQ(vg_fakecuda_prefetched_peak_bytes(0), 3 * MiB);
    CHECK_EQ(vg_fakecuda_prefetched_peak_bytes(1), 2 * MiB);
#if CUDART_VERSION < 13000 && CUDART_VERSION >= 12020
    struct cudaMemLocation loc = {cudaMemLocationTypeDevice, 0};
    CHECK_EQ(cudaMemPrefetchAsync_v2(b, MiB, loc, 0, 0), cudaSuccess);
    CHECK_EQ(vg_fakecuda_prefetched_bytes(0), MiB);
    loc.type = cudaMemLocationTypeHost;
    CHECK_EQ(cudaMemAdvise_v2(b, MiB, cudaMemAdviseSetPreferredLocation, loc), cudaSuccess);
    CHECK_EQ(cudaMemPrefetchAsync_v2(b, MiB, loc, 0, 0), cudaSuccess);
    CHECK_EQ(vg_fakecuda_prefetched_bytes(0), 0);
#endif
    CHECK_EQ(vg_fakecuda_calls("cudaMemPrefetchAsync"), 5);
    /* Freeing takes its resident bytes off. */
    CHECK_EQ(cudaFree(a), cudaSuccess);
    CHECK_EQ(vg_fakecuda_prefetched_bytes(1), 0);
    CHECK_EQ(cudaFree(b), cudaSuccess);
    vg_fakecuda_reset();
    CHECK_EQ(vg_fakecuda_prefetched_peak_bytes(0), 0);
    CHECK_EQ(vg_fakecuda_managed_peak_bytes(0), 0);
}

/* On a phantom, where device memory has no pages, managed memory is real:
 * written and read back by the host, by copies, by sets. Exits 0 when so. */
static int managed_phantom_child(void)
{
    uint64_t *p = NULL, in = 0x5eed, out = 0;
    if (cudaMallocManaged((void **)&p, 64 * MiB, cudaMemAttachHost) || !p)
        return 1;
    p[0] = 1;
    p[8 * MiB - 1] = 2;
    if (p[0] + p[8 * MiB - 1] != 3)
        return 2;
    if (cudaMemcpy(p + 1, &in, sizeof in, cudaMemcpyHostToDevice) || p[1] != in ||
        cudaMemcpy(&out, p + 1, sizeof out, cudaMemcpyDeviceToHost) || out != in)
        return 3;
    if (cudaMemset(p, 0, 8) || p[0] != 0 || prefetch_to(p, 64 * MiB, 0))
        return 4;
    if (vg_fakecuda_managed_bytes(0) != 64 * MiB || vg_fakecuda_prefetched_bytes(0) != 64 * MiB ||
        vg_fakecuda_d2h_reads() != 0)
        return 5;
    return cudaFree(p) ? 6 : 0;
}

static void test_managed_phantom(void)
{
    CHECK_EQ(rerun("VG_FAKECUDA_PHANTOM=1 VG_FAKECUDA_MEM=1GiB", "--managed-phantom-child 2>/dev/null"), 0);
}

/* ---- device addresses (core_memory.c) --------------------------------- */

/* In a fresh process: addresses go upward as a real driver's do, 2 MiB
 * apart at least, a freed hole is taken first by what fits in it, and the
 * memory (not a phantom's) is there to copy to and from. Exits 0 when so,
 * else the number of the check that failed. */
static int addresses_child(void)
{
    char *a, *b, *c, *d, *e, *f;
    if (cudaMalloc((void **)&a, 4 * MiB) || cudaMalloc((void **)&b, 4 * MiB) ||
        cudaMalloc((void **)&c, 512) || cudaMalloc((void **)&d, 3 * MiB))
        return 1;
    if (b != a + 4 * MiB || c != b + 4 * MiB || d != c + 2 * MiB)
        return 2;
    if (cudaFree(b) || cudaMalloc((void **)&e, 2 * MiB) || e != b)  /* the lowest hole that fits */
        return 3;
    if (cudaMalloc((void **)&f, 3 * MiB) || f != d + 4 * MiB)        /* 2 MiB left there: too small */
        return 4;
    if (!getenv("VG_FAKECUDA_PHANTOM")) {
        uint64_t out = 0, in = 0x5eed;
        if (cudaMemcpy(e + MiB, &in, sizeof in, cudaMemcpyHostToDevice) ||
            cudaMemcpy(&out, e + MiB, sizeof out, cudaMemcpyDeviceToHost) || out != in)
            return 5;
    }
    char *other;
    if (cudaSetDevice(1) || cudaMalloc((void **)&other, 4 * MiB) || (other >= a && other < f + 4 * MiB))
        return 6;                                                      /* each device its own space */
    if (cudaFree(a) || cudaFree(c) || cudaFree(d) || cudaFree(e) || cudaFree(f) || cudaFree(other))
        return 7;
    /* Address space reserved for mappings goes upward too (PyTorch's
     * expandable segments take the lowest-addressed one with room first),
     * at the alignment asked, a freed range the lowest hole again. */
    CUdeviceptr r1, r2, r3, r4;
    if (cuMemAddressReserve(&r1, 64 * MiB, 0, 0, 0) || cuMemAddressReserve(&r2, 6 * MiB, 0, 0, 0) ||
        cuMemAddressReserve(&r3, 64 * MiB, 64 * MiB, 0, 0))
        return 8;
    if (r2 != r1 + 64 * MiB || r3 % (64 * MiB) || r3 < r2 + 6 * MiB || r3 >= r2 + 6 * MiB + 64 * MiB)
        return 9;
    if (cuMemAddressFree(r1, 64 * MiB) || cuMemAddressReserve(&r4, 32 * MiB, 0, 0, 0) || r4 != r1)
        return 10;
    return cuMemAddressFree(r2, 6 * MiB) || cuMemAddressFree(r3, 64 * MiB) || cuMemAddressFree(r4, 32 * MiB) ? 11 : 0;
}

static void test_addresses_upward(void)
{
    CHECK_EQ(rerun("VG_FAKECUDA_MEM=1GiB,512MiB", "--addresses-child"), 0);
    CHECK_EQ(rerun("VG_FAKECUDA_PHANTOM=1 VG_FAKECUDA_MEM=1GiB,512MiB", "--addresses-child"), 0);
}

/* ---- what a kernel was compiled for (rt_fatbin.c) ---------------------- */

void **__cudaRegisterFatBinary(void *fat_cubin);
void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun, const char *device_name,
                            int thread_limit, uint3 *tid, uint3 *bid, dim3 *block, dim3 *grid, int *wsize);

/* A fat binary as nvcc lays it out: a 16-byte header, then per entry a
 * 64-byte header (kind, header size, payload size, arch at byte 28) and an
 * 8-byte payload. */
typedef struct {
    uint32_t magic, version;
    const unsigned char *data;
    const void *unused;
} test_wrapper;

static size_t make_fatbin(unsigned char *buf, const uint16_t *kinds, const uint32_t *archs, int n)
{
    memset(buf, 0, 16 + (size_t)n * 72);
    uint32_t magic = 0xBA55ED50u;
    uint16_t header = 16;
    uint64_t size = (uint64_t)n * 72;
    memcpy(buf, &magic, 4);
    memcpy(buf + 6, &header, 2);
    memcpy(buf + 8, &size, 8);
    for (int i = 0; i < n; i++) {
        unsigned char *e = buf + 16 + (size_t)i * 72;
        uint32_t entry_header = 64;
        uint64_t payload = 8;
        memcpy(e, &kinds[i], 2);
        memcpy(e + 4, &entry_header, 4);
        memcpy(e + 8, &payload, 8);
        memcpy(e + 28, &archs[i], 4);
    }
    return 16 + (size_t)n * 72;
}

static void register_kernel(const unsigned char *fatbin, const void *stub)
{
    static test_wrapper wrappers[8];
    static int used;
    test_wrapper *w = &wrappers[used++];
    *w = (test_wrapper){0x466243b1u, 1, fatbin, NULL};
    void **handle = __cudaRegisterFatBinary(w);
    __cudaRegisterFunction(handle, stub, (char *)"k", "k", -1, NULL, NULL, NULL, NULL, NULL);
}

/* Kernels compiled for: sm_75, sm_86, sm_90 (stub_90); sm_75 and sm_86
 * only (stub_none); sm_80 and compute_80 PTX (stub_ptx); a damaged fat
 * binary whose entry claims more than it holds (stub_damaged). */
static const char stub_90, stub_none, stub_ptx, stub_damaged, stub_unknown;

static void register_test_kernels(void)
{
    static unsigned char with_90[16 + 3 * 72], without[16 + 2 * 72], ptx[16 + 2 * 72], damaged[16 + 72];
    make_fatbin(with_90, (uint16_t[]){2, 2, 2}, (uint32_t[]){75, 86, 90}, 3);
    make_fatbin(without, (uint16_t[]){2, 2}, (uint32_t[]){75, 86}, 2);
    make_fatbin(ptx, (uint16_t[]){2, 1}, (uint32_t[]){80, 80}, 2);
    make_fatbin(damaged, (uint16_t[]){2}, (uint32_t[]){90}, 1);
    uint64_t huge = UINT64_MAX;
    memcpy(damaged + 16 + 8, &huge, 8);
    register_kernel(with_90, &stub_90);
    register_kernel(without, &stub_none);
    register_kernel(ptx, &stub_ptx);
    register_kernel(damaged, &stub_damaged);
}

/* Run with VG_FAKECUDA_CC set: exits with the binaryVersion of stub_90
 * (or stub_ptx), 255 when there is no image. */
static int arch_child(int which)
{
    register_test_kernels();
    struct cudaFuncAttributes attr;
    const void *stub = which ? (const void *)&stub_ptx : (const void *)&stub_90;
    if (cudaFuncGetAttributes(&attr, stub) != cudaSuccess)
        return 255;
    return attr.binaryVersion;
}

static void test_kernel_architectures(void)
{
    /* PyTorch's wheels carry SASS for some architectures and no PTX. On the
     * default 9.0, sm_90 code reports 90; a kernel with no code a 9.0 runs
     * has no image, as on a card; compute_80 PTX is compiled for 9.0. */
    register_test_kernels();
    struct cudaFuncAttributes attr;
    CHECK_EQ(cudaFuncGetAttributes(&attr, &stub_90), cudaSuccess);
    CHECK_EQ(attr.binaryVersion, 90);
    CHECK_EQ(attr.ptxVersion, 90);
    CHECK_EQ(cudaFuncGetAttributes(&attr, &stub_none), cudaErrorNoKernelImageForDevice);
    CHECK_EQ(cudaGetLastError(), cudaErrorNoKernelImageForDevice);
    CHECK_EQ(cudaFuncGetAttributes(&attr, &stub_ptx), cudaSuccess);
    CHECK_EQ(attr.binaryVersion, 90);
    CHECK_EQ(attr.ptxVersion, 80);
    CHECK_EQ(cudaFuncGetAttributes(&attr, &stub_damaged), cudaSuccess); /* nothing read: the device's own */
    CHECK_EQ(attr.binaryVersion, 90);
    CHECK_EQ(cudaFuncGetAttributes(&attr, &stub_unknown), cudaSuccess); /* never registered: likewise */
    CHECK_EQ(attr.binaryVersion, 90);
    /* An L4 (8.9) runs the sm_86 code, a T4 (7.5) the sm_75, a 7.0 card
     * none of it; an 8.6 runs sm_80 code rather than compiling the PTX. */
    CHECK_EQ(rerun("VG_FAKECUDA_CC=8.9", "--arch-child 2>/dev/null"), 86);
    CHECK_EQ(rerun("VG_FAKECUDA_CC=7.5", "--arch-child 2>/dev/null"), 75);
    CHECK_EQ(rerun("VG_FAKECUDA_CC=7.0", "--arch-child 2>/dev/null"), 255);
    CHECK_EQ(rerun("VG_FAKECUDA_CC=8.6", "--arch-child-ptx 2>/dev/null"), 80);
}

/* vg_fakecuda_call_at_exit: fn(status) once at exit() of the process that
 * armed it, never in one forked from it, never after NULL disarmed it; the
 * latest arming's handler runs (what a dry run's child relies on). */
static int at_exit_pipe = -1;

static void note_exit(int status)
{
    unsigned char byte = (unsigned char)status;
    if (write(at_exit_pipe, &byte, 1) != 1)
        _exit(99);
}

/* What exit(status) in a child that armed `arm` (and then disarmed, when
 * `disarm`) wrote to the pipe: the bytes, -1 terminated. */
static void exit_notes(int status, int disarm, int fork_first, int *out)
{
    int fds[2];
    CHECK_EQ(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        at_exit_pipe = fds[1];
        vg_fakecuda_call_at_exit(note_exit);
        vg_fakecuda_call_at_exit(note_exit); /* armed twice: still once */
        if (fork_first) {                     /* a forked process's exit() calls nothing */
            pid_t grandchild = fork();
            if (grandchild == 0)
                exit(42);
            waitpid(grandchild, NULL, 0);
        }
        if (disarm)
            vg_fakecuda_call_at_exit(NULL);
        exit(status);
    }
    close(fds[1]);
    int n = 0;
    unsigned char byte;
    while (n < 3 && read(fds[0], &byte, 1) == 1)
        out[n++] = byte;
    out[n] = -1;
    close(fds[0]);
    int wstatus = 0;
    CHECK_EQ(waitpid(pid, &wstatus, 0), pid);
    CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == status);
}

static void test_call_at_exit(void)
{
    int notes[4];
    exit_notes(7, 0, 0, notes);
    CHECK_EQ(notes[0], 7);
    CHECK_EQ(notes[1], -1);
    exit_notes(3, 0, 1, notes);
    CHECK_EQ(notes[0], 3); /* the child's, not the grandchild's 42 */
    CHECK_EQ(notes[1], -1);
    exit_notes(5, 1, 0, notes);
    CHECK_EQ(notes[0], -1);
}

/* ---- launches per library that registered kernels (rt_fatbin.c) ------- */

/* The index of the library whose path is `path`, -1 when none. */
static int library_named(const char *path)
{
    for (int i = 0; i < vg_fakecuda_kernel_libraries(); i++)
        if (strcmp(vg_fakecuda_kernel_library(i), path) == 0)
            return i;
    return -1;
}

static const char stub_lib_a, stub_lib_b, stub_heap, stub_never_registered;

static void test_launches_per_library(void)
{
    /* Two kernels of one fat binary whose wrapper lies in this program (a
     * library's registration lies in that library), one of a fat binary
     * whose wrapper lies in no loaded object (its library is ""). */
    static unsigned char image[16 + 72];
    static test_wrapper in_program;
    make_fatbin(image, (uint16_t[]){2}, (uint32_t[]){90}, 1);
    in_program = (test_wrapper){0x466243b1u, 1, image, NULL};
    void **handle = __cudaRegisterFatBinary(&in_program);
    __cudaRegisterFunction(handle, &stub_lib_a, (char *)"a", "a", -1, NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFunction(handle, &stub_lib_b, (char *)"b", "b", -1, NULL, NULL, NULL, NULL, NULL);
    test_wrapper *on_heap = malloc(sizeof *on_heap);
    CHECK(on_heap != NULL);
    *on_heap = (test_wrapper){0x466243b1u, 1, image, NULL};
    __cudaRegisterFunction(__cudaRegisterFatBinary(on_heap), &stub_heap, (char *)"h", "h", -1, NULL, NULL, NULL,
                           NULL, NULL);
    free(on_heap); /* registration reads the wrapper, keeps nothing of it */

    Dl_info info;
    CHECK(dladdr(&in_program, &info) && info.dli_fname);
    int program = library_named(info.dli_fname), unknown = library_named("");
    CHECK(program >= 0 && unknown >= 0 && program != unknown);
    long launches = vg_fakecuda_kernel_library_launches(program);
    long kernels = vg_fakecuda_kernel_library_kernels(program);
    long unknown_launches = vg_fakecuda_kernel_library_launches(unknown);
    long unknown_kernels = vg_fakecuda_kernel_library_kernels(unknown);

    dim3 one = {1, 1, 1};
    for (int i = 0; i < 3; i++)
        CHECK_EQ(cudaLaunchKernel(&stub_lib_a, one, one, NULL, 0, 0), cudaSuccess);
    cudaLaunchConfig_t config = {.gridDim = one, .blockDim = one, .stream = 0};
    CHECK_EQ(cudaLaunchKernelExC(&config, &stub_lib_b, NULL), cudaSuccess);
    CHECK_EQ(cudaLaunchKernel(&stub_heap, one, one, NULL, 0, 0), cudaSuccess);
    long expected = 3 + 1;
    /* Not counted: a kernel no fat binary registered, a launch that fails. */
    CHECK_EQ(cudaLaunchKernel(&stub_never_registered, one, one, NULL, 0, 0), cudaSuccess);
    dim3 too_big = {1, 1, 4096};
    CHECK_EQ(cudaLaunchKernel(&stub_lib_a, one, too_big, NULL, 0, 0), cudaErrorInvalidConfiguration);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
#if CUDART_VERSION >= 13000
    cudaKernel_t kernel;
    CHECK_EQ(__cudaGetKernel(&kernel, &stub_lib_b), cudaSuccess);
    CHECK_EQ(__cudaLaunchKernel(kernel, one, one, NULL, 0, 0), cudaSuccess); /* CUDA 13's form */
    expected++;
#endif
    CHECK_EQ(vg_fakecuda_kernel_library_launches(program) - launches, expected);
    CHECK_EQ(vg_fakecuda_kernel_library_kernels(program) - kernels, 2);
    CHECK_EQ(vg_fakecuda_kernel_library_launches(unknown) - unknown_launches, 1);
    CHECK_EQ(vg_fakecuda_kernel_library_kernels(unknown) - unknown_kernels, 1);
    /* A reset leaves them; indices past the end answer NULL and -1. */
    vg_fakecuda_reset();
    CHECK_EQ(vg_fakecuda_kernel_library_kernels(program) - kernels, 2);
    int n = vg_fakecuda_kernel_libraries();
    CHECK(vg_fakecuda_kernel_library(n) == NULL && vg_fakecuda_kernel_library(-1) == NULL);
    CHECK_EQ(vg_fakecuda_kernel_library_launches(n), -1);
    CHECK_EQ(vg_fakecuda_kernel_library_kernels(-1), -1);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--arch-child") == 0)
        return arch_child(0);
    if (argc > 1 && strcmp(argv[1], "--arch-child-ptx") == 0)
        return arch_child(1);
    if (argc > 1 && strcmp(argv[1], "--env-child") == 0)
        return env_child();
    if (argc > 1 && strcmp(argv[1], "--l2-child") == 0)
        return l2_child();
    if (argc > 1 && strcmp(argv[1], "--addresses-child") == 0)
        return addresses_child();
    if (argc > 1 && strcmp(argv[1], "--managed-phantom-child") == 0)
        return managed_phantom_child();
    if (argc > 1 && strcmp(argv[1], "--phantom-stub") == 0)
        return phantom_stub_child();
    if (argc > 1 && strncmp(argv[1], "--phantom-", 10) == 0)
        return phantom_child(strcmp(argv[1], "--phantom-touch") == 0);
    /* Before the first CUDA call, which reads them. */
    setenv("VG_FAKECUDA_DEVICES", "2", 1);
    setenv("VG_FAKECUDA_MEM", "1GiB,512MiB", 1);
    static const harness_test tests[] = {
        {"devices", test_devices},
        {"l2_knob", test_l2_knob},
        {"kernel_architectures", test_kernel_architectures},
        {"launches_per_library", test_launches_per_library},
        {"malloc_to_capacity", test_malloc_to_capacity},
        {"capacity_knob", test_capacity_knob},
        {"fail_malloc", test_fail_malloc},
        {"sticky_error", test_sticky_error},
        {"copies", test_copies},
        {"streams_and_events", test_streams_and_events},
        {"graph_capture_and_replay", test_graph_capture_and_replay},
        {"graph_capture_modes", test_graph_capture_modes},
        {"graph_capture_streams", test_graph_capture_streams},
        {"graph_user_objects", test_graph_user_objects},
        {"graph_nodes_and_attributes", test_graph_nodes_and_attributes},
        {"unsupported", test_unsupported},
        {"driver", test_driver},
        {"launches", test_launches},
        {"vmm", test_vmm},
        {"env_knobs", test_env_knobs},
        {"phantom", test_phantom},
        {"addresses_upward", test_addresses_upward},
        {"managed_alloc", test_managed_alloc},
        {"managed_bad_arguments", test_managed_bad_arguments},
        {"managed_prefetch", test_managed_prefetch},
        {"managed_phantom", test_managed_phantom},
        {"call_at_exit", test_call_at_exit},
    };
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
