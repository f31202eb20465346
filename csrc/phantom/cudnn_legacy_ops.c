/* The legacy operations PyTorch calls (convolutions through the v7 API,
 * batch norm, pooling, dropout, the spatial transformer) and the sizes it
 * asks for before them. No kernel runs: each operation checks its handle,
 * its descriptors and that every buffer lies in live device memory as the
 * descriptors describe it, then succeeds; a sticky error on the fake device
 * fails it as it would fail a launch.
 *
 * Sizes (README.md, "cuDNN"):
 *   convolution workspaces   VG_PHANTOM_CUDNN_WORKSPACE, as the backend's plans
 *   batch norm workspace     0, and for CUDNN_BATCHNORM_SPATIAL_PERSISTENT
 *                            16 KiB + 8 bytes per channel (cuDNN 9.19 on an
 *                            H200: 0 for SPATIAL, 17588 bytes for a persistent
 *                            NHWC batch norm of 32 channels)
 *   batch norm reserve       0 for CUDNN_BATCHNORM_OPS_BN (measured likewise);
 *                            with a fused activation, one bit per element
 *                            (the activation's mask), rounded up to 4 bytes
 */
#include "cudnn_core.h"

#include <string.h>

static cudnnStatus_t check_handle(cudnnHandle_t handle)
{
    if (!vgdnn_valid_handle(handle))
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "not a cuDNN handle");
    return CUDNN_STATUS_SUCCESS;
}

/* The device buffers of a call, checked one after the other: the first
 * failure is the call's status. `shape` NULL: a plain range of `bytes`. */
struct buffer {
    const vgdnn_shape *shape;
    const void *ptr;
    size_t bytes;
    const char *what;
};

static cudnnStatus_t check_buffers(const char *call, const struct buffer *b, int n)
{
    cudnnStatus_t st = vgdnn_device_usable(call);
    for (int i = 0; i < n && st == CUDNN_STATUS_SUCCESS; i++)
        st = b[i].shape ? vgdnn_check_tensor(b[i].shape, b[i].ptr, b[i].what)
                        : vgdnn_check_device_range(b[i].ptr, b[i].bytes, b[i].what);
    return st;
}

/* ---- convolutions ------------------------------------------------------- */

/* The shapes of a convolution's three operands, and that the descriptor is set. */
static cudnnStatus_t conv_shapes(cudnnHandle_t handle, cudnnTensorDescriptor_t x,
                                 cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t conv,
                                 cudnnTensorDescriptor_t y, vgdnn_shape *xs, vgdnn_shape *ws,
                                 vgdnn_shape *ys)
{
    cudnnStatus_t st = check_handle(handle);
    if (st == CUDNN_STATUS_SUCCESS && !vgdnn_conv_valid(conv))
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "not a set convolution descriptor");
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(x, xs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_filter_shape(w, ws);
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(y, ys);
    if (st == CUDNN_STATUS_SUCCESS && (xs->nb_dims != ws->nb_dims || xs->nb_dims != ys->nb_dims))
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                        "input, filter and output of %d, %d and %d dimensions", xs->nb_dims,
                        ws->nb_dims, ys->nb_dims);
    return st;
}

static cudnnStatus_t conv_workspace(cudnnHandle_t handle, cudnnTensorDescriptor_t x,
                                    cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t conv,
                                    cudnnTensorDescriptor_t y, size_t *size)
{
    vgdnn_shape xs, ws, ys;
    cudnnStatus_t st = conv_shapes(handle, x, w, conv, y, &xs, &ws, &ys);
    if (st == CUDNN_STATUS_SUCCESS && !size)
        st = CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (st == CUDNN_STATUS_SUCCESS)
        *size = vgdnn_workspace_bytes();
    return st;
}

/* One algorithm per direction, the one PyTorch would most often be given
 * (IMPLICIT_PRECOMP_GEMM forward, ALGO_1 backward: both numbered 1),
 * deterministic, with the convolution's math type. */
#define PERF_RESULTS(perf_type, algo_value)                                                  \
    do {                                                                                     \
        if (st == CUDNN_STATUS_SUCCESS && (requested < 1 || !returned || !perf))             \
            st = CUDNN_STATUS_BAD_PARAM;                                                     \
        if (st != CUDNN_STATUS_SUCCESS)                                                      \
            return st;                                                                       \
        memset(perf, 0, sizeof *perf);                                                       \
        perf[0].algo = (algo_value);                                                         \
        perf[0].status = CUDNN_STATUS_SUCCESS;                                               \
        perf[0].time = 0.01f;                                                                \
        perf[0].memory = vgdnn_workspace_bytes();                                            \
        perf[0].determinism = CUDNN_DETERMINISTIC;                                           \
        cudnnGetConvolutionMathType(conv, &perf[0].mathType);                                \
        *returned = 1;                                                                       \
        return CUDNN_STATUS_SUCCESS;                                                         \
    } while (0)

cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int *count)
{
    if (check_handle(handle) || !count)
        return CUDNN_STATUS_BAD_PARAM;
    *count = 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t handle, int *count)
{
    return cudnnGetConvolutionForwardAlgorithmMaxCount(handle, count);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t handle, int *count)
{
    return cudnnGetConvolutionForwardAlgorithmMaxCount(handle, count);
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w,
                                                     const cudnnConvolutionDescriptor_t conv,
                                                     const cudnnTensorDescriptor_t y, const int requested,
                                                     int *returned, cudnnConvolutionFwdAlgoPerf_t *perf)
{
    vgdnn_shape xs, ws, ys;
    cudnnStatus_t st = conv_shapes(handle, x, w, conv, y, &xs, &ws, &ys);
    PERF_RESULTS(cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t handle, const cudnnTensorDescriptor_t x,
                                                   const cudnnFilterDescriptor_t w,
                                                   const cudnnConvolutionDescriptor_t conv,
                                                   const cudnnTensorDescriptor_t y, const int requested,
                                                   int *returned, cudnnConvolutionFwdAlgoPerf_t *perf)
{
    return cudnnGetConvolutionForwardAlgorithm_v7(handle, x, w, conv, y, requested, returned, perf);
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const void *xp, const cudnnFilterDescriptor_t w,
    const void *wp, const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t y, void *yp,
    const int requested, int *returned, cudnnConvolutionFwdAlgoPerf_t *perf, void *ws_ptr, size_t ws_bytes)
{
    vgdnn_shape xs, ws, ys;
    cudnnStatus_t st = conv_shapes(handle, x, w, conv, y, &xs, &ws, &ys);
    if (st == CUDNN_STATUS_SUCCESS) {
        struct buffer b[] = {{&xs, xp, 0, "x"}, {&ws, wp, 0, "w"}, {&ys, yp, 0, "y"},
                             {NULL, ws_ptr, ws_bytes, "the workspace"}};
        st = check_buffers("cudnnFindConvolutionForwardAlgorithmEx", b, 4);
    }
    PERF_RESULTS(cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t x,
                                                      const cudnnFilterDescriptor_t w,
                                                      const cudnnConvolutionDescriptor_t conv,
                                                      const cudnnTensorDescriptor_t y,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t *size)
{
    (void)algo;
    return conv_workspace(handle, x, w, conv, y, size);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t x,
                                      const void *xp, const cudnnFilterDescriptor_t w, const void *wp,
                                      const cudnnConvolutionDescriptor_t conv, cudnnConvolutionFwdAlgo_t algo,
                                      void *ws_ptr, size_t ws_bytes, const void *beta,
                                      const cudnnTensorDescriptor_t y, void *yp)
{
    (void)algo;
    vgdnn_count(VGDNN_cudnnConvolutionForward);
    vgdnn_shape xs, ws, ys;
    cudnnStatus_t st = conv_shapes(handle, x, w, conv, y, &xs, &ws, &ys);
    if (st == CUDNN_STATUS_SUCCESS && (!alpha || !beta))
        st = CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (st == CUDNN_STATUS_SUCCESS) {
        struct buffer b[] = {{&xs, xp, 0, "x"}, {&ws, wp, 0, "w"}, {&ys, yp, 0, "y"},
                             {NULL, ws_ptr, ws_bytes, "the workspace"}};
        st = check_buffers("cudnnConvolutionForward", b, 4);
    }
    return st;
}

cudnnStatus_t cudnnConvolutionBiasActivationForward(
    cudnnHandle_t handle, const void *alpha1, const cudnnTensorDescriptor_t x, const void *xp,
    const cudnnFilterDescriptor_t w, const void *wp, const cudnnConvolutionDescriptor_t conv,
    cudnnConvolutionFwdAlgo_t algo, void *ws_ptr, size_t ws_bytes, const void *alpha2,
    const cudnnTensorDescriptor_t z, const void *zp, const cudnnTensorDescriptor_t bias, const void *bp,
    const cudnnActivationDescriptor_t act, const cudnnTensorDescriptor_t y, void *yp)
{
    (void)algo;
    vgdnn_count(VGDNN_cudnnConvolutionBiasActivationForward);
    vgdnn_shape xs, ws, ys, zs, bs;
    cudnnStatus_t st = conv_shapes(handle, x, w, conv, y, &xs, &ws, &ys);
    if (st == CUDNN_STATUS_SUCCESS && (!alpha1 || !alpha2))
        st = CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (st == CUDNN_STATUS_SUCCESS && !vgdnn_activation_valid(act))
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "not an activation descriptor");
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(z, &zs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(bias, &bs);
    if (st == CUDNN_STATUS_SUCCESS) {
        struct buffer b[] = {{&xs, xp, 0, "x"}, {&ws, wp, 0, "w"}, {&zs, zp, 0, "z"},
                             {&bs, bp, 0, "the bias"}, {&ys, yp, 0, "y"},
                             {NULL, ws_ptr, ws_bytes, "the workspace"}};
        st = check_buffers("cudnnConvolutionBiasActivationForward", b, 6);
    }
    return st;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx, const int requested,
    int *returned, cudnnConvolutionBwdDataAlgoPerf_t *perf)
{
    vgdnn_shape xs, ws, ys;
    cudnnStatus_t st = conv_shapes(handle, dx, w, conv, dy, &xs, &ws, &ys);
    PERF_RESULTS(cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx, const int requested,
    int *returned, cudnnConvolutionBwdDataAlgoPerf_t *perf)
{
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, w, dy, conv, dx, requested, returned, perf);
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t w, const void *wp, const cudnnTensorDescriptor_t dy,
    const void *dyp, const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx, void *dxp,
    const int requested, int *returned, cudnnConvolutionBwdDataAlgoPerf_t *perf, void *ws_ptr,
    size_t ws_bytes)
{
    vgdnn_shape xs, ws, ys;
    cudnnStatus_t st = conv_shapes(handle, dx, w, conv, dy, &xs, &ws, &ys);
    if (st == CUDNN_STATUS_SUCCESS) {
        struct buffer b[] = {{&ws, wp, 0, "w"}, {&ys, dyp, 0, "dy"}, {&xs, dxp, 0, "dx"},
                             {NULL, ws_ptr, ws_bytes, "the workspace"}};
        st = check_buffers("cudnnFindConvolutionBackwardDataAlgorithmEx", b, 4);
    }
    PERF_RESULTS(cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx,
    cudnnConvolutionBwdDataAlgo_t algo, size_t *size)
{
    (void)algo;
    return conv_workspace(handle, dx, w, conv, dy, size);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
                                           const cudnnFilterDescriptor_t w, const void *wp,
                                           const cudnnTensorDescriptor_t dy, const void *dyp,
                                           const cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *ws_ptr, size_t ws_bytes,
                                           const void *beta, const cudnnTensorDescriptor_t dx, void *dxp)
{
    (void)algo;
    vgdnn_count(VGDNN_cudnnConvolutionBackwardData);
    vgdnn_shape xs, ws, ys;
    cudnnStatus_t st = conv_shapes(handle, dx, w, conv, dy, &xs, &ws, &ys);
    if (st == CUDNN_STATUS_SUCCESS && (!alpha || !beta))
        st = CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (st == CUDNN_STATUS_SUCCESS) {
        struct buffer b[] = {{&ws, wp, 0, "w"}, {&ys, dyp, 0, "dy"}, {&xs, dxp, 0, "dx"},
                             {NULL, ws_ptr, ws_bytes, "the workspace"}};
        st = check_buffers("cudnnConvolutionBackwardData", b, 4);
    }
    return st;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw, const int requested,
    int *returned, cudnnConvolutionBwdFilterAlgoPerf_t *perf)
{
    vgdnn_shape xs, ws, ys;
    cudnnStatus_t st = conv_shapes(handle, x, dw, conv, dy, &xs, &ws, &ys);
    PERF_RESULTS(cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw, const int requested,
    int *returned, cudnnConvolutionBwdFilterAlgoPerf_t *perf)
{
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, x, dy, conv, dw, requested, returned, perf);
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const void *xp, const cudnnTensorDescriptor_t dy,
    const void *dyp, const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw, void *dwp,
    const int requested, int *returned, cudnnConvolutionBwdFilterAlgoPerf_t *perf, void *ws_ptr,
    size_t ws_bytes)
{
    vgdnn_shape xs, ws, ys;
    cudnnStatus_t st = conv_shapes(handle, x, dw, conv, dy, &xs, &ws, &ys);
    if (st == CUDNN_STATUS_SUCCESS) {
        struct buffer b[] = {{&xs, xp, 0, "x"}, {&ys, dyp, 0, "dy"}, {&ws, dwp, 0, "dw"},
                             {NULL, ws_ptr, ws_bytes, "the workspace"}};
        st = check_buffers("cudnnFindConvolutionBackwardFilterAlgorithmEx", b, 4);
    }
    PERF_RESULTS(cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t *size)
{
    (void)algo;
    return conv_workspace(handle, x, dw, conv, dy, size);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
                                             const cudnnTensorDescriptor_t x, const void *xp,
                                             const cudnnTensorDescriptor_t dy, const void *dyp,
                                             const cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *ws_ptr,
                                             size_t ws_bytes, const void *beta,
                                             const cudnnFilterDescriptor_t dw, void *dwp)
{
    (void)algo;
    vgdnn_count(VGDNN_cudnnConvolutionBackwardFilter);
    vgdnn_shape xs, ws, ys;
    cudnnStatus_t st = conv_shapes(handle, x, dw, conv, dy, &xs, &ws, &ys);
    if (st == CUDNN_STATUS_SUCCESS && (!alpha || !beta))
        st = CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (st == CUDNN_STATUS_SUCCESS) {
        struct buffer b[] = {{&xs, xp, 0, "x"}, {&ys, dyp, 0, "dy"}, {&ws, dwp, 0, "dw"},
                             {NULL, ws_ptr, ws_bytes, "the workspace"}};
        st = check_buffers("cudnnConvolutionBackwardFilter", b, 4);
    }
    return st;
}

cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t handle, const void *alpha,
                                           const cudnnTensorDescriptor_t dy, const void *dyp,
                                           const void *beta, const cudnnTensorDescriptor_t db, void *dbp)
{
    vgdnn_shape ys, bs;
    cudnnStatus_t st = check_handle(handle);
    if (st == CUDNN_STATUS_SUCCESS && (!alpha || !beta))
        st = CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(dy, &ys);
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(db, &bs);
    if (st == CUDNN_STATUS_SUCCESS) {
        struct buffer b[] = {{&ys, dyp, 0, "dy"}, {&bs, dbp, 0, "db"}};
        st = check_buffers("cudnnConvolutionBackwardBias", b, 2);
    }
    return st;
}

/* ---- batch norm ---------------------------------------------------------- */

/* The scale/bias/mean/variance shape cuDNN derives from x: one value per
 * channel (SPATIAL modes) or per activation, in float for half-precision
 * inputs. */
static cudnnStatus_t derive_norm_shape(const vgdnn_shape *x, int per_channel, vgdnn_shape *out)
{
    if (x->nb_dims < 3)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "batch norm over %d dimensions", x->nb_dims);
    *out = *x;
    out->dims[0] = 1;
    if (per_channel)
        for (int i = 2; i < x->nb_dims; i++)
            out->dims[i] = 1;
    int s = 1;
    for (int i = x->nb_dims - 1; i >= 0; i--) {
        out->strides[i] = s;
        s *= out->dims[i];
    }
    if ((int)x->dtype == CUDNN_DATA_HALF || (int)x->dtype == CUDNN_DATA_BFLOAT16)
        out->dtype = CUDNN_DATA_FLOAT;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t set_derived(cudnnTensorDescriptor_t derived, const vgdnn_shape *s)
{
    return cudnnSetTensorNdDescriptor(derived, s->dtype, s->nb_dims, s->dims, s->strides);
}

cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derived, const cudnnTensorDescriptor_t x,
                                            cudnnBatchNormMode_t mode)
{
    vgdnn_shape xs, bn;
    cudnnStatus_t st = vgdnn_tensor_shape(x, &xs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = derive_norm_shape(&xs, mode != CUDNN_BATCHNORM_PER_ACTIVATION, &bn);
    return st ? st : set_derived(derived, &bn);
}

static size_t channels(const vgdnn_shape *x)
{
    return x->nb_dims > 1 ? (size_t)x->dims[1] : 1;
}

static size_t elements(const vgdnn_shape *x)
{
    size_t n = 1;
    for (int i = 0; i < x->nb_dims; i++)
        n *= (size_t)x->dims[i];
    return n;
}

static size_t bn_workspace(cudnnBatchNormMode_t mode, const vgdnn_shape *x)
{
    return mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT ? 16384 + 8 * channels(x) : 0;
}

static size_t bn_reserve(cudnnBatchNormOps_t ops, const vgdnn_shape *x)
{
    return ops == CUDNN_BATCHNORM_OPS_BN ? 0 : (elements(x) + 31) / 32 * 4;
}

cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops, const cudnnTensorDescriptor_t x,
    const cudnnTensorDescriptor_t z, const cudnnTensorDescriptor_t y, const cudnnTensorDescriptor_t bn,
    const cudnnActivationDescriptor_t act, size_t *size)
{
    (void)ops, (void)z, (void)y, (void)bn, (void)act;
    vgdnn_shape xs;
    cudnnStatus_t st = check_handle(handle);
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(x, &xs);
    if (st == CUDNN_STATUS_SUCCESS && !size)
        st = CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (st == CUDNN_STATUS_SUCCESS)
        *size = bn_workspace(mode, &xs);
    return st;
}

cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops, const cudnnTensorDescriptor_t x,
    const cudnnTensorDescriptor_t y, const cudnnTensorDescriptor_t dy, const cudnnTensorDescriptor_t dz,
    const cudnnTensorDescriptor_t dx, const cudnnTensorDescriptor_t dbn, const cudnnActivationDescriptor_t act,
    size_t *size)
{
    (void)y, (void)dy, (void)dz, (void)dx;
    return cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, mode, ops, x, NULL, NULL, dbn,
                                                                    act, size);
}

cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(cudnnHandle_t handle,
                                                                   cudnnBatchNormMode_t mode,
                                                                   cudnnBatchNormOps_t ops,
                                                                   const cudnnActivationDescriptor_t act,
                                                                   const cudnnTensorDescriptor_t x, size_t *size)
{
    (void)mode, (void)act;
    vgdnn_shape xs;
    cudnnStatus_t st = check_handle(handle);
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(x, &xs);
    if (st == CUDNN_STATUS_SUCCESS && !size)
        st = CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (st == CUDNN_STATUS_SUCCESS)
        *size = bn_reserve(ops, &xs);
    return st;
}

/* What every batch norm checks: x and y (or dy and dx) as described, the
 * per-channel parameters as bn_desc describes them. `params` NULL ends. */
static cudnnStatus_t bn_check(const char *call, cudnnHandle_t handle, cudnnTensorDescriptor_t x,
                              const void *xp, cudnnTensorDescriptor_t y, const void *yp,
                              cudnnTensorDescriptor_t bn_desc, const void *const *params,
                              const char *const *names, int nparams, const void *ws_ptr, size_t ws_bytes,
                              const void *rs_ptr, size_t rs_bytes)
{
    vgdnn_shape xs, ys, bs;
    cudnnStatus_t st = check_handle(handle);
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(x, &xs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(y, &ys);
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(bn_desc, &bs);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    struct buffer b[8];
    int n = 0;
    b[n++] = (struct buffer){&xs, xp, 0, "x"};
    b[n++] = (struct buffer){&ys, yp, 0, "y"};
    for (int i = 0; i < nparams && n < 6; i++)
        if (params[i]) /* optional ones (running statistics) may be NULL */
            b[n++] = (struct buffer){&bs, params[i], 0, names[i]};
    b[n++] = (struct buffer){NULL, ws_ptr, ws_bytes, "the workspace"};
    b[n++] = (struct buffer){NULL, rs_ptr, rs_bytes, "the reserve space"};
    return check_buffers(call, b, n);
}

cudnnStatus_t cudnnBatchNormalizationForwardTrainingEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops, const void *alpha,
    const void *beta, const cudnnTensorDescriptor_t x, const void *xp, const cudnnTensorDescriptor_t z,
    const void *zp, const cudnnTensorDescriptor_t y, void *yp, const cudnnTensorDescriptor_t bn,
    const void *scale, const void *bias, double factor, void *run_mean, void *run_var, double eps,
    void *save_mean, void *save_inv_var, cudnnActivationDescriptor_t act, void *ws_ptr, size_t ws_bytes,
    void *rs_ptr, size_t rs_bytes)
{
    (void)mode, (void)factor, (void)eps, (void)act;
    vgdnn_count(VGDNN_cudnnBatchNormalizationForwardTraining);
    if (!alpha || !beta || !scale || !bias)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "batch norm: alpha, beta, scale or bias");
    if (ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION) {
        vgdnn_shape zs;
        cudnnStatus_t st = vgdnn_tensor_shape(z, &zs);
        if (st == CUDNN_STATUS_SUCCESS)
            st = vgdnn_check_tensor(&zs, zp, "z");
        if (st != CUDNN_STATUS_SUCCESS)
            return st;
    }
    const void *params[] = {scale, bias, run_mean, run_var, save_mean, save_inv_var};
    const char *names[] = {"the scale", "the bias", "the running mean", "the running variance",
                           "the saved mean", "the saved inverse variance"};
    return bn_check("cudnnBatchNormalizationForwardTrainingEx", handle, x, xp, y, yp, bn, params, names, 6,
                    ws_ptr, ws_bytes, rs_ptr, rs_bytes);
}

cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t x, const void *xp, const cudnnTensorDescriptor_t y, void *yp,
    const cudnnTensorDescriptor_t bn, const void *scale, const void *bias, double factor, void *run_mean,
    void *run_var, double eps, void *save_mean, void *save_inv_var)
{
    return cudnnBatchNormalizationForwardTrainingEx(handle, mode, CUDNN_BATCHNORM_OPS_BN, alpha, beta, x,
                                                    xp, NULL, NULL, y, yp, bn, scale, bias, factor,
                                                    run_mean, run_var, eps, save_mean, save_inv_var, NULL,
                                                    NULL, 0, NULL, 0);
}

cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t x, const void *xp, const cudnnTensorDescriptor_t y, void *yp,
    const cudnnTensorDescriptor_t bn, const void *scale, const void *bias, const void *mean,
    const void *var, double eps)
{
    (void)mode, (void)eps;
    vgdnn_count(VGDNN_cudnnBatchNormalizationForwardInference);
    if (!alpha || !beta || !scale || !bias || !mean || !var)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                          "batch norm inference: alpha, beta, scale, bias, mean or variance");
    const void *params[] = {scale, bias, mean, var};
    const char *names[] = {"the scale", "the bias", "the estimated mean", "the estimated variance"};
    return bn_check("cudnnBatchNormalizationForwardInference", handle, x, xp, y, yp, bn, params, names, 4,
                    NULL, 0, NULL, 0);
}

