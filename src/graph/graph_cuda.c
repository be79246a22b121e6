/* graph_cuda.c: the capture engine's CUDA backend (the sg_graph_backend_i table, at the end):
 * thread-local stream capture, instantiate + upload, launch, cudaGraphExecUpdate with
 * re-instantiation as the fallback, and kernel-node argument updates. Compiled only when the
 * build has CUDA. */
#include "graph/graph.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cudaStream_t stream_of(sg_ctx *ctx) { return (cudaStream_t)sg_ctx_stream(ctx); }

static sg_status cuda_begin(sg_ctx *ctx)
{
    /* Thread-local: a CUDA call from this thread that is unsafe during capture fails, while
     * other threads' work is not disturbed. */
    SG_CUDA_CHECK(ctx, cudaStreamBeginCapture(stream_of(ctx), cudaStreamCaptureModeThreadLocal));
    return SG_OK;
}

static sg_status cuda_end(sg_ctx *ctx, void **graph)
{
    cudaGraph_t gr = NULL;
    cudaError_t e = cudaStreamEndCapture(stream_of(ctx), &gr);
    *graph = gr;
    if (e == cudaSuccess && gr) return SG_OK;
    cudaGetLastError(); /* the capture error is sticky on the thread, not the context */
    if (gr) cudaGraphDestroy(gr);
    *graph = NULL;
    return sg_fail(ctx, SG_ERR_CAPTURE,
                   "sg_graph_capture: CUDA invalidated the capture (%s: %s): work went to another "
                   "stream, or a CUDA call that may not run during capture was made (a sync, an "
                   "allocation, a legacy-stream launch)%s%s",
                   cudaGetErrorName(e), cudaGetErrorString(e), ctx->module ? " in module " : "",
                   ctx->module ? ctx->module : "");
}

static void cuda_discard(void *graph)
{
    if (graph) cudaGraphDestroy((cudaGraph_t)graph);
}

static int count_nodes(cudaGraph_t gr)
{
    size_t n = 0;
    if (cudaGraphGetNodes(gr, NULL, &n) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return (int)n;
}

/* STEPGRAPH_GRAPH_DOT=DIR: each captured graph, before it is instantiated, written as
 * DIR/NAME.N.dot (cudaGraphDebugDotPrint, verbose: every node with its parameters and
 * attributes), N counting this process's dumps: what capture recorded, to compare two builds'
 * or two runs' graphs node by node. *path is "" when the variable is unset. */
static cudaError_t dump_dot(const sg_graph *g, cudaGraph_t gr, char *path, size_t n)
{
    static int dumps;
    const char *dir = getenv("STEPGRAPH_GRAPH_DOT");
    path[0] = '\0';
    if (!dir || !*dir) return cudaSuccess;
    char name[sizeof g->name];
    size_t i = 0;
    for (; g->name[i] && i + 1 < sizeof name; i++) /* a file name: no separators */
        name[i] = g->name[i] == '/' || g->name[i] == ' ' ? '_' : g->name[i];
    name[i] = '\0';
    snprintf(path, n, "%s/%s.%d.dot", dir, i ? name : "graph", __atomic_fetch_add(&dumps, 1, __ATOMIC_RELAXED));
    return cudaGraphDebugDotPrint(gr, path, cudaGraphDebugDotFlagsVerbose);
}

static sg_status cuda_instantiate(sg_graph *g, void *graph)
{
    sg_ctx *ctx = g->ctx;
    cudaGraph_t gr = (cudaGraph_t)graph;
    cudaGraphExec_t exec = NULL;
    size_t free0 = 0, free1 = 0, total = 0;
    char dot[512];
    cudaError_t e = dump_dot(g, gr, dot, sizeof dot);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaGraphDestroy(gr);
        return sg_fail(ctx, SG_ERR_IO, "sg_graph '%s': STEPGRAPH_GRAPH_DOT: could not write '%s' "
                       "(cudaGraphDebugDotPrint: %s); is the directory there and writable?", g->name, dot,
                       cudaGetErrorString(e));
    }
    /* Every failure frees gr (and exec), as the table's contract says: nothing leaks. */
    const char *call = "cudaMemGetInfo";
    e = cudaMemGetInfo(&free0, &total);
    if (e == cudaSuccess) {
        call = "cudaGraphInstantiateWithFlags";
        /* Kernel nodes keep the priority of the stream they were captured on (stream capture
         * copies it into each node) and, with this flag, run at it: without it every node
         * would run at the launch stream's priority, so data parallelism's all-reduces,
         * launched on a high-priority stream to overlap the backward eagerly, would queue
         * behind the backward's kernels in a replay (measured: no difference on 2 H100s). */
        unsigned long long flags = sg_ctx_node_priority(ctx) ? cudaGraphInstantiateFlagUseNodePriority : 0;
        e = cudaGraphInstantiateWithFlags(&exec, gr, flags);
    }
    if (e == cudaSuccess) {
        call = "cudaGraphUpload";
        e = cudaGraphUpload(exec, stream_of(ctx));
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream_of(ctx));
    }
    if (e == cudaSuccess) {
        call = "cudaMemGetInfo";
        e = cudaMemGetInfo(&free1, &total);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (exec) cudaGraphExecDestroy(exec);
        cudaGraphDestroy(gr);
        return sg_cuda_status(ctx, e, call, __FILE__, __LINE__);
    }
    g->st.exec_bytes = free0 > free1 ? free0 - free1 : 0;
    g->cuda_graph = gr;
    g->cuda_exec = exec;
    g->st.nodes = count_nodes(gr);
    return SG_OK;
}

