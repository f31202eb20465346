/* The RNN API PyTorch's RNN.cpp uses (nn.LSTM, nn.GRU, nn.RNN on cuDNN):
 * the RNN and RNN data descriptors, the weight space and where each
 * matrix and bias lies in it, the temporary spaces, and forward and
 * backward passes that check their buffers and compute nothing.
 *
 * The weight space layout is cuDNN's, which PyTorch asserts while it makes
 * its parameters views into one flat buffer (get_parameters): per pseudo-
 * layer (layer x direction), the matrices in linear-layer order (the input
 * ones, then the recurrent ones), then the biases in the same order, then
 * an LSTM's projection matrix. A matrix is hidden x (input or recurrent
 * size), a bias hidden long, a projection proj x hidden.
 *
 * Temporary spaces, a model: the workspace is VG_PHANTOM_CUDNN_WORKSPACE,
 * as for every cuDNN plan; the reserve space a training forward keeps for
 * the backward holds, per step, layer and direction, each gate's
 * activation and the cell's outputs: (gates + 2) x hidden elements per
 * sequence element.
 */
#include "cudnn_core.h"

#include <stdlib.h>
#include <string.h>

#define RNN_MAGIC 0x76677272u  /* "vgrr" */
#define DATA_MAGIC 0x76677264u /* "vgrd" */

struct cudnnRNNStruct {
    uint32_t magic;
    int set;
    cudnnRNNAlgo_t algo;
    cudnnRNNMode_t cell;
    cudnnRNNBiasMode_t bias;
    cudnnDirectionMode_t dir;
    cudnnRNNInputMode_t input_mode;
    cudnnDataType_t dtype, math_prec;
    cudnnMathType_t math;
    int32_t input, hidden, proj, layers;
    cudnnDropoutDescriptor_t dropout;
    uint32_t aux;
};

struct cudnnRNNDataStruct {
    uint32_t magic;
    int set;
    cudnnDataType_t dtype;
    cudnnRNNDataLayout_t layout;
    int max_seq, batch, vector;
    int *seq_lengths; /* batch of them */
};

