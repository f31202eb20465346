/* The legacy descriptors PyTorch still creates: tensor, filter,
 * convolution, activation, dropout, pooling, spatial transformer. Each is
 * a small heap object remembering what was set, so that gets round-trip and
 * the operations can check their pointers against the shapes.
 *
 * A descriptor starts with a magic word of its kind: a descriptor of the
 * wrong kind, a destroyed one or a NULL one is CUDNN_STATUS_BAD_PARAM, as
 * in cuDNN, instead of a crash.
 */
#include "cudnn_core.h"

#include <stdlib.h>
#include <string.h>

#define TENSOR_MAGIC 0x76677473u  /* "vgts" */
#define FILTER_MAGIC 0x76676674u  /* "vgft" */
#define CONV_MAGIC 0x76676376u    /* "vgcv" */
#define ACT_MAGIC 0x76676163u     /* "vgac" */
#define DROPOUT_MAGIC 0x7667646fu /* "vgdo" */
#define POOL_MAGIC 0x7667706cu    /* "vgpl" */
#define ST_MAGIC 0x76677374u      /* "vgst" */

struct cudnnTensorStruct {
    uint32_t magic;
    int set;
    vgdnn_shape shape;
};

struct cudnnFilterStruct {
    uint32_t magic;
    int set;
    cudnnTensorFormat_t format;
    vgdnn_shape shape; /* strides follow the format */
};

struct cudnnConvolutionStruct {
    uint32_t magic;
    int set;
    int array_length; /* spatial dimensions */
    int pad[CUDNN_DIM_MAX], stride[CUDNN_DIM_MAX], dilation[CUDNN_DIM_MAX];
    cudnnConvolutionMode_t mode;
    cudnnDataType_t compute_type;
    int groups;
    cudnnMathType_t math;
    cudnnReorderType_t reorder;
};

struct cudnnActivationStruct {
    uint32_t magic;
    cudnnActivationMode_t mode;
    cudnnNanPropagation_t nan_opt;
    double coef, swish_beta;
};

struct cudnnDropoutStruct {
    uint32_t magic;
    float dropout;
    void *states;
    size_t state_bytes;
    unsigned long long seed;
};

struct cudnnPoolingStruct {
    uint32_t magic;
    int set;
    cudnnPoolingMode_t mode;
    cudnnNanPropagation_t nan_opt;
    int nb_dims;
    int window[CUDNN_DIM_MAX], pad[CUDNN_DIM_MAX], stride[CUDNN_DIM_MAX];
};

struct cudnnSpatialTransformerStruct {
    uint32_t magic;
    cudnnSamplerType_t sampler;
    vgdnn_shape shape;
};

/* Create and destroy for each kind: calloc, the magic word, free. */
#define CREATE_DESTROY(Kind, type, kind_magic)                                  \
    cudnnStatus_t cudnnCreate##Kind##Descriptor(type *desc)               \
    {                                                                      \
        if (!desc)                                                         \
            return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;                    \
        *desc = calloc(1, sizeof **desc);                                  \
        if (!*desc)                                                        \
            return CUDNN_STATUS_ALLOC_FAILED;                              \
        (*desc)->magic = kind_magic;                                        \
        return CUDNN_STATUS_SUCCESS;                                       \
    }                                                                      \
    cudnnStatus_t cudnnDestroy##Kind##Descriptor(type desc)               \
    {                                                                      \
        if (!desc) /* cuDNN accepts NULL here */                           \
            return CUDNN_STATUS_SUCCESS;                                   \
        if (desc->magic != kind_magic)                                       \
            return CUDNN_STATUS_BAD_PARAM;                                 \
        desc->magic = 0;                                                   \
        free(desc);                                                        \
        return CUDNN_STATUS_SUCCESS;                                       \
    }

