/* The cuDNN stand-in's own test (csrc/phantom/cudnn_*.c), linked against
 * it and the fake runtime and driver, on one fake device of 1 GiB:
 * handles and versions, the stubs, the legacy descriptors and operations,
 * batch norm's sizes, and a convolution through the backend API the way
 * cudnn-frontend drives it (heuristics, engine config, plan, variant pack),
 * with the buffer checks, the descriptors' lifetimes and the workspace knob.
 *
 *   make test-fakecuda                  all of it
 *   build/fakecuda/test_cudnn backend   the tests whose name contains "backend"
 */
#include <cudnn.h>
#include <cuda_runtime_api.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakecuda.h"
#include "harness.h"
#include "rerun.h"

#define MiB (1ull << 20)

long vg_phantom_cudnn_calls(const char *name);
long vg_phantom_cudnn_unsupported_calls(void);
long vg_phantom_cudnn_live_descriptors(void);

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

static void test_handle_and_versions(void)
{
    cudnnHandle_t h;
    long before = vg_phantom_cudnn_calls("cudnnCreate");
    CHECK_EQ(cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(vg_phantom_cudnn_calls("cudnnCreate"), before + 1);
    CHECK_EQ(vg_phantom_cudnn_calls("cudnnNoSuchCall"), -1);
    CHECK_EQ(cudnnGetVersion(), CUDNN_VERSION);
    CHECK_EQ(cudnnGetCudartVersion(), CUDART_VERSION);
    int v = -1;
    CHECK_EQ(cudnnGetProperty(MAJOR_VERSION, &v), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(v, CUDNN_MAJOR);
    CHECK_EQ(cudnnGetProperty(MINOR_VERSION, &v), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(v, CUDNN_MINOR);
    CHECK(strcmp(cudnnGetErrorString(CUDNN_STATUS_NOT_SUPPORTED), "CUDNN_STATUS_NOT_SUPPORTED") == 0);
    CHECK(strcmp(cudnnGetErrorString(CUDNN_STATUS_SUCCESS), "CUDNN_STATUS_SUCCESS") == 0);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreate(&s), cudaSuccess);
    CHECK_EQ(cudnnSetStream(h, s), CUDNN_STATUS_SUCCESS);
    cudaStream_t got = NULL;
    CHECK_EQ(cudnnGetStream(h, &got), CUDNN_STATUS_SUCCESS);
    CHECK(got == s);
    CHECK_EQ(cudnnGraphVersionCheck(), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnDestroy(h), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnSetStream((cudnnHandle_t)&v, s), CUDNN_STATUS_BAD_PARAM); /* not a handle */
    cudaStreamDestroy(s);
}

/* A function the stand-in does not implement fails with NOT_SUPPORTED,
 * counted with the fake CUDA's stubs, and says so in the last error. */
static void test_stubs(void)
{
    cudnnLRNDescriptor_t lrn;
    long before = vg_fakecuda_unsupported_calls(), own = vg_phantom_cudnn_unsupported_calls();
    CHECK_EQ(cudnnCreateLRNDescriptor(&lrn), CUDNN_STATUS_NOT_SUPPORTED);
    CHECK_EQ(cudnnCreateLRNDescriptor(&lrn), CUDNN_STATUS_NOT_SUPPORTED);
    CHECK_EQ(vg_fakecuda_unsupported_calls(), before + 2);
    CHECK_EQ(vg_phantom_cudnn_unsupported_calls(), own + 2);
    CHECK(strcmp(vg_fakecuda_last_unsupported(), "cudnnCreateLRNDescriptor") == 0);
    char msg[256];
    cudnnGetLastErrorString(msg, sizeof msg);
    CHECK(strstr(msg, "cudnnCreateLRNDescriptor") != NULL);
    cudnnGetLastErrorString(msg, sizeof msg); /* read once */
    CHECK_EQ(msg[0], 0);
}

static void test_legacy_descriptors(void)
{
    cudnnTensorDescriptor_t t;
    CHECK_EQ(cudnnCreateTensorDescriptor(&t), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NHWC, CUDNN_DATA_HALF, 2, 3, 4, 5), CUDNN_STATUS_SUCCESS);
    cudnnDataType_t dt;
    int nb = 0, dims[8], strides[8];
    CHECK_EQ(cudnnGetTensorNdDescriptor(t, 8, &dt, &nb, dims, strides), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(nb, 4);
    CHECK_EQ(dt, CUDNN_DATA_HALF);
    CHECK_EQ(dims[1], 3);
    CHECK_EQ(strides[0], 60); /* NHWC: c fastest, then w, h */
    CHECK_EQ(strides[1], 1);
    CHECK_EQ(strides[2], 15);
    CHECK_EQ(strides[3], 3);
    size_t bytes = 0;
    CHECK_EQ(cudnnGetTensorSizeInBytes(t, &bytes), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(bytes, 2 * 3 * 4 * 5 * 2);
    int bad_dims[2] = {0, 1}, ones[2] = {1, 1};
    CHECK_EQ(cudnnSetTensorNdDescriptor(t, CUDNN_DATA_FLOAT, 2, bad_dims, ones), CUDNN_STATUS_BAD_PARAM);

    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    CHECK_EQ(cudnnCreateFilterDescriptor(&w), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnCreateConvolutionDescriptor(&conv), CUDNN_STATUS_SUCCESS);
    int xd[4] = {8, 16, 32, 32}, xs[4] = {16384, 1024, 32, 1}, wd[4] = {32, 16, 3, 3};
    int pad[2] = {1, 1}, stride[2] = {2, 2}, dil[2] = {1, 1};
    CHECK_EQ(cudnnSetTensorNdDescriptor(t, CUDNN_DATA_FLOAT, 4, xd, xs), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnSetFilterNdDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 4, wd), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnSetConvolutionNdDescriptor(conv, 2, pad, stride, dil, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnSetConvolutionGroupCount(conv, 1), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnSetConvolutionMathType(conv, CUDNN_TENSOR_OP_MATH), CUDNN_STATUS_SUCCESS);
    int out[4];
    CHECK_EQ(cudnnGetConvolutionNdForwardOutputDim(conv, t, w, 4, out), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(out[0], 8);
    CHECK_EQ(out[1], 32);
    CHECK_EQ(out[2], 16);
    CHECK_EQ(out[3], 16);
    cudnnTensorFormat_t fmt;
    CHECK_EQ(cudnnGetFilterNdDescriptor(w, 4, &dt, &fmt, &nb, dims), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(dims[0], 32);
    CHECK_EQ(fmt, CUDNN_TENSOR_NCHW);
    cudnnMathType_t math;
    CHECK_EQ(cudnnGetConvolutionMathType(conv, &math), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(math, CUDNN_TENSOR_OP_MATH);
    /* Descriptors of the wrong kind are refused. */
    CHECK_EQ(cudnnGetTensorSizeInBytes((cudnnTensorDescriptor_t)w, &bytes), CUDNN_STATUS_BAD_PARAM);
    CHECK_EQ(cudnnDestroyTensorDescriptor(t), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnDestroyFilterDescriptor(w), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnDestroyConvolutionDescriptor(conv), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnDestroyTensorDescriptor(NULL), CUDNN_STATUS_SUCCESS);
}

/* A v7 convolution: one algorithm, the workspace model's size, and the
 * operation checks that every buffer holds what its descriptor says. */
static void test_legacy_convolution(void)
{
    cudnnHandle_t h;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    CHECK_EQ(cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
    cudnnCreateTensorDescriptor(&x);
    cudnnCreateTensorDescriptor(&y);
    cudnnCreateFilterDescriptor(&w);
    cudnnCreateConvolutionDescriptor(&conv);
    CHECK_EQ(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 2, 4, 8, 8), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 2, 6, 8, 8), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 6, 4, 3, 3), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnSetConvolution2dDescriptor(conv, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
             CUDNN_STATUS_SUCCESS);
    cudnnConvolutionFwdAlgoPerf_t perf[4];
    int n = 0;
    CHECK_EQ(cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, conv, y, 4, &n, perf), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(n, 1);
    CHECK_EQ(perf[0].status, CUDNN_STATUS_SUCCESS);
    CHECK_EQ(perf[0].memory, 0);
    size_t ws = 1;
    CHECK_EQ(cudnnGetConvolutionForwardWorkspaceSize(h, x, w, conv, y, perf[0].algo, &ws), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(ws, 0);

    float one = 1, zero = 0;
    void *xp = dev_alloc(2 * 4 * 8 * 8 * 4), *wp = dev_alloc(6 * 4 * 3 * 3 * 4), *yp = dev_alloc(2 * 6 * 8 * 8 * 4);
    void *short_y = dev_alloc(2 * 6 * 8 * 8 * 4 - 4);
    CHECK(xp && wp && yp && short_y);
    long before = vg_phantom_cudnn_calls("cudnnConvolutionForward");
    CHECK_EQ(cudnnConvolutionForward(h, &one, x, xp, w, wp, conv, perf[0].algo, NULL, 0, &zero, y, yp),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(vg_phantom_cudnn_calls("cudnnConvolutionForward"), before + 1);
    /* An output one float short, a freed input, a host pointer: refused. */
    CHECK_EQ(cudnnConvolutionForward(h, &one, x, xp, w, wp, conv, perf[0].algo, NULL, 0, &zero, y, short_y),
             CUDNN_STATUS_BAD_PARAM);
    char msg[256];
    cudnnGetLastErrorString(msg, sizeof msg);
    CHECK(strstr(msg, "y (") != NULL);
    cudaFree(short_y);
    CHECK_EQ(cudnnConvolutionForward(h, &one, x, xp, w, wp, conv, perf[0].algo, NULL, 0, &zero, y, short_y),
             CUDNN_STATUS_BAD_PARAM);
    CHECK_EQ(cudnnConvolutionForward(h, &one, x, msg, w, wp, conv, perf[0].algo, NULL, 0, &zero, y, yp),
             CUDNN_STATUS_BAD_PARAM);
    /* Backward data and filter run over the same descriptors. */
    CHECK_EQ(cudnnConvolutionBackwardData(h, &one, w, wp, y, yp, conv, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, NULL, 0,
                                          &zero, x, xp),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnConvolutionBackwardFilter(h, &one, x, xp, y, yp, conv, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, NULL,
                                            0, &zero, w, wp),
             CUDNN_STATUS_SUCCESS);
    /* After an illegal address on the device, launches fail. */
    vg_fakecuda_set_sticky_error(700);
    CHECK_EQ(cudnnConvolutionForward(h, &one, x, xp, w, wp, conv, perf[0].algo, NULL, 0, &zero, y, yp),
             CUDNN_STATUS_EXECUTION_FAILED);
    vg_fakecuda_set_sticky_error(0);
    cudaFree(xp);
    cudaFree(wp);
    cudaFree(yp);
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroy(h);
}

/* PyTorch's BatchNorm.cpp: sizes, then training (Ex), inference, backward (Ex). */
static void test_batch_norm(void)
{
    cudnnHandle_t h;
    cudnnTensorDescriptor_t x, bn;
    CHECK_EQ(cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
    cudnnCreateTensorDescriptor(&x);
    cudnnCreateTensorDescriptor(&bn);
    CHECK_EQ(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 8, 32, 16, 16), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnDeriveBNTensorDescriptor(bn, x, CUDNN_BATCHNORM_SPATIAL), CUDNN_STATUS_SUCCESS);
    int nb, dims[8], strides[8];
    cudnnDataType_t dt;
    CHECK_EQ(cudnnGetTensorNdDescriptor(bn, 8, &dt, &nb, dims, strides), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(dims[0] * dims[1] * dims[2] * dims[3], 32);

    size_t ws = 1, rs = 1;
    CHECK_EQ(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN,
                                                                      x, x, x, bn, NULL, &ws),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(ws, 0);
    CHECK_EQ(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN,
                                                                  NULL, x, &rs),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(rs, 0);
    CHECK_EQ(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
                 h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, CUDNN_BATCHNORM_OPS_BN, x, x, x, bn, NULL, &ws),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(ws, 16384 + 8 * 32);
    CHECK_EQ(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
                 h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, CUDNN_BATCHNORM_OPS_BN_ACTIVATION, NULL, x, &rs),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(rs, 8 * 32 * 16 * 16 / 8); /* one bit per element */

    float one = 1, zero = 0;
    size_t xb = 8 * 32 * 16 * 16 * 4;
    void *xp = dev_alloc(xb), *yp = dev_alloc(xb), *dxp = dev_alloc(xb);
    void *p[6];
    for (int i = 0; i < 6; i++)
        p[i] = dev_alloc(32 * 4);
    void *wsp = dev_alloc(ws);
    CHECK(xp && yp && dxp && p[5] && wsp);
    CHECK_EQ(cudnnBatchNormalizationForwardTrainingEx(h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, CUDNN_BATCHNORM_OPS_BN,
                                                      &one, &zero, x, xp, NULL, NULL, x, yp, bn, p[0], p[1], 0.1,
                                                      p[2], p[3], 1e-5, p[4], p[5], NULL, wsp, ws, NULL, 0),
             CUDNN_STATUS_SUCCESS);
    /* A workspace smaller than it says it is. */
    CHECK_EQ(cudnnBatchNormalizationForwardTrainingEx(h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, CUDNN_BATCHNORM_OPS_BN,
                                                      &one, &zero, x, xp, NULL, NULL, x, yp, bn, p[0], p[1], 0.1,
                                                      p[2], p[3], 1e-5, p[4], p[5], NULL, wsp, ws + 1, NULL, 0),
             CUDNN_STATUS_BAD_PARAM);
    CHECK_EQ(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x, xp, x, yp, bn, p[0],
                                                     p[1], p[2], p[3], 1e-5),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x, xp, x, yp, bn, p[0],
                                                     p[1], NULL, p[3], 1e-5),
             CUDNN_STATUS_BAD_PARAM_NULL_POINTER);
    CHECK_EQ(cudnnBatchNormalizationBackwardEx(h, CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN, &one, &zero, &one,
                                               &zero, x, xp, NULL, NULL, x, yp, NULL, NULL, x, dxp, bn, p[0], NULL,
                                               p[1], p[2], 1e-5, p[4], p[5], NULL, NULL, 0, NULL, 0),
             CUDNN_STATUS_SUCCESS);
    CHECK(vg_phantom_cudnn_calls("cudnnBatchNormalizationForwardInference") >= 1);
    for (int i = 0; i < 6; i++)
        cudaFree(p[i]);
    cudaFree(xp);
    cudaFree(yp);
    cudaFree(dxp);
    cudaFree(wsp);
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroyTensorDescriptor(bn);
    cudnnDestroy(h);
}

/* An LSTM of 2 layers, bidirectional, input 8, hidden 16, projected to 4:
 * the weight space as PyTorch's get_parameters asserts it (each pseudo-
 * layer: the matrices in order, the biases, the projection), the sizes,
 * and the passes' checks. */
static void test_rnn(void)
{
    cudnnHandle_t h;
    cudnnRNNDescriptor_t rnn;
    cudnnRNNDataDescriptor_t xd, yd;
    cudnnTensorDescriptor_t hd, cd, md, bd;
    CHECK_EQ(cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnCreateRNNDescriptor(&rnn), CUDNN_STATUS_SUCCESS);
    cudnnCreateRNNDataDescriptor(&xd);
    cudnnCreateRNNDataDescriptor(&yd);
    cudnnCreateTensorDescriptor(&hd);
    cudnnCreateTensorDescriptor(&cd);
    cudnnCreateTensorDescriptor(&md);
    cudnnCreateTensorDescriptor(&bd);
    enum { IN = 8, HID = 16, PROJ = 4, LAYERS = 2, DIRS = 2, T = 5, B = 3 };
    CHECK_EQ(cudnnSetRNNDescriptor_v8(rnn, CUDNN_RNN_ALGO_STANDARD, CUDNN_LSTM, CUDNN_RNN_DOUBLE_BIAS,
                                      CUDNN_BIDIRECTIONAL, CUDNN_LINEAR_INPUT, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT,
                                      CUDNN_DEFAULT_MATH, IN, HID, PROJ, LAYERS, NULL, 0),
             CUDNN_STATUS_SUCCESS);
    /* A projection on a GRU is refused. */
    cudnnRNNDescriptor_t bad;
    cudnnCreateRNNDescriptor(&bad);
    CHECK_EQ(cudnnSetRNNDescriptor_v8(bad, CUDNN_RNN_ALGO_STANDARD, CUDNN_GRU, CUDNN_RNN_DOUBLE_BIAS,
                                      CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT,
                                      CUDNN_DEFAULT_MATH, IN, HID, PROJ, 1, NULL, 0),
             CUDNN_STATUS_BAD_PARAM);
    cudnnDestroyRNNDescriptor(bad);

    /* Per pseudo-layer: 4 input matrices (16 x 8, or 16 x 2*4 above the
     * first layer), 4 recurrent ones (16 x 4), 8 biases of 16, the
     * projection 4 x 16; floats. */
    size_t block = 4 * HID * IN + 4 * HID * PROJ + 8 * HID + PROJ * HID;
    size_t block_up = 4 * HID * DIRS * PROJ + 4 * HID * PROJ + 8 * HID + PROJ * HID;
    size_t bytes = 0;
    CHECK_EQ(cudnnGetRNNWeightSpaceSize(h, rnn, &bytes), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(bytes, (2 * block + 2 * block_up) * 4);
    char *w = dev_alloc(bytes);
    CHECK(w != NULL);
    size_t expect = 0;
    for (int p = 0; p < LAYERS * DIRS; p++) {
        int cols = p < DIRS ? IN : DIRS * PROJ;
        for (int id = 0; id < 8; id++) {
            void *m = NULL, *b = NULL;
            CHECK_EQ(cudnnGetRNNWeightParams(h, rnn, p, bytes, w, id, md, &m, bd, &b), CUDNN_STATUS_SUCCESS);
            CHECK_EQ((char *)m - w, expect * 4);
            int nb, dims[3], strides[3];
            cudnnDataType_t dt;
            CHECK_EQ(cudnnGetTensorNdDescriptor(md, 3, &dt, &nb, dims, strides), CUDNN_STATUS_SUCCESS);
            CHECK_EQ(dims[1], HID);
            CHECK_EQ(dims[2], id < 4 ? cols : PROJ);
            expect += (size_t)HID * (id < 4 ? cols : PROJ);
        }
        for (int id = 0; id < 8; id++) {
            void *m = NULL, *b = NULL;
            CHECK_EQ(cudnnGetRNNWeightParams(h, rnn, p, bytes, w, id, NULL, &m, bd, &b), CUDNN_STATUS_SUCCESS);
            CHECK_EQ((char *)b - w, expect * 4);
            expect += HID;
        }
        void *m = NULL, *b = (void *)1;
        CHECK_EQ(cudnnGetRNNWeightParams(h, rnn, p, bytes, w, 8, md, &m, bd, &b), CUDNN_STATUS_SUCCESS);
        CHECK_EQ((char *)m - w, expect * 4); /* the projection */
        CHECK(b == NULL);
        expect += PROJ * HID;
    }
    CHECK_EQ(expect * 4, bytes);
    void *m, *b;
    CHECK_EQ(cudnnGetRNNWeightParams(h, rnn, 4, bytes, w, 0, md, &m, bd, &b), CUDNN_STATUS_BAD_PARAM);
    CHECK_EQ(cudnnGetRNNWeightParams(h, rnn, 0, bytes - 1, w, 0, md, &m, bd, &b), CUDNN_STATUS_BAD_PARAM);

    int lengths[B] = {T, T, 2};
    CHECK_EQ(cudnnSetRNNDataDescriptor(xd, CUDNN_DATA_FLOAT, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, IN,
                                       lengths, NULL),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnSetRNNDataDescriptor(yd, CUDNN_DATA_FLOAT, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B,
                                       DIRS * PROJ, lengths, NULL),
             CUDNN_STATUS_SUCCESS);
    int hdims[3] = {LAYERS * DIRS, B, PROJ}, hstr[3] = {B * PROJ, PROJ, 1};
    int cdims[3] = {LAYERS * DIRS, B, HID}, cstr[3] = {B * HID, HID, 1};
    cudnnSetTensorNdDescriptor(hd, CUDNN_DATA_FLOAT, 3, hdims, hstr);
    cudnnSetTensorNdDescriptor(cd, CUDNN_DATA_FLOAT, 3, cdims, cstr);
    size_t ws = 1, rs = 0, rs_inference = 1;
    CHECK_EQ(cudnnGetRNNTempSpaceSizes(h, rnn, CUDNN_FWD_MODE_TRAINING, xd, &ws, &rs), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(ws, 0);
    CHECK_EQ(rs, (size_t)(4 + 2) * HID * T * B * LAYERS * DIRS * 4);
    CHECK_EQ(cudnnGetRNNTempSpaceSizes(h, rnn, CUDNN_FWD_MODE_INFERENCE, xd, &ws, &rs_inference),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(rs_inference, 0);

    void *x = dev_alloc(T * B * IN * 4), *y = dev_alloc(T * B * DIRS * PROJ * 4), *hx = dev_alloc(LAYERS * DIRS * B * PROJ * 4);
    void *cx = dev_alloc(LAYERS * DIRS * B * HID * 4), *reserve = dev_alloc(rs), *short_y = dev_alloc(T * B * DIRS * PROJ * 4 - 4);
    CHECK(x && y && hx && cx && reserve && short_y);
    long before = vg_phantom_cudnn_calls("cudnnRNNForward");
    CHECK_EQ(cudnnRNNForward(h, rnn, CUDNN_FWD_MODE_TRAINING, NULL, xd, x, yd, y, hd, hx, NULL, cd, cx, NULL, bytes,
                             w, 0, NULL, rs, reserve),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(vg_phantom_cudnn_calls("cudnnRNNForward"), before + 1);
    CHECK_EQ(cudnnRNNForward(h, rnn, CUDNN_FWD_MODE_TRAINING, NULL, xd, x, yd, short_y, hd, hx, NULL, cd, cx, NULL,
                             bytes, w, 0, NULL, rs, reserve),
             CUDNN_STATUS_BAD_PARAM);
    CHECK_EQ(cudnnRNNBackwardData_v8(h, rnn, NULL, yd, y, y, xd, x, hd, hx, NULL, hx, cd, cx, NULL, cx, bytes, w, 0,
                                     NULL, rs, reserve),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnRNNBackwardWeights_v8(h, rnn, CUDNN_WGRAD_MODE_ADD, NULL, xd, x, hd, hx, yd, y, bytes, w, 0, NULL,
                                        rs, reserve),
             CUDNN_STATUS_SUCCESS);
    /* A reserve space a float short. */
    CHECK_EQ(cudnnRNNBackwardWeights_v8(h, rnn, CUDNN_WGRAD_MODE_ADD, NULL, xd, x, hd, hx, yd, y, bytes, w, 0, NULL,
                                        rs + 4, reserve),
             CUDNN_STATUS_BAD_PARAM);
    void *all[] = {w, x, y, hx, cx, reserve, short_y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cudaFree(all[i]);
    cudnnDestroyRNNDataDescriptor(xd);
    cudnnDestroyRNNDataDescriptor(yd);
    cudnnDestroyTensorDescriptor(hd);
    cudnnDestroyTensorDescriptor(cd);
    cudnnDestroyTensorDescriptor(md);
    cudnnDestroyTensorDescriptor(bd);
    cudnnDestroyRNNDescriptor(rnn);
    cudnnDestroy(h);
}

/* ---- the backend API ---------------------------------------------------- */

static cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type)
{
    cudnnBackendDescriptor_t d = NULL;
    return cudnnBackendCreateDescriptor(type, &d) == CUDNN_STATUS_SUCCESS ? d : NULL;
}

static cudnnStatus_t set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                         cudnnBackendAttributeType_t type, int64_t n, const void *v)
{
    return cudnnBackendSetAttribute(d, name, type, n, v);
}

/* A tensor as PyTorch's Conv_v8.cpp makes one: packed NCHW, its uid. */
static cudnnBackendDescriptor_t tensor(int64_t uid, const int64_t dims[4], bool virt)
{
    int64_t strides[4] = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    int64_t align = 16;
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    if (!t || set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt) ||
        set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims) ||
        set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides) ||
        set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid) ||
        set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align) ||
        set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt) || cudnnBackendFinalize(t))
        return NULL;
    return t;
}

struct conv_graph {
    cudnnBackendDescriptor_t x, w, y, conv, op, graph;
};

static int conv_graph(cudnnHandle_t h, struct conv_graph *g)
{
    static const int64_t xd[4] = {8, 16, 32, 32}, wd[4] = {32, 16, 3, 3}, yd[4] = {8, 32, 32, 32};
    static const int64_t pad[2] = {1, 1}, stride[2] = {1, 1}, dil[2] = {1, 1}, dims = 2;
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    float alpha = 1, beta = 0;
    g->x = tensor('x', xd, false);
    g->w = tensor('w', wd, false);
    g->y = tensor('y', yd, false);
    g->conv = make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    if (!g->x || !g->w || !g->y || !g->conv ||
        set(g->conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt) ||
        set(g->conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode) ||
        set(g->conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims) ||
        set(g->conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad) ||
        set(g->conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad) ||
        set(g->conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride) ||
        set(g->conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil) || cudnnBackendFinalize(g->conv))
        return 1;
    g->op = make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    if (!g->op || set(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->x) ||
        set(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->w) ||
        set(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->y) ||
        set(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->conv) ||
        set(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha) ||
        set(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta) ||
        cudnnBackendFinalize(g->op))
        return 2;
    g->graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    if (!g->graph || set(g->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->op) ||
        set(g->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) || cudnnBackendFinalize(g->graph))
        return 3;
    return 0;
}

/* The frontend's path to a plan: heuristics (count, then the configs into
 * descriptors it made), each config's engine and its notes, a plan from the
 * first, its workspace. */
static cudnnBackendDescriptor_t plan_from_heuristics(cudnnHandle_t h, cudnnBackendDescriptor_t graph,
                                                     int64_t *workspace)
{
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_INSTANT;
    cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    if (!heur || set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph) ||
        set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) || cudnnBackendFinalize(heur))
        return NULL;
    int64_t count = -1;
    if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL) ||
        count != 1)
        return NULL;
    cudnnBackendDescriptor_t cfg = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = -1;
    if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &cfg) ||
        got != 1)
        return NULL;
    cudnnBackendDestroyDescriptor(heur); /* the configs outlive it */
    cudnnBackendDescriptor_t engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t index = -1, notes = -1;
    cudnnBackendNumericalNote_t note[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &engine) ||
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, &index) ||
        index != 0 ||
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &notes, note) ||
        notes != 0)
        return NULL;
    cudnnBackendDestroyDescriptor(engine);
    cudnnBackendDescriptor_t plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    if (set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg) ||
        set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) || cudnnBackendFinalize(plan))
        return NULL;
    cudnnBackendDestroyDescriptor(cfg); /* the plan holds it */
    if (cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, NULL,
                                 workspace))
        return NULL;
    return plan;
}