cudnnStatus_t cudnnBatchNormalizationBackwardEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops, const void *alpha_d,
    const void *beta_d, const void *alpha_p, const void *beta_p, const cudnnTensorDescriptor_t x,
    const void *xp, const cudnnTensorDescriptor_t y, const void *yp, const cudnnTensorDescriptor_t dy,
    const void *dyp, const cudnnTensorDescriptor_t dz, void *dzp, const cudnnTensorDescriptor_t dx, void *dxp,
    const cudnnTensorDescriptor_t dbn, const void *scale, const void *bias, void *dscale, void *dbias,
    double eps, const void *save_mean, const void *save_inv_var, cudnnActivationDescriptor_t act,
    void *ws_ptr, size_t ws_bytes, void *rs_ptr, size_t rs_bytes)
{
    (void)mode, (void)eps, (void)act, (void)bias;
    vgdnn_count(VGDNN_cudnnBatchNormalizationBackward);
    if (!alpha_d || !beta_d || !alpha_p || !beta_p || !scale || !dscale || !dbias)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "batch norm backward: scalars or parameters");
    /* y and dz take part only with a fused activation (and addition). */
    if (ops != CUDNN_BATCHNORM_OPS_BN) {
        vgdnn_shape ys;
        cudnnStatus_t st = vgdnn_tensor_shape(y, &ys);
        if (st == CUDNN_STATUS_SUCCESS)
            st = vgdnn_check_tensor(&ys, yp, "y");
        if (st == CUDNN_STATUS_SUCCESS && ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION) {
            vgdnn_shape zs;
            st = vgdnn_tensor_shape(dz, &zs);
            if (st == CUDNN_STATUS_SUCCESS)
                st = vgdnn_check_tensor(&zs, dzp, "dz");
        }
        if (st != CUDNN_STATUS_SUCCESS)
            return st;
    }
    /* x with dx first, then dy against x's shape. */
    const void *params[] = {scale, dscale, dbias, save_mean, save_inv_var};
    const char *names[] = {"the scale", "the scale's gradient", "the bias's gradient", "the saved mean",
                           "the saved inverse variance"};
    cudnnStatus_t st = bn_check("cudnnBatchNormalizationBackward", handle, x, xp, dx, dxp, dbn, params, names,
                                5, ws_ptr, ws_bytes, rs_ptr, rs_bytes);
    if (st == CUDNN_STATUS_SUCCESS) {
        vgdnn_shape dys;
        st = vgdnn_tensor_shape(dy, &dys);
        if (st == CUDNN_STATUS_SUCCESS)
            st = vgdnn_check_tensor(&dys, dyp, "dy");
    }
    return st;
}

