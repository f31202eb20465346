/* The launch calls nvcc's generated code makes in CUDA 13 (declared in
 * crt/device_functions.h for device compilation only, so in no header a C
 * file can include): a kernel's handle from its host stub, then the launch. */
#ifndef VGFC_RT_LAUNCH_H
#define VGFC_RT_LAUNCH_H

#include <cuda_runtime_api.h>

#if CUDART_VERSION >= 13000
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared_mem,
                               cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared_mem,
                                    cudaStream_t stream);
#endif

#endif
