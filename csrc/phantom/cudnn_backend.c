/* The backend (graph) API: cudnnBackendCreateDescriptor, SetAttribute,
 * GetAttribute, Finalize, DestroyDescriptor (Execute: cudnn_execute.c).
 *
 * PyTorch reaches it through the cudnn-frontend it compiles in, for
 * convolutions (Conv_v8.cpp: operation graph, heuristics, engine configs,
 * execution plan) and for cuDNN attention (MHA.cpp, the frontend's graph
 * API, which builds the same objects). What the frontend reads back, seen
 * on a real H200 with cuDNN 9.19 under PyTorch 2.11, and what the stand-in
 * answers:
 *
 *   heuristics' results (count, then the configs)  VGDNN_ENGINES configs, each
 *                                                  with an engine of index i
 *   an engine config's engine                      that engine (a copy into
 *                                                  the caller's descriptor)
 *   an engine's global index                       i
 *   numerical notes, behaviour notes, knobs        none
 *   an engine config's workspace, shared memory    the workspace model, 0
 *   an execution plan's workspace                  the workspace model
 *                                                  (VG_PHANTOM_CUDNN_WORKSPACE)
 *   an operation graph's engine count              VGDNN_ENGINES
 *   anything set                                   as set
 *   anything else never set                        no elements (count 0)
 *
 * No engine is ever "not supported", so the frontend's first choice is
 * always the one taken: PyTorch's fallbacks for a failing engine are not
 * exercised here.
 */
#include "cudnn_backend.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* How many engines every operation graph has, and heuristics return. One:
 * the frontend and PyTorch take the first that builds, and here all do. */
#define VGDNN_ENGINES 1

static pthread_mutex_t backend_lock = PTHREAD_MUTEX_INITIALIZER;
static long live_descriptors;

void vgdnn_backend_lock(void)
{
    pthread_mutex_lock(&backend_lock);
}

void vgdnn_backend_unlock(void)
{
    pthread_mutex_unlock(&backend_lock);
}

long vg_phantom_cudnn_live_descriptors(void)
{
    vgdnn_backend_lock();
    long n = live_descriptors;
    vgdnn_backend_unlock();
    return n;
}

/* ---- the live descriptors ----------------------------------------------
 * An open-addressing set of their addresses, so that a handle is checked
 * without reading through it: a stale or stray pointer is BAD_PARAM, as in
 * cuDNN, not a read of freed memory. */

#define TOMBSTONE ((uintptr_t)1)
static uintptr_t *slots;
static size_t slot_count, slots_used; /* used: live and tombstones */

static size_t slot_of(uintptr_t key, size_t cap)
{
    return (size_t)((key >> 4) * 0x9e3779b97f4a7c15ull) & (cap - 1);
}

/* Rehashes into a table four times the live descriptors (at least 1024
 * slots), which also drops the tombstones. */
static int registry_grow(void)
{
    size_t live = 0, cap = 1024;
    for (size_t i = 0; i < slot_count; i++)
        live += slots[i] > TOMBSTONE;
    while (cap < 4 * (live + 1))
        cap *= 2;
    uintptr_t *grown = calloc(cap, sizeof *grown);
    if (!grown)
        return -1;
    size_t used = 0;
    for (size_t i = 0; i < slot_count; i++)
        if (slots[i] > TOMBSTONE) {
            size_t k = slot_of(slots[i], cap);
            while (grown[k])
                k = (k + 1) & (cap - 1);
            grown[k] = slots[i];
            used++;
        }
    free(slots);
    slots = grown;
    slot_count = cap;
    slots_used = used;
    return 0;
}

static int registry_add(const vgdnn_desc *d)
{
    if (2 * (slots_used + 1) > slot_count && registry_grow() != 0)
        return -1;
    size_t k = slot_of((uintptr_t)d, slot_count);
    while (slots[k] > TOMBSTONE)
        k = (k + 1) & (slot_count - 1);
    if (!slots[k])
        slots_used++;
    slots[k] = (uintptr_t)d;
    return 0;
}

