/* cublas_api.h declares the half-precision GEMMs for C++ only (__half is
 * a class there). In C they take pointers to the incomplete struct __half,
 * the same ABI: declared here once, for the stand-in and its test. */
#ifndef VGFC_CUBLAS_HALF_H
#define VGFC_CUBLAS_HALF_H

/* CUDA 12's cublas_api.h wants its includer to define CUBLASAPI (cublas_v2.h
 * defines it empty for C); CUDA 13's defines it itself. */
#ifndef CUBLASAPI
#define CUBLASAPI
#endif
#include <cublas_api.h>

#ifndef __cplusplus
struct __half;
#define VGFC_HALF struct __half
cublasStatus_t cublasHgemm(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                           const VGFC_HALF *, const VGFC_HALF *, int, const VGFC_HALF *, int,
                           const VGFC_HALF *, VGFC_HALF *, int);
cublasStatus_t cublasHgemmStridedBatched(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                         int, int, int, const VGFC_HALF *, const VGFC_HALF *, int,
                                         long long int, const VGFC_HALF *, int, long long int,
                                         const VGFC_HALF *, VGFC_HALF *, int, long long int, int);
cublasStatus_t cublasHgemmBatched(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                  int, const VGFC_HALF *, const VGFC_HALF *const[], int,
                                  const VGFC_HALF *const[], int, const VGFC_HALF *, VGFC_HALF *const[],
                                  int, int);
#undef VGFC_HALF
#endif

#endif
