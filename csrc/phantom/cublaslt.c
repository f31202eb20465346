/* cuBLASLt stand-in: handles, the matmul descriptor, matrix layouts and
 * preferences (small heap objects that keep every attribute set on them),
 * algorithms, the heuristic query and cublasLtMatmul itself, which checks
 * that the shapes agree and computes nothing.
 *
 * Attributes are checked as cuBLASLt checks them: a known attribute, a value
 * of exactly its type's size (the sizes come from cublasLt.h, through
 * gen_cublas.py). A get of an attribute never set answers its default.
 *
 * The heuristic always finds one algorithm that needs no workspace, so that
 * PyTorch goes on to cublasLtMatmul with the workspace it has allocated
 * through its allocator (which is what the fake must show).
 */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "cublas_fake.h"

struct cublasLtContext {
    uint32_t magic; /* VGCB_MAGIC_LT while alive */
    int device;
};

/* ---- attribute stores ------------------------------------------------- */

#define MAX_ATTRS 64

/* One descriptor of any kind: the values of its attributes by their index
 * in the kind's generated table, each in the low bytes of a word. */
struct store {
    uint32_t magic; /* the kind, while alive */
    const struct vgcb_attr *table;
    int count;
    uint64_t value[MAX_ATTRS];
    unsigned char size[MAX_ATTRS]; /* the table's, or as set where it has none */
};

#define MAGIC_DESC 0x76676d64u   /* "vgmd" */
#define MAGIC_LAYOUT 0x76676d6cu /* "vgml" */
#define MAGIC_PREF 0x76676d70u   /* "vgmp" */

static int attr_index(const struct vgcb_attr *table, int count, int attr)
{
    for (int i = 0; i < count; i++)
        if (table[i].value == attr)
            return i;
    return -1;
}

/* NULL when the header has more attributes than a store holds: every
 * creation then fails, which test_cublas shows. */
static struct store *store_new(uint32_t magic, const struct vgcb_attr *table, int count)
{
    if (count > MAX_ATTRS)
        return NULL;
    struct store *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->magic = magic;
    s->table = table;
    s->count = count;
    for (int i = 0; i < count; i++)
        s->size[i] = (unsigned char)(table[i].size ? table[i].size : 8);
    return s;
}

static struct store *store_of(const void *p, uint32_t magic)
{
    const struct store *s = p;
    return s && s->magic == magic ? (struct store *)p : NULL;
}

static cublasStatus_t store_free(void *p, uint32_t magic)
{
    struct store *s = store_of(p, magic);
    if (!s)
        return CUBLAS_STATUS_INVALID_VALUE;
    s->magic = 0;
    free(s);
    return CUBLAS_STATUS_SUCCESS;
}

/* A default that is not zero, set at creation (the attribute exists in
 * every header this builds against). */
static void store_default(struct store *s, int attr, uint64_t value)
{
    int i = attr_index(s->table, s->count, attr);
    if (i >= 0)
        s->value[i] = value & (s->size[i] < 8 ? (1ull << (8 * s->size[i])) - 1 : ~0ull);
}

static uint64_t store_u64(const struct store *s, int attr)
{
    int i = attr_index(s->table, s->count, attr);
    return i < 0 ? 0 : s->value[i];
}

/* The size must be the attribute's own; where the header names no type,
 * any size up to 8 bytes is taken and remembered. */