static size_t registry_find(const void *p)
{
    if (!slot_count || !p)
        return (size_t)-1;
    for (size_t k = slot_of((uintptr_t)p, slot_count);; k = (k + 1) & (slot_count - 1)) {
        if (!slots[k])
            return (size_t)-1;
        if (slots[k] == (uintptr_t)p)
            return k;
    }
}

static void registry_remove(const vgdnn_desc *d)
{
    size_t k = registry_find(d);
    if (k != (size_t)-1)
        slots[k] = TOMBSTONE;
}

vgdnn_desc *vgdnn_backend_desc(cudnnBackendDescriptor_t handle)
{
    return registry_find(handle) != (size_t)-1 ? handle : NULL;
}

size_t vgdnn_attr_size(cudnnBackendAttributeType_t type)
{
    switch ((int)type) {
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR:
        return sizeof(void *);
    case CUDNN_TYPE_INT64:
    case CUDNN_TYPE_DOUBLE:
        return 8;
    case CUDNN_TYPE_BOOLEAN:
        return sizeof(bool);
    case CUDNN_TYPE_CHAR:
        return 1;
    case CUDNN_TYPE_FRACTION:
        return sizeof(cudnnFraction_t);
    default:
        /* The enumerations, INT32 and FLOAT, through the last type this
         * header knows and a few beyond (newer frontends' enumerations). */
        return (int)type >= 0 && (int)type < 64 ? 4 : 0;
    }
}

const struct vgdnn_attr *vgdnn_attr_find(const vgdnn_desc *d, cudnnBackendAttributeName_t name)
{
    for (int i = 0; i < d->nattrs; i++)
        if (d->attrs[i].name == name)
            return &d->attrs[i];
    return NULL;
}

vgdnn_desc *vgdnn_attr_desc(const vgdnn_desc *d, cudnnBackendAttributeName_t name)
{
    const struct vgdnn_attr *a = vgdnn_attr_find(d, name);
    if (!a || a->type != CUDNN_TYPE_BACKEND_DESCRIPTOR || a->count < 1)
        return NULL;
    return ((vgdnn_desc **)a->data)[0];
}

int64_t vgdnn_attr_int64(const vgdnn_desc *d, cudnnBackendAttributeName_t name, int64_t dflt)
{
    const struct vgdnn_attr *a = vgdnn_attr_find(d, name);
    if (!a || a->type != CUDNN_TYPE_INT64 || a->count < 1)
        return dflt;
    return ((int64_t *)a->data)[0];
}

/* ---- life ------------------------------------------------------------ */

static vgdnn_desc *desc_new(cudnnBackendDescriptorType_t type)
{
    vgdnn_desc *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    if (registry_add(d) != 0) {
        free(d);
        return NULL;
    }
    d->type = type;
    live_descriptors++;
    return d;
}

static void desc_unref(vgdnn_desc *d);

static void attr_release(struct vgdnn_attr *a)
{
    if (a->type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
        for (int64_t i = 0; i < a->count; i++)
            if (((vgdnn_desc **)a->data)[i])
                desc_unref(((vgdnn_desc **)a->data)[i]);
    free(a->data);
    a->data = NULL;
    a->count = 0;
}

static void desc_clear(vgdnn_desc *d)
{
    for (int i = 0; i < d->nattrs; i++)
        attr_release(&d->attrs[i]);
    d->nattrs = 0;
    d->finalized = 0;
}

static void desc_unref(vgdnn_desc *d)
{
    if (--d->refs > 0)
        return;
    desc_clear(d);
    free(d->attrs);
    registry_remove(d);
    free(d);
    live_descriptors--;
}

/* A copy of `count` elements, referencing the descriptors among them. */
static cudnnStatus_t attr_make(struct vgdnn_attr *out, cudnnBackendAttributeName_t name,
                               cudnnBackendAttributeType_t type, int64_t count, const void *elements)
{
    size_t size = vgdnn_attr_size(type);
    if (!size)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "attribute %d of unknown type %d", (int)name, (int)type);
    if (count < 0 || (count > 0 && !elements))
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "attribute %d: %lld elements at %p", (int)name,
                          (long long)count, elements);
    if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
        for (int64_t i = 0; i < count; i++) {
            cudnnBackendDescriptor_t e = ((cudnnBackendDescriptor_t const *)elements)[i];
            if (e && !vgdnn_backend_desc(e))
                return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "attribute %d: element %lld is not a descriptor",
                                  (int)name, (long long)i);
        }
    void *data = malloc(count ? (size_t)count * size : 1);
    if (!data)
        return CUDNN_STATUS_ALLOC_FAILED;
    if (count)
        memcpy(data, elements, (size_t)count * size);
    if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
        for (int64_t i = 0; i < count; i++)
            if (((vgdnn_desc **)data)[i])
                ((vgdnn_desc **)data)[i]->refs++;
    *out = (struct vgdnn_attr){name, type, count, data};
    return CUDNN_STATUS_SUCCESS;
}

