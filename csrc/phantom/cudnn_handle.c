/* cuDNN handles, versions, errors and knobs; the landing of the generated
 * stubs (build/fakecuda/gen/cudnn_stubs_gen.c); the counters tests read.
 *
 * The version reported is the one of the headers the stand-in is built
 * from, the cuDNN wheel PyTorch depends on: PyTorch refuses a cuDNN whose
 * version is older than the one it was compiled with, and the frontend
 * that PyTorch compiles in picks features by it.
 */
#include "cudnn_core.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HANDLE_MAGIC 0x76676468u /* "vgdh" */

struct cudnnContext {
    uint32_t magic;
    cudaStream_t stream;
};

int vgdnn_valid_handle(cudnnHandle_t handle)
{
    return handle && handle->magic == HANDLE_MAGIC;
}

/* ---- counters ------------------------------------------------------------ */

static const char *const counted_names[VGDNN_COUNTED_N] = {
#define VGDNN_NAME(name) #name,
    VGDNN_COUNTED(VGDNN_NAME)
#undef VGDNN_NAME
};
static long counted[VGDNN_COUNTED_N];

void vgdnn_count(enum vgdnn_counted which)
{
    __atomic_add_fetch(&counted[which], 1, __ATOMIC_RELAXED);
    if (vgfc_tracing())
        vgfc_trace("%s", counted_names[which]);
}

long vg_phantom_cudnn_calls(const char *name)
{
    for (int i = 0; i < VGDNN_COUNTED_N; i++)
        if (name && strcmp(counted_names[i], name) == 0)
            return __atomic_load_n(&counted[i], __ATOMIC_RELAXED);
    return -1;
}

/* ---- errors ---------------------------------------------------------- */

struct vgdnn_status_name {
    int code;
    const char *name;
};
/* Generated from cudnn_graph.h (gen_fakecuda.py cudnn). */
extern const struct vgdnn_status_name vgdnn_status_names[];
extern const int vgdnn_status_name_count;

static _Thread_local char last_error[256];

cudnnStatus_t vgdnn_fail(cudnnStatus_t status, const char *fmt, ...)
{
    char text[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    snprintf(last_error, sizeof last_error, "%s: %s (vramguard's cuDNN stand-in)",
             cudnnGetErrorString(status), text);
    if (vgfc_tracing())
        vgfc_trace("cuDNN: %s", last_error);
    return status;
}

cudnnStatus_t vgdnn_device_usable(const char *what)
{
    int sticky = vg_fakecuda_sticky_error();
    if (sticky)
        return vgdnn_fail(CUDNN_STATUS_EXECUTION_FAILED, "%s: the device has a sticky CUDA error %d",
                          what, sticky);
    return CUDNN_STATUS_SUCCESS;
}

const char *cudnnGetErrorString(cudnnStatus_t status)
{
    for (int i = 0; i < vgdnn_status_name_count; i++)
        if (vgdnn_status_names[i].code == (int)status)
            return vgdnn_status_names[i].name;
    return "CUDNN_STATUS_UNKNOWN";
}

#if CUDNN_MAJOR >= 9 /* cuDNN 8 keeps no last error to read */
void cudnnGetLastErrorString(char *message, size_t max_size)
{
    if (message && max_size) {
        snprintf(message, max_size, "%s", last_error);
        last_error[0] = '\0'; /* cuDNN clears it once read */
    }
}
#endif

cudnnStatus_t cudnnQueryRuntimeError(cudnnHandle_t handle, cudnnStatus_t *rstatus,
                                     cudnnErrQueryMode_t mode, cudnnRuntimeTag_t *tag)
{
    (void)mode;
    (void)tag;
    if (!vgdnn_valid_handle(handle) || !rstatus)
        return CUDNN_STATUS_BAD_PARAM;
    *rstatus = CUDNN_STATUS_SUCCESS; /* no kernel ran, none could fail */
    return CUDNN_STATUS_SUCCESS;
}

/* ---- versions ---------------------------------------------------------- */

size_t cudnnGetVersion(void)
{
    return CUDNN_VERSION;
}

#if CUDNN_MAJOR >= 9
size_t cudnnGetMaxDeviceVersion(void)
{
    return 1210; /* newer than any device the fake can report */
}
#endif

size_t cudnnGetCudartVersion(void)
{
    return CUDART_VERSION;
}

cudnnStatus_t cudnnGetProperty(libraryPropertyType type, int *value)
{
    if (!value)
        return CUDNN_STATUS_BAD_PARAM;
    switch (type) {
    case MAJOR_VERSION: *value = CUDNN_MAJOR; break;
    case MINOR_VERSION: *value = CUDNN_MINOR; break;
    case PATCH_LEVEL: *value = CUDNN_PATCHLEVEL; break;
    default: return CUDNN_STATUS_BAD_PARAM;
    }
    return CUDNN_STATUS_SUCCESS;
}

/* The sub-libraries' version checks: there are none to mismatch. */
#if CUDNN_MAJOR >= 9
cudnnStatus_t cudnnGraphVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnOpsVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnCnnVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnAdvVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
#else /* cuDNN 8's, an inference and a training library of each */
cudnnStatus_t cudnnOpsInferVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnOpsTrainVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnCnnInferVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnCnnTrainVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnAdvInferVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnAdvTrainVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
#endif

/* ---- handles ----------------------------------------------------------- */

/* A real cudnnCreate needs a current device; with the fake's device count
 * at 0 it fails as cuDNN does on a machine without a GPU. */
cudnnStatus_t cudnnCreate(cudnnHandle_t *handle)
{
    vgdnn_count(VGDNN_cudnnCreate);
    if (!handle)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (vgfc_device_count() < 1)
        return vgdnn_fail(CUDNN_STATUS_NOT_INITIALIZED, "cudnnCreate: no CUDA device");
    struct cudnnContext *h = calloc(1, sizeof *h);
    if (!h)
        return CUDNN_STATUS_ALLOC_FAILED;
    h->magic = HANDLE_MAGIC;
    *handle = h;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle)
{
    if (!vgdnn_valid_handle(handle))
        return CUDNN_STATUS_BAD_PARAM;
    handle->magic = 0;
    free(handle);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream)
{
    if (!vgdnn_valid_handle(handle))
        return CUDNN_STATUS_BAD_PARAM;
    handle->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *stream)
{
    if (!vgdnn_valid_handle(handle) || !stream)
        return CUDNN_STATUS_BAD_PARAM;
    *stream = handle->stream;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- knobs ------------------------------------------------------------- */

/* "123", "64KiB", "32MiB", "1GiB" (B K KiB M MiB G GiB T TiB, powers of
 * 1024), as VG_FAKECUDA_MEM reads them. */
static int parse_bytes(const char *text, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || errno)
        return -1;
    static const struct {
        const char *unit;
        unsigned shift;
    } units[] = {{"", 0}, {"B", 0}, {"K", 10}, {"KiB", 10}, {"M", 20}, {"MiB", 20},
                 {"G", 30}, {"GiB", 30}, {"T", 40}, {"TiB", 40}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].unit) == 0) {
            if (v > (~0ull >> units[i].shift))
                return -1;
            *out = (size_t)(v << units[i].shift);
            return 0;
        }
    return -1;
}

