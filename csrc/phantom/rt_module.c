/* Runtime API: what every CUDA library calls when it loads (fat binary and
 * kernel registration), the launch configuration that nvcc's kernel stubs
 * push and pop, and driver entry points.
 *
 * Registration keeps what each kernel was compiled for (rt_fatbin.c), for
 * cudaFuncGetAttributes; no kernel will run (launches succeed and do
 * nothing: rt_launch.c).
 *
 * The registration functions are private to nvcc's generated code and
 * declared in no public header; their signatures are the ones nvcc emits.
 */
#include "rt.h"
#include "rt_fatbin.h"

#include <cuda.h>
#include <stddef.h>

void **__cudaRegisterFatBinary(void *fat_cubin);
void __cudaRegisterFatBinaryEnd(void **handle);
void __cudaUnregisterFatBinary(void **handle);
void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun, const char *device_name,
                            int thread_limit, uint3 *tid, uint3 *bid, dim3 *block, dim3 *grid, int *wsize);
void __cudaRegisterVar(void **handle, char *host_var, char *device_address, const char *device_name,
                       int ext, size_t size, int constant, int global);
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared_mem, void *stream);
cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared_mem, void *stream);

/* The handle is the fat binary's record (rt_fatbin.c); without memory for
 * one, a shared handle whose kernels answer as built for the device. */
static void *no_record;

void **__cudaRegisterFatBinary(void *fat_cubin)
{
    rt_fatbin *fatbin = rt_fatbin_register(fat_cubin);
    return fatbin ? (void **)fatbin : &no_record;
}

void __cudaRegisterFatBinaryEnd(void **handle)
{
    (void)handle;
}

void __cudaUnregisterFatBinary(void **handle)
{
    (void)handle;
}

void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun, const char *device_name,
                            int thread_limit, uint3 *tid, uint3 *bid, dim3 *block, dim3 *grid, int *wsize)
{
    (void)device_fun, (void)device_name, (void)thread_limit;
    (void)tid, (void)bid, (void)block, (void)grid, (void)wsize;
    if (handle && handle != &no_record) rt_fatbin_add_kernel((rt_fatbin *)handle, host_fun);
}

void __cudaRegisterVar(void **handle, char *host_var, char *device_address, const char *device_name,
                       int ext, size_t size, int constant, int global)
{
    (void)handle, (void)host_var, (void)device_address, (void)device_name;
    (void)ext, (void)size, (void)constant, (void)global;
}

/* nvcc's `kernel<<<grid, block, shmem, stream>>>(...)` pushes the
 * configuration, and the kernel's host stub pops it before launching. */
static _Thread_local struct {
    dim3 grid, block;
    size_t shared_mem;
    void *stream;
} call_config;

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared_mem, void *stream)
{
    call_config.grid = grid;
    call_config.block = block;
    call_config.shared_mem = shared_mem;
    call_config.stream = stream;
    return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared_mem, void *stream)
{
    *grid = call_config.grid;
    *block = call_config.block;
    *shared_mem = call_config.shared_mem;
    *(void **)stream = call_config.stream;
    return cudaSuccess;
}

/* ---- driver entry points ----------------------------------------------- */

#if CUDART_VERSION >= 12000
static cudaError_t entry_point(const char *symbol, void **fn, int version, unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *status)
{
    if (!symbol || !fn)
        return rt_error(cudaErrorInvalidValue);
    CUdriverProcAddressQueryResult found;
    CUresult res = cuGetProcAddress(symbol, fn, version, (cuuint64_t)flags, &found);
    if (status)
        *status = res == CUDA_SUCCESS ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    /* A name the driver lacks is an answer (status), not an error. */
    return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *status)
{
    RT_ENTER(cudaGetDriverEntryPoint);
    return entry_point(symbol, fn, CUDART_VERSION, flags, status);
}
#else /* CUDA 11's has no status: a name the driver lacks is an error */
cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags)
{
    RT_ENTER(cudaGetDriverEntryPoint);
    if (!symbol || !fn)
        return rt_error(cudaErrorInvalidValue);
    CUresult res = cuGetProcAddress(symbol, fn, CUDART_VERSION, (cuuint64_t)flags);
    return res == CUDA_SUCCESS ? cudaSuccess : rt_error(cudaErrorSymbolNotFound);
}
#endif

#if CUDART_VERSION >= 12050 /* CUDA 12.5 on */
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status)
{
    RT_ENTER(cudaGetDriverEntryPointByVersion);
    return entry_point(symbol, fn, (int)version, flags, status);
}
#endif