/* Sets (or replaces) an attribute. */
static cudnnStatus_t attr_store(vgdnn_desc *d, cudnnBackendAttributeName_t name,
                                cudnnBackendAttributeType_t type, int64_t count, const void *elements)
{
    struct vgdnn_attr made;
    cudnnStatus_t st = attr_make(&made, name, type, count, elements);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    for (int i = 0; i < d->nattrs; i++)
        if (d->attrs[i].name == name) {
            attr_release(&d->attrs[i]); /* after the new references: it may hold the same */
            d->attrs[i] = made;
            return CUDNN_STATUS_SUCCESS;
        }
    if (d->nattrs == d->cap) {
        int cap = d->cap ? 2 * d->cap : 8;
        struct vgdnn_attr *grown = realloc(d->attrs, (size_t)cap * sizeof *grown);
        if (!grown) {
            attr_release(&made);
            return CUDNN_STATUS_ALLOC_FAILED;
        }
        d->attrs = grown;
        d->cap = cap;
    }
    d->attrs[d->nattrs++] = made;
    return CUDNN_STATUS_SUCCESS;
}

/* What a get into the caller's descriptor does: `dst` becomes a copy of
 * `src` (their attributes, sharing what they reference). */
static cudnnStatus_t desc_assign(vgdnn_desc *dst, const vgdnn_desc *src)
{
    if (dst == src)
        return CUDNN_STATUS_SUCCESS;
    if (dst->type != src->type)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "a descriptor of type %d to receive one of type %d",
                          (int)dst->type, (int)src->type);
    struct vgdnn_attr *copies = calloc((size_t)src->nattrs + 1, sizeof *copies);
    if (!copies)
        return CUDNN_STATUS_ALLOC_FAILED;
    for (int i = 0; i < src->nattrs; i++) {
        const struct vgdnn_attr *a = &src->attrs[i];
        cudnnStatus_t st = attr_make(&copies[i], a->name, a->type, a->count, a->data);
        if (st != CUDNN_STATUS_SUCCESS) {
            while (i-- > 0)
                attr_release(&copies[i]);
            free(copies);
            return st;
        }
    }
    desc_clear(dst);
    free(dst->attrs);
    dst->attrs = copies;
    dst->nattrs = src->nattrs;
    dst->cap = src->nattrs + 1;
    dst->finalized = src->finalized;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- the API ----------------------------------------------------------- */

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *out)
{
    if (!out)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if ((int)type < 0)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "descriptor type %d", (int)type);
    vgdnn_backend_lock();
    vgdnn_desc *d = desc_new(type);
    if (d) {
        d->user_alive = 1;
        d->refs = 1;
    }
    vgdnn_backend_unlock();
    if (!d)
        return CUDNN_STATUS_ALLOC_FAILED;
    *out = d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t handle)
{
    vgdnn_backend_lock();
    vgdnn_desc *d = vgdnn_backend_desc(handle);
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    if (!d || !d->user_alive)
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "destroying %p, not a live backend descriptor", handle);
    else {
        d->user_alive = 0;
        desc_unref(d);
    }
    vgdnn_backend_unlock();
    return st;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t handle, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count, const void *elements)
{
    vgdnn_backend_lock();
    vgdnn_desc *d = vgdnn_backend_desc(handle);
    cudnnStatus_t st;
    if (!d || !d->user_alive)
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "setting attribute %d of %p, not a backend descriptor",
                        (int)name, handle);
    else if (d->finalized)
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "setting attribute %d of a finalized descriptor (type %d)",
                        (int)name, (int)d->type);
    else
        st = attr_store(d, name, type, count, elements);
    vgdnn_backend_unlock();
    return st;
}

