/* NCCL stand-in (README.md, "NCCL"): communicators, versions, errors,
 * groups, memory and its registration. On a phantom GPU there is no data to
 * move, so a communicator needs no other rank: ncclCommInitRank completes
 * at once, whatever the unique id, and the rendezvous stays the
 * application's (PyTorch's TCP store). Nonblocking communicators complete
 * at once too (ncclSuccess, never ncclInProgress).
 *
 * Arguments are checked as the real library checks them, with its codes
 * and its last-error texts (ncclGetLastError): a NULL or destroyed
 * communicator, a rank outside the communicator, a NULL out-pointer are
 * ncclInvalidArgument; ncclGroupEnd outside a group is ncclInvalidUsage.
 *
 * A communicator holds no device memory unless VG_PHANTOM_NCCL_COMM says
 * how much (a real one holds its channels' buffers, which depend on the
 * topology: NCCL_BUFFSIZE per channel and peer); it is taken from the
 * device (vgfc_mem_alloc) as NCCL's own allocation would be, outside the
 * application's allocator.
 */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "fakecuda.h"
#include "nccl_fake.h"

/* ---- the last error, tracing, counters ---------------------------------- */

static pthread_mutex_t error_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_error[256];
static long live_comms, live_handles, collectives, unsupported_calls;

ncclResult_t vgnc_fail(ncclResult_t code, const char *fmt, ...)
{
    char text[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&error_lock);
    memcpy(last_error, text, sizeof text);
    pthread_mutex_unlock(&error_lock);
    if (vgfc_tracing())
        vgfc_trace("nccl: %s (%s)", text, ncclGetErrorString(code));
    return code;
}

void vgnc_trace(const char *fmt, ...)
{
    if (!vgfc_tracing())
        return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    vgfc_trace("%s", line);
}

void vgnc_count_collective(void)
{
    __atomic_add_fetch(&collectives, 1, __ATOMIC_RELAXED);
}

ncclResult_t vgnc_check_comm(ncclComm_t comm, const char *what)
{
    if (!comm)
        return vgnc_fail(ncclInvalidArgument, "%s : comm argument is NULL", what);
    if (comm->magic != VGNC_MAGIC)
        return vgnc_fail(ncclInvalidArgument, "%s : corrupted comm object detected", what);
    return ncclSuccess;
}

size_t vgnc_bytes(size_t count, size_t times, ncclDataType_t type)
{
    /* int8 .. bfloat16, then fp8 e4m3 and e5m2 (NCCL 2.24 on: an older header's
     * ncclNumTypes stops before them) */
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    if ((int)type < 0 || type >= ncclNumTypes || (size_t)type >= sizeof sizes / sizeof *sizes)
        return 0;
    size_t each = sizes[type];
    if (times && count > SIZE_MAX / times)
        return SIZE_MAX;
    count *= times;
    return count > SIZE_MAX / each ? SIZE_MAX : count * each;
}

/* For tests (ctypes.CDLL(None), tests/c/test_nccl.c). */
long vg_phantom_nccl_live_comms(void);
long vg_phantom_nccl_live_handles(void);
long vg_phantom_nccl_collectives(void);
long vg_phantom_nccl_unsupported_calls(void);
long vg_phantom_nccl_live_comms(void) { return __atomic_load_n(&live_comms, __ATOMIC_RELAXED); }
long vg_phantom_nccl_live_handles(void) { return __atomic_load_n(&live_handles, __ATOMIC_RELAXED); }
long vg_phantom_nccl_collectives(void) { return __atomic_load_n(&collectives, __ATOMIC_RELAXED); }
long vg_phantom_nccl_unsupported_calls(void) { return __atomic_load_n(&unsupported_calls, __ATOMIC_RELAXED); }

/* The generated stubs' landing (nccl_stubs_gen.c): counted with the fake
 * CUDA's stubs, named once each on stderr. */