CREATE_DESTROY(Tensor, cudnnTensorDescriptor_t, TENSOR_MAGIC)
CREATE_DESTROY(Filter, cudnnFilterDescriptor_t, FILTER_MAGIC)
CREATE_DESTROY(Convolution, cudnnConvolutionDescriptor_t, CONV_MAGIC)
CREATE_DESTROY(Activation, cudnnActivationDescriptor_t, ACT_MAGIC)
CREATE_DESTROY(Dropout, cudnnDropoutDescriptor_t, DROPOUT_MAGIC)
CREATE_DESTROY(Pooling, cudnnPoolingDescriptor_t, POOL_MAGIC)
CREATE_DESTROY(SpatialTransformer, cudnnSpatialTransformerDescriptor_t, ST_MAGIC)

/* ---- sizes and shapes -------------------------------------------------- */

/* By number, so that headers older than the newest types still build. */
size_t vgdnn_dtype_size(cudnnDataType_t dtype)
{
    switch ((int)dtype) {
    case 0: return 4;  /* FLOAT */
    case 1: return 8;  /* DOUBLE */
    case 2: return 2;  /* HALF */
    case 3: return 1;  /* INT8 */
    case 4: return 4;  /* INT32 */
    case 5: return 4;  /* INT8x4: one element is the vector */
    case 6: return 1;  /* UINT8 */
    case 7: return 4;  /* UINT8x4 */
    case 8: return 32; /* INT8x32 */
    case 9: return 2;  /* BFLOAT16 */
    case 10: return 8; /* INT64 */
    case 11: return 1; /* BOOLEAN */
    case 12: case 13: case 15: case 23: return 1; /* FP8 kinds */
    case 14: return 4; /* FAST_FLOAT_FOR_FP8 */
    case 19: return 4; /* UINT32 */
    case 20: return 8; /* COMPLEX_FP32 */
    case 21: return 16; /* COMPLEX_FP64 */
    case 22: return 1; /* BYTE_BOOLEAN */
    default: return 0; /* 4-bit types and unknown ones: no extent check */
    }
}

size_t vgdnn_extent(int nb_dims, const int64_t *dims, const int64_t *strides, size_t elem)
{
    size_t last = 0;
    for (int i = 0; i < nb_dims; i++) {
        if (dims[i] <= 0)
            return 0;
        last += (size_t)(dims[i] - 1) * (size_t)(strides[i] < 0 ? -strides[i] : strides[i]);
    }
    return (last + 1) * elem;
}

static size_t shape_extent(const vgdnn_shape *s)
{
    int64_t dims[CUDNN_DIM_MAX], strides[CUDNN_DIM_MAX];
    for (int i = 0; i < s->nb_dims; i++) {
        dims[i] = s->dims[i];
        strides[i] = s->strides[i];
    }
    return vgdnn_extent(s->nb_dims, dims, strides, vgdnn_dtype_size(s->dtype));
}

cudnnStatus_t vgdnn_check_device_range(const void *ptr, size_t bytes, const char *what)
{
    if (!ptr) {
        if (bytes == 0)
            return CUDNN_STATUS_SUCCESS;
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s is NULL", what);
    }
    if (vgfc_mem_check_device(ptr, bytes ? bytes : 1, -1) != 0)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM,
                          "%s (%p, %zu bytes) is not within live device memory", what, ptr, bytes);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t vgdnn_check_tensor(const vgdnn_shape *shape, const void *ptr, const char *what)
{
    return vgdnn_check_device_range(ptr, shape_extent(shape), what);
}

/* Packed strides for a layout: NCHW (row major) or NHWC (channels last);
 * NCHW_VECT_C is packed like NCHW, its vector being the element. */
static void packed_strides(cudnnTensorFormat_t format, int nb, const int *dims, int *strides)
{
    if (format == CUDNN_TENSOR_NHWC && nb >= 3) {
        int s = 1;
        strides[1] = s;
        s *= dims[1];
        for (int i = nb - 1; i >= 2; i--) {
            strides[i] = s;
            s *= dims[i];
        }
        strides[0] = s;
    } else {
        int s = 1;
        for (int i = nb - 1; i >= 0; i--) {
            strides[i] = s;
            s *= dims[i];
        }
    }
}