/* ---- finalize: what cuDNN requires before a descriptor is usable -------- */

static cudnnStatus_t require(const vgdnn_desc *d, cudnnBackendAttributeName_t name, const char *what)
{
    const struct vgdnn_attr *a = vgdnn_attr_find(d, name);
    if (!a || a->count < 1)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "finalizing a descriptor of type %d without %s",
                          (int)d->type, what);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t require_final(const vgdnn_desc *d, cudnnBackendAttributeName_t name, const char *what)
{
    cudnnStatus_t st = require(d, name, what);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    const struct vgdnn_attr *a = vgdnn_attr_find(d, name);
    if (a->type != CUDNN_TYPE_BACKEND_DESCRIPTOR)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "%s is not a descriptor", what);
    for (int64_t i = 0; i < a->count; i++) {
        const vgdnn_desc *e = ((vgdnn_desc **)a->data)[i];
        if (!e || !e->finalized)
            return vgdnn_fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "%s (element %lld) is not finalized",
                              what, (long long)i);
    }
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t check_tensor(const vgdnn_desc *d)
{
    cudnnStatus_t st = require(d, CUDNN_ATTR_TENSOR_DATA_TYPE, "a data type");
    if (st == CUDNN_STATUS_SUCCESS)
        st = require(d, CUDNN_ATTR_TENSOR_DIMENSIONS, "dimensions");
    if (st == CUDNN_STATUS_SUCCESS)
        st = require(d, CUDNN_ATTR_TENSOR_STRIDES, "strides");
    if (st == CUDNN_STATUS_SUCCESS)
        st = require(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, "a unique id");
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    const struct vgdnn_attr *dims = vgdnn_attr_find(d, CUDNN_ATTR_TENSOR_DIMENSIONS);
    const struct vgdnn_attr *strides = vgdnn_attr_find(d, CUDNN_ATTR_TENSOR_STRIDES);
    if (dims->type != CUDNN_TYPE_INT64 || strides->type != CUDNN_TYPE_INT64 || dims->count != strides->count ||
        dims->count > CUDNN_DIM_MAX)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "a tensor of %lld dimensions and %lld strides",
                          (long long)dims->count, (long long)strides->count);
    for (int64_t i = 0; i < dims->count; i++)
        if (((int64_t *)dims->data)[i] < 1 || ((int64_t *)strides->data)[i] < 0)
            return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "tensor %lld: dimension %lld is %lld, stride %lld",
                              (long long)vgdnn_attr_int64(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, -1), (long long)i,
                              (long long)((int64_t *)dims->data)[i], (long long)((int64_t *)strides->data)[i]);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t check_finalize(const vgdnn_desc *d)
{
    switch ((int)d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        return check_tensor(d);
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        return require_final(d, CUDNN_ATTR_OPERATIONGRAPH_OPS, "operations");
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
        cudnnStatus_t st = require_final(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, "an operation graph");
        return st ? st : require(d, CUDNN_ATTR_ENGINEHEUR_MODE, "a heuristics mode");
    }
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: {
        cudnnStatus_t st = require_final(d, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, "an operation graph");
        int64_t index = vgdnn_attr_int64(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, -1);
        if (st == CUDNN_STATUS_SUCCESS && (index < 0 || index >= VGDNN_ENGINES))
            st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "engine %lld of %d", (long long)index, VGDNN_ENGINES);
        return st;
    }
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
        return require_final(d, CUDNN_ATTR_ENGINECFG_ENGINE, "an engine");
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        /* from an engine config, or deserialized from JSON */
        if (vgdnn_attr_find(d, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION))
            return CUDNN_STATUS_SUCCESS;
        return require_final(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, "an engine config");
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
        const struct vgdnn_attr *uids = vgdnn_attr_find(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
        const struct vgdnn_attr *ptrs = vgdnn_attr_find(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
        if ((uids ? uids->count : 0) != (ptrs ? ptrs->count : 0))
            return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "a variant pack of %lld unique ids and %lld pointers",
                              (long long)(uids ? uids->count : 0), (long long)(ptrs ? ptrs->count : 0));
        return CUDNN_STATUS_SUCCESS;
    }
    default:
        return CUDNN_STATUS_SUCCESS;
    }
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t handle)
{
    vgdnn_count(VGDNN_cudnnBackendFinalize);
    vgdnn_backend_lock();
    vgdnn_desc *d = vgdnn_backend_desc(handle);
    cudnnStatus_t st;
    if (!d || !d->user_alive)
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "finalizing %p, not a backend descriptor", handle);
    else if (d->finalized)
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "finalizing a descriptor (type %d) twice", (int)d->type);
    else if ((st = check_finalize(d)) == CUDNN_STATUS_SUCCESS)
        d->finalized = 1;
    vgdnn_backend_unlock();
    return st;
}

