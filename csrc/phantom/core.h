/* The fake device, shared by the fake driver (libcuda.so.1, which owns it)
 * and the fake runtime (libcudart.so.N, which calls in here). The state
 * lives once, in the driver, as on a real system where the runtime sits on
 * the driver: memory a test maps through the driver's VMM calls is counted
 * in the runtime's cudaMemGetInfo.
 *
 * Nothing here includes a CUDA header: error codes are ints (see
 * fakecuda.h), so the runtime and the driver each map them to their type.
 */
#ifndef VGFC_CORE_H
#define VGFC_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "apis.h"
#include "fakecuda.h"

/* Error codes used by the core; equal in the runtime and the driver. */
#define VGFC_SUCCESS 0
#define VGFC_INVALID_VALUE 1
#define VGFC_OUT_OF_MEMORY 2
#define VGFC_NO_DEVICE 100
#define VGFC_INVALID_DEVICE 101
#define VGFC_NOT_SUPPORTED 801

#define VGFC_MAX_DEVICES 16

/* ---- devices (core_devices.c) ---------------------------------------- */

int vgfc_device_count(void);
int vgfc_valid_device(int dev);
size_t vgfc_capacity(int dev);
int vgfc_cc_major(void);
int vgfc_cc_minor(void);
const char *vgfc_device_name(void);
int vgfc_sm_count(void);
/* VG_FAKECUDA_PHANTOM: device memory is address space without host pages;
 * copies into it are dropped and copies out of it read zeros. */
int vgfc_phantom(void);
/* Device memory the CUDA context holds on each device (VG_FAKECUDA_CONTEXT). */
size_t vgfc_context_bytes(void);
/* The L2 cache size the devices report (VG_FAKECUDA_L2). */
int vgfc_l2_bytes(void);
/* "512MiB", "1GiB", "16G", "1048576" (powers of 1024), as the knobs take
 * sizes: 0, or -1 for text that is no size. */
int vgfc_parse_size(const char *text, size_t *out);
int vgfc_driver_version(void);
/* Fills 16 bytes. */
void vgfc_device_uuid(int dev, unsigned char uuid[16]);
int vgfc_pci_bus(int dev);

/* One attribute, numbered as CUdevice_attribute (cudaDeviceAttr uses the
 * same numbers). VGFC_INVALID_VALUE for a number past the header's range. */
int vgfc_device_attribute(int attr, int dev, int *value);

/* Launches (the runtime's and the driver's alike): whether a grid and
 * block are ones a device runs (at most 1024 threads a block; a real
 * launch fails otherwise, and PyTorch never sends one), and how many
 * blocks of `block_size` threads one multiprocessor holds. */
int vgfc_launch_shape_ok(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz);
int vgfc_blocks_per_sm(int block_size);

/* ---- contexts (core_devices.c) ----------------------------------------
 * Each device has one primary context. A thread's current context picks
 * its current device for the runtime too (cudaSetDevice makes the device's
 * primary context current, as the real runtime does). */

struct CUctx_st;
struct CUctx_st *vgfc_primary_ctx(int dev);
int vgfc_ctx_device(const struct CUctx_st *ctx); /* -1: not a context */
struct CUctx_st *vgfc_current_ctx(void);
void vgfc_set_current_ctx(struct CUctx_st *ctx);
int vgfc_current_device(void);        /* of the current context, else 0 */
void vgfc_ctx_retain(int dev);        /* the primary context becomes active */
int vgfc_ctx_release(int dev);        /* VGFC_INVALID_VALUE when not retained */
int vgfc_ctx_active(int dev);
/* The runtime uses a device: its primary context is retained once (and
 * never released, as the real runtime keeps it until exit) and current. */
void vgfc_use_device(int dev);

/* ---- memory (core_memory.c) ------------------------------------------ */

enum vgfc_mem_kind {
    VGFC_MEM_DEVICE,     /* cudaMalloc, cudaMallocAsync, cuMemAlloc */
    VGFC_MEM_HOST,       /* cudaMallocHost, cudaHostAlloc */
    VGFC_MEM_REGISTERED, /* cudaHostRegister: the caller's memory */
    VGFC_MEM_MAPPED,     /* a VMM mapping with access set */
    VGFC_MEM_MANAGED,    /* cudaMallocManaged: host memory, device -1 */
};

typedef struct vgfc_range {
    uintptr_t base;
    size_t size;
    int device; /* -1 for host memory */
    enum vgfc_mem_kind kind;
    /* Managed memory only: the device current when it was allocated, and
     * how many of its bytes the last prefetch moved to which device
     * (resident 0: all on the host). */
    int home, resident_device;
    size_t resident;
} vgfc_range;

/* Device memory counted against the device's capacity, or host memory
 * (dev -1). VGFC_OUT_OF_MEMORY past the capacity. Size 0 gives NULL. */
