/* vramguard: the device provider interface, and the providers: the
 * simulated device (sim.c) and the CUDA runtime (cuda.c). */
#ifndef VRAMGUARD_DEVICE_H
#define VRAMGUARD_DEVICE_H

#include "vramguard/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vg_device vg_device;

/* What a heap needs from a device. Every function is called with the
 * heap's lock held, so a provider need not lock for one heap. */
typedef struct vg_device_ops {
    const char *name;
    /* Reserve `size` bytes (a multiple of VG_SEGMENT_GRANULE). VG_OK and
     * *addr set, or VG_ERR_NOMEM when the device is full. */
    int (*reserve)(vg_device *dev, size_t size, uintptr_t *addr);
    void (*release)(vg_device *dev, uintptr_t addr, size_t size);
    int (*mem_info)(vg_device *dev, size_t *free_bytes, size_t *total_bytes);
    /* Wait for all work on the device; afterwards every event queries done. */
    void (*synchronize)(vg_device *dev);
    int (*event_record)(vg_device *dev, vg_stream_t stream, vg_event_t *ev);
    /* 1 when the work before the event has finished, 0 when not yet. */
    int (*event_query)(vg_device *dev, vg_event_t ev);
    void (*event_release)(vg_device *dev, vg_event_t ev);
    void (*destroy)(vg_device *dev);
} vg_device_ops;

struct vg_device {
    const vg_device_ops *ops;
    int index; /* device ordinal, for messages */
};

/* The simulated device: a capacity and a fake 64-bit address space with no
 * memory behind it, so an 80 GiB GPU can be simulated anywhere. */
vg_device *vg_sim_create(size_t capacity);
/* Refuse the nth reserve from now on (1 = the next one); 0 turns it off. */
void vg_sim_fail_nth(vg_device *dev, uint64_t nth);
/* Refuse each reserve with the given probability, from a seeded generator. */
void vg_sim_fail_random(vg_device *dev, double probability, uint64_t seed);
/* Mark all work queued so far on `stream` as finished. */
void vg_sim_complete_stream(vg_device *dev, vg_stream_t stream);
/* Bytes the sim has handed out and not got back. */
size_t vg_sim_used(const vg_device *dev);

/* The CUDA provider (device/cuda.c). The CUDA runtime is found at run
 * time; vg_cuda_load() returns NULL when it is usable, else why not. */
const char *vg_cuda_load(void);
/* Which runtime was found (a path or soname), NULL if none. */
const char *vg_cuda_runtime_source(void);
int vg_cuda_device_count(void);
/* A provider for one device; NULL if the runtime is missing. */
vg_device *vg_cuda_create(int device);

#ifdef __cplusplus
}
#endif
#endif
