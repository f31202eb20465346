/* The cuDNN stand-in (libcudnn.so.N): what its files share.
 *
 * PyTorch links libcudnn.so.N alone; the real one is a thin loader that
 * dlopens its sub-libraries (graph, ops, cnn, adv, engines) and forwards to
 * them, and it exports the whole public API itself. So one library with
 * that soname, exporting every function the real one exports, replaces
 * cuDNN entirely: nothing ever asks for the sub-libraries.
 *
 * No kernel runs. Every call that would compute on the device checks its
 * arguments as far as it can (descriptors, device pointers against the
 * fake's live memory) and returns CUDNN_STATUS_SUCCESS; every size query
 * answers with a documented model (README.md, "cuDNN").
 *
 *   cudnn_handle.c       handles, versions, errors, knobs, the stubs' landing
 *   cudnn_legacy_desc.c  the legacy descriptors (tensor, filter, convolution, ...)
 *   cudnn_legacy_ops.c   the legacy operations and their size queries
 *   cudnn_backend.c      the backend (graph) API's descriptors
 *   cudnn_execute.c      cudnnBackendExecute
 *   cudnn_rnn.c          the RNN API
 */
#ifndef VGDNN_CORE_H
#define VGDNN_CORE_H

#include <cudnn.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

/* cuDNN 8 (PyTorch 2.0's) has neither the detailed statuses nor ragged
 * tensors: it answers a bad parameter of any kind with the plain status. */
#if CUDNN_MAJOR < 9
#define CUDNN_STATUS_BAD_PARAM_NULL_POINTER CUDNN_STATUS_BAD_PARAM
#define CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED CUDNN_STATUS_BAD_PARAM
#define CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH CUDNN_STATUS_BAD_PARAM
#define VGDNN_HAS_RAGGED 0
#else
#define VGDNN_HAS_RAGGED 1
#endif

/* ---- calls counted for tests (vg_phantom_cudnn_calls) ------------------- */

#define VGDNN_COUNTED(X)                       \
    X(cudnnCreate)                             \
    X(cudnnBackendExecute)                     \
    X(cudnnBackendFinalize)                    \
    X(cudnnConvolutionForward)                 \
    X(cudnnConvolutionBackwardData)            \
    X(cudnnConvolutionBackwardFilter)          \
    X(cudnnConvolutionBiasActivationForward)   \
    X(cudnnBatchNormalizationForwardTraining)  \
    X(cudnnBatchNormalizationForwardInference) \
    X(cudnnBatchNormalizationBackward)         \
    X(cudnnNormalizationForwardTraining)       \
    X(cudnnNormalizationForwardInference)      \
    X(cudnnNormalizationBackward)              \
    X(cudnnRNNForward)                         \
    X(cudnnRNNBackwardData_v8)                 \
    X(cudnnRNNBackwardWeights_v8)

enum vgdnn_counted {
#define VGDNN_ENUM(name) VGDNN_##name,
    VGDNN_COUNTED(VGDNN_ENUM)
#undef VGDNN_ENUM
    VGDNN_COUNTED_N
};

/* Counts the call and traces it (VG_FAKECUDA_TRACE). */
void vgdnn_count(enum vgdnn_counted which);

/* For tests, exported (README.md, "cuDNN"): calls of a counted function
 * by name (-1 for another name), the stubs' calls, the backend descriptors
 * alive (the user's and those they reference). */
long vg_phantom_cudnn_calls(const char *name);
long vg_phantom_cudnn_unsupported_calls(void);
long vg_phantom_cudnn_live_descriptors(void);

/* ---- errors ---------------------------------------------------------- */

/* Records `status` and a message for cudnnGetLastErrorString (per thread),
 * traces it, and returns `status`. */
cudnnStatus_t vgdnn_fail(cudnnStatus_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* CUDNN_STATUS_EXECUTION_FAILED when the fake device has a sticky error
 * (an illegal address earlier: a real GPU fails every later launch), else
 * success. Every call that would launch a kernel asks. */
cudnnStatus_t vgdnn_device_usable(const char *what);

/* ---- handles ----------------------------------------------------------- */

/* Whether `handle` came from cudnnCreate and is not destroyed. */
int vgdnn_valid_handle(cudnnHandle_t handle);

/* ---- the model for sizes cuDNN would choose (cudnn_handle.c) ------------ */

/* VG_PHANTOM_CUDNN_WORKSPACE: the workspace every execution plan, engine
 * config and legacy convolution algorithm reports, in bytes. */
size_t vgdnn_workspace_bytes(void);
/* A backend plan's workspace: an attention graph's (a matmul and no
 * convolution) or another's (cudnn_handle.c, the workspace model). */
size_t vgdnn_graph_workspace_bytes(int attention);

/* ---- legacy descriptors (cudnn_legacy_desc.c) -------------------------- */

/* The shape of a legacy tensor or filter descriptor. */
typedef struct vgdnn_shape {
    cudnnDataType_t dtype;
    int nb_dims;
    int dims[CUDNN_DIM_MAX];
    int strides[CUDNN_DIM_MAX];
} vgdnn_shape;

/* 0 and the shape, or CUDNN_STATUS_BAD_PARAM for a descriptor that is not
 * a live, set tensor descriptor (or filter descriptor). */
cudnnStatus_t vgdnn_tensor_shape(cudnnTensorDescriptor_t desc, vgdnn_shape *out);
cudnnStatus_t vgdnn_filter_shape(cudnnFilterDescriptor_t desc, vgdnn_shape *out);
int vgdnn_conv_valid(cudnnConvolutionDescriptor_t desc);
int vgdnn_activation_valid(cudnnActivationDescriptor_t desc);

/* Bytes of one element; 0 for a type the stand-in does not know. */
size_t vgdnn_dtype_size(cudnnDataType_t dtype);

/* Bytes from the first element to one past the last, from dims and
 * strides (elements); 0 for an empty tensor. */
size_t vgdnn_extent(int nb_dims, const int64_t *dims, const int64_t *strides, size_t elem);

/* Whether [ptr, ptr + bytes) lies in one live allocation on a device: 0,
 * or CUDNN_STATUS_BAD_PARAM with the last error saying which `what`. A
 * NULL pointer passes only for 0 bytes. */
cudnnStatus_t vgdnn_check_device_range(const void *ptr, size_t bytes, const char *what);

/* The same for the memory a legacy tensor descriptor describes at `ptr`. */
cudnnStatus_t vgdnn_check_tensor(const vgdnn_shape *shape, const void *ptr, const char *what);

#endif
