/* The fake CUDA's own test, linked against the fake runtime and driver:
 * two devices of 1 GiB and 512 MiB (set below, before the first call),
 * exact memory accounting, the fault knobs, streams and events, the stubs,
 * and the driver's contexts, entry points and VMM calls.
 *
 *   make test-fakecuda       all of it
 *   build/fakecuda/test_fakecuda vmm    the tests whose name contains "vmm"
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
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

static void test_unsupported(void)
{
    vg_fakecuda_reset();
    void *managed = NULL;
    CHECK_EQ(cudaMallocManaged(&managed, 64, cudaMemAttachGlobal), cudaErrorNotSupported);
    CHECK_EQ(cudaGetLastError(), cudaErrorNotSupported);
    CHECK_EQ(vg_fakecuda_unsupported_calls(), 1);
    CHECK(strcmp(vg_fakecuda_last_unsupported(), "cudaMallocManaged") == 0);
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

    /* Two handles side by side: one piece of memory to a copy. */
    CHECK_EQ(cuMemMap(va, 2 * MiB, 0, h1, 0), CUDA_SUCCESS);
    CHECK_EQ(cuMemMap(va + 2 * MiB, 4 * MiB, 0, h2, 0), CUDA_SUCCESS);
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

/* Runs this program again with `env` in front; its exit status. */
static int rerun(const char *env, const char *arg)
{
    char self[4096], cmd[8192];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len < 0)
        return -1;
    self[len] = 0;
    snprintf(cmd, sizeof cmd, "env %s '%s' %s 2>/dev/null", env, self, arg);
    int status = system(cmd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_env_knobs(void)
{
    CHECK_EQ(rerun("VG_FAKECUDA_DEVICES=3 VG_FAKECUDA_MEM=1MiB,3MiB "
                   "VG_FAKECUDA_FAIL=cudaMalloc:2:cudaErrorMemoryAllocation", "--env-child"), 0);
    /* A sticky error from the start, named by its driver name. */
    CHECK_EQ(rerun("VG_FAKECUDA_DEVICES=3 VG_FAKECUDA_MEM=3MiB VG_FAKECUDA_STICKY=CUDA_ERROR_LAUNCH_FAILED",
                   "--env-child"), 6);
    /* Malformed settings stop the process rather than run on other devices. */
    CHECK(rerun("VG_FAKECUDA_MEM=12XB", "--env-child") >= 128);
    CHECK(rerun("VG_FAKECUDA_DEVICES=17", "--env-child") >= 128);
    CHECK(rerun("VG_FAKECUDA_FAIL=cudaMallocc:1:2", "--env-child") >= 128);
    CHECK(rerun("VG_FAKECUDA_SMS=0", "--env-child") >= 128);
    CHECK(rerun("VG_FAKECUDA_PHANTOM=yes", "--env-child") >= 128);
    CHECK(rerun("VG_FAKECUDA_CONTEXT=lots", "--env-child") >= 128);
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
    for (int i = 0; i < 3; i++)
        if (cudaMallocManaged(&p, 64, cudaMemAttachGlobal) != cudaErrorNotSupported)
            return 2;
    fflush(stderr);
    FILE *f = fopen(path, "r");
    char line[512];
    int lines = 0, named = 0;
    while (f && fgets(line, sizeof line, f)) {
        lines++;
        named += strstr(line, "cudaMallocManaged is not modelled") != NULL;
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
    CHECK_EQ(rerun(env, "--phantom-child"), 0);
    CHECK_EQ(rerun(env, "--phantom-stub"), 0);
    /* AddressSanitizer would report the fault and exit 1: let it through. */
    CHECK_EQ(rerun("ASAN_OPTIONS=handle_segv=0 VG_FAKECUDA_PHANTOM=1 VG_FAKECUDA_MEM=1GiB "
                   "VG_FAKECUDA_CONTEXT=100MiB", "--phantom-touch"), 128 + SIGSEGV);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--env-child") == 0)
        return env_child();
    if (argc > 1 && strcmp(argv[1], "--phantom-stub") == 0)
        return phantom_stub_child();
    if (argc > 1 && strncmp(argv[1], "--phantom-", 10) == 0)
        return phantom_child(strcmp(argv[1], "--phantom-touch") == 0);
    /* Before the first CUDA call, which reads them. */
    setenv("VG_FAKECUDA_DEVICES", "2", 1);
    setenv("VG_FAKECUDA_MEM", "1GiB,512MiB", 1);
    static const harness_test tests[] = {
        {"devices", test_devices},
        {"malloc_to_capacity", test_malloc_to_capacity},
        {"capacity_knob", test_capacity_knob},
        {"fail_malloc", test_fail_malloc},
        {"sticky_error", test_sticky_error},
        {"copies", test_copies},
        {"streams_and_events", test_streams_and_events},
        {"unsupported", test_unsupported},
        {"driver", test_driver},
        {"launches", test_launches},
        {"vmm", test_vmm},
        {"env_knobs", test_env_knobs},
        {"phantom", test_phantom},
    };
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