int vgnc_unsupported(const char *name, int *said);
int vgnc_unsupported(const char *name, int *said)
{
    __atomic_add_fetch(&unsupported_calls, 1, __ATOMIC_RELAXED);
    vgfc_unsupported(name);
    if (!__atomic_exchange_n(said, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "vramguard NCCL stand-in: %s is not implemented (ncclInvalidUsage)\n", name);
    return vgnc_fail(ncclInvalidUsage, "%s is not implemented by vramguard's NCCL stand-in", name);
}

/* ---- versions, errors -------------------------------------------------- */

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: break;
    }
    /* ncclTimeout, from NCCL 2.28 on (before, 8 was ncclNumResults). */
    if ((int)result == 8 && (int)ncclNumResults > 8)
        return "timeout";
    return "unknown result code";
}

/* The last error of any communicator, as the real library keeps it. */
const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return last_error;
}

/* ---- knobs -------------------------------------------------------------- */

static size_t comm_bytes;
static pthread_once_t knob_once = PTHREAD_ONCE_INIT;

/* Malformed, it stops the process, as the fake's other knobs do. */
static void read_knob(void)
{
    const char *text = getenv("VG_PHANTOM_NCCL_COMM");
    if (text && *text && vgfc_parse_size(text, &comm_bytes) != 0) {
        fprintf(stderr, "vramguard NCCL stand-in: VG_PHANTOM_NCCL_COMM=\"%s\": want a size like 256MiB\n", text);
        abort();
    }
}

/* ---- communicators ------------------------------------------------------ */

struct vgnc_comm_mem {
    struct ncclComm comm;
    void *buffers; /* VG_PHANTOM_NCCL_COMM's bytes on its device, or NULL */
    size_t buffer_bytes;
};

static ncclResult_t new_comm(ncclComm_t *out, int nranks, int rank, int device, int blocking,
                             const unsigned char *id)
{
    pthread_once(&knob_once, read_knob);
    struct vgnc_comm_mem *m = calloc(1, sizeof *m);
    if (!m)
        return vgnc_fail(ncclSystemError, "out of host memory for a communicator");
    if (comm_bytes && vgfc_mem_alloc(device, comm_bytes, VGFC_MEM_DEVICE, &m->buffers) != 0) {
        free(m);
        return vgnc_fail(ncclUnhandledCudaError, "Cuda failure 'out of memory' (VG_PHANTOM_NCCL_COMM=%zu bytes on "
                                                 "device %d)", comm_bytes, device);
    }
    m->buffer_bytes = m->buffers ? comm_bytes : 0;
    m->comm.magic = VGNC_MAGIC;
    m->comm.nranks = nranks;
    m->comm.rank = rank;
    m->comm.device = device;
    m->comm.blocking = blocking;
    if (id)
        memcpy(m->comm.id, id, sizeof m->comm.id);
    static int said;
    if (vgfc_phantom() && !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "vramguard phantom GPU: NCCL is vramguard's stand-in (rank %d of %d on device %d): "
                        "collectives complete at once and move no data\n", rank, nranks, device);
    __atomic_add_fetch(&live_comms, 1, __ATOMIC_RELAXED);
    vgnc_trace("nccl: communicator %p: rank %d of %d, device %d", (void *)&m->comm, rank, nranks, device);
    *out = &m->comm;
    return ncclSuccess;
}

static void free_comm(ncclComm_t comm)
{
    struct vgnc_comm_mem *m = (struct vgnc_comm_mem *)comm;
    if (m->buffers)
        vgfc_mem_free(m->buffers, VGFC_MEM_DEVICE);
    comm->magic = 0;
    free(m);
    __atomic_sub_fetch(&live_comms, 1, __ATOMIC_RELAXED);
}

/* The config's blocking attribute (1 unless it says 0); -1 with the last
 * error set when the config was not made by NCCL_CONFIG_INITIALIZER. */
