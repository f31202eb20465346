/* cudnnBackendExecute: no kernel runs, but everything a launch would read
 * or write is checked, so that a program whose buffers are wrong fails
 * here as it would fail (or corrupt memory) on a GPU:
 *
 *   - the plan and the variant pack are finalized descriptors of their types;
 *   - the fake device has no sticky error (else CUDNN_STATUS_EXECUTION_FAILED);
 *   - the workspace covers the plan's workspace size (the model's);
 *   - every tensor of the plan's graph that is neither virtual nor passed
 *     by value has a pointer in the pack, and the memory its dimensions,
 *     strides and data type span lies in one live device allocation.
 *     Ragged tensors and tensors whose shapes the pack overrides are
 *     checked at their first byte only.
 */
#include "cudnn_backend.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/* cuDNN 9.18 added the variant pack's override UIDs (dynamic shapes). An
 * older header (CUDA 12's PyTorch wheels pin cuDNN 9.10) lacks the name, and
 * nothing built against it sets the attribute: its number, never found. */
#if CUDNN_VERSION < 91800
#define CUDNN_ATTR_VARIANT_PACK_OVERRIDE_UNIQUE_IDS ((cudnnBackendAttributeName_t)1010)
#endif

/* Tensors reachable from the graph's operations (through operations'
 * descriptors and tensors' ragged offsets), each once. */
struct tensors {
    const vgdnn_desc **items;
    int n, cap;
    int failed; /* out of memory */
};

static int seen(const struct tensors *t, const vgdnn_desc *d)
{
    for (int i = 0; i < t->n; i++)
        if (t->items[i] == d)
            return 1;
    return 0;
}

static void collect(struct tensors *t, const vgdnn_desc *d, int depth)
{
    if (!d || depth > 4 || t->failed)
        return;
    if (d->type == CUDNN_BACKEND_TENSOR_DESCRIPTOR) {
        if (seen(t, d))
            return;
        if (t->n == t->cap) {
            int cap = t->cap ? 2 * t->cap : 16;
            const vgdnn_desc **grown = realloc(t->items, (size_t)cap * sizeof *grown);
            if (!grown) {
                t->failed = 1;
                return;
            }
            t->items = grown;
            t->cap = cap;
        }
        t->items[t->n++] = d;
    }
    for (int i = 0; i < d->nattrs; i++) {
        const struct vgdnn_attr *a = &d->attrs[i];
        if (a->type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
            for (int64_t k = 0; k < a->count; k++)
                collect(t, ((vgdnn_desc **)a->data)[k], depth + 1);
    }
}

static bool attr_bool(const vgdnn_desc *d, cudnnBackendAttributeName_t name)
{
    const struct vgdnn_attr *a = vgdnn_attr_find(d, name);
    return a && a->type == CUDNN_TYPE_BOOLEAN && a->count > 0 && ((bool *)a->data)[0];
}

static int64_t pack_index(const struct vgdnn_attr *uids, int64_t uid)
{
    for (int64_t i = 0; uids && i < uids->count; i++)
        if (((int64_t *)uids->data)[i] == uid)
            return i;
    return -1;
}

/* Bytes the tensor spans, or 1 (its first byte) when its extent is not
 * its dimensions' (ragged, overridden, a type of unknown size). */
static size_t tensor_bytes(const vgdnn_desc *t, const struct vgdnn_attr *overridden)
{
    int64_t uid = vgdnn_attr_int64(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, -1);
    const struct vgdnn_attr *dims = vgdnn_attr_find(t, CUDNN_ATTR_TENSOR_DIMENSIONS);
    const struct vgdnn_attr *strides = vgdnn_attr_find(t, CUDNN_ATTR_TENSOR_STRIDES);
    const struct vgdnn_attr *dtype = vgdnn_attr_find(t, CUDNN_ATTR_TENSOR_DATA_TYPE);
#if VGDNN_HAS_RAGGED
    if (vgdnn_attr_find(t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC))
        return 1;
#endif
    if (pack_index(overridden, uid) >= 0 || !dims || !strides || !dtype || dims->count != strides->count)
        return 1;
    size_t elem = vgdnn_dtype_size((cudnnDataType_t)((int *)dtype->data)[0]);
    size_t bytes = vgdnn_extent((int)dims->count, dims->data, strides->data, elem);
    return bytes ? bytes : 1;
}

static cudnnStatus_t check_graph(const vgdnn_desc *graph, const vgdnn_desc *pack)
{
    const struct vgdnn_attr *uids = vgdnn_attr_find(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
    const struct vgdnn_attr *ptrs = vgdnn_attr_find(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
    const struct vgdnn_attr *overridden = vgdnn_attr_find(pack, CUDNN_ATTR_VARIANT_PACK_OVERRIDE_UNIQUE_IDS);
    struct tensors t = {0};
    collect(&t, graph, 0);
    cudnnStatus_t st = t.failed ? CUDNN_STATUS_ALLOC_FAILED : CUDNN_STATUS_SUCCESS;
    for (int i = 0; i < t.n && st == CUDNN_STATUS_SUCCESS; i++) {
        const vgdnn_desc *tensor = t.items[i];
        if (attr_bool(tensor, CUDNN_ATTR_TENSOR_IS_VIRTUAL))
            continue;
        int64_t uid = vgdnn_attr_int64(tensor, CUDNN_ATTR_TENSOR_UNIQUE_ID, -1);
        int64_t k = pack_index(uids, uid);
        if (k < 0 || !ptrs || k >= ptrs->count) {
            st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "tensor %lld of the graph has no pointer in the variant pack",
                            (long long)uid);
            break;
        }
        if (attr_bool(tensor, CUDNN_ATTR_TENSOR_IS_BY_VALUE))
            continue; /* a host scalar */
        char what[64];
        snprintf(what, sizeof what, "tensor %lld", (long long)uid);
        st = vgdnn_check_device_range(((void **)ptrs->data)[k], tensor_bytes(tensor, overridden), what);
    }
    free(t.items);
    return st;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan_handle,
                                  cudnnBackendDescriptor_t pack_handle)
{
    vgdnn_count(VGDNN_cudnnBackendExecute);
    if (!vgdnn_valid_handle(handle))
        return vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: not a cuDNN handle");
    vgdnn_backend_lock();
    const vgdnn_desc *plan = vgdnn_backend_desc(plan_handle);
    const vgdnn_desc *pack = vgdnn_backend_desc(pack_handle);
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    if (!plan || plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !plan->finalized)
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: not a finalized execution plan");
    else if (!pack || pack->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR || !pack->finalized)
        st = vgdnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: not a finalized variant pack");
    if (st == CUDNN_STATUS_SUCCESS)
        st = vgdnn_device_usable("cudnnBackendExecute");
    if (st == CUDNN_STATUS_SUCCESS) {
        const struct vgdnn_attr *ws = vgdnn_attr_find(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
        void *ws_ptr = ws && ws->count > 0 ? ((void **)ws->data)[0] : NULL;
        st = vgdnn_check_device_range(ws_ptr, vgdnn_plan_workspace_bytes(plan), "the workspace");
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        /* A plan deserialized from JSON has no graph to check against. */
        const vgdnn_desc *cfg = vgdnn_attr_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
        const vgdnn_desc *engine = cfg ? vgdnn_attr_desc(cfg, CUDNN_ATTR_ENGINECFG_ENGINE) : NULL;
        const vgdnn_desc *graph = engine ? vgdnn_attr_desc(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH) : NULL;
        if (graph)
            st = check_graph(graph, pack);
    }
    vgdnn_backend_unlock();
    return st;
}
