/* Runtime API: stream capture, graphs, executable graphs and user objects.
 *
 * A capture records instead of running: while a stream captures, every
 * launch, copy, set, host function and graph launch on it adds a node to
 * the capture's graph (copies move no bytes, host functions do not run)
 * and returns. A graph is its nodes (their type and dependencies; a host
 * node also its function), an executable graph what a replay needs: its
 * host nodes, which run at each launch, in capture order. Kernels compute
 * nothing here anyway, so a replay is otherwise a no-op.
 *
 * The rules a driver enforces that matter to an allocator are kept:
 *  - the capture modes: a potentially unsafe call (cudaMalloc, cudaFree,
 *    synchronizes, event queries) is refused with
 *    cudaErrorStreamCaptureUnsupported, and invalidates the captures that
 *    forbid it, when the calling thread's mode (cudaThreadExchange-
 *    StreamCaptureMode) is global and any thread captures in the global
 *    mode, or when it is global or thread-local and the thread itself has
 *    a capture not begun in the relaxed mode;
 *  - an invalidated capture answers cudaErrorStreamCaptureInvalidated to
 *    work on its streams and at its end, which gives no graph;
 *  - work on the legacy stream while a blocking stream (not
 *    cudaStreamNonBlocking) of its device captures:
 *    cudaErrorStreamCaptureImplicit, the capture invalidated;
 *  - other streams join a capture by waiting on an event recorded in it,
 *    and must be joined back (their last work a dependency of the origin
 *    stream's) before it ends, else cudaErrorStreamCaptureUnjoined; the
 *    end must be on the origin stream (cudaErrorStreamCaptureUnmatched) and,
 *    unless the capture is relaxed, in the thread that began it;
 *  - an event recorded in a capture cannot be queried, synchronized or
 *    timed (cudaErrorCapturedEvent); a capturing stream cannot wait on an
 *    event recorded outside its capture (cudaErrorStreamCaptureIsolation)
 *    unless with cudaEventWaitExternal, nor on one of another capture
 *    (cudaErrorStreamCaptureMerge).
 * Capture ids are unique in the process, from 1.
 *
 * User objects have a reference count, shared by their owners (the caller,
 * graphs, executable graphs: an executable graph takes its own references
 * to its graph's objects); the destructor runs, in the releasing thread and
 * once this file's lock is dropped, when the count reaches zero, as
 * PyTorch relies on to free what a graph kept (CUDA runs it on a thread of
 * its own; either way it must not call CUDA).
 *
 * Not modelled: capture of the per-thread default stream (refused with
 * cudaErrorStreamCaptureUnsupported, as of the legacy stream), conditional
 * nodes (cudaGraphConditionalHandleCreate stays a stub), graph memory
 * nodes (cudaMallocAsync during a capture allocates at once; the graph
 * memory attributes read 0), and the driver's own calls (cuLaunchKernel
 * during a capture runs its no-op kernel and adds no node).
 *
 * One mutex covers the captures, the streams' and events' capture fields,
 * graphs, executable graphs and user objects; nothing is called under it.
 * While no capture is underway the hooks the other files call cost one
 * atomic load.
 */
#include "rt.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define GRAPH_MAGIC 0x47525048u /* "GRPH" */
#define EXEC_MAGIC 0x47455845u  /* "GEXE" */
#define NODE_MAGIC 0x4e4f4445u  /* "NODE" */
#define UOBJ_MAGIC 0x554f424au  /* "UOBJ" */

struct CUuserObject_st {
    unsigned magic;
    unsigned long long refs;
    void *ptr;
    cudaHostFn_t destroy;
};

/* References an owner holds. */
struct obj_ref {
    struct CUuserObject_st *obj;
    unsigned long long count;
};

struct CUgraphNode_st {
    unsigned magic;
    enum cudaGraphNodeType type;
    struct CUgraph_st *graph;
    cudaHostFn_t fn; /* a host node's */
    void *data;
    unsigned long mark; /* the last join check that reached it */
    size_t ndeps;
    struct CUgraphNode_st *deps[];
};

struct CUgraph_st {
    unsigned magic;
    struct rt_capture *capture; /* capturing into it */
    struct CUgraphNode_st **nodes;
    size_t nnodes, nodes_cap;
    struct obj_ref *refs;
    size_t nrefs;
};

struct host_call {
    cudaHostFn_t fn;
    void *data;
};

struct CUgraphExec_st {
    unsigned magic;
    unsigned long long flags;
    size_t nnodes;
    struct host_call *hosts; /* in capture order */
    size_t nhosts;
    struct obj_ref *refs;
    size_t nrefs;
};