static cudnnStatus_t execute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, int n, void **ptrs,
                             const int64_t *uids, void *workspace)
{
    cudnnBackendDescriptor_t pack = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    cudnnStatus_t st = set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (!st)
        st = set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (!st)
        st = set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    if (!st)
        st = cudnnBackendFinalize(pack);
    if (!st)
        st = cudnnBackendExecute(h, plan, pack);
    cudnnBackendDestroyDescriptor(pack);
    return st;
}

static void destroy_graph(struct conv_graph *g)
{
    /* In the order a C++ frontend's destructors happen to run: users first. */
    cudnnBackendDescriptor_t all[] = {g->graph, g->op, g->y, g->conv, g->x, g->w};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cudnnBackendDestroyDescriptor(all[i]);
}

static void test_backend_convolution(void)
{
    long live = vg_phantom_cudnn_live_descriptors();
    cudnnHandle_t h;
    CHECK_EQ(cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
    struct conv_graph g;
    CHECK_EQ(conv_graph(h, &g), 0);
    int64_t count = 0;
    CHECK_EQ(cudnnBackendGetAttribute(g.graph, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1,
                                      NULL, &count),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(count, 1);
    int64_t workspace = -1;
    cudnnBackendDescriptor_t plan = plan_from_heuristics(h, g.graph, &workspace);
    CHECK(plan != NULL);
    CHECK_EQ(workspace, 0);
    destroy_graph(&g); /* the plan keeps what it needs */

    void *x = dev_alloc(8 * 16 * 32 * 32 * 4), *w = dev_alloc(32 * 16 * 3 * 3 * 4), *y = dev_alloc(8 * 32 * 32 * 32 * 4);
    void *short_y = dev_alloc(8 * 32 * 32 * 32 * 4 - 1);
    CHECK(x && w && y && short_y);
    void *ptrs[3] = {x, y, w};
    int64_t uids[3] = {'x', 'y', 'w'};
    long before = vg_phantom_cudnn_calls("cudnnBackendExecute");
    CHECK_EQ(execute(h, plan, 3, ptrs, uids, NULL), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(vg_phantom_cudnn_calls("cudnnBackendExecute"), before + 1);
    ptrs[1] = short_y; /* y a byte short */
    CHECK_EQ(execute(h, plan, 3, ptrs, uids, NULL), CUDNN_STATUS_BAD_PARAM);
    char msg[256];
    cudnnGetLastErrorString(msg, sizeof msg);
    CHECK(strstr(msg, "tensor 121") != NULL); /* 'y' */
    ptrs[1] = y;
    CHECK_EQ(execute(h, plan, 2, ptrs, uids, NULL), CUDNN_STATUS_BAD_PARAM); /* w missing */
    vg_fakecuda_set_sticky_error(700);
    CHECK_EQ(execute(h, plan, 3, ptrs, uids, NULL), CUDNN_STATUS_EXECUTION_FAILED);
    vg_fakecuda_set_sticky_error(0);
    CHECK_EQ(cudnnBackendDestroyDescriptor(plan), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnBackendDestroyDescriptor(plan), CUDNN_STATUS_BAD_PARAM); /* twice */
    CHECK_EQ(vg_phantom_cudnn_live_descriptors(), live); /* everything freed */
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
    cudaFree(short_y);
    cudnnDestroy(h);
}

/* What was set is what a get returns, descriptors included (copied into
 * the caller's); finalized descriptors are frozen; finalize checks. */
static void test_backend_attributes(void)
{
    long live = vg_phantom_cudnn_live_descriptors();
    static const int64_t dims[4] = {2, 3, 4, 5};
    cudnnBackendDescriptor_t t = tensor(7, dims, false);
    CHECK(t != NULL);
    int64_t got[8], n = 0;
    CHECK_EQ(cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 8, &n, got),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(n, 4);
    CHECK_EQ(got[3], 5);
    CHECK_EQ(cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 2, &n, got),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(n, 4); /* all there are, two copied */
    CHECK_EQ(got[0], 60);
    CHECK_EQ(cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_FLOAT, 1, &n, got),
             CUDNN_STATUS_BAD_PARAM); /* as FLOAT: the wrong size */
    int64_t uid = 8;
    CHECK_EQ(set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid), CUDNN_STATUS_BAD_PARAM); /* final */

    /* An operation's tensor, read back into a descriptor of the caller's. */
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    CHECK_EQ(set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t),
             CUDNN_STATUS_SUCCESS);
    cudnnBackendDestroyDescriptor(t); /* the operation still holds it */
    cudnnBackendDescriptor_t copy = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    CHECK_EQ(cudnnBackendGetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                      &copy),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnBackendGetAttribute(copy, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &n, got),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(got[0], 7);
    cudnnBackendDescriptor_t wrong = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    CHECK_EQ(cudnnBackendGetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                      &wrong),
             CUDNN_STATUS_BAD_PARAM);
    /* Never set: no elements. */
    n = -1;
    CHECK_EQ(cudnnBackendGetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                      &copy),
             CUDNN_STATUS_SUCCESS);
    CHECK_EQ(n, 0);
    /* A tensor without its unique id does not finalize. */
    cudnnBackendDescriptor_t bad = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    CHECK_EQ(set(bad, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(cudnnBackendFinalize(bad), CUDNN_STATUS_BAD_PARAM);
    /* A descriptor element that is not a descriptor. */
    CHECK_EQ(set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got),
             CUDNN_STATUS_BAD_PARAM);
    cudnnBackendDescriptor_t all[] = {op, copy, wrong, bad};
    for (size_t i = 0; i < 4; i++)
        CHECK_EQ(cudnnBackendDestroyDescriptor(all[i]), CUDNN_STATUS_SUCCESS);
    CHECK_EQ(vg_phantom_cudnn_live_descriptors(), live);
}

