/* Driver API: the legacy entry points the real libcuda.so.1 still exports
 * beside their _v2 successors, for callers that look a driver function up by
 * its bare name (PyTorch 2.6's c10/cuda/driver_api.cpp dlsyms
 * "cuStreamWriteValue32"). cuda.h declares them only for the driver's own
 * build (__CUDA_API_VERSION_INTERNAL), so this file alone sees them, and
 * includes nothing of the fake that relies on the macros mapping the bare
 * names to the _v2 ones.
 *
 * Only those a caller is known to look up are written here, each
 * forwarding to its successor. gen_fakecuda.py
 * stubs the others (cuMemAlloc with 32-bit pointers and the like), so that
 * they fail as unsupported rather than being missing.
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#if CUDA_VERSION >= 12000 /* before, the bare names are the ones drv_*.c define */
CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    return cuStreamWriteValue32_v2(stream, addr, value, flags);
}

/* CUDA 11's lookup, without the status its successor reports. */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, NULL);
}
#endif

