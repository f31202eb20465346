/* The backend (graph) API's descriptors, shared by cudnn_backend.c, which
 * makes them, and cudnn_execute.c, which reads a plan's graph.
 *
 * A descriptor is a small heap object remembering every attribute set on
 * it, whatever its type: gets of what was set round-trip, and the
 * attributes only cuDNN could know (heuristics' results, workspace sizes,
 * engine counts) are made up by cudnn_backend.c by a fixed model.
 *
 * Descriptors referenced by an attribute (a tensor in an operation, an
 * operation in a graph, a graph in an engine, ...) are counted references:
 * a descriptor lives while its user has not destroyed it or another one
 * still refers to it, so that the user may destroy descriptors in any order,
 * as real cuDNN allows.
 */
#ifndef VGDNN_BACKEND_H
#define VGDNN_BACKEND_H

#include "cudnn_core.h"

struct vgdnn_attr {
    cudnnBackendAttributeName_t name;
    cudnnBackendAttributeType_t type;
    int64_t count;
    void *data; /* count elements of vgdnn_attr_size(type) bytes */
};

typedef struct vgdnn_desc {
    cudnnBackendDescriptorType_t type;
    int finalized;
    int user_alive; /* not yet passed to cudnnBackendDestroyDescriptor */
    long refs;      /* user_alive + references from other descriptors */
    int nattrs, cap;
    struct vgdnn_attr *attrs;
} vgdnn_desc;

/* A finalized execution plan's workspace, by the workspace model
 * (cudnn_handle.c): its graph's kind decides. */
size_t vgdnn_plan_workspace_bytes(const vgdnn_desc *plan);

/* Every backend call holds this lock: descriptors are shared between
 * threads through references. */
void vgdnn_backend_lock(void);
void vgdnn_backend_unlock(void);

/* The descriptor behind a handle, or NULL for anything else. */
vgdnn_desc *vgdnn_backend_desc(cudnnBackendDescriptor_t handle);

/* The attribute as set, or NULL. */
const struct vgdnn_attr *vgdnn_attr_find(const vgdnn_desc *d, cudnnBackendAttributeName_t name);

/* The referenced descriptor of a one-element descriptor attribute, else NULL. */
vgdnn_desc *vgdnn_attr_desc(const vgdnn_desc *d, cudnnBackendAttributeName_t name);

/* The first int64 of an attribute, or `dflt` when it is not set. */
int64_t vgdnn_attr_int64(const vgdnn_desc *d, cudnnBackendAttributeName_t name, int64_t dflt);

/* Bytes of one element of an attribute type; 0 for an unknown type. */
size_t vgdnn_attr_size(cudnnBackendAttributeType_t type);

#endif