static sg_status cuda_update(sg_graph *g, void *graph)
{
    cudaGraph_t gr = (cudaGraph_t)graph;
    cudaGraphExecUpdateResultInfo info;
    /* A different node count cannot be updated in place: skip straight to re-instantiation
     * (asking would only make CUDA report an error, which sanitizers then flag). */
    cudaError_t e = count_nodes(gr) == count_nodes((cudaGraph_t)g->cuda_graph)
                        ? cudaGraphExecUpdate((cudaGraphExec_t)g->cuda_exec, gr, &info)
                        : cudaErrorGraphExecUpdateFailure;
    if (e == cudaSuccess) {
        cudaGraphDestroy((cudaGraph_t)g->cuda_graph);
        g->cuda_graph = gr;
        g->st.nodes = count_nodes(gr);
        g->st.updates++;
        return SG_OK;
    }
    /* The topology changed (or a node cannot be updated): a new executable graph. */
    cudaGetLastError();
    cudaGraphExec_t old_exec = (cudaGraphExec_t)g->cuda_exec;
    cudaGraph_t old_graph = (cudaGraph_t)g->cuda_graph;
    SG_TRY(cuda_instantiate(g, gr));
    cudaGraphExecDestroy(old_exec);
    cudaGraphDestroy(old_graph);
    g->st.reinstantiations++;
    return SG_OK;
}

static sg_status cuda_launch(sg_graph *g)
{
    SG_CUDA_CHECK(g->ctx, cudaGraphLaunch((cudaGraphExec_t)g->cuda_exec, stream_of(g->ctx)));
    sg_ctx_count_launches(g->ctx, 1);
    return SG_OK;
}

