/* Internal to the CUDA provider (device/cuda.c, device/cuda_vmm.c). Not
 * installed. */
#ifndef VG_DEVICE_CUDA_INTERNAL_H
#define VG_DEVICE_CUDA_INTERNAL_H

#include "vramguard/device.h"

typedef int cuda_error;
#define CUDA_SUCCESS 0

/* The runtime, resolved once (vg_cuda_load): the calls the VMM part needs. */
typedef struct cuda_runtime_calls {
    cuda_error (*GetLastError)(void);
    /* cudaGetDriverEntryPoint(symbol, fn, flags, status): NULL where the
     * runtime lacks it; ByVersion (CUDA 12.5 on) is preferred. */
    cuda_error (*GetDriverEntryPoint)(const char *, void **, unsigned long long, int *);
    cuda_error (*GetDriverEntryPointByVersion)(const char *, void **, unsigned, unsigned long long, int *);
} cuda_runtime_calls;
const cuda_runtime_calls *vg__cuda_runtime(void);

/* Run on `device`, then put the caller's device back (cuda.c). */
typedef struct device_guard {
    int previous;
    int switched;
} device_guard;
int vg__cuda_enter(int device, device_guard *g);
void vg__cuda_leave(device_guard g);

/* The relaxed capture mode for the calling thread while a capture is
 * underway on `device`; returns whether it was switched (give it back to
 * vg__cuda_capture_restore). */
int vg__cuda_capture_relax(int device, int *mode);
void vg__cuda_capture_restore(int relaxed, int *mode);

/* A release during a capture on `device`, done by the first call on it
 * after the capture: a range of address space when `range_size` is not 0
 * (cuMemAddressFree), else a cudaMalloc'd segment. 0 when kept for later. */
int vg__cuda_defer_free(int device, uintptr_t addr, size_t range_size);
/* Those of dev's device, once no capture is underway there; the caller has
 * entered the device. */
void vg__cuda_free_deferred(vg_device *dev);

/* cuda_vmm.c. Sets dev->page_size and the reason why not (`why`, n bytes,
 * "" when supported); the caller has entered the device. */
void vg__cuda_vmm_probe(vg_device *dev, char *why, size_t n);
int vg__cuda_range_reserve(vg_device *dev, size_t size, uintptr_t *addr);
int vg__cuda_range_release(vg_device *dev, uintptr_t addr, size_t size);
int vg__cuda_map(vg_device *dev, uintptr_t addr, size_t size);
int vg__cuda_unmap(vg_device *dev, uintptr_t addr, size_t size);
/* A deferred range's release, with the device entered; failures are lost
 * (the heap let go of the range already). */
void vg__cuda_address_free_now(uintptr_t addr, size_t size);

#endif