/* ---- get ----------------------------------------------------------------- */

/* Heuristics' results: the caller's engine config descriptors become
 * configs of engines 0, 1, ... of the graph. */
static cudnnStatus_t heuristics_results(vgdnn_desc *heur, int64_t requested, int64_t *count,
                                        cudnnBackendDescriptor_t *out)
{
    if (!heur->finalized)
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "heuristics' results before finalize");
    vgdnn_desc *graph = vgdnn_attr_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
    if (count)
        *count = VGDNN_ENGINES;
    for (int64_t i = 0; out && i < requested && i < VGDNN_ENGINES; i++) {
        vgdnn_desc *cfg = vgdnn_backend_desc(out[i]);
        if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
            return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "heuristics' result %lld into a descriptor that is "
                                                      "not an engine config", (long long)i);
        vgdnn_desc *engine = desc_new(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        if (!engine)
            return CUDNN_STATUS_ALLOC_FAILED;
        engine->refs = 1; /* ours until the config holds it */
        cudnnStatus_t st = attr_store(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                      1, &graph);
        if (st == CUDNN_STATUS_SUCCESS)
            st = attr_store(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &i);
        if (st == CUDNN_STATUS_SUCCESS) {
            engine->finalized = 1;
            desc_clear(cfg);
            st = attr_store(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &engine);
            cfg->finalized = st == CUDNN_STATUS_SUCCESS;
        }
        desc_unref(engine);
        if (st != CUDNN_STATUS_SUCCESS)
            return st;
    }
    return CUDNN_STATUS_SUCCESS;
}

/* Whether the operation graph behind an engine config is attention (SDPA
 * builds it of matmuls and pointwise operations; a convolution's graph has
 * a convolution): the workspace model differs. */
static int config_is_attention(const vgdnn_desc *cfg)
{
    const vgdnn_desc *engine = cfg ? vgdnn_attr_desc(cfg, CUDNN_ATTR_ENGINECFG_ENGINE) : NULL;
    const vgdnn_desc *graph = engine ? vgdnn_attr_desc(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH) : NULL;
    const struct vgdnn_attr *ops = graph ? vgdnn_attr_find(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS) : NULL;
    if (!ops || ops->type != CUDNN_TYPE_BACKEND_DESCRIPTOR)
        return 0;
    int matmul = 0;
    for (int64_t i = 0; i < ops->count; i++) {
        const vgdnn_desc *op = ((vgdnn_desc **)ops->data)[i];
        if (!op)
            continue;
        switch ((int)op->type) {
        case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: matmul = 1; break;
        case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
        case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
        case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR: return 0;
        default: break;
        }
    }
    return matmul;
}