struct rt_capture {
    unsigned long long id;
    enum cudaStreamCaptureMode mode;
    pthread_t thread;
    cudaStream_t origin;
    struct CUgraph_st *graph;
    int own_graph; /* begun with a graph of its own (not ...ToGraph) */
    int invalidated;
    cudaStream_t *streams; /* the origin and those that joined */
    size_t nstreams;
    struct rt_capture *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct rt_capture *captures;
static int underway; /* captures in the list: read without the lock first */
static unsigned long long last_capture_id;
static unsigned long join_marks;
static _Thread_local enum cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;

static int anything_underway(void)
{
    return __atomic_load_n(&underway, __ATOMIC_ACQUIRE) != 0;
}

static int is_builtin(cudaStream_t s)
{
    return s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

static int is_legacy(cudaStream_t s)
{
    return s == NULL || s == cudaStreamLegacy;
}

/* ---- user objects ------------------------------------------------------ */

/* Destructors due once the lock is dropped. */
struct due {
    struct host_call *calls;
    size_t n, cap;
};

static void release_obj(struct CUuserObject_st *o, unsigned long long count, struct due *due)
{
    o->refs -= count;
    if (o->refs)
        return;
    if (due->n == due->cap) {
        size_t cap = due->cap ? 2 * due->cap : 4;
        struct host_call *c = realloc(due->calls, cap * sizeof *c);
        if (!c)
            abort();
        due->calls = c, due->cap = cap;
    }
    due->calls[due->n++] = (struct host_call){o->destroy, o->ptr};
    o->magic = 0;
    free(o);
}

static void release_refs(struct obj_ref *refs, size_t n, struct due *due)
{
    for (size_t i = 0; i < n; i++)
        release_obj(refs[i].obj, refs[i].count, due);
    free(refs);
}

static void unlock_and_run(struct due *due)
{
    pthread_mutex_unlock(&lock);
    for (size_t i = 0; i < due->n; i++)
        due->calls[i].fn(due->calls[i].data);
    free(due->calls);
}

static int valid_obj(cudaUserObject_t o)
{
    return o && o->magic == UOBJ_MAGIC;
}

cudaError_t cudaUserObjectCreate(cudaUserObject_t *object_out, void *ptr, cudaHostFn_t destroy,
                                 unsigned int initial_refcount, unsigned int flags)
{
    RT_ENTER(cudaUserObjectCreate);
    /* CUDA requires the flag that says the destructor is not waited on. */
    if (!object_out || !destroy || !initial_refcount || flags != cudaUserObjectNoDestructorSync)
        return rt_error(cudaErrorInvalidValue);
    struct CUuserObject_st *o = malloc(sizeof *o);
    if (!o)
        return rt_error(cudaErrorMemoryAllocation);
    *o = (struct CUuserObject_st){UOBJ_MAGIC, initial_refcount, ptr, destroy};
    *object_out = o;
    return cudaSuccess;
}

cudaError_t cudaUserObjectRetain(cudaUserObject_t object, unsigned int count)
{
    RT_ENTER(cudaUserObjectRetain);
    if (!count)
        return rt_error(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    int ok = valid_obj(object);
    if (ok)
        object->refs += count;
    pthread_mutex_unlock(&lock);
    return ok ? cudaSuccess : rt_error(cudaErrorInvalidValue);
}

cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count)
{
    RT_ENTER(cudaUserObjectRelease);
    if (!count)
        return rt_error(cudaErrorInvalidValue);
    struct due due = {0};
    pthread_mutex_lock(&lock);
    int ok = valid_obj(object) && object->refs >= count;
    if (ok)
        release_obj(object, count, &due);
    unlock_and_run(&due);
    return ok ? cudaSuccess : rt_error(cudaErrorInvalidValue);
}

/* ---- graphs ------------------------------------------------------------ */

static int valid_graph(cudaGraph_t g)
{
    return g && g->magic == GRAPH_MAGIC;
}

static int valid_node(cudaGraphNode_t n)
{
    return n && n->magic == NODE_MAGIC;
}

static struct CUgraph_st *new_graph(void)
{
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (g)
        g->magic = GRAPH_MAGIC;
    return g;
}

static void free_graph(struct CUgraph_st *g, struct due *due)
{
    for (size_t i = 0; i < g->nnodes; i++) {
        g->nodes[i]->magic = 0;
        free(g->nodes[i]);
    }
    free(g->nodes);
    release_refs(g->refs, g->nrefs, due);
    g->magic = 0;
    free(g);
}

/* A node of `type` depending on deps (all of g's): NULL when out of memory. */
static struct CUgraphNode_st *add_node(struct CUgraph_st *g, enum cudaGraphNodeType type, cudaHostFn_t fn,
                                       void *data, struct CUgraphNode_st *const *deps, size_t ndeps)
{
    if (g->nnodes == g->nodes_cap) {
        size_t cap = g->nodes_cap ? 2 * g->nodes_cap : 16;
        struct CUgraphNode_st **nodes = realloc(g->nodes, cap * sizeof *nodes);
        if (!nodes)
            return NULL;
        g->nodes = nodes, g->nodes_cap = cap;
    }
    struct CUgraphNode_st *n = malloc(sizeof *n + ndeps * sizeof *deps);
    if (!n)
        return NULL;
    *n = (struct CUgraphNode_st){NODE_MAGIC, type, g, fn, data, 0, ndeps};
    if (ndeps)
        memcpy(n->deps, deps, ndeps * sizeof *deps);
    g->nodes[g->nnodes++] = n;
    return n;
}

static int deps_in_graph(struct CUgraph_st *g, const cudaGraphNode_t *deps, size_t n)
{
    if (n && !deps)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!valid_node(deps[i]) || deps[i]->graph != g)
            return 0;
    return 1;
}

cudaError_t cudaGraphCreate(cudaGraph_t *graph, unsigned int flags)
{
    RT_ENTER(cudaGraphCreate);
    if (!graph || flags)
        return rt_error(cudaErrorInvalidValue);
    struct CUgraph_st *g = new_graph();
    if (!g)
        return rt_error(cudaErrorMemoryAllocation);
    *graph = g;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    RT_ENTER(cudaGraphDestroy);
    struct due due = {0};
    pthread_mutex_lock(&lock);
    cudaError_t err = !valid_graph(graph) ? cudaErrorInvalidValue
                      : graph->capture    ? cudaErrorIllegalState /* still being captured into */
                                          : cudaSuccess;
    if (!err)
        free_graph(graph, &due);
    unlock_and_run(&due);
    return rt_error(err);
}

/* Fills up to *count nodes (the rest of the array NULL) and says how many
 * there are; without an array, only how many. */
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count)
{
    RT_ENTER(cudaGraphGetNodes);
    if (!count)
        return rt_error(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    int ok = valid_graph(graph);
    if (ok) {
        if (nodes)
            for (size_t i = 0; i < *count; i++)
                nodes[i] = i < graph->nnodes ? graph->nodes[i] : NULL;
        *count = graph->nnodes;
    }
    pthread_mutex_unlock(&lock);
    return ok ? cudaSuccess : rt_error(cudaErrorInvalidValue);
}

cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, enum cudaGraphNodeType *type)
{
    RT_ENTER(cudaGraphNodeGetType);
    if (!type)
        return rt_error(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    int ok = valid_node(node);
    if (ok)
        *type = node->type;
    pthread_mutex_unlock(&lock);
    return ok ? cudaSuccess : rt_error(cudaErrorInvalidValue);
}

#if CUDART_VERSION >= 13000
cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t *deps, cudaGraphEdgeData *edges,
                                         size_t *count)