static size_t workspace_bytes;
static int workspace_set;
static pthread_once_t knobs_once = PTHREAD_ONCE_INIT;

/* What an attention graph's plan asked for on an H200 (cuDNN 9.19, torch
 * 2.11, forward and backward alike): with it a phantom's SDPA allocates
 * what the card's did, to the byte (bench/results/gpu-h200-2026-11-26). */
#define ATTENTION_WORKSPACE 256

/* The workspace model. Real cuDNN sizes a plan's workspace by the engine
 * it picks, which only the real library knows (measured on an H200 with
 * cuDNN 9.19: 0 to 54 MB for convolutions, 256 bytes for SDPA). The
 * stand-in reports 256 bytes for an attention graph's plan and 0 for
 * every other plan and algorithm (a lower bound of what a real GPU would
 * allocate, exact for the tensors themselves), unless
 * VG_PHANTOM_CUDNN_WORKSPACE names one size for all. */
static void read_knobs(void)
{
    const char *ws = getenv("VG_PHANTOM_CUDNN_WORKSPACE");
    if (ws && *ws && parse_bytes(ws, &workspace_bytes) != 0) {
        fprintf(stderr, "vramguard cuDNN stand-in: VG_PHANTOM_CUDNN_WORKSPACE=\"%s\": "
                        "want bytes, e.g. 0, 4096, 32MiB\n", ws);
        abort();
    }
    workspace_set = ws && *ws;
}

size_t vgdnn_workspace_bytes(void)
{
    pthread_once(&knobs_once, read_knobs);
    return workspace_bytes;
}

size_t vgdnn_graph_workspace_bytes(int attention)
{
    pthread_once(&knobs_once, read_knobs);
    return workspace_set || !attention ? workspace_bytes : ATTENTION_WORKSPACE;
}

/* ---- the stubs' landing ------------------------------------------------ */

/* A function the stand-in does not implement: one line on stderr the first
 * time each is called (`said` is the stub's own flag), counted with the
 * fake CUDA's stubs (vg_fakecuda_unsupported_calls, _last_unsupported). */
static long unsupported_calls;

long vg_phantom_cudnn_unsupported_calls(void)
{
    return __atomic_load_n(&unsupported_calls, __ATOMIC_RELAXED);
}

int vgdnn_unsupported(const char *name, int *said);
int vgdnn_unsupported(const char *name, int *said)
{
    __atomic_add_fetch(&unsupported_calls, 1, __ATOMIC_RELAXED);
    vgfc_unsupported(name);
    if (!__atomic_exchange_n(said, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "vramguard cuDNN stand-in: %s is not implemented "
                        "(CUDNN_STATUS_NOT_SUPPORTED)\n", name);
    vgdnn_fail(CUDNN_STATUS_NOT_SUPPORTED, "%s is not implemented", name);
    return CUDNN_STATUS_NOT_SUPPORTED;
}