static int config_blocking(const ncclConfig_t *config, const char *what)
{
    if (!config)
        return 1;
    if (config->magic != VGNC_API_MAGIC || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int)) {
        vgnc_fail(ncclInvalidArgument, "%s: ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER",
                  what);
        return -1;
    }
    return config->blocking == 0 ? 0 : 1;
}

static ncclResult_t cuda_ready(int *device)
{
    int sticky = vg_fakecuda_sticky_error();
    if (sticky)
        return vgnc_fail(ncclUnhandledCudaError, "Cuda failure %d (a sticky error on the device)", sticky);
    if (cudaGetDevice(device) != cudaSuccess)
        return vgnc_fail(ncclUnhandledCudaError, "Cuda failure 'no CUDA-capable device is detected'");
    return ncclSuccess;
}

static ncclResult_t init_rank(ncclComm_t *newcomm, int nranks, const ncclUniqueId *id, int rank,
                              ncclConfig_t *config, const char *what)
{
    if (!newcomm)
        return vgnc_fail(ncclInvalidArgument, "%s : newcomm argument is NULL", what);
    *newcomm = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return vgnc_fail(ncclInvalidArgument, "Invalid rank requested : %d/%d", rank, nranks);
    int blocking = config_blocking(config, what);
    if (blocking < 0)
        return ncclInvalidArgument;
    int device;
    ncclResult_t r = cuda_ready(&device);
    if (r != ncclSuccess)
        return r;
    return new_comm(newcomm, nranks, rank, device, blocking, id ? (const unsigned char *)id->internal : NULL);
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return vgnc_fail(ncclInvalidArgument, "GetUniqueId : out argument is NULL");
    /* Any bytes do (nothing is reached through them); these differ from
     * one call and one process to the next, as the real ones do. */
    static unsigned long serial;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long words[4] = {0x7667706e63636cull /* "vgpnccl" */, (unsigned long long)getpid(),
                                   (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec,
                                   __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED)};
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, words, sizeof words);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return init_rank(comm, nranks, &commId, rank, NULL, "CommInitRank");
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    return init_rank(comm, nranks, &commId, rank, config, "CommInitRankConfig");
}

ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config)
{
    if (nId < 1 || !commIds)
        return vgnc_fail(ncclInvalidArgument, "CommInitRankScalable : invalid nId %d or commIds %p", nId,
                         (void *)commIds);
    return init_rank(newcomm, nranks, commIds, myrank, config, "CommInitRankScalable");
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (!comms)
        return vgnc_fail(ncclInvalidArgument, "CommInitAll : comms argument is NULL");
    if (ndev < 1)
        return vgnc_fail(ncclInvalidArgument, "Invalid device count requested : %d", ndev);
    int total = 0, device;
    ncclResult_t r = cuda_ready(&device);
    if (r != ncclSuccess)
        return r;
    if (cudaGetDeviceCount(&total) != cudaSuccess)
        return vgnc_fail(ncclUnhandledCudaError, "Cuda failure in cudaGetDeviceCount");
    for (int i = 0; i < ndev; i++) {
        int d = devlist ? devlist[i] : i;
        if (d < 0 || d >= total)
            return vgnc_fail(ncclInvalidArgument, "Invalid device %d (totalnDev=%d)", d, total);
        for (int j = 0; j < i; j++)
            if (devlist && devlist[j] == d)
                return vgnc_fail(ncclInvalidUsage, "Duplicate device %d in device list", d);
    }
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    for (int i = 0; i < ndev; i++) {
        r = new_comm(&comms[i], ndev, i, devlist ? devlist[i] : i, 1, (const unsigned char *)id.internal);
        if (r != ncclSuccess) {
            while (i-- > 0)
                free_comm(comms[i]);
            return r;
        }
    }
    return ncclSuccess;
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0) /* ncclCommSplit came with NCCL 2.18 */
/* The others' colors and keys are not known here (nothing is exchanged):
 * a child has its parent's size and rank. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    (void)key;
    ncclResult_t r = vgnc_check_comm(comm, "CommSplit");
    if (r != ncclSuccess)
        return r;
    if (!newcomm)
        return vgnc_fail(ncclInvalidArgument, "CommSplit : newcomm argument is NULL");
    *newcomm = NULL;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return vgnc_fail(ncclInvalidArgument, "CommSplit : invalid color %d", color);
    int blocking = config_blocking(config, "CommSplit");
    if (blocking < 0)
        return ncclInvalidArgument;
    if (color == NCCL_SPLIT_NOCOLOR)
        return ncclSuccess;
    return new_comm(newcomm, comm->nranks, comm->rank, comm->device, blocking, comm->id);
}
#endif

#ifdef NCCL_SHRINK_DEFAULT /* NCCL 2.27 and later */
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                            ncclConfig_t *config, int shrinkFlags)
{
    ncclResult_t r = vgnc_check_comm(comm, "CommShrink");
    if (r != ncclSuccess)
        return r;
    if (!newcomm)
        return vgnc_fail(ncclInvalidArgument, "CommShrink : newcomm argument is NULL");
    *newcomm = NULL;
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList))
        return vgnc_fail(ncclInvalidArgument, "CommShrink : invalid excludeRanksList or excludeRanksCount %d",
                         excludeRanksCount);
    if (shrinkFlags & ~(NCCL_SHRINK_DEFAULT | NCCL_SHRINK_ABORT))
        return vgnc_fail(ncclInvalidArgument, "CommShrink : invalid shrinkFlags %d", shrinkFlags);
    int blocking = config_blocking(config, "CommShrink");
    if (blocking < 0)
        return ncclInvalidArgument;
    int below = 0, gone = 0;
    for (int i = 0; i < excludeRanksCount; i++) {
        int x = excludeRanksList[i];
        if (x < 0 || x >= comm->nranks)
            return vgnc_fail(ncclInvalidArgument, "CommShrink : excluded rank %d is not in the communicator", x);
        if (x == comm->rank)
            return vgnc_fail(ncclInvalidArgument, "CommShrink : rank %d excludes itself", x);
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= excludeRanksList[j] == x;
        if (!seen) {
            gone++;
            below += x < comm->rank;
        }
    }
    return new_comm(newcomm, comm->nranks - gone, comm->rank - below, comm->device, blocking, comm->id);
}
#endif

ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId)
{
    ncclResult_t r = vgnc_check_comm(comm, "CommGetUniqueId");
    if (r != ncclSuccess)
        return r;
    return ncclGetUniqueId(uniqueId);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    ncclResult_t r = vgnc_check_comm(comm, "CommFinalize");
    if (r == ncclSuccess)
        comm->finalized = 1;
    return r;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    ncclResult_t r = vgnc_check_comm(comm, "CommDestroy");
    if (r == ncclSuccess)
        free_comm(comm);
    return r;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    ncclResult_t r = vgnc_check_comm(comm, "CommAbort");
    if (r == ncclSuccess)
        free_comm(comm);
    return r;
}