#else
cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t *deps, size_t *count)
#endif
{
    RT_ENTER(cudaGraphNodeGetDependencies);
    if (!count)
        return rt_error(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    int ok = valid_node(node);
    if (ok) {
        if (deps) {
            for (size_t i = 0; i < *count; i++)
                deps[i] = i < node->ndeps ? node->deps[i] : NULL;
#if CUDART_VERSION >= 13000
            if (edges)
                memset(edges, 0, *count * sizeof *edges);
#endif
        }
        *count = node->ndeps;
    }
    pthread_mutex_unlock(&lock);
    return ok ? cudaSuccess : rt_error(cudaErrorInvalidValue);
}

#if CUDART_VERSION >= 12030
/* Conditional nodes need child graphs and device-side handles: not here. */
static cudaError_t graph_add_node(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps,
                                  size_t ndeps, struct cudaGraphNodeParams *params)
{
    if (!node || !params)
        return rt_error(cudaErrorInvalidValue);
    if (params->type == cudaGraphNodeTypeConditional)
        return rt_error(cudaErrorNotSupported);
    cudaError_t err = cudaSuccess;
    pthread_mutex_lock(&lock);
    if (!valid_graph(graph) || !deps_in_graph(graph, deps, ndeps)) {
        err = cudaErrorInvalidValue;
    } else {
        int host = params->type == cudaGraphNodeTypeHost;
        if (host && !params->host.fn)
            err = cudaErrorInvalidValue;
        else if (!(*node = add_node(graph, params->type, host ? params->host.fn : NULL,
                                    host ? params->host.userData : NULL, deps, ndeps)))
            err = cudaErrorMemoryAllocation;
    }
    pthread_mutex_unlock(&lock);
    return rt_error(err);
}

#if CUDART_VERSION >= 13000
cudaError_t cudaGraphAddNode(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps,
                             const cudaGraphEdgeData *edges, size_t ndeps, struct cudaGraphNodeParams *params)
{
    RT_ENTER(cudaGraphAddNode);
    (void)edges; /* every edge is a plain dependency here */
    return graph_add_node(node, graph, deps, ndeps, params);
}
#elif CUDART_VERSION >= 12030
cudaError_t cudaGraphAddNode(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps, size_t ndeps,
                             struct cudaGraphNodeParams *params)
{
    RT_ENTER(cudaGraphAddNode);
    return graph_add_node(node, graph, deps, ndeps, params);
}
#endif
#endif

/* ---- user objects held by graphs ---------------------------------------- */

static int add_ref(struct obj_ref **refs, size_t *n, struct CUuserObject_st *o, unsigned long long count)
{
    for (size_t i = 0; i < *n; i++)
        if ((*refs)[i].obj == o) {
            (*refs)[i].count += count;
            return 1;
        }
    struct obj_ref *r = realloc(*refs, (*n + 1) * sizeof *r);
    if (!r)
        return 0;
    r[(*n)++] = (struct obj_ref){o, count};
    *refs = r;
    return 1;
}

cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t object, unsigned int count,
                                      unsigned int flags)
{
    RT_ENTER(cudaGraphRetainUserObject);
    if (!count || (flags & ~(unsigned)cudaGraphUserObjectMove))
        return rt_error(cudaErrorInvalidValue);
    cudaError_t err = cudaSuccess;
    pthread_mutex_lock(&lock);
    if (!valid_graph(graph) || !valid_obj(object) ||
        ((flags & cudaGraphUserObjectMove) && object->refs < count))
        err = cudaErrorInvalidValue;
    else if (!add_ref(&graph->refs, &graph->nrefs, object, count))
        err = cudaErrorMemoryAllocation;
    else if (!(flags & cudaGraphUserObjectMove))
        object->refs += count; /* new references; a move hands the caller's over */
    pthread_mutex_unlock(&lock);
    return rt_error(err);
}