cudnnStatus_t cudnnBatchNormalizationBackward(cudnnHandle_t handle, cudnnBatchNormMode_t mode,
                                              const void *alpha_d, const void *beta_d, const void *alpha_p,
                                              const void *beta_p, const cudnnTensorDescriptor_t x,
                                              const void *xp, const cudnnTensorDescriptor_t dy,
                                              const void *dyp, const cudnnTensorDescriptor_t dx, void *dxp,
                                              const cudnnTensorDescriptor_t dbn, const void *scale,
                                              void *dscale, void *dbias, double eps, const void *save_mean,
                                              const void *save_inv_var)
{
    return cudnnBatchNormalizationBackwardEx(handle, mode, CUDNN_BATCHNORM_OPS_BN, alpha_d, beta_d, alpha_p,
                                             beta_p, x, xp, NULL, NULL, dy, dyp, NULL, NULL, dx, dxp, dbn,
                                             scale, NULL, dscale, dbias, eps, save_mean, save_inv_var, NULL,
                                             NULL, 0, NULL, 0);
}

/* ---- the generic normalization API: batch norm's sizes and checks ----- */

cudnnStatus_t cudnnDeriveNormTensorDescriptor(cudnnTensorDescriptor_t scale_bias,
                                              cudnnTensorDescriptor_t mean_var, const cudnnTensorDescriptor_t x,
                                              cudnnNormMode_t mode, int groups)
{
    (void)groups;
    vgdnn_shape xs, d;
    cudnnStatus_t st = vgdnn_tensor_shape(x, &xs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = derive_norm_shape(&xs, mode == CUDNN_NORM_PER_CHANNEL, &d);
    if (st == CUDNN_STATUS_SUCCESS)
        st = set_derived(scale_bias, &d);
    if (st == CUDNN_STATUS_SUCCESS)
        st = set_derived(mean_var, &d);
    return st;
}

static cudnnStatus_t norm_size(cudnnHandle_t handle, cudnnTensorDescriptor_t x, size_t *size, size_t value)
{
    vgdnn_shape xs;
    cudnnStatus_t st = check_handle(handle);
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(x, &xs);
    if (st == CUDNN_STATUS_SUCCESS && !size)
        st = CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (st == CUDNN_STATUS_SUCCESS)
        *size = value;
    return st;
}

cudnnStatus_t cudnnGetNormalizationForwardTrainingWorkspaceSize(
    cudnnHandle_t handle, cudnnNormMode_t mode, cudnnNormOps_t ops, cudnnNormAlgo_t algo,
    const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t z, const cudnnTensorDescriptor_t y,
    const cudnnTensorDescriptor_t scale_bias, const cudnnActivationDescriptor_t act,
    const cudnnTensorDescriptor_t mean_var, size_t *size, int groups)
{
    (void)mode, (void)ops, (void)z, (void)y, (void)scale_bias, (void)act, (void)mean_var, (void)groups;
    vgdnn_shape xs;
    size_t bytes = 0;
    if (algo == CUDNN_NORM_ALGO_PERSIST && vgdnn_tensor_shape(x, &xs) == CUDNN_STATUS_SUCCESS)
        bytes = bn_workspace(CUDNN_BATCHNORM_SPATIAL_PERSISTENT, &xs);
    return norm_size(handle, x, size, bytes);
}

cudnnStatus_t cudnnGetNormalizationBackwardWorkspaceSize(
    cudnnHandle_t handle, cudnnNormMode_t mode, cudnnNormOps_t ops, cudnnNormAlgo_t algo,
    const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t y, const cudnnTensorDescriptor_t dy,
    const cudnnTensorDescriptor_t dz, const cudnnTensorDescriptor_t dx,
    const cudnnTensorDescriptor_t dscale_bias, const cudnnActivationDescriptor_t act,
    const cudnnTensorDescriptor_t mean_var, size_t *size, int groups)
{
    (void)y, (void)dy, (void)dz, (void)dx;
    return cudnnGetNormalizationForwardTrainingWorkspaceSize(handle, mode, ops, algo, x, NULL, NULL,
                                                             dscale_bias, act, mean_var, size, groups);
}

cudnnStatus_t cudnnGetNormalizationTrainingReserveSpaceSize(cudnnHandle_t handle, cudnnNormMode_t mode,
                                                            cudnnNormOps_t ops, cudnnNormAlgo_t algo,
                                                            const cudnnActivationDescriptor_t act,
                                                            const cudnnTensorDescriptor_t x, size_t *size,
                                                            int groups)
{
    (void)mode, (void)algo, (void)act, (void)groups;
    vgdnn_shape xs;
    size_t bytes = 0;
    if (ops != CUDNN_NORM_OPS_NORM && vgdnn_tensor_shape(x, &xs) == CUDNN_STATUS_SUCCESS)
        bytes = bn_reserve(CUDNN_BATCHNORM_OPS_BN_ACTIVATION, &xs);
    return norm_size(handle, x, size, bytes);
}

cudnnStatus_t cudnnNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnNormMode_t mode, cudnnNormOps_t ops, cudnnNormAlgo_t algo, const void *alpha,
    const void *beta, const cudnnTensorDescriptor_t x, const void *xp,
    const cudnnTensorDescriptor_t scale_bias, const void *scale, const void *bias, double factor,
    const cudnnTensorDescriptor_t mean_var, void *run_mean, void *run_var, double eps, void *save_mean,
    void *save_inv_var, cudnnActivationDescriptor_t act, const cudnnTensorDescriptor_t z, const void *zp,
    const cudnnTensorDescriptor_t y, void *yp, void *ws_ptr, size_t ws_bytes, void *rs_ptr,
    size_t rs_bytes, int groups)
{
    (void)mode, (void)ops, (void)algo, (void)factor, (void)eps, (void)act, (void)z, (void)zp, (void)groups;
    (void)mean_var;
    vgdnn_count(VGDNN_cudnnNormalizationForwardTraining);
    if (!alpha || !beta || !scale || !bias)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "normalization: alpha, beta, scale or bias");
    const void *params[] = {scale, bias, run_mean, run_var, save_mean, save_inv_var};
    const char *names[] = {"the scale", "the bias", "the running mean", "the running variance",
                           "the saved mean", "the saved inverse variance"};
    return bn_check("cudnnNormalizationForwardTraining", handle, x, xp, y, yp, scale_bias, params, names, 6,
                    ws_ptr, ws_bytes, rs_ptr, rs_bytes);
}