#ifdef NCCL_REVOKE_DEFAULT
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    ncclResult_t r = vgnc_check_comm(comm, "CommRevoke");
    if (r != ncclSuccess)
        return r;
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
        return vgnc_fail(ncclInvalidArgument, "CommRevoke : revokeFlags must be 0, not %d", revokeFlags);
    comm->revoked = 1;
    return ncclSuccess;
}
#endif

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    ncclResult_t r = vgnc_check_comm(comm, "ncclGetAsyncError");
    if (r != ncclSuccess)
        return r;
    if (!asyncError)
        return vgnc_fail(ncclInvalidArgument, "ncclGetAsyncError : asyncError argument is NULL");
    *asyncError = ncclSuccess;
    return ncclSuccess;
}

#define GETTER(fn, what, arg, value)                                             \
    ncclResult_t fn(const ncclComm_t comm, int *arg)                             \
    {                                                                            \
        ncclResult_t r = vgnc_check_comm(comm, what);                            \
        if (r != ncclSuccess)                                                    \
            return r;                                                            \
        if (!arg)                                                                \
            return vgnc_fail(ncclInvalidArgument, what " : " #arg " argument is NULL"); \
        *arg = comm->value;                                                      \
        return ncclSuccess;                                                      \
    }
GETTER(ncclCommCount, "CommCount", count, nranks)
GETTER(ncclCommCuDevice, "CommCuDevice", device, device)
GETTER(ncclCommUserRank, "CommUserRank", rank, rank)

#ifdef NCCL_SUSPEND_MEM
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags)
{
    ncclResult_t r = vgnc_check_comm(comm, "CommSuspend");
    if (r == ncclSuccess) {
        (void)flags;
        comm->suspended = 1;
    }
    return r;
}