cudaError_t cudaGraphReleaseUserObject(cudaGraph_t graph, cudaUserObject_t object, unsigned int count)
{
    RT_ENTER(cudaGraphReleaseUserObject);
    if (!count)
        return rt_error(cudaErrorInvalidValue);
    cudaError_t err = cudaErrorInvalidValue;
    struct due due = {0};
    pthread_mutex_lock(&lock);
    if (valid_graph(graph) && valid_obj(object)) {
        for (size_t i = 0; i < graph->nrefs; i++) {
            struct obj_ref *r = &graph->refs[i];
            if (r->obj != object || r->count < count)
                continue;
            r->count -= count;
            if (!r->count)
                *r = graph->refs[--graph->nrefs];
            release_obj(object, count, &due);
            err = cudaSuccess;
            break;
        }
    }
    unlock_and_run(&due);
    return rt_error(err);
}

/* ---- executable graphs --------------------------------------------------- */

static int valid_exec(cudaGraphExec_t e)
{
    return e && e->magic == EXEC_MAGIC;
}

static void free_exec(struct CUgraphExec_st *e, struct due *due)
{
    free(e->hosts);
    release_refs(e->refs, e->nrefs, due);
    e->magic = 0;
    free(e);
}

/* The graph's host nodes, and references of its own to the graph's user
 * objects. A graph still being captured into cannot be instantiated. */
static cudaError_t instantiate(cudaGraphExec_t *out, cudaGraph_t graph, unsigned long long flags)
{
    unsigned long long known = cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUseNodePriority;
#if CUDART_VERSION >= 12000
    known |= cudaGraphInstantiateFlagUpload | cudaGraphInstantiateFlagDeviceLaunch;
#endif
    if (!out || (flags & ~known))
        return rt_error(cudaErrorInvalidValue);
    struct CUgraphExec_st *e = calloc(1, sizeof *e);
    if (!e)
        return rt_error(cudaErrorMemoryAllocation);
    cudaError_t err = cudaSuccess;
    pthread_mutex_lock(&lock);
    if (!valid_graph(graph) || graph->capture) {
        err = cudaErrorInvalidValue;
    } else {
        *e = (struct CUgraphExec_st){.magic = EXEC_MAGIC, .flags = flags, .nnodes = graph->nnodes};
        for (size_t i = 0; i < graph->nnodes; i++)
            e->nhosts += graph->nodes[i]->type == cudaGraphNodeTypeHost;
        e->hosts = e->nhosts ? malloc(e->nhosts * sizeof *e->hosts) : NULL;
        e->refs = graph->nrefs ? malloc(graph->nrefs * sizeof *e->refs) : NULL;
        if ((e->nhosts && !e->hosts) || (graph->nrefs && !e->refs)) {
            err = cudaErrorMemoryAllocation;
        } else {
            size_t h = 0;
            for (size_t i = 0; i < graph->nnodes; i++)
                if (graph->nodes[i]->type == cudaGraphNodeTypeHost)
                    e->hosts[h++] = (struct host_call){graph->nodes[i]->fn, graph->nodes[i]->data};
            for (size_t i = 0; i < graph->nrefs; i++) {
                e->refs[i] = graph->refs[i];
                graph->refs[i].obj->refs += graph->refs[i].count;
            }
            e->nrefs = graph->nrefs;
        }
    }
    pthread_mutex_unlock(&lock);
    if (err) {
        free(e->hosts);
        free(e->refs);
        free(e);
        return rt_error(err);
    }
    *out = e;
    return cudaSuccess;
}

#if CUDART_VERSION >= 12000
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    RT_ENTER(cudaGraphInstantiate);
    return instantiate(exec, graph, flags);
}
#else /* CUDA 11's reports a failing node and a log, which nothing here fills */
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, cudaGraphNode_t *error_node, char *log,
                                 size_t log_size)
{
    RT_ENTER(cudaGraphInstantiate);
    if (error_node)
        *error_node = NULL;
    if (log && log_size)
        log[0] = '\0';
    return instantiate(exec, graph, 0);
}
#endif

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    RT_ENTER(cudaGraphInstantiateWithFlags);
    return instantiate(exec, graph, flags);
}

#if CUDART_VERSION >= 12000 /* CUDA 12 on */
cudaError_t cudaGraphExecGetFlags(cudaGraphExec_t exec, unsigned long long *flags)
{
    RT_ENTER(cudaGraphExecGetFlags);
    if (!flags || !valid_exec(exec))
        return rt_error(cudaErrorInvalidValue);
    *flags = exec->flags;
    return cudaSuccess;
}
#endif

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    RT_ENTER(cudaGraphExecDestroy);
    struct due due = {0};
    pthread_mutex_lock(&lock);
    int ok = valid_exec(exec);
    if (ok)
        free_exec(exec, &due);
    unlock_and_run(&due);
    return ok ? cudaSuccess : rt_error(cudaErrorInvalidValue);
}

cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t stream)
{
    RT_ENTER(cudaGraphUpload);
    if (!valid_exec(exec))
        return rt_error(cudaErrorInvalidValue);
    return rt_stream_device(stream) < 0 ? rt_error(cudaErrorInvalidResourceHandle) : cudaSuccess;
}

/* A replay: the host nodes run, in capture order; nothing else would
 * compute. On a capturing stream, a node of its capture (a child graph). */
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
    RT_ENTER(cudaGraphLaunch);
    if (!valid_exec(exec))
        return rt_error(cudaErrorInvalidValue);
    if (rt_stream_device(stream) < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    cudaError_t err;
    if (rt_capture_work(stream, cudaGraphNodeTypeGraph, NULL, NULL, &err))
        return err;
    for (size_t i = 0; i < exec->nhosts; i++)
        exec->hosts[i].fn(exec->hosts[i].data);
    return cudaSuccess;
}