cudnnStatus_t cudnnNormalizationForwardInference(
    cudnnHandle_t handle, cudnnNormMode_t mode, cudnnNormOps_t ops, cudnnNormAlgo_t algo, const void *alpha,
    const void *beta, const cudnnTensorDescriptor_t x, const void *xp,
    const cudnnTensorDescriptor_t scale_bias, const void *scale, const void *bias,
    const cudnnTensorDescriptor_t mean_var, const void *mean, const void *var,
    const cudnnTensorDescriptor_t z, const void *zp, cudnnActivationDescriptor_t act,
    const cudnnTensorDescriptor_t y, void *yp, double eps, int groups)
{
    (void)mode, (void)ops, (void)algo, (void)mean_var, (void)z, (void)zp, (void)act, (void)eps, (void)groups;
    vgdnn_count(VGDNN_cudnnNormalizationForwardInference);
    if (!alpha || !beta || !scale || !bias || !mean || !var)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "normalization inference: scalars or parameters");
    const void *params[] = {scale, bias, mean, var};
    const char *names[] = {"the scale", "the bias", "the estimated mean", "the estimated variance"};
    return bn_check("cudnnNormalizationForwardInference", handle, x, xp, y, yp, scale_bias, params, names, 4,
                    NULL, 0, NULL, 0);
}

cudnnStatus_t cudnnNormalizationBackward(
    cudnnHandle_t handle, cudnnNormMode_t mode, cudnnNormOps_t ops, cudnnNormAlgo_t algo, const void *alpha_d,
    const void *beta_d, const void *alpha_p, const void *beta_p, const cudnnTensorDescriptor_t x,
    const void *xp, const cudnnTensorDescriptor_t y, const void *yp, const cudnnTensorDescriptor_t dy,
    const void *dyp, const cudnnTensorDescriptor_t dz, void *dzp, const cudnnTensorDescriptor_t dx, void *dxp,
    const cudnnTensorDescriptor_t dscale_bias, const void *scale, const void *bias, void *dscale,
    void *dbias, double eps, const cudnnTensorDescriptor_t mean_var, const void *save_mean,
    const void *save_inv_var, cudnnActivationDescriptor_t act, void *ws_ptr, size_t ws_bytes, void *rs_ptr,
    size_t rs_bytes, int groups)
{
    (void)mode, (void)ops, (void)algo, (void)y, (void)yp, (void)dz, (void)dzp, (void)bias, (void)eps;
    (void)mean_var, (void)act, (void)groups;
    vgdnn_count(VGDNN_cudnnNormalizationBackward);
    if (!alpha_d || !beta_d || !alpha_p || !beta_p || !scale || !dscale || !dbias)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "normalization backward: scalars or parameters");
    const void *params[] = {scale, dscale, dbias, save_mean, save_inv_var};
    const char *names[] = {"the scale", "the scale's gradient", "the bias's gradient", "the saved mean",
                           "the saved inverse variance"};
    cudnnStatus_t st = bn_check("cudnnNormalizationBackward", handle, x, xp, dx, dxp, dscale_bias, params,
                                names, 5, ws_ptr, ws_bytes, rs_ptr, rs_bytes);
    if (st == CUDNN_STATUS_SUCCESS) {
        vgdnn_shape dys;
        st = vgdnn_tensor_shape(dy, &dys);
        if (st == CUDNN_STATUS_SUCCESS)
            st = vgdnn_check_tensor(&dys, dyp, "dy");
    }
    return st;
}

/* ---- pooling, dropout, spatial transformer ------------------------------ */

static cudnnStatus_t two_tensors(const char *call, cudnnHandle_t handle, cudnnTensorDescriptor_t a,
                                 const void *ap, const char *an, cudnnTensorDescriptor_t b, const void *bp,
                                 const char *bn)
{
    vgdnn_shape as, bs;
    cudnnStatus_t st = check_handle(handle);
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(a, &as);
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(b, &bs);
    if (st == CUDNN_STATUS_SUCCESS) {
        struct buffer buf[] = {{&as, ap, 0, an}, {&bs, bp, 0, bn}};
        st = check_buffers(call, buf, 2);
    }
    return st;
}

cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t pool, const void *alpha,
                                  const cudnnTensorDescriptor_t x, const void *xp, const void *beta,
                                  const cudnnTensorDescriptor_t y, void *yp)
{
    int nb;
    if (!alpha || !beta || cudnnGetPoolingNdDescriptor(pool, 0, NULL, NULL, &nb, NULL, NULL, NULL))
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "pooling: descriptor or scalars");
    return two_tensors("cudnnPoolingForward", handle, x, xp, "x", y, yp, "y");
}

cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t pool, const void *alpha,
                                   const cudnnTensorDescriptor_t y, const void *yp,
                                   const cudnnTensorDescriptor_t dy, const void *dyp,
                                   const cudnnTensorDescriptor_t x, const void *xp, const void *beta,
                                   const cudnnTensorDescriptor_t dx, void *dxp)
{
    int nb;
    if (!alpha || !beta || cudnnGetPoolingNdDescriptor(pool, 0, NULL, NULL, &nb, NULL, NULL, NULL))
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "pooling: descriptor or scalars");
    cudnnStatus_t st = two_tensors("cudnnPoolingBackward", handle, y, yp, "y", dy, dyp, "dy");
    return st ? st : two_tensors("cudnnPoolingBackward", handle, x, xp, "x", dx, dxp, "dx");
}

cudnnStatus_t cudnnDropoutForward(cudnnHandle_t handle, const cudnnDropoutDescriptor_t drop,
                                  const cudnnTensorDescriptor_t x, const void *xp,
                                  const cudnnTensorDescriptor_t y, void *yp, void *rs_ptr, size_t rs_bytes)
{
    float p;
    if (cudnnGetDropoutDescriptor(drop, handle, &p, NULL, NULL))
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "not a dropout descriptor");
    cudnnStatus_t st = two_tensors("cudnnDropoutForward", handle, x, xp, "x", y, yp, "y");
    return st ? st : vgdnn_check_device_range(rs_ptr, rs_bytes, "the reserve space");
}

cudnnStatus_t cudnnDropoutBackward(cudnnHandle_t handle, const cudnnDropoutDescriptor_t drop,
                                   const cudnnTensorDescriptor_t dy, const void *dyp,
                                   const cudnnTensorDescriptor_t dx, void *dxp, void *rs_ptr, size_t rs_bytes)
{
    float p;
    if (cudnnGetDropoutDescriptor(drop, handle, &p, NULL, NULL))
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "not a dropout descriptor");
    cudnnStatus_t st = two_tensors("cudnnDropoutBackward", handle, dy, dyp, "dy", dx, dxp, "dx");
    return st ? st : vgdnn_check_device_range(rs_ptr, rs_bytes, "the reserve space");
}

/* The spatial transformer's grids and thetas have no descriptor of their
 * own here: their first byte must be device memory. */
static cudnnStatus_t st_pointers(const char *call, cudnnHandle_t handle,
                                 cudnnSpatialTransformerDescriptor_t st_desc, const void *a, const void *b)
{
    cudnnStatus_t st = check_handle(handle);
    if (st == CUDNN_STATUS_SUCCESS && !st_desc)
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "not a spatial transformer descriptor");
    if (st == CUDNN_STATUS_SUCCESS) {
        struct buffer buf[] = {{NULL, a, 1, "an input"}, {NULL, b, 1, "an output"}};
        st = check_buffers(call, buf, 2);
    }
    return st;
}

cudnnStatus_t cudnnSpatialTfGridGeneratorForward(cudnnHandle_t handle,
                                                 const cudnnSpatialTransformerDescriptor_t st_desc,
                                                 const void *theta, void *grid)
{
    return st_pointers("cudnnSpatialTfGridGeneratorForward", handle, st_desc, theta, grid);
}

cudnnStatus_t cudnnSpatialTfGridGeneratorBackward(cudnnHandle_t handle,
                                                  const cudnnSpatialTransformerDescriptor_t st_desc,
                                                  const void *dgrid, void *dtheta)
{
    return st_pointers("cudnnSpatialTfGridGeneratorBackward", handle, st_desc, dgrid, dtheta);
}

cudnnStatus_t cudnnSpatialTfSamplerForward(cudnnHandle_t handle, cudnnSpatialTransformerDescriptor_t st_desc,
                                           const void *alpha, const cudnnTensorDescriptor_t x, const void *xp,
                                           const void *grid, const void *beta, cudnnTensorDescriptor_t y,
                                           void *yp)
{
    if (!alpha || !beta)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t st = st_pointers("cudnnSpatialTfSamplerForward", handle, st_desc, grid, grid);
    return st ? st : two_tensors("cudnnSpatialTfSamplerForward", handle, x, xp, "x", y, yp, "y");
}

cudnnStatus_t cudnnSpatialTfSamplerBackward(cudnnHandle_t handle, cudnnSpatialTransformerDescriptor_t st_desc,
                                            const void *alpha, const cudnnTensorDescriptor_t x, const void *xp,
                                            const void *beta, const cudnnTensorDescriptor_t dx, void *dxp,
                                            const void *alpha_dgrid, const cudnnTensorDescriptor_t dy,
                                            const void *dyp, const void *grid, const void *beta_dgrid,
                                            void *dgrid)
{
    if (!alpha || !beta || !alpha_dgrid || !beta_dgrid)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t st = st_pointers("cudnnSpatialTfSamplerBackward", handle, st_desc, grid, dgrid);
    if (st == CUDNN_STATUS_SUCCESS)
        st = two_tensors("cudnnSpatialTfSamplerBackward", handle, x, xp, "x", dx, dxp, "dx");
    vgdnn_shape dys;
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_tensor_shape(dy, &dys);
    return st ? st : vgdnn_check_tensor(&dys, dyp, "dy");
}