int vgfc_mem_alloc(int dev, size_t size, enum vgfc_mem_kind kind, void **out);
/* VGFC_INVALID_VALUE unless ptr starts a live allocation of that kind. */
int vgfc_mem_free(void *ptr, enum vgfc_mem_kind kind);
/* Records the caller's memory [ptr, ptr+size): 712 if it overlaps one. */
int vgfc_mem_register(void *ptr, size_t size);
/* The range containing ptr; 0 when there is none. */
int vgfc_mem_find(const void *ptr, vgfc_range *out);
/* Whether [ptr, ptr+size) lies within one piece of memory of one device
 * (dev -1: any device): 0, or VGFC_INVALID_VALUE. */
int vgfc_mem_check_device(const void *ptr, size_t size, int dev);

/* Accounting for memory the VMM calls create (core_memory.c). */
/* `mapped` 0: a VMM handle not mapped yet, which counts in the peak only
 * once vgfc_mem_mapped says it is. */
int vgfc_mem_charge(int dev, size_t size, int mapped);  /* VGFC_OUT_OF_MEMORY past capacity */
void vgfc_mem_uncharge(int dev, size_t size, int mapped);
void vgfc_mem_mapped(int dev, size_t size);
void vgfc_mem_add_range(const vgfc_range *r);
void vgfc_mem_remove_range(uintptr_t base);

/* Unified memory: real host pages (a program reads and writes them, on a
 * phantom too), counted per device apart from device memory: the driver
 * pages it in and out, so it never fails an allocation for want of room.
 * VGFC_INVALID_VALUE for size 0. */
int vgfc_managed_alloc(int home, size_t size, void **out);
/* Whether [ptr, ptr+size) lies within one managed allocation. */
int vgfc_managed_contains(const void *ptr, size_t size);
/* A prefetch of [ptr, ptr+size) to device `dev`, or to the host (dev -1):
 * VGFC_INVALID_VALUE unless the range lies within one managed allocation. */
int vgfc_managed_prefetch(const void *ptr, size_t size, int dev);

size_t vgfc_mem_used(int dev);
void vgfc_mem_reset_peaks(void); /* peaks restart at the bytes in use */

/* Fresh address space: readable and writable, committed when touched. */
void *vgfc_map_anonymous(size_t size);

/* Copies and sets of device memory, once their ends are checked: memmove
 * and memset, except on a phantom, where nothing moves into or within the
 * device and what is read from it is zeros (each such read counted). */
void vgfc_copy(void *dst, const void *src, size_t n, int dst_on_device, int src_on_device);
void vgfc_fill(void *dst, int value, size_t n);

/* ---- knobs (core_knobs.c) --------------------------------------------- */

/* Every faked function starts here: counts the call, traces it, and gives
 * the error it must return (a sticky error or an injected fault), or 0. */
int vgfc_enter(enum vgfc_api api);
/* A generated stub was called: counts, traces, gives the code to return
 * (the sticky error, else VGFC_NOT_SUPPORTED). */
int vgfc_unsupported(const char *name);
int vgfc_tracing(void);

/* ---- work (core_work.c) ------------------------------------------------ */

/* A GEMM the cuBLAS or cuBLASLt stand-in ran: op(A) m x k times op(B)
 * k x n, `batches` times; complex_type for complex elements. */
void vgfc_count_gemm(uint64_t m, uint64_t n, uint64_t k, uint64_t batches, int complex_type);
void vgfc_work_reset(void);
void vgfc_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- errors (core_errors.c; the names are generated from the headers
 * into build/fakecuda/errors_gen.c by gen_fakecuda.py) ------------------- */

struct vgfc_error_name {
    int code;
    const char *name;
};
extern const struct vgfc_error_name vgfc_runtime_error_names[];
extern const int vgfc_runtime_error_name_count;
extern const struct vgfc_error_name vgfc_driver_error_names[];
extern const int vgfc_driver_error_name_count;

const char *vgfc_runtime_error_name(int code);  /* NULL when unknown */
const char *vgfc_driver_error_name(int code);   /* NULL when unknown */
/* The message for the common codes, shared by runtime and driver (NULL
 * for others). */
const char *vgfc_error_message(int code);
/* A code from its number or its name in either API; -1 when neither. */
int vgfc_parse_error(const char *text);

/* ---- the driver's exported functions by the name cuGetProcAddress is
 * asked for (generated into build/fakecuda/procs_gen.c, sorted by name) -- */

struct vgfc_proc {
    const char *name;   /* as asked for: "cuMemAlloc" */
    const char *symbol; /* as exported: "cuMemAlloc_v2" */
};
extern const struct vgfc_proc vgfc_driver_procs[];
extern const int vgfc_driver_proc_count;

/* ---- time ------------------------------------------------------------- */

double vgfc_now_ms(void);

#endif