/* Graph memory nodes are not modelled: no memory is the graphs'. */
cudaError_t cudaDeviceGetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr, void *value)
{
    RT_ENTER(cudaDeviceGetGraphMemAttribute);
    if (!vgfc_valid_device(device))
        return rt_error(cudaErrorInvalidDevice);
    if (!value || attr < cudaGraphMemAttrUsedMemCurrent || attr > cudaGraphMemAttrReservedMemHigh)
        return rt_error(cudaErrorInvalidValue);
    *(unsigned long long *)value = 0;
    return cudaSuccess;
}

/* Only the high watermarks can be set, and only to 0 (a reset). */
cudaError_t cudaDeviceSetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr, void *value)
{
    RT_ENTER(cudaDeviceSetGraphMemAttribute);
    if (!vgfc_valid_device(device))
        return rt_error(cudaErrorInvalidDevice);
    if (!value || (attr != cudaGraphMemAttrUsedMemHigh && attr != cudaGraphMemAttrReservedMemHigh) ||
        *(unsigned long long *)value != 0)
        return rt_error(cudaErrorInvalidValue);
    return cudaSuccess;
}

cudaError_t cudaDeviceGraphMemTrim(int device)
{
    RT_ENTER(cudaDeviceGraphMemTrim);
    return vgfc_valid_device(device) ? cudaSuccess : rt_error(cudaErrorInvalidDevice);
}

/* ---- captures ------------------------------------------------------------ */

static int valid_stream(cudaStream_t s)
{
    return !is_builtin(s) && s->magic == RT_STREAM_MAGIC;
}

/* The stream's dependencies become `tips` (n of them; add: joined to its
 * own). 0 when out of memory. */
static int set_tips(cudaStream_t s, struct CUgraphNode_st *const *tips, size_t n, int add)
{
    size_t base = add ? s->ntips : 0;
    if (base + n > s->tips_cap) {
        size_t cap = s->tips_cap ? s->tips_cap : 4;
        while (cap < base + n)
            cap *= 2;
        struct CUgraphNode_st **t = realloc(s->tips, cap * sizeof *t);
        if (!t)
            return 0;
        s->tips = t;
#if CUDART_VERSION >= 12030
        cudaGraphEdgeData *e = realloc(s->tip_edges, cap * sizeof *e);
        if (!e)
            return 0;
        memset(e, 0, cap * sizeof *e);
        s->tip_edges = e;
#endif
        s->tips_cap = cap;
    }
    size_t k = base;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < k && s->tips[j] != tips[i])
            j++;
        if (j == k)
            s->tips[k++] = tips[i];
    }
    s->ntips = k;
    return 1;
}

static void leave_capture(cudaStream_t s)
{
    s->capture = NULL;
    free(s->tips);
#if CUDART_VERSION >= 12030
    free(s->tip_edges);
    s->tip_edges = NULL;
#endif
    s->tips = NULL;
    s->ntips = s->tips_cap = 0;
}

static int join_capture(struct rt_capture *c, cudaStream_t s)
{
    cudaStream_t *streams = realloc(c->streams, (c->nstreams + 1) * sizeof *streams);
    if (!streams)
        return 0;
    streams[c->nstreams++] = s;
    c->streams = streams;
    s->capture = c;
    return 1;
}

