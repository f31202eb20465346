/* vramguard: the device provider interface, and the providers: the
 * simulated device (sim.c) and the CUDA runtime (cuda.c). */
#ifndef VRAMGUARD_DEVICE_H
#define VRAMGUARD_DEVICE_H

#include "vramguard/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device ordinals are 0..VG_MAX_DEVICES-1. */
#define VG_MAX_DEVICES 64

typedef struct vg_device vg_device;

/* A device call that failed for another reason than a lack of memory, in
 * the runtime's own words, so that the report can name it as it is. */
typedef struct vg_device_error {
    int code;        /* the runtime's error number */
    char call[48];   /* what failed: "cudaMalloc", "cudaSetDevice(1)" */
    char name[64];   /* "cudaErrorIllegalAddress" */
    char text[160];  /* "an illegal memory access was encountered" */
} vg_device_error;

/* What a heap needs from a device. Every function but synchronize is
 * called with the heap's lock held, so a provider need not lock for one
 * heap among those. synchronize is called with the lock released (a device
 * wait must not hold up the heap), one at a time per heap, and may run
 * while another thread makes the other calls: whatever state it shares
 * with them must be atomic or under the provider's own lock.
 *
 * Status codes: VG_OK; VG_ERR_NOMEM only when the device is out of memory
 * (cudaErrorMemoryAllocation; a refusal worth releasing cache for);
 * VG_ERR_DEVICE for every other failure, with vg_device_last_error()
 * filled. */
typedef struct vg_device_ops {
    /* Reserve `size` bytes (a multiple of VG_SEGMENT_GRANULE) and set *addr. */
    int (*reserve)(vg_device *dev, size_t size, uintptr_t *addr);
    /* The range is gone from the heap's books whatever this returns. */
    int (*release)(vg_device *dev, uintptr_t addr, size_t size);
    int (*mem_info)(vg_device *dev, size_t *free_bytes, size_t *total_bytes);
    /* Wait for all work on the device, and on every device whose streams it
     * recorded events on; afterwards every event recorded before the call
     * queries done. */
    int (*synchronize)(vg_device *dev);
    /* Record an event on `stream` of device `device` (which may be another
     * device than dev's: a stream belongs to one device, and handle 0 is
     * the default stream of each). */
    int (*event_record)(vg_device *dev, int device, vg_stream_t stream, vg_event_t *ev);
    /* 1 when the work before the event has finished, 0 when not yet. An
     * event that fails to query counts as finished: it never will be. */
    int (*event_query)(vg_device *dev, vg_event_t ev);
    void (*event_release)(vg_device *dev, vg_event_t ev);
    void (*destroy)(vg_device *dev);

    /* Virtual memory, for the arena: address space reserved once, memory
     * mapped into it page by page. A provider without it (or a device that
     * does not support it) leaves these NULL and vg_device.page_size 0.
     * Sizes and addresses are multiples of page_size. */
    /* Reserve `size` bytes of address space with no memory behind them:
     * costs nothing against the capacity. */
    int (*range_reserve)(vg_device *dev, size_t size, uintptr_t *addr);
    /* Give back a range whose pages are all unmapped. */
    int (*range_release)(vg_device *dev, uintptr_t addr, size_t size);
    /* Put memory behind [addr, addr+size), unmapped pages of a reserved
     * range, readable and writable by the device: VG_ERR_NOMEM when the
     * device has no memory left for them (nothing is mapped then). */
    int (*map)(vg_device *dev, uintptr_t addr, size_t size);
    /* Return the memory behind mapped pages. The caller has made sure that
     * no work on the device still uses them (a synchronize). On any
     * failure nothing is unmapped: VG_ERR_BUSY while a capture is underway
     * on the device, VG_ERR_DEVICE when the device refuses. */
    int (*unmap)(vg_device *dev, uintptr_t addr, size_t size);
} vg_device_ops;

struct vg_device {
    const vg_device_ops *ops;
    int index;             /* device ordinal */
    /* The granularity of map and unmap (2 MiB on current GPUs); 0 when the
     * provider has no virtual memory calls. */
    size_t page_size;
};

/* Why the calling thread's last device call that returned VG_ERR_DEVICE
 * failed: the provider writes it before it returns, the caller reads it
 * right after, on the same thread. Per thread rather than per provider:
 * synchronize runs without the heap's lock while other threads make the
 * provider's other calls under it, so no lock covers every writer, and the
 * words of a failure belong to the thread whose call failed. Never NULL. */
vg_device_error *vg_device_last_error(void);

/* Allocation into a private pool underway on a device (CUDA graph capture:
 * PyTorch's begin_allocate_to_pool until its end_allocate_to_pool). While
 * one is, a provider makes no call that would break a capture on that
 * device: no event query or synchronize (an event answers "not finished"),
 * no release (it is deferred until no capture is underway), and a reserve
 * runs in the relaxed capture mode, as PyTorch's own allocator does. The
 * virtual memory calls alike: range_reserve and map run in the relaxed
 * mode, range_release is deferred, and unmap (which needs a synchronize
 * first) answers VG_ERR_BUSY with nothing unmapped. The
 * count is kept by the registry (device/pools.c); tests may set it. */
void vg_capture_enter(int device);
void vg_capture_leave(int device);
/* How many are underway on `device` (0 for a device out of range). */
int vg_capture_active(int device);
/* Whether a capture is underway on any device. */
int vg_capture_any(void);

