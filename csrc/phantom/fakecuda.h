/* The fake CUDA's test knobs: what a test may ask of the fake device at run
 * time, from C (link or dlsym) or from Python (ctypes.CDLL(None) in a
 * process started with the fake preloaded). The fake driver, libcuda.so.1,
 * defines them, but for the vg_fakecuda_kernel_* ones, which the fake
 * runtime defines (it holds the kernels' registrations); the runtime
 * depends on the driver, so a handle to the runtime finds them all.
 *
 * Error codes are plain ints: a runtime code (cudaError_t) where the call
 * that fails is a runtime one, a driver code (CUresult) for a driver call.
 * The codes that matter here have the same number in both (2 out of memory,
 * 700 illegal address, 801 not supported).
 */
#ifndef VG_FAKECUDA_H
#define VG_FAKECUDA_H

#ifdef __cplusplus
extern "C" {
#endif

/* Devices and their memory. */
int vg_fakecuda_device_count(void);
long long vg_fakecuda_capacity(int device);   /* bytes, -1 for a bad ordinal */
int vg_fakecuda_set_capacity(int device, long long bytes); /* 0, or -1 */
long long vg_fakecuda_bytes_in_use(int device); /* device memory held now */
long long vg_fakecuda_peak_bytes(int device);   /* since start or reset */
long vg_fakecuda_live_allocations(int device);  /* cudaMalloc'd, cuMemAlloc'd, cuMemCreate'd */
long vg_fakecuda_d2h_reads(void);
/* Unified memory (cudaMallocManaged), counted on the device current when it
 * was allocated, now and at its peak; and the managed bytes whose last
 * cudaMemPrefetchAsync sent them to this device (by the prefetch's size;
 * a prefetch to the host takes them off). Neither is in bytes_in_use:
 * a real driver pages managed memory out instead of failing for room.
 * -1 for a bad ordinal. */
long long vg_fakecuda_managed_bytes(int device);
long long vg_fakecuda_managed_peak_bytes(int device);
long long vg_fakecuda_prefetched_bytes(int device);
long long vg_fakecuda_prefetched_peak_bytes(int device);          /* device-to-host copies on a phantom, whose bytes read as zeros */

/* Work: the floating-point operations of the GEMMs cuBLAS and cuBLASLt
 * were asked for (2 m n k per GEMM, 8 m n k for complex ones), and their
 * calls, since start or reset (core_work.c). */
long long vg_fakecuda_gemm_flops(void);
long vg_fakecuda_gemm_calls(void);

/* Whether the devices report CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
 * (1, the default; VG_FAKECUDA_NO_VMM=1 starts with 0). */
void vg_fakecuda_set_vmm(int supported);

/* Faults. `api` is a faked function's documented name ("cudaMalloc",
 * "cuMemCreate"); an unknown name, nth < 1 or code 0 is refused with -1.
 * The nth call from now fails with `code`, and so do the count - 1 calls
 * after it (count < 0: every call from the nth on, until a reset). A
 * failing call does nothing else: a failed cudaMalloc allocates nothing.
 * Setting a fault on an api replaces the one pending there. */
int vg_fakecuda_fail_calls(const char *api, long nth, long count, int code);
int vg_fakecuda_fail_call(const char *api, long nth, int code);  /* count 1 */
int vg_fakecuda_fail_malloc(long nth, int code);                 /* "cudaMalloc" */

/* A sticky error, like an illegal memory access: from now on every call
 * that would touch the device (memory, copies, streams, events,
 * synchronisation, launches, cudaGetLastError) returns `code`. Device
 * queries and selection keep working, as on a real GPU. 0 clears it. */
void vg_fakecuda_set_sticky_error(int code);
int vg_fakecuda_sticky_error(void);

/* Counters: calls of a faked function since start or reset (-1 for an
 * unknown name), and calls of functions the fake does not implement. */
long vg_fakecuda_calls(const char *api);
long vg_fakecuda_malloc_calls(void);  /* "cudaMalloc" */
long vg_fakecuda_free_calls(void);    /* "cudaFree" */
long vg_fakecuda_unsupported_calls(void);
const char *vg_fakecuda_last_unsupported(void); /* "" when none */

/* fn(status) when this process calls exit() (not _exit), from this
 * process only (not one forked from it), once; NULL disarms. The last
 * call's fn is the one called. */
void vg_fakecuda_call_at_exit(void (*fn)(int status));

/* The shared objects that registered CUDA kernels (fat binaries) as they
 * loaded, and the launches of their kernels (cudaLaunchKernel and its
 * forms; not the driver's cuLaunchKernel, whose kernels come from modules
 * loaded at run time, Triton's): indices 0 to count - 1, in the order they
 * registered; each one's path as dladdr names it ("" when unknown; NULL
 * past the end), its launches and its distinct kernels launched (-1 past
 * the end). For the process's life: vg_fakecuda_reset leaves them. */
int vg_fakecuda_kernel_libraries(void);
const char *vg_fakecuda_kernel_library(int index);
long vg_fakecuda_kernel_library_launches(int index);
long vg_fakecuda_kernel_library_kernels(int index);

/* Clears faults, the sticky error and the counters; peaks restart at the
 * bytes in use now. Live allocations and capacities stay. */
void vg_fakecuda_reset(void);

#ifdef __cplusplus
}
#endif
#endif