static struct rt_capture *find_capture(unsigned long long id)
{
    for (struct rt_capture *c = captures; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

/* Every stream leaves; the capture is unlisted and freed; its graph is
 * returned (NULL: invalidated, or not its own). */
static struct CUgraph_st *end_capture(struct rt_capture *c, int keep_graph, struct due *due)
{
    for (size_t i = 0; i < c->nstreams; i++)
        leave_capture(c->streams[i]);
    struct rt_capture **p = &captures;
    while (*p != c)
        p = &(*p)->next;
    *p = c->next;
    __atomic_sub_fetch(&underway, 1, __ATOMIC_RELEASE);
    struct CUgraph_st *g = c->graph;
    g->capture = NULL;
    if (!keep_graph && c->own_graph) {
        free_graph(g, due);
        g = NULL;
    }
    free(c->streams);
    free(c);
    return g;
}

/* The legacy stream's work, from the current device: the capture of a
 * blocking stream of that device would wait on it. */
static struct rt_capture *implicit_capture(void)
{
    int dev = rt_current_device();
    for (struct rt_capture *c = captures; c; c = c->next)
        for (size_t i = 0; i < c->nstreams; i++) {
            cudaStream_t s = c->streams[i];
            if (s->device == dev && !(s->flags & cudaStreamNonBlocking))
                return c;
        }
    return NULL;
}

static cudaError_t begin_capture(cudaStream_t stream, struct CUgraph_st *graph, const cudaGraphNode_t *deps,
                                 size_t ndeps, enum cudaStreamCaptureMode mode)
{
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return rt_error(cudaErrorInvalidValue);
    if (is_builtin(stream))
        return rt_error(rt_stream_device(stream) < 0 ? cudaErrorNoDevice : cudaErrorStreamCaptureUnsupported);
    if (stream->magic != RT_STREAM_MAGIC)
        return rt_error(cudaErrorInvalidResourceHandle);
    struct rt_capture *c = calloc(1, sizeof *c);
    struct CUgraph_st *own = graph ? NULL : new_graph();
    if (!c || (!graph && !own)) {
        free(c);
        free(own);
        return rt_error(cudaErrorMemoryAllocation);
    }
    cudaError_t err = cudaSuccess;
    pthread_mutex_lock(&lock);
    if (stream->capture)
        err = cudaErrorIllegalState;
    else if (graph && (!valid_graph(graph) || graph->capture || !deps_in_graph(graph, deps, ndeps)))
        err = cudaErrorInvalidValue;
    if (!err) {
        *c = (struct rt_capture){.id = ++last_capture_id, .mode = mode, .thread = pthread_self(),
                                 .origin = stream, .graph = graph ? graph : own, .own_graph = !graph};
        if (!join_capture(c, stream) || !set_tips(stream, deps, ndeps, 0)) {
            leave_capture(stream);
            free(c->streams);
            err = cudaErrorMemoryAllocation;
        }
    }
    if (!err) {
        c->graph->capture = c;
        c->next = captures;
        captures = c;
        __atomic_add_fetch(&underway, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&lock);
    if (err) {
        free(c);
        free(own);
        return rt_error(err);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    RT_ENTER(cudaStreamBeginCapture);
    return begin_capture(stream, NULL, NULL, 0, mode);
}

#if CUDART_VERSION >= 12030
cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t *deps,
                                          const cudaGraphEdgeData *edges, size_t ndeps,
                                          enum cudaStreamCaptureMode mode)
{
    RT_ENTER(cudaStreamBeginCaptureToGraph);
    (void)edges;
    if (!graph)
        return rt_error(cudaErrorInvalidValue);
    return begin_capture(stream, graph, deps, ndeps, mode);
}
#endif

/* Whether every stream's dependencies lead to the origin's: the nodes the
 * origin's depend on are marked, then each stream's must be. */
static int all_joined(struct rt_capture *c)
{
    unsigned long mark = ++join_marks;
    struct CUgraph_st *g = c->graph;
    struct CUgraphNode_st **stack = malloc((g->nnodes + 1) * sizeof *stack);
    if (!stack)
        return 1; /* cannot tell: let it end */
    size_t top = 0;
    for (size_t i = 0; i < c->origin->ntips; i++)
        if (c->origin->tips[i]->mark != mark) {
            c->origin->tips[i]->mark = mark;
            stack[top++] = c->origin->tips[i];
        }
    while (top) {
        struct CUgraphNode_st *n = stack[--top];
        for (size_t i = 0; i < n->ndeps; i++)
            if (n->deps[i]->mark != mark) {
                n->deps[i]->mark = mark;
                stack[top++] = n->deps[i];
            }
    }
    free(stack);
    for (size_t i = 0; i < c->nstreams; i++)
        for (size_t j = 0; j < c->streams[i]->ntips; j++)
            if (c->streams[i]->tips[j]->mark != mark)
                return 0;
    return 1;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    RT_ENTER(cudaStreamEndCapture);
    if (is_builtin(stream))
        return rt_error(rt_stream_device(stream) < 0 ? cudaErrorNoDevice : cudaErrorIllegalState);
    if (stream->magic != RT_STREAM_MAGIC)
        return rt_error(cudaErrorInvalidResourceHandle);
    cudaError_t err = cudaSuccess;
    struct CUgraph_st *g = NULL;
    struct due due = {0};
    pthread_mutex_lock(&lock);
    struct rt_capture *c = stream->capture;
    if (!c) {
        err = cudaErrorIllegalState;
    } else if (c->origin != stream) {
        err = cudaErrorStreamCaptureUnmatched; /* and the capture is invalidated */
        c->invalidated = 1;
    } else if (c->mode != cudaStreamCaptureModeRelaxed && !pthread_equal(c->thread, pthread_self())) {
        err = cudaErrorStreamCaptureWrongThread;
        c->invalidated = 1;
    } else {
        if (c->invalidated)
            err = cudaErrorStreamCaptureInvalidated;
        else if (!all_joined(c))
            err = cudaErrorStreamCaptureUnjoined;
        /* ...ToGraph's graph stays the caller's, ended well or not. */
        g = end_capture(c, !err, &due);
        if (err)
            g = NULL;
    }
    unlock_and_run(&due);
    if (graph && c)
        *graph = g;
    return rt_error(err);
}

/* Status, id, graph and dependencies of a stream's capture; the legacy
 * stream cannot tell while a blocking stream of its device captures. */
static cudaError_t capture_info(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                unsigned long long *id, cudaGraph_t *graph, const cudaGraphNode_t **deps,
                                const void **edges, size_t *ndeps)
{
    if (!status)
        return rt_error(cudaErrorInvalidValue);
    if (rt_stream_device(stream) < 0)
        return rt_error(is_builtin(stream) ? cudaErrorNoDevice : cudaErrorInvalidResourceHandle);
    *status = cudaStreamCaptureStatusNone;
    if (id)
        *id = 0;
    if (!anything_underway())
        return cudaSuccess;
    cudaError_t err = cudaSuccess;
    pthread_mutex_lock(&lock);
    struct rt_capture *c = valid_stream(stream) ? stream->capture : NULL;
    if (is_legacy(stream) && implicit_capture()) {
        err = cudaErrorStreamCaptureImplicit;
    } else if (c) {
        *status = c->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
        if (id)
            *id = c->id;
        /* The rest only while active, as CUDA. */
        if (!c->invalidated) {
            if (graph)
                *graph = c->graph;
            if (deps)
                *deps = (const cudaGraphNode_t *)stream->tips;
#if CUDART_VERSION >= 12030
            if (edges)
                *edges = stream->tip_edges;
#else
            (void)edges;
#endif
            if (ndeps)
                *ndeps = stream->ntips;
        }
    }
    pthread_mutex_unlock(&lock);
    return err ? rt_error(err) : cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status)
{
    RT_ENTER(cudaStreamIsCapturing);
    return capture_info(stream, status, NULL, NULL, NULL, NULL, NULL);
}

#if CUDART_VERSION >= 13000
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                     unsigned long long *id, cudaGraph_t *graph,
                                     const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                     size_t *ndeps)
{
    RT_ENTER(cudaStreamGetCaptureInfo);
    if (edges && !deps)
        return rt_error(cudaErrorInvalidValue);
    return capture_info(stream, status, id, graph, deps, (const void **)edges, ndeps);
}
#else
#if CUDART_VERSION < 12000
/* CUDA 11's: the status and id only; the rest is _v2. */
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                     unsigned long long *id)
{
    RT_ENTER(cudaStreamGetCaptureInfo);
    return capture_info(stream, status, id, NULL, NULL, NULL, NULL);
}
#define cudaStreamGetCaptureInfo cudaStreamGetCaptureInfo_v2
#endif
/* CUDA 12 names this one cudaStreamGetCaptureInfo_v2, and from 12.3 also
 * has _v3 (with edges): a cu12 PyTorch may use either. CUDA 11 has it as
 * _v2 beside the one above. */
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                     unsigned long long *id, cudaGraph_t *graph,
                                     const cudaGraphNode_t **deps, size_t *ndeps)
{
    RT_ENTER(cudaStreamGetCaptureInfo);
    return capture_info(stream, status, id, graph, deps, NULL, ndeps);
}
#if CUDART_VERSION >= 12030
cudaError_t cudaStreamGetCaptureInfo_v3(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                        unsigned long long *id, cudaGraph_t *graph,
                                        const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                        size_t *ndeps)
{
    RT_ENTER(cudaStreamGetCaptureInfo);
    if (edges && !deps)
        return rt_error(cudaErrorInvalidValue);
    return capture_info(stream, status, id, graph, deps, (const void **)edges, ndeps);
}
#endif
#endif