ncclResult_t ncclCommResume(ncclComm_t comm)
{
    ncclResult_t r = vgnc_check_comm(comm, "CommResume");
    if (r == ncclSuccess)
        comm->suspended = 0;
    return r;
}

ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value)
{
    ncclResult_t r = vgnc_check_comm(comm, "CommMemStats");
    if (r != ncclSuccess)
        return r;
    if (!value)
        return vgnc_fail(ncclInvalidArgument, "CommMemStats : value argument is NULL");
    switch (stat) {
    case ncclStatGpuMemSuspend: *value = 0; return ncclSuccess;
    case ncclStatGpuMemSuspended: *value = (uint64_t)comm->suspended; return ncclSuccess;
    case ncclStatGpuMemPersist:
    case ncclStatGpuMemTotal: *value = ((struct vgnc_comm_mem *)comm)->buffer_bytes; return ncclSuccess;
    }
    return vgnc_fail(ncclInvalidArgument, "CommMemStats : invalid stat %d", (int)stat);
}
#endif

/* ---- groups ------------------------------------------------------------- */

static _Thread_local int group_depth;

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0)
        return vgnc_fail(ncclInvalidUsage, "ncclGroupEnd: not in a group call.");
    group_depth--;
    return ncclSuccess;
}

/* Nothing takes time on a phantom: the estimate is 0. */
#ifdef NCCL_SIM_INFO_INITIALIZER /* NCCL 2.22 and later */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    if (simInfo && (simInfo->magic != 0x74685283u || simInfo->size < sizeof *simInfo))
        return vgnc_fail(ncclInvalidArgument, "ncclGroupSimulateEnd: simInfo not initialized via "
                                              "NCCL_SIM_INFO_INITIALIZER");
    ncclResult_t r = ncclGroupEnd();
    if (r == ncclSuccess && simInfo)
        simInfo->estimatedTime = 0.0f;
    return r;
}
#endif

/* ---- memory ------------------------------------------------------------- */

/* What the real one maps is rounded up to its granularity (2 MiB). */
#define VGNC_GRANULARITY (2u << 20)

ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr || size == 0)
        return vgnc_fail(ncclInvalidArgument, "ncclMemAlloc: invalid arguments (ptr %p, size %zu)", (void *)ptr,
                         size);
    *ptr = NULL;
    if (size > SIZE_MAX - VGNC_GRANULARITY)
        return vgnc_fail(ncclInvalidArgument, "ncclMemAlloc: size %zu is too large", size);
    size_t rounded = (size + VGNC_GRANULARITY - 1) / VGNC_GRANULARITY * VGNC_GRANULARITY;
    cudaError_t err = cudaMalloc(ptr, rounded);
    if (err != cudaSuccess)
        return vgnc_fail(ncclUnhandledCudaError, "Cuda failure '%s'", cudaGetErrorString(err));
    return ncclSuccess;
}

ncclResult_t ncclMemFree(void *ptr)
{
    if (!ptr)
        return ncclSuccess;
    cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess)
        return vgnc_fail(ncclUnhandledCudaError, "Cuda failure '%s'", cudaGetErrorString(err));
    return ncclSuccess;
}

