/* Runtime API: kernel launches and what is asked of a kernel before one.
 *
 * No kernel runs here. A launch on a valid stream succeeds and does
 * nothing (counted: vg_fakecuda_calls("__cudaLaunchKernel"), and per library
 * that registered the kernel: rt_fatbin_count_launch), which is all
 * a caching allocator's user needs: PyTorch makes the same allocations
 * whether or not the kernels between them compute. What kernels would have
 * written reads as whatever the memory held (on a phantom, zeros).
 *
 * CUDA 13's nvcc stubs launch through __cudaGetKernel + __cudaLaunchKernel;
 * older code and libraries through cudaLaunchKernel and its Ex form.
 * Host functions and stream callbacks run at once: every call here
 * completes before it returns, so the stream is already where they wait.
 * On a capturing stream (rt_graph.c) a launch or host function is a node
 * of the capture's graph instead (a host function runs at each replay); a
 * stream callback is refused there, as by CUDA.
 */
#include "rt.h"

#include <stddef.h>

#include "rt_launch.h"
#include "rt_fatbin.h"

/* What every launch checks: a stream that exists, a block the device can
 * run (vgfc_launch_shape_ok). */
static cudaError_t launch(const void *stub, dim3 grid, dim3 block, cudaStream_t stream)
{
    if (rt_stream_device(stream) < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    if (!vgfc_launch_shape_ok(grid.x, grid.y, grid.z, block.x, block.y, block.z))
        return rt_error(cudaErrorInvalidConfiguration);
    cudaError_t err;
    rt_capture_work(stream, cudaGraphNodeTypeKernel, NULL, NULL, &err);
    if (err == cudaSuccess) rt_fatbin_count_launch(stub);
    return err;
}

#if CUDART_VERSION >= 13000
/* A kernel's handle is its host stub's address: nothing is looked up. */
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func)
{
    if (!kernel || !func)
        return rt_error(cudaErrorInvalidDeviceFunction);
    *kernel = (cudaKernel_t)(uintptr_t)func;
    return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared_mem,
                               cudaStream_t stream)
{
    RT_ENTER(__cudaLaunchKernel);
    (void)args, (void)shared_mem;
    return launch((const void *)kernel, grid, block, stream);
}

cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared_mem,
                                    cudaStream_t stream)
{
    RT_ENTER(__cudaLaunchKernel);
    (void)args, (void)shared_mem;
    return launch((const void *)kernel, grid, block, stream);
}

#endif

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared_mem,
                             cudaStream_t stream)
{
    RT_ENTER(cudaLaunchKernel);
    (void)args, (void)shared_mem;
    return launch(func, grid, block, stream);
}

#if CUDART_VERSION >= 11080 /* launches with attributes came with CUDA 11.8 */
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    RT_ENTER(cudaLaunchKernelExC);
    (void)args;
    if (!config)
        return rt_error(cudaErrorInvalidValue);
    return launch(func, config->gridDim, config->blockDim, config->stream);
}
#endif

cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared_mem,
                                        cudaStream_t stream)
{
    RT_ENTER(cudaLaunchCooperativeKernel);
    (void)args, (void)shared_mem;
    return launch(func, grid, block, stream);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *user_data)
{
    RT_ENTER(cudaLaunchHostFunc);
    if (!fn)
        return rt_error(cudaErrorInvalidValue);
    if (rt_stream_device(stream) < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    cudaError_t err;
    if (!rt_capture_work(stream, cudaGraphNodeTypeHost, fn, user_data, &err))
        fn(user_data);
    return err;
}

cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback, void *user_data,
                                  unsigned int flags)
{
    RT_ENTER(cudaStreamAddCallback);
    if (!callback || flags != 0)
        return rt_error(cudaErrorInvalidValue);
    if (rt_stream_device(stream) < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    cudaError_t err = rt_capture_stream_wait(stream);
    if (!err && !rt_capture_work(stream, cudaGraphNodeTypeEmpty, NULL, NULL, &err))
        callback(stream, cudaSuccess, user_data);
    return err;
}

/* ---- what callers ask of a kernel before launching it ------------------ */

/* One answer for every kernel: a small one that any block size fits,
 * compiled for what its fat binary holds that the device runs
 * (rt_fatbin.c). */
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
    RT_ENTER(cudaFuncGetAttributes);
    if (!attr || !func)
        return rt_error(cudaErrorInvalidDeviceFunction);
    int binary, ptx;
    int err = rt_fatbin_versions(func, vgfc_cc_major(), vgfc_cc_minor(), &binary, &ptx);
    if (err)
        return rt_error(err);
    *attr = (struct cudaFuncAttributes){
        .maxThreadsPerBlock = 1024,
        .numRegs = 32,
        .ptxVersion = ptx,
        .binaryVersion = binary,
        .maxDynamicSharedSizeBytes = 48 << 10,
        .preferredShmemCarveout = -1,
    };
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    RT_ENTER(cudaFuncSetAttribute);
    (void)attr, (void)value;
    return func ? cudaSuccess : rt_error(cudaErrorInvalidDeviceFunction);
}

#if CUDART_VERSION >= 13000
cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t kernel, enum cudaFuncAttribute attr, int value, int device)
{
    RT_ENTER(cudaKernelSetAttributeForDevice);
    (void)attr, (void)value;
    if (!kernel)
        return rt_error(cudaErrorInvalidDeviceFunction);
    return vgfc_valid_device(device) ? cudaSuccess : rt_error(cudaErrorInvalidDevice);
}
#endif

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *num_blocks, const void *func, int block_size,
                                                          size_t dynamic_smem)
{
    RT_ENTER(cudaOccupancyMaxActiveBlocksPerMultiprocessor);
    (void)dynamic_smem;
    if (!num_blocks || !func)
        return rt_error(cudaErrorInvalidValue);
    *num_blocks = vgfc_blocks_per_sm(block_size);
    return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *num_blocks, const void *func,
                                                                   int block_size, size_t dynamic_smem,
                                                                   unsigned int flags)
{
    RT_ENTER(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags);
    (void)dynamic_smem, (void)flags;
    if (!num_blocks || !func)
        return rt_error(cudaErrorInvalidValue);
    *num_blocks = vgfc_blocks_per_sm(block_size);
    return cudaSuccess;
}

/* A __constant__ or __device__ variable's bytes: no kernel reads them. */
cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count, size_t offset,
                               enum cudaMemcpyKind kind)
{
    RT_ENTER(cudaMemcpyToSymbol);
    (void)offset, (void)kind;
    return symbol && (src || !count) ? cudaSuccess : rt_error(cudaErrorInvalidSymbol);
}