static cudaError_t update_deps(cudaStream_t stream, cudaGraphNode_t *nodes, size_t n, unsigned flags)
{
    if (flags != cudaStreamAddCaptureDependencies && flags != cudaStreamSetCaptureDependencies)
        return rt_error(cudaErrorInvalidValue);
    if (rt_stream_device(stream) < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    cudaError_t err = cudaSuccess;
    pthread_mutex_lock(&lock);
    struct rt_capture *c = valid_stream(stream) ? stream->capture : NULL;
    if (!c || c->invalidated)
        err = cudaErrorIllegalState;
    else if (!deps_in_graph(c->graph, nodes, n))
        err = cudaErrorInvalidValue;
    else if (!set_tips(stream, nodes, n, flags == cudaStreamAddCaptureDependencies))
        err = cudaErrorMemoryAllocation;
    pthread_mutex_unlock(&lock);
    return rt_error(err);
}

#if CUDART_VERSION >= 13000
cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t stream, cudaGraphNode_t *nodes,
                                                const cudaGraphEdgeData *edges, size_t n, unsigned int flags)
{
    RT_ENTER(cudaStreamUpdateCaptureDependencies);
    (void)edges;
    return update_deps(stream, nodes, n, flags);
}
#else
cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t stream, cudaGraphNode_t *nodes, size_t n,
                                                unsigned int flags)
{
    RT_ENTER(cudaStreamUpdateCaptureDependencies);
    return update_deps(stream, nodes, n, flags);
}
#endif

/* The calling thread's mode: what it may do while captures are underway. */
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    RT_ENTER(cudaThreadExchangeStreamCaptureMode);
    if (!mode || (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
                  *mode != cudaStreamCaptureModeRelaxed))
        return rt_error(cudaErrorInvalidValue);
    enum cudaStreamCaptureMode old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return cudaSuccess;
}

/* ---- the hooks of the other files --------------------------------------- */

int rt_capture_work(cudaStream_t stream, enum cudaGraphNodeType type, cudaHostFn_t fn, void *data,
                    cudaError_t *err)
{
    *err = cudaSuccess;
    if (!anything_underway() || stream == cudaStreamPerThread)
        return 0;
    int answered = 0;
    pthread_mutex_lock(&lock);
    if (is_legacy(stream)) {
        struct rt_capture *c = implicit_capture();
        if (c) {
            c->invalidated = 1;
            *err = cudaErrorStreamCaptureImplicit;
            answered = 1;
        }
    } else if (stream->capture) {
        answered = 1;
        if (stream->capture->invalidated) {
            *err = cudaErrorStreamCaptureInvalidated;
        } else {
            struct CUgraphNode_st *n = add_node(stream->capture->graph, type, fn, data, stream->tips, stream->ntips);
            if (!n || !set_tips(stream, &n, 1, 0))
                *err = cudaErrorMemoryAllocation;
        }
    }
    pthread_mutex_unlock(&lock);
    if (*err)
        rt_error(*err);
    return answered;
}