/* VG_PHANTOM_CUDNN_WORKSPACE=1MiB: plans ask for 1 MiB, and execution
 * checks that the workspace given is that much device memory. */
static int workspace_child(void)
{
    cudnnHandle_t h;
    struct conv_graph g;
    if (cudnnCreate(&h) || conv_graph(h, &g))
        return 1;
    int64_t workspace = -1;
    cudnnBackendDescriptor_t plan = plan_from_heuristics(h, g.graph, &workspace);
    if (!plan || workspace != (int64_t)MiB)
        return 2;
    void *x = dev_alloc(8 * 16 * 32 * 32 * 4), *w = dev_alloc(32 * 16 * 3 * 3 * 4), *y = dev_alloc(8 * 32 * 32 * 32 * 4);
    void *ws = dev_alloc(MiB), *small = dev_alloc(MiB - 1);
    void *ptrs[3] = {x, y, w};
    int64_t uids[3] = {'x', 'y', 'w'};
    if (execute(h, plan, 3, ptrs, uids, NULL) != CUDNN_STATUS_BAD_PARAM_NULL_POINTER)
        return 3;
    if (execute(h, plan, 3, ptrs, uids, small) != CUDNN_STATUS_BAD_PARAM)
        return 4;
    if (execute(h, plan, 3, ptrs, uids, ws) != CUDNN_STATUS_SUCCESS)
        return 5;
    size_t legacy = 0;
    cudnnConvolutionFwdAlgoPerf_t perf;
    int n;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnCreateTensorDescriptor(&xd);
    cudnnCreateTensorDescriptor(&yd);
    cudnnCreateFilterDescriptor(&wd);
    cudnnCreateConvolutionDescriptor(&cd);
    cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 4, 4);
    cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 4, 4);
    cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 1, 1, 1, 1);
    cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
    if (cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &legacy) ||
        legacy != MiB || cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, 1, &n, &perf) || perf.memory != MiB)
        return 6;
    cudnnDestroyTensorDescriptor(xd);
    cudnnDestroyTensorDescriptor(yd);
    cudnnDestroyFilterDescriptor(wd);
    cudnnDestroyConvolutionDescriptor(cd);
    cudnnBackendDestroyDescriptor(plan);
    destroy_graph(&g);
    cudnnDestroy(h);
    return vg_phantom_cudnn_live_descriptors() == 0 ? 0 : 7;
}