size_t vgdnn_plan_workspace_bytes(const vgdnn_desc *plan)
{
    const vgdnn_desc *cfg = vgdnn_attr_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
    return vgdnn_graph_workspace_bytes(config_is_attention(cfg));
}

/* The attributes only cuDNN could know, made up: 1 when `name` is one of
 * them for this descriptor, with its value in `*a` (data in `buf`). */
static int made_up(const vgdnn_desc *d, cudnnBackendAttributeName_t name, struct vgdnn_attr *a, int64_t *buf)
{
    static const char json[] = "{\"vramguard\":\"phantom cuDNN plan\"}";
    *a = (struct vgdnn_attr){name, CUDNN_TYPE_INT64, 1, buf};
    switch ((int)d->type) {
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        if (name != CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT)
            return 0;
        *buf = VGDNN_ENGINES;
        return 1;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
#if CUDNN_VERSION >= 90200
        if (name == CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE) {
            *buf = (int64_t)vgdnn_graph_workspace_bytes(config_is_attention(d));
            return 1;
        }
        if (name == CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED) {
            a->type = CUDNN_TYPE_INT32;
            *buf = 0;
            return 1;
        }
#endif
        return 0;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        if (name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
            *buf = (int64_t)vgdnn_plan_workspace_bytes(d);
            return 1;
        }
        if (name == CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION && !vgdnn_attr_find(d, name)) {
            *a = (struct vgdnn_attr){name, CUDNN_TYPE_CHAR, sizeof json, (void *)json};
            return 1;
        }
        return 0;
    default:
        return 0;
    }
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const handle, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested, int64_t *count,
                                       void *out)
{
    vgdnn_backend_lock();
    vgdnn_desc *d = vgdnn_backend_desc(handle);
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    size_t size = vgdnn_attr_size(type);
    if (!d)
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "getting attribute %d of %p, not a backend descriptor",
                        (int)name, handle);
    else if (requested < 0 || !size)
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "getting attribute %d: %lld elements of type %d", (int)name,
                        (long long)requested, (int)type);
    if (st != CUDNN_STATUS_SUCCESS)
        goto out;

    if (d->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        st = type == CUDNN_TYPE_BACKEND_DESCRIPTOR ? heuristics_results(d, requested, count, out)
                                                   : CUDNN_STATUS_BAD_PARAM;
        goto out;
    }
    struct vgdnn_attr made;
    int64_t buf;
    const struct vgdnn_attr *a = made_up(d, name, &made, &buf) ? &made : vgdnn_attr_find(d, name);
    if (!a) {
        /* Never set and nothing to make up: no elements, as cuDNN answers
         * for notes, knobs and intermediates an engine does not have. */
        if (vgfc_tracing())
            vgfc_trace("cudnnBackendGetAttribute: attribute %d of a descriptor of type %d is not set",
                       (int)name, (int)d->type);
        if (count)
            *count = 0;
        goto out;
    }
    if (vgdnn_attr_size(a->type) != size) {
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "attribute %d is of type %d, asked as type %d", (int)name,
                        (int)a->type, (int)type);
        goto out;
    }
    if (count)
        *count = a->count;
    int64_t n = requested < a->count ? requested : a->count;
    if (!out || n == 0)
        goto out;
    if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR) {
        if (a == &made && a->type == CUDNN_TYPE_INT32) { /* made up in an int64 */
            int32_t v = (int32_t)buf;
            memcpy(out, &v, sizeof v);
        } else
            memcpy(out, a->data, (size_t)n * size);
        goto out;
    }
    for (int64_t i = 0; i < n && st == CUDNN_STATUS_SUCCESS; i++) {
        vgdnn_desc *src = ((vgdnn_desc **)a->data)[i];
        vgdnn_desc *dst = vgdnn_backend_desc(((cudnnBackendDescriptor_t *)out)[i]);
        if (!dst)
            st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "attribute %d: element %lld goes into no descriptor",
                            (int)name, (long long)i);
        else if (src)
            st = desc_assign(dst, src);
    }
out:
    vgdnn_backend_unlock();
    return st;
}
