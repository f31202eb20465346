/* The cuBLAS and cuBLASLt stand-ins (libcublas.so.N, libcublasLt.so.N):
 * what both share. The real libraries cannot run over the fake driver (their
 * static runtime asks it for undocumented export tables), so these answer at
 * the public API: handles and descriptors that remember what was set, GEMMs
 * that check their arguments and compute nothing, and version queries that
 * answer the wheel's version (CUBLAS_VER_* of the headers they are built
 * with: the wheel's own cublas_api.h and cublasLt.h).
 */
#ifndef VGCB_CUBLAS_FAKE_H
#define VGCB_CUBLAS_FAKE_H

#include <stddef.h>
#include <stdint.h>

/* CUDA 12's cublas_api.h wants its includer to define CUBLASAPI (cublas_v2.h
 * defines it empty for C); CUDA 13's defines it itself. */
#ifndef CUBLASAPI
#define CUBLASAPI
#endif
#include <cublas_api.h>
/* cublasLt.h declares cublasLtLoggerForceDisable() without a prototype. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

/* The first word of either library's handle. PyTorch hands cuBLASLt its
 * cuBLAS handle cast to cublasLtHandle_t (the cuBLAS documentation allows
 * it: a cuBLAS handle encapsulates a cuBLASLt one), so cuBLASLt takes
 * either. */
#define VGCB_MAGIC_BLAS 0x76676362u /* "vgcb" */
#define VGCB_MAGIC_LT 0x7667636cu   /* "vgcl" */

/* A cuBLAS handle (cublas.c), with what was set on it. */
struct cublasContext {
    uint32_t magic;              /* VGCB_MAGIC_BLAS while alive */
    int device;                  /* current when it was created */
    cudaStream_t stream;
    void *workspace;             /* cublasSetWorkspace's; NULL: the default one */
    size_t workspace_size;
    void *default_workspace;     /* allocated on the device by cublasCreate */
    size_t default_workspace_size;
    cublasPointerMode_t pointer_mode;
    cublasAtomicsMode_t atomics_mode;
    cublasMath_t math_mode;
    int sm_count_target;
};

/* CUBLAS_STATUS_SUCCESS for a live cuBLAS handle, else NOT_INITIALIZED
 * (what cuBLAS answers for a handle it did not create). */
cublasStatus_t vgcb_check_handle(cublasHandle_t handle);

/* ---- shared by both libraries (cublas_common.c) ---------------------- */

/* A generated stub was called (gen_cublas.py): the first call of each says
 * its name on stderr (*said remembers), every call counts in the fake's
 * vg_fakecuda_unsupported_calls(). Gives CUBLAS_STATUS_NOT_SUPPORTED. */
int vgcb_unsupported(const char *name, int *said);

/* cublasGetStatusName / cublasGetStatusString, for both libraries. */
const char *vgcb_status_name(cublasStatus_t status);
const char *vgcb_status_string(cublasStatus_t status);

/* cublasGetProperty / cublasLtGetProperty: the headers' version. */
cublasStatus_t vgcb_property(libraryPropertyType type, int *value);

/* Where a computing call would launch its kernels: a sticky error of the
 * fake device (an earlier illegal address, say) fails it as a failed launch
 * fails cuBLAS. CUBLAS_STATUS_SUCCESS otherwise. */
cublasStatus_t vgcb_launch(void);

/* VG_FAKECUDA_TRACE=1 names every computing call (and handle creation)
 * on stderr with the fake's other calls: which path PyTorch took. */
void vgcb_trace(const char *fn);
/* A GEMM run (core_work.c, in the fake driver): counted as its FLOPs. */
void vgfc_count_gemm(uint64_t m, uint64_t n, uint64_t k, uint64_t batches, int complex_type);
/* Whether a cudaDataType holds complex elements. */
int vgcb_complex_type(cudaDataType t);

/* The first word of a handle of either library: 1 when it is one. */
int vgcb_is_handle(const void *handle, int lt_too);

/* ---- cuBLASLt's attribute sizes (generated from cublasLt.h by
 * gen_cublas.py into build/fakecuda/gen/cublaslt_attrs_gen.c) --------- */

struct vgcb_attr {
    int value;        /* the enumerator */
    int size;         /* bytes; 0: the header names no type (any size up to 8) */
    const char *name;
};
extern const struct vgcb_attr vgcb_desc_attrs[];
extern const int vgcb_desc_attrs_count;
extern const struct vgcb_attr vgcb_layout_attrs[];
extern const int vgcb_layout_attrs_count;
extern const struct vgcb_attr vgcb_pref_attrs[];
extern const int vgcb_pref_attrs_count;
extern const struct vgcb_attr vgcb_algo_config_attrs[];
extern const int vgcb_algo_config_attrs_count;

#endif