static sg_status cuda_set_args(sg_graph *g, const void *func, int occurrence, void **args)
{
    sg_ctx *ctx = g->ctx;
    cudaGraph_t gr = (cudaGraph_t)g->cuda_graph;
    size_t n = 0;
    SG_CUDA_CHECK(ctx, cudaGraphGetNodes(gr, NULL, &n));
    cudaGraphNode_t *nodes = malloc((n ? n : 1) * sizeof *nodes);
    if (!nodes) return sg_fail(ctx, SG_ERR_OOM, "sg_graph_kernel_set_args: out of host memory");
    sg_status st = SG_OK;
    int seen = 0;
    bool done = false;
    if (cudaGraphGetNodes(gr, nodes, &n) != cudaSuccess) {
        st = sg_cuda_status(ctx, (int)cudaGetLastError(), "cudaGraphGetNodes", __FILE__, __LINE__);
        n = 0;
    }
    for (size_t i = 0; i < n && !done && st == SG_OK; i++) {
        enum cudaGraphNodeType type;
        if (cudaGraphNodeGetType(nodes[i], &type) != cudaSuccess || type != cudaGraphNodeTypeKernel) continue;
        struct cudaKernelNodeParams p;
        if (cudaGraphKernelNodeGetParams(nodes[i], &p) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        if (p.func != func || seen++ != occurrence) continue;
        p.kernelParams = args;
        p.extra = NULL;
        cudaError_t e = cudaGraphExecKernelNodeSetParams((cudaGraphExec_t)g->cuda_exec, nodes[i], &p);
        if (e == cudaSuccess) e = cudaGraphKernelNodeSetParams(nodes[i], &p); /* keep the graph in step */
        if (e != cudaSuccess) st = sg_cuda_status(ctx, e, "cudaGraphExecKernelNodeSetParams", __FILE__, __LINE__);
        done = true;
    }
    free(nodes);
    if (st == SG_OK && !done)
        st = sg_fail(ctx, SG_ERR_INVALID,
                     "sg_graph_kernel_set_args: graph '%s' has %d launches of that kernel; occurrence %d "
                     "asked for", g->name, seen, occurrence);
    return st;
}

static void cuda_release(sg_graph *g)
{
    if (g->cuda_exec) cudaGraphExecDestroy((cudaGraphExec_t)g->cuda_exec);
    if (g->cuda_graph) cudaGraphDestroy((cudaGraph_t)g->cuda_graph);
    g->cuda_exec = g->cuda_graph = NULL;
}

/* ---- conditional nodes ----
 * The capture is cut around the node: the set kernel is captured, the stream's capture ended
 * (the graph so far is ours), the node added after the capture's last node, each body captured
 * into the node's body graph on the same stream, and the outer capture resumed after the node.
 * One stream, so the context's handles (cuDNN, cuBLAS) need no rebinding. */

sg_status sg_cond_set_cuda(sg_ctx *ctx, unsigned long long handle, const sg_tensor *v, int kind); /* cond_cuda.cu */

static int cuda_cond_kinds(const sg_ctx *ctx)
{
    (void)ctx;
    int rt = 0, drv = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess || cudaDriverGetVersion(&drv) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    int v = rt < drv ? rt : drv, k = 0;
    if (v >= 12040) k |= 1 << SG_COND_IF | 1 << SG_COND_WHILE;
#if CUDART_VERSION >= 12080
    if (v >= 12080) k |= 1 << SG_COND_SWITCH;
#endif
    return k;
}

static enum cudaGraphConditionalNodeType node_type(sg_cond_kind kind)
{
#if CUDART_VERSION >= 12080
    if (kind == SG_COND_SWITCH) return cudaGraphCondTypeSwitch;
#endif
    return kind == SG_COND_WHILE ? cudaGraphCondTypeWhile : cudaGraphCondTypeIf;
}

/* Captures body i into gr; the stream is back to not capturing on return, whatever failed. */
static sg_status capture_body(sg_ctx *ctx, sg_cond_kind kind, cudaGraph_t gr, unsigned long long h,
                              const sg_tensor *v, sg_step_fn fn, void *user)
{
    cudaStream_t s = stream_of(ctx);
    SG_CUDA_CHECK(ctx, cudaStreamBeginCaptureToGraph(s, gr, NULL, NULL, 0, cudaStreamCaptureModeThreadLocal));
    sg_status st = sg_cond_body(ctx, kind, fn, user);
    if (st == SG_OK && kind == SG_COND_WHILE) st = sg_cond_set_cuda(ctx, h, v, kind); /* test again */
    cudaGraph_t got = NULL;
    cudaError_t e = cudaStreamEndCapture(s, &got);
    if (st != SG_OK) {
        cudaGetLastError();
        return st;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return sg_fail(ctx, SG_ERR_CAPTURE,
                       "%s: CUDA invalidated the capture of the body (%s: %s): work went to another stream, "
                       "or a call that a conditional body may not hold was made%s%s", sg_cond_call(kind),
                       cudaGetErrorName(e), cudaGetErrorString(e), ctx->module ? " in module " : "",
                       ctx->module ? ctx->module : "");
    }
    size_t n = 0;
    SG_CUDA_CHECK(ctx, cudaGraphGetNodes(gr, NULL, &n));
    if (n == 0) { /* an empty body: CUDA wants a node */
        cudaGraphNode_t empty;
        SG_CUDA_CHECK(ctx, cudaGraphAddEmptyNode(&empty, gr, NULL, 0));
    }
    return SG_OK;
}

static sg_status cuda_cond(sg_ctx *ctx, sg_cond_kind kind, const sg_tensor *v, int n, const sg_step_fn *fns,
                           void *const *users)
{
    cudaStream_t s = stream_of(ctx);
    enum cudaStreamCaptureStatus cs;
    cudaGraph_t gr = NULL;
    SG_CUDA_CHECK(ctx, cudaStreamGetCaptureInfo(s, &cs, NULL, &gr, NULL, NULL, NULL));
    if (cs != cudaStreamCaptureStatusActive || !gr)
        return sg_fail(ctx, SG_ERR_CAPTURE, "%s: the context's stream is not capturing (CUDA invalidated the "
                       "capture before the region)", sg_cond_call(kind));
    cudaGraphConditionalHandle h;
    SG_CUDA_CHECK(ctx, cudaGraphConditionalHandleCreate(&h, gr, 0, 0));
    SG_TRY(sg_cond_set_cuda(ctx, h, v, kind));
    const cudaGraphNode_t *deps = NULL;
    size_t nd = 0;
    SG_CUDA_CHECK(ctx, cudaStreamGetCaptureInfo(s, &cs, NULL, &gr, &deps, NULL, &nd));
    cudaGraphNode_t *after = malloc((nd ? nd : 1) * sizeof *after);
    if (!after) return sg_fail(ctx, SG_ERR_OOM, "%s: out of host memory", sg_cond_call(kind));
    memcpy(after, deps, nd * sizeof *after);
    cudaGraph_t outer = NULL;
    cudaError_t e = cudaStreamEndCapture(s, &outer);
    if (e != cudaSuccess || outer != gr) {
        cudaGetLastError();
        free(after);
        if (outer) cudaGraphDestroy(outer);
        return sg_fail(ctx, SG_ERR_CAPTURE, "%s: cannot cut the capture at the region (%s): work forked to "
                       "another stream must join the context's stream before a conditional region",
                       sg_cond_call(kind), cudaGetErrorString(e));
    }
    /* From here the outer capture is resumed whatever happens. */
    struct cudaGraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = node_type(kind);
    p.conditional.size = (unsigned)n;
    cudaGraphNode_t node = NULL;
    sg_status st = SG_OK;
    e = cudaGraphAddNode(&node, outer, after, NULL, nd, &p);
    if (e != cudaSuccess) {
        cudaGetLastError();
        st = sg_cuda_status(ctx, e, "cudaGraphAddNode(conditional)", __FILE__, __LINE__);
        node = NULL;
    }
    for (int i = 0; i < n && st == SG_OK; i++)
        st = capture_body(ctx, kind, p.conditional.phGraph_out[i], h, v, fns[i], users[i]);
    e = node ? cudaStreamBeginCaptureToGraph(s, outer, &node, NULL, 1, cudaStreamCaptureModeThreadLocal)
             : cudaStreamBeginCaptureToGraph(s, outer, after, NULL, nd, cudaStreamCaptureModeThreadLocal);
    free(after);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaGraphDestroy(outer);
        if (st == SG_OK) st = sg_cuda_status(ctx, e, "cudaStreamBeginCaptureToGraph(resume)", __FILE__, __LINE__);
    }
    return st;
}

const sg_graph_backend_i sg_graph_cuda = {
    .name = "CUDA",
    .begin = cuda_begin,
    .end = cuda_end,
    .discard = cuda_discard,
    .instantiate = cuda_instantiate,
    .update = cuda_update,
    .launch = cuda_launch,
    .set_args = cuda_set_args,
    .release = cuda_release,
    .cond = cuda_cond,
    .cond_kinds = cuda_cond_kinds,
};