cudaError_t rt_capture_unsafe(void)
{
    if (!anything_underway() || thread_mode == cudaStreamCaptureModeRelaxed)
        return cudaSuccess;
    int refused = 0;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&lock);
    for (struct rt_capture *c = captures; c; c = c->next) {
        int forbids = pthread_equal(c->thread, self) ? c->mode != cudaStreamCaptureModeRelaxed
                                                      : thread_mode == cudaStreamCaptureModeGlobal &&
                                                            c->mode == cudaStreamCaptureModeGlobal;
        if (forbids) {
            c->invalidated = 1;
            refused = 1;
        }
    }
    pthread_mutex_unlock(&lock);
    return refused ? rt_error(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

cudaError_t rt_capture_stream_wait(cudaStream_t stream)
{
    if (!anything_underway() || !valid_stream(stream))
        return cudaSuccess;
    pthread_mutex_lock(&lock);
    struct rt_capture *c = stream->capture;
    if (c)
        c->invalidated = 1;
    pthread_mutex_unlock(&lock);
    return c ? rt_error(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

static void forget_event(cudaEvent_t event)
{
    free(event->tips);
    event->tips = NULL;
    event->ntips = 0;
    __atomic_store_n(&event->capture_id, 0, __ATOMIC_RELAXED);
}

int rt_capture_event_record(cudaEvent_t event, cudaStream_t stream, cudaError_t *err)
{
    *err = cudaSuccess;
    if (!anything_underway()) {
        if (__atomic_load_n(&event->capture_id, __ATOMIC_RELAXED)) {
            pthread_mutex_lock(&lock);
            forget_event(event);
            pthread_mutex_unlock(&lock);
        }
        return 0;
    }
    int answered = 0;
    pthread_mutex_lock(&lock);
    struct rt_capture *c = valid_stream(stream) ? stream->capture : NULL;
    if (is_legacy(stream) && (c = implicit_capture())) {
        c->invalidated = 1;
        *err = cudaErrorStreamCaptureImplicit;
        answered = 1;
    } else if (c && c->invalidated) {
        *err = cudaErrorStreamCaptureInvalidated;
        answered = 1;
    } else if (c) {
        /* No node: the event stands for the stream's dependencies now. */
        struct CUgraphNode_st **tips = stream->ntips ? malloc(stream->ntips * sizeof *tips) : NULL;
        if (stream->ntips && !tips) {
            *err = cudaErrorMemoryAllocation;
        } else {
            forget_event(event);
            if (tips)
                memcpy(tips, stream->tips, stream->ntips * sizeof *tips);
            event->tips = tips;
            event->ntips = stream->ntips;
            __atomic_store_n(&event->capture_id, c->id, __ATOMIC_RELAXED);
        }
        answered = 1;
    } else {
        forget_event(event);
    }
    pthread_mutex_unlock(&lock);
    if (*err)
        rt_error(*err);
    return answered;
}

int rt_capture_event_wait(cudaStream_t stream, cudaEvent_t event, unsigned flags, cudaError_t *err)
{
    *err = cudaSuccess;
    if (!anything_underway())
        return 0;
    int answered = 1;
    pthread_mutex_lock(&lock);
    struct rt_capture *from = event->capture_id ? find_capture(event->capture_id) : NULL;
    struct rt_capture *c = valid_stream(stream) ? stream->capture : NULL;
    struct rt_capture *implicit = is_legacy(stream) ? implicit_capture() : NULL;
    if (from && from->invalidated) {
        *err = cudaErrorStreamCaptureInvalidated;
    } else if (c && c->invalidated) {
        *err = cudaErrorStreamCaptureInvalidated;
    } else if (implicit || (from && is_builtin(stream))) {
        /* The legacy stream would wait on a capture. */
        (implicit ? implicit : from)->invalidated = 1;
        *err = cudaErrorStreamCaptureImplicit;
    } else if (from && c && from != c) {
        from->invalidated = c->invalidated = 1;
        *err = cudaErrorStreamCaptureMerge;
    } else if (from) {
        /* A fork (the stream joins the capture) or a join. */
        if ((!c && !join_capture(from, stream)) || !set_tips(stream, event->tips, event->ntips, c != NULL))
            *err = cudaErrorMemoryAllocation;
    } else if (c && (flags & cudaEventWaitExternal)) {
        struct CUgraphNode_st *n = add_node(c->graph, cudaGraphNodeTypeWaitEvent, NULL, NULL, stream->tips,
                                            stream->ntips);
        if (!n || !set_tips(stream, &n, 1, 0))
            *err = cudaErrorMemoryAllocation;
    } else if (c) {
        /* An event from outside the capture, or from one that ended. */
        c->invalidated = 1;
        *err = cudaErrorStreamCaptureIsolation;
    } else {
        answered = 0; /* nothing captures here: the event is complete */
    }
    pthread_mutex_unlock(&lock);
    if (*err)
        rt_error(*err);
    return answered;
}

cudaError_t rt_capture_event_check(cudaEvent_t event)
{
    return __atomic_load_n(&event->capture_id, __ATOMIC_RELAXED) ? rt_error(cudaErrorCapturedEvent)
                                                                  : cudaSuccess;
}

/* A capturing stream destroyed: its capture is invalidated; the origin's
 * ends it (nothing could end it any more). */
void rt_capture_forget_stream(cudaStream_t stream)
{
    if (!anything_underway())
        return;
    struct due due = {0};
    pthread_mutex_lock(&lock);
    struct rt_capture *c = stream->capture;
    if (c) {
        c->invalidated = 1;
        if (c->origin == stream) {
            end_capture(c, 0, &due);
        } else {
            size_t i = 0;
            while (c->streams[i] != stream)
                i++;
            c->streams[i] = c->streams[--c->nstreams];
            leave_capture(stream);
        }
    }
    unlock_and_run(&due);
}

void rt_capture_forget_event(cudaEvent_t event)
{
    pthread_mutex_lock(&lock);
    forget_event(event);
    pthread_mutex_unlock(&lock);
}