static cudnnStatus_t set_shape(vgdnn_shape *s, cudnnDataType_t dtype, int nb, const int *dims,
                               const int *strides)
{
    if (nb < 1 || nb > CUDNN_DIM_MAX || !dims || !strides)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "tensor of %d dimensions", nb);
    for (int i = 0; i < nb; i++)
        if (dims[i] <= 0 || strides[i] < 0)
            return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "dimension %d is %d, stride %d", i, dims[i],
                              strides[i]);
    s->dtype = dtype;
    s->nb_dims = nb;
    memcpy(s->dims, dims, (size_t)nb * sizeof *dims);
    memcpy(s->strides, strides, (size_t)nb * sizeof *strides);
    return CUDNN_STATUS_SUCCESS;
}

/* ---- tensors ------------------------------------------------------------ */

static int tensor_ok(cudnnTensorDescriptor_t d)
{
    return d && d->magic == TENSOR_MAGIC;
}

cudnnStatus_t vgdnn_tensor_shape(cudnnTensorDescriptor_t desc, vgdnn_shape *out)
{
    if (!tensor_ok(desc) || !desc->set)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "not a set tensor descriptor");
    *out = desc->shape;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t desc, cudnnDataType_t dtype,
                                         int nb, const int dims[], const int strides[])
{
    if (!tensor_ok(desc))
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = set_shape(&desc->shape, dtype, nb, dims, strides);
    desc->set = desc->set || st == CUDNN_STATUS_SUCCESS;
    return st;
}

cudnnStatus_t cudnnSetTensorNdDescriptorEx(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
                                           cudnnDataType_t dtype, int nb, const int dims[])
{
    if (!tensor_ok(desc) || !dims || nb < 1 || nb > CUDNN_DIM_MAX)
        return CUDNN_STATUS_BAD_PARAM;
    int strides[CUDNN_DIM_MAX];
    packed_strides(format, nb, dims, strides);
    return cudnnSetTensorNdDescriptor(desc, dtype, nb, dims, strides);
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
                                         cudnnDataType_t dtype, int n, int c, int h, int w)
{
    int dims[4] = {n, c, h, w};
    return cudnnSetTensorNdDescriptorEx(desc, format, dtype, 4, dims);
}

cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t desc, cudnnDataType_t dtype,
                                           int n, int c, int h, int w, int ns, int cs, int hs, int ws)
{
    int dims[4] = {n, c, h, w}, strides[4] = {ns, cs, hs, ws};
    return cudnnSetTensorNdDescriptor(desc, dtype, 4, dims, strides);
}

cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t desc, int requested,
                                         cudnnDataType_t *dtype, int *nb, int dims[], int strides[])
{
    if (!tensor_ok(desc) || !desc->set || requested < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (dtype)
        *dtype = desc->shape.dtype;
    if (nb)
        *nb = desc->shape.nb_dims;
    for (int i = 0; i < requested && i < desc->shape.nb_dims; i++) {
        if (dims)
            dims[i] = desc->shape.dims[i];
        if (strides)
            strides[i] = desc->shape.strides[i];
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t desc, cudnnDataType_t *dtype,
                                         int *n, int *c, int *h, int *w, int *ns, int *cs, int *hs,
                                         int *ws)
{
    if (!tensor_ok(desc) || !desc->set || desc->shape.nb_dims != 4)
        return CUDNN_STATUS_BAD_PARAM;
    const vgdnn_shape *s = &desc->shape;
    int *out[8] = {n, c, h, w, ns, cs, hs, ws};
    for (int i = 0; i < 8; i++)
        if (out[i])
            *out[i] = i < 4 ? s->dims[i] : s->strides[i - 4];
    if (dtype)
        *dtype = s->dtype;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetTensorSizeInBytes(const cudnnTensorDescriptor_t desc, size_t *size)
{
    if (!tensor_ok(desc) || !desc->set || !size)
        return CUDNN_STATUS_BAD_PARAM;
    *size = shape_extent(&desc->shape);
    return CUDNN_STATUS_SUCCESS;
}

/* ---- filters ------------------------------------------------------------ */

static int filter_ok(cudnnFilterDescriptor_t d)
{
    return d && d->magic == FILTER_MAGIC;
}

cudnnStatus_t vgdnn_filter_shape(cudnnFilterDescriptor_t desc, vgdnn_shape *out)
{
    if (!filter_ok(desc) || !desc->set)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "not a set filter descriptor");
    *out = desc->shape;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t dtype,
                                         cudnnTensorFormat_t format, int nb, const int dims[])
{
    if (!filter_ok(desc) || !dims || nb < 1 || nb > CUDNN_DIM_MAX)
        return CUDNN_STATUS_BAD_PARAM;
    int strides[CUDNN_DIM_MAX];
    packed_strides(format, nb, dims, strides);
    cudnnStatus_t st = set_shape(&desc->shape, dtype, nb, dims, strides);
    if (st == CUDNN_STATUS_SUCCESS) {
        desc->format = format;
        desc->set = 1;
    }
    return st;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t dtype,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w)
{
    int dims[4] = {k, c, h, w};
    return cudnnSetFilterNdDescriptor(desc, dtype, format, 4, dims);
}

cudnnStatus_t cudnnGetFilterNdDescriptor(const cudnnFilterDescriptor_t desc, int requested,
                                         cudnnDataType_t *dtype, cudnnTensorFormat_t *format,
                                         int *nb, int dims[])
{
    if (!filter_ok(desc) || !desc->set || requested < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (dtype)
        *dtype = desc->shape.dtype;
    if (format)
        *format = desc->format;
    if (nb)
        *nb = desc->shape.nb_dims;
    for (int i = 0; dims && i < requested && i < desc->shape.nb_dims; i++)
        dims[i] = desc->shape.dims[i];
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetFilter4dDescriptor(const cudnnFilterDescriptor_t desc, cudnnDataType_t *dtype,
                                         cudnnTensorFormat_t *format, int *k, int *c, int *h, int *w)
{
    if (!filter_ok(desc) || !desc->set || desc->shape.nb_dims != 4)
        return CUDNN_STATUS_BAD_PARAM;
    int *out[4] = {k, c, h, w};
    for (int i = 0; i < 4; i++)
        if (out[i])
            *out[i] = desc->shape.dims[i];
    if (dtype)
        *dtype = desc->shape.dtype;
    if (format)
        *format = desc->format;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetFilterSizeInBytes(const cudnnFilterDescriptor_t desc, size_t *size)
{
    if (!filter_ok(desc) || !desc->set || !size)
        return CUDNN_STATUS_BAD_PARAM;
    *size = shape_extent(&desc->shape);
    return CUDNN_STATUS_SUCCESS;
}

/* ---- convolutions ------------------------------------------------------- */

static int conv_ok(cudnnConvolutionDescriptor_t d)
{
    return d && d->magic == CONV_MAGIC;
}

int vgdnn_conv_valid(cudnnConvolutionDescriptor_t desc)
{
    return conv_ok(desc) && desc->set;
}

cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t desc, int len,
                                              const int pad[], const int stride[],
                                              const int dilation[], cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute_type)
{
    if (!conv_ok(desc) || len < 1 || len > CUDNN_DIM_MAX - 2 || !pad || !stride || !dilation)
        return CUDNN_STATUS_BAD_PARAM;
    for (int i = 0; i < len; i++)
        if (pad[i] < 0 || stride[i] <= 0 || dilation[i] <= 0)
            return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "convolution pad %d, stride %d, dilation %d",
                              pad[i], stride[i], dilation[i]);
    desc->array_length = len;
    memcpy(desc->pad, pad, (size_t)len * sizeof *pad);
    memcpy(desc->stride, stride, (size_t)len * sizeof *stride);
    memcpy(desc->dilation, dilation, (size_t)len * sizeof *dilation);
    desc->mode = mode;
    desc->compute_type = compute_type;
    if (!desc->set)
        desc->groups = 1;
    desc->set = 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h,
                                              int pad_w, int u, int v, int dil_h, int dil_w,
                                              cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute_type)
{
    int pad[2] = {pad_h, pad_w}, stride[2] = {u, v}, dil[2] = {dil_h, dil_w};
    return cudnnSetConvolutionNdDescriptor(desc, 2, pad, stride, dil, mode, compute_type);
}

cudnnStatus_t cudnnGetConvolutionNdDescriptor(const cudnnConvolutionDescriptor_t desc,
                                              int requested, int *len, int pad[], int stride[],
                                              int dilation[], cudnnConvolutionMode_t *mode,
                                              cudnnDataType_t *compute_type)
{
    if (!vgdnn_conv_valid(desc) || requested < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (len)
        *len = desc->array_length;
    for (int i = 0; i < requested && i < desc->array_length; i++) {
        if (pad)
            pad[i] = desc->pad[i];
        if (stride)
            stride[i] = desc->stride[i];
        if (dilation)
            dilation[i] = desc->dilation[i];
    }
    if (mode)
        *mode = desc->mode;
    if (compute_type)
        *compute_type = desc->compute_type;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dDescriptor(const cudnnConvolutionDescriptor_t desc, int *pad_h,
                                              int *pad_w, int *u, int *v, int *dil_h, int *dil_w,
                                              cudnnConvolutionMode_t *mode,
                                              cudnnDataType_t *compute_type)
{
    if (!vgdnn_conv_valid(desc) || desc->array_length != 2)
        return CUDNN_STATUS_BAD_PARAM;
    int *out[6] = {pad_h, pad_w, u, v, dil_h, dil_w};
    const int *from[6] = {&desc->pad[0], &desc->pad[1], &desc->stride[0], &desc->stride[1],
                          &desc->dilation[0], &desc->dilation[1]};
    for (int i = 0; i < 6; i++)
        if (out[i])
            *out[i] = *from[i];
    if (mode)
        *mode = desc->mode;
    if (compute_type)
        *compute_type = desc->compute_type;
    return CUDNN_STATUS_SUCCESS;
}

/* The output of a forward convolution: batch, the filter's output
 * channels, and per spatial dimension 1 + (in + 2 pad - dilated filter) / stride. */
cudnnStatus_t cudnnGetConvolutionNdForwardOutputDim(const cudnnConvolutionDescriptor_t desc,
                                                    const cudnnTensorDescriptor_t x,
                                                    const cudnnFilterDescriptor_t w, int nb,
                                                    int out[])
{
    vgdnn_shape xs, ws;
    if (!vgdnn_conv_valid(desc) || !out || vgdnn_tensor_shape(x, &xs) || vgdnn_filter_shape(w, &ws))
        return CUDNN_STATUS_BAD_PARAM;
    if (nb != xs.nb_dims || nb != ws.nb_dims || nb != desc->array_length + 2)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "%d dimensions for a %d-d convolution", nb,
                          desc->array_length);
    out[0] = xs.dims[0];
    out[1] = ws.dims[0];
    for (int i = 2; i < nb; i++) {
        int k = i - 2;
        int span = (ws.dims[i] - 1) * desc->dilation[k] + 1;
        int room = xs.dims[i] + 2 * desc->pad[k] - span;
        if (room < 0)
            return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "the filter is larger than the padded input");
        out[i] = 1 + room / desc->stride[k];
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t desc,
                                                    const cudnnTensorDescriptor_t x,
                                                    const cudnnFilterDescriptor_t w, int *n, int *c,
                                                    int *h, int *wd)
{
    int out[4];
    cudnnStatus_t st = cudnnGetConvolutionNdForwardOutputDim(desc, x, w, 4, out);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    int *to[4] = {n, c, h, wd};
    for (int i = 0; i < 4; i++)
        if (to[i])
            *to[i] = out[i];
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t math)
{
    if (!conv_ok(desc))
        return CUDNN_STATUS_BAD_PARAM;
    desc->math = math;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t *math)
{
    if (!conv_ok(desc) || !math)
        return CUDNN_STATUS_BAD_PARAM;
    *math = desc->math;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t desc, int groups)
{
    if (!conv_ok(desc) || groups < 1)
        return CUDNN_STATUS_BAD_PARAM;
    desc->groups = groups;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionGroupCount(cudnnConvolutionDescriptor_t desc, int *groups)
{
    if (!conv_ok(desc) || !groups)
        return CUDNN_STATUS_BAD_PARAM;
    *groups = desc->groups ? desc->groups : 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionReorderType(cudnnConvolutionDescriptor_t desc,
                                             cudnnReorderType_t reorder)
{
    if (!conv_ok(desc))
        return CUDNN_STATUS_BAD_PARAM;
    desc->reorder = reorder;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionReorderType(cudnnConvolutionDescriptor_t desc,
                                             cudnnReorderType_t *reorder)
{
    if (!conv_ok(desc) || !reorder)
        return CUDNN_STATUS_BAD_PARAM;
    *reorder = desc->reorder;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- activations -------------------------------------------------------- */

int vgdnn_activation_valid(cudnnActivationDescriptor_t desc)
{
    return desc && desc->magic == ACT_MAGIC;
}

cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t desc,
                                           cudnnActivationMode_t mode,
                                           cudnnNanPropagation_t nan_opt, double coef)
{
    if (!vgdnn_activation_valid(desc))
        return CUDNN_STATUS_BAD_PARAM;
    desc->mode = mode;
    desc->nan_opt = nan_opt;
    desc->coef = coef;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetActivationDescriptor(const cudnnActivationDescriptor_t desc,
                                           cudnnActivationMode_t *mode,
                                           cudnnNanPropagation_t *nan_opt, double *coef)
{
    if (!vgdnn_activation_valid(desc))
        return CUDNN_STATUS_BAD_PARAM;
    if (mode)
        *mode = desc->mode;
    if (nan_opt)
        *nan_opt = desc->nan_opt;
    if (coef)
        *coef = desc->coef;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetActivationDescriptorSwishBeta(cudnnActivationDescriptor_t desc, double beta)
{
    if (!vgdnn_activation_valid(desc))
        return CUDNN_STATUS_BAD_PARAM;
    desc->swish_beta = beta;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetActivationDescriptorSwishBeta(cudnnActivationDescriptor_t desc, double *beta)
{
    if (!vgdnn_activation_valid(desc) || !beta)
        return CUDNN_STATUS_BAD_PARAM;
    *beta = desc->swish_beta;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- dropout ------------------------------------------------------------ */

/* The random generator's states: an estimate, one 64-byte Philox state per
 * thread of 256 per multiprocessor. PyTorch allocates exactly this on the
 * device for each dropout descriptor it initialises (RNNs with dropout). */
cudnnStatus_t cudnnDropoutGetStatesSize(cudnnHandle_t handle, size_t *size)
{
    if (!vgdnn_valid_handle(handle) || !size)
        return CUDNN_STATUS_BAD_PARAM;
    *size = (size_t)64 * 256 * (size_t)vgfc_sm_count();
    return CUDNN_STATUS_SUCCESS;
}

/* The mask dropout keeps for its backward pass: one bit per element,
 * rounded up to 128 bytes (an estimate). */
cudnnStatus_t cudnnDropoutGetReserveSpaceSize(cudnnTensorDescriptor_t x, size_t *size)
{
    vgdnn_shape s;
    if (!size || vgdnn_tensor_shape(x, &s))
        return CUDNN_STATUS_BAD_PARAM;
    size_t n = 1;
    for (int i = 0; i < s.nb_dims; i++)
        n *= (size_t)s.dims[i];
    *size = ((n + 7) / 8 + 127) / 128 * 128;
    return CUDNN_STATUS_SUCCESS;
}

/* Setting initialises the states with a kernel on the device: the states
 * must be device memory of the size given. Restoring does not touch them. */
static cudnnStatus_t set_dropout(cudnnDropoutDescriptor_t desc, cudnnHandle_t handle, float dropout,
                                 void *states, size_t bytes, unsigned long long seed, int init)
{
    if (!desc || desc->magic != DROPOUT_MAGIC || !vgdnn_valid_handle(handle))
        return CUDNN_STATUS_BAD_PARAM;
    if (dropout < 0.0f || dropout > 1.0f)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "dropout probability %g", (double)dropout);
    if (init && states) {
        cudnnStatus_t st = vgdnn_device_usable("cudnnSetDropoutDescriptor");
        if (st == CUDNN_STATUS_SUCCESS)
            st = vgdnn_check_device_range(states, bytes, "the dropout states");
        if (st != CUDNN_STATUS_SUCCESS)
            return st;
    }
    desc->dropout = dropout;
    desc->states = states;
    desc->state_bytes = bytes;
    desc->seed = seed;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetDropoutDescriptor(cudnnDropoutDescriptor_t desc, cudnnHandle_t handle,
                                        float dropout, void *states, size_t bytes,
                                        unsigned long long seed)
{
    return set_dropout(desc, handle, dropout, states, bytes, seed, 1);
}

cudnnStatus_t cudnnRestoreDropoutDescriptor(cudnnDropoutDescriptor_t desc, cudnnHandle_t handle,
                                            float dropout, void *states, size_t bytes,
                                            unsigned long long seed)
{
    return set_dropout(desc, handle, dropout, states, bytes, seed, 0);
}

cudnnStatus_t cudnnGetDropoutDescriptor(cudnnDropoutDescriptor_t desc, cudnnHandle_t handle,
                                        float *dropout, void **states, unsigned long long *seed)
{
    if (!desc || desc->magic != DROPOUT_MAGIC || !vgdnn_valid_handle(handle))
        return CUDNN_STATUS_BAD_PARAM;
    if (dropout)
        *dropout = desc->dropout;
    if (states)
        *states = desc->states;
    if (seed)
        *seed = desc->seed;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- pooling ------------------------------------------------------------ */

cudnnStatus_t cudnnSetPoolingNdDescriptor(cudnnPoolingDescriptor_t desc, const cudnnPoolingMode_t mode,
                                          const cudnnNanPropagation_t nan_opt, int nb,
                                          const int window[], const int pad[], const int stride[])
{
    if (!desc || desc->magic != POOL_MAGIC || nb < 1 || nb > CUDNN_DIM_MAX - 2 || !window ||
        !pad || !stride)
        return CUDNN_STATUS_BAD_PARAM;
    for (int i = 0; i < nb; i++)
        if (window[i] <= 0 || pad[i] < 0 || stride[i] <= 0)
            return CUDNN_STATUS_BAD_PARAM;
    desc->mode = mode;
    desc->nan_opt = nan_opt;
    desc->nb_dims = nb;
    memcpy(desc->window, window, (size_t)nb * sizeof *window);
    memcpy(desc->pad, pad, (size_t)nb * sizeof *pad);
    memcpy(desc->stride, stride, (size_t)nb * sizeof *stride);
    desc->set = 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t desc, cudnnPoolingMode_t mode,
                                          cudnnNanPropagation_t nan_opt, int wh, int ww, int ph,
                                          int pw, int sh, int sw)
{
    int window[2] = {wh, ww}, pad[2] = {ph, pw}, stride[2] = {sh, sw};
    return cudnnSetPoolingNdDescriptor(desc, mode, nan_opt, 2, window, pad, stride);
}

cudnnStatus_t cudnnGetPoolingNdDescriptor(const cudnnPoolingDescriptor_t desc, int requested,
                                          cudnnPoolingMode_t *mode, cudnnNanPropagation_t *nan_opt,
                                          int *nb, int window[], int pad[], int stride[])
{
    if (!desc || desc->magic != POOL_MAGIC || !desc->set || requested < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (mode)
        *mode = desc->mode;
    if (nan_opt)
        *nan_opt = desc->nan_opt;
    if (nb)
        *nb = desc->nb_dims;
    for (int i = 0; i < requested && i < desc->nb_dims; i++) {
        if (window)
            window[i] = desc->window[i];
        if (pad)
            pad[i] = desc->pad[i];
        if (stride)
            stride[i] = desc->stride[i];
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetPooling2dDescriptor(const cudnnPoolingDescriptor_t desc,
                                          cudnnPoolingMode_t *mode, cudnnNanPropagation_t *nan_opt,
                                          int *wh, int *ww, int *ph, int *pw, int *sh, int *sw)
{
    int nb, window[CUDNN_DIM_MAX], pad[CUDNN_DIM_MAX], stride[CUDNN_DIM_MAX];
    cudnnStatus_t st =
        cudnnGetPoolingNdDescriptor(desc, CUDNN_DIM_MAX, mode, nan_opt, &nb, window, pad, stride);
    if (st != CUDNN_STATUS_SUCCESS || nb != 2)
        return st ? st : CUDNN_STATUS_BAD_PARAM;
    int *out[6] = {wh, ww, ph, pw, sh, sw};
    int from[6] = {window[0], window[1], pad[0], pad[1], stride[0], stride[1]};
    for (int i = 0; i < 6; i++)
        if (out[i])
            *out[i] = from[i];
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetPoolingNdForwardOutputDim(const cudnnPoolingDescriptor_t desc,
                                                const cudnnTensorDescriptor_t x, int nb, int out[])
{
    vgdnn_shape s;
    if (!desc || desc->magic != POOL_MAGIC || !desc->set || !out || vgdnn_tensor_shape(x, &s) ||
        nb != s.nb_dims || nb != desc->nb_dims + 2)
        return CUDNN_STATUS_BAD_PARAM;
    out[0] = s.dims[0];
    out[1] = s.dims[1];
    for (int i = 2; i < nb; i++) {
        int k = i - 2;
        out[i] = 1 + (s.dims[i] + 2 * desc->pad[k] - desc->window[k]) / desc->stride[k];
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetPooling2dForwardOutputDim(const cudnnPoolingDescriptor_t desc,
                                                const cudnnTensorDescriptor_t x, int *n, int *c,
                                                int *h, int *w)
{
    int out[4];
    cudnnStatus_t st = cudnnGetPoolingNdForwardOutputDim(desc, x, 4, out);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    int *to[4] = {n, c, h, w};
    for (int i = 0; i < 4; i++)
        if (to[i])
            *to[i] = out[i];
    return CUDNN_STATUS_SUCCESS;
}

/* ---- spatial transformers ----------------------------------------------- */

cudnnStatus_t cudnnSetSpatialTransformerNdDescriptor(cudnnSpatialTransformerDescriptor_t desc,
                                                     cudnnSamplerType_t sampler,
                                                     cudnnDataType_t dtype, const int nb,
                                                     const int dims[])
{
    if (!desc || desc->magic != ST_MAGIC || !dims || nb < 1 || nb > CUDNN_DIM_MAX)
        return CUDNN_STATUS_BAD_PARAM;
    int strides[CUDNN_DIM_MAX];
    packed_strides(CUDNN_TENSOR_NCHW, nb, dims, strides);
    desc->sampler = sampler;
    return set_shape(&desc->shape, dtype, nb, dims, strides);
}