/* A registration or a window: what was registered, for whom. */
struct vgnc_handle {
    uint32_t magic;
    ncclComm_t comm;
    void *buff;
    size_t size;
};

static ncclResult_t new_handle(uint32_t magic, ncclComm_t comm, void *buff, size_t size, const char *what,
                               void **out)
{
    if (size && vgfc_mem_check_device(buff, size, comm->device) != 0)
        return vgnc_fail(ncclInvalidArgument, "%s : buffer %p (%zu bytes) is not memory of device %d", what, buff,
                         size, comm->device);
    struct vgnc_handle *h = malloc(sizeof *h);
    if (!h)
        return vgnc_fail(ncclSystemError, "%s : out of host memory", what);
    *h = (struct vgnc_handle){magic, comm, buff, size};
    __atomic_add_fetch(&live_handles, 1, __ATOMIC_RELAXED);
    *out = h;
    return ncclSuccess;
}

static ncclResult_t free_handle(uint32_t magic, ncclComm_t comm, void *handle, const char *what)
{
    struct vgnc_handle *h = handle;
    if (!h || h->magic != magic || h->comm != comm)
        return vgnc_fail(ncclInvalidArgument, "%s : invalid handle %p", what, handle);
    h->magic = 0;
    free(h);
    __atomic_sub_fetch(&live_handles, 1, __ATOMIC_RELAXED);
    return ncclSuccess;
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    ncclResult_t r = vgnc_check_comm(comm, "ncclCommRegister");
    if (r != ncclSuccess)
        return r;
    if (!handle)
        return vgnc_fail(ncclInvalidArgument, "ncclCommRegister : handle argument is NULL");
    *handle = NULL;
    return new_handle(VGNC_REG_MAGIC, comm, buff, size, "ncclCommRegister", handle);
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    /* The real library's text names ncclCommRegister here too. */
    ncclResult_t r = vgnc_check_comm(comm, "ncclCommRegister");
    if (r != ncclSuccess)
        return r;
    return free_handle(VGNC_REG_MAGIC, comm, handle, "ncclCommDeregister");
}

#ifdef NCCL_WIN_COLL_SYMMETRIC /* windows: NCCL 2.27 and later */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags)
{
    ncclResult_t r = vgnc_check_comm(comm, "ncclCommWindowRegister");
    if (r != ncclSuccess)
        return r;
    if (!win)
        return vgnc_fail(ncclInvalidArgument, "ncclCommWindowRegister : win argument is NULL");
    *win = NULL;
#ifndef NCCL_WIN_STRICT_ORDERING
#define NCCL_WIN_STRICT_ORDERING 0x02
#endif
    if (winFlags & ~(NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING))
        return vgnc_fail(ncclInvalidArgument, "ncclCommWindowRegister : invalid winFlags %d", winFlags);
    void *h = NULL;
    r = new_handle(VGNC_WIN_MAGIC, comm, buff, size, "ncclCommWindowRegister", &h);
    if (r == ncclSuccess)
        *win = (ncclWindow_t)h;
    return r;
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    ncclResult_t r = vgnc_check_comm(comm, "ncclCommWindowDeregister");
    if (r != ncclSuccess)
        return r;
    return free_handle(VGNC_WIN_MAGIC, comm, win, "ncclCommWindowDeregister");
}

ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr)
{
    ncclResult_t r = vgnc_check_comm(comm, "ncclWinGetUserPtr");
    if (r != ncclSuccess)
        return r;
    struct vgnc_handle *h = (struct vgnc_handle *)win;
    if (!h || h->magic != VGNC_WIN_MAGIC || h->comm != comm || !outUserPtr)
        return vgnc_fail(ncclInvalidArgument, "ncclWinGetUserPtr : invalid window %p or outUserPtr", (void *)win);
    *outUserPtr = h->buff;
    return ncclSuccess;
}
#endif