static cublasStatus_t set_value(const struct vgcb_attr *table, int count, uint64_t *value,
                                unsigned char *size, int attr, const void *buf, size_t n)
{
    int i = attr_index(table, count, attr);
    if (i < 0 || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (table[i].size ? n != (size_t)table[i].size : n == 0 || n > 8)
        return CUBLAS_STATUS_INVALID_VALUE;
    value[i] = 0;
    memcpy(&value[i], buf, n);
    size[i] = (unsigned char)n;
    return CUBLAS_STATUS_SUCCESS;
}

/* buf NULL with size 0 asks for the size (into *written); otherwise the
 * size must match, as for a set. */
static cublasStatus_t get_value(const struct vgcb_attr *table, int count, const uint64_t *value,
                                const unsigned char *size, int attr, void *buf, size_t n,
                                size_t *written)
{
    int i = attr_index(table, count, attr);
    if (i < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!buf && n == 0) {
        if (!written)
            return CUBLAS_STATUS_INVALID_VALUE;
        *written = size[i];
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || n != size[i])
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(buf, &value[i], n);
    if (written)
        *written = n;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t store_set(void *p, uint32_t magic, int attr, const void *buf, size_t n)
{
    struct store *s = store_of(p, magic);
    if (!s)
        return CUBLAS_STATUS_INVALID_VALUE;
    return set_value(s->table, s->count, s->value, s->size, attr, buf, n);
}

static cublasStatus_t store_get(const void *p, uint32_t magic, int attr, void *buf, size_t n,
                                size_t *written)
{
    const struct store *s = store_of(p, magic);
    if (!s)
        return CUBLAS_STATUS_INVALID_VALUE;
    return get_value(s->table, s->count, s->value, s->size, attr, buf, n, written);
}

/* ---- handles, versions ------------------------------------------------ */

static cublasStatus_t check_handle(cublasLtHandle_t handle)
{
    return vgcb_is_handle(handle, 1) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    vgcb_trace(__func__);
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    *handle = NULL;
    int dev;
    if (cudaGetDevice(&dev) != cudaSuccess)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    struct cublasLtContext *h = calloc(1, sizeof *h);
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = VGCB_MAGIC_LT;
    h->device = dev;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

/* Only a handle cublasLtCreate made: a cuBLAS handle is cublasDestroy's. */
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle)
{
    if (!handle || handle->magic != VGCB_MAGIC_LT)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = 0;
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

size_t cublasLtGetVersion(void)
{
    return CUBLAS_VERSION;
}

size_t cublasLtGetCudartVersion(void)
{
    return CUDART_VERSION;
}

cublasStatus_t cublasLtGetProperty(libraryPropertyType type, int *value)
{
    return vgcb_property(type, value);
}

const char *cublasLtGetStatusName(cublasStatus_t status)
{
    return vgcb_status_name(status);
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    return vgcb_status_string(status);
}

#if CUBLAS_VER_MAJOR >= 12 /* cuBLASLt 11.10 (CUDA 11.7) has no heuristics cache */
/* The heuristics cache: nothing is cached, its capacity is remembered. */
static _Atomic size_t cache_capacity = 8192;

cublasStatus_t cublasLtHeuristicsCacheGetCapacity(size_t *capacity)
{
    if (!capacity)
        return CUBLAS_STATUS_INVALID_VALUE;
    *capacity = cache_capacity;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtHeuristicsCacheSetCapacity(size_t capacity)
{
    cache_capacity = capacity;
    return CUBLAS_STATUS_SUCCESS;
}
#endif

/* ---- matmul descriptor ------------------------------------------------ */

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale)
{
    if (!desc)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct store *s = store_new(MAGIC_DESC, vgcb_desc_attrs, vgcb_desc_attrs_count);
    if (!s)
        return CUBLAS_STATUS_ALLOC_FAILED;
    store_default(s, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, (uint64_t)compute);
    store_default(s, CUBLASLT_MATMUL_DESC_SCALE_TYPE, (uint64_t)scale);
    store_default(s, CUBLASLT_MATMUL_DESC_FILL_MODE, CUBLAS_FILL_MODE_FULL);
    store_default(s, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
#if CUBLAS_VER_MAJOR >= 12 /* attributes cuBLASLt 11.10 (CUDA 11.7) lacks */
    store_default(s, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, (uint64_t)-1);
    store_default(s, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, (uint64_t)-1);
#endif
    *desc = (cublasLtMatmulDesc_t)s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    return store_free(desc, MAGIC_DESC);
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size)
{
    return store_set(desc, MAGIC_DESC, attr, buf, size);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, void *buf,
                                              size_t size, size_t *written)
{
    return store_get(desc, MAGIC_DESC, attr, buf, size, written);
}

/* ---- matrix layouts --------------------------------------------------- */

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!layout || ld < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct store *s = store_new(MAGIC_LAYOUT, vgcb_layout_attrs, vgcb_layout_attrs_count);
    if (!s)
        return CUBLAS_STATUS_ALLOC_FAILED;
    store_default(s, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint64_t)type);
    store_default(s, CUBLASLT_MATRIX_LAYOUT_ROWS, rows);
    store_default(s, CUBLASLT_MATRIX_LAYOUT_COLS, cols);
    store_default(s, CUBLASLT_MATRIX_LAYOUT_LD, (uint64_t)ld);
    store_default(s, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 1);
    *layout = (cublasLtMatrixLayout_t)s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
{
    return store_free(layout, MAGIC_LAYOUT);
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size)
{
    return store_set(layout, MAGIC_LAYOUT, attr, buf, size);
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr, void *buf,
                                                size_t size, size_t *written)
{
    return store_get(layout, MAGIC_LAYOUT, attr, buf, size, written);
}

/* ---- preferences ------------------------------------------------------ */

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct store *s = store_new(MAGIC_PREF, vgcb_pref_attrs, vgcb_pref_attrs_count);
    if (!s)
        return CUBLAS_STATUS_ALLOC_FAILED;
    store_default(s, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, CUBLASLT_REDUCTION_SCHEME_MASK);
    store_default(s, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, 256);
    store_default(s, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, 256);
    store_default(s, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, 256);
    store_default(s, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, 256);
    store_default(s, CUBLASLT_MATMUL_PREF_IMPL_MASK, ~0ull);
    *pref = (cublasLtMatmulPreference_t)s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    return store_free(pref, MAGIC_PREF);
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size)
{
    return store_set(pref, MAGIC_PREF, attr, buf, size);
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    void *buf, size_t size, size_t *written)
{
    return store_get(pref, MAGIC_PREF, attr, buf, size, written);
}

/* ---- algorithms --------------------------------------------------------
 * An algorithm is the caller's 64-byte struct, and its configuration lives
 * in it (one 32-bit word per attribute of the generated table, in table
 * order), so that it can be copied and kept as cuBLASLt allows. */

#define ALGO_WORDS ((int)(sizeof(cublasLtMatmulAlgo_t) / sizeof(uint32_t)))

static int algo_size(int i)
{
    return vgcb_algo_config_attrs[i].size ? vgcb_algo_config_attrs[i].size : 4;
}

/* The attribute's word; -1 for one the struct cannot hold. */
static int algo_index(int attr)
{
    int i = attr_index(vgcb_algo_config_attrs, vgcb_algo_config_attrs_count, attr);
    return i >= 0 && i < ALGO_WORDS && algo_size(i) <= 4 ? i : -1;
}

static uint32_t algo_word(const cublasLtMatmulAlgo_t *algo, int i)
{
    uint32_t v;
    memcpy(&v, (const char *)algo->data + sizeof v * (size_t)i, sizeof v);
    return v;
}

static void algo_put(cublasLtMatmulAlgo_t *algo, int attr, uint32_t v)
{
    int i = algo_index(attr);
    if (i >= 0)
        memcpy((char *)algo->data + sizeof v * (size_t)i, &v, sizeof v);
}

static void algo_init(cublasLtMatmulAlgo_t *algo, int id)
{
    memset(algo, 0, sizeof *algo);
    algo_put(algo, CUBLASLT_ALGO_CONFIG_ID, (uint32_t)id);
    algo_put(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1);
}

cublasStatus_t cublasLtMatmulAlgoInit(cublasLtHandle_t handle, cublasComputeType_t compute,
                                      cudaDataType_t scale, cudaDataType_t a_type,
                                      cudaDataType_t b_type, cudaDataType_t c_type,
                                      cudaDataType_t d_type, int id, cublasLtMatmulAlgo_t *algo)
{
    (void)compute, (void)scale, (void)a_type, (void)b_type, (void)c_type, (void)d_type;
    cublasStatus_t st = check_handle(handle);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!algo || id < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    algo_init(algo, id);
    return CUBLAS_STATUS_SUCCESS;
}

/* The id is read-only: cublasLtMatmulAlgoInit sets it. */
cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t *algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    const void *buf, size_t size)
{
    int i = algo_index(attr);
    if (!algo || i < 0 || attr == CUBLASLT_ALGO_CONFIG_ID || !buf ||
        size != (size_t)algo_size(i))
        return CUBLAS_STATUS_INVALID_VALUE;
    uint32_t v = 0;
    memcpy(&v, buf, size);
    algo_put(algo, attr, v);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t *algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    void *buf, size_t size, size_t *written)
{
    int i = algo_index(attr);
    if (!algo || i < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    size_t own = (size_t)algo_size(i);
    if (!buf && size == 0) {
        if (!written)
            return CUBLAS_STATUS_INVALID_VALUE;
        *written = own;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || size != own)
        return CUBLAS_STATUS_INVALID_VALUE;
    uint32_t v = algo_word(algo, i);
    memcpy(buf, &v, own);
    if (written)
        *written = own;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- the matmul -------------------------------------------------------- */

/* The GEMM a matmul computes, for the work count. */
struct gemm_shape {
    uint64_t m, n, k, batches;
    int complex_type;
};

/* D = op(A) op(B) (+ C): op(A) is m x k, op(B) k x n, C and D m x n, with
 * the operations the descriptor says. What cuBLASLt would refuse for the
 * shapes alone is refused here; types, epilogues and alignment are taken
 * as given. The GEMM's shape goes to `work` when it is not NULL. */
static cublasStatus_t check_shapes(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                   cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                   cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                   struct gemm_shape *work)
{
    cublasStatus_t st = check_handle(handle);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    const struct store *op = store_of(desc, MAGIC_DESC);
    const struct store *la = store_of(a, MAGIC_LAYOUT), *lb = store_of(b, MAGIC_LAYOUT);
    const struct store *lc = store_of(c, MAGIC_LAYOUT), *ld = store_of(d, MAGIC_LAYOUT);
    if (!op || !la || !lb || !lc || !ld)
        return CUBLAS_STATUS_INVALID_VALUE;
    int ta = store_u64(op, CUBLASLT_MATMUL_DESC_TRANSA) != CUBLAS_OP_N;
    int tb = store_u64(op, CUBLASLT_MATMUL_DESC_TRANSB) != CUBLAS_OP_N;
    uint64_t a_rows = store_u64(la, CUBLASLT_MATRIX_LAYOUT_ROWS);
    uint64_t a_cols = store_u64(la, CUBLASLT_MATRIX_LAYOUT_COLS);
    uint64_t b_rows = store_u64(lb, CUBLASLT_MATRIX_LAYOUT_ROWS);
    uint64_t b_cols = store_u64(lb, CUBLASLT_MATRIX_LAYOUT_COLS);
    uint64_t m = ta ? a_cols : a_rows, k = ta ? a_rows : a_cols;
    uint64_t kb = tb ? b_cols : b_rows, n = tb ? b_rows : b_cols;
    if (k != kb || store_u64(lc, CUBLASLT_MATRIX_LAYOUT_ROWS) != m ||
        store_u64(lc, CUBLASLT_MATRIX_LAYOUT_COLS) != n ||
        store_u64(ld, CUBLASLT_MATRIX_LAYOUT_ROWS) != m ||
        store_u64(ld, CUBLASLT_MATRIX_LAYOUT_COLS) != n)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (work) {
        work->m = m, work->n = n, work->k = k;
        work->batches = store_u64(ld, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
        work->complex_type = vgcb_complex_type((cudaDataType)store_u64(la, CUBLASLT_MATRIX_LAYOUT_TYPE));
    }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t check_problem(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                    cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                    cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d)
{
    return check_shapes(handle, desc, a, b, c, d, NULL);
}

/* What the one algorithm found or checked needs: no workspace, one wave. */
static void fill_result(cublasLtMatmulHeuristicResult_t *r)
{
    r->workspaceSize = 0;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
    memset(r->reserved, 0, sizeof r->reserved);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *returned)
{
    vgcb_trace(__func__);
    cublasStatus_t st = check_problem(handle, desc, a, b, c, d);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!store_of(pref, MAGIC_PREF) || requested <= 0 || !results || !returned)
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(&results[0], 0, sizeof results[0]);
    algo_init(&results[0].algo, 0);
    fill_result(&results[0]);
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* `algo` may be &result->algo, which is never written. */
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                       cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       const cublasLtMatmulAlgo_t *algo,
                                       cublasLtMatmulHeuristicResult_t *result)
{
    vgcb_trace(__func__);
    cublasStatus_t st = check_problem(handle, desc, a, b, c, d);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!algo || !result)
        return CUBLAS_STATUS_INVALID_VALUE;
    fill_result(result);
    return CUBLAS_STATUS_SUCCESS;
}

/* Without an algorithm cuBLASLt picks one itself: so does this. */
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t a,
                              const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D,
                              cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspace_size, cudaStream_t stream)
{
    vgcb_trace(__func__);
    (void)A, (void)B, (void)C, (void)D, (void)algo, (void)stream;
    struct gemm_shape work;
    cublasStatus_t st = check_shapes(handle, desc, a, b, c, d, &work);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!alpha || !beta || (!workspace && workspace_size))
        return CUBLAS_STATUS_INVALID_VALUE;
    st = vgcb_launch();
    if (st == CUBLAS_STATUS_SUCCESS)
        vgfc_count_gemm(work.m, work.n, work.k, work.batches, work.complex_type);
    return st;
}