static void test_workspace_knob(void)
{
    CHECK_EQ(rerun("VG_PHANTOM_CUDNN_WORKSPACE=1MiB", "--workspace-child 2>/dev/null"), 0);
    CHECK(rerun("VG_PHANTOM_CUDNN_WORKSPACE=lots", "--workspace-child 2>/dev/null") >= 128); /* aborts */
}

/* Without a device, cudnnCreate fails as cuDNN does on a machine without a GPU. */
static int no_device_child(void)
{
    cudnnHandle_t h;
    return cudnnCreate(&h) == CUDNN_STATUS_NOT_INITIALIZED ? 0 : 1;
}

static void test_no_device(void)
{
    CHECK_EQ(rerun("VG_FAKECUDA_DEVICES=0", "--no-device-child 2>/dev/null"), 0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--workspace-child") == 0)
        return workspace_child();
    if (argc > 1 && strcmp(argv[1], "--no-device-child") == 0)
        return no_device_child();
    /* Before the first CUDA call, which reads them. */
    setenv("VG_FAKECUDA_DEVICES", "1", 1);
    setenv("VG_FAKECUDA_MEM", "1GiB", 1);
    unsetenv("VG_PHANTOM_CUDNN_WORKSPACE");
    static const harness_test tests[] = {
        {"handle_and_versions", test_handle_and_versions},
        {"stubs", test_stubs},
        {"legacy_descriptors", test_legacy_descriptors},
        {"legacy_convolution", test_legacy_convolution},
        {"batch_norm", test_batch_norm},
        {"rnn", test_rnn},
        {"backend_convolution", test_backend_convolution},
        {"backend_attributes", test_backend_attributes},
        {"workspace_knob", test_workspace_knob},
        {"no_device", test_no_device},
    };
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