cudnnStatus_t cudnnCreateRNNDescriptor(cudnnRNNDescriptor_t *desc)
{
    if (!desc)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *desc = calloc(1, sizeof **desc);
    if (!*desc)
        return CUDNN_STATUS_ALLOC_FAILED;
    (*desc)->magic = RNN_MAGIC;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyRNNDescriptor(cudnnRNNDescriptor_t desc)
{
    if (!desc)
        return CUDNN_STATUS_SUCCESS;
    if (desc->magic != RNN_MAGIC)
        return CUDNN_STATUS_BAD_PARAM;
    desc->magic = 0;
    free(desc);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateRNNDataDescriptor(cudnnRNNDataDescriptor_t *desc)
{
    if (!desc)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *desc = calloc(1, sizeof **desc);
    if (!*desc)
        return CUDNN_STATUS_ALLOC_FAILED;
    (*desc)->magic = DATA_MAGIC;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyRNNDataDescriptor(cudnnRNNDataDescriptor_t desc)
{
    if (!desc)
        return CUDNN_STATUS_SUCCESS;
    if (desc->magic != DATA_MAGIC)
        return CUDNN_STATUS_BAD_PARAM;
    desc->magic = 0;
    free(desc->seq_lengths);
    free(desc);
    return CUDNN_STATUS_SUCCESS;
}

static int rnn_ok(cudnnRNNDescriptor_t d)
{
    return d && d->magic == RNN_MAGIC && d->set;
}

static int data_ok(cudnnRNNDataDescriptor_t d)
{
    return d && d->magic == DATA_MAGIC && d->set;
}

cudnnStatus_t cudnnSetRNNDescriptor_v8(cudnnRNNDescriptor_t desc, cudnnRNNAlgo_t algo, cudnnRNNMode_t cell,
                                       cudnnRNNBiasMode_t bias, cudnnDirectionMode_t dir,
                                       cudnnRNNInputMode_t input_mode, cudnnDataType_t dtype,
                                       cudnnDataType_t math_prec, cudnnMathType_t math, int32_t input,
                                       int32_t hidden, int32_t proj, int32_t layers,
                                       cudnnDropoutDescriptor_t dropout, uint32_t aux)
{
    if (!desc || desc->magic != RNN_MAGIC)
        return CUDNN_STATUS_BAD_PARAM;
    if ((int)cell < CUDNN_RNN_RELU || (int)cell > CUDNN_GRU || (int)bias < 0 || (int)bias > 3 ||
        input < 1 || hidden < 1 || layers < 1 || proj < 0 || proj > hidden ||
        (proj && proj < hidden && cell != CUDNN_LSTM) ||
        !vgdnn_dtype_size(dtype))
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "RNN: cell %d, bias %d, sizes %d/%d/%d, %d layers", (int)cell,
                          (int)bias, input, hidden, proj, layers);
    *desc = (struct cudnnRNNStruct){RNN_MAGIC, 1, algo, cell, bias, dir, input_mode, dtype, math_prec, math,
                                    input, hidden, proj, layers, dropout, aux};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetRNNDescriptor_v8(cudnnRNNDescriptor_t desc, cudnnRNNAlgo_t *algo, cudnnRNNMode_t *cell,
                                       cudnnRNNBiasMode_t *bias, cudnnDirectionMode_t *dir,
                                       cudnnRNNInputMode_t *input_mode, cudnnDataType_t *dtype,
                                       cudnnDataType_t *math_prec, cudnnMathType_t *math, int32_t *input,
                                       int32_t *hidden, int32_t *proj, int32_t *layers,
                                       cudnnDropoutDescriptor_t *dropout, uint32_t *aux)
{
    if (!rnn_ok(desc))
        return CUDNN_STATUS_BAD_PARAM;
#define OUT(p, v) if (p) *(p) = (v)
    OUT(algo, desc->algo);
    OUT(cell, desc->cell);
    OUT(bias, desc->bias);
    OUT(dir, desc->dir);
    OUT(input_mode, desc->input_mode);
    OUT(dtype, desc->dtype);
    OUT(math_prec, desc->math_prec);
    OUT(math, desc->math);
    OUT(input, desc->input);
    OUT(hidden, desc->hidden);
    OUT(proj, desc->proj);
    OUT(layers, desc->layers);
    OUT(dropout, desc->dropout);
    OUT(aux, desc->aux);
#undef OUT
    return CUDNN_STATUS_SUCCESS;
}

/* PyTorch builds the plan for its batch size when the algorithm is dynamic
 * persistent; nothing to build here. */
cudnnStatus_t cudnnBuildRNNDynamic(cudnnHandle_t handle, cudnnRNNDescriptor_t desc, int batch)
{
    if (!vgdnn_valid_handle(handle) || !rnn_ok(desc) || batch < 1)
        return CUDNN_STATUS_BAD_PARAM;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetRNNDataDescriptor(cudnnRNNDataDescriptor_t desc, cudnnDataType_t dtype,
                                        cudnnRNNDataLayout_t layout, int max_seq, int batch, int vector,
                                        const int seq_lengths[], void *padding_fill)
{
    (void)padding_fill;
    if (!desc || desc->magic != DATA_MAGIC || max_seq < 1 || batch < 1 || vector < 1 || !seq_lengths)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "RNN data: %d steps, batch %d, vector %d", max_seq, batch,
                          vector);
    for (int i = 0; i < batch; i++)
        if (seq_lengths[i] < 0 || seq_lengths[i] > max_seq)
            return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "RNN data: sequence %d of length %d, at most %d", i,
                              seq_lengths[i], max_seq);
    int *lengths = malloc((size_t)batch * sizeof *lengths);
    if (!lengths)
        return CUDNN_STATUS_ALLOC_FAILED;
    memcpy(lengths, seq_lengths, (size_t)batch * sizeof *lengths);
    free(desc->seq_lengths);
    *desc = (struct cudnnRNNDataStruct){DATA_MAGIC, 1, dtype, layout, max_seq, batch, vector, lengths};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetRNNDataDescriptor(cudnnRNNDataDescriptor_t desc, cudnnDataType_t *dtype,
                                        cudnnRNNDataLayout_t *layout, int *max_seq, int *batch, int *vector,
                                        int requested, int seq_lengths[], void *padding_fill)
{
    (void)padding_fill;
    if (!data_ok(desc) || requested < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (dtype)
        *dtype = desc->dtype;
    if (layout)
        *layout = desc->layout;
    if (max_seq)
        *max_seq = desc->max_seq;
    if (batch)
        *batch = desc->batch;
    if (vector)
        *vector = desc->vector;
    for (int i = 0; seq_lengths && i < requested && i < desc->batch; i++)
        seq_lengths[i] = desc->seq_lengths[i];
    return CUDNN_STATUS_SUCCESS;
}

/* ---- the weight space ---------------------------------------------------- */

static int gates(const struct cudnnRNNStruct *r)
{
    return r->cell == CUDNN_LSTM ? 4 : r->cell == CUDNN_GRU ? 3 : 1;
}

static int directions(const struct cudnnRNNStruct *r)
{
    return r->dir == CUDNN_BIDIRECTIONAL ? 2 : 1;
}

/* A projection: an LSTM's projSize below its hidden size (PyTorch passes
 * the hidden size, or cuDNN 8's callers 0, for none). */
static int projected(const struct cudnnRNNStruct *r)
{
    return r->proj > 0 && r->proj < r->hidden;
}

static int out_size(const struct cudnnRNNStruct *r)
{
    return projected(r) ? r->proj : r->hidden;
}

static int has_bias(const struct cudnnRNNStruct *r, int id)
{
    int g = gates(r);
    switch (r->bias) {
    case CUDNN_RNN_DOUBLE_BIAS: return id < 2 * g;
    case CUDNN_RNN_SINGLE_INP_BIAS: return id < g;
    case CUDNN_RNN_SINGLE_REC_BIAS: return id >= g && id < 2 * g;
    default: return 0;
    }
}

/* Rows and columns of linear layer `id`'s matrix in pseudo-layer `p`;
 * 0 columns when it has none (the first layer's input with SKIP_INPUT). */
static void matrix_shape(const struct cudnnRNNStruct *r, int p, int id, int *rows, int *cols)
{
    int g = gates(r), layer = p / directions(r);
    if (id == 2 * g) { /* the projection */
        *rows = r->proj;
        *cols = r->hidden;
    } else if (id < g) {
        *rows = r->hidden;
        *cols = layer == 0 ? (r->input_mode == CUDNN_SKIP_INPUT ? 0 : r->input) : out_size(r) * directions(r);
    } else {
        *rows = r->hidden;
        *cols = out_size(r);
    }
}

static int linear_layers(const struct cudnnRNNStruct *r)
{
    return 2 * gates(r) + projected(r);
}

/* Elements of one pseudo-layer's block, and where in it (elements) a
 * matrix (`bias` 0) or bias (1) starts. */
static size_t block_offset(const struct cudnnRNNStruct *r, int p, int upto_id, int bias)
{
    size_t off = 0;
    int g = gates(r);
    for (int id = 0; id < 2 * g && (bias || id < upto_id); id++) {
        int rows, cols;
        matrix_shape(r, p, id, &rows, &cols);
        off += (size_t)rows * (size_t)cols;
    }
    if (bias)
        for (int id = 0; id < upto_id && id < 2 * g; id++)
            off += has_bias(r, id) ? (size_t)r->hidden : 0;
    return off;
}

static size_t block_size(const struct cudnnRNNStruct *r, int p)
{
    size_t n = block_offset(r, p, 2 * gates(r), 1);
    if (projected(r))
        n += (size_t)r->proj * (size_t)r->hidden;
    return n;
}

static size_t weight_bytes(const struct cudnnRNNStruct *r)
{
    size_t n = 0;
    for (int p = 0; p < r->layers * directions(r); p++)
        n += block_size(r, p);
    return n * vgdnn_dtype_size(r->dtype);
}

cudnnStatus_t cudnnGetRNNWeightSpaceSize(cudnnHandle_t handle, cudnnRNNDescriptor_t desc, size_t *size)
{
    if (!vgdnn_valid_handle(handle) || !rnn_ok(desc) || !size)
        return CUDNN_STATUS_BAD_PARAM;
    *size = weight_bytes(desc);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t set_3d(cudnnTensorDescriptor_t d, cudnnDataType_t dtype, int a, int b)
{
    int dims[3] = {1, a, b}, strides[3] = {a * b, b, 1};
    return cudnnSetTensorNdDescriptor(d, dtype, 3, dims, strides);
}

cudnnStatus_t cudnnGetRNNWeightParams(cudnnHandle_t handle, cudnnRNNDescriptor_t desc, int32_t p, size_t ws_bytes,
                                      const void *ws, int32_t id, cudnnTensorDescriptor_t m_desc, void **m_addr,
                                      cudnnTensorDescriptor_t b_desc, void **b_addr)
{
    if (!vgdnn_valid_handle(handle) || !rnn_ok(desc))
        return CUDNN_STATUS_BAD_PARAM;
    if (p < 0 || p >= desc->layers * directions(desc) || id < 0 || id >= linear_layers(desc))
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "RNN weights: pseudo-layer %d, linear layer %d", p, id);
    if (ws_bytes < weight_bytes(desc))
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "RNN weights: a weight space of %zu bytes, %zu needed",
                          ws_bytes, weight_bytes(desc));
    size_t elem = vgdnn_dtype_size(desc->dtype), base = 0;
    for (int q = 0; q < p; q++)
        base += block_size(desc, q);
    char *w = (char *)(uintptr_t)ws; /* arithmetic only: never read */
    int rows, cols;
    matrix_shape(desc, p, id, &rows, &cols);
    size_t m_off = id == 2 * gates(desc) ? block_offset(desc, p, 2 * gates(desc), 1)
                                         : block_offset(desc, p, id, 0);
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    if (m_addr)
        *m_addr = cols ? w + (base + m_off) * elem : NULL;
    if (m_desc && cols)
        st = set_3d(m_desc, desc->dtype, rows, cols);
    int biased = has_bias(desc, id);
    if (b_addr)
        *b_addr = biased ? w + (base + block_offset(desc, p, id, 1)) * elem : NULL;
    if (b_desc && biased && st == CUDNN_STATUS_SUCCESS)
        st = set_3d(b_desc, desc->dtype, desc->hidden, 1);
    return st;
}

cudnnStatus_t cudnnGetRNNTempSpaceSizes(cudnnHandle_t handle, cudnnRNNDescriptor_t desc, cudnnForwardMode_t mode,
                                        cudnnRNNDataDescriptor_t x, size_t *ws, size_t *rs)
{
    if (!vgdnn_valid_handle(handle) || !rnn_ok(desc) || !data_ok(x))
        return CUDNN_STATUS_BAD_PARAM;
    if (ws)
        *ws = vgdnn_workspace_bytes();
    if (rs)
        *rs = mode == CUDNN_FWD_MODE_TRAINING
                  ? (size_t)(gates(desc) + 2) * (size_t)desc->hidden * (size_t)x->max_seq * (size_t)x->batch *
                        (size_t)desc->layers * (size_t)directions(desc) * vgdnn_dtype_size(desc->dtype)
                  : 0;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- the passes ------------------------------------------------------------ */

static size_t data_bytes(cudnnRNNDataDescriptor_t d)
{
    return (size_t)d->max_seq * (size_t)d->batch * (size_t)d->vector * vgdnn_dtype_size(d->dtype);
}

/* A state tensor (h or c), optional: a NULL pointer means zeros (inputs)
 * or not wanted (outputs). */
static cudnnStatus_t check_state(cudnnTensorDescriptor_t d, const void *p, const char *what)
{
    if (!p)
        return CUDNN_STATUS_SUCCESS;
    vgdnn_shape s;
    cudnnStatus_t st = vgdnn_tensor_shape(d, &s);
    return st ? st : vgdnn_check_tensor(&s, p, what);
}

struct rnn_call {
    const char *name;
    cudnnHandle_t handle;
    cudnnRNNDescriptor_t rnn;
    const int32_t *dev_seq;
    cudnnRNNDataDescriptor_t x, y;
    const void *xp[2], *yp[2]; /* x and dx, y and dy, as the call has them */
    cudnnTensorDescriptor_t h, c;
    const void *hp[3], *cp[3];
    size_t w_bytes, ws_bytes, rs_bytes;
    const void *w, *ws, *rs;
};

static cudnnStatus_t check_call(const struct rnn_call *k)
{
    if (!vgdnn_valid_handle(k->handle) || !rnn_ok(k->rnn) || !data_ok(k->x) || !data_ok(k->y))
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: a handle or descriptor is not set", k->name);
    cudnnStatus_t st = vgdnn_device_usable(k->name);
    if (st == CUDNN_STATUS_SUCCESS && k->w_bytes < weight_bytes(k->rnn))
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: a weight space of %zu bytes, %zu needed", k->name, k->w_bytes,
                        weight_bytes(k->rnn));
    if (st == CUDNN_STATUS_SUCCESS && k->dev_seq)
        st = vgdnn_check_device_range(k->dev_seq, (size_t)k->x->batch * sizeof(int32_t), "the sequence lengths");
    for (int i = 0; i < 2 && st == CUDNN_STATUS_SUCCESS; i++)
        if (k->xp[i] || i == 0)
            st = vgdnn_check_device_range(k->xp[i], data_bytes(k->x), i ? "dx" : "x");
    for (int i = 0; i < 2 && st == CUDNN_STATUS_SUCCESS; i++)
        if (k->yp[i] || i == 0)
            st = vgdnn_check_device_range(k->yp[i], data_bytes(k->y), i ? "dy" : "y");
    for (int i = 0; i < 3 && st == CUDNN_STATUS_SUCCESS; i++)
        st = check_state(k->h, k->hp[i], "a hidden state");
    for (int i = 0; i < 3 && st == CUDNN_STATUS_SUCCESS && k->rnn->cell == CUDNN_LSTM; i++)
        st = check_state(k->c, k->cp[i], "a cell state");
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_check_device_range(k->w, weight_bytes(k->rnn), "the weight space");
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_check_device_range(k->ws, k->ws_bytes, "the workspace");
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_check_device_range(k->rs, k->rs_bytes, "the reserve space");
    return st;
}

cudnnStatus_t cudnnRNNForward(cudnnHandle_t handle, cudnnRNNDescriptor_t rnn, cudnnForwardMode_t mode,
                              const int32_t dev_seq[], cudnnRNNDataDescriptor_t x, const void *xp,
                              cudnnRNNDataDescriptor_t y, void *yp, cudnnTensorDescriptor_t h, const void *hx,
                              void *hy, cudnnTensorDescriptor_t c, const void *cx, void *cy, size_t w_bytes,
                              const void *w, size_t ws_bytes, void *ws, size_t rs_bytes, void *rs)
{
    (void)mode;
    vgdnn_count(VGDNN_cudnnRNNForward);
    struct rnn_call k = {"cudnnRNNForward", handle, rnn, dev_seq, x, y, {xp, NULL}, {yp, NULL}, h, c,
                         {hx, hy, NULL}, {cx, cy, NULL}, w_bytes, ws_bytes, rs_bytes, w, ws, rs};
    return check_call(&k);
}

cudnnStatus_t cudnnRNNBackwardData_v8(cudnnHandle_t handle, cudnnRNNDescriptor_t rnn, const int32_t dev_seq[],
                                      cudnnRNNDataDescriptor_t y, const void *yp, const void *dy,
                                      cudnnRNNDataDescriptor_t x, void *dx, cudnnTensorDescriptor_t h,
                                      const void *hx, const void *dhy, void *dhx, cudnnTensorDescriptor_t c,
                                      const void *cx, const void *dcy, void *dcx, size_t w_bytes, const void *w,
                                      size_t ws_bytes, void *ws, size_t rs_bytes, void *rs)
{
    vgdnn_count(VGDNN_cudnnRNNBackwardData_v8);
    /* dx stands for x: the backward pass writes it, reads no x */
    struct rnn_call k = {"cudnnRNNBackwardData_v8", handle, rnn, dev_seq, x, y, {dx, NULL}, {yp, dy}, h, c,
                         {hx, dhy, dhx}, {cx, dcy, dcx}, w_bytes, ws_bytes, rs_bytes, w, ws, rs};
    return check_call(&k);
}

cudnnStatus_t cudnnRNNBackwardWeights_v8(cudnnHandle_t handle, cudnnRNNDescriptor_t rnn, cudnnWgradMode_t add,
                                         const int32_t dev_seq[], cudnnRNNDataDescriptor_t x, const void *xp,
                                         cudnnTensorDescriptor_t h, const void *hx, cudnnRNNDataDescriptor_t y,
                                         const void *yp, size_t w_bytes, void *dw, size_t ws_bytes, void *ws,
                                         size_t rs_bytes, void *rs)
{
    (void)add;
    vgdnn_count(VGDNN_cudnnRNNBackwardWeights_v8);
    struct rnn_call k = {"cudnnRNNBackwardWeights_v8", handle, rnn, dev_seq, x, y, {xp, NULL}, {yp, NULL}, h,
                         NULL, {hx, NULL, NULL}, {NULL, NULL, NULL}, w_bytes, ws_bytes, rs_bytes, dw, ws, rs};
    return check_call(&k);
}