/* The simulated device: a capacity and a fake 64-bit address space with no
 * memory behind it, so an 80 GiB GPU can be simulated anywhere. */
vg_device *vg_sim_create(size_t capacity);
/* Hand out addresses from `base` on; before the first reserve. Simulated
 * devices that stand for one GPU must not give out the same addresses (a
 * private pool's heap beside the device's own heap). */
void vg_sim_set_base(vg_device *dev, uintptr_t base);
/* Virtual memory: a simulated device has it, with 2 MiB pages, unless its
 * page size is set to 0 (then the heap falls back to segments). The page
 * size is a power of two from VG_ALIGN to VG_SEGMENT_GRANULE, set before
 * the first call; VG_ERR_ARG otherwise. Ranges come from their own part of
 * the address space (the upper half; segments keep the lower one, or all
 * of it with page size 0). Mapped bytes count against the capacity, as
 * reserved ones do (vg_sim_used counts both). */
int vg_sim_set_page_size(vg_device *dev, size_t page_size);
/* Refuse (VG_ERR_NOMEM) a range bigger than `bytes`, as a driver with a
 * cap on one reservation; 0 lifts it. */
void vg_sim_max_range(vg_device *dev, size_t bytes);
/* Map and unmap calls that succeeded so far. */
void vg_sim_vm_calls(vg_device *dev, uint64_t *maps, uint64_t *unmaps);
/* Fault injection: a map call counts as a reserve (one sequence for
 * both), and the three calls below refuse or fail it as they would a
 * reserve, mapping nothing.
 * Refuse the nth reserve from now on (1 = the next one) as out of memory;
 * 0 turns it off. */
void vg_sim_fail_nth(vg_device *dev, uint64_t nth);
/* Refuse each reserve with the given probability, from a seeded generator. */
void vg_sim_fail_random(vg_device *dev, double probability, uint64_t seed);
/* Fail the nth reserve from now on (1 = the next one) with a device error
 * that is not an out-of-memory (cudaErrorIllegalAddress). With `sticky`,
 * every reserve and synchronize after it fails the same way, as a CUDA
 * context does after a kernel's illegal memory access. 0 turns it off. */
void vg_sim_fail_device(vg_device *dev, uint64_t nth, int sticky);
/* Mark all work queued so far on `stream` of the simulated device itself
 * as finished. */
void vg_sim_complete_stream(vg_device *dev, vg_stream_t stream);
/* The same for `stream` of another device, as far as the events this
 * device recorded on it are concerned. */
void vg_sim_complete_stream_of(vg_device *dev, int device, vg_stream_t stream);
/* Bytes the sim has handed out and not got back. */
size_t vg_sim_used(const vg_device *dev);
/* Make event_record fail (VG_ERR_NOMEM), or work again (0). */
void vg_sim_fail_events(vg_device *dev, int fail);
/* Make synchronize return `rc` at once, waiting for nothing (VG_ERR_BUSY:
 * as the CUDA provider during a capture); VG_OK puts it back. */
void vg_sim_synchronize_answer(vg_device *dev, int rc);
/* Make unmap return `rc` with nothing unmapped (VG_ERR_BUSY: as the CUDA
 * provider when a capture began after the synchronize); VG_OK puts it back. */
void vg_sim_unmap_answer(vg_device *dev, int rc);
/* With `hold`, every synchronize stops at its start until the hold is
 * lifted (0); vg_sim_wait_for_held returns once `n` are stopped there. */
void vg_sim_hold_synchronize(vg_device *dev, int hold);
void vg_sim_wait_for_held(vg_device *dev, int n);
/* Event queries answered so far. */
uint64_t vg_sim_event_queries(vg_device *dev);

/* The CUDA provider (device/cuda.c). The CUDA runtime is found at run
 * time, where PyTorch loaded it; vg_cuda_load() returns NULL when it is
 * usable, else why not. */
const char *vg_cuda_load(void);
/* Whether a CUDA runtime is already mapped into the process (found or
 * loaded by anyone), so that looking for one loads nothing new. */
int vg_cuda_runtime_present(void);
/* Which runtime was found (a path or soname), NULL if none. */
const char *vg_cuda_runtime_source(void);
/* 2 when a file name (with or without a directory) is a versioned shared
 * CUDA runtime: libcudart, an optional -<hash> (as older PyTorch wheels
 * ship it), .so and an optional .<major>[.<minor>...] ("libcudart.so.12",
 * "libcudart-9335f6a2.so.11.0"); 1 for a bare "libcudart.so", a last
 * resort; 0 for anything else ("libcudart_static.a"). */
int vg_cuda_runtime_name_rank(const char *path);
int vg_cuda_device_count(void);
/* The device a CUDA stream belongs to: cudaStreamGetDevice where the
 * runtime has it (CUDA 12.8 on), else the current device. -1 when the
 * runtime cannot say. */
int vg_cuda_stream_device(vg_stream_t stream);
/* Releases of `device` waiting for its captures to end (tests). */
size_t vg_cuda_deferred_frees(int device);
/* A provider for one device; NULL when the runtime is missing, the device
 * does not exist, or the runtime cannot say (`why`, n bytes, says which). */
vg_device *vg_cuda_create(int device, char *why, size_t n);
/* Why a CUDA provider has no virtual memory calls (page_size 0): the driver
 * or the device lacks them, in words; NULL when it has them. */
const char *vg_cuda_vmm_unsupported(const vg_device *dev);

#ifdef __cplusplus
}
#endif
#endif
